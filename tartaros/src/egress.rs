//! The sandbox's gateways to the outside, all owned by the supervisor and
//! listening *inside* the sandbox's private network namespace:
//! `--port` relays, the egress proxy (explicit on [`PROXY_PORT`], transparent
//! on [`TRANSPARENT_PORT`]) and the credential broker on its configured
//! port. Nothing else leads out of the namespace.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use tokio::task::JoinHandle;

use crate::broker::BrokerSecrets;
use crate::events::EffectSender;
use crate::network::ListenSpec;
use crate::policy::Policy;
use crate::proxy::{OriginalDst, ProxyConfig, SystemResolver};

/// The gateways' own ports are part of the policy (no grant may take them).
pub use crate::policy::{PROXY_PORT, RESERVED_PORTS, TRANSPARENT_PORT};

#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error("failed to serve a gateway: {0}")]
    Serve(std::io::Error),
    #[error("failed to set up the broker: {0}")]
    Broker(#[from] crate::broker::BrokerError),
}

/// The proxy variables the agent gets when it has allowed domains.
pub fn proxy_env(policy: &Policy) -> Vec<(String, String)> {
    if policy.allow_domains.is_empty() {
        return Vec::new();
    }
    let url = format!("http://127.0.0.1:{PROXY_PORT}");
    let mut env = Vec::new();
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        env.push((name.to_string(), url.clone()));
        env.push((name.to_ascii_lowercase(), url.clone()));
    }
    // Loopback is the sandbox's own (its servers, the broker, the --port
    // gateways): it goes direct. Everything else goes through the proxy.
    let direct = "127.0.0.1,localhost,::1".to_string();
    env.push(("NO_PROXY".into(), direct.clone()));
    env.push(("no_proxy".into(), direct));
    env
}

/// Secrets and TLS for the broker, loaded before the agent starts so that a
/// missing variable refuses the run (naming the variable, never a value).
pub struct BrokerSetup {
    secrets: Arc<BrokerSecrets>,
    tls: Arc<rustls::ClientConfig>,
}

impl BrokerSetup {
    pub fn load(policy: &Policy) -> Result<Option<Self>, EgressError> {
        let Some(config) = &policy.broker else {
            return Ok(None);
        };
        crate::broker::validate(config)?;
        let secrets = Arc::new(BrokerSecrets::from_env(config)?);
        let tls = crate::broker::client_tls(config.ca_file.as_deref())?;
        Ok(Some(Self { secrets, tls }))
    }
}

/// The broker's secret values, read by name from the launcher's environment,
/// for the log writer's redaction list (defence in depth: no record should
/// ever hold them in the first place).
pub fn secret_values(policy: &Policy) -> Vec<Vec<u8>> {
    use std::os::unix::ffi::OsStringExt;
    let Some(config) = &policy.broker else {
        return Vec::new();
    };
    std::iter::once(&config.token_env)
        .chain(config.capabilities.iter().map(|c| &c.value_env))
        .filter_map(std::env::var_os)
        .map(OsStringExt::into_vec)
        .filter(|v| !v.is_empty())
        .collect()
}

/// What a gateway listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatewayKind {
    /// `--port`: relayed to the same address on the host.
    Relay(SocketAddr),
    Proxy,
    Transparent,
    Broker,
}

/// One listener inside the sandbox and what it serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gateway {
    pub listen: ListenSpec,
    pub kind: GatewayKind,
}

/// Decides the gateways the policy grants (pure): `--port` relays on
/// 127.0.0.1 and ::1 (IPv6 only where the kernel has it), the explicit
/// proxy with allowed domains, the transparent listener where eBPF sends
/// intercepted connects, the broker.
pub fn plan(policy: &Policy, transparent: bool) -> Vec<Gateway> {
    let at = |addr: SocketAddr, optional: bool, kind: GatewayKind| Gateway {
        listen: ListenSpec { addr, optional },
        kind,
    };
    let mut wanted = Vec::new();
    for port in &policy.local_ports {
        let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, *port));
        let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, *port));
        wanted.push(at(v4, false, GatewayKind::Relay(v4)));
        wanted.push(at(v6, true, GatewayKind::Relay(v6)));
    }
    if !policy.allow_domains.is_empty() {
        wanted.push(at(
            SocketAddr::from((Ipv4Addr::LOCALHOST, PROXY_PORT)),
            false,
            GatewayKind::Proxy,
        ));
        wanted.push(at(
            SocketAddr::from((Ipv6Addr::LOCALHOST, PROXY_PORT)),
            true,
            GatewayKind::Proxy,
        ));
    }
    if transparent {
        wanted.push(at(
            SocketAddr::from((Ipv4Addr::LOCALHOST, TRANSPARENT_PORT)),
            false,
            GatewayKind::Transparent,
        ));
        // `connect6` sends IPv6 destinations to [::1]: without a listener
        // there they failed, or reached whatever sandbox process bound
        // that port first (while the log said an allowed connect).
        wanted.push(at(
            SocketAddr::from((Ipv6Addr::LOCALHOST, TRANSPARENT_PORT)),
            true,
            GatewayKind::Transparent,
        ));
    }
    if let Some(config) = &policy.broker {
        wanted.push(at(
            SocketAddr::from((Ipv4Addr::LOCALHOST, config.port)),
            false,
            GatewayKind::Broker,
        ));
    }
    wanted
}

