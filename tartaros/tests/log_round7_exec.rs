//! A script exec names the script the kernel ran, from the kernel's own
//! open of it (`FAN_OPEN_EXEC`), not only the string the caller passed:
//! a link re-pointed after the exec, `/proc/self/fd/N`, and a script
//! whose interpreter is a script, `execveat` of a descriptor. The exec
//! record's `binary` is the interpreter (`bprm->file`), so before, the
//! script itself was named nowhere. Needs root and gcc (fails under
//! CI=true without).

mod common;

use common::logged::*;
use common::*;
use serde_json::Value;
use std::path::Path;

const AGENT: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static char *const env[] = {0};

static int run(const char *path, const char *marker) {
    pid_t pid = fork();
    if (pid == 0) {
        char *const argv[] = {"x", (char *)marker, 0};
        execve(path, argv, env);
        _exit(99);
    }
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main(int argc, char **argv) {
    /* Names on the stack: a string on a page not yet faulted in cannot
       be read by the capture at the call's entry. */
    char evil[] = "evil.sh", link[] = "run-tests", prog[] = "/usr/bin/true";
    if (chdir(argv[1])) return 9;
    /* 1. A harmless name, re-pointed once the script has run. */
    if (symlink(evil, link) || !run("./run-tests", "by-link")) return 10;
    if (unlink(link) || symlink(prog, link)) return 11;
    /* 2. Through /proc/self/fd, the file renamed afterwards. */
    int fd = open("fd.sh", O_RDONLY);
    char p[64];
    snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
    if (fd < 0 || !run(p, "by-proc-fd")) return 12;
    char from[] = "fd.sh", to[] = "elsewhere.sh";
    if (rename(from, to)) return 13;
    /* 3. execveat of a descriptor, no name at all. */
    int at = open("at.sh", O_RDONLY);
    pid_t pid = fork();
    if (pid == 0) {
        char *const args[] = {"x", "by-execveat", 0};
        syscall(SYS_execveat, at, "", args, env, AT_EMPTY_PATH);
        _exit(99);
    }
    int st;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) return 14;
    /* 4. A script whose interpreter is a script. */
    if (!run("./outer.sh", "nested")) return 15;
    /* 5. A program through a link: no script. */
    if (!run("./run-tests", "program")) return 16;
    return 0;
}
"#;

fn exec_with<'a>(records: &'a [Value], marker: &str) -> &'a Value {
    records
        .iter()
        .find(|r| {
            r["kind"] == "exec"
                && allowed(r)
                && r["target"]["argv"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|v| v == marker))
        })
        .unwrap_or_else(|| panic!("no exec with {marker}: {records:#?}"))
}

#[test]
fn a_script_exec_names_the_script_the_kernel_ran() {
    if !usable("exec_script") {
        return;
    }
    let (root, bin, logs) = (Dir::new(), Dir::open_to_all(), Dir::new());
    let agent = compile(&bin, "agent", AGENT);
    let dir = root.path().to_str().unwrap();
    let script = |name: &str, body: &str| {
        let path = root.file(name, body);
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
    };
    for name in ["evil.sh", "fd.sh", "at.sh", "inner.sh"] {
        script(name, "#!/bin/sh\nexit 0\n");
    }
    script("outer.sh", &format!("#!{dir}/inner.sh\nexit 0\n"));
    chown(root.path(), NOBODY);
    let (out, records) = run_logged(&root, &logs, &[agent.to_str().unwrap(), dir]);
    assert_eq!(out.status.code(), Some(0), "agent: {}", stderr(&out));
    let dash = std::fs::canonicalize("/bin/sh").unwrap();
    let dash = dash.to_str().unwrap();
    for (marker, script) in [
        ("by-link", "evil.sh"),
        ("by-proc-fd", "fd.sh"),
        ("nested", "outer.sh"),
    ] {
        let e = exec_with(&records, marker);
        assert_eq!(
            field(e, "script"),
            Some(format!("{dir}/{script}").as_str()),
            "{e}"
        );
        assert_eq!(field(e, "binary"), Some(dash), "{e}");
    }
    // execveat of a descriptor with an empty name: `path` is `/dev/fd/N`,
    // the name the interpreter is handed. The script is the kernel's
    // open, or, when none was reported, the record says it has no name.
    let at = exec_with(&records, "by-execveat");
    let kernel = format!("{dir}/at.sh");
    assert!(
        field(at, "script") == Some(kernel.as_str()) || at["target"]["script_unnamed"] == true,
        "{at}"
    );
    let nested = exec_with(&records, "nested");
    assert_eq!(
        nested["target"]["scripts"],
        serde_json::json!([format!("{dir}/outer.sh"), format!("{dir}/inner.sh")]),
        "{nested}"
    );
    let program = exec_with(&records, "program");
    assert_eq!(program["target"].get("script"), None, "{program}");
    // The readers show the script beside the name that was run.
    let log = logs.join("effects.jsonl");
    let shown = stdout(&tartaros(
        &["log", "show", "--kind", "exec", log.to_str().unwrap()],
        root.path(),
    ));
    let line = shown
        .lines()
        .find(|l| l.contains("by-link"))
        .unwrap_or_else(|| panic!("no line for the link:\n{shown}"));
    assert!(
        line.contains(&format!("[runs {dash} {dir}/evil.sh]")),
        "{line}"
    );
}

