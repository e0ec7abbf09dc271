//! Percent-encoded path segments whose meaning depends on how the upstream
//! decodes them (adversarial round 6): overlong or otherwise invalid UTF-8
//! (`%C0%AE` is `.` to a lenient decoder), and characters that Unicode
//! compatibility normalization (NFKC, which some frameworks apply to paths)
//! turns into `.`, `/`, `\`, `;` or `%` (`%EF%BC%8E`, FULLWIDTH FULL STOP).
//! Either could make a segment a dot segment, or split it, past the
//! broker's `path_prefix` check. Like the rest of `rules::check_path`, the
//! broker refuses them rather than guess the upstream's rules.

/// Every character whose NFKC form holds `.`, `/`, `\`, `;` or `%`
/// (Unicode 14; generated with Python's `unicodedata.normalize("NFKC", c)`
/// over every code point above U+007F), as inclusive ranges.
const COMPAT_PUNCTUATION: &[(u32, u32)] = &[
    (0x037E, 0x037E),   // GREEK QUESTION MARK → ;
    (0x2024, 0x2026),   // ONE/TWO DOT LEADER, HORIZONTAL ELLIPSIS → . .. ...
    (0x2100, 0x2101),   // ACCOUNT OF, ADDRESSED TO THE SUBJECT → a/c a/s
    (0x2105, 0x2106),   // CARE OF, CADA UNA → c/o c/u
    (0x2488, 0x249B),   // DIGIT ONE FULL STOP .. NUMBER TWENTY FULL STOP
    (0x33C2, 0x33C2),   // SQUARE AM → a.m.
    (0x33C7, 0x33C7),   // SQUARE CO → Co.
    (0x33D8, 0x33D8),   // SQUARE PM → p.m.
    (0xFE14, 0xFE14),   // VERTICAL SEMICOLON → ;
    (0xFE19, 0xFE19),   // VERTICAL HORIZONTAL ELLIPSIS → ...
    (0xFE30, 0xFE30),   // VERTICAL TWO DOT LEADER → ..
    (0xFE52, 0xFE52),   // SMALL FULL STOP → .
    (0xFE54, 0xFE54),   // SMALL SEMICOLON → ;
    (0xFE68, 0xFE68),   // SMALL REVERSE SOLIDUS → \
    (0xFE6A, 0xFE6A),   // SMALL PERCENT SIGN → %
    (0xFF05, 0xFF05),   // FULLWIDTH PERCENT SIGN → %
    (0xFF0E, 0xFF0F),   // FULLWIDTH FULL STOP, SOLIDUS → . /
    (0xFF1B, 0xFF1B),   // FULLWIDTH SEMICOLON → ;
    (0xFF3C, 0xFF3C),   // FULLWIDTH REVERSE SOLIDUS → \
    (0x1F100, 0x1F100), // DIGIT ZERO FULL STOP → 0.
];

/// Why the percent-decoded form of `segment` is ambiguous, if it is.
/// Malformed escapes are left to the caller (`None` here).
pub fn ambiguous(segment: &str) -> Option<&'static str> {
    let decoded = decoded(segment)?;
    let Ok(text) = std::str::from_utf8(&decoded) else {
        return Some("percent-encoded bytes that are not UTF-8 refused in the path");
    };
    text.chars()
        .any(|c| {
            COMPAT_PUNCTUATION
                .iter()
                .any(|&(low, high)| (low..=high).contains(&u32::from(c)))
        })
        .then_some("characters that normalize to . / \\ ; or % refused in the path")
}

/// `segment` with its `%XX` escapes decoded; `None` when one is malformed.
fn decoded(segment: &str) -> Option<Vec<u8>> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlong_and_compatibility_forms_are_ambiguous() {
        for segment in [
            "%C0%AE%C0%AE",
            "%E0%80%AE",
            "%C0%AF",
            "%FF",
            "x%ED%A0%80", // a UTF-16 surrogate
            "%EF%BC%8E%EF%BC%8E",
            "a%EF%BC%8Fb",
            "%E2%80%A5",
            "%CD%BE",
            "%EF%B9%A8",
            "%F0%9F%84%80",
        ] {
            assert!(ambiguous(segment).is_some(), "{segment}");
        }
    }

    #[test]
    fn names_and_other_characters_pass() {
        for segment in ["v1.2", "caf%C3%A9", "%E2%82%AC", "a%20b", "%41", "", "x"] {
            assert_eq!(ambiguous(segment), None, "{segment}");
        }
        // Malformed escapes are the caller's to refuse.
        assert_eq!(ambiguous("%zz"), None);
    }
}
