//! The broker's decisions, as pure functions: which capability a request
//! names, whether its method and path are allowed, and whether the policy
//! itself is usable.

use hyper::header::HeaderName;

use super::BrokerError;
use crate::policy::{BrokerCapability, BrokerConfig};
use crate::proxy::{allow, normalize_host};

/// Methods a capability allows when its policy lists none: read-only.
pub const DEFAULT_METHODS: &[&str] = &["GET", "HEAD"];

/// Headers a capability may not inject: they frame the message or route
/// it, and overriding them would desynchronize the broker and the upstream.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "proxy-connection",
    "proxy-authorization",
];

/// Why the broker refused a request (403). Fixed text: never input, never
/// a secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    UnknownCapability,
    MethodNotAllowed,
    PathNotAllowed,
    BadPath(&'static str),
    HostNotAllowed,
}

impl Refusal {
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::UnknownCapability => "no such capability",
            Refusal::MethodNotAllowed => "method not allowed for this capability",
            Refusal::PathNotAllowed => "path outside the capability's path prefix",
            Refusal::BadPath(why) => why,
            Refusal::HostNotAllowed => "capability upstream is outside allowed_hosts",
        }
    }
}

/// An allowed broker request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route<'a> {
    pub capability: &'a BrokerCapability,
    /// Normalized upstream host.
    pub host: String,
    /// Path and query to send upstream (origin form).
    pub target: String,
    /// The upstream path without its query, for the effect log.
    pub path: String,
}

/// Splits `/<capability>/<path>?query` and decides it.
pub fn route<'a>(
    config: &'a BrokerConfig,
    method: &str,
    path_and_query: &str,
) -> Result<Route<'a>, Refusal> {
    let (path, query) = match path_and_query.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (path_and_query, None),
    };
    let Some(rest) = path.strip_prefix('/') else {
        return Err(Refusal::BadPath("path must start with /<capability>/"));
    };
    let (name, upstream_path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let capability = config
        .capabilities
        .iter()
        .find(|c| c.name == name)
        .ok_or(Refusal::UnknownCapability)?;
    check_path(upstream_path).map_err(Refusal::BadPath)?;
    if !method_allowed(capability, method) {
        return Err(Refusal::MethodNotAllowed);
    }
    if let Some(prefix) = &capability.path_prefix
        && !prefix_matches(prefix, upstream_path)
    {
        return Err(Refusal::PathNotAllowed);
    }
    let host = normalize_host(&capability.upstream).map_err(|_| Refusal::HostNotAllowed)?;
    if !config.allowed_hosts.is_empty() && !allow(&host, &config.allowed_hosts).is_allowed() {
        return Err(Refusal::HostNotAllowed);
    }
    let target = match query {
        Some(query) => format!("{upstream_path}?{query}"),
        None => upstream_path.to_string(),
    };
    Ok(Route {
        capability,
        host,
        target,
        path: upstream_path.to_string(),
    })
}

fn method_allowed(capability: &BrokerCapability, method: &str) -> bool {
    if capability.methods.is_empty() {
        DEFAULT_METHODS.contains(&method)
    } else {
        // Methods are case-sensitive on the wire; the policy may be written
        // in any case.
        capability
            .methods
            .iter()
            .any(|m| m.to_ascii_uppercase() == method)
    }
}

