//! A fast path for the header of a Hugging Face safetensors file: parse and check it here,
//! and hand back its tensors only when every check passes.
//!
//! Why: the Python reader (`python/shardpoint/convert/hf_format.py`) checks each tensor
//! record in Python, 4-5 us per tensor: a 20,000-tensor header (a mixture-of-experts shard)
//! took 83-93 ms against the `safetensors` library's 19-20 ms, and 30-34 ms through this
//! module (docs/HF.md, "Validation"). This module makes the same checks in one pass. It only says "valid" or "not taken" (`None`): the Python
//! reader then makes its own checks, which name the file, key and fault exactly as before.
//! So this module must never accept a header the Python checks refuse; it may refuse more
//! (integers past `u64`, `NaN`, a falsy non-object `__metadata__`, lone surrogates), which
//! only sends such a file down the slower path.
//!
//! The checks (hf_format.py's module doc has them in prose): a JSON object, no duplicate key
//! in any object at any depth; `__metadata__` absent, `null` or an object of strings; every
//! other member an object with a known `dtype`, a `shape` of non-negative integers numpy can
//! represent, `data_offsets` `[begin, end]` with `begin <= end <= data_len` holding exactly
//! the shape's bytes; sorted by offset, the tensors tile `[0, data_len)`.

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use std::collections::HashSet;

/// One tensor of a checked header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StTensor {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<u64>,
    pub begin: u64,
    pub end: u64,
}

/// A checked header: tensors in the file's order, and its `__metadata__` in its order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StHeader {
    pub tensors: Vec<StTensor>,
    pub metadata: Vec<(String, String)>,
}

/// Bits per element of each safetensors dtype tag (hf_format.py's `ST_BITS`).
const DTYPES: [(&str, u32); 20] = [
    ("BOOL", 8),
    ("F4", 4),
    ("F6_E2M3", 6),
    ("F6_E3M2", 6),
    ("U8", 8),
    ("I8", 8),
    ("F8_E5M2", 8),
    ("F8_E4M3", 8),
    ("F8_E8M0", 8),
    ("I16", 16),
    ("U16", 16),
    ("F16", 16),
    ("BF16", 16),
    ("I32", 32),
    ("U32", 32),
    ("F32", 32),
    ("C64", 64),
    ("F64", 64),
    ("I64", 64),
    ("U64", 64),
];

/// The largest byte size (and dimension) numpy can represent.
const MAX_SHAPE_BYTES: u128 = (1 << 63) - 1;

/// Members of an object below which duplicates are found by a scan.
const SCAN_KEYS: usize = 16;

/// A JSON value, refusing duplicate keys in every object (serde_json keeps the last).
enum Json {
    Null,
    Bool,
    Uint(u64),
    /// Negative integers and floats: never a valid shape or offset.
    OtherNumber,
    Str(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Json, E> {
        Ok(Json::Bool)
    }
    fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
        Ok(Json::Uint(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
        Ok(u64::try_from(v).map_or(Json::OtherNumber, Json::Uint))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Json, E> {
        Ok(Json::OtherNumber)
    }
    fn visit_str<E>(self, v: &str) -> Result<Json, E> {
        Ok(Json::Str(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Json, E> {
        Ok(Json::Str(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element::<Json>()? {
            out.push(v);
        }
        Ok(Json::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut out: Vec<(String, Json)> = Vec::new();
        // a tensor's record has three members: a scan beats hashing; the top level hashes
        let mut seen: HashSet<String> = HashSet::new();
        while let Some(k) = map.next_key::<String>()? {
            let dup = if out.len() < SCAN_KEYS {
                out.iter().any(|(x, _)| *x == k)
            } else {
                if seen.is_empty() {
                    seen.extend(out.iter().map(|(x, _)| x.clone()));
                }
                !seen.insert(k.clone())
            };
            if dup {
                return Err(serde::de::Error::custom("duplicate key"));
            }
            let v = map.next_value::<Json>()?;
            out.push((k, v));
        }
        Ok(Json::Object(out))
    }
}

/// The tensors and metadata of safetensors header `blob` (the JSON after the 8-byte length)
/// of a file whose data area holds `data_len` bytes, when every check passes; `None`
/// otherwise (the caller's own checks then say why).
pub fn parse(blob: &[u8], data_len: u64) -> Option<StHeader> {
    if blob.first() != Some(&b'{') {
        return None;
    }
    let text = std::str::from_utf8(blob).ok()?;
    let Json::Object(members) = serde_json::from_str::<Json>(text).ok()? else {
        return None;
    };
    let mut out = StHeader::default();
    for (name, value) in members {
        if name == "__metadata__" {
            out.metadata = metadata(value)?;
        } else {
            out.tensors.push(tensor(name, value, data_len)?);
        }
    }
    // tile the data area: sorted by (begin, end), each starts where the last ended
    let mut order: Vec<&StTensor> = out.tensors.iter().collect();
    order.sort_by_key(|t| (t.begin, t.end));
    let mut pos = 0u64;
    for t in order {
        if t.begin != pos {
            return None;
        }
        pos = t.end;
    }
    (pos == data_len).then_some(out)
}

fn metadata(value: Json) -> Option<Vec<(String, String)>> {
    match value {
        Json::Null => Some(Vec::new()),
        Json::Object(members) => members
            .into_iter()
            .map(|(k, v)| match v {
                Json::Str(s) => Some((k, s)),
                _ => None,
            })
            .collect(),
        _ => None, // falsy scalars the Python path takes as empty: let it decide
    }
}

fn uints(value: &Json) -> Option<Vec<u64>> {
    match value {
        Json::Array(items) => items
            .iter()
            .map(|v| match v {
                Json::Uint(n) => Some(*n),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

fn tensor(name: String, value: Json, data_len: u64) -> Option<StTensor> {
    let Json::Object(fields) = value else {
        return None;
    };
    let field = |want: &str| fields.iter().find(|(k, _)| k == want).map(|(_, v)| v);
    let Some(Json::Str(tag)) = field("dtype") else {
        return None;
    };
    let (dtype, bits) = DTYPES.iter().find(|(t, _)| t == tag).copied()?;
    let shape = uints(field("shape")?)?;
    let offsets = uints(field("data_offsets")?)?;
    let [begin, end] = offsets[..] else {
        return None;
    };
    if begin > end || end > data_len {
        return None;
    }
    // numpy's limits (hf_format.py's shape_problem), then the exact byte count
    let mut nonzero_bits = u128::from(bits);
    for &d in &shape {
        if u128::from(d) > MAX_SHAPE_BYTES {
            return None;
        }
        if d != 0 {
            nonzero_bits *= u128::from(d);
            if nonzero_bits > 8 * MAX_SHAPE_BYTES {
                return None;
            }
        }
    }
    let total_bits = if shape.contains(&0) { 0 } else { nonzero_bits };
    if total_bits % 8 != 0 || total_bits / 8 != u128::from(end - begin) {
        return None;
    }
    Some(StTensor {
        name,
        dtype,
        shape,
        begin,
        end,
    })
}

#[cfg(test)]
#[path = "st_header_tests.rs"]
mod tests;
