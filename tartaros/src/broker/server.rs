//! The broker's server: thin async code applying [`super::rules`].

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Version};
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::net::TcpListener;
use tokio_rustls::TlsConnector;

use super::body_echo::{Masked, Needles};
use super::rules::{route, stripped_request_headers, token_matches, validate};
use super::{BrokerError, BrokerSecrets, UPSTREAM_PORT};
use crate::effectlog::Record;
use crate::events::EffectSender;
use crate::policy::BrokerConfig;
use crate::proxy::http::{
    Counted, Direction, Pending, ProxyBody, Spawner, Task, plain, record_refusal, serve_http1,
    strip_hop_by_hop, truncate,
};
use crate::proxy::upstream::connect_checked;
use crate::proxy::{ProxyError, Resolve, accept_loop};

/// Bound on resolving, connecting and the TLS handshake to an upstream.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Agent connections served at once; more wait in the listen backlog.
/// Finished connections free their slot (see `serve_http1`).
const MAX_CONNECTIONS: usize = 128;

#[derive(Clone)]
struct Context {
    config: Arc<BrokerConfig>,
    secrets: Arc<BrokerSecrets>,
    tls: TlsConnector,
    resolver: Arc<dyn Resolve>,
    events: EffectSender,
    auth_header: HeaderName,
    /// Agent headers removed before forwarding (see [`stripped_request_headers`]).
    stripped: Vec<HeaderName>,
    /// The forms of the secrets masked in response bodies.
    needles: Arc<Needles>,
}

/// Serves the broker on `listener` until the future is dropped or aborted
/// (which also ends its connections). Returns at once with an error if
/// the policy does not pass [`validate`]; call that before starting the
/// agent to refuse with exit 78 instead.
pub async fn serve(
    listener: TcpListener,
    config: Arc<BrokerConfig>,
    secrets: Arc<BrokerSecrets>,
    tls: Arc<rustls::ClientConfig>,
    resolver: Arc<dyn Resolve>,
    events: EffectSender,
) -> Result<(), BrokerError> {
    serve_attributed(listener, config, secrets, tls, resolver, events, None).await
}

/// [`serve`], with each request's record naming (`pid`) the sandbox
/// process that opened its connection, as `owner` says.
pub async fn serve_attributed(
    listener: TcpListener,
    config: Arc<BrokerConfig>,
    secrets: Arc<BrokerSecrets>,
    tls: Arc<rustls::ClientConfig>,
    resolver: Arc<dyn Resolve>,
    events: EffectSender,
    owner: Option<crate::events::ConnectionOwner>,
) -> Result<(), BrokerError> {
    validate(&config)?;
    let auth_header = HeaderName::from_bytes(config.auth_header.as_bytes()).map_err(|_| {
        BrokerError::Invalid("[broker] auth_header is not a valid HTTP header name".into())
    })?;
    let stripped = stripped_request_headers(&config);
    let needles = Arc::new(secrets.needles());
    let context = Arc::new(Context {
        stripped,
        needles,
        config,
        secrets,
        tls: TlsConnector::from(tls),
        resolver,
        events,
        auth_header,
    });
    accept_loop(listener, MAX_CONNECTIONS, move |stream| {
        let mut context = context.clone();
        if owner.is_some() {
            let events = crate::events::attributed(
                &context.events,
                owner.as_ref(),
                crate::events::ConnectionEnds::of(&stream),
            );
            context = Arc::new(Context {
                events,
                ..(*context).clone()
            });
        }
        let refused = context.events.clone();
        serve_http1(
            stream,
            move |request, spawn| {
                let context = context.clone();
                async move { handle(request, &context, &spawn).await }
            },
            move |status, reason| {
                record_refusal(&refused, Seen::default().effect(""), status, reason);
            },
        )
    })
    .await;
    Ok(())
}

/// What the effect log learns about a request before it is decided
/// (nothing, for a request hyper refused before any handler saw it).
#[derive(Default)]
struct Seen {
    capability: String,
    method: String,
    path: String,
}

impl Seen {
    fn effect(&self, host: &str) -> Record {
        Record::new("broker")
            .with("capability", self.capability.clone())
            .with("method", self.method.clone())
            .with("host", host.to_string())
            .with("path", self.path.clone())
    }
}

/// Records a request the broker answered itself and builds the answer.
fn answer(
    context: &Context,
    effect: Record,
    start: Instant,
    status: StatusCode,
    decision: &str,
    reason: &str,
) -> Response<ProxyBody> {
    let pending = Pending::new(
        context.events.clone(),
        effect.with("decision", decision).with("reason", reason),
        start,
    );
    pending.status.store(status.as_u16(), Ordering::Relaxed);
    drop(pending);
    plain(status, &format!("tartaros broker: {reason}"))
}