/// Serves each gateway on its listener (made inside the sandbox by the
/// init, see `network.rs`) on this runtime. Dropping the handles (abort)
/// closes them with the run. A transparent listener without the eBPF
/// original-destination lookup is closed: nothing is sent there.
pub fn serve(
    gateways: &[Gateway],
    listeners: Vec<Option<std::net::TcpListener>>,
    policy: &Policy,
    broker: Option<&BrokerSetup>,
    original_dst: Option<OriginalDst>,
    owner: Option<crate::events::ConnectionOwner>,
    effects: &EffectSender,
) -> Result<Vec<JoinHandle<()>>, EgressError> {
    let resolver = Arc::new(SystemResolver);
    let mut proxy_config = ProxyConfig::new(policy.allow_domains.clone(), resolver.clone());
    proxy_config.allow_internal = policy.proxy.allow_internal;
    proxy_config.connection_owner = owner.clone();
    if !policy.proxy.connect_ports.is_empty() {
        proxy_config.connect_ports = policy.proxy.connect_ports.clone();
    }
    if !policy.proxy.http_ports.is_empty() {
        proxy_config.http_ports = policy.proxy.http_ports.clone();
    }
    let proxy_config = Arc::new(proxy_config);
    let mut tasks = Vec::new();
    for (listener, gateway) in listeners.into_iter().zip(gateways) {
        let Some(listener) = listener else { continue };
        let listener = tokio::net::TcpListener::from_std(listener).map_err(EgressError::Serve)?;
        let effects = effects.clone();
        let task = match gateway.kind {
            GatewayKind::Relay(upstream) => tokio::spawn(crate::port_relay::relay(
                listener,
                upstream,
                effects,
                owner.clone(),
            )),
            GatewayKind::Proxy => {
                tokio::spawn(crate::proxy::serve(listener, proxy_config.clone(), effects))
            }
            GatewayKind::Transparent => {
                let Some(original) = original_dst.clone() else {
                    continue;
                };
                tokio::spawn(crate::proxy::serve_transparent(
                    listener,
                    proxy_config.clone(),
                    effects,
                    original,
                ))
            }
            GatewayKind::Broker => {
                let (Some(config), Some(setup)) = (policy.broker.clone(), broker) else {
                    continue;
                };
                let (secrets, tls, resolver) =
                    (setup.secrets.clone(), setup.tls.clone(), resolver.clone());
                let owner = owner.clone();
                tokio::spawn(async move {
                    if let Err(e) = crate::broker::serve_attributed(
                        listener,
                        Arc::new(config),
                        secrets,
                        tls,
                        resolver,
                        effects,
                        owner,
                    )
                    .await
                    {
                        eprintln!("tartaros: broker stopped: {e}");
                    }
                })
            }
        };
        tasks.push(task);
    }
    Ok(tasks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_variables_only_with_allowed_domains() {
        assert!(proxy_env(&Policy::default()).is_empty());
        let policy = Policy {
            allow_domains: vec!["crates.io".into()],
            ..Default::default()
        };
        let env = proxy_env(&policy);
        assert!(env.contains(&("HTTPS_PROXY".into(), "http://127.0.0.1:3128".into())));
        assert!(env.contains(&("https_proxy".into(), "http://127.0.0.1:3128".into())));
        assert!(env.contains(&("NO_PROXY".into(), "127.0.0.1,localhost,::1".into())));
    }

    #[test]
    fn gateways_are_planned_per_grant() {
        assert!(plan(&Policy::default(), false).is_empty());
        let policy = Policy {
            local_ports: vec![8080],
            allow_domains: vec!["crates.io".into()],
            ..Default::default()
        };
        let planned = plan(&policy, true);
        let kinds: Vec<_> = planned.iter().map(|g| g.kind).collect();
        assert_eq!(
            kinds,
            [
                GatewayKind::Relay("127.0.0.1:8080".parse().unwrap()),
                GatewayKind::Relay("[::1]:8080".parse().unwrap()),
                GatewayKind::Proxy,
                GatewayKind::Proxy,
                GatewayKind::Transparent,
                GatewayKind::Transparent,
            ]
        );
        assert_eq!(planned[5].listen.addr, "[::1]:3129".parse().unwrap());
        assert!(planned[5].listen.optional);
        // IPv6 loopback is optional: a kernel without it still runs.
        assert!(planned[1].listen.optional && !planned[0].listen.optional);
        assert_eq!(planned[4].listen.addr.port(), TRANSPARENT_PORT);
    }
}
