//! What the benches need to measure `tartaros run` as an ordinary user: a
//! throwaway user with a work directory of its own, and `tartaros service`
//! in the foreground on a socket of the bench's own. Both are undone when
//! they drop, on success, on an error and on Ctrl-C (the interrupt only
//! sets a flag while a user exists: the bench loops check it and return,
//! so the drops run). A user left by a bench that was killed outright is
//! recognised by its comment, reused and removed by the next bench.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// The throwaway user's name.
pub const NAME: &str = "tartaros-bench";
/// Its passwd comment: how a leftover of ours is told from someone's user.
const MARK: &str = "tartaros bench throwaway user";
/// The agent's PATH for the user's rows: the system's directories only
/// (root's own, such as ~/.cargo/bin, are not the user's to search).
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Whether SIGINT, SIGTERM or SIGHUP arrived while a user existed.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Fails once an interrupt arrived, so that the caller's guards drop.
pub fn check_interrupt() -> Result<()> {
    if interrupted() {
        bail!("interrupted; the bench user and service are removed");
    }
    Ok(())
}

fn trap_interrupts(trap: bool) {
    let handler = if trap {
        on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t
    } else {
        libc::SIG_DFL
    };
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { libc::signal(sig, handler) };
    }
}

/// The throwaway user and its work directory (0755, the user's own).
pub struct User {
    pub uid: u32,
    pub gid: u32,
    dir: PathBuf,
}

/// `(uid, gid, comment)` of `name` in the user database.
fn lookup(name: &str) -> Option<(u32, u32, String)> {
    let out = Command::new("getent")
        .args(["passwd", name])
        .output()
        .ok()?;
    let line = String::from_utf8_lossy(&out.stdout);
    let fields: Vec<&str> = line.trim().split(':').collect();
    if fields.len() < 5 || fields[0] != name {
        return None;
    }
    Some((
        fields[2].parse().ok()?,
        fields[3].parse().ok()?,
        fields[4].to_string(),
    ))
}

impl User {
    /// Creates the user (or takes over the leftover of an earlier bench)
    /// and its work directory.
    pub fn create() -> Result<Self> {
        if !nix_is_root() {
            bail!("creating a user needs root");
        }
        trap_interrupts(true);
        match lookup(NAME) {
            Some((_, _, comment)) if comment != MARK => {
                trap_interrupts(false);
                bail!(
                    "a user {NAME} exists and is not the bench's (comment {comment:?}); left alone"
                );
            }
            Some(_) => eprintln!("bench: reusing the {NAME} user an interrupted bench left"),
            None => {
                let status = Command::new("useradd")
                    .args(["--system", "--user-group", "--no-create-home"])
                    .args(["--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin"])
                    .args(["--comment", MARK, NAME])
                    .status();
                match status {
                    Ok(s) if s.success() => {}
                    Ok(s) => {
                        trap_interrupts(false);
                        bail!("useradd {NAME} failed: {s}");
                    }
                    Err(e) => {
                        trap_interrupts(false);
                        bail!("useradd not available: {e}");
                    }
                }
            }
        }
        // From here on the drop removes the user.
        let mut user = Self {
            uid: 0,
            gid: 0,
            dir: std::env::temp_dir().join(format!("{NAME}-{}", std::process::id())),
        };
        let (uid, gid, _) = lookup(NAME).context("the new user is not in the user database")?;
        (user.uid, user.gid) = (uid, gid);
        std::fs::create_dir_all(&user.dir)?;
        std::os::unix::fs::chown(&user.dir, Some(uid), Some(gid))?;
        std::fs::set_permissions(
            &user.dir,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )?;
        Ok(user)
    }

