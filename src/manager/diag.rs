//! Each job's agent `_diag` logs, kept after the job whatever its result:
//! `HOME/logs/<agent>/<job>/`, root-only, at most `diag_logs_max` bytes per agent (the
//! oldest jobs' copies go first; a job whose logs alone are bigger keeps their ends).
//! At most [`MAX_JOBS`] jobs' copies are kept per agent. The copy runs in the thread that
//! tears the job down, not before the slot's next agent starts; each slot keeps a
//! [`Ledger`] of its copies, so no job rescans them all.
//!
//! The upper dir is the job's: it may have planted symlinks, fifos or device nodes there
//! (`_diag -> /etc`, `Agent_1.log -> /etc/shadow`). Everything is opened relative to the
//! upper dir, without following a symlink at any step (`O_NOFOLLOW`), and only regular
//! files are read: an `O_PATH` open and a stat first, so a fifo or device is never opened.
//! The job's processes are gone when this runs (its pid namespace died with it).

use crate::config::Home;
use crate::sys::fs_at;
use std::ffi::CStr;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Where the agent keeps its `_diag`, below the upper dir.
const DIAG: [&CStr; 3] = [c"azp", c"agent", c"_diag"];
/// Subdirectories of `_diag` followed (the agent writes `pages/` there).
const MAX_DEPTH: usize = 2;
/// The most jobs' copies kept per agent, whatever their size: tiny logs must not fill
/// the disk's inodes (nor the ledger the memory) before they fill the size bound.
pub const MAX_JOBS: usize = 1000;

/// What was kept of one job's `_diag`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Kept {
    pub dir: PathBuf,
    pub files: usize,
    pub bytes: u64,
    /// Files left out or cut (the budget ran out, or not a regular file).
    pub skipped: Vec<String>,
}

/// The copies of one agent's jobs, oldest first, and their total size: read from disk
/// once when the slot starts, kept up to date by [`keep`].
#[derive(Debug, Default)]
pub struct Ledger {
    agent: String,
    dir: PathBuf,
    /// (job number, job name, bytes)
    jobs: std::collections::VecDeque<(u64, String, u64)>,
    total: u64,
}

impl Ledger {
    /// What `HOME/logs/<agent>/` holds now.
    pub fn scan(home: &Home, agent: &str) -> Ledger {
        let dir = home.logs_dir().join(agent);
        let mut jobs: Vec<(u64, String, u64)> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let n = super::joblog::job_number(&name, agent)?;
                Some((n, name, dir_bytes(&e.path())))
            })
            .collect();
        jobs.sort();
        let total = jobs.iter().map(|j| j.2).sum();
        Ledger { agent: agent.to_string(), dir, jobs: jobs.into(), total }
    }

    /// Records job `name`'s copy of `bytes`, then removes the oldest copies (never that
    /// one) until the total fits in `budget` and at most [`MAX_JOBS`] are left.
    fn add(&mut self, name: &str, bytes: u64, budget: u64) {
        let n = super::joblog::job_number(name, &self.agent).unwrap_or(u64::MAX);
        self.jobs.retain(|j| j.1 != name);
        let at = self.jobs.iter().position(|j| j.0 > n).unwrap_or(self.jobs.len());
        self.jobs.insert(at, (n, name.to_string(), bytes));
        self.total = self.jobs.iter().map(|j| j.2).sum();
        while self.total > budget || self.jobs.len() > MAX_JOBS {
            let Some(i) = self.jobs.iter().position(|j| j.1 != name) else { break };
            let (_, old, b) = self.jobs.remove(i).unwrap_or_default();
            let path = self.dir.join(&old);
            match fs_at::remove_tree(&path) {
                Ok(()) => tracing::debug!("removed old diag logs {} ({b} bytes)", path.display()),
                Err(e) => tracing::warn!("cannot remove old diag logs {}: {e}", path.display()),
            }
            self.total -= b;
        }
    }
}

