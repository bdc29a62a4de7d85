//! A job's two dirs and its state record: the record dir `<run root>/jobs/<id>/` (see
//! [`Home::run_root`]: lock, record, plan, bundle, mount point, libcontainer's state) and
//! the layer dir `<home>/layers/_<b>/<id>/` (the overlay's upper and work dirs, on disk;
//! `_<b>` is its bucket, see [`Home::job_layers_dir`]).
//!
//! The record is written *before* anything privileged happens, and a lock on `lock` is
//! held by the runner for the job's whole life. `gc` treats a record dir whose lock it
//! can take as abandoned and removes what the record names, and a layer dir without a
//! record as an orphan.

use super::plan::JobPlan;
use crate::config::Home;
use crate::sys::{DiskQuota, Mechanism, Sys};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::fs::{self, File};
use std::path::{Path, PathBuf};

/// Name prefix of a record still being built (see [`JobDir::create`]).
const STAGING: &str = ".new-";
/// The console socket's name in the record dir ([`JobDir::console_socket`]).
pub const CONSOLE_SOCKET: &str = "console.sock";

/// Held by the runner while the job lives (flock on `<job>/lock`, released by the kernel
/// when the runner dies).
pub type JobLock = nix::fcntl::Flock<File>;

#[derive(Debug, Clone)]
pub struct JobDir {
    /// The record dir (runtime dir).
    pub root: PathBuf,
    /// The layer dir (home's disk).
    pub layers: PathBuf,
    /// Where the helper mounts the overlay (see [`Home::mount_point`]).
    pub mount: PathBuf,
}

/// What `gc` needs to undo a job when the processes that owned it are gone.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobState {
    pub id: String,
    pub cgroup_path: PathBuf,
    /// libcontainer's state dir for this container.
    pub container_state: PathBuf,
    pub merged: PathBuf,
    pub rootfs: Vec<PathBuf>,
    pub runner_pid: u32,
    pub started_unix: u64,
    /// The block of host ids the job runs as (root mode): `gc` frees it with the record.
    #[serde(default)]
    pub id_block: Option<u32>,
    /// The project id of the layer dir's disk quota (see [`crate::sys::quota`]): its
    /// limits are cleared by the teardown, or by `gc` after a crash.
    #[serde(default)]
    pub project_id: Option<u32>,
    /// The layer dir is a btrfs subvolume with a qgroup limit: this qgroup (see
    /// [`crate::sys::btrfs`]). Removed as a dir; the kernel drops its qgroup.
    #[serde(default)]
    pub qgroup: Option<u64>,
    /// The job's scratch dir on the host (removed with the job).
    #[serde(default)]
    pub scratch: Option<PathBuf>,
    /// The scratch dir's disk quota: a project id, or a btrfs qgroup (the dir is then a
    /// subvolume).
    #[serde(default)]
    pub scratch_project_id: Option<u32>,
    #[serde(default)]
    pub scratch_qgroup: Option<u64>,
}

