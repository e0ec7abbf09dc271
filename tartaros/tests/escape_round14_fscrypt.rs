//! Adversarial round 14: fscrypt and fs-verity ioctls through a read-only
//! descriptor. The kernel asks no write access of the file for
//! `FS_IOC_ADD_ENCRYPTION_KEY` or `FS_IOC_REMOVE_ENCRYPTION_KEY` (the keys
//! belong to the filesystem, per user), so any readable file outside
//! every root reached them: an agent removed the host user's claim on a
//! directory's key (the user's encrypted directory locked) and added keys
//! that outlived the run (the user's key quota, unreclaimable slab).
//!
//! On a loop ext4 image made with `-O encrypt`, the host (uid nobody, the
//! agent's uid in a root run) unlocks a directory; the agent's attempts to
//! remove that key, add one, set a policy, make the superblock's salt and
//! enable verity are each refused (EPERM) and recorded, and the host still
//! sees its key present and its key count unchanged. Needs root, python3,
//! mkfs.ext4, losetup and a kernel with ext4 encryption.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;

const TEST: &str = "fscrypt_keys_and_policies_cannot_be_changed_through_a_read_only_descriptor";

/// A loop ext4 filesystem with the `encrypt` feature, mounted in a
/// directory only nobody (and root) may enter; unmounted and detached on
/// drop, a panicking test included (the unmount frees its keys).
struct EncryptedFs {
    // Dropped after the unmount in `drop` (fields drop after it).
    dir: Dir,
    mnt: PathBuf,
    loop_dev: Option<String>,
    mounted: bool,
}

impl EncryptedFs {
    fn make() -> Result<Self, String> {
        if !Path::new("/sys/fs/ext4/features/encryption").exists() {
            return Err("the kernel's ext4 has no encryption".into());
        }
        let mut fs = Self {
            dir: Dir::new(),
            mnt: PathBuf::new(),
            loop_dev: None,
            mounted: false,
        };
        let image = fs.dir.join("enc.img");
        fs.mnt = fs.dir.join("mnt");
        std::fs::create_dir(&fs.mnt).map_err(|e| format!("mkdir: {e}"))?;
        let file = std::fs::File::create(&image).map_err(|e| format!("image: {e}"))?;
        file.set_len(24 << 20).map_err(|e| format!("image: {e}"))?;
        drop(file);
        let mkfs = Command::new("mkfs.ext4")
            .args(["-q", "-O", "encrypt"])
            .arg(&image)
            .output()
            .map_err(|e| format!("mkfs.ext4: {e}"))?;
        if !mkfs.status.success() {
            return Err(format!("mkfs.ext4: {}", stderr(&mkfs)));
        }
        let setup = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&image)
            .output()
            .map_err(|e| format!("losetup: {e}"))?;
        if !setup.status.success() {
            return Err(format!("losetup: {}", stderr(&setup)));
        }
        let dev = stdout(&setup).trim().to_string();
        fs.loop_dev = Some(dev.clone());
        let mount = Command::new("mount")
            .args(["-t", "ext4", &dev])
            .arg(&fs.mnt)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !mount.status.success() {
            return Err(format!("mount: {}", stderr(&mount)));
        }
        fs.mounted = true;
        Ok(fs)
    }
}

impl Drop for EncryptedFs {
    fn drop(&mut self) {
        if self.mounted {
            let done = Command::new("umount").arg(&self.mnt).status();
            if !done.is_ok_and(|s| s.success()) {
                let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
            }
        }
        if let Some(dev) = &self.loop_dev {
            let _ = Command::new("losetup").args(["-d", dev]).status();
        }
    }
}

/// Python as uid nobody on the host, outside any sandbox.
fn as_nobody(code: &str, args: &[&str]) -> Output {
    Command::new("setpriv")
        .args([
            &format!("--reuid={NOBODY}"),
            &format!("--regid={NOBODY}"),
            "--clear-groups",
            // Not PATH's: root's may lead through a directory nobody cannot enter.
            "/usr/bin/python3",
            "-c",
            code,
        ])
        .args(args)
        .output()
        .expect("setpriv")
}

