//! The explicit proxy: CONNECT tunnels and absolute-form plain HTTP, one
//! hyper connection per accepted socket.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::http::{
    Counted, Direction, Pending, ProxyBody, Spawner, Task, empty, plain, record_refusal,
    serve_http1, strip_hop_by_hop, strip_target_overrides, truncate,
};
use super::sniff::split_host_port;
use super::upstream::{connect_checked, relay};
use super::{Decision, ProxyConfig, ProxyError, allow, normalize_host};
use crate::effectlog::Record;
use crate::events::EffectSender;

/// Where an allowed request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// Normalized (lower case, punycode) host.
    pub host: String,
    pub port: u16,
    /// The allow-list entry that matched.
    pub rule: String,
}

pub(super) fn check_host(
    host: &str,
    port: u16,
    ports: &[u16],
    config: &ProxyConfig,
) -> Result<Target, &'static str> {
    match allow(host, &config.allow_domains) {
        Decision::Deny(denial) => Err(denial.reason()),
        Decision::Allow { host, rule } if ports.contains(&port) => Ok(Target { host, port, rule }),
        Decision::Allow { .. } => Err("port not allowed"),
    }
}

/// Decides a CONNECT request from its authority (`host:port`).
pub(crate) fn decide_connect(
    authority: &str,
    config: &ProxyConfig,
) -> Result<Target, &'static str> {
    match split_host_port(authority) {
        Some((host, Some(port))) => check_host(host, port, &config.connect_ports, config),
        _ => Err("CONNECT target must be host:port"),
    }
}

/// Decides an absolute-form plain HTTP request: `http://` only, the domain
/// and port allowed, and the Host header (if any) naming the same host and
/// port as the target, so that the upstream cannot be told a different
/// virtual host from the one we checked.
pub(crate) fn decide_absolute(
    uri: &Uri,
    host_headers: &[&HeaderValue],
    config: &ProxyConfig,
) -> Result<Target, &'static str> {
    match uri.scheme_str() {
        None => return Err("this is a proxy: send http://host/path requests or CONNECT"),
        Some(s) if s.eq_ignore_ascii_case("http") => {}
        Some(s) if s.eq_ignore_ascii_case("https") => return Err("use CONNECT for https"),
        Some(_) => return Err("only http:// requests are proxied"),
    }
    let Some(authority) = uri.authority() else {
        return Err("request target has no host");
    };
    let port = authority.port_u16().unwrap_or(80);
    let target = check_host(authority.host(), port, &config.http_ports, config)?;
    match host_headers {
        [] => {}
        [value] => {
            let same =
                value
                    .to_str()
                    .ok()
                    .and_then(split_host_port)
                    .is_some_and(|(host, header_port)| {
                        normalize_host(host).ok().as_deref() == Some(target.host.as_str())
                            && header_port.unwrap_or(80) == port
                    });
            if !same {
                return Err("Host header does not match the request target");
            }
        }
        _ => return Err("more than one Host header"),
    }
    Ok(target)
}

/// Where a refused plain-HTTP request was going, for its record: the
/// target's authority, or the Host header's for an origin-form request
/// (which names its destination nowhere else), and the Host header's text
/// when it names another authority than the target, since a shared front
/// routes by it (adversarial round 11: both were missing, so the record
/// of a refusal did not say where the agent tried to go).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RefusedDestination {
    pub host: String,
    pub port: u16,
    pub host_header: Option<String>,
}

impl RefusedDestination {
    pub(crate) fn of(uri: &Uri, host_headers: &[&HeaderValue]) -> Self {
        let texts: Vec<String> = host_headers
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_string())
            .collect();
        let joined = (!texts.is_empty()).then(|| truncate(&texts.join(", "), 253));
        match uri.authority() {
            Some(authority) => {
                let same = texts.len() == 1 && texts[0].eq_ignore_ascii_case(authority.as_str());
                Self {
                    host: authority.host().to_string(),
                    port: authority.port_u16().unwrap_or(80),
                    host_header: joined.filter(|_| !same),
                }
            }
            None => {
                let first = texts.first().map(String::as_str).unwrap_or_default();
                let (host, port) = split_host_port(first).unwrap_or((first, None));
                Self {
                    host: host.to_string(),
                    port: port.unwrap_or(80),
                    host_header: joined.filter(|_| texts.len() > 1),
                }
            }
        }
    }
}

