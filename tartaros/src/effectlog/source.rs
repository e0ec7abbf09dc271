//! One open of a log for every pass a reader makes over it.
//!
//! `show`, `summary` and `report` verify the log, then read it again to
//! display it. Opened twice by path, the two reads need not see the same
//! bytes: a named pipe, a file on a hostile FUSE mount, or a file rewritten
//! between the reads serves a genuine log to the verifier and a forged one
//! to the display, which then prints it under the genuine log's `ok`.
//! So a reader opens the file once, refuses anything but a regular file
//! (a pipe cannot be read twice), hashes every byte each pass reads, and
//! keeps its verdict only when the display pass read exactly the bytes the
//! verify pass did.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::LogError;
use super::verify::{VERDICT_TAMPERED, VERDICT_UNSEALED, Verdict, against_head, check};

/// A log opened once; each [`LogFile::pass`] reads it from the start.
pub(crate) struct LogFile {
    file: File,
    path: PathBuf,
    /// The head the caller expects the seal to hash to (`--head`).
    head: Option<String>,
}

/// A reader over one pass that hashes every byte it hands out.
pub(crate) struct Hashed<R> {
    inner: R,
    hash: Sha256,
}

impl<R: Read> Read for Hashed<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// One pass over a [`LogFile`].
pub(crate) type Pass<'a> = BufReader<Hashed<&'a File>>;

/// The SHA-256 of every byte of one pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PassDigest([u8; 32]);

/// Opens `path` for reading without waiting: a FIFO with no writer would
/// hold a plain `open` forever (adversarial round 24b: every reader hung
/// on `mkfifo x; tartaros log show x`). Reads wait as usual afterwards, so
/// a pipe with a writer is read to its end.
pub(crate) fn open_without_waiting(path: &Path) -> std::io::Result<File> {
    use std::os::fd::AsRawFd as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor this function owns; no memory passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(file)
}

impl LogFile {
    pub(crate) fn open(path: &Path) -> Result<Self, LogError> {
        let read_err = |source| LogError::Read {
            path: path.to_path_buf(),
            source,
        };
        let file = open_without_waiting(path).map_err(read_err)?;
        if !file.metadata().map_err(read_err)?.is_file() {
            return Err(LogError::NotAFile {
                path: path.to_path_buf(),
            });
        }
        Ok(Self {
            file,
            path: path.to_path_buf(),
            head: None,
        })
    }

    /// The same log, whose verify pass also compares the seal with `head`
    /// (the head the run printed): a log replaced after its seal by another
    /// valid one is tampered to the readers too, not only to `verify`.
    pub(crate) fn expecting(self, head: Option<&str>) -> Self {
        Self {
            head: head.map(str::to_owned),
            ..self
        }
    }

    pub(crate) fn read_err(&self, source: std::io::Error) -> LogError {
        LogError::Read {
            path: self.path.clone(),
            source,
        }
    }

    /// A new pass from the first byte.
    pub(crate) fn pass(&self) -> Result<Pass<'_>, LogError> {
        (&self.file)
            .seek(SeekFrom::Start(0))
            .map_err(|e| self.read_err(e))?;
        Ok(BufReader::new(Hashed {
            inner: &self.file,
            hash: Sha256::new(),
        }))
    }

    /// Ends a pass: reads what it left to the end of the file, so the
    /// digest covers the whole file whatever the pass stopped at.
    pub(crate) fn finish(&self, mut pass: Pass<'_>) -> Result<PassDigest, LogError> {
        loop {
            let used = pass.fill_buf().map_err(|e| self.read_err(e))?.len();
            if used == 0 {
                break;
            }
            pass.consume(used);
        }
        Ok(PassDigest(pass.into_inner().hash.finalize().into()))
    }

    /// Verifies the log in a pass of its own.
    pub(crate) fn verify(&self) -> Result<(Verdict, PassDigest), LogError> {
        let mut pass = self.pass()?;
        let (verdict, sealed) = check(&mut pass);
        let verdict = match &self.head {
            Some(want) => against_head(verdict, sealed, want),
            None => verdict,
        };
        Ok((verdict, self.finish(pass)?))
    }
}

