//! The regular files a run created or modified, by kernel path, for the
//! seal. Kept as raw bytes in byte order: a `PathBuf` set compares paths
//! component by component, which was a tenth of the supervisor's time on a
//! create flood (every modify notification touches a file again), and in
//! byte order a directory's descendants are still one range (`d/` up to
//! `d0`, `0` being the byte after `/`).

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
use std::path::Path;

/// At most this many changed files are remembered (~100 bytes each);
/// later ones are only counted.
const MAX_TOUCHED: usize = 1_000_000;

#[derive(Debug, Default)]
pub(super) struct Touched {
    paths: BTreeSet<Vec<u8>>,
    /// Changed files not remembered (over MAX_TOUCHED).
    untracked: u64,
}

impl Touched {
    pub fn touch(&mut self, path: &Path) {
        let key = path.as_os_str().as_bytes();
        if self.paths.contains(key) {
            return;
        }
        if self.paths.len() < MAX_TOUCHED {
            self.paths.insert(key.to_vec());
        } else {
            self.untracked += 1;
        }
    }

    #[cfg(test)]
    pub fn contains(&self, path: &Path) -> bool {
        self.paths.contains(path.as_os_str().as_bytes())
    }

    /// Changed files the seal cannot list (over the memory bound).
    pub fn untracked(&self) -> u64 {
        self.untracked
    }

    /// The remembered files, in byte order.
    pub fn iter(&self) -> impl Iterator<Item = &Path> {
        self.paths
            .iter()
            .map(|p| Path::new(OsStr::from_bytes(p.as_slice())))
    }

    /// Moves the changed files of a renamed file or directory.
    pub fn renamed(&mut self, from: &Path, to: &Path, dir: bool) {
        if !dir {
            if self.paths.remove(from.as_os_str().as_bytes()) {
                self.touch(to);
            }
            return;
        }
        let from = from.as_os_str().as_bytes();
        let start = [from, b"/"].concat();
        let end = [from, b"0"].concat();
        let moved: Vec<Vec<u8>> = self.paths.range(start.clone()..end).cloned().collect();
        for p in moved {
            self.paths.remove(&p);
            let rest = OsString::from_vec(p[start.len()..].to_vec());
            self.touch(&to.join(rest));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renamed_directory_moves_its_descendants_and_nothing_else() {
        let mut t = Touched::default();
        for p in ["/w/d/f", "/w/d/e/g", "/w/d-x", "/w/d", "/w/dz/f", "/w/d0"] {
            t.touch(Path::new(p));
        }
        t.renamed(Path::new("/w/d"), Path::new("/w/n"), true);
        let now: Vec<&Path> = t.iter().collect();
        let want: Vec<&Path> = ["/w/d", "/w/d-x", "/w/d0", "/w/dz/f", "/w/n/e/g", "/w/n/f"]
            .into_iter()
            .map(Path::new)
            .collect();
        assert_eq!(now, want);
        t.renamed(Path::new("/w/d0"), Path::new("/w/m"), false);
        assert!(t.contains(Path::new("/w/m")) && !t.contains(Path::new("/w/d0")));
        // A file never touched stays untouched when renamed.
        t.renamed(Path::new("/w/q"), Path::new("/w/r"), false);
        assert!(!t.contains(Path::new("/w/r")));
    }
}