/// Adds a key (raw: 64 bytes 0x42) and sets a v2 policy on the directory,
/// writes a secret into it, prints the key's identifier.
const HOST_UNLOCK: &str = r#"
import os, sys, fcntl, struct
d = os.open(sys.argv[1], os.O_RDONLY)
arg = bytearray(80 + 64)
struct.pack_into('I', arg, 0, 2)
struct.pack_into('I', arg, 40, 64)
arg[80:] = b'\x42' * 64
fcntl.ioctl(d, 0xc0506617, arg, True)
ident = bytes(arg[8:24])
fcntl.ioctl(d, 0x800c6613, struct.pack('BBBB4x16s', 2, 1, 4, 3, ident))
with open(sys.argv[1] + '/secret', 'w') as f:
    f.write('TOPSECRET\n')
print(ident.hex())
"#;

/// FS_IOC_GET_ENCRYPTION_KEY_STATUS of an identifier: status (1 absent,
/// 2 present), flags (1: added by the caller), user count.
const HOST_STATUS: &str = r#"
import os, sys, fcntl, struct
d = os.open(sys.argv[1], os.O_RDONLY)
arg = bytearray(128)
struct.pack_into('I', arg, 0, 2)
arg[8:24] = bytes.fromhex(sys.argv[2])
fcntl.ioctl(d, 0xc080661a, arg, True)
print('status %d flags %d users %d' % struct.unpack_from('III', arg, 64))
"#;

const AGENT: &str = r#"
import fcntl, struct
M, ID, W = sys.argv[1], bytes.fromhex(sys.argv[2]), sys.argv[3]
d = os.open(M + '/u', os.O_RDONLY)
h = os.open(M + '/hostfile', os.O_RDONLY)
def spec():
    a = bytearray(64)
    struct.pack_into('I', a, 0, 2)
    a[8:24] = ID
    return a
attempt('remove', lambda: fcntl.ioctl(d, 0xc0406618, spec(), True))
attempt('remove-all-users', lambda: fcntl.ioctl(d, 0xc0406619, spec(), True))
def add():
    a = bytearray(80 + 64)
    struct.pack_into('I', a, 0, 2)
    struct.pack_into('I', a, 40, 64)
    a[80:] = os.urandom(64)
    fcntl.ioctl(h, 0xc0506617, a, True)
    print('added', bytes(a[8:24]).hex())
attempt('add', add)
# With upper bits set: the kernel reads the low 32 bits of the command.
attempt('add-upper', lambda: checked(libc.ioctl(h, ctypes.c_ulong(0x1_c050_6617), ctypes.create_string_buffer(144))))
os.mkdir(W + '/e')
e = os.open(W + '/e', os.O_RDONLY)
attempt('set-policy', lambda: fcntl.ioctl(e, 0x800c6613, struct.pack('BBBB8s', 0, 1, 4, 0, b'\x11' * 8)))
attempt('pwsalt', lambda: fcntl.ioctl(e, 0x40106614, bytes(16)))
with open(W + '/f', 'w') as f:
    f.write('x')
v = os.open(W + '/f', os.O_RDONLY)
attempt('enable-verity', lambda: fcntl.ioctl(v, 0x40806685, struct.pack('IIIIQIIQ88x', 1, 1, 4096, 0, 0, 0, 0, 0)))
# The queries stay allowed.
attempt('get-policy', lambda: fcntl.ioctl(d, 0xc0096616, bytearray(struct.pack('Q', 24) + bytes(24)), True))
print('done OK')
"#;

/// The host's key count for uid nobody (`/proc/key-users`: keys/max).
fn nobody_keys() -> String {
    let users = std::fs::read_to_string("/proc/key-users").unwrap_or_default();
    users
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{NOBODY}:")))
        .and_then(|l| l.split_whitespace().nth(3))
        .unwrap_or("0/0")
        .to_string()
}

