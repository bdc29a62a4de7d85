//! One agent slot: a stable name, its GPUs, and a loop that runs one job per fresh
//! sandbox and refills at once (no polling).

use super::hooks::{self, Stage};
use super::joblog::{self, AgentLog};
use super::phases::{self, AgentJob};
use super::status::now_unix;
use super::Shared;
use super::{diag, failed};
use crate::sandbox::{FailureKind, JobPlan, Phase, RunOptions, Sandbox};
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Everything a slot needs, decided once at start (spec inputs are not rebuilt per job).
#[derive(Clone)]
pub struct SlotConfig {
    pub index: usize,
    pub agent_name: String,
    /// The plan every job of this slot starts from (GPUs, volumes, limits, layers).
    pub base_plan: JobPlan,
    /// uid/gid of the rootfs's `azp` user, or None to run as root.
    pub user: Option<(u32, u32)>,
    pub gpu_names: Vec<String>,
    pub capability_env: Vec<(String, String)>,
    /// Set to stop this slot alone (autoscaling): no new agent once the current one ends.
    pub stop: Arc<AtomicBool>,
}

impl SlotConfig {
    /// The whole manager or this slot is stopping.
    pub fn stopping(&self, shared: &Shared) -> bool {
        shared.is_stopping() || self.stop.load(Ordering::SeqCst)
    }
}

/// Backoff after failures: 1 s doubling to 5 min; reset by a job that ran.
struct Backoff(u32);
impl Backoff {
    fn next(&mut self) -> Duration {
        let d = Duration::from_secs(1u64 << self.0.min(8)).min(Duration::from_secs(300));
        self.0 += 1;
        d
    }
}

pub fn run_slot(shared: Arc<Shared>, cfg: SlotConfig, helper_pid: Arc<AtomicI32>) {
    let mut backoff = Backoff(0);
    // Job numbers go on from the last run's: they name the jobs' kept logs.
    let mut seq: u64 = joblog::last_job_number(&shared.home, &cfg.agent_name);
    let ledger = Arc::new(std::sync::Mutex::new(diag::Ledger::scan(&shared.home, &cfg.agent_name)));
    // When the previous agent exited: refill latency is measured from here.
    let mut last_exit: Option<Instant> = None;
    // The next job's sandbox, built while the current job runs (dropped = cancelled).
    let mut prepared: Option<Sandbox> = None;
    // The previous job's cache commit, running in its clean-up thread: done (or gone)
    // when this receiver's sender is dropped.
    let mut committing: Option<CommitDone> = None;
    shared.update_slot(cfg.index, |s| {
        s.agent = cfg.agent_name.clone();
        s.gpus = cfg.gpu_names.clone();
        s.state = "starting".into();
        s.since_unix = now_unix();
    });
    while !cfg.stopping(&shared) {
        let hook_env = hook_env(&cfg, None, None);
        if let Some(dir) = &shared.settings.hooks_dir {
            if let Err(e) = hooks::run(dir, Stage::PreJob, &hook_env, shared.settings.hook_timeout) {
                pause(&shared, &cfg, &mut backoff, format!("pre-job hook: {e:#}"));
                continue;
            }
        }
        seq += 1;
        let carried = Carried { last_exit: &mut last_exit, prepared: &mut prepared, committing: &mut committing };
        match one_job(&shared, &cfg, seq, &helper_pid, &ledger, carried) {
            Ok(JobEnd::Ran) => backoff = Backoff(0),
            Ok(JobEnd::UpdateRequired) => {
                tracing::info!(slot = cfg.index, agent = %cfg.agent_name, "agent asked for an update (exit 4): refreshing the package");
                if let Err(e) = shared.refresh_package() {
                    pause(&shared, &cfg, &mut backoff, format!("agent update failed: {e:#}"));
                }
            }
            Ok(JobEnd::Stopped) => break,
            Err(e) => {
                let msg = format!("{e:#}");
                let reason = match crate::sandbox::report::kind_of(&e) {
                    FailureKind::DiskFull => {
                        format!("disk full: {msg}; free space under {}", shared.home.root().display())
                    }
                    _ => msg,
                };
                pause(&shared, &cfg, &mut backoff, reason);
            }
        }
    }
    shared.update_slot(cfg.index, |s| {
        s.state = "stopped".into();
        s.since_unix = now_unix();
    });
}

