//! The sandbox helper: a fresh, single-threaded process that owns one job's container:
//! forked by a single-threaded runner (`exec`), or this binary re-executed as
//! `azp-sandbox __sandbox-helper JOB_DIR` by a multi-threaded one (the agent manager).
//!
//! Why a separate process: libcontainer forks, and forking a multi-threaded process can
//! deadlock (measured); it also writes oom_score_adj and clears "dumpable" on its caller.
//! Here those side effects stay in a process that lives exactly as long as the job.
//!
//! The straight line: private mount namespace -> job cgroup -> edit layer (GPU jobs; built
//! once, see [`editlayer`]) -> overlay -> spec -> create -> start ->
//! wait (forwarding signals) -> delete -> report. The overlay exists only in the helper's
//! mount namespace, so the kernel unmounts it when the job's last process is gone, even
//! if everything is SIGKILLed.

use super::editlayer;
use super::inroot;
use super::jobdir::JobDir;
use super::spec;
use crate::config::Home;
use crate::sys::{Overlay, Sys};
use anyhow::{Context, Result};
use libcontainer::container::builder::ContainerBuilder;
use libcontainer::syscall::syscall::SyscallType;
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

/// What the helper reports to the runner through `<job>/result.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum HelperResult {
    /// The job ran; its exit code (128+n when killed by signal n).
    Exited { code: i32, signal: Option<i32> },
    /// The sandbox could not be created or run.
    Failed { error: String },
}

/// Time a job gets after SIGTERM/SIGINT before it is SIGKILLed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// A stop signal that arrived before the job was started (while the helper was still
/// setting up): forwarded to the job as soon as it runs. Without this, a SIGTERM in that
/// window killed the helper outright and orphaned the container's init, which kept our
/// pipes open and hung the supervisor's shutdown.
static EARLY_SIGNAL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn note_early_signal(sig: libc::c_int) {
    EARLY_SIGNAL.store(sig, std::sync::atomic::Ordering::SeqCst);
}

/// The helper's two pipes to its runner.
#[derive(Debug, Default)]
pub struct Pipes {
    /// Where the result goes as soon as the job exits, before the container is deleted,
    /// so the runner can start the slot's next job while this helper cleans up.
    pub result: Option<OwnedFd>,
    /// A prepared sandbox: the container is built, then the helper waits for one byte
    /// here before starting the job (EOF: cancelled).
    pub go: Option<OwnedFd>,
}

impl Pipes {
    /// The pipes of a re-executed helper, named by [`RESULT_FD_ENV`] and [`GO_FD_ENV`].
    fn from_env() -> Pipes {
        let take = |var: &str| {
            let fd = std::env::var(var).ok().and_then(|v| v.parse::<i32>().ok()).filter(|fd| *fd > 2);
            std::env::remove_var(var);
            fd.map(|fd| {
                // Never inherited by the job (libcontainer also closes fds >= 3 before exec).
                let _ = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC));
                // SAFETY: the runner passes this fd (a pipe end) to us and nothing else in
                // this process owns it.
                unsafe { OwnedFd::from_raw_fd(fd) }
            })
        };
        Pipes { result: take(RESULT_FD_ENV), go: take(GO_FD_ENV) }
    }
}

/// Entry point of the hidden subcommand (a re-executed helper). Returns the exit code.
pub fn main(home: &Home, job_dir: &Path) -> i32 {
    run_helper(home, job_dir, Pipes::from_env())
}

/// The helper's whole life, in a fresh process (re-executed, or forked from a
/// single-threaded runner). Returns the process exit code.
pub fn run_helper(home: &Home, job_dir: &Path, pipes: Pipes) -> i32 {
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe). glibc's
        // signal() sets SA_RESTART, so the setup's syscalls are not interrupted; the
        // job's init gets default handlers back at execve.
        unsafe { libc::signal(sig, note_early_signal as *const () as libc::sighandler_t) };
    }
    let job = JobDir::at(home, job_dir);
    let reporter = Reporter { fd: std::cell::Cell::new(pipes.result) };
    let result = match run(home, &job, &crate::sys::Real, &reporter, pipes.go) {
        Ok(r) => r,
        Err(e) => HelperResult::Failed { error: format!("{e:#}") },
    };
    let code = match &result {
        HelperResult::Exited { code, .. } => *code,
        HelperResult::Failed { .. } => 125,
    };
    reporter.report(&job, &result);
    code
}

