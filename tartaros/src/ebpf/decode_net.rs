//! The network side of decoding: socket addresses and the records of the
//! unix and connect programs.

use super::*;

/// What a connect / unix hook saw of one destination during the call in
/// flight, kept for the syscall's record.
#[derive(Debug)]
pub(super) struct Note<T> {
    /// The destination as the kernel copied it; `None` when it names
    /// nothing the record can show as a destination (an inet family the
    /// filter refused, a relative unix name).
    dest: T,
    /// The record of its refusal, when the hook refused it.
    refused: Option<Target>,
    /// Rewritten to the transparent proxy (`REDIRECT`).
    redirected: bool,
}

impl Decoder {
    /// The `connect` / `sendto` / `bind` part of a syscall's record.
    /// `None` when the call is no effect of its own; else the errno the
    /// record carries.
    pub(super) fn put_net(
        &mut self,
        t: &mut Target,
        s: &SysEvent,
        addr: Option<&[u8]>,
        mut errno: u64,
    ) -> Option<u64> {
        let h = &s.header;
        let mmsg = s.nr == nr::SENDMMSG;
        // sendmmsg whose first message named no destination (or whose
        // messages were unreadable): it sent to a destination only if a
        // kernel hook saw one.
        let unnamed = mmsg && h.flags & flag::ADDR_UNREADABLE != 0;
        if let Some(a) = addr.filter(|_| !unnamed) {
            self.put_sockaddr(t, h.tgid, a, s.len, h.flags);
        }
        if h.effect != effect::BIND {
            let (keep, refused) = self.put_kernel_destination(t, h.pid, errno, (mmsg, unnamed));
            if let Some(mut r) = refused {
                // The kernel stops a sendmmsg at its first refused
                // message and returns how many it sent, so that is the
                // refused message's index. The call succeeded and its
                // record is allowed: the refusal needs one of its own.
                r.insert("addr_source", "kernel");
                r.insert("fd", s.fd);
                r.insert("messages", s.args[1] as u32);
                r.insert("message", s.ret);
                self.refusal = Some(self.effect("sendto", h, EPERM, r));
            }
            if !keep {
                return None;
            }
        }
        t.insert("fd", s.fd);
        if mmsg {
            // `ret` messages of `messages` were sent.
            t.insert("messages", s.args[1] as u32);
            if s.ret >= 0 {
                t.insert("sent", s.ret);
            }
        }
        if errno == EINPROGRESS && h.effect == effect::CONNECT {
            // A non-blocking connect that the filters let through.
            t.insert("in_progress", true);
            errno = 0;
        }
        Some(errno)
    }

    /// The refusal the record just decoded does not tell (a `sendmmsg`
    /// that sent messages before the one a filter refused): a record of
    /// its own, to follow that one.
    pub fn take_refusal(&mut self) -> Option<Record> {
        self.refusal.take()
    }

