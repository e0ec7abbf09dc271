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

/// Why a path segment, percent-decoded (`decoded`), is ambiguous, if it
/// is.
pub fn ambiguous(decoded: &[u8]) -> Option<&'static str> {
    let Ok(text) = std::str::from_utf8(decoded) else {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `ambiguous` of a segment as `rules::check_path` decodes it.
    fn of(segment: &str) -> Option<&'static str> {
        let (decoded, _) = super::super::rules::percent_decoded(segment).expect("well-formed");
        ambiguous(&decoded)
    }

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
            assert!(of(segment).is_some(), "{segment}");
        }
    }

    #[test]
    fn names_and_other_characters_pass() {
        for segment in ["v1.2", "caf%C3%A9", "%E2%82%AC", "a%20b", "%41", "", "x"] {
            assert_eq!(of(segment), None, "{segment}");
        }
    }
}
