//! A directory path looked up on the disk, taken back to a notification's
//! place in the stream. A notification names its entry by the directory's
//! handle; a handle not in the cache (first met, or forgotten) is looked up
//! while its read is placed, after the read ended, so the path has every
//! directory rename queued in that read, also those queued after the
//! notification: `mkdir d; creat d/f; mv d g`, read at once, named the
//! create `g/f` (round 10 left it open). Those renames are in hand (the
//! rest of the read), so the path is taken back through them, the last
//! first: a path at or below a rename's new path goes back below its old
//! one. Each rename's own paths are the disk's taken back through the
//! renames after it (computed backward once per read, only as far back as
//! a lookup needs).
//!
//! `renameat2(RENAME_EXCHANGE)` of two directories is reported as two
//! renames, `a -> b` then `b -> a`, that happened at once, and `mv a b; mv
//! b a` as the same two events, one after the other: taken back in order,
//! an exchange would name one side's past by the other's name (before,
//! the disk's name was used, which was as wrong). A path at or below
//! either name of such a pair (same thread, adjacent, each the other
//! reversed) is therefore not vouched for.
//!
//! The cost falls on reads that both looked a handle up and hold a
//! directory rename after it; a notification costs nothing more otherwise.
//! The work is bounded per read; past it, or when a rename's directory is
//! gone so its paths are unknown, the path cannot be vouched for and the
//! caller counts it (a gap: `verify` says incomplete) rather than log a
//! name the file may never have had.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt as _;
use std::path::PathBuf;

use super::join::bit;
use super::notify::{DirEntry, Handle, RawEvent};
use super::place::Facts;

/// Prefix comparisons allowed per read (a hostile read of 30,000
/// directory renames would otherwise cost their square).
const WORK_PER_READ: usize = 4_000_000;

/// A rename's paths, each just before / after it; `None` when one of its
/// directories was gone at the lookup.
type Coords = Option<(Vec<u8>, Vec<u8>)>;

/// The directory renames of one read, and their paths once needed.
#[derive(Debug, Default)]
pub(super) struct Rewind {
    /// Position in the read, old entry, new entry.
    renames: Vec<(usize, DirEntry, DirEntry)>,
    /// The moved directory's own handle, per rename, when reported.
    fids: Vec<Option<Handle>>,
    /// The thread of the last rename, to pair it with one read ahead.
    last_tid: u32,
    /// Whether each rename and the one before it read as an exchange.
    pair_with_previous: Vec<bool>,
    /// Paths of the last renames, computed backward: `coords[j]` is
    /// those of `renames[renames.len() - 1 - j]`.
    coords: Vec<Coords>,
    /// Disk lookups of this read's rename directories.
    disk: HashMap<Handle, Option<PathBuf>>,
    work: usize,
}

/// A directory's lookup on the disk: its handle, and how many
/// notifications of the read had been read when it was made.
#[derive(Debug, Clone, Copy)]
pub(super) struct Lookup<'a> {
    pub handle: Option<&'a Handle>,
    pub seen: usize,
}

/// The path cannot be taken back with certainty.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Unsure;

impl Rewind {
    pub fn new(events: &[RawEvent]) -> Self {
        let mut rewind = Self::default();
        rewind.extend(0, events);
        rewind
    }

    /// More notifications of the same read, read ahead of the placement
    /// (`place.rs`), the first at position `offset`. The renames' paths
    /// are computed again: they are taken back through these too.
    pub fn extend(&mut self, offset: usize, events: &[RawEvent]) {
        let dir_rename = bit::ONDIR | bit::RENAME;
        for (i, e) in events.iter().enumerate() {
            let (Some(old), Some(new)) = (&e.entry, &e.new_entry) else {
                continue;
            };
            if e.mask & dir_rename != dir_rename {
                continue;
            }
            let at = offset + i;
            let pair = self.renames.last().is_some_and(|(j, old0, new0)| {
                *j + 1 == at && self.last_tid == e.tid && old == new0 && new == old0
            });
            self.renames.push((at, old.clone(), new.clone()));
            self.fids.push(e.fid.clone());
            self.pair_with_previous.push(pair);
            self.last_tid = e.tid;
        }
        self.coords.clear();
        self.disk.clear();
    }

