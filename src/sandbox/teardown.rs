//! Removing what a job left: its processes (via its cgroup), its cgroup dirs,
//! libcontainer's state, stray mounts under its dir, and the dir itself.
//! Used after every job and by `gc` for jobs whose runner died.

use super::jobdir::JobDir;
use crate::config::Home;
use crate::rootless::cgroups::CgroupHost;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// What a clean-up removed, for the job log line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cleanup {
    /// Things that should already have been gone (a crashed helper's leftovers).
    pub leftovers: Vec<String>,
    /// The job dir was removed.
    pub job_dir_removed: bool,
    /// The clean-up continues in a background thread (problems are logged there).
    pub background: bool,
}

impl std::fmt::Display for Cleanup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.background {
            return write!(f, "clean-up running in the background");
        }
        let dir = if self.job_dir_removed { "job dir removed" } else { "job dir NOT removed" };
        if self.leftovers.is_empty() {
            write!(f, "{dir}")
        } else {
            write!(f, "{dir}; also removed: {}", self.leftovers.join(", "))
        }
    }
}

/// Removes everything of `job`, synchronously (the agent manager calls this from a
/// background thread of its own, see `Sandbox::teardown`).
pub fn cleanup_job(home: &Home, job: &JobDir) -> Result<Cleanup> {
    let mut out = Cleanup::default();
    let id = job.id();
    let state = job.read_state().ok();
    if let Some(pid) = kill_recorded_init(job) {
        out.leftovers.push(format!("job init pid {pid} (its pid namespace killed)"));
    }
    let cgroup = state.as_ref().map(|s| s.cgroup_path.clone()).unwrap_or_else(|| cgroup_path_for(home, &id));
    if let Some(n) = remove_cgroup(&cgroup)? {
        // Removing the job's cgroup is routine (the helper made it; see sandbox::cgroup);
        // processes still in it are leftovers.
        if n > 0 {
            out.leftovers.push(format!("cgroup {} ({n} processes killed)", cgroup.display()));
        }
    }
    let container_state =
        state.as_ref().map(|s| s.container_state.clone()).unwrap_or_else(|| job.container_root().join(&id));
    if container_state.exists() {
        std::fs::remove_dir_all(&container_state)
            .with_context(|| format!("cannot remove {}", container_state.display()))?;
        out.leftovers.push(format!("container state {}", container_state.display()));
    }
    for m in mounts_under(&job.root)? {
        nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH)
            .with_context(|| format!("cannot unmount {}", m.display()))?;
        out.leftovers.push(format!("mount {}", m.display()));
    }
    // The layers (disk, maybe gigabytes) go first, the record (runtime dir, small) last:
    // a concurrent gc never sees this job's layers without their record (it would take
    // them for an orphan).
    remove_layers(home, job)?;
    if job.root.exists() {
        std::fs::remove_dir_all(&job.root).with_context(|| format!("cannot remove {}", job.root.display()))?;
    }
    remove_empty_run_root(home);
    out.job_dir_removed = true;
    Ok(out)
}

/// Moves a finished job's layers to the trash and deletes them (its record stays, so gc
/// leaves it alone meanwhile). Only for a job whose processes are all gone: the helper's
/// overlay may still be mounted over them, which only holds the dirs' inodes until it
/// goes.
pub fn remove_layers(home: &Home, job: &JobDir) -> Result<()> {
    if job.layers.exists() {
        remove_dir(home, &job.layers)?;
    }
    Ok(())
}

/// The home's runtime dir levels once its last job is gone (rmdir fails while one is
/// there; a job starting meanwhile makes them again, see `jobdir::create_in_runtime_dir`).
fn remove_empty_run_root(home: &Home) {
    if std::fs::remove_dir(home.jobs_dir()).is_ok() {
        let _ = std::fs::remove_dir(home.run_root());
    }
}

/// rmdir of a cgroup in every hierarchy; succeeds only where it is empty.
fn remove_if_empty(path: &Path) {
    for dir in cgroup_dirs(path) {
        let _ = std::fs::remove_dir(&dir);
    }
}

/// Kills the job's init recorded in `init.pid` if that very process (same pid and start
/// time) still runs; returns its pid then. It is pid 1 of the job's pid namespace, so the
/// kernel kills every other job process with it.
pub fn kill_recorded_init(job: &JobDir) -> Option<i32> {
    let text = std::fs::read_to_string(job.init_file()).ok()?;
    let (pid, start) = text.trim().split_once(' ')?;
    let (pid, start): (i32, u64) = (pid.parse().ok()?, start.parse().ok()?);
    if pid <= 1 || process_start_time(pid)? != start {
        return None;
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).ok()?;
    Some(pid)
}

