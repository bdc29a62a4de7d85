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

use super::container::{Container, Libcontainer, EARLY_SIGNAL};
use super::editlayer;
use super::inroot;
use super::jobdir::JobDir;
use super::report::{kind_of, FailureKind, SandboxError};
use super::spec;
use crate::config::Home;
use crate::rootless::cgroups::CgroupHost;
use crate::sys::{self, Overlay, Signal, Sys};
use anyhow::{Context, Result};
use std::os::fd::OwnedFd;
use std::path::Path;

pub use super::report::HelperResult;

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
            let fd = std::env::var(var).ok().and_then(|v| v.parse::<i32>().ok());
            std::env::remove_var(var);
            // Never inherited by the job (libcontainer also closes fds >= 3 before exec).
            fd.and_then(sys::process::adopt_inherited_fd)
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
    // The handler only records the signal (see EARLY_SIGNAL); glibc's signal() sets
    // SA_RESTART, so the setup's syscalls are not interrupted; the job's init gets
    // default handlers back at execve.
    sys::signals::record_on(&[Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP, Signal::SIGQUIT], &EARLY_SIGNAL);
    let job = JobDir::at(home, job_dir);
    let reporter = Reporter { fd: std::cell::Cell::new(pipes.result) };
    let mut container = Libcontainer::default();
    let result = run(home, &job, CgroupHost::get(), &sys::Real, &mut container, &reporter, pipes.go);
    let code = exit_code(&result);
    reporter.report(&job, &result);
    code
}

/// The result a helper reports for what [`run`] returned: a failure with its kind,
/// classified here from the typed error, where it was produced.
fn into_result(outcome: Result<HelperResult>) -> HelperResult {
    match outcome {
        Ok(r) => r,
        Err(e) => HelperResult::Failed { kind: kind_of(&e), error: format!("{e:#}") },
    }
}

fn exit_code(result: &HelperResult) -> i32 {
    match result {
        HelperResult::Exited { code, .. } => *code,
        HelperResult::Failed { .. } => 125,
    }
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

/// The straight line, each privileged step through `sys` and the container through
/// `container` (so that the order and the failure paths are unit-tested on doubles).
/// On a failure nothing is undone here: the overlay and binds live only in this
/// process's mount namespace and go with it, and the runner's teardown removes the
/// cgroup and dirs. Only a created container is deleted (and its unstarted init killed).
fn run(
    home: &Home,
    job: &JobDir,
    cgroups: &CgroupHost,
    sys: &dyn Sys,
    container: &mut dyn Container,
    reporter: &Reporter,
    go: Option<OwnedFd>,
) -> HelperResult {
    into_result(run_steps(home, job, cgroups, sys, container, reporter, go))
}

fn run_steps(
    home: &Home,
    job: &JobDir,
    cgroups: &CgroupHost,
    sys: &dyn Sys,
    container: &mut dyn Container,
    reporter: &Reporter,
    go: Option<OwnedFd>,
) -> Result<HelperResult> {
    let plan = job.read_plan()?;
    let merged = job.merged();
    container.prepare_stdio()?;
    sys.private_mount_namespace()?;
    let cgroup_owner = enter_job_cgroup(&plan, cgroups, sys)?;
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

    container.create(&plan, job)?;
    tracing::debug!(job = %plan.id, "container created");
    record_init(job, container.init_pid())?;
    if !wait_for_go(go) {
        container.kill_unreaped_init();
        let _ = container.delete();
        let _ = sys.unmount(&merged);
        return Err(SandboxError::new(FailureKind::Cancelled, "cancelled before start").into());
    }
    // From here on the container exists: whatever happens, delete it.
    let outcome = container.start_and_wait();
    tracing::debug!(job = %plan.id, "job exited");
    if let Ok(r) = &outcome {
        reporter.report(job, r);
    }
    if let Err(e) = container.delete() {
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
fn enter_job_cgroup(plan: &super::JobPlan, host: &CgroupHost, sys: &dyn Sys) -> Result<spec::CgroupOwner> {
    use super::cgroup::{plan_join, Setup};
    let has_cgroup = !plan.cgroup_path.as_os_str().is_empty();
    if plan.rootless {
        if has_cgroup {
            sys.join_cgroup(&plan_join(host, &plan.cgroup_path, &plan.limits, &Setup::Rootless))?;
        }
        sys.hide_cgroupfs()?;
        return Ok(spec::CgroupOwner::Helper { leaf: None });
    }
    if host.v2_mount.is_none() || !has_cgroup {
        return Ok(spec::CgroupOwner::Libcontainer);
    }
    let setup = Setup::Root { device_rules: spec::v1_device_allow_lines(plan)? };
    sys.join_cgroup(&plan_join(host, &plan.cgroup_path, &plan.limits, &setup))?;
    sys.hide_cgroupfs()?;
    Ok(spec::CgroupOwner::Helper { leaf: Some(JOB_CGROUP_LEAF.into()) })
}

/// Where libcontainer puts the job's init, in the helper's private cgroup2 view (root
/// mode): a leaf of the job's cgroup, removed by libcontainer's delete (or with the job's
/// cgroup by the teardown).
const JOB_CGROUP_LEAF: &str = "/job";

/// Writes `init.pid` (see [`JobDir::init_file`]) so `gc` can kill the job if this helper dies.
fn record_init(job: &JobDir, pid: Option<i32>) -> Result<()> {
    let pid = pid.context("sandbox created but has no init pid")?;
    let start = super::teardown::process_start_time(pid).context("cannot read the job init's start time")?;
    std::fs::write(job.init_file(), format!("{pid} {start}\n")).context("cannot record the job's init pid: disk full?")
}

/// For a prepared sandbox: blocks until the runner says go (true) or cancels (false).
fn wait_for_go(go: Option<OwnedFd>) -> bool {
    let Some(fd) = go else { return true };
    let mut b = [0u8; 1];
    matches!(std::io::Read::read(&mut std::fs::File::from(fd), &mut b), Ok(1))
}
