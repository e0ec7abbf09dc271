//! The cwd model (see the module documentation of `decode.rs`): kept in
//! event order from the captured `chdir` / `fchdir` calls. A `chdir` names
//! its directory in the record; an `fchdir` does not, and its directory is
//! read from `/proc/<pid>/fd/<fd>` when the record arrives, by which time
//! the agent may have put another directory at that number (`fchdir(d);
//! dup2(usr, d)`): a refused `open("secret/key")` then read as a refused
//! open of `/usr/secret/key`. Such a cwd, and every path resolved against
//! it, is marked `cwd_unverified` until an absolute `chdir` names the cwd
//! again; `log verify` does not vouch for a refused record so named.
//! Since session 15 a chdir's record also carries the directory it reached
//! (`(ino, dev)` from `fs->pwd` at `sys_exit`): the model's name is kept,
//! made symlink-free, when it reaches that directory when the record is
//! decoded, and is unverified otherwise (a `chdir("lnk")` whose link was
//! re-pointed or replaced). `fchdir` records carry no inode (see
//! `sysemit.rs`), so its cwd stays unverified.
//!
//! The model holds one cwd per process, but the kernel holds one per
//! `fs_struct`, and a thread can have its own (`unshare(CLONE_FS)`, or a
//! thread cloned without `CLONE_FS`), as can a `CLONE_FS` child that has
//! called `unshare` since. Adversarial round 25b: a second thread's
//! `chdir` moved the model of the whole process, and the main thread's
//! refused `open("secret")` was named in the thread's directory, verify
//! ok. Every path-named call now carries two kernel facts of its caller,
//! `fs->users` against `signal->nr_threads` (`FS_SPLIT`, `FS_ALONE`,
//! `FS_THREADS`, read at `sys_enter`), and so does a fork record, of the
//! parent: a `chdir` moves what the facts prove it moves, and a name
//! resolved against a cwd they cannot vouch for is `cwd_unverified`.

use super::*;

impl Decoder {
    /// The child starts in its parent's cwd, as sure as the parent's; a
    /// `CLONE_FS` child (`FS_SHARED`) keeps sharing it: a `chdir` of either
    /// moves both. Before, a child's `chdir` moved only the child's model,
    /// and its parent's refused `open("secret/key")` was named in the old
    /// cwd. A parent whose forking thread does not share its `fs_struct`
    /// with every thread of its process (`FS_SPLIT`) may have given the
    /// child a cwd the model never saw.
    pub(super) fn inherit_cwd(&mut self, parent: u32, child: u32, flags: u32) {
        if flags & flag::FS_SPLIT != 0 {
            self.fs_split.insert(parent);
        }
        if flags & flag::FS_SHARED != 0 {
            let group = *self.fs_peers.entry(parent).or_insert(parent);
            self.fs_peers.insert(child, group);
        }
        if let Some(cwd) = self.cwd(parent) {
            self.cwds.insert(child, cwd);
        }
        if self.cwd_doubted(parent) {
            self.cwd_unsure.insert(child);
        }
    }

    /// Whether no kernel fact vouches for the modelled cwd of `tgid` for
    /// every one of its threads.
    pub(super) fn cwd_doubted(&self, tgid: u32) -> bool {
        self.cwd_unsure.contains(&tgid) || self.fs_split.contains(&tgid)
    }

    pub(super) fn forget_cwd(&mut self, tgid: u32) {
        self.cwds.remove(&tgid);
        self.cwd_unsure.remove(&tgid);
        self.fs_split.remove(&tgid);
        self.leave_fs_group(tgid);
    }

    /// Takes `tgid` out of its `CLONE_FS` group. The group's key is one
    /// of its members: a group still keyed by a process that left would
    /// take in that process's later `CLONE_FS` children (or a new process
    /// given its pid), and move their cwds with strangers'.
    fn leave_fs_group(&mut self, tgid: u32) {
        if self.fs_peers.remove(&tgid) != Some(tgid) {
            return;
        }
        let rest: Vec<u32> = (self.fs_peers.iter())
            .filter(|&(_, &g)| g == tgid)
            .map(|(&p, _)| p)
            .collect();
        if let Some(&key) = rest.iter().min() {
            for peer in rest {
                self.fs_peers.insert(peer, key);
            }
        }
    }

    fn fs_peers_of(&self, tgid: u32) -> Vec<u32> {
        let Some(&group) = self.fs_peers.get(&tgid) else {
            return Vec::new();
        };
        (self.fs_peers.iter())
            .filter(|&(&peer, &g)| g == group && peer != tgid)
            .map(|(&peer, _)| peer)
            .collect()
    }

    pub(super) fn cwd(&mut self, tgid: u32) -> Option<String> {
        if let Some(cwd) = self.cwds.get(&tgid) {
            return Some(cwd.clone());
        }
        let cwd = std::fs::read_link(format!("{}/{tgid}/cwd", self.proc_root))
            .ok()
            .map(|p| crate::effectlog::names::display_path(&p))?;
        self.cwds.insert(tgid, cwd.clone());
        Some(cwd)
    }

