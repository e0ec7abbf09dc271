//! Filesystem confinement against the real kernel: Landlock for writes and
//! read scope, the mount namespace for denies inside granted trees.

mod common;
use common::*;

#[test]
fn writes_outside_the_roots_fail_and_leave_no_file_while_writes_inside_succeed() {
    if !can_run("writes_outside") {
        return;
    }
    let work = Dir::new();
    let outside = Dir::open_to_all();
    let code = format!(
        "{ATTEMPT}\nattempt('outside', lambda: open('{}/escape', 'w'))\nattempt('mkdir-outside', lambda: os.mkdir('{}/d'))\nattempt('inside', lambda: open('{}/ok', 'w').write('x'))",
        outside.path().display(),
        outside.path().display(),
        work.path().display()
    );
    let out = python(
        &["--strict", "--write", work.path().to_str().unwrap()],
        work.path(),
        &code,
    );
    // The read-only base answers before Landlock does.
    expect(&out, "outside", "EROFS");
    expect(&out, "mkdir-outside", "EROFS");
    expect(&out, "inside", "OK");
    assert!(!outside.join("escape").exists());
    assert!(!outside.join("d").exists());
    assert_eq!(std::fs::read_to_string(work.join("ok")).unwrap(), "x");
}

#[test]
fn a_read_denied_file_cannot_be_read_by_path_symlink_proc_root_or_hard_link() {
    if !can_run("read_denied_file") {
        return;
    }
    let work = Dir::new();
    let secret = work.file("secret.env", "TOKEN=hunter2");
    work.file("public.txt", "public");
    std::os::unix::fs::symlink(&secret, work.join("link")).unwrap();
    let w = work.path().display();
    let code = format!(
        "{ATTEMPT}
attempt('path', lambda: open('{w}/secret.env').read())
attempt('symlink', lambda: open('{w}/link').read())
attempt('proc-root', lambda: open('/proc/self/root{w}/secret.env').read())
attempt('proc-cwd', lambda: open('/proc/self/cwd/secret.env').read())
attempt('hardlink', lambda: os.link('{w}/secret.env', '{w}/hl'))
attempt('rename', lambda: os.rename('{w}/secret.env', '{w}/moved'))
attempt('unlink', lambda: os.unlink('{w}/secret.env'))
attempt('control', lambda: open('{w}/public.txt').read())"
    );
    let out = python(
        &[
            "--strict",
            "--write",
            work.path().to_str().unwrap(),
            "--read-deny",
            secret.to_str().unwrap(),
        ],
        work.path(),
        &code,
    );
    for label in ["path", "symlink", "proc-root", "proc-cwd"] {
        expect(&out, label, "EACCES");
    }
    expect(&out, "hardlink", "EXDEV");
    expect(&out, "rename", "EBUSY");
    expect(&out, "unlink", "EBUSY");
    expect(&out, "control", "OK");
    assert!(!stdout(&out).contains("hunter2"));
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "TOKEN=hunter2");
}

#[test]
fn a_read_denied_directory_is_empty_and_frozen() {
    if !can_run("read_denied_dir") {
        return;
    }
    let work = Dir::new();
    work.file("keys/id_rsa", "PRIVATE");
    let w = work.path().display();
    let code = format!(
        "{ATTEMPT}
attempt('list', lambda: os.listdir('{w}/keys'))
attempt('read', lambda: open('{w}/keys/id_rsa').read())
attempt('create', lambda: open('{w}/keys/new', 'w'))
attempt('rename', lambda: os.rename('{w}/keys', '{w}/k2'))"
    );
    let keys = work.join("keys");
    let out = python(
        &[
            "--strict",
            "--write",
            work.path().to_str().unwrap(),
            "--read-deny",
            keys.to_str().unwrap(),
        ],
        work.path(),
        &code,
    );
    expect(&out, "list", "EACCES");
    expect(&out, "read", "EACCES");
    expect(&out, "create", "EACCES");
    expect(&out, "rename", "EBUSY");
}

