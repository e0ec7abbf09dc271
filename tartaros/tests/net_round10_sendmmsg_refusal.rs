//! Adversarial round 10 (egress): a `sendmmsg` whose first message the
//! filters let through and whose second they refuse. The kernel stops at
//! the refused message and the call returns 1 (success, one sent), so the
//! refusal has no failed call of its own: with capture on, the filters'
//! events are only notes for the syscall's record, and that record is an
//! allowed send. The refusal must still be a denied record with the
//! agent's pid, and no allowed record may name the refused destination
//! as one the messages went to. Needs root and gcc (fails under CI=true
//! without).

mod common;

use common::logged::*;
use common::*;
use serde_json::Value;

const AGENT: &str = r#"
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static void two(struct mmsghdr *mm, struct iovec *io, void *a, socklen_t al, void *b, socklen_t bl) {
    memset(mm, 0, 2 * sizeof *mm);
    for (int i = 0; i < 2; i++) {
        mm[i].msg_hdr.msg_iov = &io[i];
        mm[i].msg_hdr.msg_iovlen = 1;
    }
    mm[0].msg_hdr.msg_name = a;
    mm[0].msg_hdr.msg_namelen = al;
    mm[1].msg_hdr.msg_name = b;
    mm[1].msg_hdr.msg_namelen = bl;
}

int main(int argc, char **argv) {
    struct iovec io[2] = {{"a", 1}, {"b", 1}};
    struct mmsghdr mm[2];
    // IPv4: the first message to our own receiver on loopback (granted),
    // the second to a documentation address (refused).
    struct sockaddr_in r, far;
    socklen_t len = sizeof r;
    int rx = socket(AF_INET, SOCK_DGRAM, 0), tx = socket(AF_INET, SOCK_DGRAM, 0);
    memset(&r, 0, sizeof r);
    r.sin_family = AF_INET;
    r.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (rx < 0 || tx < 0 || bind(rx, (void *)&r, sizeof r) || getsockname(rx, (void *)&r, &len))
        return 10;
    memset(&far, 0, sizeof far);
    far.sin_family = AF_INET;
    far.sin_port = htons(53);
    far.sin_addr.s_addr = inet_addr("192.0.2.53");
    two(mm, io, &r, sizeof r, &far, sizeof far);
    int v4 = sendmmsg(tx, mm, 2, 0);
    int v4_errno = errno;
    // A dual-stack IPv6 socket, IPv4-mapped destinations.
    int tx6 = socket(AF_INET6, SOCK_DGRAM, 0);
    struct sockaddr_in6 r6, far6;
    memset(&r6, 0, sizeof r6);
    r6.sin6_family = AF_INET6;
    r6.sin6_port = r.sin_port;
    inet_pton(AF_INET6, "::ffff:127.0.0.1", &r6.sin6_addr);
    far6 = r6;
    far6.sin6_port = htons(54);
    inet_pton(AF_INET6, "::ffff:192.0.2.54", &far6.sin6_addr);
    two(mm, io, &r6, sizeof r6, &far6, sizeof far6);
    int v6 = tx6 < 0 ? -2 : sendmmsg(tx6, mm, 2, 0);
    // Unix datagrams: the first to our own socket in the writable root,
    // the second to a name outside every allowed socket directory.
    struct sockaddr_un u, out;
    memset(&u, 0, sizeof u);
    u.sun_family = AF_UNIX;
    snprintf(u.sun_path, sizeof u.sun_path, "%s/rx.sock", argv[1]);
    memset(&out, 0, sizeof out);
    out.sun_family = AF_UNIX;
    strcpy(out.sun_path, "/run/tartaros-round10-elsewhere.sock");
    int urx = socket(AF_UNIX, SOCK_DGRAM, 0), utx = socket(AF_UNIX, SOCK_DGRAM, 0);
    if (urx < 0 || utx < 0 || bind(urx, (void *)&u, sizeof u)) return 11;
    two(mm, io, &u, sizeof u, &out, sizeof out);
    int ux = sendmmsg(utx, mm, 2, 0);
    int ux_errno = errno;
    char c;
    int got = recv(rx, &c, 1, MSG_DONTWAIT) == 1 && c == 'a';
    printf("%d %d %d %d %d %d %d\n", ntohs(r.sin_port), v4, v4_errno, v6, ux, ux_errno, got);
    return argc > 1 ? 0 : 12;
}
"#;

fn sends(records: &[Value]) -> Vec<&Value> {
    records.iter().filter(|r| r["kind"] == "sendto").collect()
}

/// Whether `r` names `addr` (with `port`) as a place its data went.
fn names(r: &Value, addr: &str, port: u64) -> bool {
    let t = &r["target"];
    let listed = t["destinations"].as_array().is_some_and(|d| {
        d.iter()
            .any(|d| d.as_str().is_some_and(|d| d.contains(addr)))
    });
    (t["addr"] == addr && t["port"] == port) || listed
}

#[test]
fn a_refused_later_message_of_a_sendmmsg_is_a_denied_record_with_its_pid() {
    if !usable("net_round10_sendmmsg") {
        return;
    }
    let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
    let agent = compile(&bin, "agent", AGENT);
    let (out, records) = run_logged(
        &root,
        &logs,
        &[agent.to_str().unwrap(), root.path().to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    let nums: Vec<i64> = stdout(&out)
        .split_whitespace()
        .map(|p| p.parse().expect("a number"))
        .collect();
    let [port, v4, v4_errno, v6, ux, ux_errno, got] = nums[..] else {
        panic!("agent output: {}", stdout(&out));
    };
    eprintln!(
        "sendmmsg returned: v4 {v4} (errno {v4_errno}), v6 {v6}, unix {ux} (errno {ux_errno})"
    );
    // The kernel sent the first message and stopped at the refused one.
    assert_eq!((v4, v6, got), (1, 1, 1), "{}", stdout(&out));
    let all = sends(&records);
    let pid_of = |r: &Value| r["pid"].as_u64();
    let first = all
        .iter()
        .find(|r| allowed(r) && r["target"]["messages"] == 2 && r["target"]["port"] == port)
        .unwrap_or_else(|| panic!("no record of the IPv4 sendmmsg: {all:#?}"));
    let agent_pid = pid_of(first);
    for (addr, far_port) in [("192.0.2.53", 53), ("192.0.2.54", 54)] {
        assert!(
            !all.iter().any(|r| allowed(r) && names(r, addr, far_port)),
            "an allowed record names {addr}:{far_port}, where nothing went: {all:#?}"
        );
        let refused = all
            .iter()
            .find(|r| !allowed(r) && r["target"]["addr"] == addr && r["target"]["port"] == far_port)
            .unwrap_or_else(|| {
                panic!("no denied record of the send to {addr}:{far_port}: {all:#?}")
            });
        assert_eq!(refused["errno"], 1, "{refused}");
        assert_eq!(pid_of(refused), agent_pid, "{refused}");
    }
    // The unix policy refused the second unix message (EPERM from its
    // hook, before any lookup): it returned 1, and the refusal is a
    // record too.
    assert_eq!(ux, 1, "{}", stdout(&out));
    let path = "/run/tartaros-round10-elsewhere.sock";
    assert!(
        !all.iter()
            .any(|r| allowed(r) && r["target"]["path"] == path),
        "{all:#?}"
    );
    let refused = all
        .iter()
        .find(|r| !allowed(r) && r["target"]["path"] == path)
        .unwrap_or_else(|| panic!("no denied record of the unix send to {path}: {all:#?}"));
    assert_eq!(pid_of(refused), agent_pid, "{refused}");
}
