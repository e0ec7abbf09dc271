//! Every place the host's mount table shows a denied path.
//!
//! A deny is a mount on one path, but the object it guards can appear at
//! other paths: a bind mount of `/home` at `/srv/home`, a project bound
//! into another project, a btrfs top-level or an ostree `/sysroot` that
//! shows the whole root filesystem again. Through such an alias the agent
//! read a read-denied secret, wrote a write-denied `.git/config`, and (an
//! ordinary user's run) read and truncated the effect log. The agent can
//! make no mounts, so the aliases are the host's, all listed in the mount
//! table the sandbox's namespace is copied from; each gets the deny too.
//!
//! Pure: the table is read by the caller (`/proc/self/mountinfo`).

use std::path::{Component, Path, PathBuf};

/// One line of the mount table, as far as aliases need it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mount {
    /// `major:minor` of its filesystem.
    dev: String,
    /// The directory of that filesystem the mount shows.
    root: PathBuf,
    /// Where it is mounted.
    point: PathBuf,
}

/// Another path that shows (part of) a denied path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alias {
    pub path: PathBuf,
    /// The denied object itself (`true`), or a mount whose whole tree lies
    /// inside a denied directory (`false`: the path is that mount's root,
    /// a file or directory of its own).
    pub same_object: bool,
}

/// The failure to read the table: a deny could then not be proven whole.
#[derive(Debug, thiserror::Error)]
#[error("failed to parse the line {0:?} of the mount table to find other mounts of denied paths")]
pub struct AliasError(String);

/// The host's mount table, parsed once for every path asked about.
#[derive(Debug, Clone, Default)]
pub struct Table(Vec<Mount>);

impl Table {
    pub fn parse(text: &str) -> Result<Self, AliasError> {
        let mounts = text
            .lines()
            .filter(|line| !line.is_empty())
            .map(|line| {
                let mut fields = line.split(' ').skip(2);
                let mut next = || fields.next().ok_or_else(|| AliasError(line.to_owned()));
                let (dev, root, point) = (next()?, next()?, next()?);
                Ok(Mount {
                    dev: dev.to_owned(),
                    root: crate::unix_mirror::unescape(root),
                    point: crate::unix_mirror::unescape(point),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self(mounts))
    }

    /// The other paths at which the table shows `path` (absolute, without
    /// symlinks: the policy refuses those) or a part of it. The mount
    /// holding `path` is the deepest mount point above it (the last listed
    /// of equals: stacked mounts are listed bottom first).
    pub fn aliases(&self, path: &Path) -> Vec<Alias> {
        let mounts = &self.0;
        let above = |m: &&Mount| below(path, &m.point);
        let Some(deepest) = mounts.iter().filter(above).map(|m| depth(&m.point)).max() else {
            return Vec::new();
        };
        let Some(holder) = mounts
            .iter()
            .filter(above)
            .rfind(|m| depth(&m.point) == deepest)
        else {
            return Vec::new();
        };
        let Ok(rest) = path.strip_prefix(&holder.point) else {
            return Vec::new();
        };
        // The object's path inside its filesystem.
        let inner = holder.root.join(rest);
        let mut found: Vec<Alias> = mounts
            .iter()
            .filter(|m| m.dev == holder.dev)
            .filter_map(|m| {
                if let Ok(tail) = inner.strip_prefix(&m.root) {
                    let at = if tail.as_os_str().is_empty() {
                        m.point.clone()
                    } else {
                        m.point.join(tail)
                    };
                    Some(Alias {
                        path: at,
                        same_object: true,
                    })
                } else if below(&m.root, &inner) {
                    Some(Alias {
                        path: m.point.clone(),
                        same_object: false,
                    })
                } else {
                    None
                }
            })
            .filter(|a| a.path != path)
            .collect();
        found.sort_by(|a, b| a.path.cmp(&b.path));
        found.dedup_by(|a, b| a.path == b.path);
        found
    }
}

/// Whether `path` is `prefix` or lies below it, by whole components.
fn below(path: &Path, prefix: &Path) -> bool {
    path.starts_with(prefix)
}

fn depth(path: &Path) -> usize {
    path.components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .count()
}

/// [`Table::aliases`] of `path` in the table `text`.
pub fn aliases(path: &Path, text: &str) -> Result<Vec<Alias>, AliasError> {
    Ok(Table::parse(text)?.aliases(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
22 1 253:1 / / rw,relatime - ext4 /dev/vda1 rw
23 22 0:21 / /proc rw - proc proc rw
30 22 253:1 /home /srv/home rw - ext4 /dev/vda1 rw
31 22 253:1 /home/u/.ssh/keys /mnt/keys rw - ext4 /dev/vda1 rw
32 22 253:1 /var/lib/x/hosts /etc/hosts rw - ext4 /dev/vda1 rw
33 22 0:40 / /home/u/tmp rw - tmpfs tmpfs rw
34 22 253:1 /home/u/my\\040dir /srv/space rw - ext4 /dev/vda1 rw
";

    fn paths(found: &[Alias]) -> Vec<(String, bool)> {
        found
            .iter()
            .map(|a| (a.path.display().to_string(), a.same_object))
            .collect()
    }

    #[test]
    fn a_bind_of_a_parent_and_a_mount_of_a_part_are_aliases() {
        let found = aliases(Path::new("/home/u/.ssh"), TABLE).unwrap();
        assert_eq!(
            paths(&found),
            [
                ("/mnt/keys".to_string(), false),
                ("/srv/home/u/.ssh".to_string(), true)
            ]
        );
    }

    #[test]
    fn the_same_path_through_another_mount_of_its_filesystem_counts() {
        // Denied through the alias: the original path is the alias then.
        let found = aliases(Path::new("/srv/home/u/.env"), TABLE).unwrap();
        assert_eq!(paths(&found), [("/home/u/.env".to_string(), true)]);
        // A mount's whole root denied: every other mount showing it.
        let found = aliases(Path::new("/home/u/my dir"), TABLE).unwrap();
        assert_eq!(
            paths(&found),
            [
                ("/srv/home/u/my dir".to_string(), true),
                ("/srv/space".to_string(), true)
            ]
        );
    }

    #[test]
    fn other_filesystems_and_unrelated_binds_are_not_aliases() {
        // On the tmpfs: no other mount of that filesystem.
        assert!(
            aliases(Path::new("/home/u/tmp/x"), TABLE)
                .unwrap()
                .is_empty()
        );
        // A file bind elsewhere on the same filesystem is not below /etc/shadow.
        assert!(aliases(Path::new("/etc/shadow"), TABLE).unwrap().is_empty());
        // A whole directory that holds a file bind's source hides that file.
        let found = aliases(Path::new("/var/lib"), TABLE).unwrap();
        assert_eq!(paths(&found), [("/etc/hosts".to_string(), false)]);
    }

    #[test]
    fn a_stacked_mount_is_the_one_on_top() {
        let table = "\
22 1 253:1 / / rw - ext4 /dev/vda1 rw
40 22 0:50 / /data rw - tmpfs tmpfs rw
41 40 253:1 /srv/data /data rw - ext4 /dev/vda1 rw
";
        let found = aliases(Path::new("/data/secret"), table).unwrap();
        assert_eq!(paths(&found), [("/srv/data/secret".to_string(), true)]);
    }

    #[test]
    fn an_unreadable_line_fails() {
        assert!(aliases(Path::new("/x"), "22 1 253:1\n").is_err());
    }
}
