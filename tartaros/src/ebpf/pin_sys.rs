//! The system calls of the pin cache (`pin_cache.rs`): pinning and opening
//! objects in a bpffs, what the kernel says about a pinned object, the
//! bpffs mount itself, and whether a cgroup (by id) still exists.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd as _, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

use super::rawprog::{ATTR_BYTES, bpf, obj_info, owned, put};

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_OBJ_GET: libc::c_long = 7;
/// `BPF_FS_MAGIC`, the bpffs `f_type`.
const BPF_FS_MAGIC: libc::c_long = 0xcafe_4a11;
/// `BPF_MAP_TYPE_HASH`.
pub(super) const MAP_TYPE_HASH: u32 = 1;
/// `BPF_MAP_TYPE_ARRAY`.
pub(super) const MAP_TYPE_ARRAY: u32 = 2;
/// `FILEID_KERNFS`: a kernfs node (a cgroup) by its 64-bit id.
const FILEID_KERNFS: i32 = 0xfe;
/// The most map ids read from a program's info (the unix programs use 6).
const MAX_MAP_IDS: usize = 16;

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// `BPF_OBJ_PIN`: `fd`'s object at `path` (in a bpffs).
pub(super) fn pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let c = c_path(path)?;
    let mut attr = [0u8; ATTR_BYTES];
    put(&mut attr, 0, &(c.as_ptr() as u64).to_le_bytes());
    put(&mut attr, 8, &(fd.as_raw_fd() as u32).to_le_bytes());
    bpf(BPF_OBJ_PIN, &mut attr).map(drop)
}

/// `BPF_OBJ_GET`: a new descriptor (close-on-exec) of the object pinned at
/// `path`.
pub(super) fn get(path: &Path) -> io::Result<OwnedFd> {
    let c = c_path(path)?;
    let mut attr = [0u8; ATTR_BYTES];
    put(&mut attr, 0, &(c.as_ptr() as u64).to_le_bytes());
    bpf(BPF_OBJ_GET, &mut attr).map(owned)
}

/// What a bpf descriptor refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Program,
    Map,
    Other,
}

/// Whether `fd` is a program or a map (the kernel's name of its file):
/// the info call fills a map's or a program's structure after the kind,
/// so it must be known first.
pub(super) fn kind(fd: BorrowedFd<'_>) -> Kind {
    match std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())) {
        Ok(target) if target.as_os_str() == "anon_inode:bpf-prog" => Kind::Program,
        Ok(target) if target.as_os_str() == "anon_inode:bpf-map" => Kind::Map,
        _ => Kind::Other,
    }
}

/// What the kernel says about a loaded program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ProgFacts {
    pub prog_type: u32,
    pub id: u32,
    pub tag: [u8; 8],
    /// The ids of the maps it references (at most [`MAX_MAP_IDS`] read).
    pub map_ids: Vec<u32>,
    /// How many maps it references, as the kernel counts them.
    pub map_count: u32,
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

/// `BPF_OBJ_GET_INFO_BY_FD` of a program (check [`kind`] first).
pub(super) fn prog_facts(fd: BorrowedFd<'_>) -> io::Result<ProgFacts> {
    // struct bpf_prog_info up to `name`: type 0, id 4, tag 8..16,
    // nr_map_ids 52, map_ids 56.
    let mut info = [0u8; 80];
    let mut ids = [0u32; MAX_MAP_IDS];
    info[52..56].copy_from_slice(&(MAX_MAP_IDS as u32).to_le_bytes());
    info[56..64].copy_from_slice(&(ids.as_mut_ptr() as u64).to_le_bytes());
    obj_info(fd, &mut info)?;
    let map_count = u32_at(&info, 52);
    let read = (map_count as usize).min(MAX_MAP_IDS);
    let mut tag = [0u8; 8];
    tag.copy_from_slice(&info[8..16]);
    Ok(ProgFacts {
        prog_type: u32_at(&info, 0),
        id: u32_at(&info, 4),
        tag,
        map_ids: ids[..read].to_vec(),
        map_count,
    })
}

/// What a map is: the kernel's answer, or what it must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct MapShape {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub flags: u32,
}

/// What the kernel says about a map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct MapFacts {
    pub id: u32,
    pub shape: MapShape,
    pub name: String,
}

/// `BPF_OBJ_GET_INFO_BY_FD` of a map (check [`kind`] first).
pub(super) fn map_facts(fd: BorrowedFd<'_>) -> io::Result<MapFacts> {
    // struct bpf_map_info: type, id, key_size, value_size, max_entries,
    // map_flags, name[16].
    let mut info = [0u8; 40];
    obj_info(fd, &mut info)?;
    let name = String::from_utf8_lossy(&info[24..40])
        .trim_end_matches('\0')
        .to_owned();
    Ok(MapFacts {
        id: u32_at(&info, 4),
        shape: MapShape {
            map_type: u32_at(&info, 0),
            key_size: u32_at(&info, 8),
            value_size: u32_at(&info, 12),
            max_entries: u32_at(&info, 16),
            flags: u32_at(&info, 20),
        },
        name,
    })
}

