//! File naming (FORMAT.md §1, §3.1, §8): every name a checkpoint `P` owns, made and recognised
//! in one place.
//!
//! - `P.index`: the committed index; `P.index.part-RRRRR-of-WWWWW`: a partial index of a
//!   multi-writer save; `P.lock`: the commit lock;
//! - `P.data-SSSSS-of-NNNNN`, optionally `.<16 hex token>`: shard files;
//! - `<final name>.tmp-<16 hex>`: a temp file being written (locked while in use).
//!
//! Names are suffixes appended to the prefix's last component, never joined as path elements.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Marks a shard name suffix (`.data-…`).
pub const DATA_MARK: &str = ".data-";
/// Marks a temp file (`….tmp-<token>`), anywhere in the suffix.
pub const TEMP_MARK: &str = ".tmp-";
/// The temp file of the index (`.index.tmp-<token>`).
pub const INDEX_TEMP_MARK: &str = ".index.tmp-";
/// A partial index of a multi-writer save (`.index.part-…`).
pub const PARTIAL_MARK: &str = ".index.part-";

/// `P` + `suffix` as a path (the suffix is appended to the last component, not joined).
pub fn with_suffix(prefix: &Path, suffix: &str) -> PathBuf {
    let mut s: OsString = prefix.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// The index path `P.index`.
pub fn index_path(prefix: &Path) -> PathBuf {
    with_suffix(prefix, ".index")
}

/// The commit lock path `P.lock` (held while a writer publishes, commits and cleans up).
pub fn lock_path(prefix: &Path) -> PathBuf {
    with_suffix(prefix, ".lock")
}

/// The partial index suffix of writer `rank` of `world` (`.index.part-RRRRR-of-WWWWW`).
pub fn partial_suffix(rank: u32, world: u32) -> String {
    format!("{PARTIAL_MARK}{rank:05}-of-{world:05}")
}

/// The partial index path of writer `rank` of `world`.
pub fn partial_index_path(prefix: &Path, rank: u32, world: u32) -> PathBuf {
    with_suffix(prefix, &partial_suffix(rank, world))
}

/// The hashed partial index suffix of writer `rank` of `world` (FORMAT.md §3.1.1):
/// `/HH/index.part-RRRRR-of-WWWWW`, `HH` the low byte of the crc32c of the plain suffix
/// `.index.part-RRRRR-of-WWWWW`, so a save's partial indexes spread over the 256 key
/// prefixes like its shards (a save of small shards makes as many partial PUTs as shard PUTs).
pub fn hashed_partial_suffix(rank: u32, world: u32) -> String {
    let plain = partial_suffix(rank, world);
    let hh = crate::checksum::crc(plain.as_bytes()) & 0xff;
    format!("/{hh:02x}/index.part-{rank:05}-of-{world:05}")
}

/// The partial index suffix in the form a save chose (`hashed`: §3.1.1, else §1).
pub fn partial_suffix_in(rank: u32, world: u32, hashed: bool) -> String {
    if hashed {
        hashed_partial_suffix(rank, world)
    } else {
        partial_suffix(rank, world)
    }
}

/// Whether `suffix` is exactly a hashed partial index name (§3.1.1): what
/// [`hashed_partial_suffix`] makes for the rank and world it spells (hash checked).
pub fn valid_hashed_partial_suffix(suffix: &[u8]) -> bool {
    const LEN: usize = "/00/index.part-00000-of-00000".len();
    if suffix.len() != LEN {
        return false;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        let d = &suffix[r];
        if !d.iter().all(|c| c.is_ascii_digit()) {
            return None;
        }
        std::str::from_utf8(d).ok()?.parse().ok()
    };
    let (Some(rank), Some(world)) = (num(15..20), num(24..29)) else {
        return false;
    };
    hashed_partial_suffix(rank, world).as_bytes() == suffix
}

/// Whether a suffix of `P` names a partial index, plain (`.index.part-…`) or hashed
/// (`/HH/index.part-…`): a commit consumes every one, so one found later is a dead save's.
pub fn is_partial_suffix(suffix: &str) -> bool {
    suffix.starts_with(PARTIAL_MARK) || valid_hashed_partial_suffix(suffix.as_bytes())
}

/// The temp file next to `dest` that becomes `dest` by one rename (or hard link).
pub fn temp_path(dest: &Path, token: u64) -> PathBuf {
    with_suffix(dest, &format!("{TEMP_MARK}{token:016x}"))
}

/// The final name of temp file `tmp` (what [`temp_path`] appended removed), for messages:
/// errors name the user's file, not the temp name beside it.
pub fn final_of_temp(tmp: &Path) -> PathBuf {
    let s = tmp.as_os_str().to_string_lossy();
    match s.rfind(TEMP_MARK) {
        Some(at) => PathBuf::from(&s[..at]),
        None => tmp.to_path_buf(),
    }
}

/// The shard name suffix for shard `s` of `n`, with an optional save token.
pub fn shard_name(s: u32, n: u32, token: Option<u64>) -> String {
    match token {
        None => format!("{DATA_MARK}{s:05}-of-{n:05}"),
        Some(t) => format!("{DATA_MARK}{s:05}-of-{n:05}.{t:016x}"),
    }
}

/// The hashed directory of shard `s` of `n` (FORMAT.md §3.1.1): two lowercase hex digits, the
/// low byte of the crc32c of its plain name `.data-SSSSS-of-NNNNN`. Derived from the shard
/// number only (not the token), so a shard's temp file, plain and tokened names share it.
pub fn shard_hash(s: u32, n: u32) -> String {
    let plain = format!("{DATA_MARK}{s:05}-of-{n:05}");
    format!("{:02x}", crate::checksum::crc(plain.as_bytes()) & 0xff)
}

/// The hashed shard name suffix (§3.1.1): `/HH/data-SSSSS-of-NNNNN`, optionally
/// `.<16 hex token>`. `P` + this puts the shard at `P/HH/…`: on an object store the two hex
/// digits right after the user's prefix spread a save's shards over 256 key prefixes, which
/// S3 partitions apart.
pub fn hashed_shard_name(s: u32, n: u32, token: Option<u64>) -> String {
    let hh = shard_hash(s, n);
    match token {
        None => format!("/{hh}/data-{s:05}-of-{n:05}"),
        Some(t) => format!("/{hh}/data-{s:05}-of-{n:05}.{t:016x}"),
    }
}

/// The shard name suffix in the form a save chose (`hashed`: §3.1.1, else §3.1).
pub fn shard_name_in(s: u32, n: u32, token: Option<u64>, hashed: bool) -> String {
    if hashed {
        hashed_shard_name(s, n, token)
    } else {
        shard_name(s, n, token)
    }
}

/// Check a hashed shard name read from an index (§3.1.1): exactly what
/// [`hashed_shard_name`] makes for the shard number, count and token it spells, so the two
/// hex digits must equal the hash recomputed from the name, be lowercase, and no other `/`,
/// `..` or length passes.
pub fn valid_hashed_shard_name(name: &[u8]) -> bool {
    const BASE: usize = "/00/data-00000-of-00000".len();
    if name.len() != BASE && name.len() != BASE + 17 {
        return false;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        let d = &name[r];
        if !d.iter().all(|c| c.is_ascii_digit()) {
            return None;
        }
        std::str::from_utf8(d).ok()?.parse().ok()
    };
    let (Some(s), Some(n)) = (num(9..14), num(18..23)) else {
        return false;
    };
    let token = if name.len() == BASE {
        None
    } else {
        let hex = &name[BASE + 1..];
        if !hex
            .iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
        {
            return false;
        }
        match std::str::from_utf8(hex)
            .ok()
            .and_then(|h| u64::from_str_radix(h, 16).ok())
        {
            Some(t) => Some(t),
            None => return false,
        }
    };
    hashed_shard_name(s, n, token).as_bytes() == name
}

/// The lowest index `format_version` that may name a shard so (§3.1, §3.1.1, §9): 1 for the
/// plain form, 2 for the hashed form; `None` for a name no version allows.
pub fn shard_name_version(name: &[u8]) -> Option<u32> {
    if valid_shard_name(name) {
        Some(1)
    } else if valid_hashed_shard_name(name) {
        Some(2)
    } else {
        None
    }
}

/// Whether a suffix names a file of `P` under its hashed directories: a valid hashed shard
/// name or hashed partial index name (§3.1.1, hash checked), or one followed by
/// `.tmp-<16 hex>` (its temp file). What cleanup, removal and `gc` consider there; anything
/// else under `P/` (a user's own file such as `P/ab/data-notes.txt`) is never touched.
pub fn is_hashed_owned_suffix(suffix: &str) -> bool {
    let name = match suffix.rfind(TEMP_MARK) {
        Some(at) => {
            let tok = &suffix[at + TEMP_MARK.len()..];
            if tok.len() != 16 || !tok.bytes().all(|c| c.is_ascii_hexdigit()) {
                return false;
            }
            &suffix[..at]
        }
        None => suffix,
    };
    valid_hashed_shard_name(name.as_bytes()) || valid_hashed_partial_suffix(name.as_bytes())
}

/// Check a plain shard name suffix read from an index (§3.1): `.data-NNNNN-of-NNNNN` with an
/// optional `.<16 hex>`. Anything else (a path separator, `..`) is refused before it is
/// joined to a directory.
pub fn valid_shard_name(name: &[u8]) -> bool {
    let base = b".data-00000-of-00000".len();
    if name.len() != base && name.len() != base + 17 {
        return false;
    }
    let digits = |r: std::ops::Range<usize>| name[r].iter().all(|c| c.is_ascii_digit());
    if &name[..6] != b".data-" || !digits(6..11) || &name[11..15] != b"-of-" || !digits(15..20) {
        return false;
    }
    if name.len() == base {
        return true;
    }
    name[20] == b'.'
        && name[21..]
            .iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
}

/// Whether a file of `P` with this suffix belongs to the checkpoint's files (shards, their temp
/// files, index temp files, partial indexes): what cleanup and removal consider.
pub fn is_owned_suffix(suffix: &str) -> bool {
    suffix.starts_with(DATA_MARK)
        || suffix.starts_with(INDEX_TEMP_MARK)
        || suffix.starts_with(PARTIAL_MARK)
}

/// Whether a suffix names a temp file (which a live writer may still hold).
pub fn is_temp_suffix(suffix: &str) -> bool {
    suffix.contains(TEMP_MARK)
}
