//! Recognizing what a transparently intercepted connection asks for, from
//! its first bytes: the server name of a TLS ClientHello (SNI) or the Host
//! header of an HTTP/1 request. Pure, bounds-checked parsers over a byte
//! prefix; every slice access goes through [`Reader`], which never panics.

/// The most the proxy buffers before deciding. A ClientHello is one
/// handshake message of at most a few KiB in practice (post-quantum key
/// shares included); HTTP request heads are similar.
pub const MAX_SNIFF: usize = 32 * 1024;

/// What the first bytes of a connection say about its destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sniffed {
    /// More bytes are needed to decide.
    Incomplete,
    /// A TLS ClientHello; `sni` is its server name, if it has one.
    Tls { sni: Option<String> },
    /// An HTTP/1 request head; `host` is its single Host header, or the
    /// authority of an absolute-form target (they must agree).
    Http { host: Option<String> },
    /// Neither, or a malformed or ambiguous version of either. The text is
    /// fixed (never attacker input).
    Refused(&'static str),
}

/// Classifies a connection from the bytes received so far.
pub fn sniff(buf: &[u8]) -> Sniffed {
    match buf.first() {
        None => Sniffed::Incomplete,
        Some(0x16) => match client_hello_sni(buf) {
            Hello::Incomplete => Sniffed::Incomplete,
            Hello::Sni(sni) => Sniffed::Tls { sni },
            Hello::Malformed(why) => Sniffed::Refused(why),
        },
        Some(b) if b.is_ascii_uppercase() => http_host(buf),
        Some(_) => Sniffed::Refused("neither TLS nor HTTP"),
    }
}

/// A cursor over a byte slice that reports running off the end instead of
/// panicking.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let out = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(out)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    /// A length-prefixed vector (prefix of 1 or 2 bytes).
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = usize::from(self.u8()?);
        self.take(n)
    }

    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(n)
    }

    fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Hello {
    Incomplete,
    Sni(Option<String>),
    Malformed(&'static str),
}

const RECORD_HANDSHAKE: u8 = 0x16;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXT_SERVER_NAME: usize = 0;
const NAME_TYPE_HOST: u8 = 0;

/// Reassembles the first handshake message from TLS records (it may span
/// several) and extracts the SNI from it.
fn client_hello_sni(buf: &[u8]) -> Hello {
    let mut records = Reader::new(buf);
    let mut handshake = Vec::new();
    loop {
        let Some(header) = records.take(5) else {
            return Hello::Incomplete;
        };
        if header[0] != RECORD_HANDSHAKE {
            return Hello::Malformed("TLS record that is not a handshake");
        }
        if header[1] != 3 {
            return Hello::Malformed("unknown TLS record version");
        }
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if len == 0 || len > 16384 + 2048 {
            return Hello::Malformed("bad TLS record length");
        }
        let Some(fragment) = records.take(len) else {
            return Hello::Incomplete;
        };
        handshake.extend_from_slice(fragment);
        if handshake.len() < 4 {
            continue;
        }
        if handshake[0] != HANDSHAKE_CLIENT_HELLO {
            return Hello::Malformed("first TLS message is not a ClientHello");
        }
        let body_len = (usize::from(handshake[1]) << 16)
            | (usize::from(handshake[2]) << 8)
            | usize::from(handshake[3]);
        if body_len > MAX_SNIFF {
            return Hello::Malformed("ClientHello too large");
        }
        if handshake.len() - 4 >= body_len {
            return parse_client_hello(&handshake[4..4 + body_len]);
        }
        if records.is_empty() {
            return Hello::Incomplete;
        }
    }
}

/// Parses a complete ClientHello body (RFC 8446 4.1.2) for its server name.
fn parse_client_hello(body: &[u8]) -> Hello {
    let malformed = Hello::Malformed("malformed ClientHello");
    let mut r = Reader::new(body);
    // legacy_version, random, legacy_session_id, cipher_suites,
    // legacy_compression_methods
    if r.take(2 + 32).is_none() || r.vec8().is_none() || r.vec16().is_none() || r.vec8().is_none() {
        return malformed;
    }
    if r.is_empty() {
        return Hello::Sni(None); // no extensions at all (old clients)
    }
    let Some(extensions) = r.vec16() else {
        return malformed;
    };
    if !r.is_empty() {
        return malformed;
    }
    let mut exts = Reader::new(extensions);
    let mut sni = None;
    let mut seen = Vec::new();
    while !exts.is_empty() {
        let (Some(kind), Some(data)) = (exts.u16(), exts.vec16()) else {
            return malformed;
        };
        // Duplicate extensions are illegal and would let two parsers disagree.
        if seen.contains(&kind) {
            return Hello::Malformed("duplicate TLS extension");
        }
        seen.push(kind);
        if kind == EXT_SERVER_NAME {
            match parse_server_name(data) {
                Ok(name) => sni = Some(name),
                Err(why) => return Hello::Malformed(why),
            }
        }
    }
    Hello::Sni(sni)
}

/// The `server_name` extension (RFC 6066 3): exactly one host_name entry.
fn parse_server_name(data: &[u8]) -> Result<String, &'static str> {
    let malformed = "malformed server_name extension";
    let mut r = Reader::new(data);
    let list = r.vec16().ok_or(malformed)?;
    if !r.is_empty() {
        return Err(malformed);
    }
    let mut entries = Reader::new(list);
    let mut name = None;
    while !entries.is_empty() {
        let kind = entries.u8().ok_or(malformed)?;
        let value = entries.vec16().ok_or(malformed)?;
        if kind == NAME_TYPE_HOST {
            if name.is_some() {
                return Err("more than one server name");
            }
            name = Some(value);
        }
    }
    let name = name.ok_or(malformed)?;
    if name.is_empty() || !name.iter().all(|b| b.is_ascii_graphic()) {
        return Err("server name is not a host name");
    }
    String::from_utf8(name.to_vec()).map_err(|_| "server name is not a host name")
}