async fn handle(
    request: Request<Incoming>,
    context: &Context,
    spawn: &Spawner,
) -> Response<ProxyBody> {
    let start = Instant::now();
    let secrets = &context.secrets;
    let path_and_query = request
        .uri()
        .path_and_query()
        .map(|pq| pq.as_str())
        .unwrap_or("/");
    let path = path_and_query.split('?').next().unwrap_or_default();
    // Redact before truncating, so no fragment of a secret survives.
    let seen = Seen {
        capability: truncate(
            &secrets.redact(
                path.trim_start_matches('/')
                    .split('/')
                    .next()
                    .unwrap_or_default(),
            ),
            64,
        ),
        method: truncate(request.method().as_str(), 32),
        path: truncate(&secrets.redact(path), 1024),
    };
    if request.method() == Method::CONNECT || request.uri().scheme().is_some() {
        let reason = "send requests as http://127.0.0.1:<port>/<capability>/<path>";
        return answer(
            context,
            seen.effect(""),
            start,
            StatusCode::BAD_REQUEST,
            "denied",
            reason,
        );
    }
    // The token is checked before anything else, so that an agent without
    // it learns nothing, not even which capabilities exist.
    let presented: Vec<&HeaderValue> = request
        .headers()
        .get_all(&context.auth_header)
        .iter()
        .collect();
    let authorized = matches!(presented.as_slice(), [value] if token_matches(value.as_bytes(), secrets.token.as_ref()));
    if !authorized {
        let reason = "missing or wrong broker token";
        let effect = seen.effect("");
        let response = answer(
            context,
            effect,
            start,
            StatusCode::UNAUTHORIZED,
            "denied",
            reason,
        );
        return with_hint(response, &context.config.auth_header);
    }
    if !context.needles.echoes_left() {
        return answer(
            context,
            seen.effect(""),
            start,
            StatusCode::FORBIDDEN,
            "denied",
            "the upstream echoed a credential too often: no more calls in this run",
        );
    }
    let route = match route(&context.config, request.method().as_str(), path_and_query) {
        Ok(route) => route,
        Err(refusal) => {
            return answer(
                context,
                seen.effect(""),
                start,
                StatusCode::FORBIDDEN,
                "denied",
                refusal.reason(),
            );
        }
    };
    let seen = Seen {
        capability: route.capability.name.clone(),
        path: truncate(&secrets.redact(&route.path), 1024),
        ..seen
    };
    let effect = seen.effect(&route.host);
    let (Some(secret), Ok(inject), Ok(host_value), Ok(uri)) = (
        secrets.value(&route.capability.name),
        HeaderName::from_bytes(route.capability.header.as_bytes()),
        HeaderValue::from_str(&route.host),
        route.target.parse::<hyper::Uri>(),
    ) else {
        let reason = "capability cannot be served (policy and secrets disagree)";
        return answer(
            context,
            effect,
            start,
            StatusCode::FORBIDDEN,
            "denied",
            reason,
        );
    };
    let Ok(mut value) = HeaderValue::from_maybe_shared(secret.bytes()) else {
        let reason = "capability value is not a valid header value";
        return answer(
            context,
            effect,
            start,
            StatusCode::FORBIDDEN,
            "denied",
            reason,
        );
    };
    value.set_sensitive(true);

    let sender = match connect_upstream(context, &route.host, spawn).await {
        Ok(sender) => sender,
        Err(error) => {
            tracing::debug!("broker upstream: {error}");
            let (status, decision) = if error.is_denial() {
                (StatusCode::FORBIDDEN, "denied")
            } else {
                (StatusCode::BAD_GATEWAY, "allowed")
            };
            return answer(context, effect, start, status, decision, error.reason());
        }
    };
    let mut sender = sender;
    let reason = format!("capability {}", route.capability.name);
    let pending = Arc::new(Pending::new(
        context.events.clone(),
        effect.with("decision", "allowed").with("reason", reason),
        start,
    ));
    let (mut parts, body) = request.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    // The agent cannot supply (or duplicate) an injected header, nor turn
    // the checked method into another one upstream.
    for name in &context.stripped {
        parts.headers.remove(name);
    }
    parts.headers.remove(header::HOST);
    parts.headers.insert(header::HOST, host_value);
    // A body under a coding could hide an echoed credential from the scan.
    parts.headers.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    parts.headers.insert(inject, value);
    parts.uri = uri;
    parts.version = Version::HTTP_11;
    let body = Counted::new(body, pending.clone(), Direction::Up).boxed();
    let response = match sender.send_request(Request::from_parts(parts, body)).await {
        Ok(response) => response,
        Err(source) => {
            let error = ProxyError::Http {
                host: route.host.clone(),
                source,
            };
            tracing::debug!("broker upstream: {error}");
            pending.status.store(502, Ordering::Relaxed);
            let _ = pending.failure.set(error.reason());
            drop(pending);
            return plain(
                StatusCode::BAD_GATEWAY,
                &format!("tartaros broker: {}", error.reason()),
            );
        }
    };
    // Redirects are passed back, never followed: the agent may follow a
    // Location itself, without the credential, which only the broker has.
    let (mut parts, body) = response.into_parts();
    if coded(&parts.headers) {
        // Asked for `identity`, yet sent a coded body: it cannot be
        // scanned for an echoed credential, so the agent does not get it.
        let reason = "upstream sent a coded body the broker cannot check";
        pending.status.store(502, Ordering::Relaxed);
        let _ = pending.failure.set(reason);
        drop(pending);
        return plain(
            StatusCode::BAD_GATEWAY,
            &format!("tartaros broker: {reason}"),
        );
    }
    strip_hop_by_hop(&mut parts.headers);
    // An upstream that echoes the credential in a header (debug headers,
    // a redirect carrying it, a header named after it) must not hand it to
    // the agent.
    let leaking: Vec<HeaderName> = parts
        .headers
        .iter()
        .filter(|(n, v)| {
            let leaks = |text: &[u8]| secrets.leaks_into(text) || context.needles.found_in(text);
            leaks(n.as_str().as_bytes()) || leaks(v.as_bytes())
        })
        .map(|(name, _)| name.clone())
        .collect();
    if !leaking.is_empty() {
        context.needles.note_echo();
    }
    for name in leaking {
        parts.headers.remove(name);
    }
    // Nor in its status line: hyper keeps a non-canonical reason phrase
    // and writes it back; without it the agent gets the canonical one.
    parts.extensions.remove::<hyper::ext::ReasonPhrase>();
    pending
        .status
        .store(parts.status.as_u16(), Ordering::Relaxed);
    let counted = Counted::new(body, pending, Direction::Down);
    let masked = Masked::new(counted, context.needles.clone());
    Response::from_parts(parts, masked.boxed())
}

