//! A `sendto` record names where the data went as the kernel's own hook
//! saw it, not the agent's sockaddr: a connected TCP socket ignores the
//! destination of `sendto`, so a record naming it names a send that never
//! happened. (A `sockaddr_in` with family `AF_UNSPEC`, which the kernel's
//! `udp_sendmsg` would send to, is refused by the connect filter: the test
//! keeps that so.) A `sendmmsg` whose first message names no destination
//! sends its later messages where they say. Needs root and gcc (fails under CI=true without).

mod common;

use common::logged::*;
use common::*;
use serde_json::Value;

const AGENT: &str = r#"
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int bound(int type, struct sockaddr_in *a) {
    int fd = socket(AF_INET, type, 0);
    socklen_t len = sizeof *a;
    memset(a, 0, sizeof *a);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, (void *)a, sizeof *a) || getsockname(fd, (void *)a, &len))
        return -1;
    return fd;
}

int main(void) {
    struct sockaddr_in r, l, fake;
    int rx = bound(SOCK_DGRAM, &r);
    int tx = socket(AF_INET, SOCK_DGRAM, 0);
    if (rx < 0 || tx < 0) return 10;
    struct sockaddr_in unspec = r;
    unspec.sin_family = AF_UNSPEC;
    if (sendto(tx, "x", 1, 0, (void *)&unspec, sizeof unspec) != -1 || errno != EPERM) return 17;
    if (sendto(tx, "u", 1, 0, (void *)&r, sizeof r) != 1) return 11;
    char c;
    struct timeval tv = {2, 0};
    setsockopt(rx, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (recv(rx, &c, 1, 0) != 1 || c != 'u') return 12;
    int ls = bound(SOCK_STREAM, &l);
    if (ls < 0 || listen(ls, 1)) return 13;
    int cs = socket(AF_INET, SOCK_STREAM, 0);
    if (cs < 0 || connect(cs, (void *)&l, sizeof l)) return 14;
    int as = accept(ls, 0, 0);
    memset(&fake, 0, sizeof fake);
    fake.sin_family = AF_INET;
    fake.sin_port = htons(4444);
    fake.sin_addr.s_addr = inet_addr("192.0.2.44");
    if (as < 0 || sendto(cs, "t", 1, 0, (void *)&fake, sizeof fake) != 1) return 15;
    if (recv(as, &c, 1, 0) != 1 || c != 't') return 16;
    // sendmmsg on a UDP socket connected to r: its first message goes to
    // r, its second to m, which it names.
    struct sockaddr_in m;
    int rm = bound(SOCK_DGRAM, &m), ux = socket(AF_INET, SOCK_DGRAM, 0);
    if (rm < 0 || ux < 0 || connect(ux, (void *)&r, sizeof r)) return 18;
    struct iovec io[2] = {{"a", 1}, {"m", 1}};
    struct mmsghdr mm[2];
    memset(mm, 0, sizeof mm);
    mm[0].msg_hdr.msg_iov = &io[0];
    mm[0].msg_hdr.msg_iovlen = 1;
    mm[1].msg_hdr.msg_iov = &io[1];
    mm[1].msg_hdr.msg_iovlen = 1;
    mm[1].msg_hdr.msg_name = &m;
    mm[1].msg_hdr.msg_namelen = sizeof m;
    if (sendmmsg(ux, mm, 2, 0) != 2) return 19;
    setsockopt(rm, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (recv(rm, &c, 1, 0) != 1 || c != 'm') return 20;
    dprintf(1, "%d %d %d\n", ntohs(r.sin_port), ntohs(l.sin_port), ntohs(m.sin_port));
    return 0;
}
"#;

fn sends(records: &[Value]) -> Vec<&Value> {
    records.iter().filter(|r| r["kind"] == "sendto").collect()
}

#[test]
fn a_sendto_record_names_where_the_kernel_sent_it() {
    if !usable("net_destinations") {
        return;
    }
    let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
    let agent = compile(&bin, "agent", AGENT);
    let (out, records) = run_logged(&root, &logs, &[agent.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    let ports: Vec<u64> = stdout(&out)
        .split_whitespace()
        .map(|p| p.parse().expect("a port"))
        .collect();
    let (udp, tcp, mmsg) = (ports[0], ports[1], ports[2]);
    let all = sends(&records);
    // The datagram went to 127.0.0.1:udp, as the kernel's hook saw it.
    assert!(
        all.iter().any(|r| {
            allowed(r)
                && field(r, "addr") == Some("127.0.0.1")
                && r["target"]["port"] == udp
                && field(r, "addr_source") == Some("kernel")
        }),
        "no sendto record names 127.0.0.1:{udp} from the kernel: {all:#?}"
    );
    // The AF_UNSPEC datagram was refused, and its record says so.
    assert!(
        all.iter()
            .any(|r| !allowed(r) && field(r, "family") == Some("unspec")),
        "{all:#?}"
    );
    // Nothing went to 192.0.2.44: no record says it did, and the send's
    // record says its address was not used.
    assert!(
        !all.iter().any(|r| field(r, "addr") == Some("192.0.2.44")),
        "a record names a destination the kernel ignored (the data went to port {tcp}): {all:#?}"
    );
    let tcp_send = all
        .iter()
        .find(|r| field(r, "claimed_addr") == Some("192.0.2.44"))
        .unwrap_or_else(|| panic!("no record of the TCP sendto: {all:#?}"));
    assert!(allowed(tcp_send), "{tcp_send}");
    assert_eq!(tcp_send["target"]["addr_unused"], true, "{tcp_send}");
    assert_eq!(tcp_send["target"]["claimed_port"], 4444, "{tcp_send}");
    // The sendmmsg's second datagram went to 127.0.0.1:mmsg though its
    // first message named no destination.
    let named_later = all
        .iter()
        .find(|r| r["target"]["messages"] == 2)
        .unwrap_or_else(|| panic!("no record of the sendmmsg to port {mmsg}: {all:#?}"));
    assert_eq!(
        (field(named_later, "addr"), &named_later["target"]["port"]),
        (Some("127.0.0.1"), &mmsg.into()),
        "{named_later}"
    );
    assert_eq!(field(named_later, "addr_source"), Some("kernel"));
}