impl JobState {
    /// The record of a job this process is about to create from `plan` in `job`.
    pub fn for_plan(job: &JobDir, plan: &JobPlan) -> JobState {
        JobState {
            id: plan.id.clone(),
            cgroup_path: plan.cgroup_path.clone(),
            container_state: job.container_root().join(&plan.id),
            merged: job.merged(),
            rootfs: plan.lower.clone(),
            runner_pid: std::process::id(),
            id_block: plan.userns.as_ref().and_then(|ids| ids.block),
            started_unix: std::time::SystemTime::now()
                .duration_since(std::time::SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            project_id: None,
            qgroup: None,
            scratch: plan.scratch.as_ref().map(|s| s.host.clone()),
            scratch_project_id: None,
            scratch_qgroup: None,
        }
    }
}

/// Where a helper mounts its job's network files (see [`crate::sys::net::mount_job_net_dir`]):
/// beside the overlay's mount point `mount`, one path for all jobs (each helper sees its
/// own tmpfs there). Known before the job is: an early helper mounts it (see
/// `runner::EarlyHelper`).
pub fn net_dir(mount: &Path) -> PathBuf {
    let mut name = mount.file_name().unwrap_or_default().to_os_string();
    name.push("-net");
    mount.with_file_name(name)
}

impl JobDir {
    pub fn new(home: &Home, id: &str) -> JobDir {
        JobDir { root: home.jobs_dir().join(id), layers: home.job_layers_dir(id), mount: home.mount_point() }
    }
    /// The job whose record dir is `record` (as found by a scan of [`Home::jobs_dir`];
    /// a staging record `.new-<id>` names the layers of `<id>`).
    pub fn at(home: &Home, record: &Path) -> JobDir {
        let name = record.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let id = name.strip_prefix(STAGING).unwrap_or(&name);
        JobDir { root: record.to_path_buf(), layers: home.job_layers_dir(id), mount: home.mount_point() }
    }
    /// Where [`JobDir::create`] builds the record before renaming it into place.
    pub fn staging_record(&self) -> PathBuf {
        self.root.with_file_name(format!("{STAGING}{}", self.id()))
    }
    pub fn id(&self) -> String {
        self.root.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
    }
    pub fn upper(&self) -> PathBuf {
        self.layers.join("upper")
    }
    pub fn work(&self) -> PathBuf {
        self.layers.join("work")
    }
    /// The job's tree, as the helper (and only it) sees it.
    pub fn merged(&self) -> PathBuf {
        self.mount.clone()
    }
    /// Where the helper mounts lower layer `k` idmapped with the job's ids (root mode).
    pub fn idmapped_lower(&self, k: usize) -> PathBuf {
        self.root.join("lower").join(k.to_string())
    }
    /// Where the helper mounts the job's network files: see [`net_dir`].
    pub fn net_dir(&self) -> PathBuf {
        net_dir(&self.mount)
    }

    /// Where the helper mounts the job's caches (see [`super::cachemount`]): beside the
    /// overlay's mount point, one path for all jobs.
    pub fn caches_dir(&self) -> PathBuf {
        let mut name = self.mount.file_name().unwrap_or_default().to_os_string();
        name.push("-caches");
        self.mount.with_file_name(name)
    }

    /// The OCI bundle: `config.json` (libcontainer reads it from here).
    pub fn bundle(&self) -> PathBuf {
        self.root.join("bundle")
    }
    /// libcontainer's state root for this job (instead of its default `/run/youki`).
    pub fn container_root(&self) -> PathBuf {
        self.root.join("containers")
    }
    pub fn plan_file(&self) -> PathBuf {
        self.root.join("plan.json")
    }
    pub fn state_file(&self) -> PathBuf {
        self.root.join("state.json")
    }
    pub fn lock_file(&self) -> PathBuf {
        self.root.join("lock")
    }
    /// `PID STARTTIME` of the job's init, written by the helper once the container exists:
    /// how `gc` finds a job whose helper died when the job has no cgroup (rootless without
    /// delegation). Killing pid 1 of the job's pid namespace kills every process in it.
    pub fn init_file(&self) -> PathBuf {
        self.root.join("init.pid")
    }
    /// A root-mode job's masqueraded connections (its host link and addresses) while they
    /// may outlive it unforgotten: written by the helper before the job starts, removed
    /// once it forgot them (see `network::forget`).
    pub fn connections_file(&self) -> PathBuf {
        self.root.join("connections.json")
    }
    /// Where the helper reports the job's exit status (or its own failure).
    pub fn result_file(&self) -> PathBuf {
        self.root.join("result.json")
    }
    /// Where the runner of a job with a terminal listens for its pty master (see
    /// [`super::console`]).
    pub fn console_socket(&self) -> PathBuf {
        self.root.join(CONSOLE_SOCKET)
    }

