//! The credential broker: the agent calls
//! `http://127.0.0.1:<port>/<capability>/<path>` with the broker token in
//! the `auth_header`; the broker checks the token, the capability's method
//! and path prefix, injects the capability's header (a secret the agent
//! never sees) and forwards over TLS to that capability's upstream only.
//!
//! Secrets come from the launcher's environment by *name* and live in
//! [`BrokerSecrets`], wiped on drop; nothing the broker generates (status
//! lines, bodies, effects, errors) ever contains one. Decisions are pure
//! functions in [`rules`]; [`serve`] applies them. See `docs/egress.md`.

mod body_echo;
mod echo;
mod echo_forms;
mod path_forms;
pub mod rules;
mod server;

use std::ffi::OsString;
use std::fmt;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use zeroize::Zeroizing;

use crate::policy::BrokerConfig;

pub use rules::{Refusal, Route, route, validate};
pub use server::{serve, serve_attributed};

/// The port every capability's upstream is reached on (HTTPS).
pub const UPSTREAM_PORT: u16 = 443;

/// Failures of the broker. No variant carries a secret value: a variable
/// is named, never shown.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error(
        "failed to load the broker secrets: the environment variable {name} is not set; export it before running tartaros"
    )]
    MissingVariable { name: String },
    #[error(
        "failed to load the broker secrets: the environment variable {name} is empty or holds characters that cannot go in an HTTP header (control characters, newlines); fix its value"
    )]
    InvalidValue { name: String },
    #[error(
        "failed to read the broker's CA file {path}: {why}; give a PEM file of certificates (at most 1 MiB) that you can read"
    )]
    ReadCa { path: PathBuf, why: &'static str },
    #[error("failed to use a certificate from {path}: {source}")]
    AddCa {
        path: PathBuf,
        source: rustls::Error,
    },
    #[error(
        "failed to find any trusted root certificate; install the ca-certificates package or pass an extra CA file"
    )]
    NoRoots,
    #[error("failed to build the broker's TLS configuration: {0}")]
    Tls(rustls::Error),
    #[error("{0}")]
    Invalid(String),
}

/// Secret bytes in memory that is zeroed when the last reference drops.
/// `Bytes::from_owner` lets a header value point at this memory instead
/// of copying the secret for every request.
#[derive(Clone)]
struct Secret(Arc<Zeroizing<Vec<u8>>>);

impl AsRef<[u8]> for Secret {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

impl Secret {
    fn bytes(&self) -> Bytes {
        Bytes::from_owner(self.clone())
    }
}

/// The broker token and the value of each capability, read from the
/// launcher's environment by the names the policy gives.
pub struct BrokerSecrets {
    token: Secret,
    /// (capability name, value), in policy order.
    values: Vec<(String, Secret)>,
}

impl fmt::Debug for BrokerSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.values.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("BrokerSecrets")
            .field("token", &"<redacted>")
            .field("capabilities", &names)
            .finish()
    }
}

impl BrokerSecrets {
    /// Reads the secrets from this process's environment.
    pub fn from_env(config: &BrokerConfig) -> Result<Self, BrokerError> {
        Self::load(config, |name| std::env::var_os(name))
    }

    /// Reads the secrets through `lookup` (the environment, or a map in
    /// tests). The variable's buffer is moved, not copied, into memory
    /// that is wiped on drop.
    pub fn load(
        config: &BrokerConfig,
        lookup: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Self, BrokerError> {
        let read = |name: &str| -> Result<Secret, BrokerError> {
            let value = lookup(name).ok_or_else(|| BrokerError::MissingVariable {
                name: name.to_string(),
            })?;
            let value = Zeroizing::new(value.into_vec());
            if !rules::valid_header_value(&value) {
                return Err(BrokerError::InvalidValue {
                    name: name.to_string(),
                });
            }
            Ok(Secret(Arc::new(value)))
        };
        let token = read(&config.token_env)?;
        let values = config
            .capabilities
            .iter()
            .map(|capability| Ok((capability.name.clone(), read(&capability.value_env)?)))
            .collect::<Result<_, BrokerError>>()?;
        Ok(Self { token, values })
    }

    fn value(&self, capability: &str) -> Option<&Secret> {
        self.values
            .iter()
            .find(|(name, _)| name == capability)
            .map(|(_, v)| v)
    }

    /// Whether `haystack` holds the token or any value, in any form
    /// [`echo::echoes`] knows.
    fn leaks_into(&self, haystack: &[u8]) -> bool {
        std::iter::once(&self.token)
            .chain(self.values.iter().map(|(_, v)| v))
            .any(|secret| echo::echoes(haystack, secret.as_ref()))
    }

    /// Every form of the injected values that [`body_echo::Masked`]
    /// masks in response bodies. Not the token: the agent holds it
    /// already, and a short one would mask innocent text.
    fn needles(&self) -> body_echo::Needles {
        body_echo::Needles::of(self.values.iter().map(|(_, v)| v.as_ref()))
    }

    /// `text` with every occurrence of a secret replaced, for the few
    /// agent-chosen strings (the path) that go into the effect log.
    fn redact(&self, text: &str) -> String {
        let mut out = text.to_string();
        for secret in std::iter::once(&self.token).chain(self.values.iter().map(|(_, v)| v)) {
            if let Ok(s) = std::str::from_utf8(secret.as_ref())
                && !s.is_empty()
                && out.contains(s)
            {
                out = out.replace(s, "<redacted>");
            }
        }
        out
    }
}

/// The bytes of the CA file `path`: a regular file of at most 1 MiB.
fn read_ca(path: &Path) -> Result<Vec<u8>, &'static str> {
    use std::io::Read as _;
    const MAX: u64 = 1 << 20;
    let file = std::fs::File::open(path).map_err(|_| "cannot open it")?;
    let meta = file.metadata().map_err(|_| "cannot open it")?;
    if !meta.is_file() || meta.len() > MAX {
        return Err("not a regular file of at most 1 MiB");
    }
    let mut pem = Vec::new();
    file.take(MAX)
        .read_to_end(&mut pem)
        .map_err(|_| "cannot read it")?;
    Ok(pem)
}

