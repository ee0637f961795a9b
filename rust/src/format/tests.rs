//! Unit tests of `format` (beside it, out of the module's own file).

use super::*;

#[test]
fn raw_len_refuses_shapes_no_array_can_hold() {
    let max = i64::MAX as u64;
    assert_eq!(raw_len(&[3, 4], 4), Some(48));
    assert_eq!(raw_len(&[0, max], 1), Some(0));
    assert_eq!(raw_len(&[max], 1), Some(max));
    // empty, but numpy raises building them (a dim or the non-zero dims' bytes > 2^63-1)
    assert_eq!(raw_len(&[0, u64::MAX], 1), None);
    assert_eq!(raw_len(&[0, 1 << 63], 1), None);
    assert_eq!(raw_len(&[1 << 61, 0, 2], 4), None);
    assert_eq!(raw_len(&[0, max], 2), None);
    assert_eq!(raw_len(&[1 << 32, 1 << 32], 1), None);
}

#[test]
fn dtype_tags_round_trip() {
    for d in ALL_DTYPES {
        assert_eq!(DType::from_tag(d as u8), Some(d));
        assert_eq!(DType::from_name(d.name()).unwrap(), d);
    }
    assert_eq!(DType::from_tag(0), None);
    assert_eq!(DType::from_tag(22), None);
    assert_eq!(DType::from_name("float4_e2m1fn_x2").unwrap().itemsize(), 1);
}

#[test]
fn shard_names() {
    assert!(valid_shard_name(shard_name(3, 10, None).as_bytes()));
    assert!(valid_shard_name(
        shard_name(3, 10, Some(0xdead_beef)).as_bytes()
    ));
    assert!(!valid_shard_name(b"/../etc/passwd"));
    assert!(!valid_shard_name(b".data-00000-of-00001/x"));
    assert!(!valid_shard_name(b".data-00000-of-00001.DEADBEEFDEADBEEF"));
}

#[test]
fn hashed_shard_names_are_exactly_what_the_writer_makes() {
    use crate::naming::{hashed_shard_name, shard_hash, valid_hashed_shard_name};
    // the hash is recomputable by hand: low byte of crc32c(".data-00003-of-00008")
    let hh = format!("{:02x}", crc(b".data-00003-of-00008") & 0xff);
    assert_eq!(shard_hash(3, 8), hh);
    let plain = hashed_shard_name(3, 8, None);
    let tok = hashed_shard_name(3, 8, Some(0x0123_4567_89ab_cdef));
    assert_eq!(plain, format!("/{hh}/data-00003-of-00008"));
    assert_eq!(tok, format!("/{hh}/data-00003-of-00008.0123456789abcdef"));
    assert_eq!(tok.len(), SHARD_NAME_MAX);
    for good in [&plain, &tok] {
        assert!(valid_hashed_shard_name(good.as_bytes()));
        assert_eq!(shard_name_version(good.as_bytes()), Some(2));
        assert!(!valid_shard_name(good.as_bytes()), "never a v1 name");
    }
    assert_eq!(
        shard_name_version(shard_name(3, 8, None).as_bytes()),
        Some(1)
    );
    let other = format!("{:02x}", (u8::from_str_radix(&hh, 16).unwrap()) ^ 1);
    let hostile = [
        format!("/{other}/data-00003-of-00008"), // wrong hash
        format!("/{}/data-00003-of-00008", hh.to_uppercase()), // uppercase hash
        format!("/{hh}/data-00003-of-00008.0123456789ABCDEF"), // uppercase token
        format!("/{hh}0/data-00003-of-00008"),   // three hex digits
        format!("/{}/data-00003-of-00008", &hh[..1]), // one hex digit
        format!("/{hh}/data-00003-of-00008.0123"), // short token
        format!("/{hh}/../data-00003-of-0008"),  // `..`
        "/../data-00003-of-00008".to_string(),
        format!("/{hh}/x/data-00003-of-00008"), // extra `/`
        format!("/{hh}/data-00003-of-00008/"),
        format!("{hh}/data-00003-of-00008"), // no leading `/`
        format!("/{hh}/.data-00003-of-00008"),
        format!("/{hh}/data-0000a-of-00008"),
        format!("/{hh}/data-00003-of-00008\0"),
        String::new(),
    ];
    for h in &hostile {
        assert_eq!(shard_name_version(h.as_bytes()), None, "{h:?}");
    }
    // what cleanup and gc may remove under `P/`: hashed shards and their temp files only
    use crate::naming::is_hashed_owned_suffix;
    assert!(is_hashed_owned_suffix(&plain) && is_hashed_owned_suffix(&tok));
    assert!(is_hashed_owned_suffix(&format!(
        "{plain}.tmp-00000000000000ff"
    )));
    assert!(!is_hashed_owned_suffix(&format!("{plain}.tmp-ff")));
    assert!(!is_hashed_owned_suffix(&format!(
        "/{other}/data-00003-of-00008"
    )));
    assert!(!is_hashed_owned_suffix(&format!("/{hh}/data-notes.txt")));
    // spread: 4,096 shards of one save land in (nearly) all 256 directories
    let dirs: std::collections::HashSet<String> = (0..4096).map(|s| shard_hash(s, 4096)).collect();
    assert!(dirs.len() > 250, "{}", dirs.len());
}