/// Serves one agent connection.
pub(super) async fn serve_connection(
    stream: TcpStream,
    config: Arc<ProxyConfig>,
    events: EffectSender,
) {
    let refused = events.clone();
    serve_http1(
        stream,
        move |request, spawn| {
            let (config, events) = (config.clone(), events.clone());
            async move { handle(request, &config, &events, &spawn).await }
        },
        move |status, reason| {
            record_refusal(&refused, base_effect("", 0, "unknown"), status, reason);
        },
    )
    .await
}

fn base_effect(host: &str, port: u16, method: &str) -> Record {
    Record::new("proxy")
        .with("host", truncate(host, 253))
        .with("port", port)
        .with("method", truncate(method, 32))
        .with("mode", "explicit")
}

/// Sends a denial effect and builds the 403.
pub(super) fn deny(
    events: &EffectSender,
    effect: Record,
    start: Instant,
    reason: &'static str,
) -> Response<ProxyBody> {
    let pending = Pending::new(
        events.clone(),
        effect.with("decision", "denied").with("reason", reason),
        start,
    );
    pending.status.store(403, Ordering::Relaxed);
    drop(pending);
    plain(
        StatusCode::FORBIDDEN,
        &format!("tartaros proxy: denied: {reason}"),
    )
}

/// Sends the effect of an allowed request whose upstream failed, and
/// builds the answer (403 for an internal address, else 502).
fn upstream_failed(
    events: &EffectSender,
    effect: Record,
    start: Instant,
    error: &ProxyError,
) -> Response<ProxyBody> {
    tracing::debug!("proxy upstream: {error}");
    if error.is_denial() {
        return deny(events, effect, start, error.reason());
    }
    let pending = Pending::new(
        events.clone(),
        effect
            .with("decision", "allowed")
            .with("reason", error.reason()),
        start,
    );
    pending.status.store(502, Ordering::Relaxed);
    drop(pending);
    plain(
        StatusCode::BAD_GATEWAY,
        &format!("tartaros proxy: {}", error.reason()),
    )
}

async fn handle(
    request: Request<Incoming>,
    config: &ProxyConfig,
    events: &EffectSender,
    spawn: &Spawner,
) -> Response<ProxyBody> {
    let start = Instant::now();
    if request.method() == Method::CONNECT {
        connect(request, config, events, spawn, start).await
    } else {
        forward(request, config, events, spawn, start, &base_effect).await
    }
}

async fn connect(
    request: Request<Incoming>,
    config: &ProxyConfig,
    events: &EffectSender,
    spawn: &Spawner,
    start: Instant,
) -> Response<ProxyBody> {
    let authority = request
        .uri()
        .authority()
        .map(|a| a.as_str())
        .unwrap_or_default();
    let target = match decide_connect(authority, config) {
        Ok(target) => target,
        Err(reason) => {
            let (host, port) = split_host_port(authority).unwrap_or((authority, None));
            return deny(
                events,
                base_effect(host, port.unwrap_or(0), "CONNECT"),
                start,
                reason,
            );
        }
    };
    let effect = base_effect(&target.host, target.port, "CONNECT");
    let upstream = connect_checked(
        config.resolver.as_ref(),
        &target.host,
        target.port,
        config.allow_internal,
        config.connect_timeout,
    )
    .await;
    let mut upstream = match upstream {
        Ok(upstream) => upstream,
        Err(error) => return upstream_failed(events, effect, start, &error),
    };
    let reason = format!("matched {}", target.rule);
    let pending = Pending::new(
        events.clone(),
        effect.with("decision", "allowed").with("reason", reason),
        start,
    );
    pending.status.store(200, Ordering::Relaxed);
    let tunnel = async move {
        let upgraded = match hyper::upgrade::on(request).await {
            Ok(upgraded) => upgraded,
            Err(e) => {
                tracing::debug!("proxy: CONNECT upgrade failed: {e}");
                return;
            }
        };
        // Take the raw socket back from hyper so the relay runs on plain
        // TcpStreams with large buffers, not through hyper's IO layers.
        match upgraded.downcast::<TokioIo<TcpStream>>() {
            Ok(parts) => {
                let mut client = parts.io.into_inner();
                if !parts.read_buf.is_empty() {
                    use tokio::io::AsyncWriteExt;
                    if upstream.write_all(&parts.read_buf).await.is_err() {
                        return;
                    }
                    pending
                        .up
                        .fetch_add(parts.read_buf.len() as u64, Ordering::Relaxed);
                }
                relay(&mut client, &mut upstream, &pending.up, &pending.down).await;
            }
            Err(upgraded) => {
                // Not reached with our own listener; kept correct anyway.
                let mut client = TokioIo::new(upgraded);
                if let Ok((up, down)) =
                    tokio::io::copy_bidirectional(&mut client, &mut upstream).await
                {
                    pending.up.fetch_add(up, Ordering::Relaxed);
                    pending.down.fetch_add(down, Ordering::Relaxed);
                }
            }
        }
    };
    if spawn.send(Box::pin(tunnel)).is_err() {
        return plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "tartaros proxy: shutting down",
        );
    }
    empty(StatusCode::OK)
}

