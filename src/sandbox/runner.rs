//! Parent side of a sandbox: record it, run one or more phases (each a container started
//! by a fresh helper over the same upper dir), tear it down.
//!
//! Safe to call from a multi-threaded process (the manager): it only spawns the helper
//! (fork+exec with an async-signal-safe pre_exec) and never calls libcontainer itself.

use super::console::{Console, Relay};
use super::jobdir::{JobDir, JobLock, JobState};
use super::network::table_keeper;
use super::plan::JobPlan;
use super::report::{FailureKind, HelperResult, SandboxError};
use super::teardown::{self, Cleanup};
use crate::config::Home;
use crate::sys::{self, process::HelperPipes, Signal};
use anyhow::{bail, Context, Result};
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a job (or one phase of it) ended.
#[derive(Debug, Clone)]
pub struct JobOutcome {
    pub id: String,
    /// The command's exit code (128+n when killed by signal n).
    pub code: i32,
    pub signal: Option<i32>,
    pub duration: Duration,
    pub cleanup: Cleanup,
    /// The limits it ran with.
    pub limits: super::Limits,
    /// Its disk quota's usage when it ended (None: it had no quota).
    pub disk: Option<sys::quota::Usage>,
}

/// Options of one run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Delete the job dir in the background (the manager) instead of before returning (exec).
    pub background_delete: bool,
    /// Forward SIGINT/SIGTERM received by this process to the helper (exec in a terminal).
    pub forward_signals: bool,
    /// Published while a phase runs: the helper's pid (0 otherwise), so a supervisor can
    /// signal it (SIGTERM: forwarded to the job, SIGKILL after a grace period).
    pub helper_pid: Option<Arc<AtomicI32>>,
    /// Append the job's stdout and stderr to this file instead of inheriting ours.
    pub output: Option<std::path::PathBuf>,
    /// The job's network, when this run keeps the host's table for it through firewall
    /// reloads (`exec`, root mode, isolated: see `network::table_keeper`). `run` keeps it
    /// for all its slots instead.
    pub keep_table: Option<super::network::JobNetwork>,
}

/// What differs between the phases of one sandbox (e.g. configure, then run the agent).
#[derive(Debug, Clone, Default)]
pub struct Phase {
    pub args: Vec<String>,
    /// Added to the plan's environment (later wins).
    pub env: Vec<(String, String)>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub cwd: Option<std::path::PathBuf>,
    /// Written to the job's standard input, which is then closed. Secrets go this way:
    /// never argv (visible in /proc) and never a file.
    pub stdin: Option<Vec<u8>>,
}

/// The helper that stop signals to this process go to (exec in a terminal), 0 for none.
static FORWARD_PID: AtomicI32 = AtomicI32::new(0);
static BACKGROUND_CLEANUPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Checks what can be checked before anything is created, with one-line errors.
pub fn validate(plan: &JobPlan) -> Result<()> {
    for v in &plan.volumes {
        if !v.host.exists() {
            bail!(
                "volume source {} does not exist: fix --volume {}:{}",
                v.host.display(),
                v.host.display(),
                v.container.display()
            );
        }
    }
    for l in &plan.lower {
        if !l.is_dir() {
            let msg = format!("rootfs layer {} is missing: re-import the rootfs", l.display());
            return Err(SandboxError::new(FailureKind::RootfsMissing, msg).into());
        }
    }
    for m in plan.edits.mounts.iter().filter(|m| !m.optional) {
        if !m.host_path.exists() {
            bail!(
                "{} is missing on the host (needed at {} in the sandbox)",
                m.host_path.display(),
                m.container_path.display()
            );
        }
    }
    Ok(())
}

/// A job with ids of its own binds its volumes, device nodes and driver files as those
/// ids (libcontainer sets the mounts up as the job's root): every dir on the way to them
/// must be searchable by any id. Checked here for a one-line error.
fn validate_reachable(plan: &JobPlan) -> Result<()> {
    for v in &plan.volumes {
        super::check_reachable(&v.host)
            .with_context(|| format!("the job's ids cannot reach volume source {}", v.host.display()))?;
    }
    let nodes = plan.edits.device_nodes.iter().map(|n| &n.host_path);
    for p in nodes.chain(plan.edits.mounts.iter().map(|m| &m.host_path)) {
        super::check_reachable(p).with_context(|| format!("the job's ids cannot reach {}", p.display()))?;
    }
    Ok(())
}

/// A recorded job dir (upper layer kept across phases) with its lock.
pub struct Sandbox {
    home: Home,
    job: JobDir,
    plan: JobPlan,
    lock: Option<JobLock>,
    created: Instant,
    /// The last phase's helper, still deleting its container after reporting the result.
    pending: Option<(Helper, Option<Arc<AtomicI32>>)>,
    /// A phase whose container is already built, waiting for `run` to start it.
    prepared: Option<(Spawned, String)>,
    /// The block of host ids the job runs as (root mode), held until it is cleaned up.
    ids: Option<crate::identity::lease::BlockLease>,
    /// The project id of the layer dir's disk quota.
    project_id: Option<u32>,
    /// The qgroup of the layer dir's disk quota (a btrfs subvolume).
    qgroup: Option<u64>,
    /// A helper forked before the plan, for the first phase (see [`EarlyHelper`]).
    early: Option<EarlyHelper>,
    /// Whether a phase was started (see [`Sandbox::write_phase_plan`]).
    phase_started: bool,
}

impl Sandbox {
    pub fn create(home: &Home, mut plan: JobPlan) -> Result<Sandbox> {
        validate(&plan)?;
        plan.rootless = crate::rootless::mode().rootless;
        // Every job runs under the init (one stat once it is written).
        plan.process.init = Some(super::init::ensure(home)?);
        if plan.network == crate::config::Network::Isolated && !plan.rootless {
            // The host's table, made again if a firewall reload flushed it (one netlink
            // query when it exists): the helper makes no job link without it. With
            // the job's allowed destinations and proxy port, which went with the flushed
            // table (added once per table: see `firewall::ensure`).
            super::network::ensure_table(&mut plan.net, true, crate::config::Ipv6::Auto)?;
        }
        // Optional mounts whose source is missing are dropped here, never failing the job.
        plan.edits.mounts.retain(|m| !m.optional || m.host_path.exists());
        // The home's dirs exist: `exec` and `run` ensure them once at start, not per job.
        let job = JobDir::new(home, &plan.id);
        let ids = match crate::identity::for_sandbox(&job.root, plan.uid, plan.gid)? {
            Some((ids, lease)) => {
                plan.userns = Some(ids);
                lease
            }
            None => None,
        };
        if plan.userns.is_some() {
            validate_reachable(&plan)?;
        }
        let mut state = JobState::for_plan(&job, &plan);
        let quota = disk_quota(home, &plan);
        let lock = job.create(&plan, &mut state, quota.as_ref().map(|q| (&sys::Real as &dyn sys::Sys, q)))?;
        tracing::debug!(job = %plan.id, "job dir recorded");
        let sandbox = Sandbox {
            home: home.clone(),
            job,
            plan,
            lock: Some(lock),
            created: Instant::now(),
            pending: None,
            prepared: None,
            ids,
            project_id: state.project_id,
            qgroup: state.qgroup,
            early: None,
            phase_started: false,
        };
        // Recorded first, so gc removes it if we die from here on (dropped on an error).
        if let Some(s) = &sandbox.plan.scratch {
            let claimed = make_scratch(&sys::Real, &s.host, quota.as_ref())?;
            if claimed != (None, None) {
                (state.scratch_project_id, state.scratch_qgroup) = claimed;
                // The record names the claim for the teardown (gc after a crash removes
                // the dir either way: the record named it before it existed).
                std::fs::write(sandbox.job.state_file(), serde_json::to_vec_pretty(&state)?)
                    .with_context(|| format!("cannot write {}: disk full?", sandbox.job.state_file().display()))?;
            }
        }
        for c in &sandbox.plan.caches {
            crate::cache::store::count_hit(&c.store);
        }
        Ok(sandbox)
    }