/// Whether `path` is inside `prefix` on a segment boundary: `/repos/acme`
/// covers `/repos/acme` and `/repos/acme/x`, not `/repos/acme-evil`.
pub fn prefix_matches(prefix: &str, path: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    if prefix.is_empty() {
        return true;
    }
    path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Refuses every path whose meaning depends on how the upstream
/// normalizes it, rather than normalizing it ourselves (the upstream's
/// rules are unknown): `.`/`..` segments, `;` anywhere (path parameters,
/// which Tomcat, Jetty and Spring strip before matching, so `..;` is a
/// dot segment to them), backslashes, empty segments (`//`), and
/// percent-encoded `.`, `/`, `\`, `;`, `%` (double encoding) or NUL
/// anywhere in a segment, plus malformed escapes, overlong UTF-8 and
/// characters that normalize to those ([`super::path_forms`]). A trailing
/// `/` is allowed.
pub fn check_path(path: &str) -> Result<(), &'static str> {
    let Some(rest) = path.strip_prefix('/') else {
        return Err("path must start with /");
    };
    if rest.is_empty() {
        return Ok(());
    }
    let segments: Vec<&str> = rest.split('/').collect();
    let last = segments.len() - 1;
    for (i, segment) in segments.iter().enumerate() {
        if segment.is_empty() {
            if i == last {
                continue; // trailing slash
            }
            return Err("empty path segment (//) refused");
        }
        // `...` too: some servers collapse runs of dots.
        if segment.bytes().all(|b| b == b'.') {
            return Err("dot segments (. and ..) refused in the path");
        }
        if segment.contains(';') {
            return Err("; refused in the path (upstreams strip path parameters)");
        }
        if segment.contains('\\') {
            return Err("backslash refused in the path");
        }
        let (decoded, escaped) =
            percent_decoded(segment).ok_or("malformed percent-encoding in the path")?;
        if escaped.iter().any(|b| ENCODED_REFUSED.contains(b)) {
            return Err("percent-encoded . / \\ ; % or NUL refused in the path");
        }
        if let Some(why) = super::path_forms::ambiguous(&decoded) {
            return Err(why);
        }
    }
    Ok(())
}

/// Bytes that change a path's meaning when an upstream decodes them (or
/// decodes twice, for `%`): refused in percent-encoded form.
const ENCODED_REFUSED: &[u8] = b"./\\;%\0";

/// Headers that ask the upstream to treat a request as another method
/// than the one the broker checked: stripped from every request.
pub const METHOD_OVERRIDE_HEADERS: &[&str] = &[
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// Headers with which the agent shapes the response body so that a scan
/// for an echoed credential cannot see it (adversarial round 8): a range
/// fetches it in pieces too short to recognize, a content coding hides
/// it. Stripped from every request; the broker asks for `identity`.
pub const BODY_SHAPING_HEADERS: &[&str] = &["range", "if-range", "accept-encoding"];

/// Every agent-sent header the broker removes before forwarding: the
/// broker token, every header any capability injects (the agent must not
/// supply or duplicate one), the method overrides, the path and host
/// overrides (`proxy::http::TARGET_OVERRIDE_HEADERS`) and the
/// headers that shape the body ([`BODY_SHAPING_HEADERS`]).
pub fn stripped_request_headers(config: &BrokerConfig) -> Vec<HeaderName> {
    let mut names: Vec<HeaderName> = METHOD_OVERRIDE_HEADERS
        .iter()
        .chain(crate::proxy::http::TARGET_OVERRIDE_HEADERS)
        .chain(BODY_SHAPING_HEADERS)
        .map(|name| HeaderName::from_static(name))
        .collect();
    let policy_names = std::iter::once(config.auth_header.as_str())
        .chain(config.capabilities.iter().map(|c| c.header.as_str()));
    names.extend(policy_names.filter_map(|name| HeaderName::from_bytes(name.as_bytes()).ok()));
    names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    names.dedup();
    names
}

/// `segment` percent-decoded, and apart the bytes it spells as `%XX`
/// escapes; `None` when an escape is malformed.
pub(super) fn percent_decoded(segment: &str) -> Option<(Vec<u8>, Vec<u8>)> {
    let bytes = segment.as_bytes();
    let (mut all, mut escaped) = (Vec::with_capacity(bytes.len()), Vec::new());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            let text = std::str::from_utf8(hex).ok()?;
            let byte = u8::from_str_radix(text, 16).ok()?;
            all.push(byte);
            escaped.push(byte);
            i += 3;
        } else {
            all.push(bytes[i]);
            i += 1;
        }
    }
    Some((all, escaped))
}

