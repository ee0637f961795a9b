//! cargo-fuzz target `index`: see logic.rs (shared with tests/fuzz_smoke.rs). Each input is
//! also tried resealed (every crc recomputed): libFuzzer cannot fix checksums itself, and
//! without this almost every mutation would stop at the header or block crc.
#![no_main]

use libfuzzer_sys::fuzz_target;

include!("logic.rs");

fuzz_target!(|data: &[u8]| {
    fuzz_index(data);
    let mut m = data.to_vec();
    reseal_index(&mut m);
    fuzz_index(&m);
});
