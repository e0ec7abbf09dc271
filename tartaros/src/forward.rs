//! `--port N`: the sandbox has a private network namespace, so its loopback
//! is its own. A granted port N is a gateway: the supervisor listens on
//! 127.0.0.1:N and [::1]:N *inside* the sandbox's namespace and relays each
//! connection to the same address and port of the host. Every relayed connection is a `connect`
//! effect in the log.

use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use crate::events::{Effect, EffectSender};

/// Relays connections accepted on `listener` (inside the sandbox) to
/// `upstream` on the host, until the task is dropped.
/// With `owner`, each record names (`pid`) the process that connected.
pub async fn relay(
    listener: TcpListener,
    upstream: SocketAddr,
    effects: EffectSender,
    owner: Option<crate::events::ConnectionOwner>,
) {
    loop {
        let Ok((inside, peer)) = listener.accept().await else {
            continue;
        };
        let effects = crate::events::attributed(&effects, owner.as_ref(), Some(peer));
        tokio::spawn(async move {
            let started = Instant::now();
            let target = |decision: &str| {
                Effect::new("connect")
                    .with("dest", upstream.to_string())
                    .with("via", "port-forward")
                    .with("decision", decision)
            };
            match TcpStream::connect(upstream).await {
                Ok(outside) => {
                    // Counted as written, so that a connection that ends
                    // with an error (a reset, a peer gone) still reports
                    // every byte that reached the other side.
                    let mut inside = Counted::new(inside);
                    let mut outside = Counted::new(outside);
                    let copied = tokio::io::copy_bidirectional(&mut inside, &mut outside).await;
                    let mut effect = target("allowed")
                        .with("bytes_up", outside.written)
                        .with("bytes_down", inside.written)
                        .with("duration_us", started.elapsed().as_micros() as u64);
                    if let Err(e) = copied {
                        effect = effect.with("error", e.to_string());
                    }
                    let _ = effects.send(effect.into());
                }
                Err(e) => {
                    // The grant held; the host side had no listener.
                    let _ = effects.send(target("allowed").with("error", e.to_string()).into());
                }
            }
        });
    }
}

/// A stream that counts the bytes written to it.
struct Counted<S> {
    inner: S,
    written: u64,
}

impl<S> Counted<S> {
    fn new(inner: S) -> Self {
        Self { inner, written: 0 }
    }
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
            self.written += *n as u64;
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
