//! Intercepted plain HTTP, request by request. The first request's Host
//! header decided the connection once, and the bytes after it were relayed
//! as they came: a second request on the kept-alive connection, naming
//! another host, reached the allowed host's server, which behind a shared
//! front (a CDN, a virtual-hosting server) routes it to the other site
//! (adversarial round 7). Now the connection is served by the HTTP parser,
//! like the explicit proxy's: every request is judged by its own Host
//! header and forwarded on an upstream connection of its own.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::http::uri::PathAndQuery;
use hyper::{Method, Request, Uri};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::ProxyConfig;
use super::explicit::{deny, forward};
use super::http::{record_refusal, serve_http1, truncate};
use super::sniff::split_host_port;
use crate::effectlog::Record;
use crate::events::EffectSender;

/// Serves the intercepted connection `stream` whose first bytes, already
/// read to sniff it, are `prefix`; `original` is where it was going.
pub(super) async fn serve(
    stream: TcpStream,
    prefix: Vec<u8>,
    original: SocketAddr,
    config: Arc<ProxyConfig>,
    events: EffectSender,
) {
    let stream = Rewind {
        prefix,
        read: 0,
        inner: stream,
    };
    let dst = original.to_string();
    let refused = (events.clone(), dst.clone());
    let on_refusal = move |status, reason| {
        let (events, dst) = refused;
        let effect = Record::new("proxy")
            .with("mode", "transparent")
            .with("original_dst", dst)
            .with("host", "")
            .with("port", original.port())
            .with("method", "HTTP");
        record_refusal(&events, effect, status, reason);
    };
    serve_http1(
        stream,
        move |request, spawn| {
            let (config, events, dst) = (config.clone(), events.clone(), dst.clone());
            async move {
                let start = Instant::now();
                // The record keeps the transparent shape: the method is the
                // protocol, as for an intercepted TLS connection.
                let base = move |host: &str, port: u16, _method: &str| {
                    Record::new("proxy")
                        .with("mode", "transparent")
                        .with("original_dst", dst.clone())
                        .with("host", truncate(host, 253))
                        .with("port", port)
                        .with("method", "HTTP")
                };
                match absolute(request, original.port()) {
                    Ok(request) => forward(request, &config, &events, &spawn, start, &base).await,
                    Err((host, reason)) => {
                        deny(&events, base(&host, original.port(), ""), start, reason)
                    }
                }
            }
        },
        on_refusal,
    )
    .await
}

/// `request` in absolute form for `http://host:port`, `host` from its one
/// Host header (or, without one, its absolute-form target's authority) and
/// `port` the original destination's (a Host header that names another
/// port is refused, as for the first request); the Host header is
/// rewritten to match. Every request on the connection is judged as the
/// first one is by the sniffer (`sniff::http_host`): until adversarial
/// round 24a a later request was judged by its Host header only, so an
/// absolute-form target naming another host, port or scheme was dropped
/// and the request sent to the Host's site, and a refused one (CONNECT, an
/// absolute form without Host) was recorded with no host at all.
/// Refused: every host the request named (for the record) and why.
fn absolute(
    mut request: Request<Incoming>,
    port: u16,
) -> Result<Request<Incoming>, (String, &'static str)> {
    // The text of each Host header even when it is not visible ASCII (the
    // record must still say where the agent tried to go; `log show`
    // escapes it).
    let headers: Vec<String> = request
        .headers()
        .get_all(header::HOST)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_string())
        .collect();
    // The authority the target names: an absolute form's, or CONNECT's.
    let target = request.uri().authority().map(|a| a.as_str().to_string());
    let mut named = target.iter().chain(&headers).cloned().collect::<Vec<_>>();
    // A Host that repeats the target is named once.
    named.dedup_by(|a, b| a.eq_ignore_ascii_case(b));
    let refuse = |why| Err((named.join(", "), why));
    if request.method() == Method::CONNECT {
        return refuse("CONNECT on an intercepted connection");
    }
    let text = match (headers.as_slice(), &target) {
        ([], None) => return refuse("HTTP request without a Host header"),
        ([], Some(target)) => target.clone(),
        ([header], Some(target)) if !header.eq_ignore_ascii_case(target) => {
            return refuse("Host header does not match the request target");
        }
        ([header], _) => header.clone(),
        _ => return refuse("more than one Host header"),
    };
    let host = match split_host_port(&text) {
        None => return refuse("Host header is not host[:port]"),
        Some((_, Some(p))) if p != port => {
            return refuse("Host header port does not match the destination port");
        }
        Some((host, _)) => host.to_string(),
    };
    let authority = if port == 80 {
        host
    } else {
        format!("{host}:{port}")
    };
    // Built from parts, never by pasting text: `OPTIONS *` pasted after
    // the authority made `http://host:port*`, a request to port 80
    // (adversarial round 13). Only an origin-form path (or an absolute
    // form's, whose authority the Host header already had to match) is
    // forwarded; the asterisk form asks the proxy's next hop about
    // itself, which is not ours to forward.
    let path = match request.uri().path_and_query() {
        Some(pq) if pq.as_str().starts_with('/') => pq.clone(),
        Some(_) => return refuse("asterisk-form request target (OPTIONS *) is not forwarded"),
        None if request.uri().authority().is_some() => PathAndQuery::from_static("/"),
        None => return refuse("asterisk-form request target (OPTIONS *) is not forwarded"),
    };
    let uri = Uri::builder()
        .scheme("http")
        .authority(authority.as_str())
        .path_and_query(path)
        .build();
    let (Ok(uri), Ok(value)) = (uri, HeaderValue::from_str(&authority)) else {
        return refuse("Host header is not host[:port]");
    };
    *request.uri_mut() = uri;
    request.headers_mut().insert(header::HOST, value);
    Ok(request)
}

/// A stream whose first bytes are `prefix` (read before, to sniff it).
struct Rewind {
    prefix: Vec<u8>,
    read: usize,
    inner: TcpStream,
}

impl AsyncRead for Rewind {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let left = &this.prefix[this.read..];
        if !left.is_empty() {
            let n = left.len().min(buf.remaining());
            buf.put_slice(&left[..n]);
            this.read += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
