//! Which syscalls the capture looks at, the effect kind each is given, and
//! the argument constants the decoders need (x86-64 numbers).

use super::effect;

/// Syscall numbers captured (x86_64). [`crate::syscalls::TABLE`] says why
/// every other one is not.
pub mod nr {
    pub const IOCTL: u32 = 16;
    pub const OPEN: u32 = 2;
    pub const CONNECT: u32 = 42;
    pub const SENDTO: u32 = 44;
    pub const SENDMSG: u32 = 46;
    pub const BIND: u32 = 49;
    pub const EXECVE: u32 = 59;
    pub const KILL: u32 = 62;
    pub const TRUNCATE: u32 = 76;
    pub const FTRUNCATE: u32 = 77;
    pub const CHDIR: u32 = 80;
    pub const FCHDIR: u32 = 81;
    pub const RENAME: u32 = 82;
    pub const MKDIR: u32 = 83;
    pub const RMDIR: u32 = 84;
    pub const CREAT: u32 = 85;
    pub const LINK: u32 = 86;
    pub const UNLINK: u32 = 87;
    pub const SYMLINK: u32 = 88;
    pub const CHMOD: u32 = 90;
    pub const FCHMOD: u32 = 91;
    pub const CHOWN: u32 = 92;
    pub const FCHOWN: u32 = 93;
    pub const LCHOWN: u32 = 94;
    pub const RT_SIGQUEUEINFO: u32 = 129;
    pub const UTIME: u32 = 132;
    pub const MKNOD: u32 = 133;
    pub const SETXATTR: u32 = 188;
    pub const LSETXATTR: u32 = 189;
    pub const FSETXATTR: u32 = 190;
    pub const REMOVEXATTR: u32 = 197;
    pub const LREMOVEXATTR: u32 = 198;
    pub const FREMOVEXATTR: u32 = 199;
    pub const TKILL: u32 = 200;
    pub const TGKILL: u32 = 234;
    pub const UTIMES: u32 = 235;
    pub const OPENAT: u32 = 257;
    pub const MKDIRAT: u32 = 258;
    pub const MKNODAT: u32 = 259;
    pub const FCHOWNAT: u32 = 260;
    pub const FUTIMESAT: u32 = 261;
    pub const UNLINKAT: u32 = 263;
    pub const RENAMEAT: u32 = 264;
    pub const LINKAT: u32 = 265;
    pub const SYMLINKAT: u32 = 266;
    pub const FCHMODAT: u32 = 268;
    pub const UTIMENSAT: u32 = 280;
    pub const RT_TGSIGQUEUEINFO: u32 = 297;
    pub const SENDMMSG: u32 = 307;
    pub const RENAMEAT2: u32 = 316;
    pub const EXECVEAT: u32 = 322;
    pub const PIDFD_SEND_SIGNAL: u32 = 424;
    pub const OPENAT2: u32 = 437;
    pub const FCHMODAT2: u32 = 452;
    pub const SETXATTRAT: u32 = 463;
    pub const REMOVEXATTRAT: u32 = 466;
    pub const FILE_SETATTR: u32 = 469;

    /// Whether the capture looks further at syscall `nr`: every number
    /// above, and every number the seccomp filter refuses (their attempts
    /// are `syscall` records). Checked before anything else, so every
    /// other syscall on the host costs the capture a few comparisons.
    #[inline(always)]
    pub const fn is_captured(nr: u64) -> bool {
        if nr > u32::MAX as u64 {
            return false;
        }
        is_effect(nr as u32) || is_refused(nr as u32)
    }

