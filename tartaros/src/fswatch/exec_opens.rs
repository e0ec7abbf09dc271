//! The files an exec opened to run, as the kernel named them
//! (`FAN_OPEN_EXEC`), for the `script` of an exec record.
//!
//! The exec record's `path` is the string the caller passed (a symlink, a
//! `/proc/self/fd/N`) and its `binary` is `bprm->file` when the new image
//! starts: for a script, its interpreter. The script itself is closed by
//! then (`binfmt_script` hands `bprm->file` on to the interpreter), so no
//! kernel object of the exec tracepoint names it: an agent that ran
//! `./run-tests`, a link to `evil.sh`, and then pointed the link at
//! `/usr/bin/true` had a log naming only the link and `/usr/bin/dash`.
//! The kernel opens every file of an exec with `open_exec`, which queues
//! `FAN_OPEN_EXEC` on the filesystems the group marks (those of the
//! writable roots, where every script the agent can write lives), in
//! order: the file the caller named, the interpreter of each `#!` line,
//! then the ELF interpreter (`ld.so`). The files before the first one
//! that is the record's `binary` are the scripts.
//!
//! See docs/ebpf.md, "Scripts: the file the kernel ran".

use std::collections::HashMap;

use serde_json::Value;

use crate::effectlog::{Decision, Record, names};

/// Opens kept per process until its exec record (a `#!` chain is at
/// most 5 deep, plus the binary and `ld.so`; more is another exec's).
const KEPT: usize = 16;

/// Exec opens of sandbox threads, per process, in queue order.
#[derive(Debug, Default)]
pub(super) struct ExecOpens {
    by_process: HashMap<u32, Vec<(u32, String)>>,
}

impl ExecOpens {
    /// One `FAN_OPEN_EXEC` of thread `tid` of process `tgid`.
    pub fn opened(&mut self, tgid: u32, tid: u32, path: &str) {
        let opens = self.by_process.entry(tgid).or_default();
        if opens.len() < KEPT {
            opens.push((tid, path.to_string()));
        }
    }

    /// A process exited: an exec of it that failed past the point of no
    /// return (killed, no record) leaves opens nothing else takes.
    pub fn exited(&mut self, tgid: u32) {
        self.by_process.remove(&tgid);
    }

    /// Names the scripts of an exec record from the opens of its process
    /// (and forgets them: every open so far belongs to this exec or an
    /// earlier one). A refused exec forgets its thread's opens: the
    /// kernel opened the file, then the exec failed.
    pub fn name(&mut self, r: &mut Record, tid: u32) {
        if r.decision != Decision::Allowed {
            let mut opened = Vec::new();
            if let Some(opens) = self.by_process.get_mut(&r.pid) {
                opens.retain(|(t, p)| {
                    if *t == tid {
                        opened.push(p.clone());
                    }
                    *t != tid
                });
                if opens.is_empty() {
                    self.by_process.remove(&r.pid);
                }
            }
            name_refused(r, &opened);
            return;
        }
        let opens = self.by_process.remove(&r.pid).unwrap_or_default();
        if opens.is_empty() {
            mark_unnamed_script(r);
            return;
        }
        let Some(binary) = r.target.get("binary").and_then(Value::as_str) else {
            return;
        };
        // No open before the interpreter's (a memfd, or a file on no
        // marked filesystem, is not reported): a script run by descriptor
        // is still said to have no name. Only the empty case was checked,
        // and the interpreter's own open on the root's filesystem skipped it.
        let Some(at) = opens
            .iter()
            .position(|(_, p)| p == binary)
            .filter(|&at| at > 0)
        else {
            mark_unnamed_script(r);
            return;
        };
        let thread = opens[at].0;
        if opens.iter().any(|(t, _)| *t != thread) {
            // Two threads of the process were in an exec at once (one
            // won, the other was killed in it): whose script ran is not
            // known from the opens.
            r.target.insert("script_unverified", true);
            return;
        }
        let scripts: Vec<String> = opens[..at].iter().map(|(_, p)| p.clone()).collect();
        r.target.insert("script", scripts[0].clone());
        if scripts.len() > 1 {
            r.target.insert(
                "scripts",
                Value::Array(scripts.into_iter().map(Value::String).collect()),
            );
        }
    }
}

