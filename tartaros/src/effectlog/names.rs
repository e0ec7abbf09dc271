//! How the log writes a name the kernel gave (a path, a directory entry),
//! which need not be UTF-8. Used by the capture's decoder and the file
//! notifications alike, so one name is written one way.

use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

/// A kernel name as the log shows it: itself when it is UTF-8; otherwise
/// every byte that is not part of valid UTF-8 as `\xNN` and every `\` as
/// `\\`, so that two different names never show the same (U+FFFD would
/// let an agent give two files one name, or hide one from the seal).
pub fn display(bytes: &[u8]) -> String {
    if let Ok(s) = std::str::from_utf8(bytes) {
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

/// [`display`] of a path.
pub fn display_path(path: &Path) -> String {
    display(path.as_os_str().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_are_not_utf8_are_shown_escaped_and_distinct() {
        assert_eq!(display(b"/w/plain \\ name"), "/w/plain \\ name");
        assert_eq!(display(b"/w/\xff"), "/w/\\xff");
        assert_eq!(display(b"/w/\\\xfe"), "/w/\\\\\\xfe");
        assert_ne!(display(b"/w/\xff"), display(b"/w/\xfe"));
    }
}
