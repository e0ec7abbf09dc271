//! At the seal: the log is still this run's alone. Its inode is
//! append-only while the run lives, but its directory is not (adversarial
//! round 24b: another run's agent, same uid, whose writable root held the
//! log, appended a line, or moved the directory away and put an older log
//! at the name; the run reported its log complete).

use std::fs::File;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use crate::effectlog::LogError;

/// Whether `file` holds exactly the `written` bytes this writer wrote and
/// its `path` still leads to it. Also gives the reserve back: a truncation
/// to the size frees the blocks past the end.
pub fn still_ours(file: &File, path: &Path, written: u64) -> Result<(), LogError> {
    let ours = file.metadata().ok();
    let size = ours.as_ref().map_or(written, |m| m.len());
    let _ = file.set_len(size);
    let named = std::fs::symlink_metadata(path).ok();
    let id = |m: &std::fs::Metadata| (m.dev(), m.ino());
    if ours.as_ref().map(id).is_none() || named.as_ref().map(id) != ours.as_ref().map(id) {
        return Err(LogError::Moved {
            path: path.to_path_buf(),
        });
    }
    match size.abs_diff(written) {
        0 => Ok(()),
        bytes => Err(LogError::Foreign {
            path: path.to_path_buf(),
            bytes,
        }),
    }
}
