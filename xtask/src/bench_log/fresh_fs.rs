//! A new, empty ext4 filesystem for one run of the overhead workload.
//!
//! Why: ext4 does not hand out an inode freed in the last seconds while its
//! inode-table block is still cached (`recently_deleted()` in
//! `fs/ext4/ialloc.c`), so every create scans past the inodes the previous
//! runs' 20,000 unlinks freed. In a `perf` profile of a logged run in a
//! reused directory (2026-12-06) that scan (`find_get_block_common`,
//! `recently_deleted`, `__brelse`) was ~25% of the workload's samples and
//! the capture's own kernel work (fanotify, the capture programs) ~2%:
//! whichever variant ran second paid for the others' deletes, and medians
//! of five alternating runs moved by several percent from one invocation
//! to the next. On a filesystem of its own, made the same way every time,
//! each variant starts from the same state and only the sandbox differs.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

/// Big enough that 20,000 creates never run out of inodes, whatever ext4
/// keeps back as recently deleted.
const IMAGE_BYTES: u64 = 256 << 20;
const INODES: &str = "131072";

/// A mounted loop filesystem, owned by the agent's uid (nobody when run as
/// root); unmounted and deleted on drop.
pub struct FreshFs {
    mount: PathBuf,
    image: PathBuf,
    mounted: bool,
}

impl FreshFs {
    /// Makes `<parent>/<tag>.img` and mounts it at `<parent>/<tag>`.
    pub fn new(parent: &Path, tag: &str) -> Result<Self> {
        let image = parent.join(format!("{tag}.img"));
        let mount = parent.join(tag);
        let mut fs = Self {
            mount,
            image,
            mounted: false,
        };
        std::fs::File::create(&fs.image)
            .and_then(|f| f.set_len(IMAGE_BYTES))
            .with_context(|| format!("failed to create {}", fs.image.display()))?;
        // Inode tables and journal written now, not by a background
        // thread during the measured run.
        crate::check(
            Command::new("mkfs.ext4")
                .args(["-q", "-F", "-N", INODES])
                .args(["-E", "lazy_itable_init=0,lazy_journal_init=0"])
                .arg(&fs.image),
        )
        .context("failed to make the benchmark's ext4 image (is e2fsprogs installed?)")?;
        std::fs::create_dir_all(&fs.mount)?;
        crate::check(
            Command::new("mount")
                .args(["-o", "loop"])
                .arg(&fs.image)
                .arg(&fs.mount),
        )
        .context("failed to mount the benchmark's ext4 image")?;
        fs.mounted = true;
        crate::check(Command::new("chown").arg("65534:65534").arg(&fs.mount))?;
        Ok(fs)
    }

    pub fn path(&self) -> &Path {
        &self.mount
    }
}

impl Drop for FreshFs {
    fn drop(&mut self) {
        // `mount -o loop` sets autoclear: the loop device goes with the
        // unmount. A process of the run still exiting may hold it for a
        // moment; lazily unmounted as a last resort, never left mounted.
        if self.mounted {
            let unmounted = (0..20).any(|_| {
                let ok = Command::new("umount")
                    .arg(&self.mount)
                    .stderr(std::process::Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                if !ok {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                ok
            });
            if !unmounted {
                let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
            }
        }
        let _ = std::fs::remove_dir(&self.mount);
        let _ = std::fs::remove_file(&self.image);
    }
}
