//! Runtime dispatch of the codec's hot loops to a copy compiled for x86-64-v3 (AVX2, BMI2).
//!
//! Why: the wheels are built for baseline x86-64 (SSE2), where the byte (un)grouping loops
//! vectorise 16 bytes at a time and every variable shift of the Huffman bit writers and
//! readers is a multi-µop `shl %cl`. The same source compiled with AVX2 + BMI2 (`shlx`/`shrx`)
//! runs markedly faster; [`multiversion!`] compiles a function body twice and picks the copy
//! once per call from the CPU's features (std caches the detection in an atomic).
//!
//! What must stay true: both copies are the same source, so they compute the same bytes
//! (the tests run whichever copy the test machine picks; `SHARDPOINT_NO_SIMD=1` forces the
//! baseline copy so CI can run both).

/// Whether the x86-64-v3 copies may run: the CPU has the features and the user did not turn
/// them off with `SHARDPOINT_NO_SIMD=1`.
#[inline]
pub fn v3_enabled() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static ON: OnceLock<bool> = OnceLock::new();
        *ON.get_or_init(|| {
            std::env::var_os("SHARDPOINT_NO_SIMD").is_none_or(|v| v.is_empty() || v == "0")
                && std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("bmi1")
                && std::is_x86_feature_detected!("bmi2")
                && std::is_x86_feature_detected!("lzcnt")
                && std::is_x86_feature_detected!("popcnt")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Define `fn name(args) -> ret { body }` compiled twice: for the baseline target and, on
/// x86-64, for AVX2 + BMI2, chosen at run time by [`v3_enabled`]. Helpers the body calls
/// should be `#[inline(always)]` so they are compiled into each copy.
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) -> $ret:ty $body:block) => {
        $(#[$m])*
        $vis fn $name($($arg: $ty),*) -> $ret {
            #[inline(always)]
            fn body($($arg: $ty),*) -> $ret $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
                unsafe fn v3($($arg: $ty),*) -> $ret {
                    body($($arg),*)
                }
                if $crate::codec::simd::v3_enabled() {
                    // SAFETY: v3_enabled() checked that this CPU has every feature v3 was
                    // compiled for.
                    return unsafe { v3($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}
