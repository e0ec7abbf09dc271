//! Records named by the kernel's file (write-opens, descriptor calls).

use super::*;

/// A kernel file of `names` (leaf first) and walk `status`.
pub(super) fn kernel_file(names: &[&str], status: u32) -> KernelFile {
    // SAFETY: plain data; every bit pattern is valid.
    let mut f: KernelFile = unsafe { std::mem::zeroed() };
    let mut off = 0;
    for n in names {
        f.names[off..off + n.len()].copy_from_slice(n.as_bytes());
        off += n.len() + 1;
    }
    f.names_len = off as u32;
    f.depth = names.len() as u32;
    f.status = status;
    f.ino = 7;
    f.nlink = 1;
    f
}

/// A `SysFileEvent` of a successful write-open: `agent` is the string read
/// at entry, `names` the kernel's walk of the returned descriptor.
fn opened(agent: &str, names: &[&str], status: u32) -> SysFileEvent {
    // SAFETY: plain data; every bit pattern is valid.
    let mut e: SysFileEvent = unsafe { std::mem::zeroed() };
    e.sys = sys(record::SYS_FILE, effect::OPEN, nr::OPENAT, 5);
    e.sys.header.flags = flag::OPENS_FILE;
    e.sys.args = [libc::O_RDWR as u64, 0, 0];
    let (path, len) = path_buf(agent);
    e.path = path;
    e.sys.len = len;
    e.file = kernel_file(names, status | file_status::FD_CHANGED);
    e
}

#[test]
fn a_write_open_is_named_by_the_file_it_returned() {
    let mut d = Decoder::new();
    // The agent's buffer said one file, the descriptor holds another.
    let ev = opened(
        "/w/notes.txt",
        &["pre-commit", "hooks", ".git", "w"],
        file_status::COMPLETE,
    );
    let e = effect_of(&mut d, &bytes_of(&ev));
    let t = target(&e);
    assert_eq!(e.kind, "open");
    assert_eq!(t["path"], "/w/.git/hooks/pre-commit");
    assert_eq!(t["path_source"], "kernel");
    assert_eq!(t["claimed_path"], "/w/notes.txt");
    assert_eq!(t["ino"], 7);
    assert_eq!(t["flags"], libc::O_RDWR as u64);
    // A new descriptor is never "changed", and nothing of the ioctl shape.
    assert!(!t.contains_key("fd_changed") && !t.contains_key("fd"));

    let ev = opened("/w/a", &["a", "w"], file_status::COMPLETE);
    let t = target(&effect_of(&mut d, &bytes_of(&ev)));
    assert_eq!(t["path"], "/w/a");
    assert!(!t.contains_key("claimed_path"));

    // Without a whole walk, and with nothing that leads to the file, the
    // agent's string stays, says why, and says it is the agent's.
    let ev = opened("/w/b", &["b"], file_status::TRUNCATED);
    let t = target(&effect_of(&mut d, &bytes_of(&ev)));
    assert_eq!(t["path"], "/w/b");
    assert_eq!(t["kernel_path_incomplete"], "too deep");
    assert_eq!(t["path_source"], "agent");
    assert_eq!(t["path_unresolved"], true);
}

/// A `SysFileEvent` of a successful `fsetxattr(fd, "user.x")` whose
/// descriptor held `names` (leaf first) at exit.
fn fsetxattr(names: &[&str], flags: u32, status: u32) -> SysFileEvent {
    // SAFETY: plain data; every bit pattern is valid.
    let mut e: SysFileEvent = unsafe { std::mem::zeroed() };
    e.sys = sys(record::SYS_FILE, effect::XATTR, nr::FSETXATTR, 0);
    e.sys.fd = 3;
    e.sys.header.flags = flag::BY_FD | flags;
    let (name, len) = path_buf("user.x");
    e.path = name;
    e.sys.len2 = len;
    e.file = kernel_file(names, status);
    e
}

#[test]
fn a_descriptor_call_is_named_by_the_kernel_s_file_and_keeps_its_attribute() {
    let mut d = Decoder::new();
    let ev = fsetxattr(
        &["pre-commit", "hooks", ".git", "w"],
        0,
        file_status::COMPLETE,
    );
    let t = target(&effect_of(&mut d, &bytes_of(&ev)));
    assert_eq!(t["path"], "/w/.git/hooks/pre-commit");
    assert_eq!(t["path_source"], "kernel");
    assert_eq!(
        (&t["name"], &t["op"], &t["fd"], &t["ino"]),
        (&"user.x".into(), &"set".into(), &3.into(), &7.into())
    );
    assert!(!t.contains_key("path_unverified") && !t.contains_key("fd_shared"));
}

/// With the fd table shared, the file at exit may not be the one changed:
/// the record says which it read, and asserts no path.
#[test]
fn a_descriptor_call_of_a_shared_table_asserts_no_path() {
    let mut d = Decoder::new();
    let names = ["pre-commit", "hooks", ".git", "w"];
    let ev = fsetxattr(&names, flag::FD_SHARED, file_status::COMPLETE);
    let t = target(&effect_of(&mut d, &bytes_of(&ev)));
    assert_eq!(t["path_unverified"], true);
    assert_eq!(t["fd_shared"], true);
    assert_eq!(t["fd_path_at_exit"], "/w/.git/hooks/pre-commit");
    assert_eq!(t["name"], "user.x");
    for key in [
        "path",
        "path_source",
        "ino",
        "dev",
        "fd_changed",
        "path_unresolved",
    ] {
        assert!(!t.contains_key(key), "{key}: {t:?}");
    }
    let changed = file_status::COMPLETE | file_status::FD_CHANGED;
    let ev = fsetxattr(&names, flag::FD_SHARED, changed);
    let t = target(&effect_of(&mut d, &bytes_of(&ev)));
    assert_eq!(
        (&t["fd_changed"], &t["path_unverified"]),
        (&true.into(), &true.into())
    );
    let ev = fsetxattr(&[], flag::FD_SHARED, file_status::NO_FILE);
    let t = target(&effect_of(&mut d, &bytes_of(&ev)));
    assert_eq!(t["fd_at_exit_incomplete"], "fd not open at exit");
    assert!(!t.contains_key("path"));
}