/// [`kill_recorded_init`] for every job dir whose runner is gone (its lock is free).
pub fn kill_abandoned_inits(home: &Home) {
    for entry in read_dir_or_empty(&home.jobs_dir()) {
        let job = JobDir::at(home, &entry);
        if !job.is_live() {
            if let Some(pid) = kill_recorded_init(&job) {
                tracing::info!("killed pid {pid}, the init of abandoned job {}", job.root.display());
            }
        }
    }
}

/// Field 22 of /proc/PID/stat (start time in clock ticks since boot): with the pid, it
/// names one process, never a later one that reused the pid.
pub fn process_start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(19)?.parse().ok()
}

/// The cgroup (relative to the cgroup root) of job `id`; empty when jobs get none
/// (rootless without a delegated cgroup).
pub fn cgroup_path_for(home: &Home, id: &str) -> PathBuf {
    crate::rootless::mode().cgroup_path_for(&home.tag(), id)
}

/// Kills every process in the cgroup and removes it (all v1 controllers, or the v2 dir).
/// Returns the number of processes found when the cgroup still existed.
///
/// Done here rather than through libcgroups' manager, which re-reads mountinfo once per
/// controller (24 reads per job in the profile of the start/stop path).
pub fn remove_cgroup(path: &Path) -> Result<Option<usize>> {
    // An empty path means "no cgroup"; it must never become the cgroup root.
    if path.as_os_str().is_empty() || path == Path::new("/") {
        return Ok(None);
    }
    // The usual case first: the job and its helper are gone, so each dir is empty and one
    // rmdir per hierarchy is all there is to do (the kernel refuses it while a process or
    // a child cgroup is left: then the thorough way below). Saves the stat, readdir and
    // cgroup.procs read of every dir, ~50 syscalls of each `exec`.
    if let Some(existed) = rmdir_if_empty_everywhere(path) {
        return Ok(existed.then_some(0));
    }
    let dirs = cgroup_dirs(path);
    if dirs.is_empty() {
        return Ok(None);
    }
    // Every dir of the subtree, deepest first (jobs cannot make cgroups, but be thorough).
    let mut all: Vec<PathBuf> = dirs.iter().flat_map(|d| subdirs(d)).collect();
    all.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    let mut killed = std::collections::HashSet::new();
    // Repeat: a process may fork while we kill (the pids limit bounds it).
    for _ in 0..100 {
        let pids: Vec<i32> = all.iter().flat_map(|d| procs_of(d)).collect();
        if pids.is_empty() {
            break;
        }
        for pid in pids {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            killed.insert(pid);
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    for dir in &all {
        rmdir_when_empty(dir).with_context(|| format!("cannot remove cgroup {}", dir.display()))?;
    }
    Ok(Some(killed.len()))
}

/// rmdir of the job's dir in every hierarchy. Some(whether any existed) when none is
/// left; None when one could not be removed (busy: processes or child cgroups).
fn rmdir_if_empty_everywhere(path: &Path) -> Option<bool> {
    let mut existed = false;
    for dir in cgroup_dirs_anywhere(path) {
        match std::fs::remove_dir(dir) {
            Ok(()) => existed = true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(_) => return None,
        }
    }
    Some(existed)
}

/// `dir` and every cgroup below it. The entry type comes from readdir (d_type): a stat of
/// each of the ~30 control files of every v1 dir cost ~1.5 ms per job in the profile.
fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(subdirs(&e.path()));
        }
    }
    out
}

fn procs_of(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// rmdir, retried while the kernel still counts exiting tasks (EBUSY), for up to ~1 s.
fn rmdir_when_empty(dir: &Path) -> std::io::Result<()> {
    let mut last = None;
    for i in 0..200 {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                for pid in procs_of(dir) {
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
                }
                last = Some(e);
                std::thread::sleep(std::time::Duration::from_millis(if i < 20 { 1 } else { 5 }));
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("cgroup stayed busy")))
}

/// Existing directories of a cgroup path on this host, in every hierarchy a job can have
/// one in (the same list the helper creates them from, [`CgroupHost::hierarchies`]).
fn cgroup_dirs(path: &Path) -> Vec<PathBuf> {
    cgroup_dirs_anywhere(path).filter(|p| p.is_dir()).collect()
}

/// Where a cgroup path's dir is in each hierarchy, whether it exists or not.
fn cgroup_dirs_anywhere(path: &Path) -> impl Iterator<Item = PathBuf> + '_ {
    let rel = path.strip_prefix("/").unwrap_or(path);
    CgroupHost::get().hierarchies().map(move |h| h.join(rel))
}

