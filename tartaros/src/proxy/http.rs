//! HTTP plumbing shared by the proxy and the broker: response bodies that
//! count bytes, the pending effect that is written once a request is done,
//! hop-by-hop header stripping and short plain-text answers.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::effectlog::Record;
use crate::events::EffectSender;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body type of every response the proxy and the broker produce.
pub(crate) type ProxyBody = BoxBody<Bytes, BoxError>;

/// How long a client may take to send a request head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// The most of a request head a connection buffers (hyper's default is
/// about 400 KiB). A head is a few KiB; the agent holding every connection
/// slot with a head it never ends made root keep 400 KiB a connection,
/// 125 MiB for the proxy's 512, for as long as the header timeout.
const MAX_HEAD_BUFFER: usize = 64 * 1024;

/// Work that must outlive a request handler (a tunnel, the driver of an
/// upstream HTTP connection) but not the agent's connection.
pub(crate) type Task = Pin<Box<dyn Future<Output = ()> + Send>>;
pub(crate) type Spawner = mpsc::UnboundedSender<Task>;

/// Serves one HTTP/1 connection with `handler`. Tasks the handler hands to
/// its [`Spawner`] run in a [`JoinSet`] owned by this future, so aborting
/// the server ends them too. A request hyper refuses itself, before any
/// handler sees it (a malformed head, one past [`MAX_HEAD_BUFFER`]), is
/// answered by hyper and passed to `refused` with its status and a fixed
/// reason, to be recorded: the handler's records are the others.
pub(crate) async fn serve_http1<S, H, Fut, R>(stream: S, handler: H, refused: R)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Incoming>, Spawner) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<ProxyBody>> + Send + 'static,
    R: FnOnce(u16, &'static str),
{
    let (spawn, mut spawned) = mpsc::unbounded_channel::<Task>();
    let service = service_fn(move |request| {
        let fut = handler(request, spawn.clone());
        async move { Ok::<_, Infallible>(fut.await) }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_HEAD_BUFFER)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(connection);
    let mut tasks = JoinSet::new();
    let mut connection_done = false;
    let mut refused = Some(refused);
    loop {
        tokio::select! {
            result = &mut connection, if !connection_done => {
                connection_done = true;
                let refusal = result.as_ref().err().and_then(parse_refusal);
                if let (Some((status, reason)), Some(refused)) = (refusal, refused.take()) {
                    refused(status, reason);
                }
                // The finished connection still holds the service and so a
                // sender: without closing the channel `recv` would wait
                // forever and this future (and its slot in the accept
                // loop) would never be released. Queued tasks still arrive.
                spawned.close();
            }
            Some(task) = spawned.recv() => { tasks.spawn(task); }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            else => break,
        }
    }
}

/// The status hyper answered and why, when it refused a request itself:
/// the agent got an answer and nothing was forwarded, a refusal like the
/// handlers' 403s (adversarial round 10: these left no record).
fn parse_refusal(error: &hyper::Error) -> Option<(u16, &'static str)> {
    if error.is_parse_too_large() {
        Some((431, "request head too large"))
    } else if error.is_parse() {
        Some((400, "malformed request"))
    } else {
        None
    }
}

/// Records `effect` as a request refused by hyper (`serve_http1`).
pub(crate) fn record_refusal(events: &EffectSender, effect: Record, status: u16, reason: &str) {
    let pending = Pending::new(
        events.clone(),
        effect.with("decision", "denied").with("reason", reason),
        Instant::now(),
    );
    pending.status.store(status, Ordering::Relaxed);
}

/// A short `text/plain` answer. `text` must be fixed text chosen by us,
/// never attacker input and never a secret.
pub(crate) fn plain(status: StatusCode, text: &str) -> Response<ProxyBody> {
    let body = Full::new(Bytes::from(format!("{text}\n")))
        .map_err(|never| match never {})
        .boxed();
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

pub(crate) fn empty(status: StatusCode) -> Response<ProxyBody> {
    let mut response = Response::new(
        Full::new(Bytes::new())
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response
}

/// Headers that describe one hop, not the message (RFC 9110 7.6.1), plus
/// the deprecated `Proxy-Connection`.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Removes hop-by-hop headers, every header that `Connection` names, and
/// every `Proxy-*` header (credentials for this proxy are not for the
/// upstream).
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(*name);
    }
    let proxy: Vec<HeaderName> = headers
        .keys()
        .filter(|name| name.as_str().starts_with("proxy-"))
        .cloned()
        .collect();
    for name in proxy {
        headers.remove(name);
    }
}

/// Headers with which frameworks and fronts replace the request's path or
/// virtual host (Symfony, Zend and IIS URL Rewrite route by
/// `X-Original-URL`; trusting fronts pick the host from `X-Forwarded-Host`
/// or `Forwarded`): the upstream would serve another request than the one
/// the proxy judged (its host) or the broker checked (the capability's
/// prefix), adversarial round 8. Both strip them from every request, as
/// they strip a second Host header or the method overrides.
pub(crate) const TARGET_OVERRIDE_HEADERS: &[&str] = &[
    "x-original-url",
    "x-rewrite-url",
    "x-override-url",
    "x-forwarded-host",
    "x-forwarded-server",
    "x-forwarded-prefix",
    "x-host",
    "x-http-host-override",
    "forwarded",
];

/// Removes every [`TARGET_OVERRIDE_HEADERS`] header.
pub(crate) fn strip_target_overrides(headers: &mut HeaderMap) {
    for name in TARGET_OVERRIDE_HEADERS {
        headers.remove(*name);
    }
}

/// Cuts a string to at most `max` bytes on a character boundary, for
/// attacker-chosen values that go into the effect log.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// An effect that is sent once the request it describes is over (when the
/// last holder drops it), with the bytes counted each way and the duration.
pub(crate) struct Pending {
    sender: EffectSender,
    effect: Option<Record>,
    start: Instant,
    pub(crate) up: AtomicU64,
    pub(crate) down: AtomicU64,
    /// The HTTP status returned to the agent; 0 while unknown (tunnels).
    pub(crate) status: AtomicU16,
    /// Replaces the effect's reason when the request failed after it was
    /// allowed (fixed text only).
    pub(crate) failure: OnceLock<&'static str>,
}

impl Pending {
    pub(crate) fn new(sender: EffectSender, effect: Record, start: Instant) -> Self {
        Self {
            sender,
            effect: Some(effect),
            start,
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            status: AtomicU16::new(0),
            failure: OnceLock::new(),
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(mut effect) = self.effect.take() else {
            return;
        };
        let up = self.up.load(Ordering::Relaxed);
        let down = self.down.load(Ordering::Relaxed);
        let duration_us = u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX);
        effect.stamp_now();
        effect.target.insert("bytes_up", up);
        effect.target.insert("bytes_down", down);
        if effect.kind == "broker" {
            effect.target.insert("bytes", down);
        }
        effect.target.insert("duration_us", duration_us);
        if let Some(reason) = self.failure.get() {
            effect.target.insert("reason", *reason);
        }
        let status = self.status.load(Ordering::Relaxed);
        if status != 0 {
            effect.target.insert("status", status);
        }
        // The receiver is gone only when the supervisor is shutting down.
        let _ = self.sender.send(effect.into());
    }
}

/// Which way a [`Counted`] body flows.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Direction {
    Up,
    Down,
}

/// A body that adds the bytes it passes to a [`Pending`] effect and keeps
/// that effect alive until the body is done or dropped.
pub(crate) struct Counted<B> {
    inner: B,
    pending: Arc<Pending>,
    direction: Direction,
}

impl<B> Counted<B> {
    pub(crate) fn new(inner: B, pending: Arc<Pending>, direction: Direction) -> Self {
        Self {
            inner,
            pending,
            direction,
        }
    }
}

impl<B> Body for Counted<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let counter = match this.direction {
                        Direction::Up => &this.pending.up,
                        Direction::Down => &this.pending.down,
                    };
                    counter.fetch_add(data.len() as u64, Ordering::Relaxed);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_stripped() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "keep-alive, X-Secret-Hop"),
            ("keep-alive", "timeout=5"),
            ("x-secret-hop", "1"),
            ("proxy-authorization", "Basic abc"),
            ("proxy-connection", "keep-alive"),
            ("proxy-anything", "x"),
            ("transfer-encoding", "chunked"),
            ("te", "trailers"),
            ("upgrade", "websocket"),
            ("content-type", "text/html"),
            ("content-length", "3"),
            ("authorization", "Bearer upstream-credential"),
        ] {
            headers.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        strip_hop_by_hop(&mut headers);
        let mut left: Vec<&str> = headers.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(left, ["authorization", "content-length", "content-type"]);
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("abc", 5), "abc");
        assert_eq!(truncate("abcdef", 3), "abc...");
        assert_eq!(truncate("ééé", 3), "é...");
    }
}
