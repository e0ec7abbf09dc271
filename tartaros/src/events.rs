//! Effects observed by the supervisor's own services (proxy, broker) and by
//! the eBPF programs, on their way to the effect log. Producers send them on
//! a channel; the supervisor is the log's only writer.

use serde_json::{Map, Value};

use crate::effectlog::Record;

/// One effect record before it gets its `seq`, `prev` and times.
#[derive(Debug, Clone, PartialEq)]
pub struct Effect {
    /// The record kind: `proxy`, `broker`, `connect`, `exec`, ...
    pub kind: &'static str,
    /// Everything but `kind`, `seq` and `prev`. Must hold no secret.
    pub fields: Map<String, Value>,
}

impl Effect {
    pub fn new(kind: &'static str) -> Self {
        Self {
            kind,
            fields: Map::new(),
        }
    }

    /// Adds a field (builder style).
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.fields.insert(key.to_string(), value.into());
        self
    }
}

/// What travels to the log writer: an effect of the supervisor's own
/// services, a batch of typed records from the eBPF capture, or a gap.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    Effect(Effect),
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

impl From<Effect> for Entry {
    fn from(effect: Effect) -> Self {
        Entry::Effect(effect)
    }
}

impl Entry {
    /// Everything in the entry as [`Effect`]s, each record with its common
    /// fields and `target` (for tests and tools; the writer takes records
    /// as they are).
    pub fn into_effects(self) -> Vec<Effect> {
        match self {
            Entry::Effect(effect) => vec![effect],
            Entry::Records(records) => records
                .into_iter()
                .map(|r| Effect {
                    kind: r.kind,
                    fields: r.to_fields(),
                })
                .collect(),
            Entry::Gap(gap) => vec![
                Effect::new("gap")
                    .with("count", gap.count)
                    .with("lost_kind", gap.lost_kind),
            ],
        }
    }
}

/// Names the sandbox process (host pid) behind an accepted connection,
/// from its peer address (see `CgroupPrograms::connection_owner`).
pub type ConnectionOwner =
    std::sync::Arc<dyn Fn(std::net::SocketAddr) -> Option<u32> + Send + Sync>;

/// The sender for the effects of one accepted connection from `peer`:
/// each gets the `pid` of the process that opened the connection, when
/// `owner` knows it (`pid_unknown` otherwise). The effects of a gateway
/// are built deep in its request handling; tagging them on their way out
/// keeps the attribution in one place.
pub fn attributed(
    effects: &EffectSender,
    owner: Option<&ConnectionOwner>,
    peer: Option<std::net::SocketAddr>,
) -> EffectSender {
    let Some(owner) = owner else {
        return effects.clone();
    };
    let pid = peer.and_then(|peer| owner(peer));
    let (tx, mut rx) = channel();
    let out = effects.clone();
    // Ends when the connection's last sender is gone.
    tokio::spawn(async move {
        while let Some(entry) = rx.recv().await {
            let entry = match entry {
                Entry::Effect(mut effect) => {
                    match pid {
                        Some(pid) => {
                            effect.fields.insert("pid".into(), pid.into());
                        }
                        None => {
                            effect.fields.insert("pid_unknown".into(), true.into());
                        }
                    }
                    Entry::Effect(effect)
                }
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
