//! Adversarial round 15 on the log: names through links. A single-threaded
//! agent changing files through symlinks (`chmod('l1')`, `l1 -> r1`) or
//! through `..` after a directory link (`dl/../g1`, `dl -> a/b`) passes a
//! string the kernel's notification never names. The kernel merges a
//! file's metadata changes while their notification is queued (a `chmod`
//! and `utime` are one `FAN_ATTRIB`), so the `utime` found no notification
//! of its own, took the next file's by position, and every later record
//! of the thread named the file after its own with `path_source:
//! "kernel"` (`chmod {claimed_path: l1, path: r2, mode: 0777}` while the
//! host showed r1 0777), `verify` ok. `truncate`, `setxattr` and
//! `file_setattr(2)` through a link kept the link's name unmarked.
//!
//! Asserted from the host side: every record the log calls the kernel's
//! names the file the call changed (its mode, times, xattr and size on the
//! host are the call's), every record that keeps a string through a link
//! is marked as the agent's claim, and every changed file is in the log
//! under its real name (or, with no notification to name it, its record
//! is marked). Needs root and python3.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::logged::*;
use common::*;
use serde_json::Value;

/// Per i: `chmod` and `utime` through `l{i} -> r{i}`, then through
/// `dl/../g{i}` (`dl -> a/b`), then a file created and renamed through
/// `dl/..` and changed the same way; then `chmod`, `utime`, `setxattr`
/// through `lnk -> real`, `truncate` through `tl -> tr` and `dl/../t`,
/// and `file_setattr(2)` (469) through `innocent -> target` (its result
/// printed, `-errno` where the kernel lacks it).
const AGENT: &str = r#"
import ctypes, os, struct
N = 6
for i in range(N):
    os.chmod('l%d' % i, MODES[i]); os.utime('l%d' % i, (1000 + i, 1000 + i))
for i in range(N):
    os.chmod('dl/../g%d' % i, MODES[i]); os.utime('dl/../g%d' % i, (2000 + i, 2000 + i))
for i in range(N):
    open('dl/../f%d' % i, 'w').close()
    os.rename('dl/../f%d' % i, 'dl/../h%d' % i)
    os.chmod('dl/../h%d' % i, MODES[i]); os.utime('dl/../h%d' % i, (3000 + i, 3000 + i))
os.chmod('lnk', 0o604); os.utime('lnk', (5, 5)); os.setxattr('lnk', 'user.q', b'1')
os.truncate('tl', 1)
os.truncate('dl/../t', 2)
libc = ctypes.CDLL(None, use_errno=True)
attr = ctypes.create_string_buffer(24)
r = libc.syscall(468, -100, b'innocent', attr, 24, 0)
if r == 0:
    flags = struct.unpack_from('<Q', attr.raw)[0] | 0x20 | 0x40 | 0x80
    struct.pack_into('<Q', attr, 0, flags)
    r = libc.syscall(469, -100, b'innocent', attr, 24, 0)
print('SETATTR', r if r == 0 else -ctypes.get_errno())
"#;

const MODES: [u32; 6] = [0o600, 0o777, 0o640, 0o700, 0o604, 0o660];

/// What a call through `claim` must have left on `real`.
#[derive(Debug, Default, Clone)]
struct Truth {
    real: String,
    mode: Option<u32>,
    mtime: Option<i64>,
    xattr: bool,
    size: Option<u64>,
}

fn leaf(path: &str, root: &str) -> String {
    path.strip_prefix(root)
        .map(|p| p.trim_start_matches('/').to_string())
        .unwrap_or_else(|| path.to_string())
}

/// The inode flags of `path` (`file_getattr`), `None` without the call.
fn xflags(path: &Path) -> Option<u64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let mut attr = [0u8; 24];
    // SAFETY: `c` is a NUL-terminated path and `attr` is 24 writable bytes,
    // the size passed (FILE_ATTR_SIZE_VER0).
    let r = unsafe {
        libc::syscall(
            468,
            libc::AT_FDCWD,
            c.as_ptr(),
            attr.as_mut_ptr(),
            attr.len(),
            0,
        )
    };
    (r == 0).then(|| u64::from_le_bytes(attr[..8].try_into().unwrap()))
}