    pub fn id(&self) -> &str {
        &self.plan.id
    }

    /// The helper of the first phase [`run`](Sandbox::run) without a terminal or stdin:
    /// one forked before the plan ([`EarlyHelper::fork`]), for this job's network mode.
    pub fn adopt_early_helper(&mut self, early: Option<EarlyHelper>) {
        self.early = early;
    }

    /// The job's lock and id lease: this runner's, never a helper's. A forked helper
    /// closes them, so that when this process dies the job is abandoned at once (`gc`
    /// then kills it from outside the rootless namespace, the only place where a job
    /// running as subordinate ids can be killed), not only once the helper is gone too.
    fn held_fds(&self) -> Vec<i32> {
        let lock = self.lock.as_ref().map(|l| l.as_raw_fd());
        lock.into_iter().chain(self.ids.as_ref().map(|l| l.as_raw_fd())).collect()
    }

    pub fn plan(&self) -> &JobPlan {
        &self.plan
    }

    /// Commits the caches numbered `which` (see [`crate::cache::commit`]) once the job's
    /// last helper is gone (its overlays with it), logging one line each: a failed or
    /// refused commit leaves the cache's current snapshot as it was. `why`: who decided.
    pub fn commit_caches(&mut self, which: &[usize], why: &str) {
        if which.is_empty() {
            return;
        }
        self.wait_pending();
        let ids = self.plan.userns.as_ref().filter(|i| i.idmap_layers);
        for &k in which {
            let Some(c) = self.plan.caches.get(k) else { continue };
            let upper = super::cachemount::upper(&self.job, k);
            let started = Instant::now();
            match crate::cache::commit::commit(&c.store, &upper, ids, &self.plan.id, c.max_size) {
                Ok(crate::cache::commit::Committed::Unchanged) => {
                    tracing::info!(job = %self.plan.id, "cache {}: nothing changed, nothing committed", c.name)
                }
                Ok(crate::cache::commit::Committed::Snapshot { n, size_bytes, entries }) => tracing::info!(
                    job = %self.plan.id,
                    "cache {}: committed snapshot {n} ({} entries changed, {} in all) in {:.3}s ({why})",
                    c.name,
                    entries,
                    super::limits::human_size(size_bytes),
                    started.elapsed().as_secs_f64()
                ),
                Err(e) => tracing::warn!(
                    job = %self.plan.id,
                    "cache {}: commit refused, the old snapshot stays: {e:#}",
                    c.name
                ),
            }
        }
    }

    /// The read-only layers this sandbox was created over.
    pub fn lower(&self) -> &[std::path::PathBuf] {
        &self.plan.lower
    }

    /// The job's writable layer on the host (what the job wrote, e.g. agent logs).
    pub fn upper(&self) -> std::path::PathBuf {
        self.job.upper()
    }

    /// Waits until the last phase's helper has exited: by then everything the phase printed
    /// is in its output file. (Not done after every phase: the helper deletes its container
    /// while the next phase already runs.)
    pub fn settle(&mut self) {
        self.wait_pending();
    }

    /// Moves the job's writable layers (`upper/`, `work/`) to `dest` (which must not exist,
    /// on the home's filesystem), so that the teardown leaves them: a failed job kept for
    /// inspection. Waits for the last helper first (its overlay holds the dirs).
    pub fn keep_layers(&mut self, dest: &std::path::Path) -> Result<()> {
        self.wait_pending();
        std::fs::rename(&self.job.layers, dest)
            .with_context(|| format!("cannot move {} to {}", self.job.layers.display(), dest.display()))
    }

    /// Writes the phase's plan for the next helper; returns the job id.
    fn write_phase_plan(&mut self, phase: &Phase) -> Result<JobPlan> {
        // Phases share the upper dir and the container id: one at a time.
        self.wait_pending();
        if phase.args.is_empty() && self.plan.args.is_empty() {
            bail!("no command given: use `azp-sandbox exec [OPTIONS] -- CMD [ARGS...]`");
        }
        let mut plan = self.plan.clone();
        if !phase.args.is_empty() {
            plan.args = phase.args.clone();
        }
        plan.env.extend(phase.env.iter().cloned());
        plan.uid = phase.uid.unwrap_or(plan.uid);
        plan.gid = phase.gid.unwrap_or(plan.gid);
        if let Some(cwd) = &phase.cwd {
            plan.cwd = cwd.clone();
        }
        let first = !std::mem::replace(&mut self.phase_started, true);
        let unchanged = phase.args.is_empty()
            && phase.env.is_empty()
            && (phase.uid, phase.gid) == (None, None)
            && phase.cwd.is_none();
        if first && unchanged {
            // The record's plan (see JobDir::create) is this one, and no result is there
            // yet: `exec`, one phase, writes its plan once.
            return Ok(plan);
        }
        std::fs::write(self.job.plan_file(), serde_json::to_vec(&plan)?)
            .context("cannot write job plan: disk full?")?;
        let _ = std::fs::remove_file(self.job.result_file());
        Ok(plan)
    }

    /// Builds the phase's container now (overlay, spec, namespaces, cgroup; the process
    /// waits before exec) so that a later [`Sandbox::run`] only has to start it: the
    /// agent runner prepares a slot's next job while the current one runs.
    pub fn prepare(&mut self, phase: &Phase, opts: &RunOptions) -> Result<()> {
        let plan = self.write_phase_plan(phase)?;
        let quiet = RunOptions { helper_pid: None, forward_signals: false, ..opts.clone() };
        let how = Spawn { prepared: true, terminal: false };
        let held = self.held_fds();
        let spawned = spawn_helper(&self.home, &self.job.root, phase.stdin.as_deref(), &quiet, how, &held)?;
        self.prepared = Some((spawned, plan.cgroup_path.display().to_string()));
        Ok(())
    }

