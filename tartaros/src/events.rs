//! Effect records ([`Record`]) of the supervisor's own services (proxy,
//! broker, port relays, signals) and of the eBPF programs, on their way to
//! the effect log. Producers send them on a channel; the supervisor is the
//! log's only writer.

use crate::effectlog::Record;

/// What travels to the log writer: one record of the supervisor's own
/// services, a batch of records from the eBPF capture, or a gap.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    Record(Record),
    Records(Vec<Record>),
    Gap(Gap),
}

/// Events a producer knows it lost: a `gap` record of the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    /// How many (at least 1; a lower bound when the exact number is not
    /// known).
    pub count: u64,
    /// What was lost: an effect kind, or why the count is unknown.
    pub lost_kind: &'static str,
}

impl From<Record> for Entry {
    fn from(record: Record) -> Self {
        Entry::Record(record)
    }
}

/// Names the sandbox process (host pid) behind an accepted connection,
/// from its two ends: the peer's address and the gateway's own (see
/// `CgroupPrograms::connection_owner`).
pub type ConnectionOwner = std::sync::Arc<dyn Fn(ConnectionEnds) -> Option<u32> + Send + Sync>;

/// An accepted connection's peer (the sandbox client) and local (the
/// gateway) addresses: together they name the connection, where the peer
/// alone does not (two sockets may share a local port).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionEnds {
    pub peer: std::net::SocketAddr,
    pub local: std::net::SocketAddr,
}

impl ConnectionEnds {
    /// The ends of an accepted connection; `None` when the socket cannot
    /// say (it is already gone).
    pub fn of(stream: &tokio::net::TcpStream) -> Option<Self> {
        Some(Self {
            peer: stream.peer_addr().ok()?,
            local: stream.local_addr().ok()?,
        })
    }
}

/// The parent and real user of the host's process `pid`, from
/// `/proc/<pid>/status`; `None` once it is gone.
fn owner_ids(pid: u32) -> Option<(u32, u32)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_ids(&status)
}

fn parse_ids(status: &str) -> Option<(u32, u32)> {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse::<u32>().ok())
    };
    Some((field("PPid:")?, field("Uid:")?))
}

/// The sender for the records of one accepted connection from `peer`:
/// each gets the `pid` of the process that opened the connection, when
/// `owner` knows it (`pid_unknown` otherwise). The effects of a gateway
/// are built deep in its request handling; tagging them on their way out
/// keeps the attribution in one place.
pub fn attributed(
    effects: &EffectSender,
    owner: Option<&ConnectionOwner>,
    ends: Option<ConnectionEnds>,
) -> EffectSender {
    // Without the programs (an ordinary user's run without the service)
    // nothing tells the owner: the records say so.
    let pid = owner.and_then(|owner| ends.and_then(|ends| owner(ends)));
    // Its parent and user, read once now that the connection is accepted
    // (the process that opened it is alive, or its connection would be
    // gone): the records' `ppid` and `uid` said 0, root, for the agent's
    // requests (adversarial round 13).
    let ids = pid.map(|pid| (pid, owner_ids(pid)));
    let (tx, mut rx) = channel();
    let out = effects.clone();
    // Ends when the connection's last sender is gone.
    tokio::spawn(async move {
        while let Some(entry) = rx.recv().await {
            let entry = match entry {
                Entry::Record(mut record) => {
                    match ids {
                        Some((pid, Some((ppid, uid)))) => {
                            (record.pid, record.ppid, record.uid) = (pid, ppid, uid);
                        }
                        Some((pid, None)) => {
                            record.pid = pid;
                            record.target.insert("ids_unknown", true);
                        }
                        None => record.target.insert("pid_unknown", true),
                    }
                    Entry::Record(record)
                }
                // The capture's records carry the pid the kernel saw.
                other => other,
            };
            if out.send(entry).is_err() {
                break;
            }
        }
    });
    tx
}

/// Where producers send effects. Unbounded so that a slow disk never
/// blocks the proxy; the supervisor drains it continuously.
pub type EffectSender = tokio::sync::mpsc::UnboundedSender<Entry>;
pub type EffectReceiver = tokio::sync::mpsc::UnboundedReceiver<Entry>;

pub fn channel() -> (EffectSender, EffectReceiver) {
    tokio::sync::mpsc::unbounded_channel()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pid of the connection's owner, or the flag that it is unknown,
    /// lands where the log has always had it: `pid`, or `target`.
    #[tokio::test]
    async fn attributed_records_carry_the_owner_pid_or_say_it_is_unknown() {
        let ends = ConnectionEnds {
            peer: "127.0.0.1:4000".parse().unwrap(),
            local: "127.0.0.1:3128".parse().unwrap(),
        };
        // This test's own process stands for the connection's owner.
        let me = std::process::id();
        for (known, want) in [(Some(me), me), (None, 0)] {
            let owner: ConnectionOwner = std::sync::Arc::new(move |_| known);
            let (out, mut rx) = channel();
            let tx = attributed(&out, Some(&owner), Some(ends));
            tx.send(Record::new("proxy").with("host", "a.example").into())
                .unwrap();
            tx.send(Entry::Records(vec![Record::new("open").pid(7)]))
                .unwrap();
            let Some(Entry::Record(record)) = rx.recv().await else {
                panic!("expected the gateway's record");
            };
            assert_eq!(record.pid, want);
            if known.is_some() {
                let ppid = std::os::unix::process::parent_id();
                let uid = nix::unistd::getuid().as_raw();
                assert_eq!((record.ppid, record.uid), (ppid, uid), "{record:?}");
            }
            let unknown = record.target.get("pid_unknown").is_some();
            assert_eq!(unknown, known.is_none(), "{record:?}");
            let Some(Entry::Records(batch)) = rx.recv().await else {
                panic!("expected the capture's batch");
            };
            assert_eq!(batch[0].pid, 7, "the capture's pid is the kernel's");
        }
        // Without the programs, nothing knows the owner.
        let (out, mut rx) = channel();
        let tx = attributed(&out, None, Some(ends));
        tx.send(Record::new("proxy").into()).unwrap();
        let Some(Entry::Record(record)) = rx.recv().await else {
            panic!("expected the gateway's record");
        };
        assert_eq!(record.target.get("pid_unknown"), Some(&true.into()));
    }

    #[test]
    fn a_status_file_gives_the_parent_and_the_real_uid() {
        let status = "Name:\tcurl\nPid:\t9\nPPid:\t4\nUid:\t65534\t65534\t65534\t65534\n";
        assert_eq!(parse_ids(status), Some((4, 65534)));
        assert_eq!(parse_ids("Name:\tx\n"), None);
    }
}