    /// Creates the dirs, takes the lock, records the state and writes the plan.
    /// Returns the lock; dropping it marks the job as abandoned for `gc`. With a `quota`,
    /// the layer dir gets its disk quota before its upper and work dirs are made (they
    /// inherit its project id), and `state` records the id.
    ///
    /// The record is built under `.new-<id>` and renamed into place with the lock already
    /// held (flock follows the inode), so `gc` never sees a record that is not locked yet;
    /// the layer dir is made while the staging record exists, so `gc` never takes it for
    /// an orphan. On failure, what this call made is removed again.
    pub fn create(
        &self,
        plan: &JobPlan,
        state: &mut JobState,
        quota: Option<(&dyn Sys, &DiskQuota)>,
    ) -> Result<JobLock> {
        let staging = JobDir { root: self.staging_record(), layers: self.layers.clone(), mount: self.mount.clone() };
        // mkdir fails if the staging dir exists: then nothing here is ours to remove.
        create_in_runtime_dir(&staging.root, &private_dir())?;
        let mut made_layers = false;
        let made = self.fill(&staging, plan, state, quota, &mut made_layers);
        if made.is_err() {
            // Only what this call made: the layer dir or the final record may belong to a
            // live job of the same name (its mkdir and the rename failed then).
            let _ = fs::remove_dir_all(&staging.root);
            if made_layers {
                if let (Some((sys, _)), Some(id)) = (quota, state.project_id.take()) {
                    let _ = sys.release_disk_quota(&self.layers, id);
                }
                let _ = fs::remove_dir_all(&self.layers);
            }
        }
        made
    }

    fn fill(
        &self,
        staging: &JobDir,
        plan: &JobPlan,
        state: &mut JobState,
        quota: Option<(&dyn Sys, &DiskQuota)>,
        made_layers: &mut bool,
    ) -> Result<JobLock> {
        let file = File::create(staging.lock_file()).context("cannot create job lock file")?;
        let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| anyhow::anyhow!("cannot lock new job dir {}: {e}", staging.root.display()))?;
        fs::create_dir(staging.bundle()).with_context(|| format!("cannot create {}", staging.bundle().display()))?;
        create_mount_point(&self.mount)?;
        match quota {
            Some((sys, quota)) if quota.mechanism == Mechanism::BtrfsQgroup => {
                // The layer dir is the subvolume: made with its limit, or not at all.
                create_bucket(&self.layers).with_context(|| {
                    format!(
                        "cannot create the bucket of {}: check free space under the home dir",
                        self.layers.display()
                    )
                })?;
                state.qgroup = Some(sys.create_quota_subvolume(&self.layers, quota.bytes)?);
                *made_layers = true;
            }
            _ => {
                create_layer_dir(&self.layers).with_context(|| {
                    format!("cannot create job dir {}: check free space under the home dir", self.layers.display())
                })?;
                *made_layers = true;
                if let Some((sys, quota)) = quota {
                    state.project_id = Some(sys.claim_disk_quota(&self.layers, quota)?);
                }
            }
        }
        for d in [self.upper(), self.work()] {
            fs::create_dir(&d).with_context(|| format!("cannot create {}: disk full?", d.display()))?;
        }
        fs::write(staging.plan_file(), serde_json::to_vec(plan)?).context("cannot write job plan: disk full?")?;
        // The record is written before anything privileged happens, so a crash of this
        // process from here on is visible to gc. Not fsynced: it must outlive a process,
        // not the machine (a reboot takes the mounts, cgroups and processes with it, and gc
        // removes a job dir whose record is missing or torn).
        fs::write(staging.state_file(), serde_json::to_vec_pretty(state)?)
            .with_context(|| format!("cannot write {}: disk full?", staging.state_file().display()))?;
        fs::rename(&staging.root, &self.root)
            .with_context(|| format!("cannot move {} into place", staging.root.display()))?;
        Ok(lock)
    }

    /// True for a job dir still being set up by [`JobDir::create`].
    pub fn is_staging(path: &Path) -> bool {
        path.file_name().is_some_and(|n| n.to_string_lossy().starts_with(STAGING))
    }

    pub fn read_state(&self) -> Result<JobState> {
        let bytes =
            fs::read(self.state_file()).with_context(|| format!("cannot read {}", self.state_file().display()))?;
        serde_json::from_slice(&bytes).with_context(|| format!("corrupt job record {}", self.state_file().display()))
    }

