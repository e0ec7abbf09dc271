//! Adversarial round 9: the injected credential echoed back in an
//! encoding the body scan of round 8 did not know. An upstream that
//! answers with base64 of a document quoting the request (a JWT-like
//! token, a "debug" blob, a JSON field of bytes), its hex dump, UTF-16
//! (which some servers pick from `Accept-Charset`), every character as a
//! `\u00XX` escape, or the user and password of a `Basic` credential
//! decoded, handed the agent the credential: each is a reversible
//! encoding, and the agent decodes it. Asserted on what the agent
//! receives, decoded as an attacker would (leniently, around the masks),
//! never on what the broker reports.

use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use hyper::Response;

#[path = "support/broker_echo.rs"]
mod broker_echo;
#[path = "support/pki.rs"]
mod pki_support;
use broker_echo::{BASIC_PASSWORD, CREDENTIAL, Chunks, broker_with, call_with, header};

/// The page an inspector endpoint answers: the request's `Authorization`
/// quoted, after `pad` spaces (which moves the credential to each of the
/// three alignments of a base64 stream).
fn page(authorization: &str, pad: usize) -> String {
    format!(
        "{}{{\"headers\": {{\"Authorization\": \"{authorization}\"}}}}",
        " ".repeat(pad)
    )
}

/// The upstream's body for `path`, the page in the encoding it names.
fn encoded_page(path: &str, authorization: &str) -> Vec<u8> {
    let std64 = base64::engine::general_purpose::STANDARD;
    let url64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let pad = |path: &str| path.bytes().last().map_or(0, |b| usize::from(b - b'0'));
    let utf16 = |big: bool| -> Vec<u8> {
        page(authorization, 0)
            .encode_utf16()
            .flat_map(|unit| {
                if big {
                    unit.to_be_bytes()
                } else {
                    unit.to_le_bytes()
                }
            })
            .collect()
    };
    match path {
        p if p.starts_with("/v1/base64/") => std64.encode(page(authorization, pad(p))).into(),
        p if p.starts_with("/v1/base64url/") => url64.encode(page(authorization, pad(p))).into(),
        "/v1/hex" => hex::encode(page(authorization, 0)).into(),
        "/v1/HEX" => hex::encode_upper(page(authorization, 0)).into(),
        "/v1/utf16le" => utf16(false),
        "/v1/utf16be" => utf16(true),
        "/v1/uescape" => page(authorization, 0)
            .chars()
            .map(|c| format!("\\u{:04x}", u32::from(c)))
            .collect::<String>()
            .into(),
        // A login check answering with the decoded Basic credential.
        "/v1/whoami" => {
            let decoded = authorization
                .strip_prefix("Basic ")
                .and_then(|b| std64.decode(b).ok())
                .unwrap_or_default();
            let decoded = String::from_utf8_lossy(&decoded).into_owned();
            let (user, password) = decoded.split_once(':').unwrap_or_default();
            format!("{{\"user\": \"{user}\", \"password\": \"{password}\"}}").into()
        }
        _ => b"ok".to_vec(),
    }
}

/// The bytes `text` decodes to under each of the four alignments of a
/// base64 alphabet (`url` for `-_`), a quartet with any other byte (a
/// mask) decoding to `?`: what an attacker recovers around the masks.
fn lenient_base64(text: &[u8], url: bool) -> Vec<u8> {
    let alphabet: &[u8] = if url {
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    } else {
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    };
    let mut out = Vec::new();
    for start in 0..4 {
        for quartet in text.get(start..).unwrap_or_default().chunks(4) {
            let values: Option<Vec<u32>> = quartet
                .iter()
                .map(|b| alphabet.iter().position(|a| a == b).map(|v| v as u32))
                .collect();
            match values {
                Some(v) if v.len() == 4 => {
                    let n = v[0] << 18 | v[1] << 12 | v[2] << 6 | v[3];
                    out.extend([(n >> 16) as u8, (n >> 8) as u8, n as u8]);
                }
                _ => out.extend(b"???"),
            }
        }
        out.push(b'\n');
    }
    out
}

/// `text` read as hex digit pairs at both alignments, `?` for a pair that
/// is not one.
fn lenient_hex(text: &[u8]) -> Vec<u8> {
    let digit = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::new();
    for start in 0..2 {
        for pair in text.get(start..).unwrap_or_default().chunks(2) {
            match (
                pair.first().and_then(|&b| digit(b)),
                pair.get(1).and_then(|&b| digit(b)),
            ) {
                (Some(h), Some(l)) => out.push((h * 16 + l) as u8),
                _ => out.push(b'?'),
            }
        }
        out.push(b'\n');
    }
    out
}