    /// Syscalls recorded with their own effect kind.
    #[inline(always)]
    pub const fn is_effect(nr: u32) -> bool {
        matches!(
            nr,
            IOCTL
                | OPEN
                | CONNECT
                | SENDTO
                | SENDMSG
                | BIND
                | EXECVE
                | KILL
                | TRUNCATE
                | FTRUNCATE
                | CHDIR
                | FCHDIR
                | RENAME
                | MKDIR
                | RMDIR
                | CREAT
                | LINK
                | UNLINK
                | SYMLINK
                | CHMOD
                | FCHMOD
                | CHOWN
                | FCHOWN
                | LCHOWN
                | RT_SIGQUEUEINFO
                | UTIME
                | MKNOD
                | SETXATTR
                | LSETXATTR
                | FSETXATTR
                | REMOVEXATTR
                | LREMOVEXATTR
                | FREMOVEXATTR
                | TKILL
                | TGKILL
                | UTIMES
                | OPENAT
                | MKDIRAT
                | MKNODAT
                | FCHOWNAT
                | FUTIMESAT
                | UNLINKAT
                | RENAMEAT
                | LINKAT
                | SYMLINKAT
                | FCHMODAT
                | UTIMENSAT
                | RT_TGSIGQUEUEINFO
                | SENDMMSG
                | RENAMEAT2
                | EXECVEAT
                | PIDFD_SEND_SIGNAL
                | FCHMODAT2
                | SETXATTRAT
                | REMOVEXATTRAT
                | FILE_SETATTR
        )
    }

    /// Syscalls the default seccomp filter refuses whatever their
    /// arguments (`seccomp.rs`, `DEFAULT_ALWAYS`), but `clone3`, which
    /// glibc tries before every thread: their attempts are `syscall`
    /// records. A test holds this list, the table and the filter together.
    #[inline(always)]
    pub const fn is_refused(nr: u32) -> bool {
        matches!(
            nr,
            103 | 134
                | 154
                | 155
                | 159
                | 163..=173
                | 175
                | 176
                | 179
                | 206
                | 209
                | 212
                | 227
                | 246
                | 248..=250
                | 298
                | 303..=305
                | 308
                | 310
                | 311
                | 313
                | 320
                | 321
                | 323
                | 425..=433
                | 437
                | 438
                | 440
                | 442
                | 443
                | 467
        )
    }
}

/// Syscalls the seccomp filter refuses for some arguments only, or only
/// under `--seccomp-strict` (with EPERM; `ioctl`'s terminal commands are
/// recorded apart, the calls refused in every run are `nr::is_refused`).
/// The kernel runs no tracepoint before seccomp, so `sys_exit` records
/// every EPERM of these from their registers, and the decoder keeps those
/// the filter's own rules refuse (`seccomp::refusing_rule`): a user
/// namespace, a raw socket, a core-size limit, a lease or a write-life
/// hint on a host file, a `ptrace` tried and refused is an attempt a
/// reviewer must see. `fadvise64`'s tested argument (the advice) is its
/// fourth, kept in the record like `openat`'s mode. A test in the tartaros crate
/// holds this list and the rules together.
pub mod refused_sometimes {
    pub const OPEN: u32 = 2;
    pub const SOCKET: u32 = 41;
    pub const CLONE: u32 = 56;
    pub const FCNTL: u32 = 72;
    pub const CREAT: u32 = 85;
    pub const MKNOD: u32 = 133;
    pub const OPENAT: u32 = 257;
    pub const MKNODAT: u32 = 259;
    pub const CHMOD: u32 = 90;
    pub const FCHMOD: u32 = 91;
    pub const PTRACE: u32 = 101;
    pub const PERSONALITY: u32 = 135;
    pub const PRCTL: u32 = 157;
    pub const SETRLIMIT: u32 = 160;
    pub const CHROOT: u32 = 161;
    pub const MIGRATE_PAGES: u32 = 256;
    pub const UNSHARE: u32 = 272;
    pub const FCHMODAT: u32 = 268;
    pub const MOVE_PAGES: u32 = 279;
    pub const FADVISE64: u32 = 221;
    pub const MADVISE: u32 = 28;
    pub const FANOTIFY_INIT: u32 = 300;
    pub const PRLIMIT64: u32 = 302;
    pub const KCMP: u32 = 312;
    pub const MEMFD_CREATE: u32 = 319;
    pub const FCHMODAT2: u32 = 452;

    const ALL: [u32; 26] = [
        OPEN,
        CREAT,
        MKNOD,
        OPENAT,
        MKNODAT,
        SOCKET,
        CLONE,
        FCNTL,
        FADVISE64,
        MADVISE,
        CHMOD,
        FCHMOD,
        PTRACE,
        PERSONALITY,
        PRCTL,
        SETRLIMIT,
        CHROOT,
        MIGRATE_PAGES,
        FCHMODAT,
        UNSHARE,
        MOVE_PAGES,
        FANOTIFY_INIT,
        PRLIMIT64,
        KCMP,
        MEMFD_CREATE,
        FCHMODAT2,
    ];

