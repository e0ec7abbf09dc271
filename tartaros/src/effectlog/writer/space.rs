//! Room for the end of the log. The agent may fill the filesystem that
//! holds the log (a writable root on it); the gap and the seal must still
//! fit. So the writer keeps [`RESERVE`] bytes allocated past the end of
//! the file (`fallocate(FALLOC_FL_KEEP_SIZE)`: ext4, xfs, btrfs, tmpfs):
//! appends land in blocks that are already the log's. When the reserve
//! cannot be renewed for lack of room, the log is full: effect records are
//! dropped and counted, and what remains of the reserve (at least half of
//! it) holds the `log-full` gap and the seal, so `verify` answers
//! `incomplete` (3), never `ok`. On a filesystem without fallocate the
//! writer has no reserve: a full disk there leaves the log unsealed (2).
//!
//! The log is also full at [`size_limit`]: an agent makes records as fast
//! as the writer takes them (~15 MB of log a second here), and nothing
//! else bounded the file on the host's disk.

use std::fs::File;
use std::os::fd::AsRawFd;

/// 256 KiB: four full batches, or a seal listing ~2,000 files.
pub const RESERVE: u64 = 256 * 1024;

/// Written data is sent to the disk every this many bytes, so that the
/// seal's fdatasync waits only for the last of it: for a log of 24 MB
/// (60,000 records) that sync took 13 ms after the agent had ended.
pub const WRITEBACK_BYTES: u64 = 1024 * 1024;

/// Starts writing `[from, to)` of the file to the disk without waiting
/// (`sync_file_range(SYNC_FILE_RANGE_WRITE)`): no durability promise of
/// its own (the seal's fdatasync keeps that), and a failure here is
/// one the fdatasync reports.
pub fn start_writeback(file: &File, from: u64, to: u64) {
    let (Ok(offset), Ok(len)) = (i64::try_from(from), i64::try_from(to - from)) else {
        return;
    };
    // SAFETY: sync_file_range on an fd we own; no memory is passed.
    let _ = unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE)
    };
}

/// Half the space the log's filesystem has free for unprivileged
/// writers when the log is made (`u64::MAX` if it cannot say): enough
/// for any run's records, and the host keeps the other half whatever
/// the agent does. Runs sharing a filesystem each take half of what
/// the earlier ones left.
pub fn size_limit(file: &File) -> u64 {
    match nix::sys::statvfs::fstatvfs(file) {
        Ok(st) => st.blocks_available().saturating_mul(st.fragment_size()) / 2,
        Err(_) => u64::MAX,
    }
}

/// The space a log leaves its filesystem free for unprivileged writers,
/// whatever the number of logs on it: a twentieth of the filesystem, or
/// half of what was free when the log was made if that is less (so a log
/// on a nearly full disk still has room). [`size_limit`] bounds each log
/// alone; runs made in the same instant each measured the same free
/// space, and four of them, started together by one user through the
/// service, filled the filesystem with root's writes (adversarial round
/// 9), which on ext4 also take the blocks reserved for root and ignore
/// the caller's quota. 0 if the filesystem cannot say.
pub fn kept_free(file: &File) -> u64 {
    match nix::sys::statvfs::fstatvfs(file) {
        Ok(st) => {
            let size = st.blocks().saturating_mul(st.fragment_size());
            let free = st.blocks_available().saturating_mul(st.fragment_size());
            (size / 20).min(free / 2)
        }
        Err(_) => 0,
    }
}

/// The space free for unprivileged writers now (`u64::MAX` if the
/// filesystem cannot say).
pub fn free_now(file: &File) -> u64 {
    nix::sys::statvfs::fstatvfs(file).map_or(u64::MAX, |st| {
        st.blocks_available().saturating_mul(st.fragment_size())
    })
}

/// Allocates `RESERVE` bytes from `offset` without changing the file's
/// size. `Ok(false)`: the filesystem cannot (no reserve, not full);
/// `Err`: no room.
pub fn reserve(file: &File, offset: u64) -> Result<bool, std::io::Error> {
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(RESERVE)) else {
        return Ok(false);
    };
    // SAFETY: fallocate on an fd we own; no memory is passed.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, offset, len) };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG) => Err(e),
        _ => Ok(false),
    }
}
