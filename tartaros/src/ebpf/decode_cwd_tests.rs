//! The cwd model against the kernel facts of round 25b: a `chdir` moves
//! what the caller's `fs_struct` proves it moves, and a name resolved
//! against a cwd no fact vouches for is `cwd_unverified`.

use super::*;
use serde_json::Map;

const P: u32 = u32::MAX - 101;
const C: u32 = u32::MAX - 102;
const D: u32 = u32::MAX - 103;

fn bytes_of<T: Plain>(v: &T) -> Vec<u8> {
    // SAFETY: `T: Plain` is repr(C) plain data without padding.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
}

fn header(record: u16, effect: u16, tgid: u32, flags: u32) -> EventHeader {
    EventHeader {
        ktime_ns: 5_000,
        cgroup_id: 9,
        pid: tgid,
        tgid,
        uid: 1000,
        record,
        effect,
        ppid: 1,
        flags,
    }
}

fn path_event(effect: u16, nr: u32, tgid: u32, name: &str, flags: u32) -> Vec<u8> {
    let mut path = [0u8; PATH_BYTES];
    path[..name.len()].copy_from_slice(name.as_bytes());
    let sys = SysEvent {
        header: header(record::SYS_PATH, effect, tgid, flags),
        nr,
        fd: AT_FDCWD,
        fd2: AT_FDCWD,
        len: name.len() as i32 + 1,
        len2: 0,
        _pad: 0,
        ret: -13,
        args: [0; 3],
    };
    bytes_of(&SysPathEvent { sys, path })
}

fn chdir(d: &mut Decoder, tgid: u32, to: &str, flags: u32) {
    let mut bytes = path_event(effect::CHDIR, nr::CHDIR, tgid, to, flags);
    // A successful call: only those are recorded.
    let ret = std::mem::offset_of!(SysEvent, ret);
    bytes[ret..ret + 8].copy_from_slice(&0i64.to_ne_bytes());
    assert!(matches!(d.decode(&bytes), Decoded::Skip));
}

/// The target of a refused `unlink(name)` by `tgid`.
fn refused(d: &mut Decoder, tgid: u32, name: &str, flags: u32) -> Map<String, Value> {
    match d.decode(&path_event(effect::UNLINK, nr::UNLINK, tgid, name, flags)) {
        Decoded::Record(r) => r.target.to_map(),
        other => panic!("expected a record, got {other:?}"),
    }
}

fn fork(d: &mut Decoder, parent: u32, child: u32, flags: u32) {
    let fork = ForkEvent {
        header: header(record::FORK, effect::FORK, parent, flags),
        child,
        _pad: 0,
    };
    assert!(matches!(d.decode(&bytes_of(&fork)), Decoded::Record(_)));
}

fn vouched(t: &Map<String, Value>, path: &str) {
    assert_eq!(t["path"], path, "{t:?}");
    assert_eq!(t["resolved_from"], "cwd", "{t:?}");
    assert!(t.get("cwd_unverified").is_none(), "{t:?}");
}

fn doubted(t: &Map<String, Value>) {
    assert_eq!(t["cwd_unverified"], true, "{t:?}");
}

const ONE: u32 = flag::FS_ALONE;
const THREADS_ALL: u32 = flag::FS_ALONE | flag::FS_THREADS;
const SPLIT: u32 = flag::FS_SPLIT | flag::FS_THREADS;

#[test]
fn a_chdir_by_a_thread_with_its_own_cwd_leaves_the_process_unverified() {
    let mut d = Decoder::new();
    chdir(&mut d, P, "/w/x", ONE);
    vouched(&refused(&mut d, P, "secret", ONE), "/w/x/secret");
    // The second thread, `unshare(CLONE_FS)`d (or cloned without
    // `CLONE_FS`), moves to y: the main thread is still in x.
    chdir(&mut d, P, "/w/y", SPLIT);
    doubted(&refused(&mut d, P, "secret", ONE));
    // The thread is gone, and the main thread's own chdir shows every
    // thread in its fs_struct: vouched again.
    chdir(&mut d, P, "/w/x", ONE);
    vouched(&refused(&mut d, P, "secret", ONE), "/w/x/secret");
    // Threads that all share it, and no other process: as sure.
    chdir(&mut d, P, "/w/y", THREADS_ALL);
    vouched(&refused(&mut d, P, "secret", THREADS_ALL), "/w/y/secret");
}

