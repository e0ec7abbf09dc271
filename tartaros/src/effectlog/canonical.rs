//! Canonical JSON: the byte form every log line must have, so that the hash
//! chain is over a unique encoding and a verifier can reject any other one.
//!
//! Rules: object keys sorted by their UTF-8 bytes at every level, no
//! whitespace, integers only (a float is refused, never rounded), strings
//! escaped exactly as serde_json escapes them (`"`, `\`, control characters;
//! everything else raw UTF-8).

use std::fmt::Write;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::LogError;

/// Serializes `value` canonically; fails on any float.
pub fn to_canonical(value: &Value) -> Result<String, LogError> {
    // An effect record is 300-500 bytes: one allocation, no regrowth.
    let mut out = String::with_capacity(512);
    write_value(value, &mut out).map_err(|mut rev| {
        rev.push("$".to_string());
        rev.reverse();
        LogError::Float { at: rev.concat() }
    })?;
    Ok(out)
}

/// Hex SHA-256 of the canonical JSON of `policy`, as recorded in genesis.
pub fn policy_hash(policy: &Value) -> Result<String, LogError> {
    Ok(sha256_hex(to_canonical(policy)?.as_bytes()))
}

pub(crate) fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(sha256(bytes))
}

/// Parses `line` and reports whether it is exactly the canonical encoding of
/// what it parses to (so two different byte strings can never be "the same
/// record"). Returns the parsed value on success, a short reason otherwise.
pub(crate) fn parse_canonical(line: &[u8]) -> Result<Value, String> {
    let text = std::str::from_utf8(line).map_err(|_| "not valid UTF-8".to_string())?;
    let value: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON ({e})"))?;
    let again = to_canonical(&value).map_err(|_| "holds a float".to_string())?;
    if again != text {
        return Err("not in canonical form".to_string());
    }
    Ok(value)
}

// This runs for every record at up to 200k records/s, so it allocates nothing
// per value; on a float the error carries the path segments in reverse
// (collected while unwinding), which is the rare case.
pub(crate) fn write_value(value: &Value, out: &mut String) -> Result<(), Vec<String>> {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            // fmt::Write into a String cannot fail.
            let _ = if let Some(u) = n.as_u64() {
                write!(out, "{u}")
            } else if let Some(i) = n.as_i64() {
                write!(out, "{i}")
            } else {
                return Err(Vec::new());
            };
        }
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(item, out).map_err(|mut rev| {
                    rev.push(format!("[{i}]"));
                    rev
                })?;
            }
            out.push(']');
        }
        Value::Object(map) => {
            // serde_json's Map is sorted unless `preserve_order` is enabled
            // somewhere in the dependency graph; sort explicitly (only when
            // needed) so feature unification can never change the bytes we
            // hash.
            if map.keys().is_sorted_by(|a, b| a.as_bytes() <= b.as_bytes()) {
                write_entries(map.iter().map(|(k, v)| (k.as_str(), v)), out)?;
            } else {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
                write_entries(entries.into_iter().map(|(k, v)| (k.as_str(), v)), out)?;
            }
        }
    }
    Ok(())
}

/// An object from entries already in key order.
pub(crate) fn write_entries<'a>(
    entries: impl Iterator<Item = (&'a str, &'a Value)>,
    out: &mut String,
) -> Result<(), Vec<String>> {
    out.push('{');
    for (i, (key, v)) in entries.enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(key, out);
        out.push(':');
        write_value(v, out).map_err(|mut rev| {
            rev.push(format!(".{key}"));
            rev
        })?;
    }
    out.push('}');
    Ok(())
}

/// Same escaping as serde_json's compact writer, so a canonical line parses
/// and re-serializes to itself.
pub(crate) fn write_string(s: &str, out: &mut String) {
    out.push('"');
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let esc = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0..=0x1f => "",
            _ => continue,
        };
        // Bytes below 0x80 are whole characters, so these are char
        // boundaries.
        out.push_str(&s[start..i]);
        if esc.is_empty() {
            let _ = write!(out, "\\u{b:04x}");
        } else {
            out.push_str(esc);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sorts_keys_at_every_level_without_whitespace() {
        let v = json!({"b": 1, "a": {"z": [3, {"y": true, "x": null}], "c": "s"}});
        assert_eq!(
            to_canonical(&v).unwrap(),
            r#"{"a":{"c":"s","z":[3,{"x":null,"y":true}]},"b":1}"#
        );
    }

    #[test]
    fn sorts_keys_by_utf8_bytes() {
        let v = json!({"é": 1, "z": 2, "A": 3, "a": 4});
        assert_eq!(to_canonical(&v).unwrap(), r#"{"A":3,"a":4,"z":2,"é":1}"#);
    }

    #[test]
    fn refuses_floats_and_says_where() {
        let v = json!({"a": [1, {"b": 1.5}]});
        match to_canonical(&v) {
            Err(LogError::Float { at }) => assert_eq!(at, "$.a[1].b"),
            other => panic!("expected a float error, got {other:?}"),
        }
    }

    #[test]
    fn integers_at_the_extremes() {
        let v = json!([u64::MAX, i64::MIN, 0, -1]);
        assert_eq!(
            to_canonical(&v).unwrap(),
            format!("[{},{},0,-1]", u64::MAX, i64::MIN)
        );
    }

    #[test]
    fn escapes_like_serde_json() {
        let s = "q\" b\\ n\n t\t c\u{1} del\u{7f} é 😀 \u{2028}";
        let v = json!({ "s": s });
        assert_eq!(
            to_canonical(&v).unwrap(),
            serde_json::to_string(&v).unwrap()
        );
        let line = to_canonical(&v).unwrap();
        assert_eq!(parse_canonical(line.as_bytes()).unwrap(), v);
    }

    #[test]
    fn parse_canonical_rejects_other_encodings() {
        for bad in [
            r#"{"b":1,"a":2}"#,
            r#"{"a": 2}"#,
            r#"{"a":2} "#,
            r#"{"a":2.0}"#,
            r#"{"a":1e2}"#,
            r#"{"a":-0}"#,
            r#"{"a":"\u0041"}"#,
            r#"{"a":"\/"}"#,
            r#"{"a":1,"a":1}"#,
            r#"{"a":01}"#,
            "{\"a\":\"\u{0}\"}",
        ] {
            assert!(parse_canonical(bad.as_bytes()).is_err(), "{bad} accepted");
        }
        assert!(parse_canonical(b"{\"a\":\"\xff\"}").is_err());
        assert!(parse_canonical(br#"{"a":[1,{"b":"c"}]}"#).is_ok());
    }

    #[test]
    fn policy_hash_is_key_order_independent() {
        let a: Value = serde_json::from_str(r#"{"x":1,"y":[2]}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"y":[2],"x":1}"#).unwrap();
        assert_eq!(policy_hash(&a).unwrap(), policy_hash(&b).unwrap());
        assert_eq!(policy_hash(&a).unwrap().len(), 64);
    }
}