#[test]
fn a_write_denied_file_cannot_be_written_truncated_renamed_or_deleted_nor_its_parent_moved() {
    if !can_run("write_denied") {
        return;
    }
    let work = Dir::new();
    let hook = work.file(".git/hooks/pre-commit", "#!/bin/sh\nexit 0\n");
    work.file(".git/config", "[core]\n");
    let w = work.path().display();
    let code = format!(
        "{ATTEMPT}
attempt('write', lambda: open('{w}/.git/hooks/pre-commit', 'a').write('evil'))
attempt('truncate', lambda: os.truncate('{w}/.git/hooks/pre-commit', 0))
attempt('rename', lambda: os.rename('{w}/.git/hooks/pre-commit', '{w}/x'))
attempt('unlink', lambda: os.unlink('{w}/.git/hooks/pre-commit'))
attempt('rename-parent', lambda: os.rename('{w}/.git/hooks', '{w}/.git/h2'))
attempt('rename-grandparent', lambda: os.rename('{w}/.git', '{w}/g2'))
attempt('read', lambda: open('{w}/.git/hooks/pre-commit').read())
attempt('sibling', lambda: open('{w}/.git/config', 'a').write('x'))"
    );
    let out = python(
        &[
            "--strict",
            "--write",
            work.path().to_str().unwrap(),
            "--write-deny",
            hook.to_str().unwrap(),
        ],
        work.path(),
        &code,
    );
    expect(&out, "write", "EROFS");
    expect(&out, "truncate", "EROFS");
    // The read-only bind is its own mount: rename out of it is cross-device.
    expect(&out, "rename", "EXDEV");
    expect(&out, "unlink", "EBUSY");
    expect(&out, "rename-parent", "EBUSY");
    expect(&out, "rename-grandparent", "EBUSY");
    expect(&out, "read", "OK");
    expect(&out, "sibling", "OK");
    assert_eq!(
        std::fs::read_to_string(&hook).unwrap(),
        "#!/bin/sh\nexit 0\n"
    );
}

#[test]
fn read_scope_granted_hides_directories_that_were_not_granted() {
    if !can_run("read_scope_granted") {
        return;
    }
    let work = Dir::new();
    let home = Dir::open_to_all();
    home.file(".aws/credentials", "aws_secret");
    std::fs::set_permissions(
        home.join(".aws/credentials"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let h = home.path().display();
    let code = format!(
        "{ATTEMPT}
attempt('home', lambda: open('{h}/.aws/credentials').read())
attempt('list-home', lambda: os.listdir('{h}'))
attempt('usr', lambda: open('/usr/bin/env', 'rb').read(1))
attempt('root', lambda: open('{}/mine', 'w'))",
        work.path().display()
    );
    let granted = python(
        &[
            "--strict",
            "--read-scope",
            "granted",
            "--write",
            work.path().to_str().unwrap(),
        ],
        work.path(),
        &code,
    );
    expect(&granted, "home", "EACCES");
    expect(&granted, "list-home", "EACCES");
    expect(&granted, "usr", "OK");
    expect(&granted, "root", "OK");
    // Control: the same read succeeds with the default scope.
    let all = python(
        &["--strict", "--write", work.path().to_str().unwrap()],
        work.path(),
        &code,
    );
    expect(&all, "home", "OK");
}

#[test]
fn materialize_holds_an_absent_deny_and_hands_the_tree_back() {
    if !can_run("materialize") {
        return;
    }
    let work = Dir::new();
    let env = work.join(".env");
    let code = format!(
        "{ATTEMPT}\nattempt('create', lambda: open('{}', 'w').write('stolen'))",
        env.display()
    );
    let out = python(
        &[
            "--strict",
            "--materialize",
            "--write",
            work.path().to_str().unwrap(),
            "--read-deny",
            env.to_str().unwrap(),
        ],
        work.path(),
        &code,
    );
    // The placeholder is an empty directory under a mode-000 read-only tmpfs.
    expect(&out, "create", "EISDIR");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        !env.exists(),
        "the placeholder must be removed after the run"
    );
}

#[test]
fn private_tmp_is_private_and_writable() {
    if !can_run("private_tmp") {
        return;
    }
    let work = Dir::new();
    let name = format!("tartaros-private-tmp-{}", std::process::id());
    let code = format!("{ATTEMPT}\nattempt('tmp', lambda: open('/tmp/{name}', 'w').write('x'))");
    let out = python(&["--strict", "--private-tmp"], work.path(), &code);
    expect(&out, "tmp", "OK");
    assert!(!std::path::Path::new("/tmp").join(&name).exists());
    // Control: without --private-tmp, /tmp is outside the roots (and on
    // the read-only base).
    let out = python(&["--strict"], work.path(), &code);
    expect(&out, "tmp", "EROFS");
}
