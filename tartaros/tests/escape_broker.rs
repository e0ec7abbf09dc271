//! The broker against a hostile agent and a careless upstream
//! (adversarial round 6):
//! - the injected credential echoed back by the upstream in another form
//!   than the exact value it injected: the bare token without its
//!   `Bearer ` scheme (as an API's error or debug header would quote it),
//!   percent-encoded in a redirect's `Location`, in another letter case,
//!   or as a header's name. None of these may reach the agent;
//! - paths whose meaning depends on the upstream's decoding: overlong
//!   UTF-8 for `.` and `/` (`%C0%AE`, which lenient decoders read as `.`)
//!   and characters that Unicode compatibility normalization (NFKC) turns
//!   into `.`, `/`, `\`, `;` or `%` (`%EF%BC%8E` is U+FF0E FULLWIDTH FULL
//!   STOP). Each could climb out of the capability's `path_prefix` at an
//!   upstream that normalizes; the broker must refuse them, not forward.
//!
//! Adversarial round 8: the credential echoed in the response *body* (an
//! error page or a "request inspector" endpoint quoting the request's
//! headers, as httpbin's `/headers` does), whole, JSON-escaped, split
//! over two chunks, in two halves fetched with `Range`, or hidden under a
//! content coding the agent asked for with `Accept-Encoding`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use hyper::Response;

#[path = "support/broker_echo.rs"]
mod broker_echo;
#[path = "support/pki.rs"]
mod pki_support;
use broker_echo::{CREDENTIAL, Chunks, broker_with, call_with, header};

/// What the upstream answers for each path: a header that holds the
/// credential in some form, and one that must be kept.
fn echo(path: &str, authorization: &str) -> Option<(&'static str, String)> {
    let bare = authorization
        .strip_prefix("Bearer ")
        .unwrap_or(authorization);
    let encoded: String = bare
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    Some(match path {
        "/v1/bare" => (
            "www-authenticate",
            format!("Bearer error=\"invalid_token\", token=\"{bare}\""),
        ),
        "/v1/location" => (
            "location",
            format!("https://login.example/cb?access_token={encoded}"),
        ),
        "/v1/upper" => ("x-debug-token", bare.to_ascii_uppercase()),
        // A debug header holding JSON, from PHP's json_encode (`/` as `\/`).
        "/v1/jsonheader" => (
            "x-debug",
            format!("{{\"auth\":\"{}\"}}", bare.replace('/', "\\/")),
        ),
        _ => return None,
    })
}

/// The upstream of the second capability names a header after the
/// credential (`token <credential>`).
fn echo_as_name(path: &str, authorization: &str) -> Option<(String, String)> {
    let bare = authorization.strip_prefix("token ")?;
    (path == "/v1/name").then(|| (bare.to_ascii_lowercase(), "1".to_string()))
}