    pub(super) fn put_sockaddr(
        &mut self,
        t: &mut Target,
        tgid: u32,
        a: &[u8],
        len: i32,
        flags: u32,
    ) {
        if flags & flag::ADDR_UNREADABLE != 0 || len < 2 {
            t.insert("family", "unknown");
            t.insert("addr_unreadable", true);
            return;
        }
        if flags & flag::ADDR_TRUNCATED != 0 {
            t.insert("addr_truncated", true);
        }
        let a = &a[..(len as usize).min(a.len())];
        let family = u16::from_ne_bytes([a[0], a[1]]);
        let port = |a: &[u8]| a.get(2..4).map(|p| u16::from_be_bytes([p[0], p[1]]));
        match family {
            AF_INET if a.len() >= 8 => {
                t.insert("family", "inet");
                t.insert(
                    "addr",
                    std::net::Ipv4Addr::new(a[4], a[5], a[6], a[7]).to_string(),
                );
                t.insert("port", port(a).unwrap_or(0));
            }
            AF_INET6 if a.len() >= 24 => {
                let mut ip = [0u8; 16];
                ip.copy_from_slice(&a[8..24]);
                t.insert("family", "inet6");
                t.insert("addr", std::net::Ipv6Addr::from(ip).to_string());
                t.insert("port", port(a).unwrap_or(0));
            }
            AF_UNIX => {
                t.insert("family", "unix");
                let name = &a[2..];
                if name.first() == Some(&0) {
                    // Abstract: the whole name, NULs included, is the address.
                    t.insert("path", format!("@{}", shown(&name[1..])));
                    t.insert("abstract", true);
                } else {
                    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
                    let mut buf = name[..end].to_vec();
                    buf.push(0);
                    self.put_path(
                        t,
                        "path",
                        tgid,
                        AT_FDCWD,
                        &buf,
                        buf.len() as i32,
                        false,
                        false,
                    );
                }
            }
            0 => {
                t.insert("family", "unspec");
            }
            other => {
                t.insert("family", other);
            }
        }
    }

    pub(super) fn unix(&mut self, e: &UnixEvent) -> Option<Record> {
        let kind = if e.hook == unix_hook::SENDMSG {
            "sendto"
        } else {
            "connect"
        };
        let len = (e.addr_len as usize).saturating_sub(2).min(SUN_PATH_MAX);
        let name = &e.path[..len];
        if e.verdict & unix_verdict::DESTINATION_NOTE != 0 {
            let v = e.verdict & !unix_verdict::DESTINATION_NOTE;
            // Kept for the syscall's own record, named as `put_sockaddr`
            // names the agent's.
            let shown_name = if name.first() == Some(&0) {
                format!("@{}", shown(&name[1..]))
            } else {
                let end = name.iter().position(|&b| b == 0).unwrap_or(len);
                shown(&name[..end])
            };
            let refused = (v >= unix_verdict::DENY).then(|| {
                let mut t = Target::new();
                t.insert("family", "unix");
                t.insert("path", shown_name.clone());
                t.insert("reason", unix_reason(v));
                t
            });
            // A relative or unreadable name names nothing on its own: the
            // record keeps the agent's string, resolved by its cwd.
            let named = v != unix_verdict::DENY_RELATIVE && v != unix_verdict::DENY_ERROR;
            let notes = self.kernel_unix.entry(e.header.pid).or_default();
            if notes.len() < 1024 {
                notes.push(Note {
                    dest: named.then_some(shown_name),
                    refused,
                    redirected: false,
                });
            }
            return None;
        }
        let mut t = Target::new();
        t.insert("family", "unix");
        let end = name.iter().position(|&b| b == 0).unwrap_or(len);
        t.insert("path", shown(&name[..end]));
        t.insert("reason", unix_reason(e.verdict));
        Some(self.effect(kind, &e.header, EPERM, t))
    }