/// The hosts a complete HTTP/1 request head names (an absolute-form
/// target's authority, then each Host header), joined with `, `: for the
/// record of a head refused for naming them ambiguously (two Host headers,
/// a Host other than the target), which must still say where the agent
/// tried to go (adversarial round 11). `None` for anything else.
pub fn hosts_named_in_http(buf: &[u8]) -> Option<String> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    let Ok(httparse::Status::Complete(_)) = request.parse(buf) else {
        return None;
    };
    // A CONNECT's target is an authority (`host:port`), the host it
    // names (adversarial round 24a: its record had no host).
    let target = match request.method {
        Some(m) if m.eq_ignore_ascii_case("CONNECT") => request.path,
        _ => request.path.and_then(absolute_form_authority),
    };
    let hosts = request
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("host"))
        .map(|h| String::from_utf8_lossy(h.value).trim().to_string());
    let named: Vec<String> = target
        .map(str::to_string)
        .into_iter()
        .chain(hosts)
        .collect();
    (!named.is_empty()).then(|| named.join(", "))
}

/// Parses an HTTP/1 request head for its target host.
fn http_host(buf: &[u8]) -> Sniffed {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(buf) {
        Ok(httparse::Status::Partial) => {
            if buf.len() >= MAX_SNIFF {
                Sniffed::Refused("HTTP request head too large")
            } else {
                Sniffed::Incomplete
            }
        }
        Err(httparse::Error::TooManyHeaders) => Sniffed::Refused("too many HTTP headers"),
        Err(_) => Sniffed::Refused("neither TLS nor HTTP"),
        Ok(httparse::Status::Complete(_)) => {
            if request.method == Some("CONNECT") {
                return Sniffed::Refused("CONNECT sent to the transparent listener");
            }
            let hosts: Vec<_> = request
                .headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case("host"))
                .collect();
            let host = match hosts.as_slice() {
                [] => None,
                [h] => match std::str::from_utf8(h.value) {
                    Ok(v) => Some(v.trim().to_string()),
                    Err(_) => return Sniffed::Refused("Host header is not text"),
                },
                _ => return Sniffed::Refused("more than one Host header"),
            };
            let path = request.path.unwrap_or("/");
            if let Some(target) = absolute_form_authority(path) {
                match &host {
                    Some(h) if !h.eq_ignore_ascii_case(target) => {
                        return Sniffed::Refused("Host header does not match the request target");
                    }
                    Some(_) => {}
                    None => {
                        return Sniffed::Http {
                            host: Some(target.to_string()),
                        };
                    }
                }
            }
            Sniffed::Http { host }
        }
    }
}

/// The authority of an absolute-form request target (`http://a.b:80/x`).
fn absolute_form_authority(target: &str) -> Option<&str> {
    let lower = target.get(..8).map(str::to_ascii_lowercase);
    let rest = match lower.as_deref() {
        Some(p) if p.starts_with("http://") => &target[7..],
        Some("https://") => &target[8..],
        _ => return None,
    };
    Some(rest.split(['/', '?', '#']).next().unwrap_or(rest))
}

