//! Reversible encodings of a secret that an upstream may echo it in
//! (adversarial round 9). Round 8's body scan knew the value as is,
//! JSON-escaped and percent-encoded; an upstream answering with base64 of
//! a document that quotes the request (a debug blob, a JSON field of
//! bytes), a hex dump, UTF-16 (picked from `Accept-Charset`), `\u00XX`
//! escapes, or the user and password of a `Basic` credential decoded,
//! handed the agent the credential to decode. Each encoding here maps the
//! secret to a fixed set of strings, so the scan finds them as it finds
//! the plain value.

use base64::Engine;
use zeroize::Zeroizing;

/// A password inside a decoded `Basic` credential is looked for on its
/// own from this length: shorter ones would mask innocent words, and a
/// password that short is guessed anyway.
const MIN_BASIC_PASSWORD: usize = 8;

/// The strings that encode `needle` byte by byte: lower-case hex (the
/// scan ignores case), UTF-16 in both byte orders and `\u00XX` escapes
/// of every byte.
pub(super) fn bytewise_forms(needle: &[u8]) -> [Zeroizing<Vec<u8>>; 4] {
    let mut hex = Zeroizing::new(Vec::with_capacity(needle.len() * 2));
    let mut utf16le = Zeroizing::new(Vec::with_capacity(needle.len() * 2));
    let mut utf16be = Zeroizing::new(Vec::with_capacity(needle.len() * 2));
    let mut escaped = Zeroizing::new(Vec::with_capacity(needle.len() * 6));
    let digits = b"0123456789abcdef";
    for &b in needle {
        let pair = [digits[usize::from(b >> 4)], digits[usize::from(b & 15)]];
        hex.extend(pair);
        utf16le.extend([b, 0]);
        utf16be.extend([0, b]);
        escaped.extend([b'\\', b'u', b'0', b'0']);
        escaped.extend(pair);
    }
    [hex, utf16le, utf16be, escaped]
}

/// The base64 forms of `needle` wherever it sits in an encoded stream,
/// in the standard and the URL-safe alphabet: for each alignment (0, 1
/// or 2 bytes of a neighbour before it in its group of three), the
/// characters of the encoding that hold only its bits. The one or two at
/// each end that mix in a neighbour's bits are not part of it, so at most
/// a byte at either end of the secret can be read from what the scan
/// leaves (fewer than [`super::echo::MIN_SECRET_PART`], as a run between
/// two unknown escapes is).
pub(super) fn base64_forms(needle: &[u8]) -> Vec<Zeroizing<Vec<u8>>> {
    let engines = [
        base64::engine::general_purpose::STANDARD_NO_PAD,
        base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ];
    let mut forms = Vec::with_capacity(6);
    for shift in 0..3usize {
        let mut shifted = Zeroizing::new(vec![0u8; shift]);
        shifted.extend_from_slice(needle);
        // Character i holds bits 6i..6i+6 of the stream; the needle's
        // are bits 8*shift..8*(shift+len).
        let first = (8 * shift).div_ceil(6);
        let end = 8 * (shift + needle.len()) / 6;
        if end <= first {
            continue;
        }
        for engine in &engines {
            let encoded = Zeroizing::new(engine.encode(shifted.as_slice()).into_bytes());
            if let Some(own) = encoded.get(first..end) {
                forms.push(Zeroizing::new(own.to_vec()));
            }
        }
    }
    forms
}

/// What a `Basic` credential (`Basic <base64 of user:password>`) holds
/// decoded: the password alone when it is at least
/// [`MIN_BASIC_PASSWORD`] bytes long, then the `user:password` pair (so
/// two entries mean the first is the password). Empty for any other
/// value.
pub(super) fn basic_decoded(secret: &[u8]) -> Vec<Zeroizing<Vec<u8>>> {
    let Some(scheme) = secret.get(..6) else {
        return Vec::new();
    };
    if !scheme.eq_ignore_ascii_case(b"basic ") {
        return Vec::new();
    }
    let encoded = secret[6..].trim_ascii();
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded) else {
        return Vec::new();
    };
    let decoded = Zeroizing::new(decoded);
    let mut out = Vec::with_capacity(2);
    if let Some(colon) = decoded.iter().position(|&b| b == b':') {
        let password = &decoded[colon + 1..];
        if password.len() >= MIN_BASIC_PASSWORD {
            out.push(Zeroizing::new(password.to_vec()));
        }
    }
    out.push(decoded);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether one of `forms` occurs in `text`, in any ASCII case (as
    /// the scan matches).
    fn holds(forms: &[Zeroizing<Vec<u8>>], text: &[u8]) -> bool {
        forms.iter().any(|form| {
            text.windows(form.len())
                .any(|w| w.eq_ignore_ascii_case(form.as_slice()))
        })
    }

    #[test]
    fn base64_of_a_stream_holds_a_form_at_every_alignment() {
        let secret = b"ghp_Up5treamCred/9f8e+7d==";
        let forms = base64_forms(secret);
        for engine in [
            base64::engine::general_purpose::STANDARD,
            base64::engine::general_purpose::URL_SAFE,
        ] {
            for prefix in ["", "a", "ab", "abc", "{\"x\": \""] {
                for suffix in ["", "\"", "\"}", "!!!"] {
                    let stream = [prefix.as_bytes(), secret, suffix.as_bytes()].concat();
                    let encoded = engine.encode(&stream);
                    assert!(holds(&forms, encoded.as_bytes()), "{prefix:?} {suffix:?}");
                }
            }
        }
    }

    #[test]
    fn byte_wise_encodings_are_found() {
        let forms = bytewise_forms(b"ghp_Up5treamCred");
        let hex = format!("x {} y", hex::encode(b"ghp_Up5treamCred").to_uppercase());
        for text in [
            hex.as_bytes(),
            b"g\0h\0p\0_\0U\0p\x005\0t\0r\0e\0a\0m\0C\0r\0e\0d\0",
            b"\0g\0h\0p\0_\0U\0p\x005\0t\0r\0e\0a\0m\0C\0r\0e\0d",
            b"\\u0067\\u0068\\u0070\\u005f\\u0055\\u0070\\u0035\\u0074\\u0072\\u0065\\u0061\\u006d\\u0043\\u0072\\u0065\\u0064",
        ] {
            assert!(holds(&forms, text), "{}", String::from_utf8_lossy(text));
        }
    }

    #[test]
    fn a_basic_credential_yields_its_pair_and_long_password() {
        // deploy-bot:s3cret-Passw0rd-77
        let found = basic_decoded(b"Basic ZGVwbG95LWJvdDpzM2NyZXQtUGFzc3cwcmQtNzc=");
        let found: Vec<&[u8]> = found.iter().map(|f| f.as_slice()).collect();
        assert_eq!(
            found,
            [&b"s3cret-Passw0rd-77"[..], b"deploy-bot:s3cret-Passw0rd-77"]
        );
        // user:short
        let short = basic_decoded(b"basic dXNlcjpzaG9ydA==");
        assert_eq!(short.len(), 1);
        assert!(basic_decoded(b"Bearer ZGVwbG95").is_empty());
        assert!(basic_decoded(b"Basic !!!").is_empty());
        assert!(basic_decoded(b"Basi").is_empty());
    }
}
