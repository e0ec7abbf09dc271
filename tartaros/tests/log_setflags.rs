//! An inode-flag change (`FS_IOC_SETFLAGS`) is logged under the file's real
//! name, taken from the kernel's `struct file` at the syscall's exit
//! (issue 13): the kernel sends no file notification for it, and a
//! `/proc/<pid>/fd` lookup after the event fails once the process is gone
//! and names the wrong file once the fd is reused. Needs root.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::*;
use serde_json::Value;

/// Adds `FS_NOATIME_FL` (an owner may set it without a capability) to the
/// file's flags, as chattr does (dropping ext4's extents flag fails).
const AGENT: &str = r#"
import fcntl, struct, time
W = sys.argv[1]
def setflags(fd):
    old = struct.unpack('l', fcntl.ioctl(fd, 0x80086601, struct.pack('l', 0)))[0]
    fcntl.ioctl(fd, 0x40086602, struct.pack('l', old | 0x80))
# Sets the flag and exits at once: nothing is left in /proc to look at.
if os.fork() == 0:
    setflags(os.open(W + '/flagged', os.O_RDONLY))
    os._exit(0)
os.wait()
# Renamed between the open and the ioctl, then the fd number reused for
# another file while the process lives on.
if os.fork() == 0:
    fd = os.open(W + '/before', os.O_RDONLY)
    os.rename(W + '/before', W + '/after')
    setflags(fd)
    os.close(fd)
    assert os.open(W + '/decoy', os.O_RDONLY) == fd
    time.sleep(0.5)
    os._exit(0)
os.wait()
print('done OK')
"#;

#[track_caller]
fn assert_names(flags: &[&Value], file: &Path) {
    let path = file.to_str().unwrap();
    let meta = std::fs::metadata(file).expect("stat");
    let r = flags
        .iter()
        .find(|r| r["target"]["path"] == path)
        .unwrap_or_else(|| panic!("no setflags record names {path}: {flags:#?}"));
    let t = &r["target"];
    assert_eq!(
        (r["decision"].as_str(), r["errno"].as_u64()),
        (Some("allowed"), Some(0)),
        "{r}"
    );
    assert_eq!(t["path_source"], "kernel", "{r}");
    assert_eq!(t.get("path_unresolved"), None, "{r}");
    assert_eq!(t.get("resolved_from"), None, "{r}");
    assert_eq!(
        (t["dev"].as_u64(), t["ino"].as_u64()),
        (Some(meta.dev()), Some(meta.ino()))
    );
    assert_ne!(t["flags"].as_u64().unwrap_or(0) & 0x80, 0, "{r}");
}

#[test]
fn setflags_records_name_the_file_from_the_kernel() {
    if !can_run("log_setflags") {
        return;
    }
    let work = Dir::new();
    for name in ["flagged", "before", "decoy"] {
        work.file(name, "f");
    }
    let logs = Dir::new();
    let log = logs.join("effects.jsonl");
    let out = logged_agent(&work, &log, AGENT);
    expect(&out, "done", "OK");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let log = records(&log);
    let flags: Vec<&Value> = log.iter().filter(|r| r["kind"] == "setflags").collect();
    assert_eq!(flags.len(), 2, "{flags:#?}");
    assert_names(&flags, &work.join("flagged"));
    // The name the file had when the flag was set, not the one it was
    // opened under, nor the file that took its fd number afterwards.
    assert_names(&flags, &work.join("after"));
    for r in &flags {
        assert_eq!(r["target"]["fd_changed"], Value::Null, "{r}");
        for gone in ["before", "decoy"] {
            assert_ne!(r["target"]["path"], work.join(gone).to_str().unwrap());
        }
    }
}