#[test]
fn calls_through_links_never_name_another_file_as_the_kernels() {
    if !usable("log_round15_link_names") {
        return;
    }
    let (work, logs) = (Dir::new(), Dir::new());
    let w = work.path();
    let root = w.to_str().unwrap().to_string();
    std::fs::create_dir_all(w.join("a/b")).unwrap();
    std::os::unix::fs::symlink("a/b", w.join("dl")).unwrap();
    let mut truth: BTreeMap<String, Truth> = BTreeMap::new();
    for (i, mode) in MODES.into_iter().enumerate() {
        std::fs::write(w.join(format!("r{i}")), format!("{i}\n")).unwrap();
        std::os::unix::fs::symlink(format!("r{i}"), w.join(format!("l{i}"))).unwrap();
        std::fs::write(w.join(format!("a/g{i}")), format!("{i}\n")).unwrap();
        let mode = Some(mode);
        let t = |real: String, mtime: i64| Truth {
            real,
            mode,
            mtime: Some(mtime),
            ..Default::default()
        };
        truth.insert(format!("l{i}"), t(format!("r{i}"), 1000 + i as i64));
        truth.insert(format!("dl/../g{i}"), t(format!("a/g{i}"), 2000 + i as i64));
        truth.insert(format!("dl/../h{i}"), t(format!("a/h{i}"), 3000 + i as i64));
    }
    for (real, link) in [("real", "lnk"), ("tr", "tl"), ("target", "innocent")] {
        std::fs::write(w.join(real), "0123456789\n").unwrap();
        std::os::unix::fs::symlink(real, w.join(link)).unwrap();
    }
    std::fs::write(w.join("a/t"), "0123456789\n").unwrap();
    let plain = |real: &str| Truth {
        real: real.to_string(),
        ..Default::default()
    };
    truth.insert(
        "lnk".into(),
        Truth {
            mode: Some(0o604),
            mtime: Some(5),
            xattr: true,
            ..plain("real")
        },
    );
    truth.insert(
        "tl".into(),
        Truth {
            size: Some(1),
            ..plain("tr")
        },
    );
    truth.insert(
        "dl/../t".into(),
        Truth {
            size: Some(2),
            ..plain("a/t")
        },
    );
    truth.insert("innocent".into(), plain("target"));
    let flags_before = xflags(&w.join("target"));
    let status = std::process::Command::new("chown")
        .args(["-hR", "nobody", &root])
        .status()
        .unwrap();
    assert!(status.success());
    let code = AGENT.replace("MODES[i]", &format!("{MODES:?}[i]"));
    let (out, records) = run_logged(&work, &logs, &["python3", "-c", &code]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let setattr = text
        .lines()
        .find_map(|l| l.strip_prefix("SETATTR "))
        .unwrap_or_else(|| panic!("no SETATTR line: {text} {}", stderr(&out)))
        .trim()
        .to_string();
    // The host's truth is what the test expects the calls to have done.
    for t in truth.values() {
        let m = std::fs::metadata(w.join(&t.real)).unwrap();
        if let Some(mode) = t.mode {
            assert_eq!(m.mode() & 0o7777, mode, "{t:?}");
        }
        if let Some(mtime) = t.mtime {
            assert_eq!(m.mtime(), mtime, "{t:?}");
        }
        if let Some(size) = t.size {
            assert_eq!(m.len(), size, "{t:?}");
        }
        assert_eq!(xattr_of(&w.join(&t.real)), t.xattr, "{t:?}");
    }
    let set_flags = setattr == "0";
    if set_flags {
        assert_ne!(xflags(&w.join("target")), flags_before, "file_setattr");
    } else {
        eprintln!("file_setattr(2) not here ({setattr}): not checked");
    }
    let kinds = [
        "chmod", "utime", "xattr", "truncate", "setflags", "attrib", "write",
    ];
    let ours: Vec<&Value> = records
        .iter()
        .filter(|r| kinds.contains(&r["kind"].as_str().unwrap_or_default()))
        .filter(|r| field(r, "path").is_some_and(|p| p.starts_with(&root)))
        .collect();
    let mut wrong = Vec::new();
    let mut unmarked = Vec::new();
    let mut named: BTreeSet<String> = BTreeSet::new();
    let mut kernel = 0;
    for r in &ours {
        let path = leaf(field(r, "path").unwrap(), &root);
        let claim = field(r, "claimed_path").map(|c| leaf(c, &root));
        let said = claim.clone().unwrap_or_else(|| path.clone());
        if field(r, "path_source") == Some("kernel") {
            kernel += 1;
            named.insert(path.clone());
            // A kernel name: the file the call through its string changed,
            // with what the call left on it.
            if let Some(t) = truth.get(&said) {
                let m = std::fs::symlink_metadata(w.join(&path)).unwrap();
                let mode_ok = r["target"]["mode"]
                    .as_u64()
                    .is_none_or(|mode| u64::from(m.mode() & 0o7777) == mode);
                if path != t.real || !mode_ok {
                    wrong.push(format!(
                        "{} through {said}: the log says {path} (mode {:o} on the host), \
                         the kernel changed {}: {r}",
                        r["kind"],
                        m.mode() & 0o7777,
                        t.real
                    ));
                }
            }
        } else if truth.contains_key(&said) && r["target"]["claim_unproven"] != true {
            // The string names a link (or goes through one): unmarked, it
            // reads as the file the kernel changed.
            unmarked.push(format!("{r}"));
        }
    }
    let mut missing: Vec<&str> = truth
        .values()
        .map(|t| t.real.as_str())
        .filter(|real| *real != "target" && !named.contains(*real))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if set_flags
        && !named.contains("target")
        && !ours.iter().any(|r| {
            r["kind"] == "setflags"
                && leaf(field(r, "path").unwrap(), &root) == "innocent"
                && r["target"]["claim_unproven"] == true
        })
    {
        missing.push("target (file_setattr)");
    }
    eprintln!(
        "{} records of {kinds:?} in the root, {kernel} named by the kernel, {} wrong, {} unmarked claims, {} changed files unnamed",
        ours.len(),
        wrong.len(),
        unmarked.len(),
        missing.len()
    );
    assert!(
        wrong.is_empty(),
        "{} kernel-named records name the wrong file:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert!(
        unmarked.is_empty(),
        "{} records keep a string through a link unmarked:\n{}",
        unmarked.len(),
        unmarked.join("\n")
    );
    assert!(
        missing.is_empty(),
        "changed files no record names (nor marks as a claim): {missing:?}"
    );
}

fn xattr_of(path: &Path) -> bool {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let mut buf = [0u8; 8];
    // SAFETY: `c` is NUL-terminated, `buf` is writable for its length.
    let n = unsafe {
        libc::getxattr(
            c.as_ptr(),
            c"user.q".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    n == 1 && buf[0] == b'1'
}
