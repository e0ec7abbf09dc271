//! The proxy's decisions, as pure functions: which host names the agent may
//! reach ([`allow`]) and which resolved addresses the proxy may connect to
//! ([`upstream_address_allowed`]).
//!
//! Matching rules (also in `docs/egress.md`):
//! - a host is normalized first: IDNA (UTS #46) to its ASCII/punycode form,
//!   lower case, one trailing dot removed; anything that is not a DNS name
//!   made of letters, digits and `-` is refused;
//! - an exact entry `example.com` matches only `example.com`;
//! - a wildcard `*.example.com` matches every name *below* `example.com`
//!   at any depth (`a.example.com`, `a.b.example.com`) but **not**
//!   `example.com` itself: the apex is often a different service, and a user
//!   who wants both writes both;
//! - IP literals are refused in every spelling a resolver or URL parser
//!   might accept: dotted quads, IPv6 with or without brackets, and the
//!   `inet_aton` forms (`2130706433`, `0x7f.1`, `0177.0.0.1`, `127.1`). A name
//!   whose last label is numeric (or `0x...`) is treated as such a literal,
//!   as the WHATWG URL standard does; no real top-level domain is numeric.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Longest DNS name in text form, without the trailing dot.
const MAX_HOST_LEN: usize = 253;
const MAX_LABEL_LEN: usize = 63;

/// Why a host was refused. The reason strings are fixed text so that a
/// denial never echoes what the agent sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denial {
    EmptyHost,
    HostTooLong,
    InvalidHost,
    IpLiteral,
    NotAllowed,
}

impl Denial {
    pub fn reason(self) -> &'static str {
        match self {
            Denial::EmptyHost => "empty host",
            Denial::HostTooLong => "host name too long",
            Denial::InvalidHost => "not a valid host name",
            Denial::IpLiteral => "IP literals are refused; use a domain name",
            Denial::NotAllowed => "domain not in the allow list",
        }
    }
}

/// The verdict on one host name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Allowed. `host` is the normalized name to resolve and `rule` the
    /// allow-list entry (normalized) that matched.
    Allow {
        host: String,
        rule: String,
    },
    Deny(Denial),
}

impl Decision {
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allow { .. })
    }
}

/// Decides whether `host` (as the agent wrote it: CONNECT authority, URL
/// host, Host header or TLS SNI, without port) matches `allow_list`.
pub fn allow(host: &str, allow_list: &[String]) -> Decision {
    let host = match normalize_host(host) {
        Ok(host) => host,
        Err(denial) => return Decision::Deny(denial),
    };
    for entry in allow_list {
        let Some(pattern) = normalize_pattern(entry) else {
            continue; // the policy validated the list; a bad entry matches nothing
        };
        if pattern_matches(&pattern, &host) {
            return Decision::Allow {
                host,
                rule: pattern,
            };
        }
    }
    Decision::Deny(Denial::NotAllowed)
}

/// Whether a normalized `pattern` (`name` or `*.name`) matches a normalized
/// `host`.
fn pattern_matches(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        // A strict subdomain: longer than the suffix and separated by a dot.
        Some(suffix) => {
            host.len() > suffix.len() + 1
                && host.ends_with(suffix)
                && host.as_bytes()[host.len() - suffix.len() - 1] == b'.'
        }
        None => host == pattern,
    }
}

/// Normalizes an allow-list entry; `None` if it is not a valid pattern.
fn normalize_pattern(entry: &str) -> Option<String> {
    let entry = entry.trim();
    match entry.strip_prefix("*.") {
        Some(rest) => {
            let rest = normalize_host(rest).ok()?;
            // `*.com` would allow a whole top-level domain.
            rest.contains('.').then(|| format!("*.{rest}"))
        }
        None => normalize_host(entry).ok(),
    }
}