    /// Runs one phase to completion: a container over this sandbox's layers. If the
    /// sandbox was [prepared](Sandbox::prepare), that phase is started and `phase` is
    /// not looked at.
    pub fn run(&mut self, phase: &Phase, opts: &RunOptions) -> Result<JobOutcome> {
        let (spawned, plan, console) = match self.prepared.take() {
            Some((mut s, _)) => {
                s.go();
                let mut plan = self.plan.clone();
                plan.args = phase.args.clone();
                (s, plan, None)
            }
            None => {
                let plan = self.write_phase_plan(phase)?;
                // Listening before the helper exists: its container connects during create.
                let console = plan.process.terminal.then(|| Console::listen(&self.job)).transpose()?;
                let how = Spawn { prepared: false, terminal: console.is_some() };
                let held = self.held_fds();
                // (One that cannot be used here is reaped when dropped.)
                let early = self.early.take().filter(|_| !how.terminal && phase.stdin.is_none());
                let spawned = match early {
                    Some(early) => early.hand_over(&self.job.root, &plan),
                    None => spawn_helper(&self.home, &self.job.root, phase.stdin.as_deref(), opts, how, &held)?,
                };
                (spawned, plan, console)
            }
        };
        let started = Instant::now();
        // A job with a terminal is relayed until it ends: it keeps the host's table (when
        // this run keeps it) from its start, not from its first second on (see
        // `await_result`), which only begins once the relay is over.
        let _table = console.as_ref().and(opts.keep_table.as_ref()).and_then(|n| table_keeper::keep(n.clone()));
        let keep_later = opts.keep_table.as_ref().filter(|_| console.is_none());
        if let Some(console) = console {
            watch_helper(spawned.child.pid, opts);
            if let Err(e) = relay_terminal(console, &spawned) {
                // Nobody reads the job's terminal now: stop the job rather than leave it
                // blocked on a full one.
                tracing::warn!(job = %plan.id, "cannot relay the job's terminal ({e:#}): stopping the job");
                let _ = sys::process::kill(spawned.child.pid, Signal::SIGTERM);
            }
        }
        let (mut child, report) = await_result(spawned, opts, keep_later);
        let result = match report {
            Some(r) => {
                // The job is over; the helper is still deleting its container.
                self.pending = Some((child, opts.helper_pid.clone()));
                Ok(r)
            }
            None => {
                let helper_pid = child.child.pid;
                let status = child.wait().context("lost the sandbox helper");
                unpublish_pid(opts.helper_pid.as_ref(), helper_pid);
                tracing::debug!(job = %plan.id, "helper exited without a result");
                if status.as_ref().map(|s| s.signal().is_some()).unwrap_or(true) {
                    // The helper died: its container may live on. Kill it first.
                    let _ = teardown::remove_cgroup(&plan.cgroup_path);
                }
                read_result(&self.job, &status)
            }
        };
        let duration = started.elapsed();
        match result? {
            HelperResult::Exited { code, signal } => Ok(JobOutcome {
                id: plan.id,
                code,
                signal,
                duration,
                cleanup: Cleanup::default(),
                limits: plan.limits,
                disk: self.disk_usage(),
            }),
            HelperResult::Failed { kind, error } => Err(SandboxError { kind, message: error }.into()),
        }
    }

    /// What the job's layer has used of its disk quota (None: no quota, or unreadable).
    pub fn disk_usage(&self) -> Option<sys::quota::Usage> {
        match (self.project_id, self.qgroup) {
            (Some(id), _) => sys::quota::usage(&self.job.layers, id).ok(),
            (None, Some(q)) => sys::btrfs::usage(&self.job.layers, q).ok(),
            (None, None) => None,
        }
    }

    /// A prepared container that will not be started: closing the go pipe makes its
    /// helper delete it and exit.
    fn cancel_prepared(&mut self) {
        if let Some((mut s, _)) = self.prepared.take() {
            drop(s.go_tx.take());
            let (mut helper, _) = await_result(s, &RunOptions::default(), None);
            let _ = helper.wait();
        }
    }

    /// Waits for the last helper to finish deleting its container.
    fn wait_pending(&mut self) {
        if let Some((mut child, pid)) = self.pending.take() {
            let helper_pid = child.child.pid;
            let _ = child.wait();
            unpublish_pid(pid.as_ref(), helper_pid);
        }
    }

    /// Removes everything; the lock goes last so gc never races us. With `background`,
    /// the whole clean-up (waiting for the helper's container deletion, removing the dirs)
    /// runs in a thread and this returns at once: the slot's next job does not wait.
    pub fn teardown(self, background: bool) -> Result<Cleanup> {
        self.teardown_after(background, |_| {})
    }

    /// [`Sandbox::teardown`] that first calls `first` with this sandbox, in the thread
    /// that cleans up: a copy of what the job left (its logs, from [`Sandbox::upper`]) or
    /// a commit of its caches ([`Sandbox::commit_caches`]) costs the caller, a slot about
    /// to start its next agent, nothing. The job's processes are gone by then.
    pub fn teardown_after(
        mut self,
        background: bool,
        first: impl FnOnce(&mut Sandbox) + Send + 'static,
    ) -> Result<Cleanup> {
        // Backpressure: at most MAX_BACKGROUND clean-ups at once, so jobs that each wrote
        // gigabytes cannot outrun their deletion and fill the disk.
        const MAX_BACKGROUND: usize = 2;
        if background && BACKGROUND_CLEANUPS.fetch_add(1, Ordering::SeqCst) < MAX_BACKGROUND {
            let mut sb = Sandbox {
                home: self.home.clone(),
                job: self.job.clone(),
                plan: self.plan.clone(),
                lock: self.lock.take(),
                created: self.created,
                pending: self.pending.take(),
                prepared: self.prepared.take(),
                ids: self.ids.take(),
                project_id: self.project_id,
                qgroup: self.qgroup,
                early: self.early.take(),
                phase_started: self.phase_started,
            };
            // A deep stack: `first` may commit caches, whose walk takes a frame per level
            // of a job's tree (up to PATH_MAX's ~2000): 2030 levels overflowed 1 MiB, and
            // std's 2 MiB was the margin (found by a red-team pass); an abort here would
            // take `run`'s manager and every slot down.
            const CLEANUP_STACK: usize = 16 << 20;
            let spawned = std::thread::Builder::new().name("clean-up".into()).stack_size(CLEANUP_STACK);
            spawned.spawn(move || {
                sys::process::lower_priority_of_this_thread();
                first(&mut sb);
                if let Err(e) = sb.finish() {
                    tracing::warn!("clean-up failed ({e:#}); `azp-sandbox gc` will retry");
                }
                BACKGROUND_CLEANUPS.fetch_sub(1, Ordering::SeqCst);
            })?;
            return Ok(Cleanup { background: true, ..Default::default() });
        }
        if background {
            BACKGROUND_CLEANUPS.fetch_sub(1, Ordering::SeqCst);
        }
        first(&mut self);
        self.finish()
    }

