//! The records the join makes of its own (a `write` record per process
//! and file, and a notification no capture record claimed), in a file of
//! their own to keep `join.rs` readable.

use std::os::unix::fs::MetadataExt as _;

use super::{Join, Notice, Task, bit};
use crate::effectlog::{Decision, Record, Target, names};
use crate::fswatch::notify::Handle;
use crate::fswatch::relinked::{Place, locate};
use crate::fswatch::writes::Writes;

impl Join {
    /// Where the file of `path`'s writes `w` is ([`locate`]); a name that
    /// holds no file, with no removal seen, is of a removed file when the
    /// file's own handle no longer opens or has no link left. A file the
    /// run renamed is then looked for by its handle (see
    /// [`Self::find_renamed`]), and so is one replaced by a rename. A name
    /// that holds a file is not checked against the handle: the tree has
    /// moved on since the counts were read (a later lock file renamed over
    /// the name), and the record says what was written there before the
    /// records after it.
    pub(super) fn place_of(&self, path: &str, here: bool, w: &Writes) -> Place {
        let place = locate(path, here, &self.tmpfile_links, &self.relinked);
        let Some(fid) = w.fid.as_ref() else {
            return place;
        };
        let renamed = !self.writes.names_of(fid).is_empty();
        match place {
            Place::Missing if renamed => self.find_renamed(path, fid, place),
            Place::Gone if w.replaced => self.find_renamed(path, fid, place),
            Place::Missing if self.probe.gone(fid) => Place::Gone,
            place => place,
        }
    }

    /// Where the file `fid`, whose counts reached `path`, is. The kernel
    /// merges a thread's identical rename notifications still queued into
    /// the first one's place (`fanotify_should_merge`: same thread, kind,
    /// directory handles, names and file handle), so the counts of a
    /// rename loop can end at a name the file no longer has. The file is
    /// where its handle's inode is: at the newest name a rename of it gave
    /// or took that holds it; gone when the handle says so (asked again
    /// after the search: the run goes on meanwhile); else not found.
    fn find_renamed(&self, path: &str, fid: &Handle, place: Place) -> Place {
        let Some(at) = self.probe.linked_inode(fid) else {
            return if self.probe.gone(fid) {
                Place::Gone
            } else {
                // Cannot be told (descriptors out): as before.
                place
            };
        };
        let holds = |p: &str| {
            crate::mount_tree::open_file_no_symlinks(&names::on_disk(p))
                .and_then(|f| f.metadata().map_err(|_| nix::errno::Errno::EIO))
                .is_ok_and(|m| (m.dev(), m.ino()) == at)
        };
        let names = self.writes.names_of(fid);
        match names.iter().rev().find(|n| *n != path && holds(n)) {
            Some(name) => Place::Moved(name.clone()),
            None if self.probe.gone(fid) => Place::Gone,
            None => Place::Missing,
        }
    }

    /// A `write` record of `path`, with the file's size when it still
    /// exists; `exists` false: the name was removed.
    pub(super) fn write_record(&self, path: &str, w: &Writes, exists: bool) -> Record {
        let mut t = Target::new();
        let here = exists && !self.writes.was_removed(path);
        let place = self.place_of(path, here, w);
        let path = match &place {
            Place::Linked(to) => {
                t.insert("written_as", path.to_string());
                to.as_str()
            }
            Place::Gone => w.written_at.as_deref().unwrap_or(path), // as written
            Place::Moved(to) => to.as_str(),
            _ => path,
        };
        t.insert("path", path.to_string());
        t.insert("path_source", "kernel");
        t.insert("count", w.count);
        let on_disk = names::on_disk(path);
        if let Some(size) = exists
            .then(|| crate::fswatch::content::size_of(&on_disk))
            .flatten()
        {
            t.insert("size", size);
        }
        match place {
            Place::Gone if !w.replaced && self.still_linked(w) => {
                // The name is gone but the file is not: another link,
                // which may be outside every root (a hard link the host
                // made), keeps what was written (round 25b).
                t.insert("still_linked", true);
            }
            Place::Gone => {
                t.insert("deleted", true);
                if w.replaced {
                    // Not a removal of the name: a rename put another
                    // file there (the summary keeps the name).
                    t.insert("replaced", true);
                }
            }
            Place::Unknown => t.insert("links_forgotten", true),
            Place::Missing => t.insert("not_found", true),
            Place::Linked(_) | Place::Here | Place::Moved(_) => {}
        }
        if !self.tasks.contains_key(&w.task.tgid) {
            // A thread gone before it could be looked up, that no record
            // named: its process and user are not known.
            t.insert("pid_unverified", true);
        }
        self.kernel_record("write", w.task, w.first_ns, t)
    }

    /// Whether the file of writes `w` still has a link (its handle opens
    /// on a file with `st_nlink > 0`).
    fn still_linked(&self, w: &Writes) -> bool {
        w.fid
            .as_ref()
            .is_some_and(|fid| self.probe.linked_inode(fid).is_some())
    }

    fn kernel_record(
        &self,
        kind: &'static str,
        task: Task,
        mono_ns: u64,
        target: Target,
    ) -> Record {
        Record {
            kind,
            pid: task.tgid,
            ppid: task.ppid,
            uid: task.uid,
            mono_ns,
            wall_ns: u64::try_from(i128::from(mono_ns) + self.wall_offset).unwrap_or(0),
            decision: Decision::Allowed,
            errno: 0,
            target,
        }
    }

    /// Records for the bits of `n` no capture record claimed: effects the
    /// capture did not see (io_uring, core files, ...), named by the kernel.
    pub(super) fn uncaptured(&self, n: &Notice, task: Task) -> Vec<Record> {
        let dir = n.is_dir();
        let kinds: [(u64, &'static str); 4] = [
            (bit::CREATE, if dir { "mkdir" } else { "create" }),
            (bit::DELETE, if dir { "rmdir" } else { "unlink" }),
            (bit::RENAME, "rename"),
            (bit::ATTRIB, "attrib"),
        ];
        let mut out = Vec::new();
        for (b, kind) in kinds {
            if n.mask & !n.claimed & b == 0 {
                continue;
            }
            let mut t = Target::new();
            let path = n.path.clone().unwrap_or_else(|| n.name.clone());
            if b == bit::RENAME {
                t.insert("from", path);
                t.insert("to", n.new_path.clone().unwrap_or_default());
            } else {
                t.insert("path", path);
            }
            if n.path.is_none() {
                t.insert("dir_unresolved", true);
            }
            if dir {
                t.insert("dir", true);
            }
            t.insert("path_source", "kernel");
            if b == bit::ATTRIB && self.unverified_fd.contains(&n.tid) {
                // Most likely the change of one of the thread's calls on
                // a shared descriptor, whose records name no file.
                t.insert("unverified_fd_call", true);
            } else {
                t.insert("uncaptured", true);
            }
            if !self.tasks.contains_key(&n.tid) {
                t.insert("pid_unverified", true);
            }
            if n.tid != task.tgid {
                t.insert("tid", n.tid);
            }
            out.push(self.kernel_record(kind, task, n.read_ns, t));
        }
        out
    }
}
