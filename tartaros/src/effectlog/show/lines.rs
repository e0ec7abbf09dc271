//! Streams a log one record at a time with bounded memory: a line over
//! [`MAX_LINE_BYTES`] is skipped (read through to its newline, never held),
//! and a line that is not a JSON object is reported, not fatal.

use std::io::{BufRead, ErrorKind};

use serde_json::{Map, Value};

use crate::effectlog::MAX_LINE_BYTES;

/// One line of a log, as a reader sees it.
pub(crate) enum Line {
    Record(Map<String, Value>),
    /// Why the line is not a record (fixed text, safe to print).
    Unreadable(&'static str),
}

pub(crate) struct Lines<R> {
    reader: R,
    buf: Vec<u8>,
    /// 1-based number of the line last returned.
    pub(crate) lineno: u64,
}

impl<R: BufRead> Lines<R> {
    pub(crate) fn new(reader: R) -> Self {
        Self {
            reader,
            buf: Vec::new(),
            lineno: 0,
        }
    }

    /// The reader, for what the caller does after the last line.
    pub(crate) fn into_inner(self) -> R {
        self.reader
    }

    /// The next line, `None` at the end of the file.
    pub(crate) fn next_line(&mut self) -> std::io::Result<Option<Line>> {
        self.buf.clear();
        let limit = MAX_LINE_BYTES as u64 + 1;
        let n = std::io::Read::take(&mut self.reader, limit).read_until(b'\n', &mut self.buf)?;
        if n == 0 {
            return Ok(None);
        }
        self.lineno += 1;
        if self.buf.len() > MAX_LINE_BYTES && self.buf.last() != Some(&b'\n') {
            self.buf = Vec::new();
            self.skip_rest()?;
            return Ok(Some(Line::Unreadable("longer than the 16 MiB line limit")));
        }
        let line = self.buf.strip_suffix(b"\n").unwrap_or(&self.buf);
        let parsed = match serde_json::from_slice::<Value>(line) {
            Ok(Value::Object(m)) => Line::Record(m),
            Ok(_) => Line::Unreadable("not a JSON object"),
            Err(_) if std::str::from_utf8(line).is_err() => Line::Unreadable("not UTF-8"),
            Err(_) => Line::Unreadable("not valid JSON"),
        };
        Ok(Some(parsed))
    }

    /// Consumes input up to and including the next newline.
    fn skip_rest(&mut self) -> std::io::Result<()> {
        loop {
            let (done, used) = {
                let chunk = match self.reader.fill_buf() {
                    Ok(c) => c,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                };
                if chunk.is_empty() {
                    return Ok(());
                }
                match chunk.iter().position(|&b| b == b'\n') {
                    Some(i) => (true, i + 1),
                    None => (false, chunk.len()),
                }
            };
            self.reader.consume(used);
            if done {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversized_lines_are_skipped_whole() {
        let mut data = b"{\"a\":1}\n".to_vec();
        data.extend(std::iter::repeat_n(b'x', MAX_LINE_BYTES + 10));
        data.extend_from_slice(b"\n{\"b\":2}\n\xff\n[1]\n");
        let mut lines = Lines::new(std::io::Cursor::new(data));
        assert!(matches!(lines.next_line().unwrap(), Some(Line::Record(_))));
        assert!(matches!(
            lines.next_line().unwrap(),
            Some(Line::Unreadable("longer than the 16 MiB line limit"))
        ));
        match lines.next_line().unwrap() {
            Some(Line::Record(m)) => assert!(m.contains_key("b")),
            _ => panic!("the record after the long line is lost"),
        }
        assert!(matches!(
            lines.next_line().unwrap(),
            Some(Line::Unreadable("not UTF-8"))
        ));
        assert!(matches!(
            lines.next_line().unwrap(),
            Some(Line::Unreadable("not a JSON object"))
        ));
        assert!(lines.next_line().unwrap().is_none());
        assert_eq!(lines.lineno, 5);
    }
}
