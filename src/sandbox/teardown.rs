//! Removing what a job left: its processes (via its cgroup), its cgroup dirs,
//! libcontainer's state, stray mounts under its dir, and the dir itself.
//! Used after every job and by `gc` for jobs whose runner died.

use super::jobdir::JobDir;
use crate::config::Home;
use crate::rootless::cgroups::CgroupHost;
use crate::sys::{self, Signal, Sys};
use anyhow::{Context, Result};
use nix::errno::Errno;
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
    cleanup_job_with(home, job, &sys::Real, CgroupHost::get())
}

/// [`cleanup_job`], in this order: the job's init (and with it its pid namespace), its
/// cgroup (killing what is left in it), libcontainer's state, stray mounts, the layers,
/// the record. The first step that fails ends it (the error says which); `gc` retries
/// the rest, since the record is still there.
pub fn cleanup_job_with(home: &Home, job: &JobDir, sys: &dyn Sys, cgroups: &CgroupHost) -> Result<Cleanup> {
    let mut out = Cleanup::default();
    let state = job.read_state().ok();
    stop_job_with(home, job, sys, cgroups, state.as_ref(), &mut out)?;
    remove_job_files_with(home, job, sys, state.as_ref(), &mut out)?;
    Ok(out)
}

/// [`cleanup_job`]'s first half (the job's processes, its cgroup, libcontainer's state,
/// stray mounts), for a caller with work of its own before the second
/// ([`Stopped::finish`]: the layers, the record): `Sandbox::finish` deletes the layers
/// meanwhile, and this half's kernel work overlaps their wait on the disk.
pub fn stop_job(home: &Home, job: &JobDir) -> Result<Stopped> {
    let mut out = Cleanup::default();
    let state = job.read_state().ok();
    stop_job_with(home, job, &sys::Real, CgroupHost::get(), state.as_ref(), &mut out)?;
    Ok(Stopped { state, out })
}

/// A job whose processes, cgroup and runtime state are gone; its files are not yet.
#[derive(Debug)]
pub struct Stopped {
    state: Option<super::jobdir::JobState>,
    out: Cleanup,
}

impl Stopped {
    /// [`cleanup_job`]'s second half: the layers (if still there), the scratch dir, the
    /// record (last: a concurrent gc never sees the layers without it), the id block.
    pub fn finish(mut self, home: &Home, job: &JobDir) -> Result<Cleanup> {
        remove_job_files_with(home, job, &sys::Real, self.state.as_ref(), &mut self.out)?;
        Ok(self.out)
    }
}

/// The first half: the job's processes, its cgroup, libcontainer's state, stray mounts.
fn stop_job_with(
    home: &Home,
    job: &JobDir,
    sys: &dyn Sys,
    cgroups: &CgroupHost,
    state: Option<&super::jobdir::JobState>,
    out: &mut Cleanup,
) -> Result<()> {
    let id = job.id();
    if let Some(pid) = kill_recorded_init_with(job, sys) {
        out.leftovers.push(format!("job init pid {pid} (its pid namespace killed)"));
    }
    let cgroup = state.map(|s| s.cgroup_path.clone()).unwrap_or_else(|| cgroup_path_for(home, &id));
    if let Some(n) = remove_cgroup_with(sys, cgroups, &cgroup)? {
        // Removing the job's cgroup is routine (the helper made it; see sandbox::cgroup);
        // processes still in it are leftovers.
        if n > 0 {
            out.leftovers.push(format!("cgroup {} ({n} processes killed)", cgroup.display()));
        }
    }
    // Its processes are gone: connections its helper did not get to forget (killed).
    if let Some(left) = super::network::forget::left_by_a_killed_helper(&job.connections_file(), sys) {
        if left.entries > 0 {
            out.leftovers
                .push(format!("{} tracked connections of the job (its helper did not forget them)", left.entries));
        }
        if let Some(link) = left.link {
            out.leftovers.push(format!("link {link} (the kernel had not removed it with the job's namespace yet)"));
        }
    }
    let container_state = state.map(|s| s.container_state.clone()).unwrap_or_else(|| job.container_root().join(&id));
    if container_state.exists() {
        sys.remove_tree(&container_state)?;
        out.leftovers.push(format!("container state {}", container_state.display()));
    }
    for m in sys.mounts_under(&job.root)? {
        sys.unmount(&m)?;
        out.leftovers.push(format!("mount {}", m.display()));
    }
    Ok(())
}