enum JobEnd {
    Ran,
    UpdateRequired,
    Stopped,
}

/// Dropped (its sender) when a job's cache commit is over, whatever its outcome.
type CommitDone = std::sync::mpsc::Receiver<()>;

/// What one job hands the slot's next one.
struct Carried<'a> {
    /// When the previous agent exited: refill latency is measured from here.
    last_exit: &'a mut Option<Instant>,
    /// The next job's sandbox, built while the current job runs.
    prepared: &'a mut Option<Sandbox>,
    /// The previous job's cache commit, if it is still running in the background.
    committing: &'a mut Option<CommitDone>,
}

fn one_job(
    shared: &Arc<Shared>,
    cfg: &SlotConfig,
    seq: u64,
    helper_pid: &Arc<AtomicI32>,
    ledger: &Arc<std::sync::Mutex<diag::Ledger>>,
    carried: Carried,
) -> anyhow::Result<JobEnd> {
    let Carried { last_exit, prepared, committing } = carried;
    let plan_for = |seq: u64| {
        let mut plan = cfg.base_plan.clone();
        plan.id = format!("{}-{seq}", cfg.agent_name);
        plan.cgroup_path = crate::sandbox::teardown::cgroup_path_for(&shared.home, &plan.id);
        plan.lower.insert(0, shared.package_layer());
        let (uid, gid) = cfg.user.unwrap_or((0, 0));
        plan.uid = uid;
        plan.gid = gid;
        plan.owned_dirs = vec![phases::agent_dir()];
        plan.scratch = shared.work_root().map(|root| super::workdir::scratch_for(&root, &plan.id));
        plan.caches = shared.settings.caches.iter().map(|d| d.mount(&shared.home)).collect();
        plan
    };
    let plan = plan_for(seq);
    let agent = AgentJob {
        url: &shared.settings.url,
        pool: &shared.settings.pool,
        agent_name: &cfg.agent_name,
        as_root: cfg.user.is_none(),
    };
    let log = AgentLog::open(&shared.home, &cfg.agent_name)?;
    let opts = RunOptions {
        background_delete: true,
        forward_signals: false,
        helper_pid: Some(helper_pid.clone()),
        output: Some(log.path().to_path_buf()),
        // The run keeps the table for all its slots (manager::run).
        keep_table: None,
    };
    // The job's section of the agent log starts here, with a header a sysadmin can find.
    let section = log.offset();
    log.append_line(&header(shared, cfg, &plan, seq).line())?;

    shared.update_slot(cfg.index, |s| {
        s.state = "configuring".into();
        s.since_unix = now_unix();
    });
    // The sandbox built during the previous job, if it still fits (same id, same agent
    // package); else a fresh one.
    let mut sandbox = match prepared.take() {
        Some(s) if s.id() == plan.id && s.lower() == plan.lower.as_slice() => s,
        stale => {
            drop(stale);
            Sandbox::create(&shared.home, plan.clone())?
        }
    };
    // Both phases get the capability env: config.sh registers it with the agent record,
    // which is what pipelines' demands are matched against before the listener starts.
    let mut env = phases::agent_env(&agent);
    env.extend(cfg.capability_env.iter().cloned());
    let configure = Phase {
        args: phases::configure_args(&agent),
        env: env.clone(),
        cwd: Some(phases::agent_dir()),
        stdin: Some(format!("{}\n", shared.token).into_bytes()),
        ..Default::default()
    };
    let configure_start = log.offset();
    let c = sandbox.run(&configure, &opts)?;
    // Previous agent's exit -> this agent configured (registration included).
    let refill_ms = last_exit.take().map(|t| t.elapsed().as_secs_f64() * 1e3);
    if c.code != 0 {
        // Its helper gone, everything config.sh printed is in the log: quote its end.
        sandbox.settle();
        let last = log.last_lines_since(configure_start, joblog::TAIL_LINES);
        copy_diag(shared, ledger, cfg.index, &plan.id)(&sandbox.upper());
        anyhow::bail!(
            "config.sh failed with exit {}{} (all of it: {}; is the PAT allowed to register agents in pool '{}'?)",
            c.code,
            joblog::quoted(&last),
            log.path().display(),
            shared.settings.pool
        );
    }
    if cfg.stopping(shared) {
        // In the foreground: the helper dies with this thread (PDEATHSIG), which is about
        // to end, so it must finish deleting its container first.
        if let Err(e) = sandbox.teardown(false) {
            tracing::warn!(slot = cfg.index, "clean-up failed ({e:#}); `azp-sandbox gc` will retry");
        }
        return Ok(JobEnd::Stopped);
    }
    shared.update_slot(cfg.index, |s| {
        s.state = "waiting-for-job".into();
        s.since_unix = now_unix();
    });
    // Build the next job's sandbox now, while this agent waits for and runs its job, so
    // that the refill after it only has to start a container.
    let next = (|| -> anyhow::Result<Sandbox> {
        let mut s = Sandbox::create(&shared.home, plan_for(seq + 1))?;
        s.prepare(&configure, &opts)?;
        Ok(s)
    })();
    match next {
        Ok(s) => *prepared = Some(s),
        Err(e) => {
            tracing::warn!(slot = cfg.index, "could not prepare the next sandbox ({e:#}); it will be built on demand")
        }
    }
    // What the agent had of job requests before its run.sh can take one: its job's
    // request is then the only newer one (see `cache::trust::learn`). Asked here, not
    // while run.sh starts: a job could take a second request first.
    let before = (!plan.caches.is_empty()).then(|| super::caches::before_the_job(shared, &cfg.agent_name));
    let run = Phase { args: phases::run_args(), env, cwd: Some(phases::agent_dir()), ..Default::default() };
    // The agent configured meanwhile; its job mounts the caches as the run phase starts,
    // so it waits for the previous job's commit here: it sees the committed snapshot.
    wait_for_commit(cfg, &plan.id, committing.take());
    let started = Instant::now();
    let run_start = log.offset();
    let r = sandbox.run(&run, &opts);
    *last_exit = Some(Instant::now());
    let upper = sandbox.upper();
    let result = job_result(&upper);
    let worked = ran_a_job(&upper, plan.scratch.as_ref().map(|s| s.host.as_path())) || result.is_some();
    // The agent's own logs are copied whatever the result: here on a failure (the job is
    // kept, or quoted), else by the teardown's thread, off the refill's path.
    let failure = failure_of(&r);
    let copy = copy_diag(shared, ledger, cfg.index, &plan.id);
    let mut last = vec![];
    let stopping = cfg.stopping(shared);
    let commit = failure.is_none() && worked && !plan.caches.is_empty();
    let cleanup = match &failure {
        Some(reason) => {
            sandbox.settle();
            last = log.last_lines_since(run_start, joblog::TAIL_LINES);
            copy(&upper);
            // An agent that had no job and was stopped by a drain is no failed job.
            if shared.settings.keep_failed > 0 && (worked || !stopping) {
                if let Err(e) = keep_failed(shared, cfg, &mut sandbox, &plan.id, reason, &log, section) {
                    tracing::warn!(slot = cfg.index, job = %plan.id, "could not keep the failed job: {e:#}");
                }
            }
            // A stopping slot's thread ends next: clean up in the foreground (see above).
            sandbox.teardown(!stopping)
        }
        None => {
            // The commit (the trust lookup, then the snapshot) runs in the clean-up's
            // thread: the slot's next agent configures meanwhile (see `wait_for_commit`).
            let (done, commit_done) = std::sync::mpsc::channel::<()>();
            if commit {
                *committing = Some(commit_done);
            }
            let (shared, slot, agent) = (shared.clone(), cfg.index, cfg.agent_name.clone());
            sandbox.teardown_after(!stopping, move |sb| {
                copy(&sb.upper());
                if let (true, Some(before)) = (commit, &before) {
                    super::caches::commit_if_trusted(&shared, slot, &agent, before, sb);
                }
                drop(done);
            })
        }
    };
    let r = r?;
    let cleanup = cleanup?;
    tracing::info!(
        slot = cfg.index,
        agent = %cfg.agent_name,
        job = seq,
        duration_s = %format!("{:.1}", started.elapsed().as_secs_f64()),
        configure_ms = %format!("{:.0}", c.duration.as_secs_f64() * 1e3),
        refill_ms = %refill_ms.map(|m| format!("{m:.1}")).unwrap_or_else(|| "-".into()),
        exit = r.code,
        result = %result.as_deref().unwrap_or(if worked { "unknown" } else { "no job" }),
        limits = %format!("{}{}", r.limits, crate::sandbox::limits::disk_note(r.disk.as_ref())),
        "job finished; {cleanup}"
    );
    if r.disk.is_some_and(|d| d.full()) {
        // The job got ENOSPC/EDQUOT in its own layer (the agent reports the job's failure
        // itself); the host and the other slots kept their space, and the next job gets a
        // fresh layer.
        tracing::warn!(slot = cfg.index, agent = %cfg.agent_name, job = seq, "the job filled its disk quota; the slot refills with a fresh layer");
    }
    shared.update_slot(cfg.index, |s| {
        s.jobs_done += u64::from(worked);
        s.last_exit = Some(r.code);
        s.last_result = result.clone();
        s.paused_reason = None;
    });
    if let Some(dir) = &shared.settings.hooks_dir {
        let env = hook_env(cfg, Some(&upper), Some(r.code));
        // Context keeps the cause's type (a full disk is told from its errno).
        hooks::run(dir, Stage::PostJob, &env, shared.settings.hook_timeout).context("post-job hook")?;
    }
    match r.code {
        0 => Ok(JobEnd::Ran),
        4 => Ok(JobEnd::UpdateRequired),
        code => anyhow::bail!("run.sh --once exited with {code}{}", joblog::quoted(&last)),
    }
}