/// Copies the `_diag` of the job whose upper dir is `upper` into
/// `HOME/logs/<agent>/<job>/` (at most `budget` bytes), then removes the oldest jobs'
/// copies of the agent until all of them fit in `budget`. None when the job has no `_diag`
/// or `budget` is 0 (none kept).
pub fn keep(
    home: &Home,
    ledger: &std::sync::Mutex<Ledger>,
    job: &str,
    upper: &Path,
    budget: u64,
) -> std::io::Result<Option<Kept>> {
    if budget == 0 {
        return Ok(None);
    }
    let Some(diag) = open_diag(upper)? else { return Ok(None) };
    let agent = ledger.lock().unwrap_or_else(|p| p.into_inner()).agent.clone();
    let agent_dir = home.logs_dir().join(&agent);
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&agent_dir)?;
    let dest = agent_dir.join(job);
    let _ = fs_at::remove_tree(&dest); // a leftover of a run that died mid-copy
    std::fs::DirBuilder::new().mode(0o700).create(&dest)?;
    let mut kept = Kept { dir: dest.clone(), ..Default::default() };
    let mut left = budget;
    copy_dir(diag.as_raw_fd(), &dest, &mut left, &mut kept, 0)?;
    ledger.lock().unwrap_or_else(|p| p.into_inner()).add(job, kept.bytes, budget);
    Ok(Some(kept))
}

/// `upper/azp/agent/_diag`, each step a real directory (not a symlink).
fn open_diag(upper: &Path) -> std::io::Result<Option<OwnedFd>> {
    let mut fd = fs_at::open_dir(upper)?;
    for name in DIAG {
        fd = match fs_at::open_dir_at(fd.as_raw_fd(), name) {
            Ok(next) => next,
            // Missing, a symlink (ELOOP), or not a directory: nothing of ours to copy.
            Err(e) if matches!(fs_at::errno(&e), libc::ENOENT | libc::ELOOP | libc::ENOTDIR) => return Ok(None),
            Err(e) => return Err(e),
        };
    }
    Ok(Some(fd))
}

fn copy_dir(dir: RawFd, dest: &Path, left: &mut u64, kept: &mut Kept, depth: usize) -> std::io::Result<()> {
    let mut names = fs_at::read_dir_names(dir)?;
    names.sort();
    for name in names {
        let shown = dest.join(name.to_string_lossy().as_ref());
        let st = match fs_at::fstatat_nofollow(dir, &name) {
            Ok(st) => st,
            Err(_) => continue,
        };
        if fs_at::is_dir(&st) {
            if depth + 1 >= MAX_DEPTH {
                kept.skipped.push(format!("{} (too deep)", shown.display()));
                continue;
            }
            let Ok(sub) = fs_at::open_dir_at(dir, &name) else { continue };
            std::fs::DirBuilder::new().mode(0o700).create(&shown)?;
            copy_dir(sub.as_raw_fd(), &shown, left, kept, depth + 1)?;
            continue;
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            kept.skipped.push(format!("{} (not a regular file)", shown.display()));
            continue;
        }
        if *left == 0 {
            kept.skipped.push(format!("{} (over the size bound)", shown.display()));
            continue;
        }
        let Some(file) = open_regular(dir, &name, &st) else { continue };
        let copied = copy_tail(file, &shown, *left)?;
        if copied < st.st_size as u64 {
            kept.skipped.push(format!("{} (only its last {copied} bytes)", shown.display()));
        }
        *left -= copied;
        kept.bytes += copied;
        kept.files += 1;
    }
    Ok(())
}

/// Opens `name` for reading if it is still the regular file `st` described (no symlink
/// followed, never blocking).
fn open_regular(dir: RawFd, name: &CStr, st: &libc::stat) -> Option<std::fs::File> {
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
    let fd = fs_at::openat(dir, name, flags, 0).ok()?;
    let now = fs_at::fstat(fd.as_raw_fd()).ok()?;
    let same = (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino) && now.st_mode & libc::S_IFMT == libc::S_IFREG;
    same.then(|| std::fs::File::from(fd))
}

/// Copies the last `max` bytes of `from` into a new file `to` (0600); returns the bytes.
fn copy_tail(mut from: std::fs::File, to: &Path, max: u64) -> std::io::Result<u64> {
    let len = from.metadata()?.len();
    from.seek(SeekFrom::Start(len.saturating_sub(max)))?;
    let mut out = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(to)?;
    let n = std::io::copy(&mut from.take(max), &mut out)?;
    out.flush()?;
    Ok(n)
}