    pub fn read_plan(&self) -> Result<JobPlan> {
        let bytes =
            fs::read(self.plan_file()).with_context(|| format!("cannot read {}", self.plan_file().display()))?;
        serde_json::from_slice(&bytes).with_context(|| format!("corrupt job plan {}", self.plan_file().display()))
    }

    /// True when some live process holds the job's lock.
    pub fn is_live(&self) -> bool {
        let Ok(f) = File::open(self.lock_file()) else { return false };
        match nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(_unlocked_on_drop) => false,
            Err(_) => true,
        }
    }
}

/// 0700 from the start: a root job can leave setuid-root files in its upper dir, which
/// lives on the host's disk; no host user may reach them (nor the record's mount point).
fn private_dir() -> fs::DirBuilder {
    dir_with_mode(0o700)
}

/// A dir others may pass through but not list (0711): the home's runtime dir levels and
/// the layer buckets, whose entries are private dirs of their own.
pub(super) fn traversable_dir() -> fs::DirBuilder {
    dir_with_mode(0o711)
}

fn dir_with_mode(mode: u32) -> fs::DirBuilder {
    let mut b = fs::DirBuilder::new();
    std::os::unix::fs::DirBuilderExt::mode(&mut b, mode);
    b
}

/// The job's layer dir, and its bucket the first time one is used (buckets stay: they
/// are made once, so ext4 spreads them, and never deleted).
fn create_layer_dir(dir: &Path) -> std::io::Result<()> {
    match private_dir().create(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let bucket = dir.parent().ok_or(e)?;
            match traversable_dir().create(bucket) {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
            private_dir().create(dir)
        }
        r => r,
    }
}

