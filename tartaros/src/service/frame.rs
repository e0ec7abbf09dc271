//! Frames between the client and a service worker: a 4-byte little-endian
//! length, then that many bytes of JSON. Bounded in size; anything else is
//! an error, never a panic.

use serde::{Deserialize, Serialize};

/// The largest frame either side accepts.
pub const MAX_FRAME: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("failed to read a frame: {0}")]
    Io(#[from] std::io::Error),
    #[error("failed to read a frame: {0} bytes is over the limit of {MAX_FRAME}")]
    TooLarge(usize),
    #[error("failed to decode a frame: {0}")]
    Decode(#[from] serde_json::Error),
    #[error("failed to read a frame: the peer closed the connection")]
    Closed,
}

/// What the client asks for: the arguments of `tartaros run` (after
/// `run`), its working directory and environment. Its stdio travels as
/// SCM_RIGHTS with this frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    pub version: u32,
    pub args: Vec<String>,
    pub cwd: String,
    pub env: Vec<(String, String)>,
}

/// Messages after the request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Message {
    /// Client -> worker: a signal the launcher got, for the agent.
    Signal(i32),
    /// Worker -> client: the run's exit status.
    Exit(i32),
    /// Worker -> client: the request was refused (one line, no secret).
    Refused { code: i32, message: String },
}

pub const VERSION: u32 = 1;

pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, FrameError> {
    let body = serde_json::to_vec(value)?;
    if body.len() > MAX_FRAME {
        return Err(FrameError::TooLarge(body.len()));
    }
    let mut out = (body.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(&body);
    Ok(out)
}

/// Reads one frame from `from` (blocking; the caller sets timeouts).
pub fn read<T: for<'de> Deserialize<'de>>(from: &mut impl std::io::Read) -> Result<T, FrameError> {
    let mut len = [0u8; 4];
    read_exact_or_closed(from, &mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    read_exact_or_closed(from, &mut body)?;
    Ok(serde_json::from_slice(&body)?)
}

/// A message from the other side, fit for one terminal line: control
/// characters (escape sequences, newlines) become `?`, and it is cut at
/// 1,000 characters.
pub fn one_line(message: &str) -> String {
    message
        .chars()
        .take(1000)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

fn read_exact_or_closed(from: &mut impl std::io::Read, buf: &mut [u8]) -> Result<(), FrameError> {
    match from.read_exact(buf) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(FrameError::Closed),
        Err(e) => Err(FrameError::Io(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let request = Request {
            version: VERSION,
            args: vec!["--write".into(), ".".into(), "--".into(), "true".into()],
            cwd: "/w".into(),
            env: vec![("PATH".into(), "/bin".into())],
        };
        let bytes = encode(&request).unwrap();
        let back: Request = read(&mut &bytes[..]).unwrap();
        assert_eq!(back, request);
        let exit = encode(&Message::Exit(3)).unwrap();
        assert_eq!(read::<Message>(&mut &exit[..]).unwrap(), Message::Exit(3));
    }

    #[test]
    fn messages_are_one_safe_line() {
        assert_eq!(one_line("ok\n\x1b[2Jfake"), "ok??[2Jfake");
        assert_eq!(one_line(&"x".repeat(5000)).len(), 1000);
    }

    #[test]
    fn hostile_frames_are_errors() {
        let huge = ((MAX_FRAME + 1) as u32).to_le_bytes();
        assert!(matches!(
            read::<Request>(&mut &huge[..]),
            Err(FrameError::TooLarge(_))
        ));
        let half = [10u8, 0, 0, 0, b'{'];
        assert!(matches!(
            read::<Request>(&mut &half[..]),
            Err(FrameError::Closed)
        ));
        let garbage = [3u8, 0, 0, 0, b'x', b'y', b'z'];
        assert!(matches!(
            read::<Request>(&mut &garbage[..]),
            Err(FrameError::Decode(_))
        ));
        // A claimed identity is an unknown field: refused, never believed.
        let claim = br#"{"version":1,"args":[],"cwd":"/","env":[],"uid":0}"#;
        let mut framed = (claim.len() as u32).to_le_bytes().to_vec();
        framed.extend_from_slice(claim);
        assert!(read::<Request>(&mut &framed[..]).is_err());
        assert!(matches!(
            read::<Request>(&mut &[][..]),
            Err(FrameError::Closed)
        ));
    }
}