/// A refused exec whose first files the kernel opened (`opened`, in
/// order): the refusal was on a later file. When the last one is a
/// script, that is its interpreter, which the record named nowhere: a
/// `#!/home/u/.ssh/x` script's refusal was logged as an exec of the
/// script refused for `file permissions?`, the read-denied interpreter in
/// no record. The interpreter is read from the script's `#!` line now
/// (`interpreter_source: "script"`: what the file says, not a name the
/// kernel reported), without following a link planted at its name.
fn name_refused(r: &mut Record, opened: &[String]) {
    const EACCES: u64 = 13;
    const EPERM: u64 = 1;
    let (Some(first), Some(last)) = (opened.first(), opened.last()) else {
        return;
    };
    if !matches!(r.errno, EACCES | EPERM) {
        return;
    }
    let Some((interpreter, elf)) = interpreter_line(last) else {
        return;
    };
    // A program alone (its `ld.so` refused) is no script.
    if !(elf && opened.len() == 1) {
        r.target.insert("script", first.clone());
    }
    r.target.insert("interpreter", interpreter);
    r.target
        .insert("interpreter_source", if elf { "elf" } else { "script" });
}

/// The interpreter a `#!` line at the start of `path` names (the
/// kernel reads at most 256 bytes of it), or the program interpreter
/// (`PT_INTERP`, `ld.so`) of an ELF file, which the kernel opens before
/// the point of no return too.
fn interpreter_line(path: &str) -> Option<(String, bool)> {
    use std::io::Read as _;
    let file = crate::mount_tree::open_file_no_symlinks(&names::on_disk(path)).ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut head = Vec::with_capacity(256);
    (&file).take(256).read_to_end(&mut head).ok()?;
    if head.starts_with(b"\x7fELF") {
        return elf_interpreter(&file, &head).map(|i| (i, true));
    }
    let line = head.strip_prefix(b"#!")?;
    let line = line.split(|&b| b == b'\n').next()?;
    let name: Vec<u8> = line
        .iter()
        .copied()
        .skip_while(|b| *b == b' ' || *b == b'\t')
        .take_while(|b| !matches!(b, b' ' | b'\t' | 0))
        .collect();
    (!name.is_empty()).then(|| (names::display(&name), false))
}

/// `PT_INTERP` of a 64-bit little-endian ELF file (`head`: its first
/// bytes), read at most 4 KiB.
fn elf_interpreter(file: &std::fs::File, head: &[u8]) -> Option<String> {
    use std::os::unix::fs::FileExt as _;
    const PT_INTERP: u32 = 3;
    let u16_at =
        |b: &[u8], at: usize| Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?));
    let u32_at =
        |b: &[u8], at: usize| Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?));
    let u64_at =
        |b: &[u8], at: usize| Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?));
    // ELFCLASS64, ELFDATA2LSB: the only binaries this host runs natively.
    if head.get(4..6)? != [2, 1] {
        return None;
    }
    let (phoff, phentsize, phnum) = (u64_at(head, 32)?, u16_at(head, 54)?, u16_at(head, 56)?);
    for i in 0..u64::from(phnum.min(64)) {
        let mut ph = [0u8; 56];
        let at = phoff.checked_add(i.checked_mul(u64::from(phentsize))?)?;
        file.read_exact_at(&mut ph, at).ok()?;
        if u32_at(&ph, 0)? != PT_INTERP {
            continue;
        }
        let (offset, size) = (u64_at(&ph, 8)?, u64_at(&ph, 32)?);
        let mut name = vec![0u8; usize::try_from(size.min(4096)).ok()?];
        file.read_exact_at(&mut name, offset).ok()?;
        let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        return (end > 0).then(|| names::display(&name[..end]));
    }
    None
}