/// Every other byte of `text`, at both alignments (UTF-16 of ASCII).
fn every_other_byte(text: &[u8]) -> Vec<u8> {
    let mut out: Vec<u8> = text.iter().step_by(2).copied().collect();
    out.push(b'\n');
    out.extend(text.iter().skip(1).step_by(2));
    out
}

/// `\u00XX` escapes decoded, other bytes as they are.
fn unescaped(text: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(text);
    let mut out = Vec::new();
    let mut rest = &*text;
    while let Some(at) = rest.find("\\u") {
        out.extend(rest[..at].bytes());
        let code = rest
            .get(at + 2..at + 6)
            .and_then(|h| u32::from_str_radix(h, 16).ok());
        match code.and_then(char::from_u32) {
            Some(c) => {
                out.extend(c.to_string().bytes());
                rest = &rest[at + 6..];
            }
            None => {
                out.push(b'?');
                rest = &rest[at + 2..];
            }
        }
    }
    out.extend(rest.bytes());
    out
}

/// The first 12-byte run of `secret` that `recovered` holds, in any case.
fn run_of(secret: &str, recovered: &[u8]) -> Option<String> {
    let recovered = recovered.to_ascii_lowercase();
    let secret = secret.to_ascii_lowercase();
    let secret = secret.as_bytes();
    secret
        .windows(12)
        .find(|run| recovered.windows(12).any(|w| &w == run))
        .map(|run| String::from_utf8_lossy(run).into_owned())
}

async fn broker() -> (pki_support::TestPki, std::net::SocketAddr) {
    broker_with(Arc::new(|request| {
        let body = encoded_page(request.uri().path(), &header(request, "authorization"));
        Response::new(Chunks::one(Bytes::from(body)))
    }))
    .await
}

/// The body of the broker's answer, with the status line checked.
async fn body_of(broker: std::net::SocketAddr, path: &str) -> Vec<u8> {
    let answer = call_with(broker, path, "").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
    let (_, body) = answer.split_once("\r\n\r\n").unwrap_or_default();
    body.as_bytes().to_vec()
}

#[tokio::test]
async fn the_credential_echoed_in_base64_does_not_reach_the_agent() {
    for pad in 0..3 {
        for (alphabet, url) in [("base64", false), ("base64url", true)] {
            // A broker each: it answers only a few echoes per run.
            let (_pki, broker) = broker().await;
            let path = format!("/api/v1/{alphabet}/{pad}");
            let recovered = lenient_base64(&body_of(broker, &path).await, url);
            assert_eq!(
                run_of(CREDENTIAL, &recovered),
                None,
                "{path}: the agent decodes the credential from {}",
                String::from_utf8_lossy(&recovered)
            );
        }
    }
}

#[tokio::test]
async fn the_credential_echoed_as_hex_does_not_reach_the_agent() {
    let (_pki, broker) = broker().await;
    for path in ["/api/v1/hex", "/api/v1/HEX"] {
        let recovered = lenient_hex(&body_of(broker, path).await);
        assert_eq!(run_of(CREDENTIAL, &recovered), None, "{path}");
    }
}

#[tokio::test]
async fn the_credential_echoed_in_utf16_does_not_reach_the_agent() {
    let (_pki, broker) = broker().await;
    for path in ["/api/v1/utf16le", "/api/v1/utf16be"] {
        let recovered = every_other_byte(&body_of(broker, path).await);
        assert_eq!(run_of(CREDENTIAL, &recovered), None, "{path}");
    }
}

#[tokio::test]
async fn the_credential_echoed_as_unicode_escapes_does_not_reach_the_agent() {
    let (_pki, broker) = broker().await;
    let recovered = unescaped(&body_of(broker, "/api/v1/uescape").await);
    assert_eq!(run_of(CREDENTIAL, &recovered), None);
}

#[tokio::test]
async fn a_basic_credential_echoed_decoded_does_not_reach_the_agent() {
    let (_pki, broker) = broker().await;
    let body = body_of(broker, "/basic/v1/whoami").await;
    let text = String::from_utf8_lossy(&body);
    assert!(
        !text.contains(BASIC_PASSWORD),
        "the decoded Basic password reaches the agent: {text}"
    );
    // The user name is no secret, and the page stays readable.
    assert!(text.contains("deploy-bot"), "{text}");
    // Other bodies pass unchanged.
    assert_eq!(body_of(broker, "/api/v1/other").await, b"ok");
}