/// Mount points at or below `dir` in this process's mount namespace.
fn mounts_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").context("cannot read /proc/self/mountinfo")?;
    let mut found: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mountinfo)
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect();
    // Deepest first.
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    Ok(found)
}

fn unescape_mountinfo(s: &str) -> String {
    s.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
}

/// Removes a layer dir: renamed into the trash first (so its name is free at once, and a
/// crash mid-way leaves it where gc looks), then deleted.
fn remove_dir(home: &Home, dir: &Path) -> Result<()> {
    let trash = home.trash_dir().join(dir.file_name().unwrap_or_default());
    std::fs::rename(dir, &trash).with_context(|| format!("cannot move {} to the trash", dir.display()))?;
    std::fs::remove_dir_all(&trash).with_context(|| format!("cannot delete {}", trash.display()))
}

/// What `gc` did.
#[derive(Debug, Default)]
pub struct GcReport {
    pub removed: Vec<String>,
    /// Items that could not be removed (gc goes on; the next gc retries).
    pub failed: Vec<String>,
    pub live_jobs: usize,
}

impl GcReport {
    /// One log line per item removed (info) and per item that could not be (warning).
    pub fn log(&self) {
        for r in &self.removed {
            tracing::info!("gc: removed {r}");
        }
        for f in &self.failed {
            tracing::warn!("gc: could not remove {f}");
        }
    }
}

/// [`gc`], stale edit layers (see [`super::editlayer::prune`]), then, when no job of any home is left, the service's own cgroup parent
/// (`/azp-sandbox`, root mode only: a delegated or `--cgroup-parent` dir belongs to the
/// admin). For `azp-sandbox gc` and the end of `run`; the gc at the start of every `exec`
/// keeps the parent, which the next job would only make again (a mkdir and an rmdir in
/// each hierarchy per job).
pub fn gc_all(home: &Home) -> Result<GcReport> {
    let mut report = gc(home)?;
    report.removed.extend(super::editlayer::prune(home));
    let mode = crate::rootless::mode();
    let root_parent = Path::new(crate::rootless::cgroups::ROOT_PARENT);
    if !mode.rootless && mode.cgroups.parent() == Some(root_parent) {
        remove_if_empty(root_parent);
    }
    Ok(report)
}

/// Removes everything that crashed runs left: abandoned jobs (with their layers, cgroups
/// and container state), layer dirs without a record, the trash, interrupted imports.
pub fn gc(home: &Home) -> Result<GcReport> {
    Ok(gc_with(home, true)?.0)
}

/// [`gc`] at the start of every `exec`, which looks for layer dirs without a record only
/// once per life of the runtime dir. Records live there, so such dirs appear only when
/// it is lost (a reboot empties /run); a job's own clean-up and gc remove a job's layers
/// before its record. The scan lists every bucket (17 readdirs, ~80 syscalls), which
/// each `exec` would otherwise pay. `azp-sandbox gc` always scans.
pub fn gc_before_job(home: &Home) -> Result<GcReport> {
    let marker = home.layers_checked_marker();
    let scan = !marker.exists();
    let (report, orphans_all_gone) = gc_with(home, scan)?;
    if scan && orphans_all_gone {
        let made = marker.parent().map(|d| super::jobdir::traversable_dir().recursive(true).create(d));
        if let Some(Err(e)) = made.map(|r| r.and_then(|()| std::fs::write(&marker, ""))) {
            tracing::debug!("cannot write {} ({e}): the next exec scans the layers again", marker.display());
        }
    }
    Ok(report)
}

