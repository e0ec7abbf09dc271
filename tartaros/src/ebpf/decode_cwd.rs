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

use super::*;

impl Decoder {
    /// The child starts in its parent's cwd, as sure as the parent's; a
    /// `CLONE_FS` child (`shared`) keeps sharing it: a `chdir` of either
    /// moves both. Before, a child's `chdir` moved only the child's model,
    /// and its parent's refused `open("secret/key")` was named in the old
    /// cwd.
    pub(super) fn inherit_cwd(&mut self, parent: u32, child: u32, shared: bool) {
        if shared {
            let group = *self.fs_peers.entry(parent).or_insert(parent);
            self.fs_peers.insert(child, group);
        }
        if let Some(cwd) = self.cwd(parent) {
            self.cwds.insert(child, cwd);
        }
        if self.cwd_unsure.contains(&parent) {
            self.cwd_unsure.insert(child);
        }
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
        let mut moved = vec![tgid];
        if let Some(&group) = self.fs_peers.get(&tgid) {
            moved.extend(
                self.fs_peers
                    .iter()
                    .filter(|&(&peer, &g)| g == group && peer != tgid)
                    .map(|(&peer, _)| peer),
            );
        }
        for peer in moved {
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