/// Env var naming a re-executed helper's result pipe (see [`Pipes::result`]).
pub const RESULT_FD_ENV: &str = "AZP_SANDBOX_RESULT_FD";
/// Env var naming a re-executed helper's go pipe (see [`Pipes::go`]).
pub const GO_FD_ENV: &str = "AZP_SANDBOX_GO_FD";

struct Reporter {
    fd: std::cell::Cell<Option<OwnedFd>>,
}

impl Reporter {
    /// Writes the result file, then sends it on the pipe (once).
    fn report(&self, job: &JobDir, result: &HelperResult) {
        let bytes = serde_json::to_vec(result).unwrap_or_default();
        if let Err(e) = std::fs::write(job.result_file(), &bytes) {
            eprintln!("azp-sandbox helper: cannot write {}: {e}", job.result_file().display());
        }
        if let Some(fd) = self.fd.take() {
            let mut f = std::fs::File::from(fd);
            let _ = std::io::Write::write_all(&mut f, &bytes);
        }
    }
}

fn run(home: &Home, job: &JobDir, sys: &dyn Sys, reporter: &Reporter, go: Option<OwnedFd>) -> Result<HelperResult> {
    let plan = job.read_plan()?;
    let merged = job.merged();
    keep_dev_null_writable()?;
    sys.private_mount_namespace()?;
    let cgroup_owner = enter_job_cgroup(&plan, sys)?;
    let mut plan = plan;
    // Held (locked against gc) until this helper exits with the job.
    let _edit_layer = if editlayer::wanted(&plan.edits) {
        let layer = editlayer::obtain(home, &plan, sys)?;
        layer.stack_on(&mut plan);
        Some(layer)
    } else {
        None
    };
    sys.mount_overlay(&Overlay {
        lower: plan.lower.clone(),
        upper: job.upper(),
        work: job.work(),
        target: merged.clone(),
        userxattr: plan.rootless,
    })?;
    // What the layer holds when there is one; with CDI hooks, made in the job's own layer.
    editlayer::write_edits(&merged, &plan.edits)?;
    for dir in &plan.owned_dirs {
        inroot::create_owned_dir(&merged, dir, plan.uid, plan.gid)
            .with_context(|| format!("cannot give {} to uid {} in the sandbox", dir.display(), plan.uid))?;
    }
    tracing::debug!(job = %plan.id, "overlay mounted");

    let spec = spec::build(&plan, &merged, &cgroup_owner)?;
    spec.save(job.bundle().join("config.json")).context("cannot write the OCI spec")?;

    // libcontainer gives its caller the job's oom_score_adj; ours goes back after build().
    let own_oom_score_adj = std::fs::read_to_string("/proc/self/oom_score_adj").ok();
    let mut container = ContainerBuilder::new(plan.id.clone(), SyscallType::default())
        .with_root_path(job.container_root())
        .context("bad libcontainer state dir")?
        .as_init(job.bundle())
        .with_systemd(false)
        .with_detach(false)
        .build()
        .map_err(|e| {
            anyhow::anyhow!("cannot create the sandbox: {}", explain_create_error(&e.to_string(), &plan.args))
        })?;

    tracing::debug!(job = %plan.id, "container created");
    if let Some(v) = own_oom_score_adj {
        // In the job's cgroup (see sandbox::cgroup), a memory-limit OOM must pick the
        // job's processes, not the helper. Lowering needs root; rootless it stays.
        let _ = std::fs::write("/proc/self/oom_score_adj", v.trim());
    }
    record_init(job, &container)?;
    if !wait_for_go(go) {
        kill_unreaped_init(&container);
        let _ = container.delete(true);
        let _ = sys.unmount(&merged);
        return Ok(HelperResult::Failed { error: "cancelled before start".into() });
    }
    // From here on the container exists: whatever happens, delete it.
    let outcome = start_and_wait(&mut container);
    tracing::debug!(job = %plan.id, "job exited");
    if let Ok(r) = &outcome {
        reporter.report(job, r);
    }
    if let Err(e) = container.delete(true) {
        tracing::warn!(job = %plan.id, "libcontainer delete failed ({e}); gc will finish the clean-up");
    }
    // No unmount of the overlay here: it lives only in this process's mount namespace,
    // which the kernel tears down when we exit, before our parent's wait returns. An
    // unmount of its own costs one more RCU grace period (~0.7 ms per job measured).
    tracing::debug!(job = %plan.id, "container deleted");
    outcome
}

