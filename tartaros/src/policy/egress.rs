//! The egress parts of the policy: the `[broker]` and `[proxy]` tables and
//! the domain allow-list's spelling.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{PolicyError, invalid};

/// One credential the broker injects (`[[broker.capability]]`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BrokerCapability {
    pub name: String,
    pub upstream: String,
    pub header: String,
    /// Name of the launcher's environment variable holding the value; the
    /// value itself never enters the policy.
    pub value_env: String,
    #[serde(default)]
    pub methods: Vec<String>,
    #[serde(default)]
    pub path_prefix: Option<String>,
}

fn default_auth_header() -> String {
    "X-Broker-Auth".to_string()
}

/// The `[broker]` table.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BrokerConfig {
    pub port: u16,
    #[serde(default = "default_auth_header")]
    pub auth_header: String,
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    #[serde(default)]
    pub allow_internal: bool,
    pub token_env: String,
    #[serde(default, rename = "capability")]
    pub capabilities: Vec<BrokerCapability>,
    /// An extra CA certificate (PEM) to trust for upstreams, besides the
    /// system roots: a private CA, or a test CA.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}

/// The `[proxy]` table: how the egress proxy treats allowed domains.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ProxySettings {
    /// Allow upstreams in loopback, private, link-local and similar ranges
    /// (refused by default: DNS rebinding). For internal mirrors and tests.
    #[serde(default)]
    pub allow_internal: bool,
    /// Ports CONNECT may reach (default 443).
    #[serde(default)]
    pub connect_ports: Vec<u16>,
    /// Ports plain HTTP may reach (default 80).
    #[serde(default)]
    pub http_ports: Vec<u16>,
}

/// Normalizes an allow-list entry: lower case, no trailing dot, `*.` only as
/// a whole leading label, no IP literals, only hostname characters.
pub fn normalize_domain(raw: &str) -> Result<String, PolicyError> {
    let lowered = raw.trim().trim_end_matches('.').to_ascii_lowercase();
    let bad = |why: &str| {
        invalid(format!(
            "--allow-domain {raw:?} is not a valid host pattern: {why}"
        ))
    };
    let host = lowered.strip_prefix("*.").unwrap_or(&lowered);
    if host.is_empty() {
        return Err(bad("empty"));
    }
    if host.parse::<std::net::IpAddr>().is_ok() || host.starts_with('[') {
        return Err(bad("IP literals are refused; name the domain"));
    }
    if host.len() > 253 {
        return Err(bad("longer than 253 characters"));
    }
    for label in host.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !ok {
            return Err(bad(
                "use letters, digits and '-' in dot-separated labels, with an optional leading '*.' (write IDNs in their xn-- form)",
            ));
        }
    }
    if !host.contains('.') && lowered.starts_with("*.") {
        return Err(bad("a wildcard needs at least two labels after '*.'"));
    }
    Ok(lowered)
}

pub(super) fn check_broker(
    broker: &BrokerConfig,
    env_is_set: &dyn Fn(&str) -> bool,
) -> Result<(), PolicyError> {
    if broker.port == 0 {
        return Err(invalid("[broker] port 0 is not a port; use 1 to 65535"));
    }
    if let Some(ca) = &broker.ca_file
        && !ca.is_absolute()
    {
        return Err(invalid(format!(
            "[broker] ca_file {:?} is relative; write it as an absolute path",
            ca.display().to_string()
        )));
    }
    if !env_is_set(&broker.token_env) {
        return Err(invalid(format!(
            "[broker] token_env names the environment variable {}, which is not set; export it before running tartaros",
            broker.token_env
        )));
    }
    for capability in &broker.capabilities {
        if !env_is_set(&capability.value_env) {
            return Err(invalid(format!(
                "[broker] capability {:?} names the environment variable {}, which is not set; export it before running tartaros",
                capability.name, capability.value_env
            )));
        }
        normalize_domain(&capability.upstream)?;
    }
    for host in &broker.allowed_hosts {
        normalize_domain(host)?;
    }
    Ok(())
}
