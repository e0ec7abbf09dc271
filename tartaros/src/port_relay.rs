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
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use crate::effectlog::Record;
use crate::events::EffectSender;

/// Bound on connecting to the host's service: a port that drops SYNs must
/// not pin a connection slot for the kernel's minutes-long retry.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Relayed connections at once; more wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 256;

/// Relays connections accepted on `listener` (inside the sandbox) to
/// `upstream` on the host, until the future is dropped or aborted (which
/// also ends the connections it relays). With `owner`, each record names
/// (`pid`) the sandbox process that connected.
pub async fn relay(
    listener: TcpListener,
    upstream: SocketAddr,
    effects: EffectSender,
    owner: Option<crate::events::ConnectionOwner>,
) {
    crate::proxy::accept_loop(listener, MAX_CONNECTIONS, move |inside| {
        let ends = crate::events::ConnectionEnds::of(&inside);
        let effects = crate::events::attributed(&effects, owner.as_ref(), ends);
        relay_one(inside, upstream, CONNECT_TIMEOUT, effects)
    })
    .await
}

/// The `connect` effect of one relayed connection, sent when it is over,
/// also when the run's end aborts it half-way (then with `"ended":
/// "run-ended"` and the bytes relayed until then).
struct Outcome {
    effects: EffectSender,
    /// The effect as known so far; replaced by the final one.
    effect: Option<Record>,
    started: Instant,
    /// Bytes written towards the host (up) and the sandbox (down) so far.
    up: Arc<AtomicU64>,
    down: Arc<AtomicU64>,
}

impl Drop for Outcome {
    fn drop(&mut self) {
        if let Some(mut effect) = self.effect.take() {
            let duration_us = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX);
            effect.stamp_now();
            let effect = effect
                .with("bytes_up", self.up.load(Ordering::Relaxed))
                .with("bytes_down", self.down.load(Ordering::Relaxed))
                .with("duration_us", duration_us);
            let _ = self.effects.send(effect.into());
        }
    }
}

/// A stream that counts what was written through it, so that a connection
/// that ends with an error (a reset, a peer gone) or is cut by the run's
/// end still reports every byte that reached the other side.
struct Counted<S> {
    inner: S,
    written: Arc<AtomicU64>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &polled {
            self.written.fetch_add(*n as u64, Ordering::Relaxed);
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

async fn relay_one(
    inside: TcpStream,
    upstream: SocketAddr,
    timeout: Duration,
    effects: EffectSender,
) {
    // The grant held whatever the host side does: the decision is ours.
    let target = || {
        Record::new("connect")
            .with("dest", upstream.to_string())
            .with("via", "port-forward")
            .with("decision", "allowed")
    };
    let (up, down) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut outcome = Outcome {
        effects,
        effect: Some(target().with("ended", "run-ended")),
        started: Instant::now(),
        up: up.clone(),
        down: down.clone(),
    };
    let connected = tokio::time::timeout(timeout, crate::caller::connect_tcp(upstream)).await;
    let effect = match connected {
        Ok(Ok(outside)) => {
            let mut inside = Counted {
                inner: inside,
                written: down,
            };
            let mut outside = Counted {
                inner: outside,
                written: up,
            };
            match tokio::io::copy_bidirectional(&mut inside, &mut outside).await {
                Ok(_) => target(),
                Err(e) => target().with("error", e.to_string()),
            }
        }
        Ok(Err(e)) => target().with("error", e.to_string()),
        Err(_) => target().with("error", format!("connect timed out after {timeout:?}")),
    };
    outcome.effect = Some(effect);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Entry;

    /// Aborting the relay (the run ended) ends a connection the host side
    /// holds open, and its record is still written.
    #[tokio::test]
    async fn aborting_the_relay_ends_held_connections_and_records_them() {
        let host = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = host.local_addr().unwrap();
        let inside = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gateway = inside.local_addr().unwrap();
        let (effects, mut records) = crate::events::channel();
        let relay = tokio::spawn(relay(inside, upstream, effects, None));
        let _agent = TcpStream::connect(gateway).await.unwrap();
        // The host service accepts and then never reads, writes or closes.
        let (_held, _) = host.accept().await.unwrap();
        relay.abort();
        let entry = tokio::time::timeout(Duration::from_secs(2), records.recv())
            .await
            .expect("a record within 2 s")
            .expect("the record");
        let Entry::Record(effect) = entry else {
            panic!("expected one record, got {entry:?}");
        };
        assert_eq!(effect.kind, "connect");
        assert_eq!(effect.target.get("ended"), Some(&"run-ended".into()));
        assert_eq!(
            effect.target.get("dest"),
            Some(&upstream.to_string().into())
        );
        assert_eq!(effect.target.get("via"), Some(&"port-forward".into()));
        // Every sender is gone with the relay: the log's drain can finish.
        let closed = tokio::time::timeout(Duration::from_secs(2), records.recv()).await;
        assert!(matches!(closed, Ok(None)), "a sender outlived the relay");
    }

    /// A host side that never answers the connect is given up on.
    #[tokio::test]
    async fn the_connect_to_the_host_is_bounded() {
        // A listener whose accept queue is full drops further SYNs, so a
        // connect to it hangs: the host service that never answers.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let full = socket.listen(0).unwrap();
        let upstream = full.local_addr().unwrap();
        let mut fillers = Vec::new();
        for _ in 0..2 {
            let filler = tokio::net::TcpSocket::new_v4().unwrap();
            let connecting = filler.connect(upstream);
            if let Ok(Ok(stream)) =
                tokio::time::timeout(Duration::from_millis(200), connecting).await
            {
                fillers.push(stream);
            }
        }
        let inside = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gateway = inside.local_addr().unwrap();
        let (effects, mut records) = crate::events::channel();
        let started = Instant::now();
        let accept = tokio::spawn(async move {
            let (stream, _) = inside.accept().await.unwrap();
            relay_one(stream, upstream, Duration::from_millis(300), effects).await;
        });
        let _agent = TcpStream::connect(gateway).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), accept)
            .await
            .expect("the relay gave up within 5 s")
            .unwrap();
        let Some(Entry::Record(effect)) = records.recv().await else {
            panic!("expected one record");
        };
        let error = effect.target.get("error").and_then(|e| e.as_str());
        let error = error.unwrap_or_default();
        assert!(error.contains("timed out"), "{effect:?}");
        assert!(started.elapsed() >= Duration::from_millis(300));
        drop(full);
    }
}