    /// Replaces the agent's sockaddr (read from its memory at
    /// `sys_enter`, so a second thread can change it before the kernel's
    /// copy) of a `connect` / `sendto` record with the destination the
    /// kernel's inet hook saw in the same call. A successful inet call
    /// the hook never saw did not use its address (`sendto` on a
    /// connected TCP socket): the record says so and names no destination.
    /// `sendmmsg` (`all`) names the first destination its messages went
    /// to and lists them all in `destinations` when there are several.
    /// First of the pair, false: the record of a `sendmmsg` whose first
    /// message named no destination (`unnamed`) and whose messages all
    /// went to the connected peer, which is no effect of its own.
    /// Second: what a filter refused in a `sendmmsg` that succeeded (it
    /// sent the messages before), the target of a record of its own; the
    /// call's record names only where its messages went.
    pub(super) fn put_kernel_destination(
        &mut self,
        t: &mut Target,
        tid: u32,
        errno: u64,
        (all, unnamed): (bool, bool),
    ) -> (bool, Option<Target>) {
        let mut unix = self.kernel_unix.remove(&tid).unwrap_or_default();
        let mut notes = self.kernel_dests.remove(&tid).unwrap_or_default();
        let mut refused = None;
        if all && errno == 0 {
            refused = take_refused(&mut unix).or(take_refused(&mut notes));
        }
        let unix: Vec<String> = unix.into_iter().filter_map(|n| n.dest).collect();
        if let Some(path) = if all { unix.first() } else { unix.last() } {
            put_kernel_unix_path(t, path);
            return (true, refused);
        }
        let notes: Vec<(std::net::SocketAddr, bool)> = notes
            .iter()
            .filter_map(|n| n.dest.map(|d| (d, n.redirected)))
            .collect();
        let kernel = if all { notes.first() } else { notes.last() };
        if unnamed && kernel.is_none() {
            return (false, refused);
        }
        let family = t.get("family").and_then(|f| f.as_str());
        let inet = matches!(family, Some("inet" | "inet6"));
        if kernel.is_none() && (!inet || errno != 0) {
            if inet || family == Some("unix") {
                // No hook's note: the agent's claim is all there is.
                t.insert("addr_source", "agent");
            }
            return (true, refused);
        }
        let claimed = Claimed {
            family: t.remove("family"),
            addr: t.remove("addr"),
            port: t.remove("port"),
            path: t.remove("path"),
        };
        let Some(&(dest, redirected)) = kernel else {
            // Succeeded without the kernel looking at the address.
            claimed.put(t, true);
            t.insert("addr_source", "agent");
            t.insert("addr_unused", true);
            return (true, refused);
        };
        let family = if dest.is_ipv4() { "inet" } else { "inet6" };
        let addr = dest.ip().to_string();
        if claimed.family.as_ref().and_then(Value::as_str) != Some(family)
            || claimed.addr.as_ref().and_then(Value::as_str) != Some(addr.as_str())
            || claimed.port.as_ref().and_then(Value::as_u64) != Some(u64::from(dest.port()))
        {
            claimed.put(t, false);
        }
        t.insert("family", family);
        t.insert("addr", addr);
        t.insert("port", dest.port());
        t.insert("addr_source", "kernel");
        if redirected {
            // Sent to the transparent proxy, whose record tells what
            // became of it: nothing reached this address.
            t.insert("transparent", true);
        }
        let mut distinct: Vec<String> = Vec::new();
        for (d, _) in notes.iter().filter(|_| all) {
            let d = d.to_string();
            if !distinct.contains(&d) {
                distinct.push(d);
            }
        }
        if distinct.len() > 1 {
            t.insert("destinations", distinct);
        }
        (true, refused)
    }

    pub(super) fn connect_event(&mut self, e: &ConnectEvent) -> Option<Record> {
        if e.verdict & verdict::DESTINATION_NOTE != 0 {
            // Kept for the syscall's own record (sendmmsg: one per message).
            let dest = super::super::event_destination(e);
            let refused = verdict::is_denied(e.verdict).then(|| {
                let mut t = Target::new();
                put_inet(&mut t, dest, e.family);
                t
            });
            let notes = self.kernel_dests.entry(e.pid).or_default();
            // sendmmsg sends at most UIO_MAXIOV messages a call.
            if notes.len() < 1024 {
                notes.push(Note {
                    dest,
                    refused,
                    redirected: e.verdict & !verdict::DESTINATION_NOTE == verdict::REDIRECT,
                });
            }
            return None;
        }
        let kind = match e.kind {
            kind::SENDMSG4 | kind::SENDMSG6 => "sendto",
            _ => "connect",
        };
        let mut t = Target::new();
        if e.kind == kind::SOCK_CREATE {
            t.insert("socket", true);
            t.insert("family", e.family);
            t.insert("type", e.sock_type);
            t.insert("protocol", e.protocol);
        } else {
            put_inet(&mut t, super::super::event_destination(e), e.family);
        }
        if e.verdict == verdict::ALLOW_MONITOR {
            t.insert("monitor", true);
        }
        if e.verdict == verdict::REDIRECT {
            // Sent to the transparent proxy, which logs its own decision.
            t.insert("transparent", true);
        }
        let errno = if verdict::is_denied(e.verdict) {
            EPERM
        } else {
            0
        };
        let header = EventHeader {
            ktime_ns: e.ktime_ns,
            cgroup_id: e.cgroup_id,
            pid: e.pid,
            tgid: e.tgid,
            uid: e.uid,
            record: 0,
            effect: 0,
            ppid: self.ppids.get(&e.tgid).copied().unwrap_or(0),
            flags: 0,
        };
        Some(self.effect(kind, &header, errno, t))
    }
}

