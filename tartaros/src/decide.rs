//! Deciding a run: a pure function of the request and the host facts (read
//! once, before), returning everything the stages carry out, or a refusal.
//! Nothing here creates, mounts or writes; the tests run without root.

use std::path::{Path, PathBuf};

use crate::cgroup::Limits;
use crate::credentials::Identity;
use crate::ebpf::AttachOptions;
use crate::exit::{self, Refusal};
use crate::guarantee::{Guarantee, Ledger};
use crate::host_facts::Host;
use crate::plan::{Late, Plan, SeccompPlan};
use crate::policy::Policy;

/// What a path is, as far as the decisions need to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathKind {
    Dir,
    Socket,
    Symlink,
    /// A regular file, device or FIFO.
    File,
}

/// One `stat` of a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub kind: PathKind,
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
    /// Hard links (names) of the file.
    pub links: u64,
}

/// The facts about the host's files and users the decisions read.
pub trait Facts {
    /// `stat` (`follow`) or `lstat` of `path`; `None` if it does not exist.
    fn stat(&self, path: &Path, follow: bool) -> Option<Stat>;
    /// The uid and gid of a user name or number.
    fn user(&self, name: &str) -> Result<Identity, String>;
    /// The regular files with other hard links below the directory `dir`,
    /// looking at `limit` entries at most (`link_walk.rs`); none where
    /// there is no tree to walk (the tests' fakes).
    fn linked_below(&self, _dir: &Path, _limit: usize) -> crate::link_walk::LinkWalk {
        crate::link_walk::LinkWalk::default()
    }
}

/// The real host.
pub struct HostFiles;

impl Facts for HostFiles {
    fn stat(&self, path: &Path, follow: bool) -> Option<Stat> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let meta = if follow {
            std::fs::metadata(path)
        } else {
            std::fs::symlink_metadata(path)
        }
        .ok()?;
        let kind = match meta.file_type() {
            t if t.is_dir() => PathKind::Dir,
            t if t.is_socket() => PathKind::Socket,
            t if t.is_symlink() => PathKind::Symlink,
            _ => PathKind::File,
        };
        Some(Stat {
            kind,
            uid: meta.uid(),
            gid: meta.gid(),
            mode: meta.mode(),
            links: meta.nlink(),
        })
    }

    fn user(&self, name: &str) -> Result<Identity, String> {
        crate::credentials::lookup(name).map_err(|e| e.to_string())
    }

    fn linked_below(&self, dir: &Path, limit: usize) -> crate::link_walk::LinkWalk {
        // With the service's caller's access: the warning names files, and
        // must not name one the caller could not list itself.
        crate::caller::as_caller(|| crate::link_walk::linked_files(dir, limit))
    }
}

/// What the run asks for, as the CLI read it.
pub struct Request<'a> {
    pub policy: &'a Policy,
    pub argv: &'a [String],
    pub cwd: &'a Path,
    pub log: Option<&'a Path>,
    pub log_buffer: u32,
    pub launcher_env: &'a [(String, String)],
    /// `--setenv NAME=VALUE` pairs.
    pub setenv: &'a [(String, String)],
    /// The agent gets its own pseudo-terminal.
    pub pty: bool,
}

/// Facts read once from the host before deciding.
pub struct HostFacts<'a> {
    pub host: &'a Host,
    /// Who runs tartaros (for the service: its caller).
    pub current: Identity,
    /// The service runs this for `current`, who may not choose another user.
    pub on_behalf: bool,
    /// The host's listening pathname sockets outside the roots, resolved
    /// (`mounts::host_sockets`): hidden by the mount plan.
    pub host_sockets: &'a [PathBuf],
    /// The service's eBPF programs are attached above the run's cgroup
    /// (adopted maps): they refuse what a run they do not know does, so
    /// every run registers, even one that uses none of them.
    pub shared_programs: bool,
    pub files: &'a dyn Facts,
    /// The host's mount table (`/proc/self/mountinfo`), for the other
    /// mounts of denied paths (`mount_aliases.rs`); `None` if it could not
    /// be read.
    pub mount_table: Option<&'a str>,
    /// The launcher's placeholder registry (`materialize.rs`), made before
    /// deciding: hidden from an agent whose uid could open it.
    pub placeholder_registry: Option<&'a Path>,
}