    /// Moves the modelled cwd of the caller (successful calls only).
    pub(super) fn chdir(&mut self, s: &SysEvent, path: Option<&[u8]>) {
        let tgid = s.header.tgid;
        // Whether the new cwd is named by the call itself (an absolute
        // path, or one relative to a cwd that is), or looked up in /proc
        // after the call.
        let (new, sure) = match path {
            Some(buf) if s.header.flags & flag::PATH_UNREADABLE == 0 => {
                // `..` stays: through a symlink (`chdir("link/..")`) it is
                // not the lexical parent, and folding it put files in the
                // wrong directory.
                match cstr(buf, s.len).map(shown) {
                    Some(p) if p.starts_with('/') => (Some(join("/", &p)), true),
                    Some(p) => (
                        self.cwd(tgid).map(|base| join(&base, &p)),
                        !self.cwd_unsure.contains(&tgid),
                    ),
                    None => (None, false),
                }
            }
            Some(_) => (None, false),
            None => (self.fd_path(tgid, s.fd), false),
        };
        // The kernel recorded the directory the call reached: a name
        // that reaches another one now (a link re-pointed, or replaced by
        // a directory, since `chdir("lnk")`) is not the cwd's, and one
        // that reaches it is, whatever the model's base was.
        let (new, sure) = match (new, s.args[1]) {
            (Some(model), ino) if ino != 0 => match reaching(&model, ino, s.args[2]) {
                Some(canonical) => (Some(canonical), true),
                None => (Some(model), false),
            },
            (new, _) => (new, sure),
        };
        let (split, peers) = self.who_moved(tgid, s.header.flags);
        let moved =
            std::iter::once((tgid, sure && !split)).chain(peers.into_iter().map(|p| (p, false)));
        for (peer, sure) in moved {
            match &new {
                Some(cwd) => self.cwds.insert(peer, cwd.clone()),
                // Unknown now: read from /proc next time, if still possible.
                None => self.cwds.remove(&peer),
            };
            if sure {
                self.cwd_unsure.remove(&peer);
            } else {
                self.cwd_unsure.insert(peer);
            }
        }
    }

    /// What a `chdir` of `tgid` moved, by the kernel facts of its caller
    /// (`flags`): whether the process may now have threads in other cwds
    /// (`fs_split`, kept until a `chdir` proves otherwise), and the other
    /// processes whose model moves with it. A peer's model moves but is
    /// unverified: the count of users cannot tell which peer still shares
    /// the caller's `fs_struct` (one of three that called `unshare` still
    /// counts among the users its new one has).
    fn who_moved(&mut self, tgid: u32, flags: u32) -> (bool, Vec<u32>) {
        let threads = flags & flag::FS_THREADS != 0;
        let alone = flags & flag::FS_ALONE != 0;
        let mut peers = self.fs_peers_of(tgid);
        // With threads, `users == nr_threads` is proof only when no other
        // process may share: with a `CLONE_FS` peer it is as well a split
        // process (a thread elsewhere) and a peer still here; `users >
        // nr_threads` likewise.
        let split = flags & flag::FS_SPLIT != 0 || (threads && !(alone && peers.is_empty()));
        if split {
            self.fs_split.insert(tgid);
        } else if alone {
            // Every thread, and no other process: the caller's cwd is the
            // process's, and its peers (if it had any: it has called
            // `unshare` since) keep theirs.
            self.fs_split.remove(&tgid);
            self.leave_fs_group(tgid);
            peers.clear();
        }
        // No bits (an `fchdir`, which carries no facts and is unverified
        // anyway; no offsets; or one thread sharing with other processes):
        // the group moves, as before round 25b.
        (split, peers)
    }

    /// A call whose caller's `fs_struct` some thread of its process does
    /// not share (`FS_SPLIT` at `sys_enter`): whichever cwd the model
    /// holds, it may not be this thread's, and the process stays split
    /// until a `chdir` proves otherwise (a thread whose `unshare` raced a
    /// `chdir` may `exec` and leave the process in its cwd).
    pub(super) fn doubt_split_call(&mut self, t: &mut Target, tgid: u32, flags: u32) {
        if flags & flag::FS_SPLIT == 0 {
            return;
        }
        self.fs_split.insert(tgid);
        let by_cwd = t.keys().any(|k| {
            k.ends_with("resolved_from") && t.get(k).and_then(|v| v.as_str()) == Some("cwd")
        });
        if by_cwd {
            t.insert("cwd_unverified", true);
        }
    }

    pub(super) fn fd_path(&self, tgid: u32, fd: i32) -> Option<String> {
        if fd < 0 {
            return None;
        }
        std::fs::read_link(format!("{}/{tgid}/fd/{fd}", self.proc_root))
            .ok()
            .map(|p| crate::effectlog::names::display_path(&p))
    }
}

/// The name without symlinks of the directory `shown` names now, if that
/// is the kernel's `(ino, dev)`: a directory has one name, and one with
/// no link in it keeps its meaning when links are re-pointed later.
fn reaching(shown: &str, ino: u64, dev: u64) -> Option<String> {
    use std::os::unix::fs::MetadataExt as _;
    let user = super::file::user_dev(dev as u32);
    let canonical = std::fs::canonicalize(crate::effectlog::names::on_disk(shown)).ok()?;
    let m = std::fs::metadata(&canonical).ok()?;
    (m.ino() == ino && m.dev() == user).then(|| crate::effectlog::names::display_path(&canonical))
}

#[cfg(test)]
#[path = "decode_cwd_tests.rs"]
mod tests;
