//! A cache's dir in the home: `<home>/caches/<name>/`
//!
//! - `snapshots/<n>/`: immutable trees, `n` counting up; `current` is a symlink to the
//!   one new jobs get (replaced by rename, so it always names a whole snapshot);
//! - `commit.lock`: held (exclusive) by a commit and by gc of leftovers, so commits
//!   serialize; `current.lock`: held shared while a job resolves `current` and locks its
//!   snapshot, exclusive while `current` is swapped or snapshots are removed;
//! - each job holds a shared flock on its snapshot's dir for its whole life (the
//!   [`SnapshotLease`], in the sandbox helper): gc removes only snapshots nobody holds;
//! - `info.json`: the last commit (job, time, size); `hits`: one byte per job that
//!   started on a non-empty snapshot (appended, so no lock and no rewrite per job).

use anyhow::{bail, Context, Result};
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use std::fs::{self, File};
use std::path::{Path, PathBuf};

/// Where the caches of `home` live.
pub fn caches_dir(home: &crate::config::Home) -> PathBuf {
    home.root().join("caches")
}

/// The dir of the cache `name` of `home`.
pub fn dir(home: &crate::config::Home, name: &str) -> PathBuf {
    caches_dir(home).join(name)
}

/// Prefix of a snapshot being built by a commit (removed by gc once no commit runs).
pub const BUILDING: &str = ".tmp-";
/// Prefix of a snapshot on its way out.
const TRASH: &str = ".trash-";
/// Prefix of a removed cache's dir (`cache rm`), kept until no job holds its snapshots.
const REMOVED: &str = ".removed-";

/// The last commit of a cache.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Info {
    pub last_committer: Option<String>,
    pub committed_unix: Option<u64>,
    pub size_bytes: u64,
}

/// A job's hold on the snapshot its overlay reads (gc leaves it while held).
#[derive(Debug)]
pub struct SnapshotLease {
    pub dir: PathBuf,
    _lock: Flock<File>,
}

fn lock(path: &Path, how: FlockArg) -> Result<Flock<File>> {
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("cannot open lock {}: check free space and permissions", path.display()))?;
    Flock::lock(f, how).map_err(|(_, e)| anyhow::anyhow!("cannot lock {}: {e}", path.display()))
}

fn try_lock_dir(dir: &Path) -> Option<Flock<File>> {
    let f = File::open(dir).ok()?;
    Flock::lock(f, FlockArg::LockExclusiveNonblock).ok()
}

/// Makes the cache's dir with an empty first snapshot, the first time.
pub fn ensure(store: &Path) -> Result<()> {
    if store.join("current").exists() {
        return Ok(());
    }
    fs::create_dir_all(store.join("snapshots")).with_context(|| {
        format!("cannot create cache dir {}: check free space and permissions of the home", store.display())
    })?;
    let _commit = lock(&store.join("commit.lock"), FlockArg::LockExclusive)?;
    if store.join("current").exists() {
        return Ok(());
    }
    let first = store.join("snapshots/1");
    match fs::create_dir(&first) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(e).with_context(|| format!("cannot create {}", first.display()))
        }
        _ => {}
    }
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&first, fs::Permissions::from_mode(0o755))?;
    point_current(store, 1)
}

/// Points `current` at snapshot `n`: a new symlink renamed over the old one.
pub(super) fn point_current(store: &Path, n: u64) -> Result<()> {
    let tmp = store.join("current.new");
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(format!("snapshots/{n}"), &tmp)
        .with_context(|| format!("cannot write {}: disk full?", tmp.display()))?;
    fs::rename(&tmp, store.join("current")).with_context(|| format!("cannot replace {}/current", store.display()))?;
    if let Ok(d) = File::open(store) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// The number of the current snapshot.
pub fn current(store: &Path) -> Result<u64> {
    let link = fs::read_link(store.join("current"))
        .with_context(|| format!("cache {} has no current snapshot", store.display()))?;
    link.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("corrupt cache pointer {}/current -> {}", store.display(), link.display()))
}

/// Resolves `current` and holds that snapshot for the caller's life (the helper's: the
/// job's). The shared `current.lock` makes resolve-and-hold one step against gc.
pub fn lease_current(store: &Path) -> Result<SnapshotLease> {
    ensure(store)?;
    let _resolving = lock(&store.join("current.lock"), FlockArg::LockShared)?;
    let n = current(store)?;
    let dir = store.join("snapshots").join(n.to_string());
    let f = File::open(&dir).with_context(|| format!("cannot open cache snapshot {}", dir.display()))?;
    let held = Flock::lock(f, FlockArg::LockShared)
        .map_err(|(_, e)| anyhow::anyhow!("cannot hold cache snapshot {}: {e}", dir.display()))?;
    Ok(SnapshotLease { dir, _lock: held })
}