/// The second half: the layers, the scratch dir, the record, the id block's lease.
fn remove_job_files_with(
    home: &Home,
    job: &JobDir,
    sys: &dyn Sys,
    state: Option<&super::jobdir::JobState>,
    out: &mut Cleanup,
) -> Result<()> {
    // The layers (disk, maybe gigabytes) go first, the record (runtime dir, small) last:
    // a concurrent gc never sees this job's layers without their record (it would take
    // them for an orphan).
    remove_layers_with(home, job, sys, state.and_then(|s| s.project_id))?;
    if let Some(s) = state {
        if let Some(dir) = &s.scratch {
            // As the layers: the project id's limits go while the dir still holds it. A
            // btrfs subvolume goes as any dir (its qgroup: see sys::btrfs).
            if let (Some(id), true) = (s.scratch_project_id, dir.exists()) {
                sys.release_disk_quota(dir, id)?;
            }
            sys.remove_tree(dir)?;
        }
    }
    if job.root.exists() {
        sys.remove_tree(&job.root)?;
    }
    if let Some(block) = state.and_then(|s| s.id_block) {
        // Its processes and record are gone: its host ids may go to the next job.
        crate::identity::lease::forget(Path::new(crate::identity::lease::DIR), block, &job.root);
    }
    remove_empty_run_root(home, sys);
    out.job_dir_removed = true;
    Ok(())
}

/// Moves a finished job's layers to the trash and deletes them (its record stays, so gc
/// leaves it alone meanwhile). Only for a job whose processes are all gone: the helper's
/// overlay may still be mounted over them, which only holds the dirs' inodes until it
/// goes. The layer dir's disk quota (`project`) is cleared first: while the dir still
/// holds usage, no other job can have taken its project id (see [`crate::sys::quota`]).
fn remove_layers_with(home: &Home, job: &JobDir, sys: &dyn Sys, project: Option<u32>) -> Result<()> {
    if let Some(trash) = trash_layers_with(home, job, sys, project)? {
        sys.remove_tree(&trash)?;
    }
    Ok(())
}

/// The first half of removing a finished job's layers (see [`remove_layers_with`]):
/// their quota cleared and the dir renamed into the trash, where gc finds it should the
/// rest be cut short. Returns where it is now (None: there were none), for
/// [`delete_trashed`]. Once it returns, the job's record may go before the layers do.
pub fn trash_layers(home: &Home, job: &JobDir, project: Option<u32>) -> Result<Option<PathBuf>> {
    trash_layers_with(home, job, &sys::Real, project)
}

fn trash_layers_with(home: &Home, job: &JobDir, sys: &dyn Sys, project: Option<u32>) -> Result<Option<PathBuf>> {
    if !job.layers.exists() {
        return Ok(None);
    }
    if let Some(id) = project {
        sys.release_disk_quota(&job.layers, id)?;
    }
    Ok(Some(move_to_trash(home, &job.layers, sys)?))
}

/// The second half: the layers, deleted from the trash.
pub fn delete_trashed(trash: &Path) -> Result<()> {
    Ok(sys::Real.remove_tree(trash)?)
}

/// The home's runtime dir levels once its last job is gone (rmdir fails while one is
/// there; a job starting meanwhile makes them again, see `jobdir::create_in_runtime_dir`).
fn remove_empty_run_root(home: &Home, sys: &dyn Sys) {
    if sys.remove_dir(&home.jobs_dir()).is_ok() {
        let _ = sys.remove_dir(&home.run_root());
    }
}

