//! The fanotify side of kernel-sourced paths: one notification group with
//! file-handle reporting, filesystem marks on the writable roots, and the
//! parser of its event records. The only `unsafe` of the module lives here.

use std::ffi::CString;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use super::FsWatchError;

/// What the group reports (all of it kernel-side, at the time of the
/// effect): the directory's handle and the entry name, the thread (not the
/// process) that caused it, and the file's own handle, for a directory
/// entry's creation, removal and rename too (`FAN_REPORT_TARGET_FID`,
/// Linux 5.17). The kernel merges a thread's identical notifications still
/// queued; with the file's handle in them it merges only those of one
/// file, never a later file of the same name (git's `config.lock`,
/// written and renamed over `config` four times by `git init`, had a later
/// lock file's writes queued before the earlier one's rename).
const INIT_FLAGS: libc::c_uint =
    INIT_FLAGS_BY_NAME | libc::FAN_REPORT_FID | libc::FAN_REPORT_TARGET_FID;

/// [`INIT_FLAGS`] without the file's own handle, for a kernel that refuses
/// it (`EINVAL`): one name's notifications of different files may then
/// merge (the watch says so, `Group::reports_fid`).
const INIT_FLAGS_BY_NAME: libc::c_uint = libc::FAN_CLASS_NOTIF
    | libc::FAN_CLOEXEC
    | libc::FAN_NONBLOCK
    | libc::FAN_UNLIMITED_QUEUE
    | libc::FAN_REPORT_DFID_NAME
    | libc::FAN_REPORT_TID;

/// The events that change a writable root, and the opens of the files an
/// exec runs (`FAN_OPEN_EXEC`: a script's own name, which no object of
/// the exec tracepoint still holds; `exec_opens.rs`). Not
/// `FAN_CLOSE_WRITE`: a process's `write` record is written when it exits
/// or the file is deleted, which saves a notification per closed file.
pub(super) const MARK_MASK: u64 = libc::FAN_CREATE
    | libc::FAN_DELETE
    | libc::FAN_RENAME
    | libc::FAN_MODIFY
    | libc::FAN_ATTRIB
    | libc::FAN_OPEN_EXEC
    | libc::FAN_ONDIR;

/// The most notification bytes one [`Group::read_all`] takes (about
/// 30,000 notifications).
pub(super) const READ_BATCH_BYTES: usize = 4 << 20;

/// A file handle as the kernel reported it, with the filesystem it is on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Handle {
    pub fsid: [i32; 2],
    pub handle_type: i32,
    pub bytes: Vec<u8>,
}

/// A directory entry: the directory's handle and the name in it (`.` for
/// an event on the directory itself).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct DirEntry {
    pub dir: Handle,
    pub name: Vec<u8>,
}

/// One fanotify event, parsed; handles not yet resolved to paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RawEvent {
    pub mask: u64,
    /// Thread id in the supervisor's pid namespace (FAN_REPORT_TID).
    pub tid: u32,
    /// The entry the event is about (DFID_NAME; the old name of a rename).
    pub entry: Option<DirEntry>,
    /// The new name of a rename.
    pub new_entry: Option<DirEntry>,
    /// The file's own handle (`FAN_EVENT_INFO_TYPE_FID`): the object
    /// changed, created, removed or renamed; `None` for an event on a
    /// directory itself, or from a group without `FAN_REPORT_FID`.
    pub fid: Option<Handle>,
}

