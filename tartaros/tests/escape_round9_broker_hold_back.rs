//! Adversarial round 9: the body scan as an oracle. To find a credential
//! split over two chunks, the broker held back the end of a chunk that
//! could begin one of its forms, and passed everything else on at once.
//! So what it held depended on the secret: an upstream that streams the
//! agent's own words back (an echo endpoint, a model repeating a prompt)
//! and then pauses showed the agent, by what arrived before the pause,
//! whether its words ended with the start of the credential (or any run
//! of it). One guess per character and position rebuilds it: 64 requests
//! a character, the right one the only one held. Asserted on the bytes
//! the agent receives before the pause, for a true and a false guess.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::Response;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[path = "support/broker_echo.rs"]
mod broker_echo;
#[path = "support/pki.rs"]
mod pki_support;
use broker_echo::{Chunks, TOKEN, broker_with};

/// How long the upstream waits before the end of its answer.
const PAUSE: Duration = Duration::from_secs(3);

/// The bytes of the broker's answer to `GET /api/v1/echo?<guess>` that
/// arrive within the first second (the upstream echoes the query, then
/// pauses).
async fn before_the_pause(broker: std::net::SocketAddr, guess: &str) -> Vec<u8> {
    let request = format!(
        "GET /api/v1/echo?{guess} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Broker-Auth: {TOKEN}\r\n\r\n"
    );
    let mut stream = TcpStream::connect(broker).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let until = Instant::now() + Duration::from_secs(1);
    let mut buf = [0u8; 4096];
    while let Ok(Ok(n)) = tokio::time::timeout(
        until.saturating_duration_since(Instant::now()),
        stream.read(&mut buf),
    )
    .await
    {
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
    }
    seen
}

/// How many leading bytes of `guess` are in the body part of `seen`.
fn shown(guess: &str, seen: &[u8]) -> usize {
    let body = seen
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(&[][..], |at| &seen[at + 4..]);
    let guess = guess.as_bytes();
    (1..=guess.len())
        .rev()
        .find(|&k| body.windows(k).any(|w| w == &guess[..k]))
        .unwrap_or(0)
}

#[tokio::test]
async fn what_the_broker_holds_back_does_not_depend_on_the_secret() {
    let (_pki, broker) = broker_with(Arc::new(|request| {
        let echo = request.uri().query().unwrap_or_default().to_string();
        Response::new(Chunks::paused(
            Bytes::from(format!("you said: {echo}")),
            PAUSE,
            Bytes::from_static(b"\n"),
        ))
    }))
    .await;
    // The credential is `ghp_Up5treamCred/9f8e+7d==`; `ghp_` is public
    // (GitHub's token prefix), the rest is what the agent is after.
    let guesses = ["ghp_Up5t", "ghp_Xp5t", "zzzzzzzz"];
    let mut shown_of = Vec::new();
    for guess in guesses {
        let seen = before_the_pause(broker, guess).await;
        assert!(
            seen.starts_with(b"HTTP/1.1 200"),
            "{guess}: {}",
            String::from_utf8_lossy(&seen)
        );
        shown_of.push(shown(guess, &seen));
    }
    assert!(
        shown_of.iter().all(|&n| n == shown_of[0]),
        "before the pause the agent saw {shown_of:?} bytes of its guesses {guesses:?}: \
         what is held back tells the secret"
    );
}
