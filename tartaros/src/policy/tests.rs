use super::*;

fn build_flags(flags: FlagPolicy) -> Result<Policy, PolicyError> {
    build(None, flags, Path::new("/tmp"), &|_| true)
}

#[test]
fn unknown_toml_key_is_named() {
    let err = ConfigFile::parse(
        Path::new("p.toml"),
        "[policy]\nwritable_rots = [\"/tmp\"]\n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("writable_rots"), "{err}");
    assert!(err.contains("line 2"), "{err}");
}

#[test]
fn malformed_toml_has_line_and_column() {
    let err = ConfigFile::parse(Path::new("p.toml"), "[policy]\nisolate_pids = yes\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("line 2, column"), "{err}");
}

#[test]
fn relative_paths_in_files_are_refused_and_flags_resolve() {
    let file = ConfigFile::parse(
        Path::new("p.toml"),
        "[policy]\nwritable_roots = [\"src\"]\n",
    )
    .unwrap();
    let err = build(
        Some(file),
        FlagPolicy::default(),
        Path::new("/tmp"),
        &|_| true,
    )
    .unwrap_err();
    assert!(err.to_string().contains("relative path"));
    assert_eq!(
        resolve(Path::new("a/../b"), Path::new("/nonexistent-x")),
        PathBuf::from("/nonexistent-x/b")
    );
}

#[test]
fn lists_add_up_and_flag_scalars_win() {
    let file = ConfigFile::parse(
        Path::new("p.toml"),
        "[policy]\nwritable_roots = [\"/tmp\"]\nmax_processes = 10\nread_scope = \"granted\"\n",
    )
    .unwrap();
    let flags = FlagPolicy {
        write: vec![PathBuf::from("/dev/shm")],
        max_procs: Some(5),
        ..Default::default()
    };
    let policy = build(Some(file), flags, Path::new("/"), &|_| true).unwrap();
    assert_eq!(policy.writable_roots.len(), 2);
    assert_eq!(policy.max_processes, Some(5));
    assert_eq!(policy.read_scope, ReadScope::Granted);
}

#[test]
fn refusals() {
    let missing = build_flags(FlagPolicy {
        write: vec!["/nonexistent/tartaros".into()],
        ..Default::default()
    });
    assert!(missing.unwrap_err().to_string().contains("does not exist"));
    let zero = build_flags(FlagPolicy {
        max_procs: Some(0),
        ..Default::default()
    });
    assert!(zero.unwrap_err().to_string().contains("--max-procs"));
    let port = build_flags(FlagPolicy {
        port: vec![0],
        ..Default::default()
    });
    assert!(port.unwrap_err().to_string().contains("--port"));
    let both = build_flags(FlagPolicy {
        write: vec!["/tmp".into()],
        write_deny: vec!["/tmp".into()],
        ..Default::default()
    });
    assert!(both.unwrap_err().to_string().contains("both"));
    let glob = ConfigFile::parse(Path::new("p"), "[policy]\nglob_denies = [\"*.env\"]\n").unwrap();
    assert!(build(Some(glob), FlagPolicy::default(), Path::new("/"), &|_| true).is_err());
    let unix = ConfigFile::parse(
        Path::new("p"),
        "[policy]\nallow_unix_socket_paths = [\"/x\"]\n",
    )
    .unwrap();
    assert!(build(Some(unix), FlagPolicy::default(), Path::new("/"), &|_| true).is_err());
}

#[test]
fn globs_and_symlinked_roots_or_denies_are_refused() {
    let glob = build_flags(FlagPolicy {
        read_deny: vec!["/etc/*.conf".into()],
        ..Default::default()
    })
    .unwrap_err()
    .to_string();
    assert!(
        glob.contains("--read-deny /etc/*.conf") && glob.contains("glob"),
        "{glob}"
    );
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.path().join("cache")).unwrap();
    let write = build_flags(FlagPolicy {
        write: vec![dir.path().join("cache")],
        ..Default::default()
    })
    .unwrap_err()
    .to_string();
    assert!(write.contains("is a symlink"), "{write}");
    let real = outside.path().canonicalize().unwrap();
    assert!(
        write.contains(&format!("resolved path {}", real.display())),
        "{write}"
    );
    let deny = build_flags(FlagPolicy {
        write: vec![dir.path().to_path_buf()],
        write_deny: vec![dir.path().join("cache/hooks")],
        ..Default::default()
    })
    .unwrap_err()
    .to_string();
    assert!(deny.contains("passes through the symlink"), "{deny}");
    let allow = build_flags(FlagPolicy {
        read_allow: vec![dir.path().join("cache")],
        ..Default::default()
    });
    assert!(allow.is_ok(), "read allows only grant");
}

#[test]
fn broker_missing_variable_is_named_not_valued() {
    let file = ConfigFile::parse(
        Path::new("p"),
        "[broker]\nport = 9000\ntoken_env = \"TOK\"\n[[broker.capability]]\nname = \"gh\"\nupstream = \"api.github.com\"\nheader = \"Authorization\"\nvalue_env = \"GH\"\n",
    )
    .unwrap();
    let err = build(Some(file), FlagPolicy::default(), Path::new("/"), &|name| {
        name == "TOK"
    })
    .unwrap_err();
    assert!(err.to_string().contains("GH"), "{err}");
}

#[test]
fn domains_normalize() {
    assert_eq!(normalize_domain("Crates.IO.").unwrap(), "crates.io");
    assert_eq!(normalize_domain("*.npmjs.org").unwrap(), "*.npmjs.org");
    assert!(normalize_domain("127.0.0.1").is_err());
    assert!(normalize_domain("[::1]").is_err());
    assert!(normalize_domain("a..b").is_err());
    assert!(normalize_domain("ex ample.com").is_err());
    assert!(normalize_domain("*.com").is_err());
}
