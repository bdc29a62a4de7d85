//! `/etc/subuid` and `/etc/subgid`: the subordinate id ranges an administrator granted a
//! user (`usermod --add-subuids`). Rootless sandboxes map container ids 1..=count onto
//! the user's range; `newuidmap`/`newgidmap` (setuid root, from the `uidmap` package)
//! check the same files before writing the map, so this parser only has to find the range.

use anyhow::{bail, Context, Result};
use std::path::Path;

/// One `NAME_OR_ID:START:COUNT` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubIdRange {
    pub start: u32,
    pub count: u32,
}

impl SubIdRange {
    /// One past the last id, as u64 (a range may end at 2^32).
    pub fn end(&self) -> u64 {
        self.start as u64 + self.count as u64
    }
    pub fn overlaps(&self, other: &SubIdRange) -> bool {
        (self.start as u64) < other.end() && (other.start as u64) < self.end()
    }
    pub fn contains(&self, id: u32) -> bool {
        id >= self.start && (id as u64) < self.end()
    }
}

/// The first range granted to `user` (by name or numeric id) in a subuid/subgid file's
/// text; None when there is none. Malformed lines are skipped, as shadow-utils does.
pub fn find(text: &str, user: &str, id: u32) -> Option<SubIdRange> {
    let id = id.to_string();
    entries(text).into_iter().find_map(|(owner, range)| (owner == user || owner == id).then_some(range))
}

/// Every well-formed `OWNER:START:COUNT` entry of a subuid/subgid file's text, in order.
pub fn entries(text: &str) -> Vec<(String, SubIdRange)> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|line| {
            let mut parts = line.trim().splitn(3, ':');
            let (owner, start, count) = (parts.next()?, parts.next()?, parts.next()?);
            let range = SubIdRange { start: start.parse().ok()?, count: count.parse().ok()? };
            (range.count > 0).then(|| (owner.to_string(), range))
        })
        .collect()
}

/// Reads the range of `user` from `file` (`/etc/subuid` or `/etc/subgid`), with the fix
/// in the error.
pub fn lookup(file: &Path, user: &str, id: u32) -> Result<SubIdRange> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", file.display())),
    };
    match find(&text, user, id) {
        Some(r) if r.count >= MIN_COUNT => Ok(r),
        Some(r) => bail!(
            "{} grants {user} only {} subordinate ids; rootless sandboxes need at least {MIN_COUNT}: \
             ask an administrator to run `usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {user}`",
            file.display(),
            r.count
        ),
        None => bail!(
            "rootless mode needs subordinate ids for {user} in {}: ask an administrator to run \
             `usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {user}`",
            file.display()
        ),
    }
}

/// Container images use ids up to 65534 (nobody); fewer and their files cannot be owned.
pub const MIN_COUNT: u32 = 65536;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_by_name_or_uid_and_skips_junk() {
        let t = "# comment\nalice:100000:65536\nbroken line\nbob:x:1\n1002:300000:70000\nbob:200000:65536\n";
        assert_eq!(find(t, "alice", 1001), Some(SubIdRange { start: 100000, count: 65536 }));
        assert_eq!(find(t, "carol", 1002), Some(SubIdRange { start: 300000, count: 70000 }));
        assert_eq!(find(t, "bob", 1003), Some(SubIdRange { start: 200000, count: 65536 }));
        assert_eq!(find(t, "dave", 1004), None);
        assert_eq!(find("erin:5:0\n", "erin", 1), None);
    }

    #[test]
    fn lookup_errors_say_what_to_run() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("subuid");
        std::fs::write(&f, "small:100000:1000\n").unwrap();
        let e = lookup(&f, "small", 1).unwrap_err().to_string();
        assert!(e.contains("only 1000") && e.contains("usermod --add-subuids"), "{e}");
        let e = lookup(&f, "nobody-here", 2).unwrap_err().to_string();
        assert!(e.contains("rootless mode needs subordinate ids for nobody-here"), "{e}");
        let e = lookup(&dir.path().join("missing"), "x", 3).unwrap_err().to_string();
        assert!(e.contains("usermod"), "{e}");
    }
}