    fn finish(mut self) -> Result<Cleanup> {
        self.cancel_prepared();
        let cleanup = if self.pending.is_some() {
            // The job is over (its result came after its init, and with it the whole pid
            // namespace, was reaped); its helper may still be deleting its container.
            // Its layers go to the trash at once and a thread deletes them there: on a
            // disk where each freed dir block waits for a discard, that overlaps all the
            // rest, the helper's exit included. A helper done with the job exits while
            // the job's cgroup and record go here; otherwise it is reaped first.
            let trashed = teardown::trash_layers(&self.home, &self.job, self.project_id);
            std::thread::scope(|s| {
                let deleting = match trashed {
                    Ok(trash) => trash.map(|t| s.spawn(move || teardown::delete_trashed(&t))),
                    Err(e) => {
                        tracing::debug!(job = %self.plan.id, "layers not moved to the trash ({e:#}); the clean-up retries");
                        None
                    }
                };
                if !self.pending.as_mut().is_some_and(|(helper, _)| helper.done()) {
                    self.wait_pending();
                }
                let cleanup = teardown::stop_job(&self.home, &self.job).and_then(|s| s.finish(&self.home, &self.job));
                self.wait_pending();
                let deleted = deleting.map(|d| d.join().unwrap_or_else(|_| Err(anyhow::anyhow!("panicked"))));
                if let Some(Err(e)) = deleted {
                    tracing::debug!(job = %self.plan.id, "layer removal failed ({e:#}); gc removes the trash");
                }
                cleanup
            })
        } else {
            self.wait_pending();
            teardown::stop_job(&self.home, &self.job).and_then(|s| s.finish(&self.home, &self.job))
        };
        drop(self.lock.take());
        // Its processes are gone and its record with them: the ids are free.
        drop(self.ids.take());
        tracing::debug!(job = %self.plan.id, age_ms = self.created.elapsed().as_millis() as u64, "cleaned up");
        if let Ok(c) = &cleanup {
            if !c.leftovers.is_empty() {
                tracing::warn!(job = %self.plan.id, "clean-up found leftovers: {c}");
            }
        }
        cleanup
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        self.cancel_prepared();
        self.wait_pending();
        if self.lock.is_some() {
            // Not torn down explicitly (an error path): do it now rather than leave it to gc.
            if let Err(e) = teardown::cleanup_job(&self.home, &self.job) {
                tracing::warn!(job = %self.plan.id, "clean-up failed ({e:#}); `azp-sandbox gc` will retry");
            }
        }
    }
}

/// The disk quota a job's layer dir gets: its limits (see [`super::limits`], which set
/// them only where project quotas work), and the host-wide lock under which project ids
/// are taken (beside the homes' runtime dirs: `/run/azp-sandbox` as root).
fn disk_quota(home: &Home, plan: &JobPlan) -> Option<sys::DiskQuota> {
    let bytes = plan.limits.disk_bytes.filter(|_| !plan.rootless)?;
    let lock = home.run_root().with_file_name(".project-ids.lock");
    let mechanism = plan.limits.disk_mechanism.unwrap_or_default();
    Some(sys::DiskQuota { bytes, inodes: plan.limits.disk_inodes, lock, mechanism })
}

