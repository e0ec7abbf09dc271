//! Adversarial round 9: the body scan's masks as an oracle. The broker
//! masks every run of 12 bytes of an injected value in a response (round
//! 8), also when the agent wrote it: an upstream that quotes the agent's
//! words back (an error naming a bad parameter) masks them exactly when
//! they are a run of the credential. An agent that knows 11 bytes of it
//! in a row (`Bearer ghp_`: the scheme and GitHub's public prefix; many
//! API keys have longer public prefixes) tries each character as the
//! 12th until one comes back masked, then slides on: the credential, a
//! byte per masking, about 40 requests a byte. Asserted on what the agent
//! can rebuild from the answers it gets.

use std::sync::Arc;

use bytes::Bytes;
use hyper::Response;

#[path = "support/broker_echo.rs"]
mod broker_echo;
#[path = "support/pki.rs"]
mod pki_support;
use broker_echo::{CREDENTIAL, Chunks, broker_with, call_with};

/// What the agent knows at the start: the scheme and the token's public
/// prefix.
const KNOWN: &str = "Bearer ghp_";
const CANDIDATES: &str = "abcdefghijklmnopqrstuvwxyz0123456789_-+/=.";

/// `text` with every byte but letters and digits as `%XX`.
fn escaped(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// `%XX` escapes decoded.
fn unescaped(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn masked_echoes_of_the_agents_guesses_do_not_spell_the_credential() {
    // An upstream that quotes the query it got in an error.
    let (_pki, broker) = broker_with(Arc::new(|request| {
        let query = unescaped(request.uri().query().unwrap_or_default());
        Response::new(Chunks::one(Bytes::from(format!(
            "{{\"error\": \"unknown parameter '{query}'\"}}\n"
        ))))
    }))
    .await;
    let mut known = KNOWN.to_string();
    let mut refused = false;
    'bytes: for _ in 0..12 {
        let window = &known[known.len() - 11..];
        for candidate in CANDIDATES.chars() {
            let guess = format!("{window}{candidate}");
            let answer = call_with(broker, &format!("/api/v1/x?{}", escaped(&guess)), "").await;
            if !answer.starts_with("HTTP/1.1 200") {
                refused = true;
                break 'bytes;
            }
            if answer.contains("'************'") {
                known.push(candidate);
                continue 'bytes;
            }
        }
        break;
    }
    let learned = &known[KNOWN.len()..];
    eprintln!("learned {learned:?}, then refused: {refused}");
    let secret = CREDENTIAL[4..].to_ascii_lowercase();
    assert!(
        secret.starts_with(learned),
        "the oracle is sound: {learned:?}"
    );
    assert!(
        learned.len() <= 3,
        "the agent rebuilt {} bytes of the credential from masked echoes: {learned:?}",
        learned.len()
    );
    assert!(refused, "the broker went on answering");
}