/// Everything decided for a run.
#[derive(Debug)]
pub struct RunPlan {
    /// What the sandbox init does.
    pub init: Plan,
    /// What it does once the eBPF programs are attached (or not).
    pub late: Late,
    pub ledger: Ledger,
    /// Directories `--materialize` creates before the init starts,
    /// outermost first (the stage shares those another run made).
    pub materialize: Vec<PathBuf>,
    /// The run's own cgroup and its limits; `None`: no cgroup of its own.
    pub cgroup: Option<Limits>,
    /// The eBPF programs to attach to that cgroup.
    pub watch: Option<AttachOptions>,
    /// The gateways (`--port`, proxy, broker), in the order of
    /// `init.listeners`.
    pub gateways: Vec<crate::egress::Gateway>,
    /// What hides the host's listening sockets if the eBPF unix policy,
    /// planned in `watch`, fails to attach (see [`RunPlan::unix_policy_lost`]).
    pub unattached_unix_hiding: Vec<crate::mounts::MountOp>,
}

impl RunPlan {
    /// The unix policy did not attach: no mirrors, and hide what the host
    /// has listening now, as in a run that never planned the policy.
    pub fn unix_policy_lost(&mut self) {
        self.late.unix_mirrors.clear();
        self.late
            .hide_sockets
            .extend(std::mem::take(&mut self.unattached_unix_hiding));
    }
}

