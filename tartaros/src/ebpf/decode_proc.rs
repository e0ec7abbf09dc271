//! Decoding signals: the target process, and whether it is outside the
//! sandbox (from the host's view of its PID namespaces).

use super::*;

impl Decoder {
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
            // The target is a pidfd: its process, as the fd says now.
            t.insert("pidfd", s.fd);
            t.insert("signal", s.args[1] as u32 as i32);
            match super::super::targets::pidfd_pid(&self.proc_root, s.header.tgid, s.fd) {
                Some(pid) => {
                    t.insert("to_host_pid", pid);
                    t.insert("outside", !self.known.contains(&pid));
                }
                None => {
                    t.insert("to_unresolved", true);
                }
            }
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
    /// known to be in the sandbox. The sender may live in a pid namespace:
    /// its `NSpid` line says so, and the target is then matched against the
    /// innermost pids of the known sandbox processes.
    pub(super) fn target_outside(&mut self, sender: u32, to: i32) -> Option<bool> {
        let sender_ns = self.nspid(sender)?;
        if sender_ns.len() <= 1 {
            return Some(!self.known.contains(&(to as u32)));
        }
        let known: Vec<u32> = self.known.iter().copied().collect();
        for pid in known {
            if let Some(ns) = self.nspid(pid)
                && ns.last() == Some(&i64::from(to))
            {
                return Some(false);
            }
        }
        Some(true)
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
