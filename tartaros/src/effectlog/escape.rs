//! Every string a reader prints comes from a log, and most of a log comes
//! from the agent (paths, argv, host names). These two functions are the only
//! way such a string reaches a reviewer's terminal or an HTML page.
//!
//! [`terminal`] makes a string inert and unambiguous on a terminal: control
//! characters (C0, DEL, C1, so ESC and CSI too), bidi overrides and other
//! invisible formatting characters are written as Rust-style escapes
//! (`\u{1b}`, `\n`), and a backslash as `\\`, so an escape can never be
//! mistaken for the characters it stands for. [`html`] is the same text with
//! `& < > " '` as entities, safe in element content and in quoted
//! attributes.

use std::fmt::Write as _;

/// `s` made safe and unambiguous for a terminal, cut after `max_chars`
/// characters of input with a visible `…[+N bytes]` marker (bounded output
/// even for a 10 MB path).
pub fn terminal_capped(s: &str, max_chars: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max_chars.saturating_mul(2)));
    for (taken, (at, c)) in s.char_indices().enumerate() {
        if taken == max_chars {
            let _ = write!(out, "…[+{} bytes]", s.len() - at);
            return out;
        }
        push_escaped(&mut out, c);
    }
    out
}

/// `s` made safe and unambiguous for a terminal, uncut.
pub fn terminal(s: &str) -> String {
    terminal_capped(s, usize::MAX)
}

/// `s` as HTML text: [`terminal_capped`]'s escapes (so invisible and bidi
/// characters show on the page too), then the five HTML specials as
/// entities.
pub fn html_capped(s: &str, max_chars: usize) -> String {
    entities(&terminal_capped(s, max_chars))
}

/// The HTML specials of text that [`terminal`] already escaped (escaping
/// it again would double its backslashes).
pub(crate) fn entities(safe: &str) -> String {
    let mut out = String::with_capacity(safe.len() + 16);
    for c in safe.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// [`html_capped`] without a cap.
pub fn html(s: &str) -> String {
    html_capped(s, usize::MAX)
}

/// Text that [`terminal`] already escaped, as one field of a reader's
/// line: in double quotes (its own `"` as `\\"`) when it could be read as
/// more than one field or as the reader's own words: empty, holding a
/// space or a quote (a TLS server name `pypi.org:443  1 allowed`, an
/// argument `make test; echo pwned`), or holding an arrow the readers
/// join fields with (`<-` before a parent in an ancestry, `->` after a
/// rename's source). The one rule for `log show`'s values and the
/// summary's paths and destinations; [`quoted_word`] for argv.
pub(crate) fn quoted(escaped: &str) -> String {
    quote_if(escaped, false)
}

/// [`quoted`] for one word of a command line, where a word that starts
/// with `[` is quoted too: the words `[runs` `/usr/bin/make]` or `[exit`
/// `code` `0]` would read as the readers' own notes after a command.
pub(crate) fn quoted_word(escaped: &str) -> String {
    quote_if(escaped, escaped.starts_with('['))
}

fn quote_if(escaped: &str, also: bool) -> String {
    let ambiguous = also
        || escaped.is_empty()
        || escaped.contains(char::is_whitespace)
        || escaped.contains(['"', '\''])
        || escaped.contains("<-")
        || escaped.contains("->");
    if ambiguous {
        format!("\"{}\"", escaped.replace('"', "\\\""))
    } else {
        escaped.to_string()
    }
}

/// Raw bytes (a line that is not UTF-8): valid runs as [`terminal`],
/// each invalid byte as `\x{..}`.
pub fn terminal_bytes(bytes: &[u8], max_chars: usize) -> String {
    let mut out = String::new();
    let mut chars = 0usize;
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if chars == max_chars {
                out.push('…');
                return out;
            }
            push_escaped(&mut out, c);
            chars += 1;
        }
        for b in chunk.invalid() {
            if chars == max_chars {
                out.push('…');
                return out;
            }
            let _ = write!(out, "\\x{{{b:02x}}}");
            chars += 1;
        }
    }
    out
}

