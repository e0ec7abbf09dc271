//! Escapes found by an adversarial review of the containment, each proved
//! from the host side (what the host shows afterwards, never the agent's
//! own report) and each failing on the binary before its fix.
//!
//! Ideas ported (not code) from other sandboxes' suites and write-ups:
//! firejail's and nsjail's rlimit handling (`RLIMIT_CORE`), and the
//! container escapes through a host core handler (apport's
//! CVE-2019-15790 / CVE-2021-25682 class: a crash inside the sandbox makes
//! the host run a root helper with the crashing process's data).

mod common;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

const CORE_PATTERN: &str = "/proc/sys/kernel/core_pattern";

/// Puts `kernel.core_pattern` back when dropped, also when the test fails.
struct SavedCorePattern(String);

impl Drop for SavedCorePattern {
    fn drop(&mut self) {
        let _ = std::fs::write(CORE_PATTERN, &self.0);
    }
}

/// A root-owned directory with `helper`, a core handler that appends its
/// pid argument to `marker` (and drains the core from its stdin).
fn core_helper() -> (tempfile::TempDir, PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("tt-core-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let helper = dir.path().join("helper");
    let marker = dir.path().join("marker");
    let script = format!(
        "#!/bin/sh\necho \"$1\" >> {}\nexec cat > /dev/null\n",
        marker.display()
    );
    std::fs::write(&helper, script).unwrap();
    std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
    (dir, helper, marker)
}

fn crash_on_host(marker: &Path) -> bool {
    let _ = Command::new("sh")
        .args(["-c", "ulimit -c 0; kill -SEGV $$"])
        .status();
    eventually(5, || marker.exists())
}

/// A `core_pattern` that pipes to a handler (`|/usr/lib/systemd/
/// systemd-coredump ...`, apport: the default of most distributions)
/// ignores `RLIMIT_CORE` 0: a crash of the agent made the kernel start that
/// handler as root in the host's namespaces, outside every wall, where it
/// wrote the agent's memory under /var. The agent now keeps `RLIMIT_CORE`
/// at 1, the kernel's marker that refuses the pipe, and cannot lower it.
#[test]
fn a_crash_in_the_sandbox_does_not_run_the_hosts_core_handler() {
    if !can_run("a_crash_in_the_sandbox_does_not_run_the_hosts_core_handler") {
        return;
    }
    let work = Dir::new();
    let (_dir, helper, marker) = core_helper();
    let _saved = SavedCorePattern(std::fs::read_to_string(CORE_PATTERN).unwrap());
    std::fs::write(CORE_PATTERN, format!("|{} %p", helper.display())).unwrap();

    // Control: the handler runs for a crash on the host, limit 0 or not.
    assert!(crash_on_host(&marker), "the host's core handler never ran");
    std::fs::remove_file(&marker).unwrap();

    let code = format!(
        "{ATTEMPT}
import resource, signal, subprocess
print('limit', resource.getrlimit(resource.RLIMIT_CORE))
# By libc, not resource.setrlimit: Python reports EPERM as a ValueError.
hard = resource.getrlimit(resource.RLIMIT_CORE)[1]
soft_zero = (ctypes.c_ulong * 2)(0, hard)
attempt('lower_soft', lambda: checked(libc.setrlimit(4, ctypes.byref(soft_zero))))
attempt('prlimit', lambda: checked(libc.prlimit(0, 4, ctypes.byref(soft_zero), None)))
attempt('lower', lambda: checked(libc.setrlimit(4, ctypes.byref((ctypes.c_ulong * 2)(0, 0)))))
subprocess.run(['sh', '-c', 'ulimit -c 0 2>/dev/null; kill -SEGV $$'])
sys.stdout.flush()
os.kill(os.getpid(), signal.SIGSEGV)
"
    );
    let w = work.path().to_str().unwrap();
    let out = python(&["--write", w], work.path(), &code);
    // Give a handler the kernel started the time the control needed.
    std::thread::sleep(Duration::from_secs(2));
    let ran = std::fs::read_to_string(&marker).unwrap_or_default();
    assert!(
        ran.is_empty(),
        "the host's core handler ran for sandbox pids {ran:?}\n{}{}",
        stdout(&out),
        stderr(&out)
    );
    for label in ["lower_soft", "prlimit", "lower"] {
        expect(&out, label, "EPERM");
    }
    expect(&out, "limit", "(1, 1)");
}
