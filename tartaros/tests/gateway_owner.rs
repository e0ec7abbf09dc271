//! Who opened a gateway connection (issue 13, session 13's review): a
//! process that reaches the proxy through a dual-stack IPv6 socket, from a
//! local port another process used before over IPv4, must be named, not
//! that other process. Seen from the log: the `proxy` record's pid is the
//! pid that created X's marker file.

mod common;

use common::proxied::*;
use common::*;

#[test]
fn a_proxy_record_names_the_process_that_connected_not_an_earlier_user_of_its_port() {
    if !can_run("gateway_owner") {
        return;
    }
    let records =
        run_script_with_proxy(&[("attr.py", include_str!("support/attr_owner.py"))], &[]).records;
    let (x, y) = (
        pid_of_marker(&records, "/X_marker"),
        pid_of_marker(&records, "/Y_marker"),
    );
    assert_ne!(x, y);
    let proxy = records
        .iter()
        .find(|r| r["kind"] == "proxy")
        .unwrap_or_else(|| panic!("no proxy record: {records:#?}"));
    assert_eq!(proxy["pid"].as_u64(), Some(x), "{proxy}");
    // Its parent and user too, as the capture saw them (they said 0, root,
    // before round 13).
    let own = records
        .iter()
        .find(|r| {
            r["pid"].as_u64() == Some(x) && r["kind"] != "proxy" && r["uid"].as_u64().is_some()
        })
        .unwrap_or_else(|| panic!("no capture record of {x}: {records:#?}"));
    assert_eq!(
        (&proxy["ppid"], &proxy["uid"]),
        (&own["ppid"], &own["uid"]),
        "{proxy}\n{own}"
    );
    assert_ne!(proxy["uid"].as_u64(), Some(0), "{proxy}");
}

#[test]
fn an_intercepted_ipv6_connect_reaches_the_transparent_proxy_and_no_squatter() {
    if !can_run("transparent_v6") {
        return;
    }
    let (work, logs) = (Dir::new(), Dir::new());
    let code = "import socket\n\
        s = socket.socket(socket.AF_INET6)\n\
        try:\n    s.bind(('::1', 3129)); print('squat ok')\n\
        except OSError as e:\n    print('squat', e.errno)\n\
        c = socket.socket(socket.AF_INET6); c.settimeout(5)\n\
        c.connect(('2001:db8::1', 18080))\n\
        c.sendall(b'GET /v6 HTTP/1.1\\r\\nHost: localhost:18080\\r\\nConnection: close\\r\\n\\r\\n')\n\
        print('got', c.recv(12))\n";
    let (out, records) = run_with_proxy(&work, &logs, &[], &["python3", "-c", code]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    assert!(
        text.contains("squat 98"),
        "[::1]:3129 is the gateway's: {text}"
    );
    assert!(text.contains("got b'HTTP/1.1"), "{text}");
    assert!(
        records
            .iter()
            .any(|r| r["kind"] == "proxy" && r["target"]["mode"] == "transparent"),
        "{records:#?}"
    );
}