/// Puts the helper into the job's cgroup (see [`super::cgroup`]), so the job is born there,
/// and hides the host's cgroup tree from libcontainer. Root mode on a host without a
/// cgroup2 hierarchy leaves it all to libcontainer's v1 manager instead. Rootless without
/// delegation, the job gets no cgroup (the warning was printed at start).
fn enter_job_cgroup(plan: &super::JobPlan, sys: &dyn Sys) -> Result<spec::CgroupOwner> {
    use super::cgroup::{join_job_cgroup, Setup};
    let host = crate::rootless::cgroups::CgroupHost::get();
    let has_cgroup = !plan.cgroup_path.as_os_str().is_empty();
    if plan.rootless {
        if has_cgroup {
            join_job_cgroup(host, &plan.cgroup_path, &plan.limits, &Setup::Rootless)?;
        }
        sys.hide_cgroupfs()?;
        return Ok(spec::CgroupOwner::Helper { leaf: None });
    }
    if host.v2_mount.is_none() || !has_cgroup {
        return Ok(spec::CgroupOwner::Libcontainer);
    }
    let setup = Setup::Root { device_rules: spec::v1_device_allow_lines(plan)? };
    join_job_cgroup(host, &plan.cgroup_path, &plan.limits, &setup)?;
    sys.hide_cgroupfs()?;
    Ok(spec::CgroupOwner::Helper { leaf: Some(JOB_CGROUP_LEAF.into()) })
}

/// Where libcontainer puts the job's init, in the helper's private cgroup2 view (root
/// mode): a leaf of the job's cgroup, removed by libcontainer's delete (or with the job's
/// cgroup by the teardown).
const JOB_CGROUP_LEAF: &str = "/job";

fn start_and_wait(container: &mut libcontainer::container::Container) -> Result<HelperResult> {
    // Block the signals we handle before the job starts, so none is lost; the job's
    // init was forked during build() and does not inherit this mask.
    let mut set = SigSet::empty();
    for s in [Signal::SIGCHLD, Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP, Signal::SIGQUIT] {
        set.add(s);
    }
    set.thread_block().context("cannot block signals in the helper")?;

    if let Err(e) = container.start() {
        kill_unreaped_init(container);
        anyhow::bail!("cannot start the sandbox: {e}");
    }
    let init = container.pid().context("sandbox started but has no init pid")?;

    let mut kill_at: Option<Instant> = None;
    // Signals are blocked now (sigtimedwait below takes them); one that came earlier is
    // the job's too.
    if let Ok(sig) = Signal::try_from(EARLY_SIGNAL.swap(0, std::sync::atomic::Ordering::SeqCst)) {
        tracing::info!("received {sig} while starting: forwarding to the job, SIGKILL in {}s", STOP_GRACE.as_secs());
        let _ = kill(init, sig);
        kill_at = Some(Instant::now() + STOP_GRACE);
    }
    loop {
        // Reap everything (libcontainer's intermediate too); stop when init is gone.
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == init => {
                    return Ok(HelperResult::Exited { code, signal: None })
                }
                Ok(WaitStatus::Signaled(pid, sig, _)) if pid == init => {
                    return Ok(HelperResult::Exited { code: 128 + sig as i32, signal: Some(sig as i32) })
                }
                Ok(WaitStatus::StillAlive) | Err(nix::errno::Errno::ECHILD) => break,
                Ok(_) => continue,
                Err(e) => return Err(e).context("waitpid failed"),
            }
        }
        let timeout = kill_at.map(|t| t.saturating_duration_since(Instant::now())).unwrap_or(Duration::from_secs(60));
        match wait_signal(&set, timeout) {
            Some(Signal::SIGCHLD) => {}
            Some(sig) if kill_at.is_none() => {
                tracing::info!("received {sig}: forwarding to the job, SIGKILL in {}s", STOP_GRACE.as_secs());
                let _ = kill(init, sig);
                kill_at = Some(Instant::now() + STOP_GRACE);
            }
            Some(sig) => {
                tracing::info!("received {sig} again: killing the job");
                let _ = kill(init, Signal::SIGKILL);
            }
            None => {
                if kill_at.is_some_and(|t| Instant::now() >= t) {
                    let _ = kill(init, Signal::SIGKILL);
                }
            }
        }
    }
}