    /// `path`, a directory's as the disk had it after this read, as it was
    /// just after the read's notification `at`.
    #[cfg(test)]
    pub fn back_to(
        &mut self,
        at: usize,
        path: PathBuf,
        facts: &dyn Facts,
    ) -> Result<PathBuf, Unsure> {
        let lookup = Lookup {
            handle: None,
            seen: usize::MAX,
        };
        self.back_to_looked_up(at, path, lookup, &|| true, &|_| None, facts)
    }

    /// [`Self::back_to`] of a path looked up when the first `seen`
    /// notifications of the read had been read. A rename read after that
    /// may have come after the lookup: a path at or below its new path was
    /// then already there, which a rename allows only for an empty
    /// directory it replaced, so the path is exactly the new one and the
    /// directory is dead (`alive` says it is not): then it is not vouched
    /// for. A live one was moved there by the rename. `at_stream` is a
    /// directory's path at `at` in the stream, when known (the cache's):
    /// no directory rename comes between `at` and the first rename after
    /// it, so that rename's directories, gone from the disk (`mv xI oI;
    /// rm -rf` right after), are where the cache has them. `handle` is the
    /// looked-up directory's: a rename whose own handle is that one moved
    /// it, so a path exactly at its new path needs no `alive` (`rm -r`
    /// right after `mv dI eI` left it dead, and the mkdir in it was named
    /// `eI/sub` with a gap).
    pub fn back_to_looked_up(
        &mut self,
        at: usize,
        path: PathBuf,
        lookup: Lookup<'_>,
        alive: &dyn Fn() -> bool,
        at_stream: &dyn Fn(&Handle) -> Option<PathBuf>,
        facts: &dyn Facts,
    ) -> Result<PathBuf, Unsure> {
        let first = self.renames.partition_point(|(i, _, _)| *i <= at);
        if first == self.renames.len() {
            return Ok(path);
        }
        self.compute_down_to(first, facts, at_stream);
        let mut bytes = path.as_os_str().as_bytes().to_vec();
        let end = self.renames.len();
        let taken_back = match self.undo(&mut bytes, first..end, lookup.seen, lookup.handle) {
            Ok(replaced) if !replaced || alive() => Ok(bytes),
            _ => self.back_from_own_rename(first, lookup, alive),
        };
        Ok(PathBuf::from(OsStr::from_bytes(&taken_back?)))
    }

    /// The looked-up directory's path just after the notification before
    /// `renames[first]`, from the first rename after it whose own handle is
    /// the directory's: just before that rename it was at the rename's old
    /// path, whatever came later (`mv x48 o48; mv x49 o49; rm -rf` before
    /// the later renames' paths were looked up). Taken back through the
    /// renames between, which must be known.
    fn back_from_own_rename(
        &mut self,
        first: usize,
        lookup: Lookup<'_>,
        alive: &dyn Fn() -> bool,
    ) -> Result<Vec<u8>, Unsure> {
        let moved = lookup.handle.ok_or(Unsure)?;
        let mut own = None;
        for k in first..self.renames.len() {
            self.work += 1;
            if self.work > WORK_PER_READ {
                return Err(Unsure);
            }
            if self.fids[k].as_ref() == Some(moved) {
                own = Some(k);
                break;
            }
        }
        let own = own.ok_or(Unsure)?;
        let last = self.renames.len() - 1;
        let Some((old, _)) = &self.coords[last - own] else {
            return Err(Unsure);
        };
        let mut bytes = old.clone();
        let replaced = self.undo(&mut bytes, first..own, lookup.seen, Some(moved))?;
        if replaced && !alive() {
            return Err(Unsure);
        }
        Ok(bytes)
    }