    /// One bit per number below 512: one load for the eBPF verifier to
    /// walk, where a chain of comparisons cost `sys_exit` ~120 walked
    /// instructions.
    const BITS: [u64; 8] = {
        let mut bits = [0u64; 8];
        let mut i = 0;
        while i < ALL.len() {
            bits[(ALL[i] >> 6) as usize] |= 1 << (ALL[i] & 63);
            i += 1;
        }
        bits
    };

    #[inline(always)]
    pub fn contains(nr: u32) -> bool {
        match BITS.get((nr >> 6) as usize) {
            Some(word) => (word >> (nr & 63)) & 1 != 0,
            None => false,
        }
    }
}

/// Entries of the program's syscall table (`call_shape::TABLE`; every
/// x86-64 number is below).
pub const SYSCALL_KINDS: u32 = 512;

/// The effect kind the capture gives syscall `nr` (its main one: see
/// [`crate::syscalls::Class::Captured`]); [`effect::OTHER`] when it is not
/// captured. The eBPF classifier takes its kinds from here.
#[inline(always)]
pub const fn effect_of(nr: u32) -> u16 {
    use nr::*;
    match nr {
        OPEN | OPENAT | CREAT => effect::OPEN,
        EXECVE | EXECVEAT => effect::EXEC,
        TRUNCATE | FTRUNCATE => effect::TRUNCATE,
        UNLINK | UNLINKAT => effect::UNLINK,
        RMDIR => effect::RMDIR,
        MKDIR | MKDIRAT => effect::MKDIR,
        RENAME | RENAMEAT | RENAMEAT2 => effect::RENAME,
        LINK | LINKAT => effect::LINK,
        SYMLINK | SYMLINKAT => effect::SYMLINK,
        CHMOD | FCHMOD | FCHMODAT | FCHMODAT2 => effect::CHMOD,
        CHOWN | FCHOWN | LCHOWN | FCHOWNAT => effect::CHOWN,
        CONNECT => effect::CONNECT,
        SENDTO | SENDMSG | SENDMMSG => effect::SENDTO,
        KILL | TKILL | TGKILL | RT_SIGQUEUEINFO | RT_TGSIGQUEUEINFO | PIDFD_SEND_SIGNAL => {
            effect::SIGNAL
        }
        CHDIR | FCHDIR => effect::CHDIR,
        MKNOD | MKNODAT => effect::MKNOD,
        BIND => effect::BIND,
        SETXATTR | LSETXATTR | FSETXATTR | REMOVEXATTR | LREMOVEXATTR | FREMOVEXATTR
        | SETXATTRAT | REMOVEXATTRAT => effect::XATTR,
        UTIME | UTIMES | FUTIMESAT | UTIMENSAT => effect::UTIME,
        IOCTL | FILE_SETATTR => effect::SETFLAGS,
        n if is_refused(n) => effect::SYSCALL,
        _ => effect::OTHER,
    }
}

/// ioctl commands that change inode flags (`FS_IOC_SETFLAGS` and its
/// 32-bit twin, `FS_IOC_FSSETXATTR`): the only ioctls recorded.
pub mod ioctl {
    pub const FS_IOC_SETFLAGS: u64 = 0x4008_6602;
    pub const FS_IOC32_SETFLAGS: u64 = 0x4004_6602;
    pub const FS_IOC_FSSETXATTR: u64 = 0x401c_5820;

    /// `TIOCSTI`, `TIOCLINUX`, `TIOCSETD` (input injection, line
    /// disciplines), `FS_IOC_SETVERSION` (and its 32-bit twin: an
    /// inode's generation, which the kernel's file handles carry) and the
    /// filesystem ioctls that change state through a read-only descriptor
    /// (fscrypt keys and policies, fs-verity): refused by the seccomp
    /// filter (`seccomp_tables.rs`); their refused attempts are `syscall`
    /// records.
    pub const TIOCSTI: u64 = 0x5412;
    pub const TIOCLINUX: u64 = 0x541c;
    pub const TIOCSETD: u64 = 0x5423;
    pub const FS_IOC_SETVERSION: u64 = 0x4008_7602;
    pub const FS_IOC32_SETVERSION: u64 = 0x4004_7602;
    pub const FS_IOC_SET_ENCRYPTION_POLICY: u64 = 0x800c_6613;
    pub const FS_IOC_GET_ENCRYPTION_PWSALT: u64 = 0x4010_6614;
    pub const FS_IOC_ADD_ENCRYPTION_KEY: u64 = 0xc050_6617;
    pub const FS_IOC_REMOVE_ENCRYPTION_KEY: u64 = 0xc040_6618;
    pub const FS_IOC_REMOVE_ENCRYPTION_KEY_ALL_USERS: u64 = 0xc040_6619;
    pub const FS_IOC_ENABLE_VERITY: u64 = 0x4080_6685;