/// Decides the whole run, or refuses it.
pub fn decide(request: &Request, facts: &HostFacts) -> Result<RunPlan, Refusal> {
    let policy = request.policy;
    let host = facts.host;
    let capture = request.log.is_some();
    let mut ledger = crate::guarantee::requested(policy, host, capture)?;
    binds_hiding_roots(policy)?;

    // An ordinary user gets a user namespace in which the init is root,
    // mapped to that user; the agent stays that user, without capabilities.
    let user_namespace = !host.root;
    if facts.on_behalf && policy.user.is_some() {
        return Err(Refusal::new(
            exit::REFUSED,
            "--user is not available through the service: the agent runs as you; drop --user",
        ));
    }
    let identity = match (&policy.user, user_namespace) {
        (Some(_), true) => {
            return Err(Refusal::new(
                exit::REFUSED,
                "--user needs tartaros to run as root; drop --user",
            ));
        }
        (_, true) => Identity { uid: 0, gid: 0 },
        (Some(name), false) => facts
            .files
            .user(name)
            .map_err(|e| Refusal::new(exit::REFUSED, e))?,
        (None, false) => {
            let env = |name: &str| lookup_env(request.launcher_env, name);
            crate::credentials::choose(None, facts.current, &env)
                .map_err(|e| Refusal::new(exit::REFUSED, e))?
        }
    };
    if !user_namespace {
        for warning in unwritable_roots(policy, identity, facts.files) {
            ledger.warn(warning);
        }
    }

    let materialize = absent_denies(policy, facts.files, &mut ledger)?;
    linked_denies(policy, facts.files, &mut ledger)?;

    // The agent must not open, truncate, rename or delete the log, even
    // when it lies inside a writable root: it is denied like a secret.
    let mut mount_policy = policy.clone();
    mount_policy
        .read_denies
        .extend(request.log.map(Path::to_path_buf));
    // So is the placeholder registry, where the agent is its owner (an
    // ordinary user's run, uid 0): a lock on it stalled the user's other
    // runs, and with the registry in a root (`--write /tmp`) a marker
    // replaced let this run's end remove a placeholder another run's deny
    // is mounted on.
    if user_namespace || identity.uid == 0 {
        mount_policy
            .read_denies
            .extend(facts.placeholder_registry.map(Path::to_path_buf));
    }
    let table = match facts.mount_table {
        Some(text) => crate::mount_aliases::Table::parse(text).map_err(|e| e.to_string()),
        None => Err("failed to read the mount table /proc/self/mountinfo".to_string()),
    };
    let same_objects = deny_aliases(&mut mount_policy, &table, &mut ledger)?;
    // The stages create the log and the placeholders before the init's
    // mounts; another mount of either shows what the original shows.
    let exists = |path: &Path| {
        let path = same_objects
            .iter()
            .find_map(|(alias, original)| (alias == path).then_some(original.as_path()))
            .unwrap_or(path);
        if materialize.iter().any(|p| p == path) {
            return Some(true);
        }
        if request.log == Some(path) {
            return Some(false);
        }
        facts
            .files
            .stat(path, true)
            .map(|s| s.kind == PathKind::Dir)
    };
    let watch = watch_options(request, facts.shared_programs, &mut ledger)?;
    let unix_mirrors = match &watch {
        Some(w) if w.unix_policy => w.unix_allowed.clone(),
        _ => Vec::new(),
    };
    let mut mounts =
        crate::mounts::plan_with_mirrors(&mount_policy, request.cwd, &exists, unix_mirrors.len());
    // With the eBPF unix policy every allowed socket name is looked up
    // through a mirror that follows no symlink, and every other name is
    // refused: hiding the host's sockets would add nothing but start-up
    // time. Without it, hiding those listening now is what is left; and
    // should the policy fail to attach, the stage adds the same hiding. A
    // socket shown again by another mount is hidden there too.
    let mut sockets = facts.host_sockets.to_vec();
    if let Ok(table) = &table {
        for socket in facts.host_sockets {
            let again = table.aliases(socket).into_iter().filter(|a| a.same_object);
            sockets.extend(again.map(|a| a.path));
        }
    }
    let hiding = crate::mounts::hide_sockets(&mounts, &mount_policy, &sockets);
    let unattached_unix_hiding = if unix_mirrors.is_empty() {
        mounts.extend(hiding);
        Vec::new()
    } else {
        hiding
    };
    // Landlock holds the read denies and their other mounts too, not the log
    // or the registry: never replaced by a rename, their mounts hide them.
    let mut landlock_policy = mount_policy.clone();
    let hidden = [request.log, facts.placeholder_registry];
    landlock_policy
        .read_denies
        .retain(|d| !hidden.contains(&Some(d.as_path())));
    let init = Plan {
        argv: request.argv.to_vec(),
        env: crate::environment::agent_env_with(policy, request.launcher_env, request.setenv),
        cwd: request.cwd.to_path_buf(),
        identity,
        user_namespace,
        mounts,
        listeners: Vec::new(),
        landlock: host
            .landlock_abi
            .filter(|_| ledger.installed(Guarantee::LandlockFilesystem))
            .map(|abi| crate::landlock::plan(&landlock_policy, abi)),
        seccomp: ledger.installed(Guarantee::Seccomp).then_some(SeccompPlan {
            strict: policy.harden_syscalls,
            deny_unix: policy.deny_unix,
            host_terminal: false,
        }),
        strict: policy.strict,
        pty: request.pty,
        scope: crate::scope::ScopeMounts::of(policy, identity),
        // The agent keeps the launcher's own ids (identity_map.rs).
        map_user: user_namespace.then_some(facts.current),
        // Only the agent's own user namespace makes RLIMIT_NPROC a per-run
        // bound (as root the uid's count is host-wide, and the cgroup holds).
        max_tasks: policy
            .max_processes
            .filter(|_| user_namespace && ledger.installed(Guarantee::MaxProcs)),
        // Known once the cgroups exist (supervisor.rs).
        limit_cgroups: Vec::new(),
        ipc: crate::tmpfs_bounds::ipc_of(policy),
        user_counts: host
            .user_counts
            .filter(|_| user_namespace)
            .map(crate::user_counts::of),
        caller_attributes: None,
        groups: Vec::new(),
    };

    let cgroup = ledger.installed(Guarantee::Cgroup).then_some(Limits {
        max_procs: policy.max_processes,
        max_memory: policy.max_memory,
    });
    let gateways = if ledger.installed(Guarantee::Gateways) {
        let transparent = watch.as_ref().is_some_and(|w| w.transparent_port.is_some());
        crate::egress::plan(policy, transparent)
    } else {
        Vec::new()
    };
    let mut init = init;
    init.listeners = gateways.iter().map(|g| g.listen).collect();
    Ok(RunPlan {
        init,
        late: Late {
            unix_mirrors,
            hide_sockets: Vec::new(),
        },
        ledger,
        materialize,
        cgroup,
        watch,
        gateways,
        unattached_unix_hiding,
    })
}

fn lookup_env(env: &[(String, String)], name: &str) -> Option<String> {
    env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
}

