//! Tests of the safetensors header fast path (`st_header.rs`); the Python suite checks it
//! against the Python checks on hostile headers (tests/hf/test_hf_header_fast_path.py).

use super::*;

fn ok(json: &str, data_len: u64) -> Option<StHeader> {
    parse(json.as_bytes(), data_len)
}

#[test]
fn a_valid_header_gives_its_tensors_in_file_order_and_its_metadata() {
    let h = ok(
        r#"{"b":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},
            "__metadata__":{"format":"pt"},
            "a":{"dtype":"F4","shape":[4],"data_offsets":[24,26],"extra":[1,{"x":2}]},
            "e":{"dtype":"BF16","shape":[0,5],"data_offsets":[26,26]}}"#,
        26,
    )
    .unwrap();
    let names: Vec<&str> = h.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["b", "a", "e"]);
    assert_eq!(h.tensors[0].shape, [2, 3]);
    assert_eq!((h.tensors[1].begin, h.tensors[1].end), (24, 26));
    assert_eq!(h.metadata, [("format".to_string(), "pt".to_string())]);
    assert_eq!(ok("{}", 0), Some(StHeader::default()));
    assert!(ok(r#"{"__metadata__":null}"#, 0).is_some());
}

#[test]
fn every_fault_is_not_taken() {
    let t = r#""dtype":"F32","shape":[2],"data_offsets":[0,8]"#;
    for (json, data_len) in [
        (format!("{{{t}}}"), 8),                                 // not an entry object
        (format!(r#"{{"a":{{{t}}},"a":{{{t}}}}}"#), 8),           // duplicate tensor
        (r#"{"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#.into(), 8),
        (format!(r#"{{"a":{{{t},"x":{{"k":1,"k":2}}}}}}"#), 8), // nested duplicate
        (format!(r#"{{"a":{{{t}}}}}"#), 9),                      // trailing bytes
        (format!(r#"{{"a":{{{t}}}}}"#), 7),                      // past the data area
        (r#"{"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}}"#.into(), 8),
        (r#"{"a":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,8]}}"#.into(), 8),
        (r#"{"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}"#.into(), 8),
        (r#"{"a":{"dtype":"F32","shape":[true],"data_offsets":[0,4]}}"#.into(), 4),
        (r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#.into(), 8),
        (r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}"#.into(), 8),
        (r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}}"#.into(), 8),
        (r#"{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}}"#.into(), 1), // 1.5 bytes
        (r#"{"a":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,1]}}"#.into(), 1),
        (r#"{"a":{"dtype":"U8","shape":[0,18446744073709551615],"data_offsets":[0,0]}}"#.into(), 0),
        (r#"{"a":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,0]}}"#.into(), 0),
        (r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}"#.into(), 6),
        (r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}"#.into(), 6), // a hole first
        (r#"{"__metadata__":{"k":1}}"#.into(), 0),
        (r#"{"__metadata__":0}"#.into(), 0), // the Python path decides
        (r#"["a"]"#.into(), 0),
        (" {}".into(), 0),
        ("{".into(), 0),
        ("{}x".into(), 0),
        (r#"{"a":NaN}"#.into(), 0),
        (r#"{"\ud800":{}}"#.into(), 0),
        ("[".repeat(100_000), 0), // deep nesting: serde_json's limit, no stack overflow
    ] {
        assert_eq!(ok(&json, data_len), None, "{json:.120}");
    }
    assert_eq!(parse(b"{\"\xff\":1}", 0), None, "not UTF-8");
}

#[test]
fn duplicates_are_found_in_objects_of_any_size() {
    let members: Vec<String> = (0..40).map(|i| format!(r#""k{i}":"v""#)).collect();
    let meta = |extra: &str| format!(r#"{{"__metadata__":{{{}{extra}}}}}"#, members.join(","));
    assert!(ok(&meta(""), 0).is_some());
    for dup in [",\"k0\":\"v\"", ",\"k39\":\"v\"", ",\"k17\":\"w\""] {
        assert_eq!(ok(&meta(dup), 0), None, "{dup}");
    }
}