/// The value at `key` of the array map `map`, which must hold values of
/// exactly `value.len()` bytes (checked here: the kernel writes
/// `value_size` bytes).
pub(super) fn array_value(map: BorrowedFd<'_>, key: u32, value: &mut [u8]) -> io::Result<()> {
    let facts = map_facts(map)?;
    if facts.shape.map_type != MAP_TYPE_ARRAY || facts.shape.value_size as usize != value.len() {
        return Err(io::Error::from(io::ErrorKind::InvalidData));
    }
    let mut attr = [0u8; ATTR_BYTES];
    put(&mut attr, 0, &(map.as_raw_fd() as u32).to_le_bytes());
    put(
        &mut attr,
        8,
        &(std::ptr::from_ref(&key) as u64).to_le_bytes(),
    );
    put(&mut attr, 16, &(value.as_mut_ptr() as u64).to_le_bytes());
    bpf(BPF_MAP_LOOKUP_ELEM, &mut attr).map(drop)
}

/// The id of the inner map under `key` in the map of maps `outer` (a
/// lookup from user space gives the inner map's id); `None` when the key
/// is not there.
pub(super) fn inner_map_id(outer: BorrowedFd<'_>, key: u64) -> Option<u32> {
    let mut id = 0u32;
    let mut attr = [0u8; ATTR_BYTES];
    put(&mut attr, 0, &(outer.as_raw_fd() as u32).to_le_bytes());
    put(
        &mut attr,
        8,
        &(std::ptr::from_ref(&key) as u64).to_le_bytes(),
    );
    put(
        &mut attr,
        16,
        &(std::ptr::from_mut(&mut id) as u64).to_le_bytes(),
    );
    bpf(BPF_MAP_LOOKUP_ELEM, &mut attr).ok().map(|_| id)
}

/// Whether `path` is the root of a bpffs.
pub(super) fn is_bpffs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|fs| fs.filesystem_type().0 as libc::c_long == BPF_FS_MAGIC)
}

/// Mounts a bpffs of its own (only root may enter it) at `path`, so that
/// it propagates to no other mount namespace: `path` is first bound onto
/// itself and made private, and the bpffs mounted on that bind. (Made
/// private after the fact, a bpffs mounted under a shared `/run` would
/// already have been copied into its peers and slaves, which would keep
/// the pinned programs alive after a `cache drop`.)
pub(super) fn mount_bpffs(path: &Path) -> io::Result<()> {
    use nix::mount::MsFlags;
    nix::mount::mount(
        Some(path),
        path,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )?;
    let mounted = nix::mount::mount(
        None::<&str>,
        path,
        None::<&str>,
        MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .and_then(|()| {
        nix::mount::mount(
            Some("bpf"),
            path,
            Some("bpf"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some("mode=0700"),
        )
    });
    if let Err(e) = mounted {
        let _ = nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH);
        return Err(e.into());
    }
    Ok(())
}

/// Unmounts every bpffs at `path`, then the private bind under them
/// ([`mount_bpffs`]); lazily, so a run still opening a pin keeps its
/// descriptors.
pub(super) fn unmount(path: &Path) -> io::Result<()> {
    while is_bpffs(path) {
        nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH)?;
    }
    match nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH) {
        // Not a mount point (no bind under it).
        Ok(()) | Err(nix::errno::Errno::EINVAL) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Whether the cgroup of id `id` still exists, asked through any open
/// directory `mount` of the cgroup2 filesystem: `Some(false)` when the
/// kernel says the id is stale, `None` when it cannot say.
pub(super) fn cgroup_alive(mount: BorrowedFd<'_>, id: u64) -> Option<bool> {
    #[repr(C)]
    struct Handle {
        bytes: u32,
        kind: i32,
        id: [u8; 8],
    }
    let mut handle = Handle {
        bytes: 8,
        kind: FILEID_KERNFS,
        id: id.to_ne_bytes(),
    };
    // SAFETY: `handle` is a `struct file_handle` with its 8 bytes of
    // `f_handle` inline, alive for the call; the kernel only reads it. A
    // descriptor returned is owned here and closed at once.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount.as_raw_fd(),
            std::ptr::from_mut(&mut handle),
            libc::O_PATH | libc::O_CLOEXEC,
        )
    };
    if fd >= 0 {
        drop(owned(fd));
        return Some(true);
    }
    match io::Error::last_os_error().raw_os_error() {
        Some(libc::ESTALE | libc::ENOENT) => Some(false),
        _ => None,
    }
}
