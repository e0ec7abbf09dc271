//! How the log writes a name the kernel gave (a path, a directory entry),
//! which need not be UTF-8. Used by the capture's decoder and the file
//! notifications alike, so one name is written one way.

use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

/// A kernel name as the log shows it: itself when it is UTF-8 without a
/// `\`; otherwise every byte that is not part of valid UTF-8 as `\xNN`
/// and every `\` as `\\`, so that two different names never show the
/// same: U+FFFD would let an agent give two files one name, or hide one
/// from the seal, and so would a UTF-8 name that spells an escape (the
/// four characters `\xff` beside the byte 0xff).
pub fn display(bytes: &[u8]) -> String {
    if let Ok(s) = std::str::from_utf8(bytes)
        && !s.contains('\\')
    {
        return s.to_string();
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' {
                out.push_str("\\\\");
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// The bytes that [`display`] shows as `shown`, when `shown` is an escaped
/// form (it holds a `\`); `None` for a name shown as it is.
pub fn undisplay(shown: &str) -> Option<Vec<u8>> {
    if !shown.contains('\\') {
        return None;
    }
    let bytes = shown.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], bytes.get(i + 1)) {
            (b'\\', Some(b'\\')) => {
                out.push(b'\\');
                i += 2;
            }
            (b'\\', Some(b'x')) => {
                out.push(u8::from_str_radix(shown.get(i + 2..i + 4)?, 16).ok()?);
                i += 4;
            }
            (b'\\', _) => return None,
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    (display(&out) == shown).then_some(out)
}

/// The path a name shown by [`display`] stands for on disk.
pub fn on_disk(shown: &str) -> std::path::PathBuf {
    use std::os::unix::ffi::OsStringExt as _;
    match undisplay(shown) {
        Some(raw) => std::ffi::OsString::from_vec(raw).into(),
        None => shown.into(),
    }
}

/// [`display`] of a path.
pub fn display_path(path: &Path) -> String {
    display(path.as_os_str().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_are_not_plain_are_shown_escaped_and_distinct() {
        assert_eq!(display(b"/w/plain name"), "/w/plain name");
        assert_eq!(display(b"/w/plain \\ name"), "/w/plain \\\\ name");
        assert_eq!(display(b"/w/\xff"), "/w/\\xff");
        assert_eq!(display(b"/w/\\\xfe"), "/w/\\\\\\xfe");
        assert_ne!(display(b"/w/\xff"), display(b"/w/\xfe"));
        // A UTF-8 name that spells an escape is not the byte it spells.
        assert_ne!(display(b"/w/\\xff"), display(b"/w/\xff"));
    }

    #[test]
    fn an_escaped_name_is_read_back_and_nothing_else_is() {
        for raw in [
            &b"/w/\xff"[..],
            b"/w/\\\xfe",
            b"/w/\xc3(\\x",
            b"/w/\\xff",
            b"/w/a\\b",
        ] {
            assert_eq!(undisplay(&display(raw)).as_deref(), Some(raw));
        }
        // A name shown as it is, or no escape `display` writes.
        for shown in ["/w/plain", "/w/\\x", "/w/\\x+f", "/w/\\q", "/w/\\xz1"] {
            assert_eq!(undisplay(shown), None, "{shown}");
        }
    }
}
