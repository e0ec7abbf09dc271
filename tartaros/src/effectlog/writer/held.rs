//! The live log's inode held append-only from its creation to its seal
//! (`crate::append_only`): nobody renames, replaces or truncates it while
//! the run lives.

use std::os::fd::{AsRawFd, RawFd};

use super::LogWriter;
use crate::effectlog::LogError;

impl LogWriter {
    /// Makes the log's inode append-only until the seal (or until the
    /// writer is dropped): nobody can rename, replace or truncate the live
    /// log. Call as the supervisor (`CAP_LINUX_IMMUTABLE`), not as the
    /// caller. An error says why the filesystem or the process cannot.
    pub fn hold_append_only(&mut self) -> Result<(), LogError> {
        crate::append_only::set(&self.file, true).map_err(|source| LogError::AppendOnly {
            path: self.path.clone(),
            source,
        })?;
        self.append_only = true;
        Ok(())
    }

    /// Lets the inode go (the seal, a dropped writer).
    pub(super) fn release_append_only(&mut self) {
        if std::mem::take(&mut self.append_only) {
            let _ = crate::append_only::set(&self.file, false);
        }
    }

    /// The log's descriptor, for the janitor to reopen and let go of the
    /// flag should the supervisor die before the seal.
    pub fn raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}