/// Parses a buffer returned by read(2) on the group. Records it cannot
/// understand are skipped by their length; a length that does not fit
/// ends the parse (the kernel never writes partial records).
pub(super) fn parse(buf: &[u8]) -> Vec<RawEvent> {
    let mut events = Vec::new();
    let mut at = 0usize;
    while let Some(meta) = buf.get(at..at + 24) {
        let event_len = u32_at(meta, 0) as usize;
        let metadata_len = u16::from_ne_bytes([meta[6], meta[7]]) as usize;
        if event_len < 24 || metadata_len < 24 || at + event_len > buf.len() {
            break;
        }
        let mask = u64::from_ne_bytes(meta[8..16].try_into().unwrap_or([0; 8]));
        let pid = i32::from_ne_bytes(meta[20..24].try_into().unwrap_or([0; 4]));
        let mut event = RawEvent {
            mask,
            tid: u32::try_from(pid).unwrap_or(0),
            entry: None,
            new_entry: None,
            fid: None,
        };
        let mut info = at + metadata_len.min(event_len);
        let end = at + event_len;
        while info + 4 <= end {
            let info_type = buf[info];
            let len = u16::from_ne_bytes([buf[info + 2], buf[info + 3]]) as usize;
            if len < 4 || info + len > end {
                break;
            }
            let record = &buf[info..info + len];
            match info_type {
                libc::FAN_EVENT_INFO_TYPE_DFID_NAME | libc::FAN_EVENT_INFO_TYPE_OLD_DFID_NAME => {
                    event.entry = dir_entry(record);
                }
                libc::FAN_EVENT_INFO_TYPE_NEW_DFID_NAME => event.new_entry = dir_entry(record),
                libc::FAN_EVENT_INFO_TYPE_FID => event.fid = handle(record).map(|(h, _)| h),
                _ => {}
            }
            info += len;
        }
        events.push(event);
        at = end;
    }
    events
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .map(|s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
        .unwrap_or(0)
}

/// `fanotify_event_info_fid`: a header, the fsid and a `struct
/// file_handle`; the rest of the record (a directory entry's name).
fn handle(record: &[u8]) -> Option<(Handle, &[u8])> {
    let fsid = [u32_at(record, 4) as i32, u32_at(record, 8) as i32];
    let handle_bytes = u32_at(record, 12) as usize;
    let handle_type = u32_at(record, 16) as i32;
    let bytes = record.get(20..20 + handle_bytes)?.to_vec();
    let rest = record.get(20 + handle_bytes..)?;
    Some((
        Handle {
            fsid,
            handle_type,
            bytes,
        },
        rest,
    ))
}

/// A directory's handle followed by a NUL-terminated name.
fn dir_entry(record: &[u8]) -> Option<DirEntry> {
    let (dir, rest) = handle(record)?;
    let name_end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    Some(DirEntry {
        dir,
        name: rest[..name_end].to_vec(),
    })
}

/// The notification group and one descriptor per marked filesystem (to
/// open handles on it).
pub(super) struct Group {
    fd: OwnedFd,
    mounts: Vec<([i32; 2], OwnedFd)>,
    /// The read buffer, kept: the group is read once per batch of records.
    buf: Vec<u8>,
    /// Directory levels climbed so far by [`path_of_dir`], in all.
    climbed: std::cell::Cell<usize>,
    /// Live directories that could not be named (past the climb's bounds,
    /// or a mount crossed on the way): what changed in them is counted as
    /// not hashed, never dropped silently.
    unnamed: std::cell::Cell<u64>,
    /// Whether notifications carry the file's own handle ([`INIT_FLAGS`]).
    fid: bool,
}

impl Group {
    /// Creates the group and marks the filesystem of every root.
    pub fn new(roots: &[PathBuf]) -> Result<Self, FsWatchError> {
        let init = |flags: libc::c_uint| {
            // SAFETY: fanotify_init takes two flag words and returns a new
            // fd or -1; no memory is passed.
            let raw = unsafe { libc::fanotify_init(flags, libc::O_RDONLY as libc::c_uint) };
            if raw < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(raw)
            }
        };
        let (raw, fid) = match init(INIT_FLAGS) {
            Ok(raw) => (raw, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                (init(INIT_FLAGS_BY_NAME).map_err(FsWatchError::Init)?, false)
            }
            Err(e) => return Err(FsWatchError::Init(e)),
        };
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut group = Self {
            fd,
            mounts: Vec::new(),
            buf: vec![0u8; 64 * 1024],
            climbed: std::cell::Cell::new(0),
            unnamed: std::cell::Cell::new(0),
            fid,
        };
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        for root in roots {
            group.mark(root)?;
            // The root is given to the agent with its submounts (a tmpfs
            // or another disk below it): their filesystems are watched
            // too, or the watch fails (and the log says incomplete).
            for below in mounts_under(root, &mountinfo) {
                group.mark(&below)?;
            }
        }
        Ok(group)
    }

    fn mark(&mut self, root: &Path) -> Result<(), FsWatchError> {
        let err = |source| FsWatchError::Mark {
            path: root.to_path_buf(),
            source,
        };
        let c = CString::new(root.as_os_str().as_bytes())
            .map_err(|_| err(std::io::Error::from_raw_os_error(libc::EINVAL)))?;
        let fsid = fsid_of(&c).map_err(err)?;
        if self.mounts.iter().any(|(id, _)| *id == fsid) {
            return Ok(());
        }
        // SAFETY: `c` is a NUL-terminated path that lives across the call.
        let rc = unsafe {
            libc::fanotify_mark(
                self.fd.as_raw_fd(),
                libc::FAN_MARK_ADD | libc::FAN_MARK_FILESYSTEM,
                MARK_MASK,
                libc::AT_FDCWD,
                c.as_ptr(),
            )
        };
        if rc < 0 {
            return Err(err(std::io::Error::last_os_error()));
        }
        // Not O_PATH: open_by_handle_at refuses such a mount descriptor.
        // SAFETY: `c` is a NUL-terminated path; open returns a new fd or -1.
        let raw = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(err(std::io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        self.mounts
            .push((fsid, unsafe { OwnedFd::from_raw_fd(raw) }));
        Ok(())
    }

    /// A second descriptor of the group, for [`unmark_all`].
    pub fn dup(&self) -> Option<OwnedFd> {
        self.fd.try_clone().ok()
    }

    /// Reads every queued event (the group is non-blocking).
    /// What is queued, up to [`READ_BATCH_BYTES`] of it: a busy host
    /// writing on a marked filesystem (its notifications are read to be
    /// dropped) must not make one read hold its whole backlog in memory.
    /// The flag says whether more may be waiting.
    pub fn read_all(&mut self) -> Result<(Vec<RawEvent>, bool), std::io::Error> {
        let mut events = Vec::new();
        let mut read = 0usize;
        let buf = &mut self.buf;
        loop {
            if read >= READ_BATCH_BYTES {
                return Ok((events, true));
            }
            // SAFETY: `buf` is a writable buffer of `buf.len()` bytes.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::EAGAIN) => Ok((events, false)),
                    Some(libc::EINTR) => continue,
                    _ => Err(e),
                };
            }
            if n == 0 {
                return Ok((events, false));
            }
            read += n as usize;
            events.extend(parse(&buf[..n as usize]));
        }
    }

    /// The path of a directory handle now, as the supervisor sees it.
    /// `None` when the directory is gone (or on a filesystem not marked).
    pub fn resolve(&self, handle: &Handle) -> Option<PathBuf> {
        let mount = self.mounts.iter().find(|(id, _)| *id == handle.fsid)?;
        let fd = match open_handle(&mount.1, handle) {
            Ok(fd) => fd,
            Err(errno) => {
                // Only a stale handle means the directory is gone. Anything
                // else (EMFILE, ENFILE, ENOMEM: the supervisor out of
                // descriptors or memory) leaves a live directory unnamed,
                // which the seal counts (`files_omitted`): an agent that
                // exhausts the supervisor must not turn lost names into a
                // log that verifies complete.
                if !matches!(errno, nix::errno::Errno::ESTALE | nix::errno::Errno::ENOENT) {
                    self.unnamed.set(self.unnamed.get().saturating_add(1));
                }
                return None;
            }
        };
        // Gone by its link count, not by the " (deleted)" that the kernel
        // appends to its name: a directory may be named that.
        let Ok(st) = nix::sys::stat::fstat(fd.as_raw_fd()) else {
            self.unnamed.set(self.unnamed.get().saturating_add(1));
            return None;
        };
        if st.st_nlink == 0 {
            return None;
        }
        let named = path_of_dir(fd, &self.climbed);
        if named.is_none() {
            self.unnamed.set(self.unnamed.get().saturating_add(1));
        }
        named
    }

    /// What tells whether a file handle's file still has a name.
    pub fn probe(&self) -> FidProbe {
        FidProbe {
            mounts: self
                .mounts
                .iter()
                .filter_map(|(id, fd)| Some((*id, fd.try_clone().ok()?)))
                .collect(),
        }
    }

    /// Whether the kernel reports each file's own handle: `false` when it
    /// refused `FAN_REPORT_FID | FAN_REPORT_TARGET_FID`.
    pub fn reports_fid(&self) -> bool {
        self.fid
    }

    /// Live directories that could not be named (see [`Self::resolve`]).
    pub fn unnamed_dirs(&self) -> u64 {
        self.unnamed.get()
    }
}

