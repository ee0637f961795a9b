//! Recycled output buffers of the chunk encoder, one pool per shard being written.
//!
//! Why: every compressed chunk needs an output buffer of about the chunk's size. Fresh ones come
//! from the allocator, which hands memory back to the kernel between chunks (heap trimming), so
//! each chunk paid page faults and kernel page zeroing on its output (~10% of a save in perf
//! profiles). The shard writer hands written chunks' buffers back here and the encoder takes
//! them again, so their pages stay mapped for the whole save and are dropped with the pool.

use std::sync::Mutex;

/// At most this many idle buffers are kept: two batches of chunks in flight (the writer's
/// double buffering) never need more.
const MAX_IDLE: usize = 64;

/// A pool of byte buffers (thread-safe; encoders on rayon threads take, the writer gives).
#[derive(Default)]
pub struct BufPool(Mutex<Vec<Vec<u8>>>);

impl BufPool {
    /// An empty buffer with at least `cap` bytes of capacity (recycled when one is idle).
    pub fn take(&self, cap: usize) -> Vec<u8> {
        let recycled = self.0.lock().map(|mut v| v.pop()).unwrap_or(None);
        let mut b = recycled.unwrap_or_default();
        b.clear();
        b.reserve(cap);
        b
    }

    /// Return a buffer whose bytes are no longer needed.
    pub fn give(&self, b: Vec<u8>) {
        if b.capacity() == 0 {
            return;
        }
        if let Ok(mut v) = self.0.lock() {
            if v.len() < MAX_IDLE {
                v.push(b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_and_come_back_empty() {
        let p = BufPool::default();
        let mut b = p.take(1000);
        b.extend_from_slice(&[7u8; 1000]);
        let ptr = b.as_ptr();
        p.give(b);
        let c = p.take(500);
        assert!(c.is_empty() && c.capacity() >= 1000);
        assert_eq!(c.as_ptr(), ptr);
        for _ in 0..(2 * MAX_IDLE) {
            p.give(vec![0u8; 8]);
        }
        assert_eq!(p.0.lock().unwrap().len(), MAX_IDLE);
    }
}