#[test]
fn hashed_partial_index_names() {
    use crate::naming::{
        hashed_partial_suffix, is_hashed_owned_suffix, is_partial_suffix, partial_suffix_in,
        valid_hashed_partial_suffix,
    };
    // the low byte of crc32c of the plain name, as for shards (FORMAT.md §3.1.1)
    let hh = format!("{:02x}", crc(b".index.part-00001-of-00004") & 0xff);
    let name = hashed_partial_suffix(1, 4);
    assert_eq!(name, format!("/{hh}/index.part-00001-of-00004"));
    assert_eq!(partial_suffix_in(1, 4, true), name);
    assert_eq!(partial_suffix_in(1, 4, false), ".index.part-00001-of-00004");
    assert!(valid_hashed_partial_suffix(name.as_bytes()));
    assert!(is_partial_suffix(&name) && is_partial_suffix(".index.part-00001-of-00004"));
    assert!(is_hashed_owned_suffix(&name));
    assert!(is_hashed_owned_suffix(&format!(
        "{name}.tmp-00000000000000ff"
    )));
    let other = format!("{:02x}", u8::from_str_radix(&hh, 16).unwrap() ^ 1);
    for bad in [
        format!("/{other}/index.part-00001-of-00004"), // wrong hash
        format!("/{hh}0/index.part-00001-of-00004"),   // three hex digits
        format!("/{hh}/index.part-00001-of-00004.0123456789abcdef"), // partials carry no token
        format!("/{hh}/index.part-0001-of-00004"),
        format!("/{hh}/../index.part-00001-of-00004"),
        format!("/{hh}/index.part-00001-of-0000a"),
    ] {
        assert!(!valid_hashed_partial_suffix(bad.as_bytes()), "{bad:?}");
        assert!(
            !is_partial_suffix(&bad) && !is_hashed_owned_suffix(&bad),
            "{bad:?}"
        );
    }
    // never a shard name of any version: an index cannot name a partial
    assert_eq!(shard_name_version(name.as_bytes()), None);
}

#[test]
fn shard_header_round_trip_and_checks() {
    let h = ShardHeader {
        save_token: 7,
        shard_index: 1,
        shard_count: 2,
    };
    let (b, c) = h.encode();
    let p = Path::new("x");
    assert_eq!(ShardHeader::decode(&b, p).unwrap(), (h, c));
    let mut bad = b;
    bad[20] ^= 1;
    assert!(matches!(
        ShardHeader::decode(&bad, p),
        Err(Error::Checksum { .. })
    ));
    assert!(ShardHeader::decode(&b[..10], p).is_err());
}