#[test]
fn fscrypt_keys_and_policies_cannot_be_changed_through_a_read_only_descriptor() {
    if !can_run(TEST) {
        return;
    }
    let fs = match EncryptedFs::make() {
        Ok(fs) => fs,
        Err(reason) => return skip(TEST, &reason),
    };
    let mnt = fs.mnt.to_str().unwrap();
    std::fs::write(fs.mnt.join("hostfile"), "x\n").unwrap();
    for sub in ["u", "w"] {
        std::fs::create_dir(fs.mnt.join(sub)).unwrap();
        chown(&fs.mnt.join(sub), NOBODY);
    }
    let unlock = as_nobody(HOST_UNLOCK, &[&format!("{mnt}/u")]);
    assert!(unlock.status.success(), "{}", stderr(&unlock));
    let ident = stdout(&unlock).trim().to_string();
    let status = || as_nobody(HOST_STATUS, &[&format!("{mnt}/u"), &ident]);
    let before = stdout(&status());
    assert_eq!(before.trim(), "status 2 flags 1 users 1");
    let keys_before = nobody_keys();

    let logs = Dir::new();
    let log = logs.join("effects.jsonl");
    let w = format!("{mnt}/w");
    let code = format!("{ATTEMPT}{AGENT}");
    let out = tartaros(
        &[
            "run",
            "--write",
            &w,
            "--log",
            log.to_str().unwrap(),
            "--",
            "python3",
            "-c",
            &code,
            mnt,
            &ident,
            &w,
        ],
        fs.dir.path(),
    );
    eprintln!("{}\n{}", stdout(&out), stderr(&out));

    // The host's view first: its key is present, still claimed by it, and
    // no key was added.
    let after = status();
    assert_eq!(stdout(&after).trim(), "status 2 flags 1 users 1");
    let secret = as_nobody(
        "import sys; print(open(sys.argv[1]).read().strip())",
        &[&format!("{mnt}/u/secret")],
    );
    assert_eq!(stdout(&secret).trim(), "TOPSECRET", "{}", stderr(&secret));
    for line in stdout(&out).lines() {
        if let Some(added) = line.strip_prefix("added ") {
            let host = as_nobody(HOST_STATUS, &[&format!("{mnt}/u"), added]);
            panic!("the agent added key {added}: {}", stdout(&host));
        }
    }
    assert_eq!(nobody_keys(), keys_before, "nobody's key count changed");
    for label in [
        "remove",
        "remove-all-users",
        "add",
        "add-upper",
        "set-policy",
        "pwsalt",
        "enable-verity",
    ] {
        expect(&out, label, "EPERM");
    }
    expect(&out, "get-policy", "OK");
    expect(&out, "done", "OK");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    // Each refused attempt is a record naming its command.
    let log = records(&log);
    let named = |cmd: &str| {
        log.iter()
            .filter(|r| r["kind"] == "syscall" && r["target"]["syscall"] == "ioctl")
            .filter(|r| r["target"]["cmd"] == cmd)
            .inspect(|r| {
                assert_eq!(r["errno"], libc::EPERM, "{r}");
                assert_eq!(r["target"]["refused_by"], "seccomp", "{r}");
            })
            .count()
    };
    for (cmd, times) in [
        ("FS_IOC_REMOVE_ENCRYPTION_KEY", 1),
        ("FS_IOC_REMOVE_ENCRYPTION_KEY_ALL_USERS", 1),
        ("FS_IOC_ADD_ENCRYPTION_KEY", 2),
        ("FS_IOC_SET_ENCRYPTION_POLICY", 1),
        ("FS_IOC_GET_ENCRYPTION_PWSALT", 1),
        ("FS_IOC_ENABLE_VERITY", 1),
    ] {
        assert_eq!(named(cmd), times, "{cmd}");
    }
    drop(fs);
}