/// Waits until the previous job's cache commit is over (at once when it already is).
fn wait_for_commit(cfg: &SlotConfig, job: &str, committing: Option<CommitDone>) {
    let Some(done) = committing else { return };
    if !matches!(done.try_recv(), Err(std::sync::mpsc::TryRecvError::Empty)) {
        return;
    }
    let t = Instant::now();
    tracing::info!(
        slot = cfg.index,
        job,
        "agent configured; waiting for the previous job's cache commit before it takes a job"
    );
    let _ = done.recv();
    tracing::info!(
        slot = cfg.index,
        job,
        waited_ms = %format!("{:.0}", t.elapsed().as_secs_f64() * 1e3),
        "the previous job's cache commit is over; the agent takes jobs"
    );
}

/// The header of the job's section in the agent log.
fn header<'a>(shared: &Shared, cfg: &'a SlotConfig, plan: &'a JobPlan, seq: u64) -> joblog::Header<'a> {
    joblog::Header {
        job: &plan.id,
        slot: cfg.index,
        number: seq,
        unix: now_unix(),
        rootfs: shared.rootfs_name(),
        gpus: &cfg.gpu_names,
        limits: &plan.limits,
        user: cfg.user,
        work_dir: plan.scratch.as_ref().map(|s| s.host.as_path()),
        agent_version: shared.package_version(),
    }
}

