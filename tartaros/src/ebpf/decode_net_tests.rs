//! Records of the connect and unix programs' notes (adversarial round 10).

use super::*;

/// A `sendmmsg` that sent messages before a filter refused one: its
/// record is allowed and names only where they went; the refusal is a
/// denied record of its own (adversarial round 10). Before, the refused
/// destination was listed in the allowed record's `destinations`, or was
/// its `addr` when the first message named none.
#[test]
fn a_sendmmsg_refused_after_sending_gets_a_denied_record() {
    let note = |addr: [u8; 4], port: u16, v: u16| {
        let mut n = ConnectEvent::ZERO;
        (n.kind, n.family, n.port) = (kind::SENDMSG4, AF_INET, port);
        n.verdict = v | verdict::DESTINATION_NOTE;
        n.pid = std::process::id();
        n.addr[..4].copy_from_slice(&addr);
        n
    };
    let mut v4 = vec![0u8; 16];
    v4[..2].copy_from_slice(&AF_INET.to_ne_bytes());
    v4[2..4].copy_from_slice(&9000u16.to_be_bytes());
    v4[4..8].copy_from_slice(&[127, 0, 0, 1]);
    let mmsg = |ret: i64, flags: u32| {
        let mut e = addr_event(effect::SENDTO, ret, &v4);
        (e.sys.nr, e.sys.args[1], e.sys.header.flags) = (nr::SENDMMSG, 2, flags);
        e
    };
    let mut d = Decoder::new();
    for n in [
        note([127, 0, 0, 1], 9000, verdict::ALLOW),
        note([192, 0, 2, 53], 53, verdict::DENY),
    ] {
        assert!(matches!(d.decode(&bytes_of(&n)), Decoded::Skip));
    }
    let e = effect_of(&mut d, &bytes_of(&mmsg(1, 0)));
    let t = target(&e);
    assert_eq!(e.decision, Decision::Allowed);
    assert_eq!((&t["addr"], &t["sent"]), (&"127.0.0.1".into(), &1.into()));
    assert!(!t.contains_key("destinations"), "{t:?}");
    let r = d.take_refusal().expect("a record of the refused message");
    let rt = target(&r);
    assert_eq!(
        (r.kind, r.errno, r.pid),
        ("sendto", EPERM, std::process::id())
    );
    assert_eq!(
        (&rt["addr"], &rt["port"]),
        (&"192.0.2.53".into(), &53.into())
    );
    assert_eq!((&rt["message"], &rt["messages"]), (&1.into(), &2.into()));
    assert!(d.take_refusal().is_none());

    // The first message went to the connected peer (no name, no note):
    // the call's record is dropped as before, the refusal is kept.
    let n = note([192, 0, 2, 53], 53, verdict::DENY);
    assert!(matches!(d.decode(&bytes_of(&n)), Decoded::Skip));
    let unnamed = mmsg(1, flag::ADDR_UNREADABLE);
    assert!(matches!(d.decode(&bytes_of(&unnamed)), Decoded::Skip));
    assert_eq!(
        target(&d.take_refusal().expect("kept"))["addr"],
        "192.0.2.53"
    );

    // Refused first: the call failed, its own record is the refusal.
    let n = note([192, 0, 2, 53], 53, verdict::DENY);
    assert!(matches!(d.decode(&bytes_of(&n)), Decoded::Skip));
    let e = effect_of(&mut d, &bytes_of(&mmsg(-1, 0)));
    assert_eq!(
        (e.decision, &target(&e)["addr"]),
        (Decision::Denied, &"192.0.2.53".into())
    );
    assert!(d.take_refusal().is_none());

    // Unix: the same for a name outside the allowed directories.
    let unix_note = |p: &[u8], v: u16| {
        let mut path = [0u8; UNIX_PATH_BYTES];
        path[..p.len()].copy_from_slice(p);
        UnixEvent {
            header: header(record::UNIX, effect::SENDTO),
            hook: unix_hook::SENDMSG,
            verdict: v | unix_verdict::DESTINATION_NOTE,
            addr_len: 2 + p.len() as u32,
            path,
        }
    };
    for n in [
        unix_note(b"/w/rx.sock", unix_verdict::ALLOW),
        unix_note(b"/run/x.sock", unix_verdict::DENY),
    ] {
        assert!(matches!(d.decode(&bytes_of(&n)), Decoded::Skip));
    }
    let mut un = AF_UNIX.to_ne_bytes().to_vec();
    un.extend_from_slice(b"/w/rx.sock\0");
    let mut e = addr_event(effect::SENDTO, 1, &un);
    (e.sys.nr, e.sys.args[1]) = (nr::SENDMMSG, 2);
    let e = effect_of(&mut d, &bytes_of(&e));
    assert_eq!(target(&e)["path"], "/w/rx.sock");
    let r = d
        .take_refusal()
        .expect("a record of the refused unix message");
    assert_eq!(
        (r.decision, &target(&r)["path"]),
        (Decision::Denied, &"/run/x.sock".into())
    );
    assert_eq!(
        target(&r)["reason"],
        "outside the allowed socket directories"
    );

    // A relative name is refused too, and is no destination of the call's
    // record: the refusal keeps it as the kernel copied it.
    for n in [
        unix_note(b"/w/rx.sock", unix_verdict::ALLOW),
        unix_note(b"rel.sock", unix_verdict::DENY_RELATIVE),
    ] {
        assert!(matches!(d.decode(&bytes_of(&n)), Decoded::Skip));
    }
    let mut e = addr_event(effect::SENDTO, 1, &un);
    (e.sys.nr, e.sys.args[1]) = (nr::SENDMMSG, 2);
    let e = effect_of(&mut d, &bytes_of(&e));
    assert_eq!(target(&e)["path"], "/w/rx.sock");
    let r = d.take_refusal().expect("a record of the relative name");
    assert_eq!(
        (&target(&r)["path"], &target(&r)["reason"]),
        (&"rel.sock".into(), &"relative socket path".into())
    );
}

/// A connect the connect program sent to the transparent proxy says so
/// in the syscall's record, as in the program's own record without
/// capture: before, with capture on, it read as an allowed connection to
/// the address, which nothing reached (adversarial round 10).
#[test]
fn a_redirected_connect_is_marked_transparent_in_the_syscalls_record() {
    let mut d = Decoder::new();
    let mut note = ConnectEvent::ZERO;
    (note.kind, note.family, note.port) = (kind::CONNECT4, AF_INET, 80);
    note.verdict = verdict::REDIRECT | verdict::DESTINATION_NOTE;
    note.pid = std::process::id();
    note.addr[..4].copy_from_slice(&[192, 0, 2, 9]);
    assert!(matches!(d.decode(&bytes_of(&note)), Decoded::Skip));
    let mut v4 = vec![0u8; 16];
    v4[..2].copy_from_slice(&AF_INET.to_ne_bytes());
    v4[2..4].copy_from_slice(&80u16.to_be_bytes());
    v4[4..8].copy_from_slice(&[192, 0, 2, 9]);
    let e = effect_of(&mut d, &bytes_of(&addr_event(effect::CONNECT, -115, &v4)));
    let t = target(&e);
    assert_eq!(
        (&t["addr"], &t["transparent"]),
        (&"192.0.2.9".into(), &true.into())
    );
    // An allowed one is not.
    note.verdict = verdict::ALLOW | verdict::DESTINATION_NOTE;
    assert!(matches!(d.decode(&bytes_of(&note)), Decoded::Skip));
    let e = effect_of(&mut d, &bytes_of(&addr_event(effect::CONNECT, 0, &v4)));
    assert!(!target(&e).contains_key("transparent"));
}