/// Counts a job that starts with this cache warm (its current snapshot not the empty
/// first one): once per job, by its runner (a job's helpers, one per phase, each mount it).
pub fn count_hit(store: &Path) {
    if current(store).unwrap_or(1) <= 1 {
        return;
    }
    use std::io::Write;
    if let Ok(mut f) = File::options().create(true).append(true).open(store.join("hits")) {
        let _ = f.write_all(b".");
    }
}

pub fn read_info(store: &Path) -> Info {
    fs::read(store.join("info.json")).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
}

pub(super) fn write_info(store: &Path, info: &Info) -> Result<()> {
    crate::json_file::write_atomic(&store.join("info.json"), info)
}

/// What `gc` removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swept {
    pub snapshots: usize,
    pub bytes: u64,
}

/// Removes the snapshots of `store` that are neither current nor held by a job, and
/// what killed commits left (only when no commit runs).
pub fn gc(store: &Path) -> Result<Swept> {
    let mut swept = Swept::default();
    let commit = try_lock(&store.join("commit.lock"));
    let trash = {
        let _swap = lock(&store.join("current.lock"), FlockArg::LockExclusive)?;
        let current = current(store).ok().map(|n| n.to_string());
        let mut trash = vec![];
        let snapshots = store.join("snapshots");
        for e in fs::read_dir(&snapshots).with_context(|| format!("cannot list {}", snapshots.display()))? {
            let name = e?.file_name().to_string_lossy().into_owned();
            let path = snapshots.join(&name);
            let leftover = name.starts_with(BUILDING) || name.starts_with(TRASH);
            if leftover {
                if commit.is_some() {
                    trash.push(path);
                }
                continue;
            }
            if Some(&name) == current.as_ref() || try_lock_dir(&path).is_none() {
                continue;
            }
            let to = snapshots.join(format!("{TRASH}{name}"));
            fs::rename(&path, &to).with_context(|| format!("cannot move {} aside", path.display()))?;
            swept.snapshots += 1;
            trash.push(to);
        }
        trash
    };
    for t in trash {
        swept.bytes += super::size::tree_size(&t).unwrap_or(0);
        crate::sys::fs_at::remove_tree(&t).with_context(|| format!("cannot remove {}", t.display()))?;
    }
    Ok(swept)
}

fn try_lock(path: &Path) -> Option<Flock<File>> {
    lock(path, FlockArg::LockExclusiveNonblock).ok()
}

/// The caches of `home` by name (sorted).
pub fn names(home: &crate::config::Home) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(caches_dir(home))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    v.sort();
    v
}

/// The cache `name` of `home`, which must exist.
pub fn existing(home: &crate::config::Home, name: &str) -> Result<PathBuf> {
    let d = dir(home, name);
    if super::check_name(name).is_err() || !d.join("current").exists() {
        let known = names(home);
        bail!(
            "unknown cache '{name}': known caches: {} (`azp-sandbox cache ls`)",
            if known.is_empty() { "none".into() } else { known.join(", ") }
        );
    }
    Ok(d)
}

/// `cache rm`: new jobs get an empty cache at once; the old snapshots go when the jobs
/// that hold them have ended (this call, or a later `cache gc`).
pub fn remove(home: &crate::config::Home, name: &str) -> Result<Swept> {
    let d = existing(home, name)?;
    let _commit = lock(&d.join("commit.lock"), FlockArg::LockExclusive)?;
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|t| t.as_nanos()).unwrap_or(0);
    let gone = caches_dir(home).join(format!("{REMOVED}{name}-{stamp}"));
    fs::rename(&d, &gone).with_context(|| format!("cannot move {} aside", d.display()))?;
    Ok(sweep_removed(home).unwrap_or_default())
}

/// Removes the dirs of removed caches whose snapshots no job holds any more.
pub fn sweep_removed(home: &crate::config::Home) -> Result<Swept> {
    let mut swept = Swept::default();
    for e in fs::read_dir(caches_dir(home)).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with(REMOVED) {
            continue;
        }
        let snaps: Vec<PathBuf> =
            fs::read_dir(e.path().join("snapshots")).into_iter().flatten().flatten().map(|s| s.path()).collect();
        let held: Vec<_> = snaps.iter().map(|s| try_lock_dir(s)).collect();
        if held.iter().zip(&snaps).any(|(h, s)| h.is_none() && s.is_dir()) {
            continue;
        }
        swept.snapshots += snaps.len();
        swept.bytes += super::size::tree_size(&e.path()).unwrap_or(0);
        crate::sys::fs_at::remove_tree(&e.path()).with_context(|| format!("cannot remove {}", e.path().display()))?;
    }
    Ok(swept)
}

