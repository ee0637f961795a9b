//! cargo-fuzz target `chunk`: see logic.rs (shared with tests/fuzz_smoke.rs).
#![no_main]

use libfuzzer_sys::fuzz_target;

include!("logic.rs");

fuzz_target!(|data: &[u8]| fuzz_chunk(data));
