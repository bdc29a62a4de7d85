//! Parent side of one job: record it, start the helper, wait, tear down.
//!
//! Safe to call from a multi-threaded process (the manager): it only spawns the helper
//! (fork+exec with an async-signal-safe pre_exec) and never calls libcontainer itself.

use super::helper::HelperResult;
use super::jobdir::{JobDir, JobState};
use super::plan::JobPlan;
use super::teardown::{self, Cleanup};
use crate::config::Home;
use anyhow::{bail, Context, Result};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// How a job ended.
#[derive(Debug, Clone)]
pub struct JobOutcome {
    pub id: String,
    /// The command's exit code (128+n when killed by signal n).
    pub code: i32,
    pub signal: Option<i32>,
    pub duration: Duration,
    pub cleanup: Cleanup,
}

/// Options of one run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Delete the job dir in the background (the manager) instead of before returning (exec).
    pub background_delete: bool,
    /// Forward SIGINT/SIGTERM received by this process to the helper (exec in a terminal).
    pub forward_signals: bool,
}

static HELPER_PID: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward_to_helper(sig: libc::c_int) {
    let pid = HELPER_PID.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill(2) is async-signal-safe; pid is a plain integer.
        unsafe { libc::kill(pid, sig) };
    }
}

/// Checks what can be checked before anything is created, with one-line errors.
pub fn validate(plan: &JobPlan) -> Result<()> {
    if plan.args.is_empty() {
        bail!("no command given: use `azp-sandbox exec [OPTIONS] -- CMD [ARGS...]`");
    }
    for v in &plan.volumes {
        if !v.host.exists() {
            bail!("volume source {} does not exist: fix --volume {}:{}", v.host.display(), v.host.display(), v.container.display());
        }
    }
    for l in &plan.lower {
        if !l.is_dir() {
            bail!("rootfs layer {} is missing: re-import the rootfs", l.display());
        }
    }
    for m in plan.edits.mounts.iter().filter(|m| !m.optional) {
        if !m.host_path.exists() {
            bail!("{} is missing on the host (needed at {} in the sandbox)", m.host_path.display(), m.container_path.display());
        }
    }
    Ok(())
}

/// Runs one job to completion in a fresh sandbox and removes everything it left.
pub fn run_job(home: &Home, mut plan: JobPlan, opts: &RunOptions) -> Result<JobOutcome> {
    validate(&plan)?;
    // Optional mounts whose source is missing are dropped here, never failing the job.
    plan.edits.mounts.retain(|m| !m.optional || m.host_path.exists());
    home.ensure()?;
    let job = JobDir::new(&home.jobs_dir(), &plan.id);
    let state = JobState {
        id: plan.id.clone(),
        cgroup_path: plan.cgroup_path.clone(),
        container_state: home.runtime_dir().join(&plan.id),
        merged: job.merged(),
        rootfs: plan.lower.clone(),
        runner_pid: std::process::id(),
        started_unix: SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
    };
    let started = Instant::now();
    let lock = match job.create(&plan, &state) {
        Ok(l) => l,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&job.root);
            return Err(e);
        }
    };
    tracing::debug!(job = %plan.id, "job dir recorded");
    let status = spawn_helper(home, &job.root, opts.forward_signals);
    tracing::debug!(job = %plan.id, "helper exited");
    let result = read_result(&job, &status);
    let duration = started.elapsed();
    // Teardown happens whatever the helper said; the lock goes last so gc never races us.
    let cleanup = teardown::cleanup_job(home, &job, opts.background_delete);
    drop(lock);
    let cleanup = cleanup?;
    tracing::debug!(job = %plan.id, "cleaned up");
    match result? {
        HelperResult::Exited { code, signal } => Ok(JobOutcome { id: plan.id, code, signal, duration, cleanup }),
        HelperResult::Failed { error } => bail!("{error}"),
    }
}

fn spawn_helper(home: &Home, job_dir: &std::path::Path, forward: bool) -> Result<std::process::ExitStatus> {
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg("--home").arg(home.root());
    if tracing::enabled!(tracing::Level::DEBUG) {
        cmd.arg("-v");
    }
    cmd.arg("__sandbox-helper").arg(job_dir);
    cmd.stdin(Stdio::inherit()).stdout(Stdio::inherit()).stderr(Stdio::inherit());
    // SAFETY: the closure runs between fork and exec and only calls prctl(2), which is
    // async-signal-safe. PDEATHSIG ties the helper to this process: if we die, it dies,
    // and gc (keyed on our lock) removes the rest.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("cannot start the sandbox helper (re-exec of /proc/self/exe)")?;
    if forward {
        HELPER_PID.store(child.id() as i32, Ordering::SeqCst);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
            // SAFETY: installs a handler that only does an atomic load and kill(2).
            unsafe { libc::signal(sig, forward_to_helper as *const () as libc::sighandler_t) };
        }
    }
    let status = child.wait().context("lost the sandbox helper");
    if forward {
        HELPER_PID.store(0, Ordering::SeqCst);
    }
    status
}

fn read_result(job: &JobDir, status: &Result<std::process::ExitStatus>) -> Result<HelperResult> {
    let path: PathBuf = job.result_file();
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).with_context(|| format!("corrupt helper result {}", path.display())),
        Err(_) => match status {
            Ok(s) if s.signal().is_some() => bail!("sandbox helper was killed by signal {}", s.signal().unwrap_or(0)),
            Ok(s) => bail!("sandbox helper exited with {s} without reporting; run with -vv for details"),
            Err(e) => bail!("{e:#}"),
        },
    }
}