/// rmdir of a cgroup in every hierarchy; succeeds only where it is empty.
fn remove_if_empty(path: &Path) {
    for dir in cgroup_dirs(CgroupHost::get(), path) {
        let _ = std::fs::remove_dir(&dir);
    }
}

/// Kills the job's init recorded in `init.pid` if that very process (same pid and start
/// time) still runs; returns its pid then. It is pid 1 of the job's pid namespace, so the
/// kernel kills every other job process with it.
pub fn kill_recorded_init(job: &JobDir) -> Option<i32> {
    kill_recorded_init_with(job, &sys::Real)
}

fn kill_recorded_init_with(job: &JobDir, sys: &dyn Sys) -> Option<i32> {
    let text = std::fs::read_to_string(job.init_file()).ok()?;
    let (pid, start) = text.trim().split_once(' ')?;
    let (pid, start): (i32, u64) = (pid.parse().ok()?, start.parse().ok()?);
    if pid <= 1 || process_start_time(pid)? != start {
        return None;
    }
    sys.kill(pid, Signal::SIGKILL).ok()?;
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
    // One read: the line is a few hundred bytes (the name at most 16), and the helper
    // reads it between the container's create and its start, while the job's init waits
    // (`read_to_string` grows its buffer from 32 bytes: six reads).
    let mut buf = [0u8; 2048];
    let n = std::io::Read::read(&mut std::fs::File::open(format!("/proc/{pid}/stat")).ok()?, &mut buf).ok()?;
    let stat = &buf[..n];
    // The command name (field 2) may contain spaces, parentheses and bytes that are not
    // UTF-8: split after the last ')'.
    let rest = std::str::from_utf8(stat.get(stat.iter().rposition(|b| *b == b')')? + 2..)?).ok()?;
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
    remove_cgroup_with(&sys::Real, CgroupHost::get(), path)
}

fn remove_cgroup_with(sys: &dyn Sys, cgroups: &CgroupHost, path: &Path) -> Result<Option<usize>> {
    // An empty path means "no cgroup"; it must never become the cgroup root.
    if path.as_os_str().is_empty() || path == Path::new("/") {
        return Ok(None);
    }
    // The usual case first: the job and its helper are gone, so each dir is empty and one
    // rmdir per hierarchy is all there is to do (the kernel refuses it while a process or
    // a child cgroup is left: then the thorough way below). Saves the stat, readdir and
    // cgroup.procs read of every dir, ~50 syscalls of each `exec`.
    if let Some(existed) = rmdir_if_empty_everywhere(sys, cgroups, path) {
        return Ok(existed.then_some(0));
    }
    let dirs = cgroup_dirs(cgroups, path);
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
            let _ = sys.kill(pid, Signal::SIGKILL);
            killed.insert(pid);
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    for dir in &all {
        rmdir_when_empty(sys, dir).with_context(|| format!("cannot remove cgroup {}", dir.display()))?;
    }
    Ok(Some(killed.len()))
}

