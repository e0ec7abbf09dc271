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
    let Some(owner) = owner else {
        return effects.clone();
    };
    let pid = ends.and_then(|ends| owner(ends));
    let (tx, mut rx) = channel();
    let out = effects.clone();
    // Ends when the connection's last sender is gone.
    tokio::spawn(async move {
        while let Some(entry) = rx.recv().await {
            let entry = match entry {
                Entry::Record(mut record) => {
                    match pid {
                        Some(pid) => record.pid = pid,
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
        for (known, want) in [(Some(42), 42), (None, 0)] {
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
            let unknown = record.target.get("pid_unknown").is_some();
            assert_eq!(unknown, known.is_none(), "{record:?}");
            let Some(Entry::Records(batch)) = rx.recv().await else {
                panic!("expected the capture's batch");
            };
            assert_eq!(batch[0].pid, 7, "the capture's pid is the kernel's");
        }
    }
}