    /// The refused commands and the names records give them.
    pub const REFUSED: [(u64, &str); 11] = [
        (TIOCSTI, "TIOCSTI"),
        (TIOCLINUX, "TIOCLINUX"),
        (TIOCSETD, "TIOCSETD"),
        (FS_IOC_SETVERSION, "FS_IOC_SETVERSION"),
        (FS_IOC32_SETVERSION, "FS_IOC32_SETVERSION"),
        (FS_IOC_SET_ENCRYPTION_POLICY, "FS_IOC_SET_ENCRYPTION_POLICY"),
        (FS_IOC_GET_ENCRYPTION_PWSALT, "FS_IOC_GET_ENCRYPTION_PWSALT"),
        (FS_IOC_ADD_ENCRYPTION_KEY, "FS_IOC_ADD_ENCRYPTION_KEY"),
        (FS_IOC_REMOVE_ENCRYPTION_KEY, "FS_IOC_REMOVE_ENCRYPTION_KEY"),
        (
            FS_IOC_REMOVE_ENCRYPTION_KEY_ALL_USERS,
            "FS_IOC_REMOVE_ENCRYPTION_KEY_ALL_USERS",
        ),
        (FS_IOC_ENABLE_VERITY, "FS_IOC_ENABLE_VERITY"),
    ];

    // A match, not a walk of `REFUSED`: the eBPF verifier takes it as a
    // few comparisons (a unit test ties the two together).
    #[inline(always)]
    pub const fn refused(cmd: u64) -> bool {
        matches!(
            cmd & 0xffff_ffff,
            TIOCSTI
                | TIOCLINUX
                | TIOCSETD
                | FS_IOC_SETVERSION
                | FS_IOC32_SETVERSION
                | FS_IOC_SET_ENCRYPTION_POLICY
                | FS_IOC_GET_ENCRYPTION_PWSALT
                | FS_IOC_ADD_ENCRYPTION_KEY
                | FS_IOC_REMOVE_ENCRYPTION_KEY
                | FS_IOC_REMOVE_ENCRYPTION_KEY_ALL_USERS
                | FS_IOC_ENABLE_VERITY
        )
    }

    /// The name of a refused command, as records give it.
    pub fn refused_name(cmd: u64) -> Option<&'static str> {
        let cmd = cmd & 0xffff_ffff;
        REFUSED
            .iter()
            .find(|(c, _)| *c == cmd)
            .map(|(_, name)| *name)
    }

    #[inline(always)]
    pub const fn sets_flags(cmd: u64) -> bool {
        let cmd = cmd & 0xffff_ffff;
        cmd == FS_IOC_SETFLAGS || cmd == FS_IOC32_SETFLAGS || cmd == FS_IOC_FSSETXATTR
    }
}

/// Open flags (x86_64 / generic values).
pub mod oflag {
    pub const O_ACCMODE: u64 = 0o3;
    pub const O_CREAT: u64 = 0o100;
    pub const O_TRUNC: u64 = 0o1000;
    pub const O_PATH: u64 = 0o10000000;
    /// `__O_TMPFILE` (O_TMPFILE without O_DIRECTORY).
    pub const O_TMPFILE_BIT: u64 = 0o20000000;
    /// `O_CREAT | O_WRONLY | O_TRUNC`, what creat(2) means.
    pub const CREAT_FLAGS: u64 = O_CREAT | 0o1 | O_TRUNC;
}

/// `AT_FDCWD`.
pub const AT_FDCWD: i32 = -100;
/// `AT_REMOVEDIR` (unlinkat).
pub const AT_REMOVEDIR: u64 = 0x200;