/// Characters a terminal shows as nothing, or as an ordinary space: a name
/// holding one would show as another name (`notes.txt` + U+3164 HANGUL
/// FILLER looks like `notes.txt`; `my` U+00A0 `notes` like `my notes`).
/// The class is Unicode's own rather than a list of known tricks: every
/// `Default_Ignorable_Code_Point` (bidi marks and overrides, zero-width
/// characters, fillers, variation selectors, tags), every `White_Space`
/// character but the ASCII space, the other format controls (`Cf`: the
/// Arabic number signs, interlinear annotation) and the blank Braille
/// pattern.
pub(crate) fn is_invisible(c: char) -> bool {
    matches!(c,
        // Default_Ignorable_Code_Point (Unicode 16 DerivedCoreProperties).
        '\u{00ad}'
        | '\u{034f}'
        | '\u{061c}'
        | '\u{115f}'..='\u{1160}'
        | '\u{17b4}'..='\u{17b5}'
        | '\u{180b}'..='\u{180f}'
        | '\u{200b}'..='\u{200f}'
        | '\u{202a}'..='\u{202e}'
        | '\u{2060}'..='\u{206f}'
        | '\u{3164}'
        | '\u{fe00}'..='\u{fe0f}'
        | '\u{feff}'
        | '\u{ffa0}'
        | '\u{fff0}'..='\u{fff8}'
        | '\u{1bca0}'..='\u{1bca3}'
        | '\u{1d173}'..='\u{1d17a}'
        | '\u{e0000}'..='\u{e0fff}'
        // White_Space other than ' ' (the C0/C1 ones are controls).
        | '\u{00a0}'
        | '\u{1680}'
        | '\u{2000}'..='\u{200a}'
        | '\u{2028}'..='\u{2029}'
        | '\u{202f}'
        | '\u{205f}'
        | '\u{3000}'
        // Other format controls (Cf) that render as nothing or mark up
        // the text after them.
        | '\u{0600}'..='\u{0605}'
        | '\u{06dd}'
        | '\u{070f}'
        | '\u{0890}'..='\u{0891}'
        | '\u{08e2}'
        | '\u{fff9}'..='\u{fffb}'
        | '\u{110bd}'
        | '\u{110cd}'
        | '\u{13430}'..='\u{1343f}'
        // Shown blank, though not a space.
        | '\u{2800}')
}

