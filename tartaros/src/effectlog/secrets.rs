//! Redaction guard: secret byte strings (the broker token, injected values)
//! must never reach the log, even if a caller puts one in a record by mistake.
//! The secrets themselves live in buffers that are zeroed when dropped.

use super::record::Target;
use serde_json::{Map, Value};

pub(crate) const REDACTED: &[u8] = b"[REDACTED]";

/// Overwrites `buf` with zeros in a way the optimizer may not elide (a plain
/// fill right before a free is a dead store it is allowed to drop).
pub(crate) fn zeroize(buf: &mut [u8]) {
    for b in buf.iter_mut() {
        // SAFETY: `b` is a valid, aligned, exclusive reference to a u8.
        unsafe { std::ptr::write_volatile(b, 0) };
    }
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

pub(crate) fn zeroize_vec(mut buf: Vec<u8>) {
    // Zero the spare capacity too: bytes past `len` may hold an older copy.
    buf.resize(buf.capacity(), 0);
    zeroize(&mut buf);
}

/// The registered secrets, each in raw form and, when it is UTF-8 whose JSON
/// encoding differs (quotes, backslashes, control characters), in that
/// escaped form too, since that is how it would appear inside a line.
#[derive(Default)]
pub(crate) struct Secrets {
    forms: Vec<Vec<u8>>,
}

impl Secrets {
    pub(crate) fn new(secrets: Vec<Vec<u8>>) -> Self {
        let mut forms = Vec::new();
        for s in secrets {
            // An empty secret would "occur" everywhere.
            if s.is_empty() {
                continue;
            }
            if let Ok(text) = std::str::from_utf8(&s) {
                let mut quoted = super::canonical::to_canonical(&Value::String(text.to_string()))
                    .unwrap_or_default()
                    .into_bytes();
                // Strip the surrounding quotes; `quoted` is at least `""`.
                let escaped = quoted
                    .get(1..quoted.len().saturating_sub(1))
                    .map(<[u8]>::to_vec);
                zeroize_vec(std::mem::take(&mut quoted));
                if let Some(e) = escaped {
                    if e != s && !e.is_empty() {
                        forms.push(e);
                    } else {
                        zeroize_vec(e);
                    }
                }
            }
            forms.push(s);
        }
        Self { forms }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.forms.is_empty()
    }

    /// Redacts every string and key inside `map`, zeroing the replaced
    /// originals. Returns how many occurrences were replaced.
    pub(crate) fn redact_map(&self, map: &mut Map<String, Value>) -> usize {
        if self.is_empty() {
            return 0;
        }
        let mut n: usize = map.values_mut().map(|v| self.redact_value(v)).sum();
        // Keys rarely hold a secret; only those that do are re-inserted.
        let dirty: Vec<String> = map
            .keys()
            .filter(|k| self.occurs(k.as_bytes()))
            .cloned()
            .collect();
        for key in dirty {
            if let Some((mut k, v)) = map.remove_entry(&key) {
                n += self.redact_string(&mut k);
                map.insert(k, v);
            }
            zeroize_vec(key.into_bytes());
        }
        n
    }

    /// [`Self::redact_map`] for a typed record's target.
    pub(crate) fn redact_target(&self, target: &mut Target) -> usize {
        if self.is_empty() {
            return 0;
        }
        let mut n = 0;
        for (key, value) in target.entries_mut() {
            n += self.redact_value(value);
            if self.occurs(key.as_bytes()) {
                let mut owned = std::mem::take(key).into_owned();
                n += self.redact_string(&mut owned);
                *key = owned.into();
            }
        }
        n
    }

    fn occurs(&self, hay: &[u8]) -> bool {
        self.forms.iter().any(|s| find(hay, s).is_some())
    }

    fn redact_value(&self, v: &mut Value) -> usize {
        match v {
            Value::String(s) => self.redact_string(s),
            Value::Array(items) => items.iter_mut().map(|i| self.redact_value(i)).sum(),
            Value::Object(map) => self.redact_map(map),
            Value::Null | Value::Bool(_) | Value::Number(_) => 0,
        }
    }

    fn redact_string(&self, s: &mut String) -> usize {
        let mut n = 0;
        for secret in &self.forms {
            // The common case (no secret) must not allocate: this runs on
            // every string of every record.
            if find(s.as_bytes(), secret).is_none() {
                continue;
            }
            let (out, k) = replace_all(s.as_bytes(), secret);
            if k > 0 {
                n += k;
                // A secret may split a multi-byte character; the remnants
                // become U+FFFD rather than invalid UTF-8.
                let new = String::from_utf8_lossy(&out).into_owned();
                zeroize_vec(out);
                let old = std::mem::replace(s, new);
                zeroize_vec(old.into_bytes());
            }
        }
        n
    }

    /// Last line of defence on the serialized line: a secret that spans JSON
    /// syntax or sits in a number survives value redaction. Replacing it may
    /// leave the line non-canonical, which `verify` then flags: a visible
    /// broken line is better than a leaked secret.
    pub(crate) fn guard_line(&self, line: &mut Vec<u8>) -> usize {
        let mut n = 0;
        for secret in &self.forms {
            if find(line, secret).is_none() {
                continue;
            }
            let (out, k) = replace_all(line, secret);
            n += k;
            let old = std::mem::replace(line, out);
            zeroize_vec(old);
        }
        n
    }
}

impl Drop for Secrets {
    fn drop(&mut self) {
        for f in self.forms.drain(..) {
            zeroize_vec(f);
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || needle.len() > hay.len() {
        return None;
    }
    let first = needle[0];
    (0..=hay.len() - needle.len()).find(|&i| hay[i] == first && hay[i..].starts_with(needle))
}

/// Non-overlapping, left-to-right replacement of `needle` with REDACTED.
fn replace_all(hay: &[u8], needle: &[u8]) -> (Vec<u8>, usize) {
    let mut out = Vec::with_capacity(hay.len());
    let mut n = 0;
    let mut i = 0;
    while i < hay.len() {
        if hay[i..].starts_with(needle) {
            out.extend_from_slice(REDACTED);
            i += needle.len();
            n += 1;
        } else {
            out.push(hay[i]);
            i += 1;
        }
    }
    (out, n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn redacts_strings_keys_and_nested_values() {
        let s = Secrets::new(vec![b"tok-123".to_vec()]);
        let mut m = json!({
            "a": "Bearer tok-123!",
            "tok-123": 1,
            "n": [{"x": "tok-123tok-123"}],
            "k": 5
        })
        .as_object()
        .cloned()
        .unwrap();
        assert_eq!(s.redact_map(&mut m), 4);
        assert_eq!(
            Value::Object(m),
            json!({
                "a": "Bearer [REDACTED]!",
                "[REDACTED]": 1,
                "n": [{"x": "[REDACTED][REDACTED]"}],
                "k": 5
            })
        );
    }

    #[test]
    fn escaped_form_is_caught_on_the_line() {
        let s = Secrets::new(vec![b"a\"b".to_vec()]);
        let mut line = br#"{"x":"za\"bz"}"#.to_vec();
        assert_eq!(s.guard_line(&mut line), 1);
        assert_eq!(line, br#"{"x":"z[REDACTED]z"}"#.to_vec());
    }

    #[test]
    fn non_utf8_secret_and_empty_secret() {
        let s = Secrets::new(vec![vec![0xff, 0xfe], Vec::new()]);
        let mut line = b"ab\xff\xfecd".to_vec();
        assert_eq!(s.guard_line(&mut line), 1);
        assert_eq!(line, b"ab[REDACTED]cd".to_vec());
        let mut clean = b"nothing here".to_vec();
        assert_eq!(s.guard_line(&mut clean), 0);
    }

    #[test]
    fn split_multibyte_character_stays_valid_utf8() {
        // "é" is C3 A9; a secret ending in C3 cuts it.
        let s = Secrets::new(vec![b"x\xc3".to_vec()]);
        let mut m = json!({"p": "xé"}).as_object().cloned().unwrap();
        assert_eq!(s.redact_map(&mut m), 1);
        assert_eq!(m["p"], json!("[REDACTED]\u{fffd}"));
    }

    #[test]
    fn zeroize_clears_bytes() {
        let mut b = b"secret".to_vec();
        zeroize(&mut b);
        assert_eq!(b, vec![0; 6]);
    }
}