/// The record of a request to `host`, `port` with `method`, before its
/// decision: the explicit proxy's or the transparent one's.
pub(super) type BaseEffect<'a> = &'a (dyn Fn(&str, u16, &str) -> Record + Send + Sync);

/// Forwards one absolute-form plain HTTP request on a connection of its
/// own to the upstream, once its target and Host header are allowed.
pub(super) async fn forward(
    request: Request<Incoming>,
    config: &ProxyConfig,
    events: &EffectSender,
    spawn: &Spawner,
    start: Instant,
    base_effect: BaseEffect<'_>,
) -> Response<ProxyBody> {
    let method = request.method().as_str().to_string();
    let host_headers: Vec<&HeaderValue> = request.headers().get_all(header::HOST).iter().collect();
    let target = match decide_absolute(request.uri(), &host_headers, config) {
        Ok(target) => target,
        Err(reason) => {
            let named = RefusedDestination::of(request.uri(), &host_headers);
            let mut effect = base_effect(&named.host, named.port, &method);
            if let Some(header) = named.host_header {
                effect = effect.with("host_header", header);
            }
            return deny(events, effect, start, reason);
        }
    };
    let effect = base_effect(&target.host, target.port, &method);
    let upstream = connect_checked(
        config.resolver.as_ref(),
        &target.host,
        target.port,
        config.allow_internal,
        config.connect_timeout,
    )
    .await;
    let upstream = match upstream {
        Ok(upstream) => upstream,
        Err(error) => return upstream_failed(events, effect, start, &error),
    };
    let handshake =
        hyper::client::conn::http1::handshake::<_, ProxyBody>(TokioIo::new(upstream)).await;
    let (mut sender, connection) = match handshake {
        Ok(pair) => pair,
        Err(source) => {
            let error = ProxyError::Http {
                host: target.host.clone(),
                source,
            };
            return upstream_failed(events, effect, start, &error);
        }
    };
    let driver: Task = Box::pin(async move {
        let _ = connection.await;
    });
    if spawn.send(driver).is_err() {
        return plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "tartaros proxy: shutting down",
        );
    }
    let reason = format!("matched {}", target.rule);
    let pending = Arc::new(Pending::new(
        events.clone(),
        effect.with("decision", "allowed").with("reason", reason),
        start,
    ));
    let (mut parts, body) = request.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    // The host judged is the only one the upstream may be told of.
    strip_target_overrides(&mut parts.headers);
    let host_value = if target.port == 80 {
        target.host.clone()
    } else {
        format!("{}:{}", target.host, target.port)
    };
    if let Ok(value) = HeaderValue::from_str(&host_value) {
        parts.headers.insert(header::HOST, value);
    }
    parts.uri = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .unwrap_or("/")
        .parse()
        .unwrap_or_else(|_| Uri::from_static("/"));
    parts.version = Version::HTTP_11;
    let body = Counted::new(body, pending.clone(), Direction::Up).boxed();
    let response = match sender.send_request(Request::from_parts(parts, body)).await {
        Ok(response) => response,
        Err(source) => {
            let error = ProxyError::Http {
                host: target.host,
                source,
            };
            tracing::debug!("proxy upstream: {error}");
            pending.status.store(502, Ordering::Relaxed);
            let _ = pending.failure.set(error.reason());
            drop(pending);
            return plain(
                StatusCode::BAD_GATEWAY,
                &format!("tartaros proxy: {}", error.reason()),
            );
        }
    };
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    pending
        .status
        .store(parts.status.as_u16(), Ordering::Relaxed);
    Response::from_parts(parts, Counted::new(body, pending, Direction::Down).boxed())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::StaticResolver;

    fn config() -> ProxyConfig {
        let mut config = ProxyConfig::new(
            vec!["example.com".into(), "*.pypi.org".into()],
            Arc::new(StaticResolver::new()),
        );
        config.connect_ports = vec![443, 8443];
        config
    }

    fn target(host: &str, port: u16, rule: &str) -> Result<Target, &'static str> {
        Ok(Target {
            host: host.into(),
            port,
            rule: rule.into(),
        })
    }

    #[test]
    fn connect_decisions() {
        let config = config();
        assert_eq!(
            decide_connect("example.com:443", &config),
            target("example.com", 443, "example.com")
        );
        assert_eq!(
            decide_connect("Files.PyPI.org.:8443", &config),
            target("files.pypi.org", 8443, "*.pypi.org")
        );
        assert_eq!(
            decide_connect("example.com:22", &config),
            Err("port not allowed")
        );
        assert_eq!(
            decide_connect("example.com", &config),
            Err("CONNECT target must be host:port")
        );
        assert_eq!(
            decide_connect("evil.com:443", &config),
            Err("domain not in the allow list")
        );
        for literal in ["127.0.0.1:443", "[::1]:443", "2130706433:443", "0x7f.1:443"] {
            assert_eq!(
                decide_connect(literal, &config),
                Err("IP literals are refused; use a domain name"),
                "{literal}"
            );
        }
    }

    #[test]
    fn a_refused_destination_names_the_host_the_agent_named() {
        let uri = |s: &str| s.parse::<Uri>().unwrap();
        let host = HeaderValue::from_static;
        let named = |h: &str, port, header: Option<&str>| RefusedDestination {
            host: h.into(),
            port,
            host_header: header.map(str::to_string),
        };
        // Origin form: the Host header is the only destination.
        assert_eq!(
            RefusedDestination::of(&uri("/x"), &[&host("evil.test:8080")]),
            named("evil.test", 8080, None)
        );
        assert_eq!(
            RefusedDestination::of(&uri("/x"), &[&host("a.test"), &host("b.test")]),
            named("a.test", 80, Some("a.test, b.test"))
        );
        assert_eq!(RefusedDestination::of(&uri("/x"), &[]), named("", 80, None));
        // Absolute form: the target, and a Host header naming another.
        assert_eq!(
            RefusedDestination::of(&uri("http://example.com/x"), &[&host("evil.test")]),
            named("example.com", 80, Some("evil.test"))
        );
        assert_eq!(
            RefusedDestination::of(&uri("http://Example.com:81/x"), &[&host("example.COM:81")]),
            named("Example.com", 81, None)
        );
        assert_eq!(
            RefusedDestination::of(&uri("http://evil.test/x"), &[]),
            named("evil.test", 80, None)
        );
    }

    #[test]
    fn absolute_form_decisions() {
        let config = config();
        let uri = |s: &str| s.parse::<Uri>().unwrap();
        let host = HeaderValue::from_static;
        let ok = target("example.com", 80, "example.com");
        assert_eq!(
            decide_absolute(&uri("http://example.com/x"), &[], &config),
            ok
        );
        assert_eq!(
            decide_absolute(
                &uri("http://example.com/x"),
                &[&host("EXAMPLE.com")],
                &config
            ),
            ok
        );
        assert_eq!(
            decide_absolute(
                &uri("http://example.com:80/x"),
                &[&host("example.com:80")],
                &config
            ),
            ok
        );
        assert_eq!(
            decide_absolute(&uri("http://example.com/x"), &[&host("evil.com")], &config),
            Err("Host header does not match the request target")
        );
        assert_eq!(
            decide_absolute(
                &uri("http://example.com/x"),
                &[&host("example.com:8080")],
                &config
            ),
            Err("Host header does not match the request target")
        );
        assert_eq!(
            decide_absolute(
                &uri("http://example.com/x"),
                &[&host("example.com"), &host("example.com")],
                &config
            ),
            Err("more than one Host header")
        );
        assert_eq!(
            decide_absolute(&uri("http://example.com:8080/x"), &[], &config),
            Err("port not allowed")
        );
        assert_eq!(
            decide_absolute(&uri("https://example.com/x"), &[], &config),
            Err("use CONNECT for https")
        );
        assert!(decide_absolute(&uri("/x"), &[&host("example.com")], &config).is_err());
        assert!(decide_absolute(&uri("ftp://example.com/x"), &[], &config).is_err());
        assert_eq!(
            decide_absolute(&uri("http://169.254.169.254/latest"), &[], &config),
            Err("IP literals are refused; use a domain name")
        );
        assert_eq!(
            decide_absolute(&uri("http://evil.com/"), &[&host("example.com")], &config),
            Err("domain not in the allow list")
        );
    }
}
