//! The running kernel's structure offsets and BTF ids (`kbtf.rs`), parsed
//! once per boot and cached in /run/tartaros, where only root may write.

use std::fs::File;
use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;
use std::sync::OnceLock;

use super::kbtf::{self, KernelLayout};

/// The structure offsets and BTF ids the programs need, from one quick
/// pass over the kernel BTF (~9 ms with the read), once per process.
static KERNEL_LAYOUT: OnceLock<Result<KernelLayout, String>> = OnceLock::new();

const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

pub(super) fn kernel_layout() -> Result<KernelLayout, String> {
    KERNEL_LAYOUT
        .get_or_init(|| {
            if let Some(layout) = cached_layout() {
                return Ok(layout);
            }
            let data = std::fs::read(VMLINUX).map_err(|e| format!("cannot read {VMLINUX}: {e}"))?;
            let layout = kbtf::layout(&data)?;
            store_layout(&layout);
            Ok(layout)
        })
        .clone()
}

/// Where the layout of the running kernel is cached: /run is a tmpfs, so a
/// reboot (a new kernel) empties it; the name carries the kernel's release
/// and build. Root-only, like every eBPF run.
fn layout_cache_path() -> Option<PathBuf> {
    let uts = nix::sys::utsname::uname().ok()?;
    let mut id = uts.release().to_string_lossy().into_owned();
    id.push('-');
    id.push_str(&uts.version().to_string_lossy());
    let digest = sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(
        id.as_bytes(),
    ));
    Some(PathBuf::from(format!(
        "/run/tartaros/kernel-layout-v14-{}.json",
        &hex::encode(digest)[..16]
    )))
}

fn cached_layout() -> Option<KernelLayout> {
    let path = layout_cache_path()?;
    let file = File::open(&path).ok()?;
    let meta = file.metadata().ok()?;
    // Only a file root wrote and nobody else can change is trusted: wrong
    // offsets would blind the capture.
    if meta.uid() != 0 || meta.mode() & 0o022 != 0 {
        return None;
    }
    serde_json::from_reader(std::io::BufReader::new(file)).ok()
}

fn store_layout(layout: &KernelLayout) {
    let Some(path) = layout_cache_path() else {
        return;
    };
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let _ = std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700));
    let temporary = dir.join(format!(".layout-{}", std::process::id()));
    let written = serde_json::to_vec(layout)
        .ok()
        .is_some_and(|bytes| std::fs::write(&temporary, bytes).is_ok());
    if written {
        let _ = std::fs::rename(&temporary, &path);
    } else {
        let _ = std::fs::remove_file(&temporary);
    }
}

/// Takes the layout from the cache if it is there; whether it was.
pub(super) fn kernel_layout_from_cache() -> bool {
    match cached_layout() {
        Some(layout) => {
            // Another thread may have set it meanwhile: the same value.
            let _ = KERNEL_LAYOUT.set(Ok(layout));
            true
        }
        None => false,
    }
}

pub(super) fn kernel_layout_ready() -> bool {
    KERNEL_LAYOUT.get().is_some()
}