/// Normalizes a host name to lower-case ASCII (punycode for IDNs) without
/// a trailing dot, refusing IP literals and anything that is not a DNS name.
pub fn normalize_host(raw: &str) -> Result<String, Denial> {
    if raw.is_empty() {
        return Err(Denial::EmptyHost);
    }
    // Cheap bound before any Unicode work; UTS #46 can only shrink a name
    // by mapping, never by more than this factor in practice.
    if raw.len() > 4 * MAX_HOST_LEN {
        return Err(Denial::HostTooLong);
    }
    if raw.starts_with('[') || raw.contains(':') || raw.parse::<IpAddr>().is_ok() {
        return Err(Denial::IpLiteral);
    }
    let ascii = idna::uts46::Uts46::new()
        .to_ascii(
            raw.as_bytes(),
            idna::uts46::AsciiDenyList::STD3,
            idna::uts46::Hyphens::Allow,
            idna::uts46::DnsLength::Ignore,
        )
        .map_err(|_| Denial::InvalidHost)?;
    let host = ascii
        .strip_suffix('.')
        .unwrap_or(&ascii)
        .to_ascii_lowercase();
    if host.is_empty() {
        return Err(Denial::EmptyHost);
    }
    // IDNA maps full-width digits and dots to ASCII, so look for literals
    // again on the mapped form.
    if host.parse::<IpAddr>().is_ok() || last_label_is_numeric(&host) {
        return Err(Denial::IpLiteral);
    }
    if host.len() > MAX_HOST_LEN {
        return Err(Denial::HostTooLong);
    }
    for label in host.split('.') {
        if label.is_empty()
            || !label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Err(Denial::InvalidHost);
        }
        if label.len() > MAX_LABEL_LEN {
            return Err(Denial::HostTooLong);
        }
    }
    Ok(host)
}

/// Whether the last label is a number in any base `inet_aton` accepts
/// (decimal, octal with a leading 0, hex with `0x`), which makes the whole
/// name an IPv4 literal to many parsers.
fn last_label_is_numeric(host: &str) -> bool {
    let last = host.rsplit('.').next().unwrap_or(host);
    if let Some(hex) = last.strip_prefix("0x") {
        return hex.bytes().all(|b| b.is_ascii_hexdigit());
    }
    !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit())
}

