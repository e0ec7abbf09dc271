//! The errors of loading and attaching the eBPF programs.

use std::path::PathBuf;

use aya::maps::MapError;

use super::{MIN_KERNEL, UNIX_KERNEL, rawprog};

/// Errors of the eBPF programs.
#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    #[error(
        "failed to open the cgroup directory {path}: {source}; pass an existing cgroup v2 directory (e.g. under /sys/fs/cgroup/unified on hybrid hosts)"
    )]
    OpenCgroup {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("failed to load the eBPF programs ahead of the attach: {0}")]
    Preload(&'static str),
    #[error("failed to determine the kernel version: {0}; is /proc/sys/kernel/osrelease readable?")]
    KernelVersion(String),
    #[error(
        "failed to attach the network filter: kernel {found} is older than {}.{}, which cgroup BPF links and ring buffers need; upgrade the kernel or run without the eBPF filter",
        MIN_KERNEL.0, MIN_KERNEL.1
    )]
    KernelTooOld { found: String },
    #[error(
        "failed to size the event ring buffer: {0} bytes is not a power of two of at least 4096"
    )]
    RingSize(u32),
    #[error(
        "failed to prepare event capture: {0}; capture needs x86_64 and the kernel BTF (/sys/kernel/btf/vmlinux, CONFIG_DEBUG_INFO_BTF)"
    )]
    CaptureUnsupported(String),
    #[error(
        "failed to install the unix socket policy: {reason}; the kernel needs the cgroup connect_unix / sendmsg_unix hooks (Linux {}.{}); run without the unix policy or upgrade",
        UNIX_KERNEL.0, UNIX_KERNEL.1
    )]
    UnixHooksUnsupported { reason: String },
    #[error(
        "failed to set up transparent interception: {0}; it needs cgroup sock_ops programs (Linux 4.13), writable connect addresses (4.17) and bpf_get_socket_cookie in sock_addr / sock_ops programs (4.19); run without allowed domains (the explicit proxy on 127.0.0.1:3128 still works)"
    )]
    Transparent(#[source] Box<EbpfError>),
    #[error("failed to use {path} as an allowed unix socket prefix: {reason}")]
    UnixPrefix { path: PathBuf, reason: String },
    #[error(
        "failed to load the embedded eBPF object: {0}; run as root (or with CAP_BPF), and if it persists rebuild tartaros (or check TARTAROS_EBPF_OBJECT points to an object built from this tree)"
    )]
    LoadObject(#[source] rawprog::RawError),
    #[error(
        "failed to find {what} in the eBPF object; it was built from another version of tartaros-ebpf: rebuild, or fix TARTAROS_EBPF_OBJECT"
    )]
    MissingInObject { what: String },
    #[error(
        "failed to use the eBPF map {map}: {source}; rebuild tartaros so the object and the supervisor agree"
    )]
    Map {
        map: &'static str,
        #[source]
        source: MapError,
    },
    #[error(
        "failed to load the eBPF program {program} into the kernel: {source}; run as root (or with CAP_BPF and CAP_NET_ADMIN) and check `tartaros doctor`"
    )]
    LoadProgram {
        program: &'static str,
        #[source]
        source: rawprog::RawError,
    },
    #[error(
        "failed to attach the eBPF program {program} to the cgroup {path}: {source}; the directory must be a cgroup v2 directory and the process needs CAP_NET_ADMIN"
    )]
    AttachProgram {
        program: &'static str,
        path: PathBuf,
        #[source]
        source: rawprog::RawError,
    },
    #[error(
        "failed to install the capture program {program}: {source}; the host must allow tp_btf and raw_tracepoint programs (see `tartaros doctor`)"
    )]
    AttachTracing {
        program: &'static str,
        #[source]
        source: rawprog::RawError,
    },
    #[error(
        "failed to prepare the eBPF program from the embedded object: {0}; rebuild tartaros (or fix TARTAROS_EBPF_OBJECT)"
    )]
    RawProgram(#[from] rawprog::RawError),
}
