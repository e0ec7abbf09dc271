//! `--port N`: the sandbox has a private network namespace, so its loopback
//! is its own. A granted port N is a gateway: the supervisor listens on
//! 127.0.0.1:N and [::1]:N *inside* the sandbox's namespace and relays each
//! connection to the same address and port of the host. Every relayed connection is a `connect`
//! effect in the log.

use std::net::SocketAddr;
use std::time::Instant;

use tokio::net::{TcpListener, TcpStream};

use crate::events::{Effect, EffectSender};

/// Relays connections accepted on `listener` (inside the sandbox) to
/// `upstream` on the host, until the task is dropped.
pub async fn relay(listener: TcpListener, upstream: SocketAddr, effects: EffectSender) {
    loop {
        let Ok((mut inside, _)) = listener.accept().await else {
            continue;
        };
        let effects = effects.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let target = |decision: &str| {
                Effect::new("connect")
                    .with("dest", upstream.to_string())
                    .with("via", "port-forward")
                    .with("decision", decision)
            };
            match TcpStream::connect(upstream).await {
                Ok(mut outside) => {
                    let copied = tokio::io::copy_bidirectional(&mut inside, &mut outside).await;
                    let (up, down) = copied.unwrap_or((0, 0));
                    let _ = effects.send(
                        target("allowed")
                            .with("bytes_up", up)
                            .with("bytes_down", down)
                            .with("duration_us", started.elapsed().as_micros() as u64)
                            .into(),
                    );
                }
                Err(e) => {
                    // The grant held; the host side had no listener.
                    let _ = effects.send(target("allowed").with("error", e.to_string()).into());
                }
            }
        });
    }
}
