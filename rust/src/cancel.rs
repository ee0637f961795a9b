//! Cooperative cancellation of long calls (a save, a load, a verify).
//!
//! A caller that wants to stop a call from another thread (the Python binding, when Ctrl-C
//! arrives while the GIL is released) makes a [`Token`], [`enter`]s it on the thread that runs
//! the call, and [`Token::cancel`]s it later. The core checks the calling thread's token
//! between chunks, batches and pieces (never inside one), and stops with
//! [`Error::Cancelled`]; a cancelled save commits nothing and removes its temp files, exactly
//! as on any other error.
//!
//! The token lives in a thread-local so that the many entry points need no extra argument.
//! Work fanned out to other threads (rayon, scoped threads) captures [`current`] first and
//! checks or re-enters that token there.

use crate::error::{Error, Result};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Cancellation flags shared by the callers and the call (none: never cancelled). A token
/// joined from two ([`Token::joined`]) is cancelled when either is.
#[derive(Clone, Default, Debug)]
pub struct Token(Vec<Arc<AtomicBool>>);

thread_local! {
    static CURRENT: RefCell<Token> = const { RefCell::new(Token(Vec::new())) };
}

impl Token {
    /// A fresh, cancellable token.
    pub fn new() -> Token {
        Token(vec![Arc::new(AtomicBool::new(false))])
    }

    /// A token cancelled when this one or `other` is (a call of the caller's, on an object
    /// that can also be cancelled on its own, e.g. a writer being aborted).
    pub fn joined(&self, other: &Token) -> Token {
        let mut flags = self.0.clone();
        flags.extend(other.0.iter().cloned());
        Token(flags)
    }

    /// Ask every call running under this token to stop at its next check.
    pub fn cancel(&self) {
        for f in &self.0 {
            f.store(true, Ordering::Relaxed);
        }
    }

    /// Whether [`Token::cancel`] was called (on this token or one it was joined from).
    pub fn is_cancelled(&self) -> bool {
        self.0.iter().any(|f| f.load(Ordering::Relaxed))
    }

    /// `Err(Error::Cancelled)` once cancelled.
    pub fn check(&self) -> Result<()> {
        test_pause();
        if self.is_cancelled() {
            Err(Error::Cancelled)
        } else {
            Ok(())
        }
    }

    /// Make this the calling thread's token until the guard is dropped.
    pub fn enter(&self) -> Scope {
        Scope(Some(CURRENT.with(|c| c.replace(self.clone()))))
    }
}

/// Restores the previous token of the thread when dropped.
pub struct Scope(Option<Token>);

impl Drop for Scope {
    fn drop(&mut self) {
        if let Some(prev) = self.0.take() {
            CURRENT.with(|c| *c.borrow_mut() = prev);
        }
    }
}

/// Test hook: `SHARDPOINT_TEST_CHECK_PAUSE_US=N` makes every cancellation check sleep `N`
/// microseconds, so that tests can interrupt a load that would otherwise finish before the
/// signal arrives. Read once; unset (always, outside tests) it costs one load per check.
fn test_pause() {
    static PAUSE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let us = *PAUSE.get_or_init(|| {
        std::env::var("SHARDPOINT_TEST_CHECK_PAUSE_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    });
    if us > 0 {
        std::thread::sleep(std::time::Duration::from_micros(us));
    }
}

/// The calling thread's token (a never-cancelled one when none was entered).
pub fn current() -> Token {
    CURRENT.with(|c| c.borrow().clone())
}

/// Check the calling thread's token.
pub fn check() -> Result<()> {
    CURRENT.with(|c| c.borrow().check())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_scopes_nest_and_restore() {
        assert!(check().is_ok());
        let t = Token::new();
        {
            let _s = t.enter();
            assert!(check().is_ok());
            t.cancel();
            assert!(matches!(check(), Err(Error::Cancelled)));
            let inner = Token::new();
            {
                let _s2 = inner.enter();
                assert!(check().is_ok());
            }
            assert!(check().is_err());
        }
        assert!(check().is_ok());
        let (a, b) = (Token::new(), Token::new());
        let j = a.joined(&b);
        assert!(!j.is_cancelled());
        b.cancel();
        assert!(j.is_cancelled() && !a.is_cancelled());
    }
}