/// The layer dir's bucket, the first time one is used.
fn create_bucket(layers: &Path) -> std::io::Result<()> {
    let bucket = layers.parent().ok_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    match traversable_dir().create(bucket) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

/// mkdir of a record dir; its parents (the home's runtime dir levels) are made as needed.
/// They are removed again once the home has no job, maybe by another job's teardown
/// between our `create_dir_all` and `mkdir`: then the parents are made once more.
fn create_in_runtime_dir(dir: &Path, builder: &fs::DirBuilder) -> Result<()> {
    let parent = dir.parent().context("job dir has no parent")?;
    let mut tries = 0;
    loop {
        let made = traversable_dir().recursive(true).create(parent).and_then(|()| builder.create(dir));
        match made {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries < 5 => tries += 1,
            r => return r.with_context(|| format!("cannot create job dir {}", dir.display())),
        }
    }
}

/// The shared mount point (see [`Home::mount_point`]), made the first time (0700: covered
/// by each helper's mount, and empty for everyone else). One in a shared dir (`/tmp`)
/// must be ours: a symlink or another user's dir there would put the job's tree where
/// they choose.
pub(super) fn create_mount_point(dir: &Path) -> Result<()> {
    make_mount_point(dir)?;
    use std::os::unix::fs::MetadataExt;
    let m = fs::symlink_metadata(dir).with_context(|| format!("cannot stat {}", dir.display()))?;
    if !m.is_dir() || m.uid() != nix::unistd::geteuid().as_raw() || m.mode() & 0o022 != 0 {
        anyhow::bail!(
            "{} is not a dir of this user's that only it may write: remove it (jobs are mounted there)",
            dir.display()
        );
    }
    Ok(())
}

fn make_mount_point(dir: &Path) -> Result<()> {
    match private_dir().create(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = dir.parent().context("mount point has no parent")?;
            traversable_dir().recursive(true).create(parent)?;
            match private_dir().create(dir) {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
                _ => Ok(()),
            }
        }
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
    .with_context(|| format!("cannot create the jobs' mount point {}", dir.display()))
}

/// A fresh job id: valid as a container id, a cgroup name and a file name.
pub fn new_job_id(prefix: &str) -> String {
    // getrandom(2): one call on every `exec`'s path, where /dev/urandom took three and
    // gave an all-zero id when it could not be opened.
    let hex = crate::sys::fs_at::random_suffix();
    format!("{prefix}-{}", &hex[..12])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::Recorder;

    #[test]
    fn job_ids_are_the_prefix_and_12_random_hex_digits() {
        let (a, b) = (new_job_id("exec"), new_job_id("exec"));
        assert_ne!(a, b);
        let hex = a.strip_prefix("exec-").unwrap();
        assert!(hex.len() == 12 && hex.chars().all(|c| c.is_ascii_hexdigit()), "{a}");
    }

    fn home(t: &Path) -> Home {
        std::fs::create_dir_all(t.join("xdg")).unwrap();
        let home = Home::for_caller(t.join("home"), false, Some(t.join("xdg")));
        home.ensure().unwrap();
        home
    }

    #[test]
    fn a_disk_quota_is_claimed_on_the_layer_dir_before_upper_and_work_and_recorded() {
        let t = tempfile::tempdir().unwrap();
        let home = home(t.path());
        let plan = super::super::plan::test_plan("jd-1", vec![], "");
        let job = JobDir::new(&home, "jd-1");
        let mut state = JobState::for_plan(&job, &plan);
        let quota = DiskQuota {
            bytes: 1 << 30,
            inodes: Some(1000),
            lock: t.path().join("lock"),
            mechanism: Mechanism::Project,
        };
        let rec = Recorder::default();
        let _lock = job.create(&plan, &mut state, Some((&rec, &quota))).unwrap();
        assert_eq!(rec.calls(), [format!("claim_disk_quota {} {}", job.layers.display(), 1u64 << 30)]);
        let id = *crate::sys::quota::PROJECT_IDS.start();
        assert_eq!(state.project_id, Some(id));
        assert_eq!(job.read_state().unwrap().project_id, Some(id), "in the record, for the teardown and gc");
        assert!(job.upper().is_dir() && job.work().is_dir());
        // A refused claim: the job is not created, and nothing of it is left.
        let job = JobDir::new(&home, "jd-2");
        let mut state = JobState::for_plan(&job, &plan);
        let rec = Recorder::failing_at(0, nix::errno::Errno::EPERM);
        let e = job.create(&plan, &mut state, Some((&rec, &quota))).unwrap_err();
        assert!(e.to_string().starts_with("cannot set the disk quota of project"), "{e}");
        assert!(!job.layers.exists() && !job.root.exists() && !job.staging_record().exists());
    }

    #[test]
    fn a_btrfs_quota_makes_the_layer_dir_a_limited_subvolume_before_upper_and_work() {
        let t = tempfile::tempdir().unwrap();
        let home = home(t.path());
        let plan = super::super::plan::test_plan("jd-3", vec![], "");
        let job = JobDir::new(&home, "jd-3");
        let mut state = JobState::for_plan(&job, &plan);
        let quota =
            DiskQuota { bytes: 64 << 20, inodes: None, lock: t.path().join("lock"), mechanism: Mechanism::BtrfsQgroup };
        let rec = Recorder::default();
        let _lock = job.create(&plan, &mut state, Some((&rec, &quota))).unwrap();
        assert_eq!(rec.calls(), [format!("create_quota_subvolume {} {}", job.layers.display(), 64u64 << 20)]);
        assert_eq!((state.qgroup, state.project_id), (Some(256), None));
        assert_eq!(job.read_state().unwrap().qgroup, Some(256), "in the record, for status and gc");
        assert!(job.upper().is_dir() && job.work().is_dir(), "made inside the subvolume, after its limit");
        // A refused subvolume: no job, nothing left (the bucket stays, as always).
        let job = JobDir::new(&home, "jd-4");
        let mut state = JobState::for_plan(&job, &plan);
        let rec = Recorder::failing_at(0, nix::errno::Errno::EPERM);
        let e = job.create(&plan, &mut state, Some((&rec, &quota))).unwrap_err();
        assert!(e.to_string().starts_with("cannot create the btrfs subvolume"), "{e}");
        assert!(!job.layers.exists() && !job.root.exists() && !job.staging_record().exists());
    }
}