/// The verdict that holds for what a display pass read: `verdict` when it
/// read the bytes the verify pass did. Otherwise the display may hold lines
/// nobody verified: a sealed log never changes, so that is tampering; an
/// unsealed one may still be being written, and stays unsealed.
pub(crate) fn settle(verdict: Verdict, verified: PassDigest, shown: PassDigest) -> Verdict {
    if verified == shown || verdict.code == VERDICT_TAMPERED {
        return verdict;
    }
    let (code, what) = if verdict.code == VERDICT_UNSEALED {
        (VERDICT_UNSEALED, "unsealed")
    } else {
        (VERDICT_TAMPERED, "tampered")
    };
    // The verifier escaped its message already; escaping it again would
    // double its backslashes.
    Verdict {
        code,
        message: format!(
            "{what}: the file changed while it was read, so what is shown is not what was verified (verify said: {}); read a copy that nothing writes",
            verdict.message
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::effectlog::VERDICT_OK;
    use crate::effectlog::testutil::write_sample;
    use std::io::Write;

    #[test]
    fn a_log_rewritten_between_the_passes_is_not_vouched_for() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("effects.jsonl");
        drop(write_sample(&path));
        let log = LogFile::open(&path).unwrap();
        let (verdict, verified) = log.verify().unwrap();
        assert_eq!(verdict.code, VERDICT_OK, "{verdict:?}");
        // The same inode, rewritten in place after the verify pass.
        let mut bytes = std::fs::read(&path).unwrap();
        let at = bytes.iter().position(|&b| b == b'x').unwrap();
        bytes[at] = b'y';
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .write_all(&bytes)
            .unwrap();
        let mut pass = log.pass().unwrap();
        let mut shown = Vec::new();
        pass.read_to_end(&mut shown).unwrap();
        assert_eq!(shown, bytes, "the display pass reads the file as it is now");
        let v = settle(verdict, verified, log.finish(pass).unwrap());
        assert_eq!(v.code, VERDICT_TAMPERED, "{v:?}");
        assert!(v.message.contains("changed while it was read"), "{v:?}");
    }

    #[test]
    fn a_reader_given_the_head_calls_another_seal_tampered() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("effects.jsonl");
        drop(write_sample(&path));
        let (_, sealed) = check(std::io::BufReader::new(File::open(&path).unwrap()));
        let head = hex::encode(sealed.unwrap());
        let verdict = |want: &str| {
            let log = LogFile::open(&path).unwrap().expecting(Some(want));
            log.verify().unwrap().0
        };
        assert_eq!(verdict(&head).code, VERDICT_OK);
        assert_eq!(verdict(&head.to_uppercase()).code, VERDICT_OK);
        let other = verdict(&"0".repeat(64));
        assert_eq!(other.code, VERDICT_TAMPERED, "{other:?}");
        assert!(other.message.contains("not the expected"), "{other:?}");
        let no_head = LogFile::open(&path).unwrap().verify().unwrap().0;
        assert_eq!(no_head.code, VERDICT_OK);
    }

    #[test]
    fn the_same_bytes_keep_the_verdict_and_a_growing_unsealed_log_stays_unsealed() {
        let d = PassDigest([1; 32]);
        let e = PassDigest([2; 32]);
        let ok = Verdict {
            code: VERDICT_OK,
            message: "ok".into(),
        };
        assert_eq!(settle(ok.clone(), d, d), ok);
        let unsealed = Verdict {
            code: VERDICT_UNSEALED,
            message: "unsealed: lines 1-3".into(),
        };
        assert_eq!(settle(unsealed, d, e).code, VERDICT_UNSEALED);
    }

    #[test]
    fn a_pipe_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("p");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // No writer: a plain open would wait forever (round 24b).
        for path in [fifo.as_path(), Path::new("/dev/null")] {
            let err = LogFile::open(path).err().expect("refused");
            assert!(matches!(err, LogError::NotAFile { .. }), "{err}");
        }
    }
}
