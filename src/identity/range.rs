//! The host ids reserved for jobs (root and setuid modes): the `azp-sandbox` entry of
//! `/etc/subuid` and `/etc/subgid`, as `podman --userns=auto` reserves `containers`. Each
//! job leases one [`BLOCK`] of it ([`super::lease`]).
//!
//! The entry reserves the range so that `useradd` hands none of it out as another
//! user's subordinate ids; the checks here make sure that no real account or group has
//! an id in it (a job running as that id could signal that user's processes, read its
//! files, count against its process limit) and that it overlaps no other entry (those
//! ids belong to another user's user namespaces).

use crate::rootless::subid::{self, SubIdRange};
use anyhow::{bail, Context, Result};
use std::path::Path;

/// The owner name of the entry.
pub const ENTRY: &str = "azp-sandbox";
/// Ids per job: container ids 0..=65535, every id an image uses (nobody is 65534).
pub const BLOCK: u32 = 65536;
/// Where `setup.sh` and `service install` put the range: 2^31, far above the ids of
/// local accounts and of directory services (sssd maps AD users below 2000200000).
pub const DEFAULT_START: u32 = 1 << 31;
/// 1024 blocks: jobs of 500 slots, each with the next one prepared, with room to spare.
pub const DEFAULT_COUNT: u32 = 1024 * BLOCK;

/// The files the range lives in (the real ones, or a test's).
#[derive(Debug, Clone)]
pub struct Files<'a> {
    pub subuid: &'a Path,
    pub subgid: &'a Path,
    pub passwd: &'a Path,
    pub group: &'a Path,
}

impl Files<'static> {
    pub fn host() -> Files<'static> {
        Files {
            subuid: Path::new("/etc/subuid"),
            subgid: Path::new("/etc/subgid"),
            passwd: Path::new("/etc/passwd"),
            group: Path::new("/etc/group"),
        }
    }
}

/// The reserved uids and gids, checked; whole blocks only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub uids: SubIdRange,
    pub gids: SubIdRange,
}

impl Range {
    /// Number of job blocks: the smaller of the two ranges, in whole blocks.
    pub fn blocks(&self) -> u32 {
        self.uids.count.min(self.gids.count) / BLOCK
    }
    /// First host uid and gid of block `k`.
    pub fn block_start(&self, k: u32) -> (u32, u32) {
        (self.uids.start + k * BLOCK, self.gids.start + k * BLOCK)
    }
}

/// The one line that says how to reserve the range.
pub fn how_to_add() -> String {
    format!(
        "add `{ENTRY}:{DEFAULT_START}:{DEFAULT_COUNT}` to /etc/subuid and /etc/subgid (`sudo azp-sandbox service install` \
         or scripts/setup.sh does), or run jobs with host ids: --userns host (NOT recommended, see SECURITY.md)"
    )
}

/// Reads and checks the range.
pub fn load(files: &Files) -> Result<Range> {
    // Each file read once: its entry is found, then checked against the others.
    let (subuid, subgid) = (read(files.subuid)?, read(files.subgid)?);
    let uids = find(files.subuid, &subuid)?;
    let gids = find(files.subgid, &subgid)?;
    let range = Range { uids, gids };
    if range.blocks() == 0 {
        bail!(
            "the {ENTRY} range in {} and {} holds no whole block of {BLOCK} ids: {}",
            files.subuid.display(),
            files.subgid.display(),
            how_to_add()
        );
    }
    check(files.subuid, &subuid, uids, files.passwd, "uid")?;
    check(files.subgid, &subgid, gids, files.group, "gid")?;
    Ok(range)
}

fn read(file: &Path) -> Result<String> {
    match std::fs::read_to_string(file) {
        Ok(t) => Ok(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", file.display())),
    }
}

/// The entry of [`ENTRY`] in `file`, whose text is `text`.
fn find(file: &Path, text: &str) -> Result<SubIdRange> {
    let Some((_, range)) = subid::entries(text).into_iter().find(|(o, _)| o == ENTRY) else {
        bail!(
            "jobs get their own host ids from the {ENTRY} entry of {}, which is missing: {}",
            file.display(),
            how_to_add()
        );
    };
    if range.start == 0 || range.end() > u32::MAX as u64 {
        bail!("bad {ENTRY} entry in {}: ids must lie in 1..4294967294: {}", file.display(), how_to_add());
    }
    Ok(range)
}

/// No other entry of `subfile` (whose text is `subtext`) and no account (or group) in
/// `ids_file` has an id in `range`.
fn check(subfile: &Path, subtext: &str, range: SubIdRange, ids_file: &Path, what: &str) -> Result<()> {
    for (owner, other) in subid::entries(subtext) {
        if owner != ENTRY && other.overlaps(&range) {
            bail!(
                "the {ENTRY} range {}:{} in {} overlaps {owner}'s {}:{}: move one of them (jobs must never share ids \
                 with another user's namespaces)",
                range.start,
                range.count,
                subfile.display(),
                other.start,
                other.count
            );
        }
    }
    for (name, id) in ids_in(&read(ids_file)?) {
        if range.contains(id) {
            bail!(
                "{name} in {} has {what} {id}, inside the {ENTRY} range {}:{} of {}: move the range (jobs must never \
                 run as an account's ids)",
                ids_file.display(),
                range.start,
                range.count,
                subfile.display()
            );
        }
    }
    Ok(())
}

/// `(name, id)` of each line of a passwd or group file (the third field).
fn ids_in(text: &str) -> Vec<(String, u32)> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            let id = f.nth(1)?.parse().ok()?;
            Some((name.to_string(), id))
        })
        .collect()
}