/// Whether a response's body is under a content coding, or a transfer
/// coding other than `chunked` (which hyper decodes): bytes the echo scan
/// would not see as the agent, decoding them, does.
fn coded(headers: &hyper::HeaderMap) -> bool {
    let codings = |name| {
        headers
            .get_all(name)
            .iter()
            .flat_map(|v| v.as_bytes().split(|&b| b == b','))
            .map(|coding| coding.trim_ascii().to_ascii_lowercase())
            .filter(|coding| !coding.is_empty())
            .collect::<Vec<_>>()
    };
    codings(header::CONTENT_ENCODING)
        .iter()
        .any(|c| c != b"identity")
        || codings(header::TRANSFER_ENCODING)
            .iter()
            .any(|c| c != b"chunked" && c != b"identity")
}

/// Tells the agent which header carries the token (the header's name is
/// policy, not a secret).
fn with_hint(mut response: Response<ProxyBody>, auth_header: &str) -> Response<ProxyBody> {
    if let Ok(value) = HeaderValue::from_str(&format!(
        "Token realm=\"tartaros-broker\", header=\"{auth_header}\""
    )) {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, value);
    }
    response
}

/// Connects to a checked address of `host`, does the TLS handshake
/// (verifying the certificate for `host`) and starts an HTTP/1 client.
async fn connect_upstream(
    context: &Context,
    host: &str,
    spawn: &Spawner,
) -> Result<hyper::client::conn::http1::SendRequest<ProxyBody>, ProxyError> {
    let allow_internal = context.config.allow_internal;
    let tcp = connect_checked(
        context.resolver.as_ref(),
        host,
        UPSTREAM_PORT,
        allow_internal,
        CONNECT_TIMEOUT,
    )
    .await?;
    let tls_error = |source: std::io::Error| ProxyError::Tls {
        host: host.to_string(),
        source,
    };
    let name = ServerName::try_from(host.to_string())
        .map_err(|e| tls_error(std::io::Error::new(std::io::ErrorKind::InvalidInput, e)))?;
    let tls = tokio::time::timeout(CONNECT_TIMEOUT, context.tls.connect(name, tcp))
        .await
        .map_err(|_| tls_error(std::io::ErrorKind::TimedOut.into()))?
        .map_err(tls_error)?;
    let (sender, connection) =
        hyper::client::conn::http1::handshake::<_, ProxyBody>(TokioIo::new(tls))
            .await
            .map_err(|source| ProxyError::Http {
                host: host.to_string(),
                source,
            })?;
    let driver: Task = Box::pin(async move {
        let _ = connection.await;
    });
    // Fails only when the agent's connection is already gone.
    let _ = spawn.send(driver);
    Ok(sender)
}