/// rmdir of the job's dir in every hierarchy. Some(whether any existed) when none is
/// left; None when one could not be removed (busy: processes or child cgroups).
fn rmdir_if_empty_everywhere(sys: &dyn Sys, cgroups: &CgroupHost, path: &Path) -> Option<bool> {
    let mut existed = false;
    // cgroup v2: the helper's leaf goes first (libcontainer removed its own below it).
    if cgroups.unified {
        for dir in cgroup_dirs_anywhere(cgroups, path) {
            match sys.remove_dir(&dir.join(super::cgroup::HELPER_LEAF)) {
                Ok(()) => existed = true,
                Err(e) if e.errno() == Some(Errno::ENOENT) => {}
                Err(_) => return None,
            }
        }
    }
    for dir in cgroup_dirs_anywhere(cgroups, path) {
        match sys.remove_dir(&dir) {
            Ok(()) => existed = true,
            Err(e) if e.errno() == Some(Errno::ENOENT) => {}
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
fn rmdir_when_empty(sys: &dyn Sys, dir: &Path) -> sys::Result<()> {
    let mut last = None;
    // Up to ~5 s: a killed process leaves its cgroup only once it has exited, and one that
    // is flushing what it wrote (a job's dd on btrfs under a loaded CI machine) took more
    // than the earlier ~1 s window, so a `gc` right after `kill -9` of an `exec` failed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    for i in 0.. {
        if i >= 20 && std::time::Instant::now() >= deadline {
            break;
        }
        match sys.remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.errno() == Some(Errno::ENOENT) => return Ok(()),
            Err(e) if e.errno() == Some(Errno::EBUSY) => {
                for pid in procs_of(dir) {
                    let _ = sys.kill(pid, Signal::SIGKILL);
                }
                last = Some(e);
                std::thread::sleep(std::time::Duration::from_millis(if i < 20 { 1 } else { 5 }));
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| sys::Error::RemoveDir {
        path: dir.into(),
        source: std::io::Error::other("cgroup stayed busy"),
    }))
}

/// Existing directories of a cgroup path on this host, in every hierarchy a job can have
/// one in (the same list the helper creates them from, [`CgroupHost::hierarchies`]).
fn cgroup_dirs(cgroups: &CgroupHost, path: &Path) -> Vec<PathBuf> {
    cgroup_dirs_anywhere(cgroups, path).filter(|p| p.is_dir()).collect()
}

/// Where a cgroup path's dir is in each hierarchy, whether it exists or not.
fn cgroup_dirs_anywhere<'a>(cgroups: &'a CgroupHost, path: &'a Path) -> impl Iterator<Item = PathBuf> + 'a {
    let rel = path.strip_prefix("/").unwrap_or(path);
    cgroups.hierarchies().map(move |h| h.join(rel))
}

/// Removes a layer dir: renamed into the trash first (so its name is free at once, and a
/// crash mid-way leaves it where gc looks), then deleted.
fn remove_dir(home: &Home, dir: &Path, sys: &dyn Sys) -> Result<()> {
    let trash = move_to_trash(home, dir, sys)?;
    Ok(sys.remove_tree(&trash)?)
}

fn move_to_trash(home: &Home, dir: &Path, sys: &dyn Sys) -> Result<PathBuf> {
    let trash = home.trash_dir().join(dir.file_name().unwrap_or_default());
    sys.rename(dir, &trash)?;
    Ok(trash)
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

/// [`gc`], stale edit layers (see [`super::editlayer::prune`]), the jobs' network table
/// (see [`super::network::gc`]), then, when no job of any home is left, the service's own cgroup parent
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
    // The jobs' network table of the host (root mode), when no job of any home has a
    // link left: the gc before each `exec` keeps it, which its next job would make again.
    match super::network::gc() {
        Ok(Some(what)) => report.removed.push(what),
        Ok(None) => {}
        Err(e) => report.failed.push(format!("the jobs' network table: {e:#}")),
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
        if JobDir::is_staging(&entry) && staging_not_abandoned(&job, &entry) {
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
        match remove_dir(home, &entry, &sys::Real) {
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
        remove_empty_run_root(home, &sys::Real);
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

/// A staging record (see `JobDir::create`) is a live job's unless it is still there,
/// unlocked and older than a create takes. One that is gone since the listing was
/// renamed into place (or removed by its own create's failure): its layers are the
/// new job's. Taken for abandoned, they were removed under a job of another `exec` of
/// the same home that was about to use them (a CI rehearsal: `d02`, its upper dir
/// gone, "ENOENT"). One not locked yet, or just locked: its create is under way.
fn staging_not_abandoned(job: &JobDir, entry: &Path) -> bool {
    job.is_live() || !older_than(entry, STAGING_ABANDONED_AFTER)
}

/// How old an unlocked staging record must be to be taken for abandoned.
const STAGING_ABANDONED_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// True only for a path that is there and was last changed at least `age` ago.
fn older_than(path: &Path, age: std::time::Duration) -> bool {
    let age_of = |m: std::fs::Metadata| m.modified().ok().and_then(|t| t.elapsed().ok());
    std::fs::metadata(path).ok().and_then(age_of).is_some_and(|e| e >= age)
}

fn read_dir_or_empty(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir).map(|rd| rd.flatten().map(|e| e.path()).collect()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_staging_record_gone_fresh_or_locked_is_not_abandoned_an_old_unlocked_one_is() {
        let d = tempfile::tempdir().unwrap();
        let entry = d.path().join(".new-job-1");
        let job = JobDir { root: entry.clone(), layers: d.path().join("layers"), mount: d.path().join("mnt") };
        // Renamed into place since the listing (or never there): not gc's.
        assert!(staging_not_abandoned(&job, &entry));
        std::fs::create_dir(&entry).unwrap();
        assert!(staging_not_abandoned(&job, &entry), "fresh: its create is under way");
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(120);
        std::fs::File::open(&entry).unwrap().set_modified(old).unwrap();
        assert!(!staging_not_abandoned(&job, &entry), "old and unlocked: abandoned");
        let lock = std::fs::File::create(job.lock_file()).unwrap();
        std::fs::File::open(&entry).unwrap().set_modified(old).unwrap();
        let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock).unwrap();
        assert!(staging_not_abandoned(&job, &entry), "locked: live");
    }

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
        let job = JobDir { root: dir.path().into(), layers: dir.path().join("layers"), mount: dir.path().join("m") };
        // A record naming us with another start time is stale: nothing is killed.
        std::fs::write(job.init_file(), format!("{me} {}", t + 1)).unwrap();
        assert_eq!(kill_recorded_init(&job), None);
        std::fs::write(job.init_file(), "garbage").unwrap();
        assert_eq!(kill_recorded_init(&job), None);
        // A process whose name has a space, a ')' and a byte that is not UTF-8 (a job
        // names its processes as it likes): its start time is read all the same.
        use std::os::unix::ffi::OsStrExt;
        let link = dir.path().join(std::ffi::OsStr::from_bytes(b"a) b\xff"));
        std::os::unix::fs::symlink("/bin/sleep", &link).unwrap();
        let mut child = std::process::Command::new(&link).arg("5").spawn().unwrap();
        let pid = child.id() as i32;
        let start = std::time::Instant::now();
        while !std::fs::read(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .starts_with(format!("{pid} (a) b").as_bytes())
            && start.elapsed() < std::time::Duration::from_secs(5)
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let t = process_start_time(pid);
        let _ = child.kill();
        let _ = child.wait();
        assert!(t.is_some_and(|t| t > 0), "{t:?}");
    }

    /// A recorded job (as `Sandbox::create` leaves it) whose init is a live `sleep`,
    /// with libcontainer's state dir, and a cgroup host in a temp dir where no job
    /// cgroup exists.
    struct Fixture {
        _t: tempfile::TempDir,
        home: Home,
        job: JobDir,
        host: CgroupHost,
        _lock: super::super::jobdir::JobLock,
        init: std::process::Child,
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = self.init.kill();
            let _ = self.init.wait();
        }
    }

    fn fixture() -> Fixture {
        let t = tempfile::tempdir().unwrap();
        // Searchable, so that the jobs' mount point is made in it (see Home::mount_point).
        std::fs::set_permissions(t.path(), std::os::unix::fs::PermissionsExt::from_mode(0o711)).unwrap();
        std::fs::create_dir_all(t.path().join("xdg")).unwrap();
        let home = Home::for_caller(t.path().join("home"), false, Some(t.path().join("xdg")));
        home.ensure().unwrap();
        let plan = crate::sandbox::plan::test_plan("td-1", vec![], "/azp-test-td/td-1");
        let job = JobDir::new(&home, "td-1");
        let mut state = super::super::jobdir::JobState::for_plan(&job, &plan);
        let lock = job.create(&plan, &mut state, None).unwrap();
        std::fs::create_dir_all(&state.container_state).unwrap();
        let init = std::process::Command::new("sleep").arg("60").spawn().unwrap();
        let start = process_start_time(init.id() as i32).unwrap();
        std::fs::write(job.init_file(), format!("{} {start}\n", init.id())).unwrap();
        let cg = t.path().join("cg");
        let host = CgroupHost {
            unified: false,
            v1_mounts: vec![cg.join("memory"), cg.join("pids")],
            root: cg.clone(),
            own_v2: None,
            own_v1: vec![],
            v2_mount: None,
        };
        Fixture { _t: t, home, job, host, _lock: lock, init }
    }

    impl Fixture {
        /// The teardown's steps, in order.
        fn steps(&self) -> Vec<String> {
            let (home, job) = (&self.home, &self.job);
            let trash = home.trash_dir().join("td-1");
            vec![
                format!("kill {} SIGKILL", self.init.id()),
                format!("remove_dir {}", self.host.v1_mounts[0].join("azp-test-td/td-1").display()),
                format!("remove_dir {}", self.host.v1_mounts[1].join("azp-test-td/td-1").display()),
                format!("remove_tree {}", job.container_root().join("td-1").display()),
                format!("mounts_under {}", job.root.display()),
                format!("unmount {}", job.idmapped_lower(0).display()),
                format!("rename {} {}", job.layers.display(), trash.display()),
                format!("remove_tree {}", trash.display()),
                format!("remove_tree {}", job.root.display()),
                format!("remove_dir {}", home.jobs_dir().display()),
                format!("remove_dir {}", home.run_root().display()),
            ]
        }

        /// The teardown on a recorder that fails call `k` (none: all succeed), with a mount
        /// left in the record dir (as if a crashed helper's were visible).
        fn run(&self, k: Option<usize>) -> (Vec<String>, Result<Cleanup>) {
            let rec = match k {
                Some(k) => crate::sys::Recorder::failing_at(k, nix::errno::Errno::EIO),
                None => crate::sys::Recorder::default(),
            };
            rec.mounts.borrow_mut().push(self.job.idmapped_lower(0));
            let r = cleanup_job_with(&self.home, &self.job, &rec, &self.host);
            (rec.calls(), r)
        }
    }

    #[test]
    fn connections_a_killed_helper_left_are_forgotten_once_the_job_is_stopped() {
        let f = fixture();
        let link = "azp0123456789ab".to_string();
        let sources = vec!["10.87.0.5".parse().unwrap(), "fd61:7a70:7362::a57:5".parse().unwrap()];
        let c = crate::sandbox::network::job_connections(link, sources);
        let t = crate::sandbox::network::forget::Tracked { connections: c, markers: None };
        crate::sandbox::network::forget::record(&f.job.connections_file(), &t).unwrap();
        let (calls, r) = f.run(None);
        r.unwrap();
        // After its processes and cgroup (its link goes then), while its record is still
        // there to say whose.
        let mut want = f.steps();
        want.insert(3, "remove_job_link azp0123456789ab".into());
        want.insert(4, "forget_connections 10.87.0.5 fd61:7a70:7362::a57:5 of azp0123456789ab Always".into());
        assert_eq!(calls, want);
    }

    #[test]
    fn the_first_half_leaves_the_layers_and_the_record_to_the_second() {
        let f = fixture();
        let rec = crate::sys::Recorder::default();
        rec.mounts.borrow_mut().push(f.job.idmapped_lower(0));
        let state = f.job.read_state().ok();
        let mut out = Cleanup::default();
        stop_job_with(&f.home, &f.job, &rec, &f.host, state.as_ref(), &mut out).unwrap();
        // The init, the cgroup, libcontainer's state, the stray mount: the same steps as
        // the whole clean-up's first six.
        assert_eq!(rec.calls(), f.steps()[..6]);
        assert!(!out.job_dir_removed);
        remove_job_files_with(&f.home, &f.job, &rec, state.as_ref(), &mut out).unwrap();
        assert_eq!(rec.calls(), f.steps(), "then the layers, the record last");
        assert!(out.job_dir_removed);
    }

    #[test]
    fn layers_moved_to_the_trash_let_the_record_go_before_they_are_deleted() {
        let f = fixture();
        std::fs::create_dir_all(f.job.upper().join("usr")).unwrap();
        let trash = trash_layers(&f.home, &f.job, None).unwrap().expect("the job has layers");
        assert_eq!(trash, f.home.trash_dir().join("td-1"));
        assert!(!f.job.layers.exists() && trash.join("upper/usr").is_dir(), "renamed, not deleted yet");
        // The record's half no longer sees layers: no second rename, the record goes.
        let rec = crate::sys::Recorder::default();
        let state = f.job.read_state().ok();
        let mut out = Cleanup::default();
        remove_job_files_with(&f.home, &f.job, &rec, state.as_ref(), &mut out).unwrap();
        let layer_steps = f.steps().into_iter().filter(|s| s.starts_with("rename ") || s.contains("/trash/"));
        assert!(rec.calls().iter().all(|c| !layer_steps.clone().any(|l| &l == c)), "{:?}", rec.calls());
        assert!(out.job_dir_removed);
        delete_trashed(&trash).unwrap();
        assert!(!trash.exists());
        assert_eq!(trash_layers(&f.home, &f.job, None).unwrap(), None, "nothing left to move");
    }

    #[test]
    fn teardown_kills_first_removes_the_record_last() {
        let f = fixture();
        let (calls, c) = f.run(None);
        let c = c.unwrap();
        assert_eq!(calls, f.steps());
        assert!(c.job_dir_removed);
        assert_eq!(
            c.leftovers,
            [
                format!("job init pid {} (its pid namespace killed)", f.init.id()),
                format!("container state {}", f.job.container_root().join("td-1").display()),
                format!("mount {}", f.job.idmapped_lower(0).display()),
            ]
        );
    }

    #[test]
    fn a_jobs_scratch_dir_goes_after_its_layers_before_its_record() {
        let f = fixture();
        let mut state = f.job.read_state().unwrap();
        let scratch = f._t.path().join("nvme/td-1");
        state.scratch = Some(scratch.clone());
        std::fs::write(f.job.state_file(), serde_json::to_vec(&state).unwrap()).unwrap();
        let (calls, c) = f.run(None);
        assert!(c.unwrap().job_dir_removed);
        let mut want = f.steps();
        let at = want.iter().position(|c| c == &format!("remove_tree {}", f.job.root.display())).unwrap();
        want.insert(at, format!("remove_tree {}", scratch.display()));
        assert_eq!(calls, want);
    }

    #[test]
    fn a_failed_teardown_step_stops_it_and_leaves_the_record_for_gc() {
        let f = fixture();
        let all = f.steps();
        let at = |prefix: &str| all.iter().position(|s| s.starts_with(prefix)).unwrap();
        // A kill that fails (the init just exited) is no leftover; the rest goes on.
        let (calls, r) = f.run(Some(0));
        assert_eq!(calls, all);
        assert!(r.unwrap().leftovers.iter().all(|l| !l.starts_with("job init")));
        // A cgroup rmdir refused: the thorough way finds no dir left; the rest goes on.
        let (calls, r) = f.run(Some(1));
        assert_eq!(calls[..2], all[..2]);
        assert_eq!(calls[2..], all[3..], "no rmdir after the fast path gave up; nothing exists to kill");
        assert!(r.is_ok());
        // Each removal or unmount that fails ends the teardown there, before the record
        // goes: gc retries from it.
        for (step, says) in
            [("remove_tree ", "cannot remove"), ("unmount ", "cannot unmount"), ("rename ", "cannot move")]
        {
            let k = at(step);
            let (calls, r) = f.run(Some(k));
            assert_eq!(calls, all[..=k], "{step}");
            let e = r.unwrap_err();
            let failed = e.downcast_ref::<crate::sys::Error>().expect("the failed step's own error");
            assert_eq!(failed.errno(), Some(nix::errno::Errno::EIO), "{step}");
            assert!(e.to_string().starts_with(says), "{step}: {e}");
        }
        let k = all.len() - 3; // the record itself
        let (calls, r) = f.run(Some(k));
        assert_eq!(calls, all[..=k]);
        assert!(format!("{:#}", r.unwrap_err()).starts_with(&format!("cannot remove {}", f.job.root.display())));
        // The runtime dir levels are best effort: the job counts as removed.
        let (calls, r) = f.run(Some(all.len() - 2));
        assert_eq!(calls, all[..all.len() - 1], "the run root is not tried while the jobs dir is left");
        assert!(r.unwrap().job_dir_removed);
    }

    #[test]
    fn a_disk_quota_is_cleared_while_its_layer_dir_still_holds_the_project_id() {
        let f = fixture();
        let mut state = f.job.read_state().unwrap();
        state.project_id = Some(2_052_000_007);
        std::fs::write(f.job.state_file(), serde_json::to_vec(&state).unwrap()).unwrap();
        let (calls, r) = f.run(None);
        r.unwrap();
        let mut want = f.steps();
        let rename = want.iter().position(|s| s.starts_with("rename ")).unwrap();
        want.insert(rename, format!("release_disk_quota {} 2052000007", f.job.layers.display()));
        assert_eq!(calls, want, "before the layers go: nobody can have taken the id meanwhile");
        // A release that fails stops the teardown there, before the layers and the record
        // go: gc retries.
        let (calls, r) = f.run(Some(rename));
        assert_eq!(calls, want[..=rename]);
        assert!(r.unwrap_err().to_string().starts_with("cannot set the disk quota of project 2052000007"));
    }

    #[test]
    fn processes_left_in_a_cgroup_are_killed_before_its_rmdir() {
        use nix::errno::Errno;
        let t = tempfile::tempdir().unwrap();
        let mem = t.path().join("memory");
        let job = mem.join("azp-test-td/td-2");
        std::fs::create_dir_all(&job).unwrap();
        std::fs::write(job.join("cgroup.procs"), "999999\n").unwrap();
        let host = CgroupHost {
            unified: false,
            v1_mounts: vec![mem],
            root: t.path().into(),
            own_v2: None,
            own_v1: vec![],
            v2_mount: None,
        };
        // The fast path's rmdir is refused (busy): the thorough way kills, then rmdirs.
        let rec = crate::sys::Recorder::failing_at(0, Errno::EBUSY);
        let n = remove_cgroup_with(&rec, &host, Path::new("/azp-test-td/td-2")).unwrap();
        assert_eq!(n, Some(1), "one process found and killed");
        let calls = rec.calls();
        let rmdir = format!("remove_dir {}", job.display());
        assert_eq!(calls.first(), Some(&rmdir));
        assert_eq!(calls.last(), Some(&rmdir));
        assert!(calls[1..calls.len() - 1].iter().all(|c| c == "kill 999999 SIGKILL"), "{calls:?}");
        // No cgroup at all (rootless without delegation): nothing is touched.
        let rec = crate::sys::Recorder::default();
        assert_eq!(remove_cgroup_with(&rec, &host, Path::new("")).unwrap(), None);
        assert!(rec.calls().is_empty());
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