/// Bytes of the files below `dir` (our own copies: no symlinks in them).
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upper_with_diag(files: &[(&str, &[u8])]) -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let diag = t.path().join("upper/azp/agent/_diag");
        std::fs::create_dir_all(&diag).unwrap();
        for (name, bytes) in files {
            let p = diag.join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, bytes).unwrap();
        }
        t
    }

    #[test]
    fn copies_the_diag_files_and_nothing_a_job_planted() {
        let t = upper_with_diag(&[("Agent_1.log", b"agent"), ("pages/step.log", b"step")]);
        let diag = t.path().join("upper/azp/agent/_diag");
        let secret = t.path().join("host-secret");
        std::fs::write(&secret, "root's").unwrap();
        std::os::unix::fs::symlink(&secret, diag.join("Worker_1.log")).unwrap();
        std::os::unix::fs::symlink(t.path(), diag.join("dirlink")).unwrap();
        nix::unistd::mkfifo(&diag.join("fifo.log"), nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let home = Home::new(t.path().join("home"));
        let ledger = std::sync::Mutex::new(Ledger::scan(&home, "h-0"));
        let kept = keep(&home, &ledger, "h-0-1", &t.path().join("upper"), 1 << 20).unwrap().unwrap();
        let dest = t.path().join("home/logs/h-0/h-0-1");
        assert_eq!(kept.dir, dest);
        assert_eq!((kept.files, kept.bytes), (2, 9));
        assert_eq!(std::fs::read(dest.join("Agent_1.log")).unwrap(), b"agent");
        assert_eq!(std::fs::read(dest.join("pages/step.log")).unwrap(), b"step");
        for planted in ["Worker_1.log", "dirlink", "fifo.log"] {
            assert!(std::fs::symlink_metadata(dest.join(planted)).is_err(), "{planted} copied");
        }
        assert_eq!(kept.skipped.len(), 3, "{:?}", kept.skipped);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&dest).unwrap().permissions().mode() & 0o777, 0o700);
    }

    #[test]
    fn a_diag_dir_that_is_a_symlink_is_not_followed() {
        let t = tempfile::tempdir().unwrap();
        let agent = t.path().join("upper/azp/agent");
        std::fs::create_dir_all(&agent).unwrap();
        std::fs::create_dir_all(t.path().join("etc")).unwrap();
        std::fs::write(t.path().join("etc/shadow"), "x").unwrap();
        std::os::unix::fs::symlink(t.path().join("etc"), agent.join("_diag")).unwrap();
        let home = Home::new(t.path().join("home"));
        let ledger = std::sync::Mutex::new(Ledger::scan(&home, "h-0"));
        assert_eq!(keep(&home, &ledger, "h-0-1", &t.path().join("upper"), 1 << 20).unwrap(), None);
        // A symlinked parent too.
        std::fs::remove_file(agent.join("_diag")).unwrap();
        std::fs::remove_dir(&agent).unwrap();
        std::os::unix::fs::symlink(t.path().join("etc"), &agent).unwrap();
        assert_eq!(keep(&home, &ledger, "h-0-1", &t.path().join("upper"), 1 << 20).unwrap(), None);
    }

    #[test]
    fn the_budget_keeps_the_newest_jobs_and_the_ends_of_big_logs() {
        let home_dir = tempfile::tempdir().unwrap();
        let home = Home::new(home_dir.path());
        // An earlier run's copy, found by the scan when the slot starts.
        std::fs::create_dir_all(home.logs_dir().join("h-0/h-0-1")).unwrap();
        std::fs::write(home.logs_dir().join("h-0/h-0-1/Agent.log"), [b'a'; 40]).unwrap();
        let ledger = std::sync::Mutex::new(Ledger::scan(&home, "h-0"));
        assert_eq!(ledger.lock().unwrap().total, 40);
        for n in 2..=3 {
            let t = upper_with_diag(&[("Agent.log", &[b'a' + n as u8; 40])]);
            keep(&home, &ledger, &format!("h-0-{n}"), &t.path().join("upper"), 100).unwrap();
        }
        let logs = home.logs_dir().join("h-0");
        assert!(!logs.join("h-0-1").exists(), "the oldest went");
        assert!(logs.join("h-0-2").exists() && logs.join("h-0-3").exists());
        // One job bigger than the budget: its files' ends, nothing older kept.
        let t = upper_with_diag(&[("Agent.log", b"0123456789"), ("Worker.log", b"abcdefghij")]);
        let kept = keep(&home, &ledger, "h-0-4", &t.path().join("upper"), 15).unwrap().unwrap();
        assert_eq!(std::fs::read(logs.join("h-0-4/Agent.log")).unwrap(), b"0123456789");
        assert_eq!(std::fs::read(logs.join("h-0-4/Worker.log")).unwrap(), b"fghij");
        assert_eq!(kept.bytes, 15);
        let left: Vec<_> = std::fs::read_dir(&logs).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(left, ["h-0-4"]);
    }
}
