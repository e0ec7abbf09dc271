//! A file lease taken on the host: the way a test holds an agent's write
//! open blocked in the kernel (to rewrite its arguments meanwhile). The
//! sandbox refuses `F_SETLEASE` (docs/seccomp.md, "Leases and locks"), and
//! the blocking open does not care who holds the lease.

use std::io::{BufRead as _, BufReader, Read as _};
use std::path::Path;
use std::process::{ChildStdout, Command, Stdio};

use super::KillOnDrop;

/// The holder: a read lease on each file, each let go 500 ms after its
/// break starts (the kernel's SIGIO; `F_GETLEASE` then answers the type
/// the break asks for, `F_UNLCK` for a writer).
const HOLDER: &str = r#"
import fcntl, os, signal, sys, time
F_SETLEASE, F_GETLEASE = 1024, 1025
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGIO})
held = [os.open(p, os.O_RDONLY) for p in sys.argv[1:]]
for fd in held:
    fcntl.fcntl(fd, F_SETLEASE, fcntl.F_RDLCK)
print('leased', flush=True)
while held:
    if signal.sigtimedwait({signal.SIGIO}, 60) is None:
        sys.exit('never broken')
    time.sleep(0.5)
    for fd in list(held):
        if fcntl.fcntl(fd, F_GETLEASE) == fcntl.F_UNLCK:
            fcntl.fcntl(fd, F_SETLEASE, fcntl.F_UNLCK)
            held.remove(fd)
            print('released', flush=True)
"#;

/// Read leases held by a host process; killed on drop, so a failing test
/// leaves no holder behind.
pub struct HostLease {
    holder: KillOnDrop,
    out: BufReader<ChildStdout>,
}

impl HostLease {
    /// Takes a read lease on each of `files` (none may be open for
    /// writing); returns once they are all held.
    pub fn take(files: &[&Path]) -> Self {
        let mut child = Command::new("python3")
            .args(["-c", HOLDER])
            .args(files)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the lease holder");
        let mut out = BufReader::new(child.stdout.take().expect("holder stdout"));
        let holder = KillOnDrop(Some(child));
        let mut line = String::new();
        out.read_line(&mut line).expect("read the holder");
        assert_eq!(line.trim(), "leased", "the host's leases");
        Self { holder, out }
    }

    /// Waits for the holder to let go of every lease, each after a break;
    /// how many it let go.
    pub fn released(mut self) -> usize {
        let status = self.holder.take().wait().expect("wait for the holder");
        let mut rest = String::new();
        self.out.read_to_string(&mut rest).expect("read the holder");
        assert!(status.success(), "lease holder: {status} {rest}");
        rest.lines().filter(|l| *l == "released").count()
    }
}

/// Whether `/proc/locks` lists a process named `comm` waiting for a lease
/// break (a `->` line: its pid is the fourth field after the arrow).
pub fn lease_waiter_is(comm: &str) -> bool {
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    locks.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let Some(arrow) = fields.iter().position(|f| *f == "->") else {
            return false;
        };
        fields.get(arrow + 1) == Some(&"LEASE")
            && fields.get(arrow + 4).is_some_and(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm)
            })
    })
}
