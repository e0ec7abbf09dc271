//! Who opened a gateway connection (issue 13, session 13's review): a
//! process that reaches the proxy through a dual-stack IPv6 socket, from a
//! local port another process used before over IPv4, must be named, not
//! that other process. Seen from the log: the `proxy` record's pid is the
//! pid that created X's marker file.

mod common;

use common::*;

const POLICY: &str =
    "[proxy]\nallow_internal = true\nhttp_ports = [18080]\nconnect_ports = [18080]\n";

/// `tartaros run --strict --allow-domain localhost` with the loopback
/// upstream policy, `--log` into `logs`, extra flags, then `argv`.
fn run_with_proxy(
    work: &Dir,
    logs: &Dir,
    flags: &[&str],
    argv: &[&str],
) -> (std::process::Output, Vec<serde_json::Value>) {
    let policy = logs.join("policy.toml");
    std::fs::write(&policy, POLICY).unwrap();
    let log = logs.join("effects.jsonl");
    let mut args = vec![
        "run",
        "-q",
        "--strict",
        "--allow-domain",
        "localhost",
        "--config",
        policy.to_str().unwrap(),
        "--log",
        log.to_str().unwrap(),
    ];
    args.extend_from_slice(flags);
    args.push("--");
    args.extend_from_slice(argv);
    let out = tartaros(&args, work.path());
    let records = if log.exists() {
        records(&log)
    } else {
        Vec::new()
    };
    (out, records)
}

#[test]
fn a_proxy_record_names_the_process_that_connected_not_an_earlier_user_of_its_port() {
    if !can_run("gateway_owner") {
        return;
    }
    let (work, logs) = (Dir::new(), Dir::new());
    let script = work.join("attr.py");
    std::fs::write(&script, include_str!("support/attr_owner.py")).unwrap();
    let w = work.path().to_str().unwrap();
    let (out, records) = run_with_proxy(
        &work,
        &logs,
        &["--write", w],
        &["python3", script.to_str().unwrap(), w],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let pid_of_marker = |name: &str| {
        records
            .iter()
            .find(|r| {
                r["target"]["path"]
                    .as_str()
                    .is_some_and(|p| p.ends_with(name))
            })
            .unwrap_or_else(|| panic!("no record of {name}: {records:#?}"))["pid"]
            .as_u64()
            .unwrap()
    };
    let (x, y) = (pid_of_marker("/X_marker"), pid_of_marker("/Y_marker"));
    assert_ne!(x, y);
    let proxy = records
        .iter()
        .find(|r| r["kind"] == "proxy")
        .unwrap_or_else(|| panic!("no proxy record: {records:#?}"));
    assert_eq!(proxy["pid"].as_u64(), Some(x), "{proxy}");
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