/// libcontainer 0.7 replaces stdio fds that point at /dev/null with the container's
/// /dev/null opened *read-only*, so a job whose stdout is /dev/null fails every write
/// with EBADF. /dev/zero discards writes the same way and is not touched: use it.
fn keep_dev_null_writable() -> Result<()> {
    use std::os::fd::AsRawFd;
    let null = nix::sys::stat::stat("/dev/null").context("cannot stat /dev/null")?;
    let mut zero: Option<std::fs::File> = None;
    for fd in [1, 2] {
        let Ok(st) = nix::sys::stat::fstat(fd) else { continue };
        if st.st_mode & libc::S_IFMT == libc::S_IFCHR && st.st_rdev == null.st_rdev {
            if zero.is_none() {
                zero =
                    Some(std::fs::OpenOptions::new().write(true).open("/dev/zero").context("cannot open /dev/zero")?);
            }
            let z = zero.as_ref().map(|f| f.as_raw_fd()).unwrap_or(-1);
            nix::unistd::dup2(z, fd).context("cannot redirect stdio from /dev/null to /dev/zero")?;
        }
    }
    Ok(())
}

/// Writes `init.pid` (see [`JobDir::init_file`]) so `gc` can kill the job if this helper dies.
fn record_init(job: &JobDir, container: &libcontainer::container::Container) -> Result<()> {
    let pid = container.pid().context("sandbox created but has no init pid")?.as_raw();
    let start = super::teardown::process_start_time(pid).context("cannot read the job init's start time")?;
    std::fs::write(job.init_file(), format!("{pid} {start}\n")).context("cannot record the job's init pid: disk full?")
}

/// SIGKILLs the container's init when it was never started (cancelled, or start failed).
/// libcontainer's forced delete kills through the cgroup, and a rootless job's processes
/// are not in one libcontainer knows; init still holds our pipes, so without this the
/// runner would wait for it forever. Init is pid 1 of the job's pid namespace: the kernel
/// kills the rest. Only for an init not yet reaped, whose pid cannot have been reused.
fn kill_unreaped_init(container: &libcontainer::container::Container) {
    if let Some(pid) = container.pid() {
        let _ = kill(pid, Signal::SIGKILL);
        let _ = waitpid(pid, None);
    }
}

/// For a prepared sandbox: blocks until the runner says go (true) or cancels (false).
fn wait_for_go(go: Option<OwnedFd>) -> bool {
    let Some(fd) = go else { return true };
    let mut b = [0u8; 1];
    matches!(std::io::Read::read(&mut std::fs::File::from(fd), &mut b), Ok(1))
}

/// sigtimedwait on `set`; None on timeout.
fn wait_signal(set: &SigSet, timeout: Duration) -> Option<Signal> {
    let ts = libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as _ };
    // SAFETY: `set` is a valid, initialised sigset_t borrowed for the call; `ts` lives on the
    // stack for the call; a null siginfo pointer is allowed by sigtimedwait(2).
    let r = unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), &ts) };
    if r < 0 {
        None
    } else {
        Signal::try_from(r).ok()
    }
}

/// libcontainer's errors are precise but not always actionable; translate the common ones.
fn explain_create_error(err: &str, args: &[String]) -> String {
    let cmd = args.first().map(String::as_str).unwrap_or("");
    if err.contains("executable") && (err.contains("not found") || err.contains("No such file")) {
        return format!("command '{cmd}' not found in the sandbox's rootfs ({err})");
    }
    err.to_string()
}
