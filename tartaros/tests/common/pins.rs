//! The pin cache seen from the host: raw `bpf(2)` calls on its pins, the
//! runs' cgroups, `tartaros cache drop` (unix_pin_cache.rs,
//! log_pin_cache.rs).

use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};

use super::{cgroup2_root, stderr, tartaros};

pub const PIN_ROOT: &str = "/run/tartaros/bpf";
pub const PIN_LOCK: &str = "/run/tartaros/bpf.lock";
pub fn bpf(cmd: libc::c_long, attr: &mut [u8; 128]) -> std::io::Result<libc::c_long> {
    // SAFETY: `attr` is a zeroed `union bpf_attr` of 128 bytes that
    // outlives the call; the kernel reads and writes at most that many.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), 128u32) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

pub fn path_attr(path: &Path) -> ([u8; 128], std::ffi::CString) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let mut attr = [0u8; 128];
    attr[0..8].copy_from_slice(&(c.as_ptr() as u64).to_le_bytes());
    (attr, c)
}

/// `BPF_OBJ_GET` of a pin.
pub fn obj_get(path: &Path) -> OwnedFd {
    let (mut attr, _c) = path_attr(path);
    let fd = bpf(7, &mut attr).unwrap_or_else(|e| panic!("open pin {}: {e}", path.display()));
    // SAFETY: a new descriptor the kernel returned, owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// `BPF_OBJ_PIN` of `fd` at `path`.
pub fn obj_pin(fd: &OwnedFd, path: &Path) {
    let (mut attr, _c) = path_attr(path);
    attr[8..12].copy_from_slice(&(fd.as_raw_fd() as u32).to_le_bytes());
    bpf(6, &mut attr).unwrap_or_else(|e| panic!("pin {}: {e}", path.display()));
}

/// The first `N` bytes of the kernel's info of the object behind `fd`
/// (`BPF_OBJ_GET_INFO_BY_FD`), if it gives them.
pub fn obj_info<const N: usize>(fd: &OwnedFd) -> Option<[u8; N]> {
    let mut info = [0u8; N];
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&(fd.as_raw_fd() as u32).to_le_bytes());
    attr[4..8].copy_from_slice(&(N as u32).to_le_bytes());
    attr[8..16].copy_from_slice(&(info.as_mut_ptr() as u64).to_le_bytes());
    bpf(15, &mut attr).ok().map(|_| info)
}

/// The id of the program or map behind `fd` (both infos have it at 4).
pub fn obj_id(fd: &OwnedFd) -> u32 {
    let info: [u8; 8] = obj_info(fd).expect("object info");
    u32::from_le_bytes(info[4..8].try_into().unwrap())
}

/// The value size of map `map`.
pub fn value_size(map: &OwnedFd) -> usize {
    let info: [u8; 16] = obj_info(map).expect("map info");
    u32::from_le_bytes(info[12..16].try_into().unwrap()) as usize
}

/// The keys (run ids) of the pinned hash map `map`.
pub fn keys(map: &OwnedFd) -> Vec<u64> {
    let mut found = Vec::new();
    let mut key: Option<u64> = None;
    loop {
        let mut next = 0u64;
        let mut attr = [0u8; 128];
        attr[0..4].copy_from_slice(&(map.as_raw_fd() as u32).to_le_bytes());
        if let Some(k) = key.as_ref() {
            attr[8..16].copy_from_slice(&(std::ptr::from_ref(k) as u64).to_le_bytes());
        }
        attr[16..24].copy_from_slice(&(std::ptr::from_mut(&mut next) as u64).to_le_bytes());
        if bpf(4, &mut attr).is_err() {
            return found;
        }
        found.push(next);
        key = Some(next);
    }
}

/// `BPF_MAP_LOOKUP_ELEM` of the u64 `key` in `map` into `value` (a map of
/// maps gives the inner map's id); false when the key is not there.
pub fn lookup(map: &OwnedFd, key: u64, value: &mut [u8]) -> bool {
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&(map.as_raw_fd() as u32).to_le_bytes());
    attr[8..16].copy_from_slice(&(std::ptr::from_ref(&key) as u64).to_le_bytes());
    attr[16..24].copy_from_slice(&(value.as_mut_ptr() as u64).to_le_bytes());
    bpf(1, &mut attr).is_ok()
}