/// A script with no open reported for it: run by descriptor
/// (`execveat(fd, "", AT_EMPTY_PATH)` of a memfd: `binfmt_script` hands
/// the interpreter `/dev/fd/N`, which names nothing once the process is
/// gone) or from a filesystem the group does not mark (the sandbox's
/// private `/dev/shm` and `/tmp`, which the agent can write: `path` is
/// then only its string). `binfmt_script` puts the script's name after
/// the interpreter and its one optional argument. Said so, not left for
/// a reviewer to take `path` for the kernel's name.
fn mark_unnamed_script(r: &mut Record) {
    let Some(path) = r.target.get("path").and_then(Value::as_str) else {
        return;
    };
    let argv = r.target.get("argv").and_then(Value::as_array);
    let at = |i: usize| argv.and_then(|a| a.get(i)).and_then(Value::as_str);
    // A program run by its own name is no script, whatever its arguments.
    let binary = r.target.get("binary").and_then(Value::as_str);
    if binary != Some(path) && (at(1) == Some(path) || at(2) == Some(path)) {
        r.target.insert("script_unnamed", true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::effectlog::Target;

    fn exec(pid: u32, binary: &str, decision: Decision) -> Record {
        let mut target = Target::new();
        target.insert("path", "/w/run-tests");
        target.insert("binary", binary);
        Record {
            kind: "exec",
            pid,
            ppid: 1,
            uid: 0,
            mono_ns: 1,
            wall_ns: 1,
            decision,
            errno: 0,
            target,
        }
    }

    #[test]
    fn the_files_opened_before_the_interpreter_are_the_scripts() {
        let mut opens = ExecOpens::default();
        for p in [
            "/w/evil.sh",
            "/w/inner.sh",
            "/usr/bin/dash",
            "/usr/lib/ld.so",
        ] {
            opens.opened(7, 7, p);
        }
        let mut r = exec(7, "/usr/bin/dash", Decision::Allowed);
        opens.name(&mut r, 7);
        assert_eq!(
            r.target.get("script").and_then(Value::as_str),
            Some("/w/evil.sh")
        );
        assert_eq!(
            r.target.get("scripts"),
            Some(&serde_json::json!(["/w/evil.sh", "/w/inner.sh"]))
        );
        // Forgotten: the next exec of the process starts afresh.
        opens.opened(7, 7, "/usr/bin/dash");
        let mut next = exec(7, "/usr/bin/dash", Decision::Allowed);
        opens.name(&mut next, 7);
        assert_eq!(next.target.get("script"), None);
    }

    #[test]
    fn a_failed_exec_leaves_no_script_for_the_next() {
        let mut opens = ExecOpens::default();
        // The kernel opened evil.sh, then the exec failed (its interpreter
        // is missing); the process then runs dash itself.
        opens.opened(7, 7, "/w/evil.sh");
        let mut failed = exec(7, "", Decision::Denied);
        opens.name(&mut failed, 7);
        opens.opened(7, 7, "/usr/bin/dash");
        let mut r = exec(7, "/usr/bin/dash", Decision::Allowed);
        opens.name(&mut r, 7);
        assert_eq!(r.target.get("script"), None);
    }

    #[test]
    fn racing_execs_of_two_threads_name_no_script() {
        let mut opens = ExecOpens::default();
        opens.opened(7, 8, "/w/benign.sh");
        opens.opened(7, 8, "/usr/bin/dash");
        opens.opened(7, 9, "/w/evil.sh");
        opens.opened(7, 9, "/usr/bin/dash");
        let mut r = exec(7, "/usr/bin/dash", Decision::Allowed);
        opens.name(&mut r, 9);
        assert_eq!(r.target.get("script"), None);
        assert_eq!(r.target.get("script_unverified"), Some(&Value::Bool(true)));
    }

    #[test]
    fn a_refused_exec_past_its_script_names_the_interpreter_line() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("s.sh");
        std::fs::write(&script, "#! \t/home/u/.ssh/x -e\nexit 0\n").unwrap();
        let script = script.to_str().unwrap();
        let mut opens = ExecOpens::default();
        opens.opened(7, 7, script);
        let mut r = exec(7, "", Decision::Denied);
        r.errno = 13;
        opens.name(&mut r, 7);
        assert_eq!(r.target.get("script").and_then(Value::as_str), Some(script));
        assert_eq!(
            r.target.get("interpreter").and_then(Value::as_str),
            Some("/home/u/.ssh/x")
        );
        // A link planted at the name is not followed.
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(script, &link).unwrap();
        assert_eq!(interpreter_line(link.to_str().unwrap()), None);
        // A program's own interpreter (ld.so).
        let elf = interpreter_line("/usr/bin/true").map(|(i, elf)| (i.contains("ld-linux"), elf));
        assert_eq!(elf, Some((true, true)));
    }

    #[test]
    fn a_script_run_from_a_descriptor_is_said_to_be_unnamed() {
        let mut opens = ExecOpens::default();
        let mut r = exec(7, "/usr/bin/dash", Decision::Allowed);
        r.target.insert("path", "/dev/fd/4");
        r.target
            .insert("argv", serde_json::json!(["/bin/sh", "/dev/fd/4", "x"]));
        opens.name(&mut r, 7);
        assert_eq!(r.target.get("script_unnamed"), Some(&Value::Bool(true)));
    }
}
