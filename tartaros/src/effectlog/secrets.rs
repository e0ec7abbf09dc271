//! Redaction guard: secret byte strings (the broker token, injected values)
//! must never reach the log, even if a caller puts one in a record by mistake.
//! The secrets themselves live in buffers that are zeroed when dropped.

use super::record::Target;
use serde_json::{Map, Value};

/// What a secret becomes: `[REDACTED <16 hex digits>]`, the digits drawn
/// at random for each writer (run). A fixed marker could be forged: an
/// agent that knows the broker token (it is handed one) made a file named
/// `note-[REDACTED].txt` and one named with the token; both became the same
/// name in the log, and the records of the second named the first. The
/// agent cannot read its run's log while the run lasts, so it cannot learn
/// the digits in time to name a file after them.
const MARKER_PREFIX: &[u8] = b"[REDACTED ";

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
    marker: Vec<u8>,
}

/// A fresh marker; the digits come from the kernel's random source.
fn fresh_marker() -> Vec<u8> {
    use std::io::Read;
    let mut digits = [0u8; 8];
    let drawn = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut digits));
    if drawn.is_err() {
        // Still unknown to the agent: the hasher's keys are drawn from the
        // OS at our start, and the clock's nanoseconds are ours.
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        digits = h.finish().to_le_bytes();
    }
    let mut marker = MARKER_PREFIX.to_vec();
    for b in digits {
        marker.extend_from_slice(format!("{b:02x}").as_bytes());
    }
    marker.push(b']');
    marker
}

impl Secrets {
    pub(crate) fn new(secrets: Vec<Vec<u8>>) -> Self {
        Self::with_marker(secrets, fresh_marker())
    }

    /// The marker this set writes in place of a secret.
    #[cfg(test)]
    pub(crate) fn marker(&self) -> &[u8] {
        &self.marker
    }

    pub(crate) fn with_marker(secrets: Vec<Vec<u8>>, marker: Vec<u8>) -> Self {
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
        Self { forms, marker }
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
            let (out, k) = replace_all(s.as_bytes(), secret, &self.marker);
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
            let (out, k) = replace_all(line, secret, &self.marker);
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

/// Non-overlapping, left-to-right replacement of `needle` with `marker`.
fn replace_all(hay: &[u8], needle: &[u8], marker: &[u8]) -> (Vec<u8>, usize) {
    let mut out = Vec::with_capacity(hay.len());
    let mut n = 0;
    let mut i = 0;
    while i < hay.len() {
        if hay[i..].starts_with(needle) {
            out.extend_from_slice(marker);
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

    fn fixed(secrets: Vec<Vec<u8>>) -> Secrets {
        Secrets::with_marker(secrets, b"[REDACTED]".to_vec())
    }

    #[test]
    fn each_set_draws_its_own_marker() {
        let a = Secrets::new(vec![b"tok".to_vec()]);
        let b = Secrets::new(vec![b"tok".to_vec()]);
        assert_ne!(a.marker(), b.marker());
        let text = String::from_utf8(a.marker().to_vec()).unwrap();
        let digits = text
            .strip_prefix("[REDACTED ")
            .and_then(|t| t.strip_suffix(']'))
            .unwrap();
        assert_eq!(digits.len(), 16);
        assert!(digits.bytes().all(|c| c.is_ascii_hexdigit()));
        let mut m = json!({"p": "note-tok.txt"}).as_object().cloned().unwrap();
        a.redact_map(&mut m);
        assert_eq!(m["p"], json!(format!("note-{text}.txt")));
    }

    #[test]
    fn redacts_strings_keys_and_nested_values() {
        let s = fixed(vec![b"tok-123".to_vec()]);
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
        let s = fixed(vec![b"a\"b".to_vec()]);
        let mut line = br#"{"x":"za\"bz"}"#.to_vec();
        assert_eq!(s.guard_line(&mut line), 1);
        assert_eq!(line, br#"{"x":"z[REDACTED]z"}"#.to_vec());
    }

    #[test]
    fn non_utf8_secret_and_empty_secret() {
        let s = fixed(vec![vec![0xff, 0xfe], Vec::new()]);
        let mut line = b"ab\xff\xfecd".to_vec();
        assert_eq!(s.guard_line(&mut line), 1);
        assert_eq!(line, b"ab[REDACTED]cd".to_vec());
        let mut clean = b"nothing here".to_vec();
        assert_eq!(s.guard_line(&mut clean), 0);
    }

    #[test]
    fn split_multibyte_character_stays_valid_utf8() {
        // "é" is C3 A9; a secret ending in C3 cuts it.
        let s = fixed(vec![b"x\xc3".to_vec()]);
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
