//! Transparent interception: connections the cgroup `connect4/6` program
//! redirected to this listener. The host comes from the TLS SNI or the HTTP
//! Host header; the port from the original destination.
//!
//! The upstream is `host:original_port` resolved by the proxy, not the
//! original IP: the agent chose that IP, and trusting it would let any
//! address be reached by sending an allowed name as SNI. Resolving the name
//! ourselves makes the name we checked the place we connect to.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::explicit::check_host;
use super::http::{Pending, truncate};
use super::sniff::{MAX_SNIFF, Sniffed, sniff, split_host_port};
use super::upstream::{connect_checked, relay};
use super::{ProxyConfig, ProxyError};
use crate::effectlog::Record;
use crate::events::EffectSender;

/// Where an intercepted connection may go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransparentTarget {
    /// Normalized host name from the SNI or Host header.
    pub host: String,
    /// The port the agent originally connected to.
    pub port: u16,
    /// The allow-list entry that matched.
    pub rule: String,
}

/// Decides an intercepted connection from what its first bytes say and the
/// port it was going to. TLS must go to a CONNECT port, HTTP to an HTTP
/// port; no name means no decision, so it is refused.
pub fn decide_transparent(
    sniffed: &Sniffed,
    original_port: u16,
    config: &ProxyConfig,
) -> Result<TransparentTarget, &'static str> {
    let target = match sniffed {
        Sniffed::Incomplete => return Err("connection ended before naming a host"),
        Sniffed::Refused(why) => return Err(why),
        Sniffed::Tls { sni: None } => return Err("TLS ClientHello without SNI"),
        Sniffed::Tls { sni: Some(name) } => {
            check_host(name, original_port, &config.connect_ports, config)?
        }
        Sniffed::Http { host: None } => return Err("HTTP request without a Host header"),
        Sniffed::Http { host: Some(header) } => match split_host_port(header) {
            None => return Err("Host header is not host[:port]"),
            Some((_, Some(port))) if port != original_port => {
                return Err("Host header port does not match the destination port");
            }
            Some((host, _)) => check_host(host, original_port, &config.http_ports, config)?,
        },
    };
    Ok(TransparentTarget {
        host: target.host,
        port: target.port,
        rule: target.rule,
    })
}

/// Reads until the prefix is enough to decide, the peer stops, or the
/// sniff limit is reached.
async fn read_until_decided(stream: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Sniffed> {
    loop {
        buf.reserve(4096);
        if stream.read_buf(buf).await? == 0 {
            return Ok(sniff(buf));
        }
        match sniff(buf) {
            Sniffed::Incomplete if buf.len() >= MAX_SNIFF => {
                return Ok(Sniffed::Refused("first message too large"));
            }
            Sniffed::Incomplete => {}
            decided => return Ok(decided),
        }
    }
}

fn label(sniffed: &Sniffed) -> &'static str {
    match sniffed {
        Sniffed::Tls { .. } => "TLS",
        Sniffed::Http { .. } => "HTTP",
        _ => "unknown",
    }
}