/// The eBPF programs to attach, if the connect filter is installed (it
/// needs root and the run's own cgroup, so `None` means no cgroup or no
/// eBPF at all).
fn watch_options(
    request: &Request,
    shared: bool,
    ledger: &mut Ledger,
) -> Result<Option<AttachOptions>, Refusal> {
    let filter = ledger.installed(Guarantee::ConnectFilter);
    if !filter && !ledger.installed(Guarantee::UnixSocketPolicy) && !shared {
        return Ok(None);
    }
    let policy = request.policy;
    let mut options = crate::kernel_watch::options(
        policy,
        ledger.installed(Guarantee::EbpfCapture),
        request.log_buffer,
    );
    options.filter = filter;
    options.unix_policy &= ledger.installed(Guarantee::UnixSocketPolicy);
    if options.unix_policy
        && let Err(why) = crate::kernel_watch::unix_roots_fit(&options)
    {
        ledger.lose(Guarantee::UnixSocketPolicy, why)?;
        options.unix_policy = false;
    }
    if !options.filter && !options.unix_policy && !shared {
        return Ok(None);
    }
    if !ledger.installed(Guarantee::TransparentInterception) {
        options.transparent_port = None;
    }
    Ok(Some(options))
}

/// A `--bind` onto a writable root or the private /tmp, or onto a
/// directory above one, would show its source in the root's place: a
/// read-only tree instead of the agent's work, and to the unix policy,
/// which allows socket names under the root, the source's sockets (the
/// mirror of a root is whatever is mounted there). A bind below a root is
/// fine: the mirror covers it (`unix_mirror.rs`).
fn binds_hiding_roots(policy: &Policy) -> Result<(), Refusal> {
    let tmp = PathBuf::from("/tmp");
    let private_tmp = policy.private_tmp.then_some(&tmp);
    for root in policy.writable_roots.iter().chain(private_tmp) {
        if let Some(bind) = policy.binds.iter().find(|b| root.starts_with(&b.target)) {
            return Err(Refusal::new(
                exit::REFUSED,
                format!(
                    "--bind {} {} would hide the writable root {}; bind it elsewhere",
                    bind.source.display(),
                    bind.target.display(),
                    root.display()
                ),
            ));
        }
    }
    Ok(())
}

/// The absent denied paths the agent could create, as directories to make
/// (`--materialize`, with their missing parents, outermost first). Without
/// `--materialize` such a deny cannot hold: refused under `--strict`,
/// degraded otherwise.
fn absent_denies(
    policy: &Policy,
    files: &dyn Facts,
    ledger: &mut Ledger,
) -> Result<Vec<PathBuf>, Refusal> {
    let mut create: Vec<PathBuf> = Vec::new();
    let absent: Vec<&PathBuf> = policy
        .read_denies
        .iter()
        .chain(&policy.write_denies)
        .filter(|p| files.stat(p, false).is_none())
        .collect();
    // Outside the roots only the host can create it, and a file it makes
    // there during the run (a first `gh auth login`) is not under the
    // cover: the deny's mount needs the path to exist at the start. Landlock
    // holds it all the same (landlock_siblings.rs): the name lies under no
    // rule that reads it, and nothing outside the roots is writable.
    let landlock = ledger.installed(Guarantee::LandlockFilesystem);
    let held = |p: &Path| landlock && crate::landlock::holds_deny(p);
    if let Some(path) = absent.iter().find(|p| !policy.is_writable(p) && !held(p)) {
        ledger.lose(
            Guarantee::DenyMounts,
            format!(
                "denied path {} does not exist, so a file the host creates there during the run would be readable; create it (an empty file or directory) first",
                path.display()
            ),
        )?;
    }
    for path in absent.into_iter().filter(|p| policy.is_writable(p)) {
        if !policy.materialize_absent_handoff {
            ledger.lose(
                Guarantee::DenyMounts,
                format!(
                    "denied path {} does not exist, so the agent could create it; create it first or pass --materialize",
                    path.display()
                ),
            )?;
            continue;
        }
        // Only below the root the placeholder belongs to; a deny under a
        // private /tmp or a tmpfs alone is hidden from the sandbox anyway.
        let Some((root, _)) = crate::materialize::anchor(policy, path) else {
            continue;
        };
        let mut missing: Vec<PathBuf> = path
            .ancestors()
            .take_while(|a| *a != root && files.stat(a, false).is_none())
            .map(Path::to_path_buf)
            .collect();
        missing.reverse();
        for dir in missing {
            if !create.contains(&dir) {
                create.push(dir);
            }
        }
    }
    Ok(create)
}