/// One cache for `cache ls` and `status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub name: String,
    pub snapshot: u64,
    /// Bytes of the current snapshot (at its commit).
    pub size_bytes: u64,
    /// Seconds since the current snapshot was committed (None: never committed).
    pub age_secs: Option<u64>,
    pub last_committer: Option<String>,
    /// Jobs that started on a non-empty snapshot.
    pub hits: u64,
    /// Snapshots on disk (current, held by running jobs, or not yet collected).
    pub snapshots: usize,
}

pub fn summary(home: &crate::config::Home, name: &str) -> Result<Summary> {
    let d = existing(home, name)?;
    let info = read_info(&d);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|t| t.as_secs()).unwrap_or(0);
    let snapshots = fs::read_dir(d.join("snapshots"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .count();
    Ok(Summary {
        name: name.into(),
        snapshot: current(&d)?,
        size_bytes: info.size_bytes,
        age_secs: info.committed_unix.map(|t| now.saturating_sub(t)),
        last_committer: info.last_committer,
        hits: fs::metadata(d.join("hits")).map(|m| m.len()).unwrap_or(0),
        snapshots,
    })
}

pub fn summaries(home: &crate::config::Home) -> Vec<Summary> {
    names(home).iter().filter_map(|n| summary(home, n).ok()).collect()
}

/// The caches' table (`cache ls`, `status`); empty without caches.
pub fn render(all: &[Summary]) -> String {
    if all.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "caches:\n  {:<16} {:>9} {:>9} {:>12} {:>6}  LAST COMMITTER\n",
        "NAME", "SNAPSHOT", "SIZE", "AGE", "HITS"
    );
    for s in all {
        let age = s.age_secs.map(age).unwrap_or_else(|| "never".into());
        out.push_str(&format!(
            "  {:<16} {:>9} {:>9} {:>12} {:>6}  {}\n",
            s.name,
            s.snapshot,
            crate::config::human_size(s.size_bytes),
            age,
            s.hits,
            s.last_committer.as_deref().unwrap_or("-")
        ));
    }
    out
}

impl Summary {
    /// The cache in one line (`check`).
    pub fn line(&self) -> String {
        let committed = match (self.age_secs, &self.last_committer) {
            (Some(a), Some(job)) => format!("committed {} by job {job}", age(a)),
            (Some(a), None) => format!("committed {}", age(a)),
            _ => "never committed".into(),
        };
        format!(
            "{}: snapshot {}, {}, {committed}, {} hit(s)",
            self.name,
            self.snapshot,
            crate::config::human_size(self.size_bytes),
            self.hits
        )
    }
}

/// "42s ago", "5m ago", "3h ago", "2d ago".
pub fn age(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s ago"),
        s if s < 7200 => format!("{}m ago", s / 60),
        s if s < 172_800 => format!("{}h ago", s / 3600),
        s => format!("{}d ago", s / 86400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_snapshot_outlives_a_commit_and_gc_takes_it_after() {
        let t = tempfile::tempdir().unwrap();
        let store = t.path().join("pip");
        let first = lease_current(&store).unwrap();
        assert_eq!(first.dir, store.join("snapshots/1"));
        // A commit makes snapshot 2 current while the job on 1 runs.
        fs::create_dir(store.join("snapshots/2")).unwrap();
        point_current(&store, 2).unwrap();
        assert_eq!(gc(&store).unwrap().snapshots, 0, "1 is held");
        assert!(store.join("snapshots/1").is_dir());
        drop(first);
        assert_eq!(gc(&store).unwrap().snapshots, 1);
        assert!(!store.join("snapshots/1").exists() && store.join("snapshots/2").is_dir());
        // A killed commit's leftovers go once no commit runs.
        fs::create_dir(store.join("snapshots/.tmp-3")).unwrap();
        {
            let _running = lock(&store.join("commit.lock"), FlockArg::LockExclusive).unwrap();
            gc(&store).unwrap();
            assert!(store.join("snapshots/.tmp-3").exists(), "a running commit's tree stays");
        }
        gc(&store).unwrap();
        assert!(!store.join("snapshots/.tmp-3").exists());
        assert_eq!(current(&store).unwrap(), 2);
    }

    #[test]
    fn rm_of_an_unknown_cache_names_the_known_ones() {
        let t = tempfile::tempdir().unwrap();
        let home = crate::config::Home::new(t.path());
        ensure(&dir(&home, "pip")).unwrap();
        let e = remove(&home, "conda").unwrap_err().to_string();
        assert_eq!(e, "unknown cache 'conda': known caches: pip (`azp-sandbox cache ls`)");
        let held = lease_current(&dir(&home, "pip")).unwrap();
        remove(&home, "pip").unwrap();
        assert!(names(&home).is_empty());
        assert_eq!(sweep_removed(&home).unwrap().snapshots, 0, "a job still reads it");
        drop(held);
        assert_eq!(sweep_removed(&home).unwrap().snapshots, 1);
        assert_eq!(fs::read_dir(caches_dir(&home)).unwrap().count(), 0);
    }
}