#[test]
fn a_relative_name_of_a_split_caller_is_unverified() {
    let mut d = Decoder::new();
    chdir(&mut d, P, "/w/x", ONE);
    // No chdir since the split (a thread whose `unshare` raced the chdir):
    // the call's own facts.
    doubted(&refused(&mut d, P, "secret", SPLIT));
    // And after it: the split thread may have `exec`d in its own cwd.
    doubted(&refused(&mut d, P, "secret", ONE));
    chdir(&mut d, P, "/w/x", ONE);
    vouched(&refused(&mut d, P, "secret", ONE), "/w/x/secret");
    // An absolute name needs no cwd.
    let t = refused(&mut d, P, "/w/x/secret", SPLIT);
    assert!(t.get("cwd_unverified").is_none(), "{t:?}");
}

#[test]
fn a_clone_fs_child_that_unshared_moves_alone() {
    let mut d = Decoder::new();
    chdir(&mut d, P, "/w/x", ONE);
    fork(&mut d, P, C, flag::FS_SHARED);
    // Still sharing: the child's chdir moves the parent, unverified (a
    // count of users cannot tell which peer still shares).
    chdir(&mut d, C, "/w/y", 0);
    let t = refused(&mut d, P, "secret", 0);
    assert_eq!(t["path"], "/w/y/secret", "{t:?}");
    doubted(&t);
    vouched(&refused(&mut d, C, "secret", 0), "/w/y/secret");
    // The parent's own chdir vouches for it again.
    chdir(&mut d, P, "/w/x", 0);
    vouched(&refused(&mut d, P, "secret", 0), "/w/x/secret");
    // `unshare(CLONE_FS)` in the child: alone in its fs_struct, its chdir
    // moves it alone.
    chdir(&mut d, C, "/w/y", ONE);
    vouched(&refused(&mut d, C, "secret", ONE), "/w/y/secret");
    vouched(&refused(&mut d, P, "secret", 0), "/w/x/secret");
    // And it is no peer any more: the parent's chdir leaves it.
    chdir(&mut d, P, "/w", 0);
    vouched(&refused(&mut d, C, "secret", ONE), "/w/y/secret");
}

#[test]
fn threads_and_a_clone_fs_peer_are_never_proof() {
    let mut d = Decoder::new();
    chdir(&mut d, P, "/w/x", ONE);
    fork(&mut d, P, C, flag::FS_SHARED);
    // users == nr_threads with a peer: every thread here and the peer
    // gone, or a thread elsewhere and the peer here.
    chdir(&mut d, P, "/w/y", THREADS_ALL);
    doubted(&refused(&mut d, P, "secret", 0));
    doubted(&refused(&mut d, C, "secret", 0));
    // users > nr_threads: the same.
    chdir(&mut d, P, "/w/x", flag::FS_THREADS);
    doubted(&refused(&mut d, P, "secret", 0));
}

#[test]
fn a_child_of_a_split_thread_starts_unverified() {
    let mut d = Decoder::new();
    chdir(&mut d, P, "/w/x", ONE);
    fork(&mut d, P, C, flag::FS_SPLIT);
    doubted(&refused(&mut d, C, "secret", ONE));
    doubted(&refused(&mut d, P, "secret", ONE));
    // Its own chdir, alone, names its cwd.
    chdir(&mut d, C, "/w/y", ONE);
    vouched(&refused(&mut d, C, "secret", ONE), "/w/y/secret");
}

#[test]
fn a_group_outlives_the_process_it_was_keyed_by() {
    let mut d = Decoder::new();
    chdir(&mut d, P, "/w/x", ONE);
    fork(&mut d, P, C, flag::FS_SHARED);
    fork(&mut d, P, D, flag::FS_SHARED);
    d.forget_cwd(P);
    assert_eq!(d.fs_peers.get(&C), d.fs_peers.get(&D));
    assert_eq!(d.fs_peers.get(&C), Some(&C.min(D)));
    // A new process with the old key's pid is no peer of theirs.
    chdir(&mut d, P, "/w/z", 0);
    chdir(&mut d, C, "/w/y", 0);
    vouched(&refused(&mut d, P, "secret", 0), "/w/z/secret");
    let t = refused(&mut d, D, "secret", 0);
    assert_eq!(t["path"], "/w/y/secret", "{t:?}");
}
