//! `--port N`: the sandbox has a private network namespace, so its loopback
//! is its own. A granted port N is a gateway: the supervisor listens on
//! 127.0.0.1:N and [::1]:N *inside* the sandbox's namespace and relays each
//! connection to the same address and port of the host. Every relayed
//! connection is a `connect` effect in the log.
//!
//! Each connection runs in the relay's own task set (see
//! [`crate::proxy::accept_loop`]), so aborting the relay when the agent
//! exits ends every connection at once, even one a host service keeps
//! open: none of them can hold the run (and the unsealed log) open.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};

use crate::events::{Effect, EffectSender};

/// Bound on connecting to the host's service: a port that drops SYNs must
/// not pin a connection slot for the kernel's minutes-long retry.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Relayed connections at once; more wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 256;

/// Relays connections accepted on `listener` (inside the sandbox) to
/// `upstream` on the host, until the future is dropped or aborted (which
/// also ends the connections it relays).
pub async fn relay(listener: TcpListener, upstream: SocketAddr, effects: EffectSender) {
    crate::proxy::accept_loop(listener, MAX_CONNECTIONS, move |inside| {
        relay_one(inside, upstream, CONNECT_TIMEOUT, effects.clone())
    })
    .await
}

/// The `connect` effect of one relayed connection, sent when it is over,
/// also when the run's end aborts it half-way (then with `"ended":
/// "run-ended"` and without byte counts, which the abort loses).
struct Record {
    effects: EffectSender,
    /// The effect as known so far; replaced by the final one.
    effect: Option<Effect>,
    started: Instant,
}

impl Drop for Record {
    fn drop(&mut self) {
        if let Some(effect) = self.effect.take() {
            let duration_us = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX);
            let _ = self
                .effects
                .send(effect.with("duration_us", duration_us).into());
        }
    }
}

async fn relay_one(
    mut inside: TcpStream,
    upstream: SocketAddr,
    timeout: Duration,
    effects: EffectSender,
) {
    // The grant held whatever the host side does: the decision is ours.
    let target = || {
        Effect::new("connect")
            .with("dest", upstream.to_string())
            .with("via", "port-forward")
            .with("decision", "allowed")
    };
    let mut record = Record {
        effects,
        effect: Some(target().with("ended", "run-ended")),
        started: Instant::now(),
    };
    let connected = tokio::time::timeout(timeout, TcpStream::connect(upstream)).await;
    let effect = match connected {
        Ok(Ok(mut outside)) => {
            let copied = tokio::io::copy_bidirectional(&mut inside, &mut outside).await;
            let (up, down) = copied.unwrap_or((0, 0));
            target().with("bytes_up", up).with("bytes_down", down)
        }
        Ok(Err(e)) => target().with("error", e.to_string()),
        Err(_) => target().with("error", format!("connect timed out after {timeout:?}")),
    };
    record.effect = Some(effect);
}