/// Whether the proxy may connect to `ip`, a resolved address of an allowed
/// name. Internal ranges are refused unless `allow_internal`; addresses that
/// are never a valid TCP peer (unspecified, multicast, broadcast, `0/8`,
/// reserved) are refused always.
pub fn upstream_address_allowed(ip: IpAddr, allow_internal: bool) -> bool {
    match classify(ip) {
        Class::Public => true,
        Class::Internal => allow_internal,
        Class::Never => false,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Public,
    /// Loopback, private, link-local (metadata), CGNAT, ULA: reachable only
    /// with `allow_internal`.
    Internal,
    /// Not a unicast peer at all.
    Never,
}

fn classify(ip: IpAddr) -> Class {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    };
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

fn classify_v4(ip: Ipv4Addr) -> Class {
    const NEVER: &[([u8; 4], u32)] = &[
        ([0, 0, 0, 0], 8),   // "this network", incl. 0.0.0.0 (= local host on Linux)
        ([224, 0, 0, 0], 4), // multicast
        ([240, 0, 0, 0], 4), // reserved, incl. 255.255.255.255 broadcast
    ];
    const INTERNAL: &[([u8; 4], u32)] = &[
        ([127, 0, 0, 0], 8),    // loopback
        ([10, 0, 0, 0], 8),     // private
        ([172, 16, 0, 0], 12),  // private
        ([192, 168, 0, 0], 16), // private
        ([169, 254, 0, 0], 16), // link-local, incl. 169.254.169.254 metadata
        ([100, 64, 0, 0], 10),  // CGNAT
        ([192, 0, 0, 0], 24),   // IETF protocol assignments
        ([198, 18, 0, 0], 15),  // benchmarking; also "fake IP" DNS of local proxies
    ];
    // The IPv4 documentation ranges (192.0.2/24, 198.51.100/24,
    // 203.0.113/24, RFC 5737) are left Public on purpose: no real service,
    // internal or external, may live there, so there is nothing for DNS
    // rebinding to reach, and test labs (our runner/) put their stand-ins
    // for public hosts there, inside network namespaces of their own.
    if NEVER.iter().any(|&(net, prefix)| in_v4(ip, net, prefix)) {
        Class::Never
    } else if INTERNAL.iter().any(|&(net, prefix)| in_v4(ip, net, prefix)) {
        Class::Internal
    } else {
        Class::Public
    }
}

fn classify_v6(ip: Ipv6Addr) -> Class {
    let seg = ip.segments();
    let bits = u128::from(ip);
    let low32 = Ipv4Addr::from((bits & 0xffff_ffff) as u32);
    if ip.is_unspecified() || ip.is_multicast() {
        return Class::Never;
    }
    if ip.is_loopback() {
        return Class::Internal;
    }
    // Forms that embed an IPv4 address: judge the embedded address.
    // ::ffff:a.b.c.d (mapped), ::a.b.c.d (compatible, deprecated),
    // ::ffff:0:a.b.c.d (translated), 64:ff9b::/96 (NAT64) and
    // 64:ff9b:1::/48 (local-use NAT64).
    let mapped = bits >> 32 == 0xffff;
    let compatible = bits >> 32 == 0;
    let translated = bits >> 32 == 0xffff_0000;
    let nat64 = bits >> 32 == 0x0064_ff9b_0000_0000_0000_0000;
    let local_nat64 = seg[0] == 0x64 && seg[1] == 0xff9b && seg[2] == 1;
    if mapped || compatible || translated || nat64 || local_nat64 {
        return classify_v4(low32);
    }
    // 6to4 (2002::/16) carries the IPv4 address in bits 16..48.
    if seg[0] == 0x2002 {
        let embedded = Ipv4Addr::from(((u32::from(seg[1])) << 16) | u32::from(seg[2]));
        return classify_v4(embedded);
    }
    // Teredo (2001::/32) hides an obfuscated IPv4 peer; documentation
    // (2001:db8::/32) is never a real peer.
    if seg[0] == 0x2001 && (seg[1] == 0 || seg[1] == 0x0db8) {
        return Class::Never;
    }
    // fc00::/7 unique local, fe80::/10 link-local, fec0::/10 site-local.
    if seg[0] & 0xfe00 == 0xfc00 || seg[0] & 0xffc0 == 0xfe80 || seg[0] & 0xffc0 == 0xfec0 {
        return Class::Internal;
    }
    Class::Public
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> Vec<String> {
        entries.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn allow_table() {
        let allow_list = list(&[
            "example.com",
            "*.pypi.org",
            "Crates.IO.",
            "*.bücher.de",
            "*.com",
            "bad host",
        ]);
        let cases: &[(&str, Result<&str, Denial>)] = &[
            ("example.com", Ok("example.com")),
            ("EXAMPLE.com.", Ok("example.com")),
            ("www.example.com", Err(Denial::NotAllowed)),
            ("example.com.evil.net", Err(Denial::NotAllowed)),
            ("notexample.com", Err(Denial::NotAllowed)),
            ("files.pypi.org", Ok("*.pypi.org")),
            ("a.b.pypi.org", Ok("*.pypi.org")),
            ("pypi.org", Err(Denial::NotAllowed)),
            ("xpypi.org", Err(Denial::NotAllowed)),
            (".pypi.org", Err(Denial::InvalidHost)),
            ("crates.io", Ok("crates.io")),
            ("shop.bücher.de", Ok("*.xn--bcher-kva.de")),
            ("shop.xn--bcher-kva.de", Ok("*.xn--bcher-kva.de")),
            ("SHOP.BÜCHER.DE", Ok("*.xn--bcher-kva.de")),
            // `*.com` is not a valid pattern, so it allows nothing.
            ("anything.com", Err(Denial::NotAllowed)),
            ("", Err(Denial::EmptyHost)),
            (".", Err(Denial::EmptyHost)),
            ("exa mple.com", Err(Denial::InvalidHost)),
            ("exa_mple.com", Err(Denial::InvalidHost)),
            ("a..example.com", Err(Denial::InvalidHost)),
            ("example.com..", Err(Denial::InvalidHost)),
            ("ex%61mple.com", Err(Denial::InvalidHost)),
            ("example.com/x", Err(Denial::InvalidHost)),
            ("user@example.com", Err(Denial::InvalidHost)),
            ("example.com\0", Err(Denial::InvalidHost)),
        ];
        for (host, want) in cases {
            let got = allow(host, &allow_list);
            match want {
                Ok(rule) => assert!(
                    matches!(&got, Decision::Allow { rule: r, .. } if r == rule),
                    "{host:?}: {got:?}, want rule {rule}"
                ),
                Err(denial) => assert_eq!(got, Decision::Deny(*denial), "{host:?}"),
            }
        }
    }

    #[test]
    fn allowed_host_is_normalized() {
        let got = allow("WWW.Bücher.DE.", &list(&["*.bücher.de"]));
        assert_eq!(
            got,
            Decision::Allow {
                host: "www.xn--bcher-kva.de".into(),
                rule: "*.xn--bcher-kva.de".into()
            }
        );
    }

    #[test]
    fn ip_literals_are_refused_in_every_form() {
        // Allow-listing the literal must not help either.
        let allow_list = list(&["127.0.0.1", "*.0.1", "example.com"]);
        for host in [
            "127.0.0.1",
            "127.0.0.1.",
            "2130706433",
            "0x7f000001",
            "0x7f.1",
            "0177.0.0.1",
            "127.1",
            "0",
            "1.2.3.4",
            "example.0x10",
            "example.123",
            "::1",
            "[::1]",
            "[::ffff:127.0.0.1]",
            "fe80::1%eth0",
            "::ffff:169.254.169.254",
            "１２７.０.０.１", // full-width digits, mapped by IDNA
            "127。0。0。1",    // ideographic full stops
        ] {
            assert_eq!(
                allow(host, &allow_list),
                Decision::Deny(Denial::IpLiteral),
                "{host:?}"
            );
        }
        // Numbers are fine inside a name.
        assert!(allow("example.com", &allow_list).is_allowed());
        assert_eq!(
            allow("1password.com", &list(&["1password.com"])),
            Decision::Allow {
                host: "1password.com".into(),
                rule: "1password.com".into()
            }
        );
        assert!(allow("0xdead.example.com", &list(&["*.example.com"])).is_allowed());
    }

    #[test]
    fn overlong_names_are_refused() {
        let label = "a".repeat(63);
        let ok = format!("{label}.{label}.{label}.{}", "b".repeat(61)); // 253
        assert_eq!(ok.len(), 253);
        assert!(allow(&ok, std::slice::from_ref(&ok)).is_allowed());
        let long = format!("x{ok}");
        assert_eq!(
            allow(&long, std::slice::from_ref(&long)),
            Decision::Deny(Denial::HostTooLong)
        );
        let long_label = format!("{}.com", "a".repeat(64));
        assert_eq!(
            allow(&long_label, std::slice::from_ref(&long_label)),
            Decision::Deny(Denial::HostTooLong)
        );
        assert_eq!(
            allow(&"é".repeat(2000), &[]),
            Decision::Deny(Denial::HostTooLong)
        );
    }

    #[test]
    fn wildcard_needs_a_real_suffix() {
        assert!(allow("x.co.uk", &list(&["*.co.uk"])).is_allowed());
        assert_eq!(
            allow("x.com", &list(&["*.com"])),
            Decision::Deny(Denial::NotAllowed)
        );
        assert_eq!(
            allow("x.com", &list(&["*"])),
            Decision::Deny(Denial::NotAllowed)
        );
        assert_eq!(
            allow("x.com", &list(&["*x.com"])),
            Decision::Deny(Denial::NotAllowed)
        );
        assert_eq!(allow("x.com", &[]), Decision::Deny(Denial::NotAllowed));
    }

    #[test]
    fn upstream_address_table() {
        // (address, allowed when allow_internal=false, allowed when true)
        let cases: &[(&str, bool, bool)] = &[
            ("93.184.216.34", true, true),
            ("8.8.8.8", true, true),
            ("2606:4700::1111", true, true),
            ("127.0.0.1", false, true),
            ("127.255.255.254", false, true),
            ("10.1.2.3", false, true),
            ("172.16.0.1", false, true),
            ("172.31.255.255", false, true),
            ("172.32.0.1", true, true),
            ("192.168.1.1", false, true),
            ("169.254.169.254", false, true),
            ("169.254.0.1", false, true),
            ("100.64.0.1", false, true),
            ("100.127.255.255", false, true),
            ("100.128.0.1", true, true),
            ("192.0.0.170", false, true),
            ("198.18.0.1", false, true),
            ("0.0.0.0", false, false),
            ("0.1.2.3", false, false),
            ("224.0.0.1", false, false),
            ("239.255.255.250", false, false),
            ("255.255.255.255", false, false),
            ("240.0.0.1", false, false),
            ("192.0.2.1", true, true),
            ("203.0.113.7", true, true),
            ("::", false, false),
            ("::1", false, true),
            ("fc00::1", false, true),
            ("fd12:3456::1", false, true),
            ("fe80::1", false, true),
            ("febf::1", false, true),
            ("fec0::1", false, true),
            ("ff02::1", false, false),
            ("ff05::2", false, false),
            ("::ffff:127.0.0.1", false, true),
            ("::ffff:169.254.169.254", false, true),
            ("::ffff:10.0.0.1", false, true),
            ("::ffff:0.0.0.0", false, false),
            ("::ffff:8.8.8.8", true, true),
            ("::127.0.0.1", false, true),
            ("::10.0.0.1", false, true),
            ("::ffff:0:127.0.0.1", false, true),
            ("64:ff9b::7f00:1", false, true),
            ("64:ff9b::a9fe:a9fe", false, true),
            ("64:ff9b::808:808", true, true),
            ("64:ff9b:1::a00:1", false, true),
            ("2002:7f00:1::", false, true),
            ("2002:a9fe:a9fe::1", false, true),
            ("2002:808:808::1", true, true),
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", false, false),
            ("2001:db8::1", false, false),
        ];
        for &(addr, strict, internal) in cases {
            let ip: IpAddr = addr.parse().unwrap();
            assert_eq!(
                upstream_address_allowed(ip, false),
                strict,
                "{addr} with allow_internal=false"
            );
            assert_eq!(
                upstream_address_allowed(ip, true),
                internal,
                "{addr} with allow_internal=true"
            );
        }
    }
}