/// Waits (at most `max`) for the clean-ups [`Sandbox::teardown`] left running in the
/// background; false when some are still running. `run` calls it before it exits, so
/// that what they do (the jobs' log copies, the layers' removal) is not cut short.
pub fn wait_for_background_cleanups(max: Duration) -> bool {
    let end = Instant::now() + max;
    while BACKGROUND_CLEANUPS.load(Ordering::SeqCst) > 0 {
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// The job's scratch dir, empty and ours (0700): whatever a crashed run left under its
/// name goes first. Its parent must exist. With a disk quota, the dir gets the job's
/// limit too, as its own filesystem can give it (a btrfs subvolume with a qgroup limit,
/// or a project id of its own; none where the filesystem can do neither: `run` said so
/// at start). Returns the project id or qgroup claimed.
pub(crate) fn make_scratch(
    sys: &dyn sys::Sys,
    dir: &std::path::Path,
    quota: Option<&sys::DiskQuota>,
) -> Result<(Option<u32>, Option<u64>)> {
    use std::os::unix::fs::DirBuilderExt;
    sys::fs_at::remove_tree(dir).with_context(|| format!("cannot empty the job's work dir {}", dir.display()))?;
    let parent = dir.parent().unwrap_or(std::path::Path::new("/"));
    let mechanism = quota.and_then(|_| super::limits::node::quota_mechanism(sys, parent).ok());
    if let (Some(q), Some(sys::Mechanism::BtrfsQgroup)) = (quota, mechanism) {
        let id = sys.create_quota_subvolume(dir, q.bytes)?;
        return Ok((None, Some(id)));
    }
    std::fs::DirBuilder::new().mode(0o700).create(dir).with_context(|| {
        format!("cannot create the job's work dir {}: check that its parent exists and has free space", dir.display())
    })?;
    if let (Some(q), Some(sys::Mechanism::Project)) = (quota, mechanism) {
        let id = sys.claim_disk_quota(dir, q)?;
        return Ok((Some(id), None));
    }
    Ok((None, None))
}

/// Runs one command to completion in a fresh sandbox and removes everything it left;
/// `early`: its helper, forked before the plan (see [`EarlyHelper`]).
pub fn run_job(home: &Home, plan: JobPlan, opts: &RunOptions, early: Option<EarlyHelper>) -> Result<JobOutcome> {
    if plan.args.is_empty() {
        bail!("no command given: use `azp-sandbox exec [OPTIONS] -- CMD [ARGS...]`");
    }
    let mut sandbox = Sandbox::create(home, plan)?;
    sandbox.adopt_early_helper(early);
    let outcome = sandbox.run(&Phase::default(), opts);
    let cleanup = sandbox.teardown(opts.background_delete)?;
    outcome.map(|o| JobOutcome { cleanup, ..o })
}

/// Clears the published pid, but only if it is still `pid`: a background teardown
/// finishing the previous job must not hide the helper of the job that runs now (a
/// supervisor would then never signal it).
fn unpublish_pid(slot: Option<&Arc<AtomicI32>>, pid: i32) {
    if let Some(p) = slot {
        let _ = p.compare_exchange(pid, 0, Ordering::SeqCst, Ordering::SeqCst);
    }
}

fn publish_pid(opts: &RunOptions, pid: i32) {
    if let Some(p) = &opts.helper_pid {
        p.store(pid, Ordering::SeqCst);
    }
}

/// A started helper: the result pipe to wait on, and (when prepared) the pipe that
/// tells it to start the container.
pub(crate) struct Spawned {
    child: HelperProcess,
    result_rx: OwnedFd,
    go_tx: Option<OwnedFd>,
    copiers: Vec<std::thread::JoinHandle<()>>,
}

impl Spawned {
    fn go(&mut self) {
        if let Some(tx) = self.go_tx.take() {
            let _ = std::io::Write::write_all(&mut std::fs::File::from(tx), b"g");
        }
    }
}

/// How a helper is started.
#[derive(Debug, Clone, Copy)]
struct Spawn {
    /// It builds the container, then waits for a byte on its go pipe before starting it
    /// (EOF there cancels).
    prepared: bool,
    /// The job has a terminal of its own (relayed by the runner): our stdio is not its.
    terminal: bool,
}

/// The helper's fds as the runner hands them over (the helper's ends of its pipes).
struct HelperFds {
    result_tx: OwnedFd,
    go_rx: Option<OwnedFd>,
    /// None: inherit ours.
    stdin: Option<OwnedFd>,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
}

/// Starts the helper, as `how` says.
///
/// A single-threaded runner (`exec`) forks the helper, which runs at once; a
/// multi-threaded one (the agent manager) must re-execute this binary, because a forked
/// child of a threaded process can inherit locks held by other threads and libcontainer
/// deadlocks there (measured). The fork saves the helper's exec and start-up, about a
/// tenth of an `exec` cycle.
fn spawn_helper(
    home: &Home,
    job_dir: &std::path::Path,
    stdin: Option<&[u8]>,
    opts: &RunOptions,
    how: Spawn,
    held: &[i32],
) -> Result<Spawned> {
    let prepared = how.prepared;
    let (result_rx, result_tx) = pipe()?;
    let (go_rx, go_tx) = if prepared {
        let (r, w) = pipe()?;
        (Some(r), Some(w))
    } else {
        (None, None)
    };
    let (stdin_rx, stdin_tx) = match stdin {
        Some(_) => {
            let (r, w) = pipe()?;
            (Some(r), Some(w))
        }
        None => (None, None),
    };
    // A job with a terminal writes to it, not to our stdio.
    let output = if how.terminal { OutputPlan::default() } else { output_plan(opts)? };
    let fds = HelperFds { result_tx, go_rx, stdin: stdin_rx, stdout: output.stdout, stderr: output.stderr };
    // Nothing of ours may leak into a forked helper: close our ends of the pipes there.
    let ours: Vec<i32> = [Some(&result_rx), go_tx.as_ref(), stdin_tx.as_ref()]
        .into_iter()
        .flatten()
        .chain(output.copy.iter().map(|(r, _)| r))
        .map(|fd| fd.as_raw_fd())
        .chain(held.iter().copied())
        .collect();
    let child = match fork_helper(home, job_dir, fds, &ours)? {
        Ok(forked) => forked,
        Err(fds) => exec_helper(home, job_dir, fds, prepared)?,
    };
    // Only now: a forked helper must be forked while this process has one thread.
    let copiers = output.copy.into_iter().map(|(r, f)| copier(r, f)).collect();
    if let (Some(bytes), Some(tx)) = (stdin, stdin_tx) {
        // A job that does not read its stdin must not block us: ignore EPIPE.
        let _ = std::fs::File::from(tx).write_all(bytes);
    }
    Ok(Spawned { child, result_rx, go_tx, copiers })
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    Ok(nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(sys::Error::Pipe)?)
}

/// Re-executes this binary as `__sandbox-helper JOB_DIR`, the pipes as fds 3 and 4.
fn exec_helper(home: &Home, job_dir: &std::path::Path, fds: HelperFds, prepared: bool) -> Result<HelperProcess> {
    let pipes =
        HelperPipes { result: fds.result_tx.as_raw_fd(), go: fds.go_rx.as_ref().map(|f| f.as_raw_fd()).unwrap_or(-1) };
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg("--home").arg(home.root());
    if tracing::enabled!(tracing::Level::DEBUG) {
        cmd.arg("-v");
    }
    cmd.arg("__sandbox-helper").arg(job_dir);
    cmd.env(super::helper::RESULT_FD_ENV, "3");
    if prepared {
        cmd.env(super::helper::GO_FD_ENV, "4");
    }
    let stdio = |fd: Option<OwnedFd>| fd.map(Stdio::from).unwrap_or_else(Stdio::inherit);
    cmd.stdin(stdio(fds.stdin)).stdout(stdio(fds.stdout)).stderr(stdio(fds.stderr));
    let child = sys::process::spawn_helper_command(&mut cmd, pipes)?;
    // Our copies of the helper's pipe ends go with `fds` and `cmd`: the readers see EOF
    // only once they are closed.
    Ok(HelperProcess { pid: child.id() as i32 })
}

/// Forks the helper when this process is single-threaded (else the fds come back, for
/// [`exec_helper`]): the child sets up its fds as a re-executed helper would and runs it
/// to the end, never returning here.
fn fork_helper(
    home: &Home,
    job_dir: &std::path::Path,
    fds: HelperFds,
    ours: &[i32],
) -> Result<std::result::Result<HelperProcess, HelperFds>> {
    let parent = std::process::id() as i32;
    // Read here, once, for the helper (it inherits the result) and our own teardown.
    crate::rootless::cgroups::CgroupHost::get();
    let forked =
        sys::process::run_forked("the sandbox helper", fds, |fds| forked_helper(home, job_dir, fds, ours, parent))?;
    Ok(forked.map(|pid| HelperProcess { pid: pid.as_raw() }))
}

fn forked_helper(home: &Home, job_dir: &std::path::Path, fds: HelperFds, ours: &[i32], parent: i32) -> i32 {
    match become_helper(fds, ours, parent) {
        Ok((result, go)) => {
            super::helper::run_helper(home, job_dir, super::helper::Pipes { result, go, job: None, netns: None })
        }
        Err(code) => code,
    }
}

/// In a forked helper: its name, our fds closed (`ours`, the runner's ends of the pipes),
/// its stdio in place, tied to the runner (`parent`). Its result and go pipes, or the code
/// to exit with.
fn become_helper(
    fds: HelperFds,
    ours: &[i32],
    parent: i32,
) -> std::result::Result<(Option<OwnedFd>, Option<OwnedFd>), i32> {
    // Its command line is the runner's: the name tells them apart in `ps -o comm`/top.
    sys::process::set_name(c"azp-sbx-helper");
    // The child's copies of the runner's pipe ends: nothing in the child uses them.
    sys::process::close_all(ours);
    let failed = |what: &str, e: std::io::Error| {
        // The runner reports "helper exited without a result"; this line says why.
        eprintln!("azp-sandbox: error: the sandbox helper cannot {what}: {e}");
        125
    };
    let HelperFds { result_tx, go_rx, stdin, stdout, stderr } = fds;
    for (fd, to) in [(stdin, 0), (stdout, 1), (stderr, 2)] {
        if let Some(fd) = fd {
            if let Err(e) = sys::process::dup_onto(&fd, to) {
                return Err(failed("set up its standard fds (dup2)", e));
            }
        }
    }
    if let Err(e) = sys::process::child_setup(HelperPipes { result: -1, go: -1 }) {
        return Err(failed("tie itself to the runner (PDEATHSIG) or clear its signal mask", e));
    }
    if nix::unistd::getppid().as_raw() != parent {
        // The runner died before PDEATHSIG was set: nobody would wait for us.
        return Err(125);
    }
    Ok((Some(result_tx), go_rx))
}

/// A helper forked before its job is planned (`exec` without a terminal or stdin): its
/// [first steps](super::helper::FirstSteps), the same for every job (a private mount
/// namespace; a `none` job's network namespace, the kernel's ~0.6 ms), overlap the
/// runner's plan instead of following it; then it waits for its job dir on a socket
/// ([`EarlyHelper::hand_over`]). Dropped unused (the plan failed), it is told so by EOF
/// and reaped.
pub struct EarlyHelper {
    child: Option<HelperProcess>,
    result_rx: Option<OwnedFd>,
    job_tx: Option<std::os::unix::net::UnixStream>,
    /// The job's output pipes to copy into files (see [`output_plan`]), once handed over.
    copy: Vec<(OwnedFd, std::fs::File)>,
}

impl EarlyHelper {
    /// Forks it, for a job of `network` run with `opts` (its stdout and stderr are set
    /// now); `netns`: for a `none` job, the helper's end of the socket of the namespace
    /// this runner started (see `sys::net::loopback_maker`). None when this process has
    /// threads (see [`spawn_helper`]): the job gets its helper after the plan then.
    pub fn fork(
        home: &Home,
        network: crate::config::Network,
        opts: &RunOptions,
        netns: Option<OwnedFd>,
    ) -> Result<Option<EarlyHelper>> {
        let (result_rx, result_tx) = pipe()?;
        // A socket, not a pipe: sent with MSG_NOSIGNAL, a helper gone meanwhile is an
        // error here instead of SIGPIPE (the default in this binary) killing the runner.
        let (job_tx, job_rx) = std::os::unix::net::UnixStream::pair().context("cannot make a socket pair")?;
        let output = output_plan(opts)?;
        let ours: Vec<i32> = [result_rx.as_raw_fd(), job_tx.as_raw_fd()]
            .into_iter()
            .chain(output.copy.iter().map(|(r, _)| r.as_raw_fd()))
            .collect();
        let fds = HelperFds { result_tx, go_rx: None, stdin: None, stdout: output.stdout, stderr: output.stderr };
        let parent = std::process::id() as i32;
        // Read here, once, for the helper (it inherits the result) and our own teardown.
        crate::rootless::cgroups::CgroupHost::get();
        // The socket ends go with the child: the parent's copies close when this returns.
        let forked = sys::process::run_forked(
            "the sandbox helper",
            (fds, OwnedFd::from(job_rx), netns),
            |(fds, job, netns)| match become_helper(fds, &ours, parent) {
                Ok((result, _)) => {
                    let pipes = super::helper::Pipes { result, go: None, job: Some(job), netns };
                    super::helper::run_early_helper(home, network, pipes)
                }
                Err(code) => code,
            },
        )?;
        Ok(forked.ok().map(|pid| EarlyHelper {
            child: Some(HelperProcess { pid: pid.as_raw() }),
            result_rx: Some(result_rx),
            job_tx: Some(job_tx),
            copy: output.copy,
        }))
    }

    /// Tells it its job dir (written, with `plan`, by now): from here on it is the job's
    /// helper, as [`spawn_helper`] would have started it. Then, while it mounts the job's
    /// tree, makes the job's cgroup dirs and writes their limits, which it would do next
    /// (~0.4 ms on a cgroup v1 host), and tells it so: it only moves in. EOF without that
    /// word leaves all of it to the helper.
    fn hand_over(mut self, job_dir: &std::path::Path, plan: &JobPlan) -> Spawned {
        use std::os::unix::ffi::OsStrExt;
        if let Some(tx) = self.job_tx.take() {
            let mut path = job_dir.as_os_str().as_bytes().to_vec();
            path.push(super::helper::END_OF_PATH);
            if send_all(&tx, &path) && prepare_job_cgroup(plan, crate::rootless::cgroups::CgroupHost::get()) {
                send_all(&tx, super::helper::CGROUP_PREPARED);
            }
        }
        let copiers = std::mem::take(&mut self.copy).into_iter().map(|(r, f)| copier(r, f)).collect();
        let (child, result_rx) = (self.child.take(), self.result_rx.take());
        Spawned {
            child: child.expect("an early helper"),
            result_rx: result_rx.expect("its result pipe"),
            go_tx: None,
            copiers,
        }
    }
}

/// Sends all of `bytes`; false when the peer is gone (a helper that died: its missing
/// result says so), without the SIGPIPE that would kill this process.
fn send_all(tx: &std::os::unix::net::UnixStream, mut bytes: &[u8]) -> bool {
    while !bytes.is_empty() {
        match nix::sys::socket::send(tx.as_raw_fd(), bytes, nix::sys::socket::MsgFlags::MSG_NOSIGNAL) {
            Ok(n) => bytes = &bytes[n..],
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return false,
        }
    }
    true
}

/// Makes the cgroup dirs of a root job and writes their limits (see
/// [`super::helper::root_join`]), for its helper to move into. False where the helper
/// has nothing of the kind to do, or it failed here: the helper then does it all, and
/// reports the failure as its own if it fails again.
fn prepare_job_cgroup(plan: &JobPlan, host: &crate::rootless::cgroups::CgroupHost) -> bool {
    let join = match super::helper::root_join(plan, host) {
        Ok(Some(join)) => join,
        Ok(None) => return false,
        Err(e) => {
            tracing::debug!(job = %plan.id, "the job's cgroup is left to its helper: {e:#}");
            return false;
        }
    };
    match sys::Sys::prepare_cgroup(&sys::Real, &join) {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!(job = %plan.id, "the job's cgroup is left to its helper: {e}");
            false
        }
    }
}

impl Drop for EarlyHelper {
    /// Not handed over: EOF on its socket ends it (quietly), and it is reaped here. Its
    /// output pipes close first: nothing copies them yet, and a helper blocked on a full
    /// one would never exit.
    fn drop(&mut self) {
        self.copy.clear();
        drop(self.job_tx.take());
        drop(self.result_rx.take());
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
    }
}

/// Waits for the helper's result (sent when the job exits, before the container is
/// deleted), keeping the host's table for a job of `keep_table` that runs longer than a
/// second (see `network::table_keeper`). Returns the still-running helper, holding the
/// rest of its result pipe (see [`Helper::done`]), and the result, or None when the
/// helper ended without one.
fn await_result(
    s: Spawned,
    opts: &RunOptions,
    keep_table: Option<&super::network::JobNetwork>,
) -> (Helper, Option<HelperResult>) {
    let Spawned { child, result_rx, go_tx, copiers } = s;
    drop(go_tx);
    watch_helper(child.pid, opts);
    // A long `exec` job keeps the host's table through firewall reloads from its first
    // second on (until its result is in).
    let _table = keep_table.and_then(|n| table_keeper::keep_unless_done(result_rx.as_fd(), n));
    // The result ends with END_OF_RESULT, or at EOF when the helper died (it is the last
    // holder of the write end once the job has exec'd).
    let mut pipe = std::fs::File::from(result_rx);
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    while !bytes.contains(&super::helper::END_OF_RESULT) {
        match std::io::Read::read(&mut pipe, &mut chunk) {
            Ok(0) => break,
            Ok(n) => bytes.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    if opts.forward_signals {
        FORWARD_PID.store(0, Ordering::SeqCst);
    }
    let end = bytes.iter().position(|b| *b == super::helper::END_OF_RESULT).unwrap_or(bytes.len());
    let report = serde_json::from_slice::<HelperResult>(&bytes[..end]).ok();
    let after = bytes.get(end + 1..).unwrap_or_default().to_vec();
    (Helper { child, copiers, result: Some((pipe, after)) }, report)
}

/// From now on the helper `pid` is the one a supervisor signals (published) and, for
/// `exec`, the one our own stop signals go to.
fn watch_helper(pid: i32, opts: &RunOptions) {
    publish_pid(opts, pid);
    if opts.forward_signals {
        FORWARD_PID.store(pid, Ordering::SeqCst);
        sys::signals::forward_on(&[Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP, Signal::SIGQUIT], &FORWARD_PID);
    }
}

/// A job with a terminal: its pty master, relayed to our own terminal until the job's
/// side is closed (see [`super::console`]). When the helper ends without a terminal (it
/// failed before the job existed), nothing to relay: its result says why.
fn relay_terminal(console: Console, spawned: &Spawned) -> Result<()> {
    let Some(master) = console.accept(spawned.result_rx.as_fd())? else { return Ok(()) };
    let (input, output) = (std::io::stdin(), std::io::stdout());
    Relay { master, input: input.as_fd(), output: output.as_fd() }.run()
}

/// A helper process of ours (forked or re-executed), reaped by [`HelperProcess::wait`].
pub(crate) struct HelperProcess {
    pid: i32,
}

impl HelperProcess {
    fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        sys::process::wait_exit_status(self.pid)
    }
}

/// A running helper and the threads copying its job's output.
pub(crate) struct Helper {
    child: HelperProcess,
    copiers: Vec<std::thread::JoinHandle<()>>,
    /// Its result pipe after the result, and what was read of it past the result.
    result: Option<(std::fs::File, Vec<u8>)>,
}

impl Helper {
    /// Whether the helper says it is done with the job ([`super::helper::DONE`], then
    /// EOF): its container deleted, itself out of the job's cgroups. The job can then be
    /// torn down while the helper exits; it is reaped ([`Helper::wait`]) after that.
    fn done(&mut self) -> bool {
        let Some((mut pipe, mut rest)) = self.result.take() else { return false };
        let _ = std::io::Read::read_to_end(&mut pipe, &mut rest);
        rest == super::helper::DONE
    }

    fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        let st = self.child.wait();
        // The job's processes are gone with the helper: the copiers see EOF now.
        for c in self.copiers.drain(..) {
            let _ = c.join();
        }
        st
    }
}

/// Where the job's stdout and stderr go (None: inherit ours), and the pipes to copy into
/// files once the helper runs.
#[derive(Default)]
struct OutputPlan {
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    copy: Vec<(OwnedFd, std::fs::File)>,
}

/// Where the job's stdout and stderr go. Never straight into a regular file: the job
/// could reopen it through /proc/self/fd/1 and read (or, as root, truncate) everything
/// in it, e.g. earlier jobs' output in the slot's log. A pipe instead, copied into the
/// file by a thread (as container shims do). Terminals and pipes are passed through.
///
/// Stdout and stderr into the same file (`> f 2>&1`, `>> f 2>&1`) share one pipe and one
/// copier: the job's lines stay in the order it wrote them, and no two writers race for
/// the file's offset.
fn output_plan(opts: &RunOptions) -> Result<OutputPlan> {
    if let Some(path) = &opts.output {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot open the job log {}", path.display()))?;
        let (r, w) = pipe()?;
        let w2 = w.try_clone()?;
        return Ok(OutputPlan { stdout: Some(w), stderr: Some(w2), copy: vec![(r, file)] });
    }
    let regular = |fd: i32| {
        nix::sys::stat::fstat(fd)
            .ok()
            .filter(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG)
            .map(|st| (st.st_dev, st.st_ino))
    };
    let (out, err) = (regular(1), regular(2));
    let mut plan = OutputPlan::default();
    if let Some(file) = out {
        // A dup (F_DUPFD_CLOEXEC, at 3 or above) that the copier thread owns.
        let dup = std::io::stdout().as_fd().try_clone_to_owned().context("cannot dup stdout")?;
        let (r, w) = pipe()?;
        if err == Some(file) {
            plan.stderr = Some(w.try_clone()?);
        }
        plan.stdout = Some(w);
        plan.copy.push((r, std::fs::File::from(dup)));
    }
    if err.is_some() && err != out {
        let dup = std::io::stderr().as_fd().try_clone_to_owned().context("cannot dup stderr")?;
        let (r, w) = pipe()?;
        plan.stderr = Some(w);
        plan.copy.push((r, std::fs::File::from(dup)));
    }
    Ok(plan)
}

/// Copies the job's output pipe into the file, with read and write: `std::io::copy`
/// would splice, and splice(2) without an offset takes the file's position when it starts
/// waiting for data and writes there whenever the data comes, over what another writer
/// put there meanwhile (issue 21: `exec ... > f 2>&1` lost lines).
fn copier(from: OwnedFd, mut to: std::fs::File) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut from = std::fs::File::from(from);
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match std::io::Read::read(&mut from, &mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        // Keep draining: the job must not block on a full pipe.
                        let _ = std::io::copy(&mut from, &mut std::io::sink());
                        return;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    })
}