/// The destination of a connect program's event: the address, or the
/// family it refused (`unspec` for 0, as the agent's sockaddr is named).
fn put_inet(t: &mut Target, dest: Option<std::net::SocketAddr>, family: u16) {
    match dest {
        Some(dest) => {
            t.insert("family", if dest.is_ipv4() { "inet" } else { "inet6" });
            t.insert("addr", dest.ip().to_string());
            t.insert("port", dest.port());
        }
        None if family == 0 => t.insert("family", "unspec"),
        None => t.insert("family", family),
    }
}

/// Takes out the refused destination of a call's notes, if any (a
/// `sendmmsg` stops at its first refusal, so there is at most one), and
/// drops the rest of the refused ones.
fn take_refused<T>(notes: &mut Vec<Note<T>>) -> Option<Target> {
    let first = notes.iter().position(|n| n.refused.is_some())?;
    let refused = notes.remove(first).refused;
    notes.retain(|n| n.refused.is_none());
    refused
}

fn unix_reason(verdict: u16) -> &'static str {
    match verdict {
        unix_verdict::DENY => "outside the allowed socket directories",
        unix_verdict::DENY_RELATIVE => "relative socket path",
        unix_verdict::DENY_DOTDOT => "socket path with ..",
        unix_verdict::DENY_UNPINNED => "socket path too long to look up without symlinks",
        _ => "socket address unreadable",
    }
}

/// Names the unix socket the kernel's hook saw in a `connect` / `sendto`
/// record; the agent's sockaddr, when it said otherwise, as `claimed_*`.
fn put_kernel_unix_path(t: &mut Target, path: &str) {
    let claimed = Claimed {
        family: t.remove("family"),
        addr: t.remove("addr"),
        port: t.remove("port"),
        path: t.remove("path"),
    };
    t.remove("abstract");
    if claimed.family.as_ref().and_then(Value::as_str) != Some("unix")
        || claimed.path.as_ref().and_then(Value::as_str) != Some(path)
        || claimed.addr.is_some()
    {
        claimed.put(t, false);
    }
    t.insert("family", "unix");
    t.insert("path", path);
    // Pathnames are absolute: the hook refuses relative ones.
    if path.starts_with('@') {
        t.insert("abstract", true);
    }
    t.insert("addr_source", "kernel");
}

/// The destination the agent's sockaddr gave, kept as `claimed_*`.
struct Claimed {
    family: Option<Value>,
    addr: Option<Value>,
    port: Option<Value>,
    path: Option<Value>,
}

impl Claimed {
    /// `keep_family`: the record has no other family to show.
    fn put(self, t: &mut Target, keep_family: bool) {
        if let Some(family) = self.family {
            t.insert(
                if keep_family {
                    "family"
                } else {
                    "claimed_family"
                },
                family,
            );
        }
        for (key, value) in [
            ("claimed_addr", self.addr),
            ("claimed_port", self.port),
            ("claimed_path", self.path),
        ] {
            if let Some(value) = value {
                t.insert(key, value);
            }
        }
    }
}
