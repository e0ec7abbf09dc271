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
    free_known(file).unwrap_or(u64::MAX)
}

/// The space free for unprivileged writers now, if the filesystem says.
pub fn free_known(file: &File) -> Option<u64> {
    nix::sys::statvfs::fstatvfs(file)
        .ok()
        .map(|st| st.blocks_available().saturating_mul(st.fragment_size()))
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

/// What the seal takes besides its `files` list (counts, head, digest):
/// a few hundred bytes, and one line per record kind.
const SEAL_MARGIN: u64 = 8 * 1024;

/// How many bytes of the seal's `files` list (`need` in all) may be
/// kept, or `None` when all of it fits. The room is what is left of the
/// reserve past the end of the log and what the filesystem has free
/// above the host's share; a cut list takes at most `most`. A fixed cut
/// of 64 KiB was more than a reserve renewed every half reserve could
/// still hold: the seal was cut mid-line on a filled tmpfs.
pub fn seal_files_budget(
    need: u64,
    reserve_left: u64,
    free: u64,
    kept_free: u64,
    most: u64,
) -> Option<usize> {
    let room = reserve_left.saturating_add(free.saturating_sub(kept_free));
    if need.saturating_add(SEAL_MARGIN) <= room {
        return None;
    }
    let keep = room.saturating_sub(SEAL_MARGIN).min(most);
    Some(usize::try_from(keep).unwrap_or(usize::MAX))
}

/// On a filesystem without room for the seal's whole `files` list in `m`,
/// cuts it so that the seal still fits ([`seal_files_budget`]); the
/// reserve holds `reserve_left` bytes more.
pub fn fit_seal_files(
    m: &mut serde_json::Map<String, serde_json::Value>,
    file: &File,
    reserve_left: u64,
    kept_free: u64,
) {
    let Some(files) = m.get("files") else {
        return;
    };
    let budget = seal_files_budget(
        files.to_string().len() as u64,
        reserve_left,
        // Unknown free space: only the reserve is sure to be there.
        free_known(file).unwrap_or(0),
        kept_free,
        crate::fswatch::FULL_SEAL_FILES_BYTES as u64,
    );
    if let Some(budget) = budget {
        crate::fswatch::trim(m, budget);
    }
}

#[cfg(test)]
mod budget_tests {
    use super::*;

    #[test]
    fn a_list_that_fits_the_room_is_kept_whole() {
        assert_eq!(seal_files_budget(1000, 0, 1 << 30, 1 << 20, 65536), None);
        assert_eq!(seal_files_budget(1000, RESERVE, 0, 1 << 20, 65536), None);
    }

    #[test]
    fn on_a_full_filesystem_the_list_is_cut_to_what_the_reserve_still_holds() {
        // 40 KiB of reserve left, nothing free: less than the 64 KiB cap.
        let cut = seal_files_budget(1 << 20, 40 * 1024, 0, 0, 65536);
        assert_eq!(cut, Some(40 * 1024 - SEAL_MARGIN as usize));
        // The host's share of the free space is not the log's room.
        let cut = seal_files_budget(1 << 20, 0, 100 * 1024, 100 * 1024, 65536);
        assert_eq!(cut, Some(0));
        // Plenty of reserve: the cap applies.
        assert_eq!(
            seal_files_budget(1 << 20, RESERVE, 0, 0, 65536),
            Some(65536)
        );
    }
}