/// A denied file with more than one name: the deny guards the name it
/// was given, and another link (planted by an earlier run, say) reads and
/// writes the same file. Refused under `--strict`, degraded otherwise.
fn linked_denies(policy: &Policy, files: &dyn Facts, ledger: &mut Ledger) -> Result<(), Refusal> {
    let denies = policy.read_denies.iter().chain(&policy.write_denies);
    for path in denies {
        let Some(stat) = files.stat(path, false) else {
            continue;
        };
        if stat.kind == PathKind::File && stat.links > 1 {
            ledger.lose(
                Guarantee::DenyMounts,
                format!(
                    "denied file {} has {} hard links, and the deny holds only this name; remove the other links (find / -xdev -samefile {}) or deny them too",
                    path.display(),
                    stat.links,
                    path.display()
                ),
            )?;
        }
    }
    for dir in &policy.read_denies {
        if files.stat(dir, false).map(|s| s.kind) == Some(PathKind::Dir) {
            linked_below_denied(dir, files, ledger)?;
        }
    }
    Ok(())
}

/// How many entries of one read-denied directory are looked at for files
/// with other hard links: 10,000 added 13 ms to a start here, warm and
/// idle, 35 ms under a load of 7 on 2 CPUs (docs/architecture.md).
pub const LINK_WALK_LIMIT: usize = 20_000;

/// A file under a read-denied directory with another name elsewhere is
/// read through that name, as a denied file named by the policy is; a
/// directory too large to look through in full is said to be unchecked.
fn linked_below_denied(dir: &Path, files: &dyn Facts, ledger: &mut Ledger) -> Result<(), Refusal> {
    let walk = files.linked_below(dir, LINK_WALK_LIMIT);
    if let Some((file, links)) = walk.linked.first() {
        let more = match walk.linked.len() - 1 {
            0 => String::new(),
            n => format!(" ({n} more files there have other links too)"),
        };
        let why = format!(
            "{} under the denied directory {} has {links} hard links{more}, and the deny holds only this name; remove the other links (find / -xdev -samefile {}) or deny them too",
            file.display(),
            dir.display(),
            file.display()
        );
        ledger.lose(Guarantee::DenyMounts, why)?;
    }
    if walk.stopped {
        let why = format!(
            "the denied directory {} has more than {LINK_WALK_LIMIT} entries, so its files were not all checked for other hard links; deny the secret files or smaller directories in it instead",
            dir.display()
        );
        ledger.lose(Guarantee::DenyMounts, why)?;
    }
    Ok(())
}

/// Denies every other path at which the host's mount table shows a denied
/// path, the same way: a bind of a parent elsewhere, or a mount of a part.
/// Returns `(alias, original)` for the aliases that are the denied object
/// itself. A table that cannot be read loses the deny guarantee.
fn deny_aliases(
    policy: &mut Policy,
    table: &Result<crate::mount_aliases::Table, String>,
    ledger: &mut Ledger,
) -> Result<Vec<(PathBuf, PathBuf)>, Refusal> {
    let mut same_objects = Vec::new();
    if policy.read_denies.is_empty() && policy.write_denies.is_empty() {
        return Ok(same_objects);
    }
    let table = match table {
        Ok(table) => table,
        Err(why) => {
            let why = format!("{why}, so other mounts of the denied paths stay open");
            ledger.lose(Guarantee::DenyMounts, why)?;
            return Ok(same_objects);
        }
    };
    for denies in [&mut policy.read_denies, &mut policy.write_denies] {
        let mut more = Vec::new();
        for path in denies.iter() {
            for alias in table.aliases(path) {
                if alias.same_object {
                    same_objects.push((alias.path.clone(), path.clone()));
                }
                more.push(alias.path);
            }
        }
        denies.extend(more);
        denies.sort();
        denies.dedup();
    }
    Ok(same_objects)
}

/// Warnings for writable roots the agent's user cannot write.
fn unwritable_roots(policy: &Policy, identity: Identity, files: &dyn Facts) -> Vec<String> {
    policy
        .writable_roots
        .iter()
        .filter_map(|root| {
            let stat = files.stat(root, true)?;
            let writable = identity.uid == 0
                || (stat.uid == identity.uid && stat.mode & 0o200 != 0)
                || (stat.gid == identity.gid && stat.mode & 0o020 != 0)
                || stat.mode & 0o002 != 0;
            (!writable).then(|| {
                format!(
                    "the agent runs as uid {} and cannot write {} (owner uid {}); chown it, or choose the user with --user",
                    identity.uid,
                    root.display(),
                    stat.uid
                )
            })
        })
        .collect()
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "decide_alias_tests.rs"]
mod alias_tests;