/// A script whose interpreter is read-denied: the exec is refused on the
/// interpreter, which the record named nowhere (it was an exec of the
/// script refused for `file permissions?`). Now the record has the
/// script the kernel opened and the interpreter its `#!` line names, and
/// the readers give the rule that refused it.
#[test]
fn a_refused_interpreter_is_named_with_the_rule_that_refused_it() {
    if !usable("exec_refused_interpreter") {
        return;
    }
    let (root, secret) = (Dir::new(), secret_dir());
    let r = root.path().to_str().unwrap();
    let interpreter = secret.join("key");
    let script = root.file("s.sh", &format!("#!{}\n", interpreter.display()));
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // And a program whose own interpreter (`PT_INTERP`) is read-denied.
    let bin = Dir::open_to_all();
    let ld = secret.join("ld.so");
    let prog = bin.join("prog");
    let c = bin.file("prog.c", "int main(void) { return 0; }\n");
    let built = std::process::Command::new("/usr/bin/gcc")
        .arg(format!("-Wl,--dynamic-linker={}", ld.display()))
        .arg("-o")
        .arg(&prog)
        .arg(&c)
        .output()
        .unwrap();
    assert!(built.status.success(), "{}", stderr(&built));
    chown(root.path(), NOBODY);
    let logs = Dir::new();
    let log = logs.join("effects.jsonl");
    let both = format!("{}; {}", script.display(), prog.display());
    let out = tartaros(
        &[
            "run",
            "-q",
            "--write",
            r,
            "--read-deny",
            secret.path().to_str().unwrap(),
            "--log",
            log.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &both,
        ],
        root.path(),
    );
    assert_eq!(out.status.code(), Some(126), "{}", stderr(&out));
    let records = records(&log);
    let refused_exec = |path: &Path| {
        records
            .iter()
            .find(|e| {
                e["kind"] == "exec"
                    && e["decision"] == "denied"
                    && field(e, "path") == path.to_str()
            })
            .unwrap_or_else(|| panic!("no refused exec of {path:?}: {records:#?}"))
    };
    let refused = refused_exec(&script);
    assert_eq!(refused["errno"], 13, "{refused}");
    assert_eq!(field(refused, "script"), script.to_str(), "{refused}");
    assert_eq!(
        field(refused, "interpreter"),
        interpreter.to_str(),
        "{refused}"
    );
    let program = refused_exec(&prog);
    assert_eq!(field(program, "interpreter"), ld.to_str(), "{program}");
    assert_eq!(
        field(program, "interpreter_source"),
        Some("elf"),
        "{program}"
    );
    assert_eq!(program["target"].get("script"), None, "{program}");
    let summary = stdout(&tartaros(
        &["log", "summary", log.to_str().unwrap()],
        Path::new("/"),
    ));
    let rule = format!("[read_denies {}]", secret.path().display());
    for name in ["s.sh", "prog"] {
        assert!(
            summary
                .lines()
                .any(|l| l.contains(name) && l.contains(&rule)),
            "{name}: {summary}"
        );
    }
}
