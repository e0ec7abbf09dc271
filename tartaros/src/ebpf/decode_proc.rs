//! Decoding signals: the target process, and whether it is outside the
//! sandbox (from the host's view of its PID namespaces).

use super::*;
use tartaros_common::capture::file_status;

impl Decoder {
    /// The process a `pidfd_send_signal` signalled, from the file the
    /// kernel had at its descriptor (`e.file`, the same at entry and exit):
    /// the agent's descriptor is reopened and used only if it is still
    /// that file (inode and device), so a pidfd of another process put at
    /// the number after the call is never named. Without a match (the
    /// descriptor changed or closed, the process reaped) the target is
    /// unresolved. A pidfs inode is unique to its process (Linux 6.9);
    /// before pidfs every pidfd shared one inode, and the check cannot
    /// tell them apart (`target_unverified`).
    pub(super) fn pidfd_target(&mut self, t: &mut Target, e: &SysFileEvent) {
        let status = e.file.status;
        if status & file_status::FD_CHANGED != 0 {
            t.insert("fd_changed", true);
        }
        let held =
            status & (file_status::NO_LAYOUT | file_status::NO_FILE | file_status::FD_CHANGED) == 0;
        let tgid = e.sys.header.tgid;
        let kernel = (super::file::user_dev(e.file.dev), e.file.ino);
        let found = held
            .then(|| super::super::targets::pidfd_pid(&self.proc_root, tgid, e.sys.fd, kernel))
            .flatten();
        let Some((pid, pidfs)) = found else {
            t.insert("to_unresolved", true);
            return;
        };
        t.insert("to_host_pid", pid);
        if !pidfs {
            t.insert("target_unverified", true);
        }
        // A pidfd is opened by a pid of the sender's namespace.
        let in_namespace = self.nspid(tgid).is_some_and(|ns| ns.len() > 1);
        t.insert("outside", !in_namespace && !self.known.contains(&pid));
    }

    pub(super) fn put_signal(&mut self, t: &mut Target, s: &SysEvent) {
        if matches!(
            s.nr,
            nr::RT_SIGQUEUEINFO | nr::RT_TGSIGQUEUEINFO | nr::PIDFD_SEND_SIGNAL
        ) {
            t.insert(
                "call",
                tartaros_common::syscalls::name_of(s.nr).unwrap_or(""),
            );
        }
        if s.nr == nr::PIDFD_SEND_SIGNAL {
            // The target is the pidfd's process: named from the kernel's
            // file by `pidfd_target`, never from what the number holds
            // when the record is read.
            t.insert("pidfd", s.fd);
            t.insert("signal", s.args[1] as u32 as i32);
            return;
        }
        let to = s.args[0] as u32 as i32;
        t.insert("to", to);
        t.insert("signal", s.args[1] as u32 as i32);
        match s.nr {
            nr::TKILL => {
                t.insert("thread", true);
            }
            nr::TGKILL | nr::RT_TGSIGQUEUEINFO => {
                t.insert("tid", s.args[2] as u32 as i32);
            }
            _ => {}
        }
        if to <= 0 {
            // 0: the caller's process group, -1: every process it may
            // signal, -N: process group N (all inside the pid namespace).
            t.insert("group", true);
        } else if let Some(outside) = self.target_outside(s.header.tgid, to) {
            t.insert("outside", outside);
        }
    }

    /// Whether pid `to`, as the sender `sender` names it, is a process not
    /// known to be in the sandbox (`None`: the sender is gone, so how it
    /// names pids is unknown). See [`outside`].
    pub(super) fn target_outside(&mut self, sender: u32, to: i32) -> Option<bool> {
        let levels = self.nspid(sender)?.len();
        Some(outside(levels, to, &self.known))
    }

    pub(super) fn nspid(&mut self, pid: u32) -> Option<Vec<i64>> {
        let root = self.proc_root.clone();
        self.nspids
            .entry(pid)
            .or_insert_with(|| {
                let status = std::fs::read_to_string(format!("{root}/{pid}/status")).ok()?;
                let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
                Some(
                    line[6..]
                        .split_whitespace()
                        .filter_map(|v| v.parse().ok())
                        .collect(),
                )
            })
            .clone()
    }
}

/// Whether `to`, named by a sender whose `NSpid` line has `levels` pids,
/// is outside the sandbox. A sender in a pid namespace (more than one
/// level) names only the processes of its own namespace, the run's (no
/// other process joins it, and seccomp refuses the agent a nested one):
/// never outside. Its target used to be looked up in `/proc` when the
/// record was decoded, and a child killed and reaped by then matched
/// nothing: a signal to the agent's own child was logged as sent outside
/// (`log_exec_truth.rs`). A sender in the host's namespace names host
/// pids: outside unless a known sandbox process.
fn outside(levels: usize, to: i32, known: &std::collections::HashSet<u32>) -> bool {
    levels <= 1 && !u32::try_from(to).is_ok_and(|pid| known.contains(&pid))
}

#[cfg(test)]
mod tests {
    use super::outside;

    #[test]
    fn a_sender_in_a_pid_namespace_signals_only_inside_it() {
        let known = [40, 41].into_iter().collect();
        assert!(!outside(2, 3, &known), "a reaped child of the namespace");
        assert!(!outside(3, 1, &known));
        assert!(outside(1, 1, &known), "the host's pid 1");
        assert!(!outside(1, 41, &known));
        assert!(outside(1, 42, &known));
    }
}
