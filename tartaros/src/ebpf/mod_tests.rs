use super::*;

#[test]
fn mapped_v6_grant_is_an_ipv4_key() {
    let g = ConnectGrant {
        addr: "::ffff:127.0.0.1".parse().unwrap(),
        port: 80,
    };
    assert_eq!(g.key(), AllowKey::v4([127, 0, 0, 1], 80));
    let g = ConnectGrant {
        addr: "::1".parse().unwrap(),
        port: 80,
    };
    assert_eq!(g.key().family, tartaros_common::AF_INET6);
}

#[test]
fn parse_event_roundtrip() {
    let mut ev = ConnectEvent::ZERO;
    ev.kind = kind::CONNECT4;
    ev.family = tartaros_common::AF_INET;
    ev.port = 8080;
    ev.addr[..4].copy_from_slice(&[127, 0, 0, 1]);
    // SAFETY: ConnectEvent is plain data without padding.
    let bytes = unsafe {
        std::slice::from_raw_parts((&raw const ev).cast::<u8>(), size_of::<ConnectEvent>())
    };
    let back = parse_event(bytes).unwrap();
    assert_eq!(back, ev);
    assert_eq!(
        event_destination(&back),
        Some("127.0.0.1:8080".parse().unwrap())
    );
    assert!(parse_event(&bytes[..10]).is_none());
    let mut capture = bytes.to_vec();
    capture[28..30].copy_from_slice(&tartaros_common::capture::record::EXEC.to_ne_bytes());
    assert!(
        parse_event(&capture).is_none(),
        "capture records are not connect events"
    );
}

#[test]
fn embedded_object_has_all_programs() {
    let text = String::from_utf8_lossy(EBPF_OBJECT);
    let sections = SOCK_ADDR_PROGRAMS
        .iter()
        .map(|n| format!("cgroup/{n}"))
        .chain([format!("cgroup/{SOCK_CREATE_PROGRAM}"), "sockops".into()])
        .chain(TP_BTF_PROGRAMS.iter().map(|n| format!("tp_btf/{n}")))
        .chain(
            UNIX_PROGRAMS
                .iter()
                .map(|p| format!("cgroup/connect4/{}", p.name)),
        );
    for section in sections {
        assert!(text.contains(&section), "{section} missing from the object");
    }
}

#[test]
fn default_options_capture_nothing_and_use_a_big_ring() {
    let o = AttachOptions::default();
    assert!(o.transparent_port.is_none());
    assert!(!o.capture && !o.unix_policy && o.grants.is_empty());
    assert!(o.ring_bytes.is_power_of_two() && o.ring_bytes >= 4096);
}