/// The gc, and whether every layer dir without a record it looked for is gone (true
/// when it did not look).
fn gc_with(home: &Home, scan_orphan_layers: bool) -> Result<(GcReport, bool)> {
    let mut report = GcReport::default();
    if !home.root().exists() {
        return Ok((report, true));
    }
    // One gc at a time (two `exec`s starting together both run gc).
    let _gc_lock = lock_gc(home)?;
    let mut live = std::collections::HashSet::new();
    for entry in read_dir_or_empty(&home.jobs_dir()) {
        let job = JobDir::at(home, &entry);
        if JobDir::is_staging(&entry) && (job.is_live() || younger_than(&entry, std::time::Duration::from_secs(60))) {
            continue;
        }
        let id = entry.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if job.is_live() {
            live.insert(id);
            continue;
        }
        match cleanup_job(home, &job) {
            Ok(c) if c.leftovers.is_empty() => report.removed.push(format!("job {id}")),
            Ok(c) => report.removed.push(format!("job {id} ({})", c.leftovers.join(", "))),
            Err(e) => report.failed.push(format!("job {id}: {e:#}")),
        }
    }
    report.live_jobs = live.len();
    // Layer dirs without a record: the record went with /run at a reboot (a job's own
    // clean-up removes its record last, see cleanup_job). A job being
    // created has its staging record before its layer dir, then its record: checked in
    // that order, a rename between the two checks is seen.
    let jobs_dir = home.jobs_dir();
    let layer_dirs = if scan_orphan_layers { home.job_layer_dirs() } else { vec![] };
    let mut orphans_all_gone = true;
    for entry in layer_dirs {
        let id = entry.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let job = JobDir::new(home, &id);
        if job.staging_record().exists() || job.root.exists() {
            continue;
        }
        match remove_dir(home, &entry) {
            Ok(()) => report.removed.push(format!("orphan layers {}", entry.display())),
            Err(e) => {
                orphans_all_gone = false;
                report.failed.push(format!("orphan layers {}: {e:#}", entry.display()))
            }
        }
    }
    // Cgroups are not scanned for orphans: the parent is shared by every home on the
    // host, and a job's cgroup is always removed before its record (cleanup_job).
    if live.is_empty() && read_dir_or_empty(&jobs_dir).is_empty() {
        remove_empty_run_root(home);
    }
    for entry in read_dir_or_empty(&home.trash_dir()) {
        match std::fs::remove_dir_all(&entry) {
            Ok(()) => report.removed.push(format!("trash {}", entry.display())),
            Err(e) => report.failed.push(format!("trash {}: {e}", entry.display())),
        }
    }
    for p in crate::rootfs::Store::new(home).gc()? {
        report.removed.push(format!("interrupted import {}", p.display()));
    }
    Ok((report, orphans_all_gone))
}

fn lock_gc(home: &Home) -> Result<nix::fcntl::Flock<std::fs::File>> {
    let path = home.root().join("gc.lock");
    let f = std::fs::File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| anyhow::anyhow!("cannot lock {}: {e}", path.display()))
}

fn younger_than(path: &Path, age: std::time::Duration) -> bool {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .map(|t| t.elapsed().map(|e| e < age).unwrap_or(true))
        .unwrap_or(false)
}

fn read_dir_or_empty(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir).map(|rd| rd.flatten().map(|e| e.path()).collect()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_looks_for_orphan_layers_once_per_runtime_dir_and_gc_always() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("xdg")).unwrap();
        let home = Home::for_caller(t.path().join("home"), false, Some(t.path().join("xdg")));
        home.ensure().unwrap();
        let orphan = |id: &str| {
            let d = home.job_layers_dir(id);
            std::fs::create_dir_all(d.join("upper")).unwrap();
            d
        };
        let first = orphan("lost-1");
        let report = gc_before_job(&home).unwrap();
        assert!(!first.exists(), "the first gc scans: {:?}", report.removed);
        assert!(home.layers_checked_marker().exists());
        let second = orphan("lost-2");
        gc_before_job(&home).unwrap();
        assert!(second.exists(), "later ones do not scan");
        let report = gc(&home).unwrap();
        assert!(!second.exists(), "`azp-sandbox gc` always does: {:?}", report.removed);
        // The runtime dir is gone (a reboot): the marker with it, and the scan is back.
        std::fs::remove_file(home.layers_checked_marker()).unwrap();
        let third = orphan("lost-3");
        gc_before_job(&home).unwrap();
        assert!(!third.exists());
    }

    #[test]
    fn start_time_of_this_process_and_a_stale_record() {
        let me = std::process::id() as i32;
        let t = process_start_time(me).expect("own start time");
        assert!(t > 0);
        let dir = tempfile::tempdir().unwrap();
        let job = JobDir { root: dir.path().into(), layers: dir.path().join("layers") };
        // A record naming us with another start time is stale: nothing is killed.
        std::fs::write(job.init_file(), format!("{me} {}", t + 1)).unwrap();
        assert_eq!(kill_recorded_init(&job), None);
        std::fs::write(job.init_file(), "garbage").unwrap();
        assert_eq!(kill_recorded_init(&job), None);
    }

    #[test]
    fn mountinfo_unescape() {
        assert_eq!(unescape_mountinfo("/a\\040b"), "/a b");
    }

    #[test]
    fn cleanup_display() {
        let c = Cleanup {
            leftovers: vec!["cgroup /azp-sandbox/x (2 processes killed)".into()],
            job_dir_removed: true,
            background: false,
        };
        assert_eq!(c.to_string(), "job dir removed; also removed: cgroup /azp-sandbox/x (2 processes killed)");
    }
}