/// Why the run phase counts as failed (kept with `--keep-failed`): the agent exited
/// non-zero (4 is an update, not a failure), was killed, or the sandbox failed.
fn failure_of(r: &anyhow::Result<crate::sandbox::JobOutcome>) -> Option<String> {
    match r {
        Err(e) => Some(format!("sandbox error: {e:#}")),
        Ok(o) => match (o.code, o.signal) {
            (_, Some(sig)) => Some(format!("killed by signal {sig}")),
            (0 | 4, None) => None,
            (code, None) => Some(format!("run.sh --once exited with {code}")),
        },
    }
}

/// What copies the job's `_diag` to `HOME/logs/<agent>/<job>/` (bounded; see [`diag`]),
/// given the job's upper dir, in whichever thread runs it.
fn copy_diag(
    shared: &Shared,
    ledger: &Arc<std::sync::Mutex<diag::Ledger>>,
    slot: usize,
    job: &str,
) -> impl FnOnce(&Path) + Send + 'static {
    let (home, ledger, job, budget) =
        (shared.home.clone(), ledger.clone(), job.to_string(), shared.settings.diag_logs_max);
    move |upper: &Path| match diag::keep(&home, &ledger, &job, upper, budget) {
        Ok(Some(k)) if !k.skipped.is_empty() => tracing::warn!(
            slot,
            job,
            "kept {} diag file(s) in {}; left out: {}",
            k.files,
            k.dir.display(),
            k.skipped.join(", ")
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(slot, job, "could not keep the job's _diag logs: {e}"),
    }
}