/// The TLS client configuration for upstreams: the system's roots, plus
/// the certificates of `extra_ca_pem` if given (a private CA, or a test
/// CA). HTTP/1.1 only, ring as the crypto provider.
pub fn client_tls(extra_ca_pem: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, BrokerError> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;

    let mut roots = rustls::RootCertStore::empty();
    // Unreadable or unparsable system certificates are skipped: one bad
    // file in /etc/ssl must not take the broker down.
    // `SSL_CERT_FILE` / `SSL_CERT_DIR` come from the launcher's
    // environment: read with the service caller's file access too.
    let native = crate::caller::as_caller(rustls_native_certs::load_native_certs);
    for cert in native.certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = extra_ca_pem {
        let failed = |why| BrokerError::ReadCa {
            path: path.to_path_buf(),
            why,
        };
        // Read with the service caller's file access, bounded, and never
        // quoted back: a root read of any path (a root-only file, a device)
        // told the caller what was there (session 13).
        let pem = crate::caller::as_caller(|| read_ca(path)).map_err(failed)?;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|_| failed("not a PEM certificate file"))?;
            roots.add(cert).map_err(|source| BrokerError::AddCa {
                path: path.to_path_buf(),
                source,
            })?;
        }
    }
    if roots.is_empty() {
        return Err(BrokerError::NoRoots);
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(BrokerError::Tls)?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::BrokerCapability;

    fn config() -> BrokerConfig {
        BrokerConfig {
            port: 9000,
            auth_header: "X-Broker-Auth".into(),
            allowed_hosts: vec![],
            allow_internal: false,
            token_env: "T_TOKEN".into(),
            ca_file: None,
            capabilities: vec![BrokerCapability {
                name: "gh".into(),
                upstream: "api.github.com".into(),
                header: "Authorization".into(),
                value_env: "T_GH".into(),
                methods: vec![],
                path_prefix: None,
            }],
        }
    }

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn missing_variable_is_named_not_shown() {
        let err = BrokerSecrets::load(&config(), env(&[("T_TOKEN", "tok-123")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("T_GH"), "{err}");
        assert!(!err.contains("tok-123"), "{err}");
        let err = BrokerSecrets::load(&config(), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("T_TOKEN"), "{err}");
    }

    #[test]
    fn bad_values_are_refused_without_echo() {
        let err = BrokerSecrets::load(
            &config(),
            env(&[("T_TOKEN", "tok"), ("T_GH", "Bearer x\r\nEvil: 1")]),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("T_GH") && !err.contains("Bearer"), "{err}");
    }

    #[test]
    fn debug_hides_values() {
        let secrets = BrokerSecrets::load(
            &config(),
            env(&[("T_TOKEN", "tok-123"), ("T_GH", "Bearer ghp_secret")]),
        )
        .unwrap();
        let debug = format!("{secrets:?}");
        assert!(
            !debug.contains("tok-123") && !debug.contains("ghp_secret"),
            "{debug}"
        );
        assert!(debug.contains("gh"), "{debug}");
        assert_eq!(
            secrets.value("gh").map(|v| v.bytes()),
            Some(Bytes::from_static(b"Bearer ghp_secret"))
        );
        assert!(secrets.leaks_into(b"echo: Bearer ghp_secret!"));
        assert!(secrets.leaks_into(b"tok-123"));
        assert!(!secrets.leaks_into(b"Bearer ghp_"));
        assert_eq!(secrets.redact("/a/tok-123/b"), "/a/<redacted>/b");
    }

    #[test]
    fn tls_config_loads_an_extra_ca_or_says_why_not() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let err = client_tls(Some(&missing)).unwrap_err().to_string();
        assert!(err.contains("missing.pem"), "{err}");
    }
}