/// Splits `host[:port]` as found in a Host header or authority; `None` if
/// the port is not a number. IPv6 literals keep their brackets (and are
/// refused later as literals).
pub fn split_host_port(authority: &str) -> Option<(&str, Option<u16>)> {
    if authority.starts_with('[') {
        let end = authority.find(']')?;
        let (host, rest) = authority.split_at(end + 1);
        return match rest.strip_prefix(':') {
            Some(port) => Some((host, Some(port.parse().ok()?))),
            None if rest.is_empty() => Some((host, None)),
            None => None,
        };
    }
    match authority.rsplit_once(':') {
        Some((host, port)) => Some((host, Some(port.parse().ok()?))),
        None => Some((authority, None)),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds a ClientHello record with the given extensions
    /// (`(type, data)`), split into records of at most `record_size` bytes.
    pub(crate) fn client_hello(extensions: &[(u16, Vec<u8>)], record_size: usize) -> Vec<u8> {
        let mut exts = Vec::new();
        for (kind, data) in extensions {
            exts.extend_from_slice(&kind.to_be_bytes());
            exts.extend_from_slice(&(data.len() as u16).to_be_bytes());
            exts.extend_from_slice(data);
        }
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.push(32);
        body.extend_from_slice(&[9; 32]);
        body.extend_from_slice(&[0, 4, 0x13, 0x01, 0x13, 0x02]);
        body.extend_from_slice(&[1, 0]);
        body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        body.extend_from_slice(&exts);
        let mut handshake = vec![HANDSHAKE_CLIENT_HELLO];
        handshake.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        handshake.extend_from_slice(&body);
        let mut out = Vec::new();
        for chunk in handshake.chunks(record_size) {
            out.extend_from_slice(&[RECORD_HANDSHAKE, 3, 1]);
            out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
            out.extend_from_slice(chunk);
        }
        out
    }

    pub(crate) fn sni_ext(names: &[(u8, &[u8])]) -> (u16, Vec<u8>) {
        let mut list = Vec::new();
        for (kind, name) in names {
            list.push(*kind);
            list.extend_from_slice(&(name.len() as u16).to_be_bytes());
            list.extend_from_slice(name);
        }
        let mut data = (list.len() as u16).to_be_bytes().to_vec();
        data.extend_from_slice(&list);
        (0, data)
    }

    fn tls(sni: Option<&str>) -> Sniffed {
        Sniffed::Tls {
            sni: sni.map(str::to_string),
        }
    }

    #[test]
    fn sni_is_found() {
        let alpn = (16u16, vec![0, 3, 2, b'h', b'2']);
        let hello = client_hello(&[alpn.clone(), sni_ext(&[(0, b"example.com")])], 16384);
        assert_eq!(sniff(&hello), tls(Some("example.com")));
        // The same message split over many small records.
        let split = client_hello(&[alpn, sni_ext(&[(0, b"example.com")])], 7);
        assert_eq!(sniff(&split), tls(Some("example.com")));
    }

    #[test]
    fn no_sni_is_reported() {
        assert_eq!(
            sniff(&client_hello(&[(16, vec![0, 3, 2, b'h', b'2'])], 16384)),
            tls(None)
        );
        assert_eq!(sniff(&client_hello(&[], 16384)), tls(None));
    }

    #[test]
    fn every_prefix_is_incomplete_never_a_panic() {
        let hello = client_hello(&[sni_ext(&[(0, b"a.example.com")])], 11);
        for end in 0..hello.len() {
            assert_eq!(sniff(&hello[..end]), Sniffed::Incomplete, "prefix {end}");
        }
        assert_eq!(sniff(&hello), tls(Some("a.example.com")));
    }

    #[test]
    fn ambiguous_or_broken_hellos_are_refused() {
        let two_names = client_hello(&[sni_ext(&[(0, b"a.com"), (0, b"b.com")])], 16384);
        assert_eq!(
            sniff(&two_names),
            Sniffed::Refused("more than one server name")
        );
        let two_exts = client_hello(
            &[sni_ext(&[(0, b"a.com")]), sni_ext(&[(0, b"b.com")])],
            16384,
        );
        assert_eq!(
            sniff(&two_exts),
            Sniffed::Refused("duplicate TLS extension")
        );
        let empty = client_hello(&[sni_ext(&[(0, b"")])], 16384);
        assert!(matches!(sniff(&empty), Sniffed::Refused(_)));
        let binary = client_hello(&[sni_ext(&[(0, b"a\0b.com")])], 16384);
        assert!(matches!(sniff(&binary), Sniffed::Refused(_)));
        let not_hello = [0x16, 3, 1, 0, 4, 2, 0, 0, 0];
        assert!(matches!(sniff(&not_hello), Sniffed::Refused(_)));
        let alert = [0x15, 3, 1, 0, 2, 2, 40];
        assert!(matches!(sniff(&alert), Sniffed::Refused(_)));
        let mut bad_version = client_hello(&[], 16384);
        bad_version[1] = 9;
        assert!(matches!(sniff(&bad_version), Sniffed::Refused(_)));
    }

    #[test]
    fn garbage_never_panics() {
        // A small deterministic generator (xorshift), no extra crates.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let hello = client_hello(
            &[
                sni_ext(&[(0, b"example.com")]),
                (16, vec![0, 3, 2, b'h', b'2']),
            ],
            16384,
        );
        for _ in 0..20_000 {
            let mut input = hello.clone();
            // Flip a few bytes, or truncate, or both.
            for _ in 0..(next() % 4) {
                let i = (next() as usize) % input.len();
                input[i] = next() as u8;
            }
            if next() % 2 == 0 {
                let end = (next() as usize) % (input.len() + 1);
                input.truncate(end);
            }
            let _ = sniff(&input);
        }
        for _ in 0..5_000 {
            let len = (next() % 600) as usize;
            let input: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let _ = sniff(&input);
            let mut tls = vec![0x16, 3, 1];
            tls.extend_from_slice(&input);
            let _ = sniff(&tls);
        }
    }

    #[test]
    fn hosts_named_by_a_refused_head_are_listed() {
        let named = |head: &str| hosts_named_in_http(head.as_bytes());
        assert_eq!(
            named("GET / HTTP/1.1\r\nHost: a.test\r\nHost: evil.test\r\n\r\n").as_deref(),
            Some("a.test, evil.test")
        );
        assert_eq!(
            named("GET http://evil.test:81/x HTTP/1.1\r\nHost: a.test\r\n\r\n").as_deref(),
            Some("evil.test:81, a.test")
        );
        assert_eq!(
            named("CONNECT evil.test:443 HTTP/1.1\r\n\r\n").as_deref(),
            Some("evil.test:443")
        );
        assert_eq!(named("GET / HTTP/1.1\r\n\r\n"), None);
        assert_eq!(named("GET / HTTP/1.1\r\nHost: a.test\r\n"), None);
        assert_eq!(named("\x16\x03\x01"), None);
    }

    #[test]
    fn http_host_is_found() {
        let http = |s: &str| sniff(s.as_bytes());
        let host = |h: &str| Sniffed::Http {
            host: Some(h.to_string()),
        };
        assert_eq!(
            http("GET / HTTP/1.1\r\nHost: example.com\r\n\r\n"),
            host("example.com")
        );
        assert_eq!(
            http("GET / HTTP/1.1\r\nhOsT:  example.com:8080 \r\nA: b\r\n\r\n"),
            host("example.com:8080")
        );
        assert_eq!(
            http("GET / HTTP/1.1\r\nHost: example.com\r\n"),
            Sniffed::Incomplete
        );
        assert_eq!(http("GET / HTTP/1.0\r\n\r\n"), Sniffed::Http { host: None });
        assert_eq!(http("GET http://a.com/x HTTP/1.1\r\n\r\n"), host("a.com"));
        assert_eq!(
            http("GET http://a.com/x HTTP/1.1\r\nHost: A.com\r\n\r\n"),
            host("A.com")
        );
        assert_eq!(
            http("GET http://a.com/x HTTP/1.1\r\nHost: b.com\r\n\r\n"),
            Sniffed::Refused("Host header does not match the request target")
        );
        assert_eq!(
            http("GET / HTTP/1.1\r\nHost: a.com\r\nHost: b.com\r\n\r\n"),
            Sniffed::Refused("more than one Host header")
        );
        assert!(matches!(
            http("CONNECT a.com:443 HTTP/1.1\r\n\r\n"),
            Sniffed::Refused(_)
        ));
        assert!(matches!(http("GARBAGE\0\r\n\r\n"), Sniffed::Refused(_)));
        assert!(matches!(
            sniff(b"SSH-2.0-OpenSSH_9.6\r\n"),
            Sniffed::Refused(_)
        ));
        assert!(matches!(sniff(&[0u8; 10]), Sniffed::Refused(_)));
        let huge = format!("GET / HTTP/1.1\r\nX: {}", "a".repeat(MAX_SNIFF));
        assert!(matches!(http(&huge), Sniffed::Refused(_)));
    }

    #[test]
    fn host_port_split() {
        assert_eq!(split_host_port("a.com"), Some(("a.com", None)));
        assert_eq!(split_host_port("a.com:443"), Some(("a.com", Some(443))));
        assert_eq!(split_host_port("a.com:x"), None);
        assert_eq!(split_host_port("a.com:99999"), None);
        assert_eq!(split_host_port("[::1]:80"), Some(("[::1]", Some(80))));
        assert_eq!(split_host_port("[::1]"), Some(("[::1]", None)));
        assert_eq!(split_host_port("[::1]x"), None);
        // An unbracketed IPv6 literal splits oddly; its host part still
        // holds a ':' and is refused as a literal by `normalize_host`.
        assert!(split_host_port("::1").is_none_or(|(h, _)| h.contains(':')));
    }
}