/// Appends `c`, escaped as [`terminal`] does.
pub(crate) fn push_escaped(out: &mut String, c: char) {
    match c {
        '\\' => out.push_str("\\\\"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if c.is_control() || is_invisible(c) || (is_stacking_mark(c) && !mark_fits(out)) => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
        c => out.push(c),
    }
}

/// Combining marks of the blocks that belong to no script (diacritics,
/// marks for symbols, half marks, enclosing circles): any number of them
/// may follow one letter, and stacked by the dozen they grow far above
/// and below the line, over the lines around it (on the report's page,
/// over other rows). Scripts' own marks (Devanagari, Arabic) are left as
/// they are: their text needs them and a font draws few on one letter.
fn is_stacking_mark(c: char) -> bool {
    matches!(c,
        '\u{0300}'..='\u{036f}'
        | '\u{0483}'..='\u{0489}'
        | '\u{1ab0}'..='\u{1aff}'
        | '\u{1dc0}'..='\u{1dff}'
        | '\u{20d0}'..='\u{20ff}'
        | '\u{fe20}'..='\u{fe2f}')
}

/// Whether a mark may be shown on what `out` ends with: a letter or digit
/// (never a reader's own separator: `path=` + U+0338 reads `path≠`, and
/// a string's first character joins whatever the reader printed before
/// it) carrying fewer than two marks already. Two are enough for any
/// language written with these blocks (Vietnamese `ệ`).
fn mark_fits(out: &str) -> bool {
    let mut before = out.chars().rev();
    for _ in 0..2 {
        match before.next() {
            Some(c) if is_stacking_mark(c) => continue,
            Some(c) => return c.is_alphanumeric(),
            None => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_bidi_and_backslashes_become_visible_escapes() {
        assert_eq!(
            terminal("/w/\u{1b}[2J\u{202e}x\n\\"),
            r"/w/\u{1b}[2J\u{202e}x\n\\"
        );
        assert_eq!(
            terminal("\u{9b}31m\u{7f}\u{200b}\u{2028}"),
            r"\u{9b}31m\u{7f}\u{200b}\u{2028}"
        );
        assert_eq!(terminal("naïve 日本 ok"), "naïve 日本 ok");
    }

    #[test]
    fn output_is_cut_visibly() {
        let long = "a".repeat(10_000);
        let cut = terminal_capped(&long, 8);
        assert_eq!(cut, "aaaaaaaa…[+9992 bytes]");
        assert_eq!(terminal_capped("abc", 3), "abc");
    }

    #[test]
    fn html_escapes_specials_after_controls() {
        assert_eq!(
            html("<script>alert('x')</script>&\"\u{1b}"),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;\\u{1b}"
        );
    }

    #[test]
    fn invalid_utf8_bytes_are_shown_as_hex() {
        assert_eq!(terminal_bytes(b"a\xff\x1bb", 100), r"a\x{ff}\u{1b}b");
        assert_eq!(terminal_bytes(b"abcdef", 3), "abc…");
    }

    #[test]
    fn blank_and_space_like_characters_are_escaped() {
        for (c, shown) in [
            ('\u{3164}', r"\u{3164}"),
            ('\u{115f}', r"\u{115f}"),
            ('\u{a0}', r"\u{a0}"),
            ('\u{2002}', r"\u{2002}"),
            ('\u{3000}', r"\u{3000}"),
            ('\u{fe0f}', r"\u{fe0f}"),
            ('\u{34f}', r"\u{34f}"),
            ('\u{1d173}', r"\u{1d173}"),
            ('\u{e0100}', r"\u{e0100}"),
            ('\u{2800}', r"\u{2800}"),
        ] {
            assert_eq!(terminal(&format!("a{c}b")), format!("a{shown}b"));
        }
        assert_eq!(terminal("my notes.txt"), "my notes.txt");
    }

    #[test]
    fn combining_marks_show_on_a_letter_two_at_most() {
        assert_eq!(terminal("e\u{301}t\u{1ec7}"), "e\u{301}t\u{1ec7}");
        assert_eq!(terminal("e\u{302}\u{323}"), "e\u{302}\u{323}");
        assert_eq!(
            terminal("z\u{336}\u{489}\u{336}\u{489}"),
            format!("z\u{336}\u{489}{}", r"\u{336}\u{489}")
        );
        assert_eq!(terminal("\u{338}x"), r"\u{338}x");
        assert_eq!(terminal("a \u{20dd}"), r"a \u{20dd}");
        assert_eq!(terminal("\\\u{301}"), r"\\\u{301}");
    }

    #[test]
    fn fields_that_read_as_several_or_as_the_readers_words_are_quoted() {
        assert_eq!(quoted("/w/a.txt"), "/w/a.txt");
        assert_eq!(quoted("[::1]:443"), "[::1]:443");
        assert_eq!(quoted(""), r#""""#);
        assert_eq!(quoted("a  1 allowed"), r#""a  1 allowed""#);
        assert_eq!(quoted("<-"), r#""<-""#);
        assert_eq!(quoted("a->b"), r#""a->b""#);
        assert_eq!(quoted(r#"q"x"#), r#""q\"x""#);
        assert_eq!(quoted_word("[runs"), r#""[runs""#);
        assert_eq!(quoted_word("x[1]"), "x[1]");
    }

    #[test]
    fn no_escaped_output_holds_a_control_or_invisible_char() {
        for cp in (0u32..0x3200)
            .chain(0xe0000..0xe1000)
            .chain(0xfe00..0x10000)
        {
            if let Some(c) = char::from_u32(cp) {
                let s = terminal(&c.to_string());
                assert!(
                    s.chars().all(|o| !o.is_control() && !is_invisible(o)),
                    "{cp:x} -> {s:?}"
                );
            }
        }
    }
}