    /// The user's work directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `program` as this user (no supplementary groups: the standard
    /// library drops root's when it sets the uid), in the user's
    /// directory, with the user's HOME, names and a system PATH, through
    /// `service` or, with none, through no service at all (the variable
    /// names a socket that does not exist, so that a system service at the
    /// default socket is not used either).
    pub fn command(&self, program: &str, service: Option<&Service>) -> Command {
        let mut command = Command::new(program);
        let socket = match service {
            Some(service) => service.socket.clone(),
            None => self.dir.join("no-service.sock"),
        };
        command
            .uid(self.uid)
            .gid(self.gid)
            .current_dir(&self.dir)
            .env("HOME", &self.dir)
            .env("USER", NAME)
            .env("LOGNAME", NAME)
            .env("PATH", PATH)
            .env("TARTAROS_SERVICE", socket)
            .env_remove("SUDO_UID")
            .env_remove("SUDO_GID")
            .env_remove("SUDO_USER");
        command
    }
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

impl Drop for User {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        let removed = Command::new("userdel")
            .arg(NAME)
            .stdout(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !removed || lookup(NAME).is_some() {
            eprintln!(
                "bench: warning: failed to remove the user {NAME}; remove it with `userdel {NAME}`"
            );
        }
        trap_interrupts(false);
    }
}

/// `tartaros service` in the foreground on a socket in a directory of its
/// own; stopped, and the directory (socket, its stderr) removed, on drop.
pub struct Service {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
}

impl Service {
    pub fn start(tartaros: &Path) -> Result<Self> {
        let dir =
            std::env::temp_dir().join(format!("tartaros-bench-service-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        let socket = dir.join("tartaros.sock");
        let log = dir.join("service.err");
        let child = Command::new(tartaros)
            .arg("service")
            .arg("--socket")
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                bail!("failed to start {}: {e}", tartaros.display());
            }
        };
        let mut service = Self { child, dir, socket };
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if std::os::unix::net::UnixStream::connect(&service.socket).is_ok() {
                return Ok(service);
            }
            let said = || {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                text.lines().last().unwrap_or("").to_string()
            };
            if let Ok(Some(status)) = service.child.try_wait() {
                bail!("tartaros service ended at its start ({status}): {}", said());
            }
            if Instant::now() > deadline {
                bail!("tartaros service did not listen within 5 s: {}", said());
            }
            check_interrupt()?;
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        // SIGTERM, then SIGKILL after 2 s; its workers die with it.
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: signals our own child, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The ordinary user's rows: the user, and the service when it started,
/// or why not.
pub struct Callers {
    // Declared first: it drops before the user.
    pub service: Result<Service, String>,
    pub user: Result<User, String>,
    cgroups_before: Vec<PathBuf>,
}

impl Callers {
    pub fn new(tartaros: &Path) -> Self {
        let cgroups_before = run_cgroups();
        let user = User::create().map_err(|e| format!("{e:#}"));
        let service = match &user {
            Ok(_) => Service::start(tartaros).map_err(|e| format!("{e:#}")),
            Err(_) => Err("no bench user".to_string()),
        };
        Self {
            user,
            service,
            cgroups_before,
        }
    }

    /// Waits for the runs' cgroups to go (a run's janitor removes its
    /// cgroup after the caller has its exit status), stops the service,
    /// removes the user, and says what is left.
    pub fn finish(self) {
        let Self {
            user,
            service,
            cgroups_before,
        } = self;
        let had_user = user.is_ok();
        let new_cgroups = || {
            let mut now = run_cgroups();
            now.retain(|c| !cgroups_before.contains(c));
            now
        };
        let settle = || {
            let deadline = Instant::now() + Duration::from_secs(5);
            while !new_cgroups().is_empty() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
        };
        settle();
        let socket = service.as_ref().ok().map(|s| s.socket.clone());
        drop(service);
        drop(user);
        if !had_user {
            return;
        }
        settle();
        let left = new_cgroups();
        let user_left = lookup(NAME).is_some();
        let socket_left = socket.is_some_and(|s| s.exists());
        println!(
            "  host afterwards: user {NAME} {}, service {}, new run cgroups left: {}",
            if user_left { "STILL THERE" } else { "removed" },
            if socket_left {
                "socket STILL THERE"
            } else {
                "stopped, socket removed"
            },
            if left.is_empty() {
                "none".to_string()
            } else {
                // Another session's runs on this host show here too.
                left.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
    }
}

/// Every `tartaros-*` directory in the cgroup hierarchies (v2 and v1),
/// to tell whether the bench left any.
pub fn run_cgroups() -> Vec<PathBuf> {
    fn walk(dir: &Path, depth: usize, found: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let path = entry.path();
            if entry.file_name().to_string_lossy().starts_with("tartaros-") {
                found.push(path.clone());
            }
            if depth < 6 {
                walk(&path, depth + 1, found);
            }
        }
    }
    let mut found = Vec::new();
    walk(Path::new("/sys/fs/cgroup"), 0, &mut found);
    found.sort();
    found
}