/// Compares a presented token with the real one in time independent of
/// where they differ and of the real token's length (both are hashed
/// first, so only the digests are compared).
pub fn token_matches(presented: &[u8], token: &[u8]) -> bool {
    use sha2::{Digest, Sha256};
    let a = Sha256::digest(presented);
    let b = Sha256::digest(token);
    let diff = a
        .iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Whether `haystack` contains `needle`, ignoring ASCII case.
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty()
        && haystack
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
}

/// Checks a broker policy before serving: header names, methods, path
/// prefixes, unique capability names, and every capability inside
/// `allowed_hosts` (when that list is not empty). The supervisor should
/// refuse to start (exit 78) on an error.
pub fn validate(config: &BrokerConfig) -> Result<(), BrokerError> {
    let invalid = |msg: String| Err(BrokerError::Invalid(msg));
    if HeaderName::from_bytes(config.auth_header.as_bytes()).is_err() {
        return invalid(format!(
            "[broker] auth_header {:?} is not a valid HTTP header name",
            config.auth_header
        ));
    }
    for (i, capability) in config.capabilities.iter().enumerate() {
        let name = &capability.name;
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.~".contains(&b))
            || name == "."
            || name == ".."
        {
            return invalid(format!(
                "[broker] capability name {name:?} must be one URL path segment of letters, digits, '-', '_', '.', '~'"
            ));
        }
        if config.capabilities[..i].iter().any(|c| c.name == *name) {
            return invalid(format!(
                "[broker] capability {name:?} is defined twice; give each a unique name"
            ));
        }
        match HeaderName::from_bytes(capability.header.as_bytes()) {
            Ok(header)
                if !RESERVED_HEADERS.contains(&header.as_str())
                    && !header.as_str().eq_ignore_ascii_case(&config.auth_header) => {}
            _ => {
                return invalid(format!(
                    "[broker] capability {name:?}: header {:?} is not a header the broker can inject; name an ordinary header such as Authorization",
                    capability.header
                ));
            }
        }
        for method in &capability.methods {
            if method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
                return invalid(format!(
                    "[broker] capability {name:?}: {method:?} is not an HTTP method"
                ));
            }
        }
        if let Some(prefix) = &capability.path_prefix
            && check_path(prefix).is_err()
        {
            return invalid(format!(
                "[broker] capability {name:?}: path_prefix {prefix:?} must start with / and have no empty, . or .. segments"
            ));
        }
        let host = normalize_host(&capability.upstream).map_err(|denial| {
            BrokerError::Invalid(format!(
                "[broker] capability {name:?}: upstream {:?} is not a host name ({})",
                capability.upstream,
                denial.reason()
            ))
        })?;
        if !config.allowed_hosts.is_empty() && !allow(&host, &config.allowed_hosts).is_allowed() {
            return invalid(format!(
                "[broker] capability {name:?}: upstream {host} is not in allowed_hosts; add it there or fix the upstream"
            ));
        }
    }
    Ok(())
}

