//! The egress proxy: the only way out of the sandbox's network namespace to
//! the domains of the allow list.
//!
//! - [`serve`]: an explicit HTTP proxy (CONNECT tunnels and absolute-form
//!   plain HTTP) for agents that honour `HTTP(S)_PROXY`;
//! - [`serve_transparent`]: a listener for connections that the cgroup
//!   `connect4/6` program redirected, which recovers the host from the TLS
//!   SNI or the HTTP Host header.
//!
//! Both resolve names themselves (never trusting an address the agent
//! chose), check each resolved address with [`upstream_address_allowed`]
//! and connect to exactly the address they checked, so a name that
//! resolves (or rebinds) to an internal address is refused. Every request
//! becomes one `proxy` effect. The decisions live in [`rules`] and
//! [`sniff`] as pure functions; this module and its siblings only apply
//! them. See `docs/egress.md`.

/// Only in builds for `cargo xtask bench proxy` (feature `bench`): a
/// benchmark is no part of the sandbox.
#[cfg(feature = "bench")]
pub mod bench;
pub mod budget;
mod explicit;
pub(crate) mod http;
pub mod own_addresses;
pub mod rules;
pub mod sniff;
mod splice;
mod transparent;
mod transparent_http;
pub(crate) mod upstream;

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinSet;

use crate::events::EffectSender;

pub use rules::{Decision, Denial, allow, normalize_host, upstream_address_allowed};
pub use transparent::{TransparentTarget, decide_transparent};

/// Failures of the proxy and of its upstream connections. Messages name
/// the host (already normalized, never a secret) and say how to fix what
/// the user can fix.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("failed to resolve {host}: {source}")]
    Resolve { host: String, source: io::Error },
    #[error("failed to resolve {host}: the resolver returned no address")]
    NoAddress { host: String },
    #[error(
        "refused to connect to {host}: it resolves to the internal address {addr}; allow internal addresses in the policy only if this is intended"
    )]
    Internal { host: String, addr: IpAddr },
    #[error("failed to connect to {host} ({addr}): {source}")]
    Connect {
        host: String,
        addr: SocketAddr,
        source: io::Error,
    },
    #[error("failed to connect to {host}: no answer within {timeout:?}")]
    ConnectTimeout { host: String, timeout: Duration },
    #[error("failed to read the first bytes of an intercepted connection: {0}")]
    Sniff(io::Error),
    #[error("failed to speak HTTP to {host}: {source}")]
    Http { host: String, source: hyper::Error },
    #[error("failed to set up TLS to {host}: {source}")]
    Tls { host: String, source: io::Error },
}

impl ProxyError {
    /// Whether this is a policy refusal (403) rather than an upstream
    /// failure (502).
    pub fn is_denial(&self) -> bool {
        matches!(self, ProxyError::Internal { .. })
    }

    /// A fixed, short reason for the effect log and for response bodies;
    /// never contains input or error text.
    pub fn reason(&self) -> &'static str {
        match self {
            ProxyError::Resolve { .. } | ProxyError::NoAddress { .. } => {
                "failed to resolve the host"
            }
            ProxyError::Internal { .. } => "host resolves to an internal address",
            ProxyError::Connect { .. } => "failed to connect to the upstream",
            ProxyError::ConnectTimeout { .. } => "upstream connect timed out",
            ProxyError::Sniff(_) => "failed to read the connection",
            ProxyError::Http { .. } => "upstream HTTP failure",
            ProxyError::Tls { .. } => "upstream TLS failure",
        }
    }
}

/// A future resolving a name to socket addresses.
pub type ResolveFuture<'a> = Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send + 'a>>;

/// Name resolution for the proxy and the broker: the system resolver in
/// production, a fixed map in tests (which must never use real DNS).
pub trait Resolve: Send + Sync {
    /// Resolves `host` (normalized, never an IP literal) for `port`.
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> ResolveFuture<'a>;
}

/// The host's resolver (`getaddrinfo` on tokio's blocking pool). The
/// supervisor runs in the host's network namespace, so this is the host's
/// DNS, which the sandbox itself cannot reach.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> ResolveFuture<'a> {
        Box::pin(async move { Ok(tokio::net::lookup_host((host, port)).await?.collect()) })
    }
}

#[derive(Debug, Clone)]
enum StaticTarget {
    /// Use the requested port.
    Ip(IpAddr),
    /// A fixed address: lets a test map `api.test` (port 443) to a server
    /// on an ephemeral loopback port.
    Addr(SocketAddr),
}

/// A fixed name → address map; unknown names fail to resolve.
#[derive(Debug, Default, Clone)]
pub struct StaticResolver {
    map: HashMap<String, Vec<StaticTarget>>,
}

impl StaticResolver {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `ip` as an address of `host`, used with whatever port is asked.
    pub fn with_ip(mut self, host: &str, ip: IpAddr) -> Self {
        self.map
            .entry(host.to_ascii_lowercase())
            .or_default()
            .push(StaticTarget::Ip(ip));
        self
    }

    /// Adds `addr` as the address of `host` whatever port is asked.
    pub fn with_addr(mut self, host: &str, addr: SocketAddr) -> Self {
        self.map
            .entry(host.to_ascii_lowercase())
            .or_default()
            .push(StaticTarget::Addr(addr));
        self
    }
}