/// Appends the default entry to `subuid` and `subgid` where it is missing (root: `service
/// install`), then checks the range. Returns the files it changed.
pub fn ensure(files: &Files) -> Result<Vec<std::path::PathBuf>> {
    let mut changed = vec![];
    for file in [files.subuid, files.subgid] {
        let text = read(file)?;
        if subid::entries(&text).iter().any(|(o, _)| o == ENTRY) {
            continue;
        }
        let sep = if text.is_empty() || text.ends_with('\n') { "" } else { "\n" };
        let line = format!("{sep}{ENTRY}:{DEFAULT_START}:{DEFAULT_COUNT}\n");
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(file)
            .with_context(|| format!("cannot open {} to reserve the jobs' ids", file.display()))?;
        f.write_all(line.as_bytes()).with_context(|| format!("cannot write {}", file.display()))?;
        changed.push(file.to_path_buf());
    }
    load(files)?;
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Etc {
        dir: tempfile::TempDir,
    }

    impl Etc {
        fn new(subuid: &str, subgid: &str, passwd: &str, group: &str) -> Etc {
            let dir = tempfile::tempdir().unwrap();
            for (n, t) in [("subuid", subuid), ("subgid", subgid), ("passwd", passwd), ("group", group)] {
                std::fs::write(dir.path().join(n), t).unwrap();
            }
            Etc { dir }
        }
        fn path(&self, n: &str) -> std::path::PathBuf {
            self.dir.path().join(n)
        }
        fn load(&self) -> Result<Range> {
            let (a, b, c, d) = (self.path("subuid"), self.path("subgid"), self.path("passwd"), self.path("group"));
            load(&Files { subuid: &a, subgid: &b, passwd: &c, group: &d })
        }
        fn ensure(&self) -> Result<Vec<std::path::PathBuf>> {
            let (a, b, c, d) = (self.path("subuid"), self.path("subgid"), self.path("passwd"), self.path("group"));
            ensure(&Files { subuid: &a, subgid: &b, passwd: &c, group: &d })
        }
    }

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/sh\n\
                          nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
    const GROUP: &str = "root:x:0:\nvideo:x:44:alice\nalice:x:1000:\n";

    #[test]
    fn the_range_in_blocks() {
        let e = Etc::new(
            "alice:100000:65536\nazp-sandbox:2147483648:67108864\n",
            "azp-sandbox:3000000000:655360\n",
            PASSWD,
            GROUP,
        );
        let r = e.load().unwrap();
        assert_eq!(r.blocks(), 10, "the smaller range decides");
        assert_eq!(r.block_start(0), (2147483648, 3000000000));
        assert_eq!(r.block_start(9), (2147483648 + 9 * 65536, 3000000000 + 9 * 65536));
    }

    #[test]
    fn a_missing_or_bad_entry_says_how_to_add_it() {
        let e = Etc::new("alice:100000:65536\n", "", PASSWD, GROUP);
        let err = e.load().unwrap_err().to_string();
        assert!(err.contains("azp-sandbox entry of") && err.contains("azp-sandbox:2147483648:67108864"), "{err}");
        assert!(err.contains("--userns host") && !err.contains('\n'), "{err}");
        let e = Etc::new("azp-sandbox:2147483648:1000\n", "azp-sandbox:2147483648:1000\n", PASSWD, GROUP);
        assert!(e.load().unwrap_err().to_string().contains("no whole block"));
        let e = Etc::new("azp-sandbox:4294901760:65536\n", "azp-sandbox:1:65536\n", PASSWD, GROUP);
        assert!(e.load().unwrap_err().to_string().contains("bad azp-sandbox entry"), "ends at 2^32: -1 is no id");
    }

    #[test]
    fn overlaps_with_accounts_groups_and_other_entries_are_refused() {
        let ok = "azp-sandbox:200000:131072\n";
        let e = Etc::new(&format!("alice:100000:165536\n{ok}"), ok, PASSWD, GROUP);
        let err = e.load().unwrap_err().to_string();
        assert!(err.contains("overlaps alice's 100000:165536"), "{err}");
        let e = Etc::new(ok, ok, &format!("{PASSWD}svc:x:250000:100::/:/bin/sh\n"), GROUP);
        let err = e.load().unwrap_err().to_string();
        assert!(err.contains("svc in") && err.contains("has uid 250000"), "{err}");
        let e = Etc::new(ok, ok, PASSWD, &format!("{GROUP}lab:x:331072:\n"));
        assert_eq!(e.load().unwrap().blocks(), 2, "331072 is past the end (200000 + 131072)");
        let e = Etc::new(ok, ok, PASSWD, &format!("{GROUP}lab:x:331071:\n"));
        assert!(e.load().unwrap_err().to_string().contains("has gid 331071"));
    }

    #[test]
    fn ensure_appends_the_default_once() {
        let e = Etc::new("alice:100000:65536", "", PASSWD, GROUP);
        assert_eq!(e.ensure().unwrap().len(), 2);
        let text = std::fs::read_to_string(e.path("subuid")).unwrap();
        assert_eq!(text, "alice:100000:65536\nazp-sandbox:2147483648:67108864\n");
        assert!(e.ensure().unwrap().is_empty(), "already there");
        assert_eq!(e.load().unwrap().blocks(), 1024);
        // A conflicting account is refused after the entry was added (nothing is moved).
        let e = Etc::new("", "", &format!("{PASSWD}far:x:2147500000:1::/:/bin/sh\n"), GROUP);
        assert!(e.ensure().unwrap_err().to_string().contains("far in"));
    }
}