/// Moves the failed job's writable layer under `HOME/failed/<agent>/<job>/` with its
/// logs and a record (see [`failed`]).
fn keep_failed(
    shared: &Shared,
    cfg: &SlotConfig,
    sandbox: &mut Sandbox,
    job: &str,
    reason: &str,
    log: &AgentLog,
    section: u64,
) -> anyhow::Result<()> {
    let dir = failed::make_dir(&shared.home, &cfg.agent_name, job)?;
    sandbox.keep_layers(&dir.join(failed::LAYER))?;
    std::fs::write(dir.join("agent.log"), log.section_since(section, joblog::SECTION_MAX))?;
    let kept = failed::KeptJob {
        job: job.to_string(),
        agent: cfg.agent_name.clone(),
        slot: cfg.index,
        failed_unix: now_unix(),
        reason: reason.to_string(),
        rootfs: shared.rootfs_name(),
        dir: dir.clone(),
    };
    failed::record(&shared.home, &dir, &kept, shared.settings.keep_failed)?;
    tracing::info!(slot = cfg.index, job, "kept the failed job ({reason}) in {}", dir.display());
    Ok(())
}

fn pause(shared: &Shared, cfg: &SlotConfig, backoff: &mut Backoff, reason: String) {
    let wait = backoff.next();
    tracing::warn!(slot = cfg.index, agent = %cfg.agent_name, "slot paused for {}s: {reason}", wait.as_secs());
    shared.update_slot(cfg.index, |s| {
        s.state = "paused".into();
        s.paused_reason = Some(reason.clone());
        s.since_unix = now_unix();
    });
    let end = Instant::now() + wait;
    while !cfg.stopping(shared) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100).min(end - Instant::now()));
    }
}

fn hook_env(cfg: &SlotConfig, job_dir: Option<&Path>, exit: Option<i32>) -> Vec<(String, String)> {
    let mut env = vec![
        ("AZP_SLOT".to_string(), cfg.index.to_string()),
        ("AZP_AGENT_NAME".into(), cfg.agent_name.clone()),
        ("AZP_GPU_UUIDS".into(), cfg.gpu_names.join(",")),
    ];
    if let Some(d) = job_dir {
        env.push(("AZP_JOB_DIR".into(), d.display().to_string()));
    }
    if let Some(c) = exit {
        env.push(("AZP_JOB_EXIT".into(), c.to_string()));
    }
    env
}

fn diag_dir(upper: &Path) -> PathBuf {
    upper.join(phases::AGENT_DIR.trim_start_matches('/')).join("_diag")
}