impl Resolve for StaticResolver {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> ResolveFuture<'a> {
        let found = self.map.get(&host.to_ascii_lowercase()).map(|targets| {
            targets
                .iter()
                .map(|t| match t {
                    StaticTarget::Ip(ip) => SocketAddr::new(*ip, port),
                    StaticTarget::Addr(addr) => *addr,
                })
                .collect()
        });
        Box::pin(async move {
            found.ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    "name not in the static resolver map",
                )
            })
        })
    }
}

/// What the proxy allows. Build it with [`ProxyConfig::new`] and adjust
/// the public fields.
#[derive(Clone)]
pub struct ProxyConfig {
    /// Exact names and `*.suffix` wildcards (see [`rules`]).
    pub allow_domains: Vec<String>,
    /// Ports CONNECT (and intercepted TLS) may reach. Default: 443.
    pub connect_ports: Vec<u16>,
    /// Ports plain HTTP (absolute-form or intercepted) may reach. Default: 80.
    pub http_ports: Vec<u16>,
    /// Whether upstream addresses in internal ranges (loopback, private,
    /// link-local, CGNAT, ULA) are allowed. Default: false.
    pub allow_internal: bool,
    pub resolver: Arc<dyn Resolve>,
    /// Bound on resolving and connecting to an upstream. Default: 10 s.
    pub connect_timeout: Duration,
    /// How long an intercepted connection may take to send its ClientHello
    /// or request head. Default: 10 s.
    pub sniff_timeout: Duration,
    /// Connections served at once per listener; more wait in the backlog.
    /// Default: 256. Each tunnel holds up to six descriptors, so the
    /// supervisor should raise its `RLIMIT_NOFILE` soft limit to the hard
    /// limit.
    pub max_connections: usize,
    /// Names the sandbox process behind each accepted connection, for the
    /// `pid` of its records. Default: none.
    pub connection_owner: Option<crate::events::ConnectionOwner>,
}

impl ProxyConfig {
    /// The defaults: CONNECT to 443, plain HTTP to 80, no internal
    /// addresses.
    pub fn new(allow_domains: Vec<String>, resolver: Arc<dyn Resolve>) -> Self {
        Self {
            allow_domains,
            connect_ports: vec![443],
            http_ports: vec![80],
            allow_internal: false,
            resolver,
            connect_timeout: Duration::from_secs(10),
            sniff_timeout: Duration::from_secs(10),
            max_connections: 256,
            connection_owner: None,
        }
    }
}

impl std::fmt::Debug for ProxyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyConfig")
            .field("allow_domains", &self.allow_domains)
            .field("connect_ports", &self.connect_ports)
            .field("http_ports", &self.http_ports)
            .field("allow_internal", &self.allow_internal)
            .field("connect_timeout", &self.connect_timeout)
            .field("sniff_timeout", &self.sniff_timeout)
            .field("max_connections", &self.max_connections)
            .finish_non_exhaustive()
    }
}

/// Looks up where a redirected connection was originally going; defined by
/// the eBPF layer that keeps the map, below the proxy.
pub use crate::ebpf::OriginalDst;

/// Serves the explicit proxy on `listener` until the returned future is
/// dropped or aborted; dropping it also ends every connection it serves.
pub async fn serve(listener: TcpListener, config: Arc<ProxyConfig>, events: EffectSender) {
    let max = config.max_connections;
    accept_loop(listener, max, move |stream| {
        let owner = config.connection_owner.as_ref();
        let ends = crate::events::ConnectionEnds::of(&stream);
        let events = crate::events::attributed(&events, owner, ends);
        explicit::serve_connection(stream, config.clone(), events)
    })
    .await
}

/// Serves the transparent listener: every accepted connection is one the
/// eBPF program redirected; `original_dst` says where it was going.
pub async fn serve_transparent(
    listener: TcpListener,
    config: Arc<ProxyConfig>,
    events: EffectSender,
    original_dst: OriginalDst,
) {
    let max = config.max_connections;
    accept_loop(listener, max, move |stream| {
        let original = original_dst(&stream);
        let owner = config.connection_owner.as_ref();
        let ends = crate::events::ConnectionEnds::of(&stream);
        let events = crate::events::attributed(&events, owner, ends);
        transparent::serve_connection(stream, original, config.clone(), events)
    })
    .await
}

/// Accepts connections and runs `handle` on each, in a [`JoinSet`] owned by
/// this future so that aborting the server ends its connections too. At
/// most `max` run at once, and all listeners together stay within
/// [`budget::shared`]; beyond that, connections wait in the listen
/// backlog, so an agent cannot exhaust the supervisor's descriptors (each
/// tunnel holds two sockets and two pipes) and starve the effect log.
pub(crate) async fn accept_loop<F, Fut>(listener: TcpListener, max: usize, handle: F)
where
    F: Fn(TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let budget = budget::shared();
    let mut connections = JoinSet::new();
    // A slot of the shared budget, taken before accepting: without one the
    // connection waits in the listen backlog, which costs us nothing.
    let mut slot: Option<OwnedSemaphorePermit> = None;
    loop {
        let room = connections.len() < max;
        tokio::select! {
            taken = budget.clone().acquire_owned(), if room && slot.is_none() => match taken {
                Ok(taken) => slot = Some(taken),
                // The budget is never closed.
                Err(_) => return,
            },
            accepted = listener.accept(), if room && slot.is_some() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let served = handle(stream);
                    let slot = slot.take();
                    // The slot goes back when the connection ends or is
                    // aborted with the gateway.
                    connections.spawn(async move {
                        served.await;
                        drop(slot);
                    });
                }
                Err(e) => {
                    tracing::warn!("failed to accept a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}