fn read_result(job: &JobDir, status: &Result<std::process::ExitStatus>) -> Result<HelperResult> {
    let path = job.result_file();
    match std::fs::read(&path) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes).with_context(|| format!("corrupt helper result {}", path.display()))
        }
        Err(_) => match status {
            Ok(s) if s.signal().is_some() => bail!("sandbox helper was killed by signal {}", s.signal().unwrap_or(0)),
            Ok(s) => bail!("sandbox helper exited with {s} without reporting; run with -vv for details"),
            Err(e) => bail!("{e:#}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::{Mechanism, Recorder};

    #[test]
    fn a_work_dir_gets_the_jobs_limit_as_its_own_filesystem_can() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("job-1");
        let quota =
            sys::DiskQuota { bytes: 1 << 30, inodes: None, lock: t.path().join("lock"), mechanism: Mechanism::Project };
        let d = dir.display();
        // No limit asked (or none on the layers): a plain private dir, nothing probed.
        let r = Recorder::default();
        assert_eq!(make_scratch(&r, &dir, None).unwrap(), (None, None));
        assert!(dir.is_dir() && r.calls().is_empty());
        // Project quotas on its filesystem: a project id of its own, after the mkdir.
        let r = Recorder::default();
        let id = *sys::quota::PROJECT_IDS.start();
        assert_eq!(make_scratch(&r, &dir, Some(&quota)).unwrap(), (Some(id), None), "what was there goes first");
        let parent = t.path().display();
        assert_eq!(
            r.calls(),
            [format!("probe_project_quota {parent}"), format!("claim_disk_quota {d} {}", 1u64 << 30)]
        );
        // btrfs with quotas (whatever the layers' mechanism): a limited subvolume.
        std::fs::remove_dir(&dir).unwrap();
        let r = Recorder::failing_at(0, nix::errno::Errno::ESRCH);
        assert_eq!(make_scratch(&r, &dir, Some(&quota)).unwrap(), (None, Some(256)));
        assert_eq!(
            r.calls(),
            [
                format!("probe_project_quota {parent}"),
                format!("probe_btrfs_quota {parent}"),
                format!("create_quota_subvolume {d} {}", 1u64 << 30)
            ]
        );
    }

    /// An early helper as [`EarlyHelper::fork`] leaves it, with `sh -c script` in the
    /// helper's place, the job socket its stdin and `out` its stdout. (Reaped through its
    /// pid, as a helper is.)
    #[allow(clippy::zombie_processes)]
    fn early_helper_running(script: &str, out: Stdio) -> EarlyHelper {
        let (job_tx, job_rx) = std::os::unix::net::UnixStream::pair().unwrap();
        let (result_rx, _result_tx) = pipe().unwrap();
        let mut sh = Command::new("sh");
        sh.args(["-c", script]).stdin(Stdio::from(OwnedFd::from(job_rx))).stdout(out);
        let process = HelperProcess { pid: sh.spawn().unwrap().id() as i32 };
        EarlyHelper { child: Some(process), result_rx: Some(result_rx), job_tx: Some(job_tx), copy: vec![] }
    }

    /// [`early_helper_running`] `cat`: it reads the job socket until EOF and writes what
    /// it read to `out`.
    fn cat_as_early_helper(out: Stdio) -> EarlyHelper {
        early_helper_running("exec cat", out)
    }

    #[test]
    fn an_early_helper_not_used_is_told_by_eof_and_reaped() {
        let early = cat_as_early_helper(Stdio::null());
        let pid = early.child.as_ref().unwrap().pid;
        drop(early);
        // Reaped, not a zombie: the pid is gone.
        assert_eq!(nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None), Err(nix::errno::Errno::ESRCH));
        // One that writes more than its output pipe holds before it exits: its pipe is
        // closed first, or the drop would wait for it forever.
        let (out_rx, out_tx) = pipe().unwrap();
        let mut early = early_helper_running("cat; head -c 1000000 /dev/zero", Stdio::from(out_tx));
        let file = std::fs::OpenOptions::new().append(true).open("/dev/null").unwrap();
        early.copy.push((out_rx, file));
        let pid = early.child.as_ref().unwrap().pid;
        drop(early);
        assert_eq!(nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None), Err(nix::errno::Errno::ESRCH));
    }

    #[test]
    fn an_early_helper_gets_its_whole_job_dir_then_eof() {
        let (out_rx, out_tx) = pipe().unwrap();
        let early = cat_as_early_helper(Stdio::from(out_tx));
        let dir = std::path::Path::new("/run/azp-sandbox/h-0123/jobs/exec-0123456789ab");
        // A job without a cgroup: no word after the path.
        let plan = crate::sandbox::plan::test_plan("exec-0123456789ab", vec![], "");
        let mut spawned = early.hand_over(dir, &plan);
        assert!(spawned.go_tx.is_none(), "started, not prepared");
        let mut got = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(out_rx), &mut got).unwrap();
        assert_eq!(got, format!("{}\0", dir.display()));
        assert!(spawned.child.wait().unwrap().success(), "EOF after the path");
    }

    /// A helper's result pipe as `sh -c script` writes it (its stdout), awaited.
    #[allow(clippy::zombie_processes)]
    fn result_of(script: &str) -> (Helper, Option<HelperResult>) {
        let (result_rx, result_tx) = pipe().unwrap();
        // (The Command holds the write end until it drops.)
        let pid = Command::new("sh").args(["-c", script]).stdout(Stdio::from(result_tx)).spawn().unwrap().id();
        let child = HelperProcess { pid: pid as i32 };
        await_result(Spawned { child, result_rx, go_tx: None, copiers: vec![] }, &RunOptions::default(), None)
    }

    #[test]
    fn the_result_comes_before_eof_and_done_after_it() {
        // The result at once, DONE a while later: the result is not held up by it.
        let (mut helper, r) = result_of(r#"printf '{"Exited":{"code":3,"signal":null}}\n'; sleep 0.2; printf d"#);
        assert_eq!(r, Some(HelperResult::Exited { code: 3, signal: None }));
        assert!(helper.done(), "DONE, then EOF");
        assert!(helper.wait().unwrap().success());
        // In one write with the result.
        let (mut helper, r) = result_of(r#"printf '{"Exited":{"code":0,"signal":null}}\nd'"#);
        assert_eq!(r, Some(HelperResult::Exited { code: 0, signal: None }));
        assert!(helper.done());
        let _ = helper.wait();
        // EOF without it (a helper still in the job's cgroup), or anything else: not done.
        for script in
            [r#"printf '{"Exited":{"code":0,"signal":null}}\n'"#, r#"printf '{"Exited":{"code":0,"signal":null}}\nxd'"#]
        {
            let (mut helper, r) = result_of(script);
            assert!(r.is_some() && !helper.done(), "{script}");
            let _ = helper.wait();
        }
        // A helper that died without a result (EOF) or mid-way through it.
        for script in ["true", r#"printf '{"Exited":'"#] {
            let (mut helper, r) = result_of(script);
            assert!(r.is_none() && !helper.done(), "{script}");
            let _ = helper.wait();
        }
    }

    #[test]
    fn the_runner_prepares_a_root_jobs_cgroup_and_nothing_else() {
        let t = tempfile::tempdir().unwrap();
        let cg = t.path().join("cg");
        std::fs::create_dir_all(cg.join("memory")).unwrap();
        std::fs::create_dir_all(cg.join("unified")).unwrap();
        let host = crate::rootless::cgroups::CgroupHost {
            unified: false,
            v1_mounts: vec![cg.join("memory")],
            root: cg.clone(),
            own_v2: None,
            own_v1: vec![],
            v2_mount: Some(cg.join("unified")),
        };
        let mut plan = crate::sandbox::plan::test_plan("exec-1", vec![], "/azp-test/exec-1");
        plan.limits.memory_bytes = Some(64 << 20);
        assert!(prepare_job_cgroup(&plan, &host));
        let job = cg.join("memory/azp-test/exec-1");
        assert_eq!(std::fs::read_to_string(job.join("memory.limit_in_bytes")).unwrap(), (64u64 << 20).to_string());
        assert!(!job.join("cgroup.procs").exists(), "the runner does not move in: its helper does");
        assert!(cg.join("unified/azp-test/exec-1").is_dir());
        // A rootless job's is its helper's (delegated, in its user namespace).
        plan.rootless = true;
        plan.cgroup_path = "/azp-test/exec-2".into();
        assert!(!prepare_job_cgroup(&plan, &host));
        assert!(!cg.join("memory/azp-test/exec-2").exists());
        // Where it cannot (here: the hierarchy is missing), the helper tries on its own.
        plan.rootless = false;
        std::fs::remove_dir_all(cg.join("memory")).unwrap();
        std::fs::write(cg.join("memory"), "").unwrap();
        assert!(!prepare_job_cgroup(&plan, &host));
    }
}