/// An HTTP client gets a readable refusal; a TLS client just sees the
/// connection close (we cannot answer inside its handshake).
async fn refuse(stream: &mut TcpStream, sniffed: &Sniffed, status: &str, reason: &str) {
    if matches!(sniffed, Sniffed::Http { .. }) {
        let body = format!("tartaros proxy: denied: {reason}\n");
        let response = format!(
            "HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.write_all(response.as_bytes()).await;
    }
    let _ = stream.shutdown().await;
}

pub(super) async fn serve_connection(
    mut stream: TcpStream,
    original: Option<SocketAddr>,
    config: Arc<ProxyConfig>,
    events: EffectSender,
) {
    let start = Instant::now();
    let effect = Record::new("proxy").with("mode", "transparent");
    // `status`: the HTTP answer the agent got, if it got one.
    let record_with = |effect: Record, decision: &str, reason: &str, status: Option<u16>| {
        let pending = Pending::new(
            events.clone(),
            effect.with("decision", decision).with("reason", reason),
            start,
        );
        if let Some(status) = status {
            pending.status.store(status, Ordering::Relaxed);
        }
    };
    let record = |effect: Record, decision: &str, reason: &str| {
        record_with(effect, decision, reason, None);
    };
    let Some(original) = original else {
        let effect = effect
            .with("host", "")
            .with("port", 0)
            .with("method", "unknown");
        return record(effect, "denied", "original destination unknown");
    };
    let effect = effect.with("original_dst", original.to_string());
    let mut prefix = Vec::new();
    let sniffed = match tokio::time::timeout(
        config.sniff_timeout,
        read_until_decided(&mut stream, &mut prefix),
    )
    .await
    {
        Ok(Ok(sniffed)) => sniffed,
        Ok(Err(e)) => {
            tracing::debug!("{}", ProxyError::Sniff(e));
            let effect = effect
                .with("host", "")
                .with("port", original.port())
                .with("method", "unknown");
            return record(effect, "denied", "failed to read the connection");
        }
        Err(_) => Sniffed::Refused("no ClientHello or request head in time"),
    };
    let named = match &sniffed {
        Sniffed::Tls { sni: Some(name) } => name.clone(),
        Sniffed::Http { host: Some(host) } => host.clone(),
        Sniffed::Refused(_) => super::sniff::hosts_named_in_http(&prefix).unwrap_or_default(),
        _ => String::new(),
    };
    let effect = effect
        .with("method", label(&sniffed))
        .with("port", original.port());
    let target = match decide_transparent(&sniffed, original.port(), &config) {
        Ok(target) => target,
        Err(reason) => {
            refuse(&mut stream, &sniffed, "403 Forbidden", reason).await;
            let answered = matches!(sniffed, Sniffed::Http { .. }).then_some(403);
            let effect = effect.with("host", truncate(&named, 253));
            return record_with(effect, "denied", reason, answered);
        }
    };
    if matches!(sniffed, Sniffed::Http { .. }) {
        // Every request of the connection is judged on its own, the first
        // one again included (`transparent_http`).
        return super::transparent_http::serve(stream, prefix, original, config, events).await;
    }
    let effect = effect.with("host", target.host.clone());
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
        Err(error) => {
            tracing::debug!("proxy upstream: {error}");
            let (status, decision) = if error.is_denial() {
                ("403 Forbidden", "denied")
            } else {
                ("502 Bad Gateway", "allowed")
            };
            refuse(&mut stream, &sniffed, status, error.reason()).await;
            return record(effect, decision, error.reason());
        }
    };
    let reason = format!("matched {}", target.rule);
    let pending = Pending::new(
        events.clone(),
        effect.with("decision", "allowed").with("reason", reason),
        start,
    );
    if upstream.write_all(&prefix).await.is_err() {
        let _ = pending.failure.set("failed to write to the upstream");
        return;
    }
    pending.up.fetch_add(prefix.len() as u64, Ordering::Relaxed);
    relay(&mut stream, &mut upstream, &pending.up, &pending.down).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::StaticResolver;

    fn config() -> ProxyConfig {
        ProxyConfig::new(vec!["example.com".into()], Arc::new(StaticResolver::new()))
    }

    fn tls(sni: Option<&str>) -> Sniffed {
        Sniffed::Tls {
            sni: sni.map(str::to_string),
        }
    }

    fn http(host: Option<&str>) -> Sniffed {
        Sniffed::Http {
            host: host.map(str::to_string),
        }
    }

    #[test]
    fn transparent_decisions() {
        let config = config();
        let ok = |port| {
            Ok(TransparentTarget {
                host: "example.com".into(),
                port,
                rule: "example.com".into(),
            })
        };
        assert_eq!(
            decide_transparent(&tls(Some("Example.COM")), 443, &config),
            ok(443)
        );
        assert_eq!(
            decide_transparent(&tls(Some("example.com")), 80, &config),
            Err("port not allowed")
        );
        assert_eq!(
            decide_transparent(&tls(Some("evil.com")), 443, &config),
            Err("domain not in the allow list")
        );
        assert_eq!(
            decide_transparent(&tls(Some("127.0.0.1")), 443, &config),
            Err("IP literals are refused; use a domain name")
        );
        assert_eq!(
            decide_transparent(&tls(None), 443, &config),
            Err("TLS ClientHello without SNI")
        );
        assert_eq!(
            decide_transparent(&http(Some("example.com")), 80, &config),
            ok(80)
        );
        assert_eq!(
            decide_transparent(&http(Some("example.com:80")), 80, &config),
            ok(80)
        );
        assert_eq!(
            decide_transparent(&http(Some("example.com:8080")), 80, &config),
            Err("Host header port does not match the destination port")
        );
        assert_eq!(
            decide_transparent(&http(Some("example.com")), 443, &config),
            Err("port not allowed")
        );
        assert_eq!(
            decide_transparent(&http(None), 80, &config),
            Err("HTTP request without a Host header")
        );
        assert_eq!(
            decide_transparent(&http(Some("a.com:x")), 80, &config),
            Err("Host header is not host[:port]")
        );
        assert_eq!(
            decide_transparent(&Sniffed::Refused("neither TLS nor HTTP"), 22, &config),
            Err("neither TLS nor HTTP")
        );
        assert!(decide_transparent(&Sniffed::Incomplete, 443, &config).is_err());
    }
}
