//! Whether a response header echoes a secret back to the agent, in the
//! forms an upstream may echo it in (adversarial round 6: the bare
//! credential without its scheme passed, since only the exact injected
//! value was looked for).

/// Parts of a secret shorter than this are not looked for on their own:
/// an auth scheme (`Bearer`, `Basic`, `token`) is no secret and names
/// innocent headers too (`WWW-Authenticate: Bearer`).
pub const MIN_SECRET_PART: usize = 12;

/// Whether a response header value `haystack` holds `secret` (the token or
/// an injected value) in a form an upstream may echo it in: the whole
/// value, or any of its whitespace-separated parts of at least
/// [`MIN_SECRET_PART`] bytes (the credential without its `Bearer ` scheme,
/// as an error or debug header quotes it), in any ASCII case (hex tokens
/// mean the same in either), as is or percent-decoded (a redirect's
/// `Location` carrying it in a query). The header is dropped then: better
/// a lost debug header than a leaked credential.
pub fn echoes(haystack: &[u8], secret: &[u8]) -> bool {
    let decoded = percent_decoded(haystack);
    let parts = secret
        .split(u8::is_ascii_whitespace)
        .filter(|part| part.len() >= MIN_SECRET_PART);
    std::iter::once(secret).chain(parts).any(|needle| {
        super::rules::contains(haystack, needle) || super::rules::contains(&decoded, needle)
    })
}

/// `text` with every well-formed `%XX` escape decoded, and `+` as a space
/// (query strings); other bytes as they are.
fn percent_decoded(text: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let escape = match (text[i], text.get(i + 1), text.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) => hex(h).zip(hex(l)).map(|(h, l)| (h * 16 + l) as u8),
            _ => None,
        };
        match (escape, text[i]) {
            (Some(byte), _) => {
                out.push(byte);
                i += 3;
            }
            (None, b'+') => {
                out.push(b' ');
                i += 1;
            }
            (None, byte) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALUE: &[u8] = b"Bearer ghp_Up5treamCred/9f8e+7d==";

    #[test]
    fn echoes_in_every_form_are_found() {
        for header in [
            &b"Bearer ghp_Up5treamCred/9f8e+7d=="[..],
            b"token=\"ghp_Up5treamCred/9f8e+7d==\"",
            b"GHP_UP5TREAMCRED/9F8E+7D==",
            b"https://x.example/cb?t=ghp_Up5treamCred%2F9f8e%2B7d%3D%3D",
            b"https://x.example/cb?t=Bearer+ghp_Up5treamCred%2F9f8e%2b7d%3d%3d",
        ] {
            assert!(echoes(header, VALUE), "{}", String::from_utf8_lossy(header));
        }
    }

    #[test]
    fn the_scheme_alone_and_other_values_are_kept() {
        for header in [
            &b"Bearer realm=\"api\""[..],
            b"ghp_Up5treamCre",
            b"application/json",
            b"%zz%2",
        ] {
            assert!(
                !echoes(header, VALUE),
                "{}",
                String::from_utf8_lossy(header)
            );
        }
        // A secret without parts long enough is looked for whole only.
        assert!(!echoes(b"Basic", b"Basic abc"));
        assert!(echoes(b"x Basic abc", b"Basic abc"));
    }

    #[test]
    fn percent_decoding_is_lenient() {
        assert_eq!(percent_decoded(b"a%2Fb+c%zz%4"), b"a/b c%zz%4");
    }
}