    /// Takes `path` back through the renames `range`, the last first
    /// (their paths already computed); whether a rename read at or after
    /// position `seen` had exactly `path` as its new path, and did not
    /// move the directory `moved`.
    fn undo(
        &mut self,
        path: &mut Vec<u8>,
        range: std::ops::Range<usize>,
        seen: usize,
        moved: Option<&Handle>,
    ) -> Result<bool, Unsure> {
        let last = self.renames.len() - 1;
        let mut replaced = false;
        for k in range.rev() {
            self.work += 1;
            if self.work > WORK_PER_READ {
                return Err(Unsure);
            }
            let Some((old, new)) = &self.coords[last - k] else {
                return Err(Unsure);
            };
            let exchange = self.pair_with_previous[k]
                || self.pair_with_previous.get(k + 1).copied().unwrap_or(false);
            if exchange && (at_or_below(path, new) || at_or_below(path, old)) {
                return Err(Unsure);
            }
            if at_or_below(path, new) {
                let its_own = moved.is_some() && self.fids[k].as_ref() == moved;
                replaced |= path.len() == new.len() && self.renames[k].0 >= seen && !its_own;
                let mut back = old.clone();
                back.extend_from_slice(&path[new.len()..]);
                *path = back;
            }
        }
        Ok(replaced)
    }

    /// Computes the paths of `renames[first..]`, backward from the last;
    /// a rename's are unknown (`None`) when a directory of it is gone from
    /// the disk or its disk path cannot be taken back through the later
    /// renames, except the first's, taken from the stream (`at_stream`).
    fn compute_down_to(
        &mut self,
        first: usize,
        facts: &dyn Facts,
        at_stream: &dyn Fn(&Handle) -> Option<PathBuf>,
    ) {
        while self.renames.len() - self.coords.len() > first {
            let k = self.renames.len() - self.coords.len() - 1;
            let (_, old, new) = self.renames[k].clone();
            let mut ends = Vec::with_capacity(2);
            for entry in [&old, &new] {
                let dir = self
                    .disk
                    .entry(entry.dir.clone())
                    .or_insert_with(|| facts.resolve(&entry.dir))
                    .clone();
                let end = self.renames.len();
                let known = dir.and_then(|dir| {
                    let mut bytes = dir.as_os_str().as_bytes().to_vec();
                    let back = self.undo(&mut bytes, k + 1..end, usize::MAX, None);
                    back.ok().map(|_| bytes)
                });
                let bytes = match known {
                    Some(bytes) => bytes,
                    None if k == first => match at_stream(&entry.dir) {
                        Some(dir) => dir.as_os_str().as_bytes().to_vec(),
                        None => break,
                    },
                    None => break,
                };
                ends.push(join(bytes, &entry.name));
            }
            let coords = match <[Vec<u8>; 2]>::try_from(ends) {
                Ok([old, new]) => Some((old, new)),
                Err(_) => None,
            };
            self.coords.push(coords);
        }
    }
}

fn join(mut dir: Vec<u8>, name: &[u8]) -> Vec<u8> {
    if name.is_empty() || name == b"." {
        return dir;
    }
    if dir.last() != Some(&b'/') {
        dir.push(b'/');
    }
    dir.extend_from_slice(name);
    dir
}

fn at_or_below(path: &[u8], dir: &[u8]) -> bool {
    path.starts_with(dir) && (path.len() == dir.len() || path[dir.len()] == b'/')
}

#[cfg(test)]
mod tests {
    use super::super::place::Member;
    use super::*;

    fn p(s: &str) -> PathBuf {
        std::path::Path::new(s).to_path_buf()
    }

