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