/// What the upstream answers in its body for each path (round 8): the
/// request's `Authorization` quoted in a page, as an inspector endpoint or
/// an error page does. `None`: the plain `ok`.
fn body_echo(
    path: &str,
    authorization: &str,
    range: Option<&str>,
) -> Option<(Vec<(&'static str, String)>, Chunks)> {
    let page = format!("{{\"headers\": {{\"Authorization\": \"{authorization}\"}}}}");
    Some(match path {
        "/v1/page" => (vec![], Chunks::one(page)),
        // PHP's json_encode writes `/` as `\/`.
        "/v1/json" => (vec![], Chunks::one(page.replace('/', "\\/"))),
        // An HTML template that escapes `/` and `=` (OWASP's rule, as
        // Handlebars does for `=`): each escape breaks the whole value,
        // and the runs between them are most of the credential.
        "/v1/html" => (
            vec![],
            Chunks::one(page.replace('/', "&#x2F;").replace('=', "&#x3D;")),
        ),
        "/v1/split" => {
            let at = page.find("Up5tream").unwrap_or(page.len() / 2) + 4;
            let (a, b) = page.split_at(at);
            (
                vec![],
                Chunks::many([Bytes::from(a.to_string()), Bytes::from(b.to_string())]),
            )
        }
        // Honours `Range: bytes=A-B`, as static file servers and many APIs do.
        "/v1/range" => {
            let Some((from, to)) = range
                .and_then(|r| r.strip_prefix("bytes="))
                .and_then(|r| r.split_once('-'))
            else {
                return Some((vec![], Chunks::one(page)));
            };
            let from: usize = from.parse().unwrap_or(0).min(page.len());
            let to: usize = to
                .parse()
                .map_or(page.len(), |to: usize| (to + 1).min(page.len()))
                .max(from);
            let headers = vec![(
                "content-range",
                format!("bytes {from}-{}/{}", to.max(1) - 1, page.len()),
            )];
            (headers, Chunks::one(page[from..to].to_string()))
        }
        // A content coding the broker cannot read: the page reversed.
        "/v1/coded" => {
            let reversed: String = page.chars().rev().collect();
            (
                vec![("content-encoding", "x-reverse".to_string())],
                Chunks::one(reversed),
            )
        }
        _ => return None,
    })
}

/// The `Accept-Encoding` of every request the upstream got.
type Seen = Arc<Mutex<Vec<String>>>;

async fn broker_with_upstream() -> (pki_support::TestPki, SocketAddr) {
    let (pki, broker, _) = broker_and_upstream().await;
    (pki, broker)
}

/// The broker in front of an upstream that echoes the credential as
/// [`echo`], [`echo_as_name`] and [`body_echo`] say.
async fn broker_and_upstream() -> (pki_support::TestPki, SocketAddr, Seen) {
    let seen: Seen = Arc::default();
    let seen_by_upstream = seen.clone();
    let (pki, broker) = broker_with(Arc::new(move |request| {
        let authorization = header(request, "authorization");
        let path = request.uri().path();
        seen_by_upstream
            .lock()
            .unwrap()
            .push(header(request, "accept-encoding"));
        let mut response = Response::builder().header("x-safe", "kept");
        if let Some((name, value)) = echo(path, &authorization) {
            response = response.header(name, value);
        }
        if let Some((name, value)) = echo_as_name(path, &authorization) {
            response = response.header(name, value);
        }
        let range = Some(header(request, "range")).filter(|r| !r.is_empty());
        let body = match body_echo(path, &authorization, range.as_deref()) {
            Some((headers, body)) => {
                for (name, value) in headers {
                    response = response.header(name, value);
                }
                body
            }
            None => Chunks::one(Bytes::from_static(b"ok")),
        };
        response.body(body).unwrap()
    }))
    .await;
    (pki, broker, seen)
}

#[tokio::test]
async fn paths_that_normalize_to_dot_segments_are_refused() {
    let (_pki, broker) = broker_with_upstream().await;
    for path in [
        "/api/v1/x/%C0%AE%C0%AE/admin",
        "/api/v1/%C0%AE%C0%AE%C0%AF..%C0%AFadmin",
        "/api/v1/%E0%80%AE%E0%80%AE/admin",
        "/api/v1/x/%EF%BC%8E%EF%BC%8E/admin",
        "/api/v1/x/%E2%80%A5/admin",
        "/api/v1/x%EF%BC%8F..%EF%BC%8Fadmin",
        "/api/v1/x%EF%BC%BC..",
        "/api/v1/x%EF%BC%9B/admin",
        "/api/v1/x%CD%BE/admin",
        "/api/v1/x/%FF/admin",
    ] {
        let answer = call(broker, path).await;
        assert!(answer.starts_with("HTTP/1.1 403"), "{path}: {answer}");
    }
    // Other non-ASCII names still pass.
    let answer = call(broker, "/api/v1/caf%C3%A9.txt").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

async fn call(broker: SocketAddr, path: &str) -> String {
    call_with(broker, path, "").await
}

#[tokio::test]
async fn the_credential_echoed_in_another_form_does_not_reach_the_agent() {
    let lower = CREDENTIAL.to_ascii_lowercase();
    for path in [
        "/api/v1/bare",
        "/api/v1/location",
        "/api/v1/upper",
        "/api/v1/jsonheader",
    ] {
        // A broker each: it answers only a few echoes per run (round 9).
        let (_pki, broker) = broker_with_upstream().await;
        let answer = call(broker, path).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
        assert!(answer.contains("x-safe: kept"), "{path}: {answer}");
        let decoded = answer
            .replace("\\/", "/")
            .replace("%2F", "/")
            .replace("%2B", "+")
            .replace("%3D", "=");
        assert!(
            !decoded.to_ascii_lowercase().contains(&lower),
            "{path}: credential in the answer: {answer}"
        );
    }
    let (_pki, broker) = broker_with_upstream().await;
    let answer = call(broker, "/named/v1/name").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("x-safe: kept"), "{answer}");
    assert!(
        !answer
            .to_ascii_lowercase()
            .contains("ghp_headernamecred0123"),
        "credential as a header name in the answer: {answer}"
    );
}

/// Whether `answer` holds the credential, whole or JSON-escaped, in any
/// letter case.
fn holds_credential(answer: &str) -> bool {
    let answer = answer.to_ascii_lowercase().replace("\\/", "/");
    answer.contains(&CREDENTIAL.to_ascii_lowercase())
}

#[tokio::test]
async fn the_credential_echoed_in_a_body_does_not_reach_the_agent() {
    for path in ["/api/v1/page", "/api/v1/json", "/api/v1/split"] {
        let (_pki, broker) = broker_with_upstream().await;
        let answer = call(broker, path).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
        // The page reaches the agent, the credential masked in it.
        assert!(answer.contains("********"), "{path}: {answer}");
        assert!(
            !holds_credential(&answer),
            "{path}: credential in the body: {answer}"
        );
    }
    let (_pki, broker) = broker_with_upstream().await;
    let plain = call(broker, "/api/v1/other").await;
    assert!(
        plain.ends_with("ok"),
        "other bodies pass unchanged: {plain}"
    );
}

/// Whether `answer` holds any 12 bytes of the credential in a row, in
/// any letter case: enough of it to be worth stealing.
fn holds_a_run_of_the_credential(answer: &str) -> Option<String> {
    let answer = answer.to_ascii_lowercase();
    let credential = CREDENTIAL.to_ascii_lowercase();
    (0..=credential.len() - 12)
        .map(|at| credential[at..at + 12].to_string())
        .find(|run| answer.contains(run.as_str()))
}

#[tokio::test]
async fn the_credential_echoed_with_html_escapes_does_not_reach_the_agent() {
    let (_pki, broker) = broker_with_upstream().await;
    let answer = call(broker, "/api/v1/html").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(
        holds_a_run_of_the_credential(&answer),
        None,
        "a run of the credential in the body: {answer}"
    );
}

#[tokio::test]
async fn the_credential_fetched_in_ranges_does_not_reach_the_agent() {
    let (_pki, broker) = broker_with_upstream().await;
    let mut received = String::new();
    for range in ["0-44", "45-"] {
        let answer = call_with(
            broker,
            "/api/v1/range",
            &format!("Range: bytes={range}\r\n"),
        )
        .await;
        assert!(!answer.starts_with("HTTP/1.1 5"), "{range}: {answer}");
        let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
        received.push_str(body);
    }
    assert!(
        !holds_credential(&received),
        "credential pieced together from ranges: {received}"
    );
}

#[tokio::test]
async fn the_credential_under_a_content_coding_does_not_reach_the_agent() {
    let (_pki, broker, seen) = broker_and_upstream().await;
    let answer = call_with(
        broker,
        "/api/v1/coded",
        "Accept-Encoding: x-reverse, gzip\r\n",
    )
    .await;
    let unreversed: String = answer.chars().rev().collect();
    assert!(
        !holds_credential(&unreversed),
        "credential under a content coding: {answer}"
    );
    assert!(
        answer.starts_with("HTTP/1.1 502"),
        "a body the broker cannot read is refused: {answer}"
    );
    // The upstream is asked for bodies the broker can read.
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen, ["identity"], "accept-encoding sent upstream");
}
