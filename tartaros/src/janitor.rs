//! The janitor: a small process, forked before the async runtime exists,
//! that outlives the supervisor only to clean up after it. The supervisor
//! tells it, over a pipe, what to remove if the run does not end normally
//! (the run's cgroups and the materialized placeholders); if the pipe closes
//! without a final "done" (the supervisor was SIGKILLed), it kills and
//! removes the cgroups and the placeholders. Forking (no exec) costs a
//! fraction of a millisecond, which matters for start-up.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum JanitorError {
    #[error("failed to start the janitor: {0}")]
    Fork(nix::Error),
}

/// The supervisor's end of the janitor's pipe.
pub struct Janitor {
    pipe: File,
}

impl Janitor {
    /// Forks the janitor. Must be called while the process has a single
    /// thread (before the tokio runtime starts): the child runs Rust code.
    pub fn fork() -> Result<Self, JanitorError> {
        let (read, write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(JanitorError::Fork)?;
        // SAFETY: the process is single-threaded here (documented contract,
        // called from the CLI before the runtime is built).
        match unsafe { nix::unistd::fork() }.map_err(JanitorError::Fork)? {
            nix::unistd::ForkResult::Child => {
                drop(write);
                let code = serve(File::from(read));
                // SAFETY: leave without running the parent's atexit state.
                unsafe { libc::_exit(code) }
            }
            nix::unistd::ForkResult::Parent { .. } => {
                drop(read);
                Ok(Self {
                    pipe: File::from(write),
                })
            }
        }
    }

    /// Asks for `path` (a run cgroup, v2) to be killed and removed.
    pub fn cgroup(&mut self, path: &Path) {
        self.say("cgroup", path);
    }

    /// Asks for a v1 limit cgroup to be removed.
    pub fn v1(&mut self, path: &Path) {
        self.say("v1", path);
    }

    /// Asks for an empty placeholder directory to be removed.
    pub fn placeholder(&mut self, path: &Path) {
        self.say("placeholder", path);
    }

    /// The run ended normally and cleaned up itself: the janitor exits.
    pub fn done(mut self) {
        let _ = self.pipe.write_all(b"done\n");
    }

    fn say(&mut self, what: &str, path: &Path) {
        use std::os::unix::ffi::OsStrExt;
        let mut line = format!("{what}\t").into_bytes();
        line.extend_from_slice(path.as_os_str().as_bytes());
        line.push(b'\n');
        let _ = self.pipe.write_all(&line);
    }
}

/// The janitor's life: detach from the terminal, wait, clean up.
fn serve(pipe: File) -> i32 {
    let _ = nix::unistd::setsid();
    // Hold none of the launcher's stdio: a harness waiting for EOF on the
    // supervisor's output must not wait for us.
    if let Ok(null) = File::options().read(true).write(true).open("/dev/null") {
        use std::os::fd::AsRawFd;
        for fd in 0..=2 {
            // SAFETY: dup2 onto the standard descriptors we own.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
    let mut cgroups = Vec::new();
    let mut v1 = Vec::new();
    let mut placeholders = Vec::new();
    for line in BufReader::new(pipe).split(b'\n').map_while(Result::ok) {
        use std::os::unix::ffi::OsStrExt;
        let Some(tab) = line.iter().position(|b| *b == b'\t') else {
            if line == b"done" {
                return 0;
            }
            continue;
        };
        let path = PathBuf::from(std::ffi::OsStr::from_bytes(&line[tab + 1..]));
        match &line[..tab] {
            b"cgroup" => cgroups.push(path),
            b"v1" => v1.push(path),
            b"placeholder" => placeholders.push(path),
            _ => {}
        }
    }
    // The pipe closed without "done": the supervisor died.
    let mut code = 0;
    for cgroup in &cgroups {
        if crate::cgroup::kill_and_remove(cgroup, crate::cgroup::TEARDOWN_TIMEOUT).is_err() {
            code = 1;
        }
    }
    for dir in &v1 {
        crate::cgroup::remove_v1(dir, crate::cgroup::TEARDOWN_TIMEOUT);
    }
    crate::materialize::cleanup_placeholders(&placeholders);
    code
}