/// `BPF_MAP_UPDATE_ELEM` of the u64 `key` in `map` with `value`.
pub fn update(map: &OwnedFd, key: u64, value: &[u8]) {
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&(map.as_raw_fd() as u32).to_le_bytes());
    attr[8..16].copy_from_slice(&(std::ptr::from_ref(&key) as u64).to_le_bytes());
    attr[16..24].copy_from_slice(&(value.as_ptr() as u64).to_le_bytes());
    bpf(2, &mut attr).expect("update the map");
}

/// `BPF_MAP_DELETE_ELEM` of the u64 `key` in `map`.
pub fn delete(map: &OwnedFd, key: u64) {
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&(map.as_raw_fd() as u32).to_le_bytes());
    attr[8..16].copy_from_slice(&(std::ptr::from_ref(&key) as u64).to_le_bytes());
    bpf(3, &mut attr).expect("delete from the map");
}

/// Writes `value` at index 0 of the pinned array `map` of u32.
pub fn set_u32(map: &OwnedFd, value: u32) {
    let key = 0u32;
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&(map.as_raw_fd() as u32).to_le_bytes());
    attr[8..16].copy_from_slice(&(std::ptr::from_ref(&key) as u64).to_le_bytes());
    attr[16..24].copy_from_slice(&(std::ptr::from_ref(&value) as u64).to_le_bytes());
    bpf(2, &mut attr).expect("update RUN_LEVEL");
}

pub fn mounted() -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(PIN_ROOT))
}

pub fn drop_cache() {
    let out = tartaros(&["cache", "drop"], Path::new("/"));
    assert!(out.status.success(), "cache drop: {}", stderr(&out));
}

/// Where runs of this process make their cgroups (its own v2 cgroup).
pub fn run_parent() -> PathBuf {
    let root = cgroup2_root().expect("a cgroup2 mount");
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let own = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap()
        .trim_start_matches('/')
        .to_owned();
    root.join(own)
}

/// The cgroup of the run whose supervisor is `pid` (`tartaros-<pid>-...`).
pub fn run_cgroup(pid: u32) -> PathBuf {
    let prefix = format!("tartaros-{pid}-");
    std::fs::read_dir(run_parent())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
        })
        .expect("the run's cgroup")
}

/// The run ids with an entry in any of the per-run maps of the cache.
pub fn entries(dir: &Path) -> Vec<u64> {
    let mut ids: Vec<u64> = ["map_RUNS", "map_UNIX_ALLOW", "map_EVENTS_LOST"]
        .iter()
        .flat_map(|map| keys(&obj_get(&dir.join(map))))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

pub fn inode(path: &Path) -> u64 {
    std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(path).unwrap())
}

/// How many BPF links (of any kind) run program `prog_id` now.
pub fn links_of(prog_id: u32) -> usize {
    let mut count = 0;
    let mut id = 0u32;
    loop {
        let mut attr = [0u8; 128];
        attr[0..4].copy_from_slice(&id.to_le_bytes());
        // BPF_LINK_GET_NEXT_ID
        if bpf(31, &mut attr).is_err() {
            return count;
        }
        id = u32::from_le_bytes(attr[4..8].try_into().unwrap());
        let mut attr = [0u8; 128];
        attr[0..4].copy_from_slice(&id.to_le_bytes());
        // BPF_LINK_GET_FD_BY_ID: a link gone meanwhile is skipped.
        let Ok(fd) = bpf(30, &mut attr) else { continue };
        // SAFETY: a new descriptor the kernel returned, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        // struct bpf_link_info: u32 type, u32 id, u32 prog_id.
        let info: Option<[u8; 12]> = obj_info(&fd);
        if info.is_some_and(|i| u32::from_le_bytes(i[8..12].try_into().unwrap()) == prog_id) {
            count += 1;
        }
    }
}

/// The cache directory whose name starts with `prefix` (`unix_`, `full_`).
pub fn cache_dir_of(prefix: &str) -> Option<PathBuf> {
    std::fs::read_dir(PIN_ROOT)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
        })
}
