//! Effects observed by the supervisor's own services (proxy, broker) and by
//! the eBPF programs, on their way to the effect log. Producers send them on
//! a channel; the supervisor is the log's only writer.

use serde_json::{Map, Value};

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

/// Where producers send effects. Unbounded so that a slow disk never
/// blocks the proxy; the supervisor drains it continuously.
pub type EffectSender = tokio::sync::mpsc::UnboundedSender<Effect>;
pub type EffectReceiver = tokio::sync::mpsc::UnboundedReceiver<Effect>;

pub fn channel() -> (EffectSender, EffectReceiver) {
    tokio::sync::mpsc::unbounded_channel()
}