/// Whether `value` can be sent as an HTTP header value (checked at load
/// time, so that no secret is ever copied into a rejected header).
pub fn valid_header_value(value: &[u8]) -> bool {
    !value.is_empty()
        && value
            .iter()
            .all(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capability(name: &str, methods: &[&str], prefix: Option<&str>) -> BrokerCapability {
        BrokerCapability {
            name: name.into(),
            upstream: "api.github.com".into(),
            header: "Authorization".into(),
            value_env: "GH".into(),
            methods: methods.iter().map(|m| m.to_string()).collect(),
            path_prefix: prefix.map(str::to_string),
        }
    }

    fn config() -> BrokerConfig {
        BrokerConfig {
            port: 9000,
            auth_header: "X-Broker-Auth".into(),
            allowed_hosts: vec!["*.github.com".into()],
            allow_internal: false,
            token_env: "TOKEN".into(),
            ca_file: None,
            capabilities: vec![
                capability("gh", &["GET", "post"], Some("/repos/acme")),
                capability("ro", &[], None),
            ],
        }
    }

    #[test]
    fn routes() {
        let config = config();
        let route = route(&config, "GET", "/gh/repos/acme/x?page=2").unwrap();
        assert_eq!(route.capability.name, "gh");
        assert_eq!(route.host, "api.github.com");
        assert_eq!(route.target, "/repos/acme/x?page=2");
        assert_eq!(route.path, "/repos/acme/x");
        assert!(super::route(&config, "POST", "/gh/repos/acme").is_ok());
        assert_eq!(super::route(&config, "GET", "/ro").unwrap().target, "/");
        assert_eq!(super::route(&config, "GET", "/ro/").unwrap().target, "/");
        assert!(super::route(&config, "HEAD", "/ro/x/").is_ok());
    }

    #[test]
    fn refusals() {
        let config = config();
        let cases: &[(&str, &str, Refusal)] = &[
            ("GET", "/nope/x", Refusal::UnknownCapability),
            ("GET", "/", Refusal::UnknownCapability),
            ("GET", "/GH/repos/acme", Refusal::UnknownCapability),
            ("DELETE", "/gh/repos/acme/x", Refusal::MethodNotAllowed),
            ("get", "/gh/repos/acme/x", Refusal::MethodNotAllowed),
            ("POST", "/ro/x", Refusal::MethodNotAllowed),
            ("GET", "/gh/repos/acme-evil", Refusal::PathNotAllowed),
            ("GET", "/gh/repos/other", Refusal::PathNotAllowed),
            ("GET", "/gh/", Refusal::PathNotAllowed),
        ];
        for (method, path, want) in cases {
            assert_eq!(route(&config, method, path), Err(*want), "{method} {path}");
        }
        for path in [
            "/gh/repos/acme/../other",
            "/gh/repos/acme/%2e%2e/other",
            "/gh/repos/acme/%2E%2e/other",
            "/gh/repos/acme/.%2E/other",
            "/gh/repos/acme/./x",
            "/gh/repos/acme//x",
            "/gh/repos/acme/a%2fb",
            "/gh/repos/acme/a%5cb",
            "/gh/repos/acme/a%00b",
            "/gh/repos/acme/%zz",
            "/gh/repos/acme/%2",
            "/gh//repos/acme",
            "gh/repos/acme",
        ] {
            assert!(
                matches!(route(&config, "GET", path), Err(Refusal::BadPath(_))),
                "{path}"
            );
        }
    }

    #[test]
    fn paths_that_depend_on_upstream_normalization_are_refused() {
        let config = config();
        for path in [
            // The spellings of issue 12: Tomcat/Jetty/Spring strip `;...`.
            "/gh/repos/acme/..;/other",
            "/gh/repos/acme/%2e%2e;/other",
            "/gh/repos/acme/.;/other",
            "/gh/repos/acme/%252e%252e/other",
            // `;` anywhere in a segment, raw or encoded.
            "/gh/repos/acme;/x",
            "/gh/repos/acme/x;jsessionid=1",
            "/gh/repos/acme/;",
            "/gh/repos/acme/x%3by",
            "/gh/repos/acme/x%3By",
            // Encoded dots anywhere, not only as a whole segment.
            "/gh/repos/acme/%2e",
            "/gh/repos/acme/a%2eb",
            "/gh/repos/acme/%2E%2E",
            // Double encoding of anything.
            "/gh/repos/acme/%25",
            "/gh/repos/acme/%252f",
            "/gh/repos/acme/%2541",
            // Separators, raw and encoded.
            "/gh/repos/acme/a\\b",
            "/gh/repos/acme/..\\x",
            "/gh/repos/acme/a%2Fb",
            "/gh/repos/acme/a%5Cb",
            "/gh/repos/acme//x",
            "/gh/repos/acme/x//",
            // Runs of dots and malformed escapes.
            "/gh/repos/acme/...",
            "/gh/repos/acme/%+1",
            "/gh/repos/acme/%2",
        ] {
            assert!(
                matches!(route(&config, "GET", path), Err(Refusal::BadPath(_))),
                "{path} should be refused"
            );
        }
        // Controls: ordinary paths, a dot inside a name, harmless escapes
        // and a trailing slash still go through.
        for path in [
            "/gh/repos/acme/x",
            "/gh/repos/acme/v1.2.3",
            "/gh/repos/acme/file.tar.gz",
            "/gh/repos/acme/.github",
            "/gh/repos/acme/a%20b",
            "/gh/repos/acme/%41",
            "/gh/repos/acme/x/",
            "/gh/repos/acme/x?q=a;b&c=..",
        ] {
            assert!(route(&config, "GET", path).is_ok(), "{path} should pass");
        }
    }

    #[test]
    fn method_overrides_and_injected_headers_are_stripped() {
        let mut config = config();
        config.capabilities[1].header = "X-Api-Key".into();
        let names: Vec<String> = stripped_request_headers(&config)
            .iter()
            .map(|n| n.as_str().to_string())
            .collect();
        for want in [
            "x-http-method-override",
            "x-http-method",
            "x-method-override",
            "x-broker-auth",
            "authorization",
            "x-api-key",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} missing: {names:?}");
        }
        assert!(!names.iter().any(|n| n == "accept"), "{names:?}");
    }

    #[test]
    fn allowed_hosts_bound_capabilities() {
        let mut config = config();
        config.allowed_hosts = vec!["gitlab.com".into()];
        assert_eq!(route(&config, "GET", "/ro/x"), Err(Refusal::HostNotAllowed));
        assert!(validate(&config).is_err());
        config.allowed_hosts.clear();
        assert!(route(&config, "GET", "/ro/x").is_ok());
        assert!(validate(&config).is_ok());
    }

    #[test]
    fn prefixes_match_on_segments() {
        assert!(prefix_matches("/repos/acme", "/repos/acme"));
        assert!(prefix_matches("/repos/acme/", "/repos/acme/x"));
        assert!(prefix_matches("/repos/acme", "/repos/acme/x/y"));
        assert!(!prefix_matches("/repos/acme", "/repos/acmex"));
        assert!(!prefix_matches("/repos/acme", "/repos"));
        assert!(prefix_matches("/", "/anything"));
    }

    #[test]
    fn tokens_compare_exactly() {
        assert!(token_matches(b"s3cret", b"s3cret"));
        assert!(!token_matches(b"s3cret ", b"s3cret"));
        assert!(!token_matches(b"", b"s3cret"));
        assert!(!token_matches(b"S3cret", b"s3cret"));
        assert!(contains(b"Bearer abc", b"abc"));
        assert!(!contains(b"Bearer ab", b"abc"));
        assert!(!contains(b"x", b""));
    }

    #[test]
    fn validation_names_the_problem() {
        let mut bad = config();
        bad.capabilities[1].header = "Host".into();
        assert!(validate(&bad).unwrap_err().to_string().contains("\"Host\""));
        let mut bad = config();
        bad.capabilities[1].name = "gh".into();
        assert!(validate(&bad).unwrap_err().to_string().contains("twice"));
        let mut bad = config();
        bad.capabilities[1].name = "a/b".into();
        assert!(validate(&bad).is_err());
        let mut bad = config();
        bad.capabilities[0].path_prefix = Some("/repos/../x".into());
        assert!(validate(&bad).is_err());
        let mut bad = config();
        bad.capabilities[0].methods = vec!["GET /".into()];
        assert!(validate(&bad).is_err());
        let mut bad = config();
        bad.capabilities[0].header = "X-Broker-Auth".into();
        assert!(validate(&bad).is_err());
        assert!(valid_header_value(b"Bearer abc"));
        assert!(!valid_header_value(b"abc\r\nX-Evil: 1"));
        assert!(!valid_header_value(b""));
    }
}