/// Opens `handle` on the filesystem of `mount` (`O_PATH`).
fn open_handle(mount: &OwnedFd, handle: &Handle) -> Result<OwnedFd, nix::errno::Errno> {
    let header = 8usize;
    let mut raw = vec![0u8; header + handle.bytes.len()];
    raw[..4].copy_from_slice(&(handle.bytes.len() as u32).to_ne_bytes());
    raw[4..8].copy_from_slice(&handle.handle_type.to_ne_bytes());
    raw[8..].copy_from_slice(&handle.bytes);
    // A u32-aligned copy: struct file_handle starts with two ints.
    let mut aligned = vec![0u32; raw.len().div_ceil(4)];
    for (i, chunk) in raw.chunks(4).enumerate() {
        let mut word = [0u8; 4];
        word[..chunk.len()].copy_from_slice(chunk);
        aligned[i] = u32::from_ne_bytes(word);
    }
    // SAFETY: `aligned` holds a complete struct file_handle (header and
    // handle_bytes bytes of handle) and outlives the call; the kernel
    // only reads it. open_by_handle_at returns a new fd or -1.
    let fd = unsafe {
        libc::open_by_handle_at(
            mount.as_raw_fd(),
            aligned.as_mut_ptr().cast(),
            libc::O_PATH | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(nix::errno::Errno::last());
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether the file of a handle the kernel reported still has a name:
/// a `write` record whose name holds no file, with no removal seen, is
/// of a removed file (`deleted`) when its own handle says so, instead
/// of naming no file (an `O_TMPFILE` never linked, a file removed while
/// open whose removal was reported before its writes).
#[derive(Default)]
pub(super) struct FidProbe {
    mounts: Vec<([i32; 2], OwnedFd)>,
}

impl std::fmt::Debug for FidProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FidProbe({} filesystems)", self.mounts.len())
    }
}

impl FidProbe {
    /// `true` when the file is gone or has no link left; `false` when it
    /// lives, or that cannot be told (not this group's filesystem, the
    /// supervisor out of descriptors).
    pub fn gone(&self, handle: &Handle) -> bool {
        let Some((_, mount)) = self.mounts.iter().find(|(id, _)| *id == handle.fsid) else {
            return false;
        };
        match open_handle(mount, handle) {
            Err(errno) => errno == nix::errno::Errno::ESTALE,
            Ok(fd) => nix::sys::stat::fstat(fd.as_raw_fd()).is_ok_and(|st| st.st_nlink == 0),
        }
    }

    /// A symlink's contents read through its own handle (a rename or a
    /// new link at its name cannot change which inode is read): inner
    /// `None` when it is gone; `None` when the handle is of no filesystem
    /// the probe can open handles on.
    pub fn readlink(&self, handle: &Handle) -> Option<Option<std::ffi::OsString>> {
        let (_, mount) = self.mounts.iter().find(|(id, _)| *id == handle.fsid)?;
        let fd = open_handle(mount, handle).ok();
        Some(fd.and_then(|fd| nix::fcntl::readlinkat(Some(fd.as_raw_fd()), "").ok()))
    }

    /// The file's `(st_dev, st_ino)` while it has a link; `None` when it
    /// is gone or that cannot be told.
    pub fn linked_inode(&self, handle: &Handle) -> Option<(u64, u64)> {
        let (_, mount) = self.mounts.iter().find(|(id, _)| *id == handle.fsid)?;
        let st = nix::sys::stat::fstat(open_handle(mount, handle).ok()?.as_raw_fd()).ok()?;
        (st.st_nlink > 0).then_some((st.st_dev, st.st_ino))
    }
}

/// At most this many directories are climbed to name one directory whose
/// path is longer than `PATH_MAX` (which `/proc/self/fd` cannot show), and
/// this many in all for a run: an agent nesting thousands of directories
/// must not make the supervisor's work grow with the square of the depth.
const MAX_CLIMB: usize = 4096;
const MAX_CLIMB_TOTAL: usize = 1 << 16;
/// The kernel is asked for an ancestor's path every this many levels
/// (each ask walks up to `PATH_MAX` bytes of names).
const SHOW_EVERY: usize = 64;

/// The path of the directory `fd` (an `O_PATH` descriptor). Past
/// `PATH_MAX` the kernel will not show it: the names are then read by
/// climbing `..` until an ancestor's path can be shown, each name found in
/// its parent by inode. `None` when that fails (a mount point on the way).
fn path_of_dir(fd: OwnedFd, climbed: &std::cell::Cell<usize>) -> Option<PathBuf> {
    let shown = |fd: &OwnedFd| std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    let mut names: Vec<Vec<u8>> = Vec::new();
    let mut cur = fd;
    for level in 0..MAX_CLIMB {
        if level % SHOW_EVERY == 0 {
            match shown(&cur) {
                Ok(path) if path.is_absolute() => return Some(below(path, &names)),
                Err(e) if e.raw_os_error() == Some(libc::ENAMETOOLONG) => {}
                _ => return None,
            }
        }
        if climbed.get() >= MAX_CLIMB_TOTAL {
            return None;
        }
        climbed.set(climbed.get() + 1);
        let here = nix::sys::stat::fstat(cur.as_raw_fd()).ok()?;
        let parent = nix::fcntl::openat(
            Some(cur.as_raw_fd()),
            "..",
            nix::fcntl::OFlag::O_RDONLY
                | nix::fcntl::OFlag::O_DIRECTORY
                | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .ok()?;
        // SAFETY: `openat` returned a new descriptor that nothing else owns.
        let parent = unsafe { OwnedFd::from_raw_fd(parent) };
        let up = nix::sys::stat::fstat(parent.as_raw_fd()).ok()?;
        if up.st_dev != here.st_dev {
            // A mount's root: its own path may be short enough to show.
            let path = shown(&cur).ok().filter(|p| p.is_absolute())?;
            return Some(below(path, &names));
        }
        if up.st_ino == here.st_ino {
            // The root, reached between two asks: its names are the path.
            return Some(below(PathBuf::from("/"), &names));
        }
        names.push(name_in(&parent, here.st_ino)?);
        cur = parent;
    }
    None
}

/// `top` with `names` (climbed, so innermost first) below it.
fn below(top: PathBuf, names: &[Vec<u8>]) -> PathBuf {
    use std::os::unix::ffi::OsStringExt as _;
    let mut out = top.into_os_string().into_vec();
    for name in names.iter().rev() {
        if out.last() != Some(&b'/') {
            out.push(b'/');
        }
        out.extend_from_slice(name);
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// The name of inode `ino` in the directory `dir`.
fn name_in(dir: &OwnedFd, ino: u64) -> Option<Vec<u8>> {
    use std::os::fd::IntoRawFd as _;
    let dup = dir.try_clone().ok()?;
    let mut listing = nix::dir::Dir::from_fd(dup.into_raw_fd()).ok()?;
    listing.iter().flatten().find_map(|entry| {
        let name = entry.file_name().to_bytes();
        (entry.ino() == ino && name != b"." && name != b"..").then(|| name.to_vec())
    })
}

/// Removes every filesystem mark of the group `fd`; what is queued stays
/// readable. The kernel frees marks after an SRCU grace period (5–15 ms
/// here once files were changed), and closing the group waits for that:
/// started when the sandbox is empty, the wait is mostly over by the time
/// the log is sealed and the group closed.
pub(super) fn unmark_all(fd: &OwnedFd) {
    // SAFETY: fanotify_mark on a descriptor we own; FAN_MARK_FLUSH takes
    // no path (NULL) and passes no memory.
    let _ = unsafe {
        libc::fanotify_mark(
            fd.as_raw_fd(),
            libc::FAN_MARK_FLUSH | libc::FAN_MARK_FILESYSTEM,
            0,
            libc::AT_FDCWD,
            std::ptr::null(),
        )
    };
}

/// The mount points strictly below `root` in `mountinfo` (the text of
/// `/proc/self/mountinfo`, whose fifth field is the mount point with
/// space, tab, newline and backslash as octal escapes).
fn mounts_under(root: &Path, mountinfo: &str) -> Vec<PathBuf> {
    use std::os::unix::ffi::OsStringExt as _;
    let mut out: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| {
            let raw = field.as_bytes();
            let mut bytes = Vec::with_capacity(raw.len());
            let mut i = 0;
            while i < raw.len() {
                let octal = raw.get(i + 1..i + 4).and_then(|d| {
                    std::str::from_utf8(d)
                        .ok()
                        .and_then(|d| u8::from_str_radix(d, 8).ok())
                });
                match (raw[i], octal) {
                    (b'\\', Some(b)) => {
                        bytes.push(b);
                        i += 4;
                    }
                    (b, _) => {
                        bytes.push(b);
                        i += 1;
                    }
                }
            }
            PathBuf::from(std::ffi::OsString::from_vec(bytes))
        })
        .filter(|point| point != root && point.starts_with(root))
        .collect();
    out.sort();
    out.dedup();
    out
}

fn fsid_of(path: &CString) -> Result<[i32; 2], std::io::Error> {
    // SAFETY: an all-zero statfs is a valid value for the kernel to fill.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `st` is writable.
    if unsafe { libc::statfs(path.as_ptr(), &mut st) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fsid_t is two ints; reading it as such is what the kernel's
    // fanotify_event_info_fid.fsid holds.
    let ids: [i32; 2] = unsafe { std::mem::transmute(st.f_fsid) };
    Ok(ids)
}

#[cfg(test)]
#[path = "notify_tests.rs"]
mod tests;