    /// Handle [n] is the directory `/w` + the table's path.
    struct Disk(Vec<(u8, &'static str)>);

    impl Facts for Disk {
        fn member(&self, _: u32) -> Member {
            Member::Host
        }
        fn resolve(&self, dir: &Handle) -> Option<PathBuf> {
            self.0
                .iter()
                .find(|(n, _)| dir.bytes == [*n])
                .map(|(_, path)| p(path))
        }
    }

    fn lk(handle: Option<&Handle>, seen: usize) -> Lookup<'_> {
        Lookup { handle, seen }
    }

    fn entry(dir: u8, name: &str) -> DirEntry {
        DirEntry {
            dir: Handle {
                fsid: [0, 0],
                handle_type: 1,
                bytes: vec![dir],
            },
            name: name.as_bytes().to_vec(),
        }
    }

    fn ev(mask: u64, from: DirEntry, to: Option<DirEntry>) -> RawEvent {
        RawEvent {
            mask,
            tid: 1,
            entry: Some(from),
            new_entry: to,
            fid: None,
        }
    }

    fn dir_rename(from: DirEntry, to: DirEntry) -> RawEvent {
        ev(bit::ONDIR | bit::RENAME, from, Some(to))
    }

    #[test]
    fn a_path_looked_up_after_later_renames_is_taken_back_through_them() {
        // mkdir d; creat d/f; mv d g; mkdir d; mv g/x d/x-moved ... in one
        // read. Handle 1 is /w, 2 the first d (now /w/g), 3 the second d.
        let disk = Disk(vec![(1, "/w"), (2, "/w/g"), (3, "/w/d")]);
        let events = vec![
            ev(bit::ONDIR | bit::CREATE, entry(1, "d"), None),
            ev(bit::CREATE, entry(2, "f"), None),
            dir_rename(entry(1, "d"), entry(1, "g")),
            ev(bit::ONDIR | bit::CREATE, entry(1, "d"), None),
            dir_rename(entry(2, "x"), entry(3, "x-moved")),
        ];
        let mut r = Rewind::new(&events);
        assert_eq!(r.back_to(1, p("/w/g"), &disk), Ok(p("/w/d")));
        assert_eq!(r.back_to(2, p("/w/g"), &disk), Ok(p("/w/g")));
        assert_eq!(r.back_to(1, p("/w/d/x-moved"), &disk), Ok(p("/w/d/x")));
        assert_eq!(r.back_to(3, p("/w/d/x-moved"), &disk), Ok(p("/w/g/x")));
        assert_eq!(
            r.back_to(4, p("/w/d/x-moved"), &disk),
            Ok(p("/w/d/x-moved"))
        );
        // Not a prefix by bytes only.
        assert_eq!(r.back_to(0, p("/w/gg"), &disk), Ok(p("/w/gg")));
    }

    #[test]
    fn a_loop_reads_as_exchanges_and_a_gone_directory_is_unsure() {
        let disk = Disk(vec![(1, "/w")]);
        let mut events = vec![ev(bit::CREATE, entry(5, "f"), None)];
        for _ in 0..3 {
            events.push(dir_rename(entry(1, "p"), entry(1, "q")));
            events.push(dir_rename(entry(1, "q"), entry(1, "p")));
        }
        events.push(dir_rename(entry(1, "p"), entry(1, "q")));
        let mut r = Rewind::new(&events);
        // `mv p q; mv q p` one after the other reads as an exchange.
        assert_eq!(r.back_to(0, p("/w/q/d"), &disk), Err(Unsure));
        assert_eq!(r.back_to(7, p("/w/q/d"), &disk), Ok(p("/w/q/d")));
        assert_eq!(r.back_to(0, p("/w/r/d"), &disk), Ok(p("/w/r/d")));
        // A rename in a directory gone at the lookup: unknown paths.
        let events = vec![
            ev(bit::CREATE, entry(1, "f"), None),
            dir_rename(entry(9, "a"), entry(1, "b")),
        ];
        let mut r = Rewind::new(&events);
        assert_eq!(r.back_to(0, p("/w/b"), &disk), Err(Unsure));
        // No rename after the notification: nothing looked up.
        assert_eq!(r.back_to(1, p("/w/b"), &Disk(Vec::new())), Ok(p("/w/b")));
    }

    #[test]
    fn a_path_in_an_exchanged_directory_is_unsure() {
        let disk = Disk(vec![(1, "/w")]);
        let events = vec![
            ev(bit::CREATE, entry(5, "f"), None),
            dir_rename(entry(1, "a"), entry(1, "b")),
            dir_rename(entry(1, "b"), entry(1, "a")),
        ];
        let mut r = Rewind::new(&events);
        assert_eq!(r.back_to(0, p("/w/a/x"), &disk), Err(Unsure));
        assert_eq!(r.back_to(0, p("/w/b"), &disk), Err(Unsure));
        assert_eq!(r.back_to(0, p("/w/c/x"), &disk), Ok(p("/w/c/x")));
    }

    #[test]
    fn the_work_of_a_read_is_bounded() {
        let disk = Disk(vec![(1, "/w")]);
        let mut events = vec![ev(bit::CREATE, entry(1, "f"), None)];
        for i in 0..3_000 {
            events.push(dir_rename(
                entry(1, &format!("a{i}")),
                entry(1, &format!("b{i}")),
            ));
        }
        let mut r = Rewind::new(&events);
        assert_eq!(r.back_to(0, p("/w/b2999/x"), &disk), Err(Unsure));
    }

    #[test]
    fn renames_read_ahead_are_taken_back_and_a_replaced_directory_is_unsure() {
        // Read: creat d/f. Read ahead after d's lookup: mv d g, then an
        // empty `e` replaced by a rename onto it.
        let disk = Disk(vec![(1, "/w")]);
        let mut r = Rewind::new(&[ev(bit::CREATE, entry(2, "f"), None)]);
        r.extend(1, &[dir_rename(entry(1, "d"), entry(1, "g"))]);
        assert_eq!(r.back_to(0, p("/w/g"), &disk), Ok(p("/w/d")));
        r.extend(2, &[dir_rename(entry(1, "x"), entry(1, "e"))]);
        let dead = || false;
        let alive = || true;
        let none = |_: &Handle| None;
        // `e` looked up before the last rename was read: moved there
        // (alive) or replaced by it (dead: not vouched for).
        assert_eq!(
            r.back_to_looked_up(0, p("/w/e"), lk(None, 2), &alive, &none, &disk),
            Ok(p("/w/x"))
        );
        assert_eq!(
            r.back_to_looked_up(0, p("/w/e"), lk(None, 2), &dead, &none, &disk),
            Err(Unsure)
        );
        // Below it, the rename came first (it replaces empty ones only).
        assert_eq!(
            r.back_to_looked_up(0, p("/w/e/s"), lk(None, 2), &dead, &none, &disk),
            Ok(p("/w/x/s"))
        );
        // Read before the lookup: in the disk's path.
        assert_eq!(
            r.back_to_looked_up(0, p("/w/e"), lk(None, 3), &dead, &none, &disk),
            Ok(p("/w/x"))
        );
    }

    #[test]
    fn a_directory_the_rename_itself_moved_is_taken_back_though_dead() {
        // mkdir d/sub (read), then read ahead after d's lookup (it was at
        // e): mv d e, and `rm -r e` before the check. The rename's own
        // handle (9) is the looked-up directory's: it moved it there.
        let disk = Disk(vec![(1, "/w")]);
        let mut r = Rewind::new(&[ev(bit::CREATE | bit::ONDIR, entry(9, "sub"), None)]);
        let mut mv = dir_rename(entry(1, "d"), entry(1, "e"));
        mv.fid = Some(entry(9, "").dir);
        r.extend(1, &[mv]);
        let dead = || false;
        let none = |_: &Handle| None;
        let d = entry(9, "").dir;
        assert_eq!(
            r.back_to_looked_up(0, p("/w/e"), lk(Some(&d), 1), &dead, &none, &disk),
            Ok(p("/w/d"))
        );
        // Another directory's handle: as before, not vouched for.
        let other = entry(8, "").dir;
        assert_eq!(
            r.back_to_looked_up(0, p("/w/e"), lk(Some(&other), 1), &dead, &none, &disk),
            Err(Unsure)
        );
    }

    #[test]
    fn the_first_rename_s_gone_directories_are_taken_where_the_stream_has_them() {
        // creat x/o; mv b/t/x b/o; rm -rf b: only /w is left on the disk;
        // the cache has b/t (handle 3) and b (handle 4) at the stream.
        let disk = Disk(vec![(1, "/w")]);
        let events = vec![
            ev(bit::CREATE, entry(2, "o"), None),
            dir_rename(entry(3, "x"), entry(4, "o")),
        ];
        let stream = |h: &Handle| match h.bytes.as_slice() {
            [3] => Some(p("/w/b/t")),
            [4] => Some(p("/w/b")),
            _ => None,
        };
        let mut r = Rewind::new(&events);
        let alive = || true;
        assert_eq!(
            r.back_to_looked_up(0, p("/w/b/o"), lk(None, 2), &alive, &stream, &disk),
            Ok(p("/w/b/t/x"))
        );
        // Without the stream's paths: not vouched for.
        let mut r = Rewind::new(&events);
        assert_eq!(r.back_to(0, p("/w/b/o"), &disk), Err(Unsure));
    }

    #[test]
    fn the_rename_that_moved_the_directory_tells_its_path_past_unknown_ones() {
        // The routine script's loop, then `rm -rf b` before the renames'
        // paths were looked up: creat t/x48/o (2 is x48); mv t/x48 o48;
        // mkdir t/x49; mv t/x49 o49 (5 is x49). The disk has only /w; the
        // cache has b/t (3) and b (4) at the stream. x48 was looked up at
        // /w/b/o48 before the removal.
        let disk = Disk(vec![(1, "/w")]);
        let own = |n: u8| Some(entry(n, "").dir);
        let mut mv48 = dir_rename(entry(3, "x48"), entry(4, "o48"));
        mv48.fid = own(2);
        let mut mv49 = dir_rename(entry(3, "x49"), entry(4, "o49"));
        mv49.fid = own(5);
        let events = vec![
            ev(bit::CREATE, entry(2, "o"), None),
            mv48,
            ev(bit::ONDIR | bit::CREATE, entry(3, "x49"), None),
            mv49,
        ];
        let stream = |h: &Handle| match h.bytes.as_slice() {
            [3] => Some(p("/w/b/t")),
            [4] => Some(p("/w/b")),
            _ => None,
        };
        let dead = || false;
        let x48 = entry(2, "").dir;
        for seen in [1, 4] {
            let mut r = Rewind::new(&events);
            assert_eq!(
                r.back_to_looked_up(
                    0,
                    p("/w/b/o48"),
                    lk(Some(&x48), seen),
                    &dead,
                    &stream,
                    &disk
                ),
                Ok(p("/w/b/t/x48")),
                "looked up after {seen} notifications"
            );
        }
        // A directory no rename's handle names (moved, if at all, with an
        // ancestor): the unknown rename may have moved it, not vouched for.
        let other = entry(6, "").dir;
        let mut r = Rewind::new(&events);
        assert_eq!(
            r.back_to_looked_up(0, p("/w/b/o48"), lk(Some(&other), 4), &dead, &stream, &disk),
            Err(Unsure)
        );
        // Without the renames' own handles: not vouched for.
        let bare: Vec<RawEvent> = events
            .iter()
            .cloned()
            .map(|mut e| {
                e.fid = None;
                e
            })
            .collect();
        let mut r = Rewind::new(&bare);
        assert_eq!(
            r.back_to_looked_up(0, p("/w/b/o48"), lk(Some(&x48), 4), &dead, &stream, &disk),
            Err(Unsure)
        );
        // The directory's own rename after one of unknown paths (9, of
        // directories the disk and the cache no longer have): that one may
        // have moved an ancestor, not vouched for.
        let disk = Disk(vec![(1, "/w"), (3, "/w/b/t"), (4, "/w/b")]);
        let mut unknown = dir_rename(entry(7, "y"), entry(8, "z"));
        unknown.fid = own(9);
        let mut mv48 = dir_rename(entry(3, "x48"), entry(4, "o48"));
        mv48.fid = own(2);
        let events = vec![ev(bit::CREATE, entry(2, "o"), None), unknown, mv48];
        let mut r = Rewind::new(&events);
        assert_eq!(
            r.back_to_looked_up(0, p("/w/b/o48"), lk(Some(&x48), 3), &dead, &stream, &disk),
            Err(Unsure)
        );
        // Past it, the rename alone says it.
        assert_eq!(
            r.back_to_looked_up(1, p("/w/b/o48"), lk(Some(&x48), 3), &dead, &stream, &disk),
            Ok(p("/w/b/t/x48"))
        );
    }
}