/// `path` is a real directory (not a symlink the job planted), and so are its parents
/// up to `upper`. The manager reads the job's upper dir as host root: it must never
/// follow what the job put there.
fn real_dir_below(upper: &Path, path: &Path) -> bool {
    let Ok(rel) = path.strip_prefix(upper) else { return false };
    let mut at = upper.to_path_buf();
    for c in rel.components() {
        at.push(c);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_dir() => {}
            _ => return false,
        }
    }
    true
}

/// Has the agent taken a job? The real agent starts a `_diag/Worker_*.log` and creates
/// its work folder when a job arrives (heuristic: the agent has no API for it); with
/// `--work-dir` that folder is `scratch` on the host (empty until a job fills it; the
/// `_work` in the upper dir is only its mount point then). Looks at names only: safe
/// while the job runs.
pub fn ran_a_job(upper: &Path, scratch: Option<&Path>) -> bool {
    let diag = diag_dir(upper);
    let worker_log = real_dir_below(upper, &diag)
        && std::fs::read_dir(&diag)
            .map(|rd| rd.flatten().any(|e| e.file_name().to_string_lossy().starts_with("Worker_")))
            .unwrap_or(false);
    worker_log
        || match scratch {
            Some(dir) => std::fs::read_dir(dir).map(|mut d| d.next().is_some()).unwrap_or(false),
            None => real_dir_below(upper, &diag.with_file_name(phases::WORK_DIR)),
        }
}

/// The job's result from the agent's diag logs: the listener logs
/// "Job <id> completed with result: <Result>" when a job ends. Called after the job's
/// processes are gone; reads only regular files, without following links or blocking,
/// and only their last 256 KiB.
pub fn job_result(upper: &Path) -> Option<String> {
    const MARK: &str = "completed with result: ";
    let diag = diag_dir(upper);
    if !real_dir_below(upper, &diag) {
        return None;
    }
    let mut found = None;
    for e in std::fs::read_dir(&diag).ok()?.flatten().filter(|e| e.file_name().to_string_lossy().ends_with(".log")) {
        let Some(text) = read_tail_of_regular_file(&e.path(), 256 << 10) else { continue };
        if let Some(pos) = text.rfind(MARK) {
            let word: String = text[pos + MARK.len()..].chars().take_while(|c| c.is_alphanumeric()).collect();
            if !word.is_empty() {
                found = Some(word);
            }
        }
    }
    found
}

fn read_tail_of_regular_file(path: &Path, max: u64) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    use std::os::unix::fs::OpenOptionsExt;
    let mut f =
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path).ok()?;
    let meta = f.metadata().ok()?;
    if !meta.file_type().is_file() {
        return None;
    }
    f.seek(SeekFrom::Start(meta.len().saturating_sub(max))).ok()?;
    let mut buf = Vec::new();
    f.take(max).read_to_end(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::{JobOutcome, SandboxError};

    fn outcome(code: i32, signal: Option<i32>) -> anyhow::Result<JobOutcome> {
        Ok(JobOutcome {
            id: "h-0-1".into(),
            code,
            signal,
            duration: Duration::ZERO,
            cleanup: Default::default(),
            limits: Default::default(),
            disk: None,
        })
    }

    #[test]
    fn what_counts_as_a_failed_job() {
        assert_eq!(failure_of(&outcome(0, None)), None, "whatever the pipeline's result");
        assert_eq!(failure_of(&outcome(4, None)), None, "an update");
        assert_eq!(failure_of(&outcome(1, None)).as_deref(), Some("run.sh --once exited with 1"));
        assert_eq!(failure_of(&outcome(137, Some(9))).as_deref(), Some("killed by signal 9"));
        let e = Err(SandboxError::new(FailureKind::DiskFull, "no space left").into());
        assert_eq!(failure_of(&e).as_deref(), Some("sandbox error: no space left"));
    }
}
