//! The sandbox helper: a fresh, single-threaded process that owns one job's container:
//! forked by a single-threaded runner (`exec`), or this binary re-executed as
//! `azp-sandbox __sandbox-helper JOB_DIR` by a multi-threaded one (the agent manager).
//!
//! Why a separate process: libcontainer forks, and forking a multi-threaded process can
//! deadlock (measured); it also writes oom_score_adj and clears "dumpable" on its caller.
//! Here those side effects stay in a process that lives exactly as long as the job.
//!
//! The straight line: no supplementary groups -> private mount namespace (these first
//! steps, and a `none` job's network namespace, an early helper takes before its job is
//! planned: see [`run_early_helper`]) -> network namespace (made by a child meanwhile)
//! -> edit layer (GPU jobs; built once, see
//! [`editlayer`]) -> the job's own ids (its user namespace, the lower layers idmapped,
//! see [`crate::identity`]) -> overlay -> caches (see [`cachemount`]) -> into the network
//! namespace -> the tree's own mounts (see [`treemount`]) -> job cgroup (an early
//! helper's runner may have made it: see [`HandOver`]) -> spec -> create
//! -> the network's veth ready -> start -> wait (forwarding signals) -> report -> delete.
//! The overlay exists only in the helper's
//! mount namespace, so the kernel unmounts it when the job's last process is gone, even
//! if everything is SIGKILLed.

use super::cachemount;
use super::container::{Container, Libcontainer, EARLY_SIGNAL};
use super::editlayer;
use super::inroot;
use super::jobdir::JobDir;
use super::report::{kind_of, FailureKind, SandboxError};
use super::spec;
use super::treemount;
use crate::config::{Home, Network};
use crate::rootless::cgroups::CgroupHost;
use crate::sys::{self, Overlay, Signal, Sys};
use anyhow::{Context, Result};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
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
    /// An early helper's (see [`run_early_helper`]): its job dir's path comes here once
    /// the runner has planned the job (EOF: the plan failed).
    pub job: Option<OwnedFd>,
    /// An early helper's, for a `none` job: its end of the socket of the namespace its
    /// runner started (see `sys::net::loopback_maker`).
    pub netns: Option<OwnedFd>,
}

impl Pipes {
    /// The same pipes at fds above 3: fd 3 is the job's lifeline's (see `sys::lifeline`).
    fn above_lifeline_fd(self) -> Result<Pipes> {
        let mv = |fd: Option<OwnedFd>| fd.map(sys::lifeline::move_above).transpose();
        Ok(Pipes { result: mv(self.result)?, go: mv(self.go)?, job: mv(self.job)?, netns: mv(self.netns)? })
    }

    /// The pipes of a re-executed helper, named by [`RESULT_FD_ENV`] and [`GO_FD_ENV`].
    fn from_env() -> Pipes {
        let take = |var: &str| {
            let fd = std::env::var(var).ok().and_then(|v| v.parse::<i32>().ok());
            std::env::remove_var(var);
            // Never inherited by the job (libcontainer also closes fds >= 3 before exec).
            fd.and_then(sys::process::adopt_inherited_fd)
        };
        Pipes { result: take(RESULT_FD_ENV), go: take(GO_FD_ENV), job: None, netns: None }
    }
}

/// Entry point of the hidden subcommand (a re-executed helper). Returns the exit code.
pub fn main(home: &Home, job_dir: &Path) -> i32 {
    run_helper(home, job_dir, Pipes::from_env())
}

/// The helper's whole life, in a fresh process (re-executed, or forked from a
/// single-threaded runner). Returns the process exit code.
pub fn run_helper(home: &Home, job_dir: &Path, pipes: Pipes) -> i32 {
    handle_signals();
    let job = JobDir::at(home, job_dir);
    let pipes = match keep_lifeline_fd(pipes) {
        Ok(p) => p,
        Err(e) => return report_failure(&job, None, e),
    };
    let mut container = Libcontainer::default();
    run_and_report(home, &job, pipes, &mut container, None)
}

/// The life of a helper forked before its job was planned (see `runner::EarlyHelper`):
/// its [`FirstSteps`] for a job of `network` while the runner plans, then its job dir's
/// path from `pipes.job`, then [`run_helper`]'s line from the plan on. A first step that
/// failed is the job's failure, reported as any other. EOF instead of a path: the plan
/// failed and the runner reaps this helper, which ends quietly.
pub fn run_early_helper(home: &Home, network: Network, pipes: Pipes) -> i32 {
    handle_signals();
    // Without its pipes it cannot report: the runner says "exited without a result".
    let Ok(mut pipes) = keep_lifeline_fd(pipes) else { return 125 };
    let mut container = Libcontainer::default();
    let first = first_steps(home, network, &sys::Real, &mut container, pipes.netns.take());
    let Some((job_dir, rest)) = pipes.job.take().and_then(read_job_dir) else { return 0 };
    let job = JobDir::at(home, &job_dir);
    match first {
        Ok(first) => run_and_report(home, &job, pipes, &mut container, Some((first, rest))),
        Err(e) => report_failure(&job, pipes.result, e),
    }
}

fn handle_signals() {
    // The handler only records the signal (see EARLY_SIGNAL); glibc's signal() sets
    // SA_RESTART, so the setup's syscalls are not interrupted; the job's init gets
    // default handlers back at execve.
    sys::signals::record_on(&[Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP, Signal::SIGQUIT], &EARLY_SIGNAL);
    // SIGPIPE is the default again in this binary (see main.rs), and libcontainer writes
    // the container's state to each OCI/CDI hook's stdin, ignoring EPIPE as runc does: a
    // hook that exits without reading it (`echo ran >> f`) killed the helper and lost the
    // job's result (a CI run: "sandbox helper was killed by signal 13"). Absorbed here,
    // the write fails instead; the job gets the default back at its execve.
    sys::signals::absorb_on(&[Signal::SIGPIPE]);
}

/// Before anything is opened: fd 3 is kept for the job's lifeline.
fn keep_lifeline_fd(pipes: Pipes) -> Result<Pipes> {
    let pipes = pipes.above_lifeline_fd()?;
    sys::lifeline::reserve()?;
    Ok(pipes)
}

/// Ends the job dir's path on an early helper's socket (a path holds no NUL).
pub const END_OF_PATH: u8 = 0;
/// Sent after the path when the runner has made the job's cgroup dirs and written their
/// limits ([`root_join`], see `runner::EarlyHelper::hand_over`): the helper only moves in.
pub const CGROUP_PREPARED: &[u8] = b"k";

/// The job dir's path as an early helper's runner sends it (up to [`END_OF_PATH`] or
/// EOF), and what follows it on the socket; None for nothing (cancelled) or a failed
/// read.
fn read_job_dir(pipe: OwnedFd) -> Option<(std::path::PathBuf, HandOver)> {
    use std::io::BufRead;
    use std::os::unix::ffi::OsStringExt;
    let mut rest = std::io::BufReader::new(std::fs::File::from(pipe));
    let mut bytes = Vec::new();
    rest.read_until(END_OF_PATH, &mut bytes).ok()?;
    if bytes.last() == Some(&END_OF_PATH) {
        bytes.pop();
    }
    (!bytes.is_empty()).then(|| (std::ffi::OsString::from_vec(bytes).into(), HandOver(rest)))
}

/// The rest of an early helper's socket after its job dir's path: read when the helper
/// comes to the job's cgroup.
pub struct HandOver(std::io::BufReader<std::fs::File>);

impl HandOver {
    /// Whether the runner prepared the job's cgroup ([`CGROUP_PREPARED`], then EOF).
    /// Anything else (EOF at once: it did not, or could not) leaves all of it to the
    /// helper, whose own attempt then fails with the typed error if it fails again.
    fn cgroup_prepared(mut self) -> bool {
        let mut word = Vec::new();
        std::io::Read::read_to_end(&mut self.0, &mut word).is_ok() && word == CGROUP_PREPARED
    }
}

fn report_failure(job: &JobDir, result: Option<OwnedFd>, e: anyhow::Error) -> i32 {
    let result_of = into_result(Err(e));
    Reporter::new(result).report(job, &result_of);
    exit_code(&result_of)
}

fn run_and_report(
    home: &Home,
    job: &JobDir,
    pipes: Pipes,
    container: &mut Libcontainer,
    early: Option<(FirstSteps, HandOver)>,
) -> i32 {
    let reporter = Reporter::new(pipes.result);
    let (first, hand_over) = early.unzip();
    let start = Start { go: pipes.go, first, hand_over };
    let result = into_result(run(home, job, CgroupHost::get(), &sys::Real, container, &reporter, start));
    let code = exit_code(&result);
    // A failure's (a result sent already is not sent again).
    reporter.report(job, &result);
    code
}

/// How a helper came to [`run`] its job: a prepared one with its go pipe, an early one
/// with its first steps taken and the rest of its runner's word.
#[derive(Default)]
struct Start {
    go: Option<OwnedFd>,
    first: Option<FirstSteps>,
    hand_over: Option<HandOver>,
}

/// What a helper does first whatever its job: the container's stdio, no supplementary
/// groups, a private mount namespace, the job's IPC namespace and, for a `none` job, its
/// network namespace (see [`super::network::begin`]). An early helper takes them while
/// its runner plans.
pub struct FirstSteps {
    /// The job's network mode they were taken for.
    network: Network,
    /// A `none` job's namespace, under way.
    loopback: Option<sys::net::Made>,
}

fn first_steps(
    home: &Home,
    network: Network,
    sys: &dyn Sys,
    container: &mut dyn Container,
    started: Option<OwnedFd>,
) -> Result<FirstSteps> {
    container.prepare_stdio()?;
    sys.clear_groups()?;
    sys.private_mount_namespace()?;
    // For the container to inherit, and the tree's /dev/mqueue (see treemount). Its own
    // work (~0.1 ms here) is done before the plan comes.
    sys.own_ipc_namespace()?;
    let loopback = super::network::begin(network, &super::jobdir::net_dir(&home.mount_point()), sys, started)?;
    Ok(FirstSteps { network, loopback })
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

/// Ends the result on the result pipe, which stays open after it for [`DONE`] (compact
/// JSON holds no raw newline).
pub const END_OF_RESULT: u8 = b'\n';
/// The helper's last word on the result pipe, after the result: the container is
/// deleted and the helper is out of the job's cgroups (see `Sys::leave_cgroup`), so the
/// runner may tear the job down while this process exits. EOF without it: the runner
/// waits for the helper's exit first.
pub const DONE: &[u8] = b"d";

struct Reporter {
    fd: std::cell::Cell<Option<OwnedFd>>,
    reported: std::cell::Cell<bool>,
}

impl Reporter {
    fn new(fd: Option<OwnedFd>) -> Reporter {
        Reporter { fd: std::cell::Cell::new(fd), reported: std::cell::Cell::new(false) }
    }

    /// Writes the result file, then sends it on the pipe, once: after [`Reporter::done`]
    /// nothing may touch the job dir, which the runner is removing.
    fn report(&self, job: &JobDir, result: &HelperResult) {
        if self.reported.replace(true) {
            return;
        }
        let mut bytes = serde_json::to_vec(result).unwrap_or_default();
        if let Err(e) = std::fs::write(job.result_file(), &bytes) {
            eprintln!("azp-sandbox helper: cannot write {}: {e}", job.result_file().display());
        }
        if let Some(fd) = self.fd.take() {
            let mut f = std::fs::File::from(fd);
            bytes.push(END_OF_RESULT);
            let _ = std::io::Write::write_all(&mut f, &bytes);
            self.fd.set(Some(f.into()));
        }
    }

    /// Sends [`DONE`] and closes the pipe.
    fn done(&self) {
        if let Some(fd) = self.fd.take() {
            let _ = std::io::Write::write_all(&mut std::fs::File::from(fd), DONE);
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
    start: Start,
) -> Result<HelperResult> {
    let Start { go, first, hand_over } = start;
    let plan = job.read_plan()?;
    let merged = job.merged();
    let first = match first {
        Some(f) if f.network == plan.network => f,
        Some(f) => anyhow::bail!("the helper started for a {} network, the job's is {}", f.network, plan.network),
        None => first_steps(home, plan.network, sys, container, None)?,
    };
    let (mut plan, mut network) = super::network::enter(plan, job, sys, first.loopback)?;
    // Held (locked against gc) until this helper exits with the job.
    let _edit_layer = if editlayer::wanted(&plan.edits) {
        let layer = editlayer::obtain(home, &plan, sys)?;
        layer.stack_on(&mut plan);
        Some(layer)
    } else {
        None
    };
    // The fd keeps the job's user namespace alive until libcontainer has joined it.
    let userns = own_ids(&mut plan, job, sys)?;
    sys.mount_overlay(&Overlay {
        lower: plan.lower.clone(),
        upper: job.upper(),
        work: job.work(),
        target: merged.clone(),
        userxattr: plan.rootless,
    })?;
    // What the layer holds when there is one; with CDI hooks, made in the job's own layer.
    editlayer::write_edits(&merged, &plan.edits)?;
    let (uid, gid) = outside_ids(&plan, plan.uid, plan.gid)?;
    for dir in &plan.owned_dirs {
        inroot::create_owned_dir(&merged, dir, uid, gid)
            .with_context(|| format!("cannot give {} to uid {} in the sandbox", dir.display(), plan.uid))?;
    }
    if let Some(scratch) = &plan.scratch {
        sys.give_dir(&scratch.host, uid, gid)?;
    }
    // Held (gc leaves those snapshots) until this helper exits with the job.
    let _snapshots = cachemount::mount_all(&plan, job, sys, userns.as_ref().map(|n| n.as_fd()), (uid, gid))?;
    // /dev, /dev/shm, /tmp, /etc/resolv.conf, the init...: here, not in the spec (see
    // treemount), their tmpfs roots the job's root's as if it had mounted them.
    let root_ids = outside_ids(&plan, 0, 0)?;
    let mut mounts = treemount::list(&plan, root_ids)?;
    let network_mounts = treemount::split_off_network(&plan, &mut mounts);
    treemount::mount_all(&merged, &mounts, root_ids, sys)?;
    // The job's network namespace, made meanwhile by a child, with its sysfs; then that.
    if let Some(n) = network.as_mut() {
        n.enter(sys)?;
    }
    treemount::mount_all(&merged, &network_mounts, root_ids, sys)?;
    tracing::debug!(job = %plan.id, "overlay and tree mounted");
    // The cgroup last, right before the container: the kernel makes the first move of a
    // process into a cgroup after a quiet spell wait for an RCU grace period (5-15 ms
    // here), and the moves that follow within about a grace period do not wait. Joined
    // here, libcontainer's move of the job's init into its leaf comes within that window;
    // joined before the mounts, it often came after it and waited a second time.
    let pasta = network.as_ref().and_then(|n| n.pasta_pid());
    let (cgroup_owner, mut way_back) = enter_job_cgroup(&plan, cgroups, sys, hand_over, pasta)?;

    let mut spec = spec::build(&plan, &merged, &cgroup_owner)?;
    if !plan.caches.is_empty() {
        let mut mounts = spec.mounts().clone().unwrap_or_default();
        mounts.extend(cachemount::spec_mounts(&plan, job)?);
        spec.set_mounts(Some(mounts));
    }
    if let Some(ns) = &userns {
        spec::join_user_namespace(&mut spec, &Path::new("/proc/self/fd").join(ns.as_raw_fd().to_string()))?;
    }
    spec.save(job.bundle().join("config.json")).context("cannot write the OCI spec")?;

    container.create(&plan, job)?;
    tracing::debug!(job = %plan.id, "container created");
    // Created but never started: its init goes, then the container.
    let undo = |container: &mut dyn Container| {
        container.kill_unreaped_init();
        let _ = container.delete();
    };
    // A veth configured meanwhile (in a child: see `sys::net::isolate`) must be ready
    // before the job runs.
    let ready = record_init(job, container.init_pid())
        .and_then(|()| network.as_mut().map_or(Ok(None), |n| n.finish(&plan.id, sys)));
    let mut guard = match ready {
        Ok(guard) => guard,
        Err(e) => {
            undo(container);
            return Err(e);
        }
    };
    let tracked = network.as_ref().and_then(|n| n.tracked(&plan.net));
    if let Some(t) = &tracked {
        // The job's address was a killed job's, whose helper did not forget its
        // connections: forgotten now, or this job would get their replies.
        match super::network::forget::before_its_job(t, sys) {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(job = %plan.id, "forgot {n} tracked connections a killed job left on this job's address")
            }
            Err(e) => {
                undo(container);
                return Err(e);
            }
        }
        // Until this helper forgets them after the job, a clean-up after its death does.
        // Written before the go (a prepared sandbox's start waits on nothing more).
        if let Err(e) = super::network::forget::record(&job.connections_file(), t) {
            tracing::warn!(job = %plan.id, "{e:#}: if this helper is killed, the job's tracked connections expire on their own");
        }
    }
    if !wait_for_go(go) {
        undo(container);
        let _ = sys.unmount(&merged);
        // Its job made no connection.
        if let Some(t) = &tracked {
            super::network::forget::forgotten(&job.connections_file(), t);
        }
        return Err(SandboxError::new(FailureKind::Cancelled, "cancelled before start").into());
    }
    // The user namespace's child, killed when its namespace was made, is gone by now:
    // reaped before the job's wait reaps whatever exits (see `sys::process::reap_killed`).
    if let Err(e) = sys::process::reap_killed() {
        tracing::debug!(job = %plan.id, "the user namespace's child: {e}");
    }
    // From here on the container exists: whatever happens, delete it. Once the job runs,
    // its init and all it forks are in the job's cgroup: the helper goes back to its
    // runner's, so that the runner may remove the job's while this process exits.
    let mut left = false;
    let outcome = container.start_and_wait(
        &mut || {
            let Some(back) = way_back.take() else { return };
            match sys.leave_cgroup(back) {
                Ok(()) => left = true,
                // Not expected (the helper opened its way back before it entered): the
                // job's limits then bind the helper too, and its cgroup goes only once
                // the helper is reaped. Said, not fatal: the job runs as it would. On
                // cgroup v2, a kernel without the fix for CVE-2021-4197 checks the move
                // against the helper's current cgroup namespace (the job's by then)
                // rather than the one the way back was opened in: there it may fail
                // for every job.
                Err(e) => tracing::warn!(
                    job = %plan.id,
                    "the sandbox helper could not leave the job's cgroup ({}): the job's pids and memory limits apply to the helper too until the job ends",
                    e.with_causes()
                ),
            }
        },
        &mut || guard.as_mut().map_or(Ok(()), |g| g.tend()),
    );
    tracing::debug!(job = %plan.id, "job exited");
    if let Ok(r) = &outcome {
        reporter.report(job, r);
    }
    let deleted = container.delete();
    if let Err(e) = &deleted {
        tracing::warn!(job = %plan.id, "libcontainer delete failed ({e}); gc will finish the clean-up");
    }
    // A rootless job's connections end on the host in its pasta's sockets: set to reset
    // as pasta stops (with data unsent they would live on there, orphaned, for minutes),
    // before the job's own sockets, aborted next, make pasta close some of them itself.
    if let Some(pid) = pasta {
        if let Err(e) = sys.linger_pasta(pid) {
            tracing::warn!(job = %plan.id, "{}: connections of the job may outlive it on the host", e.with_causes());
        }
    }
    // What the job's connections left in its namespace (see below), counted and aborted
    // while its pasta still runs.
    let outliving = network.as_mut().and_then(|n| n.outliving_connections(&plan.id, sys));
    // Its job is gone, and it is in the job's cgroup: gone too before the runner removes
    // that (its death signal would come only with this process's exit, racing the runner).
    if let Some(pid) = pasta {
        if let Err(e) = sys.stop_pasta(pid) {
            tracing::warn!(job = %plan.id, "{}; the job's clean-up kills it", e.with_causes());
        }
    }
    // A connection of the job's that outlives it (an orphaned socket still sending to a
    // far end that no longer answers, or keeps its window shut: for minutes) holds the
    // job's namespace and so its link, past the job and past gc's wait for dying links
    // (a CI rehearsal: a `run`'s last job), and a place in the node's one budget of
    // orphans (a red-team class: a slot's jobs one after another add them up). Such
    // sockets are aborted (their far ends get a reset) and the link goes now, as a killed
    // job's does (see `forget::left_by_a_killed_helper`): they can send nothing more, and
    // the forgetting below is final. Without such sockets the link goes with the
    // namespace, as the kernel tears it down (removing it here would wait for a normal
    // RCU grace period in every job: `rcu_barrier` of the device's unregistration). A
    // connection still closing as the job ends (its FIN not yet acknowledged) counts
    // too: that job's end then pays for the removal.
    if let Some(t) = tracked.as_ref() {
        if let Some(super::network::Outliving { left: left @ 1.., aborted }) = outliving {
            match sys.remove_job_link(&t.connections.link) {
                Ok(_) => tracing::info!(
                    job = %plan.id,
                    "{left} TCP connection(s) of the job outlived it: {}removed its link {} now",
                    if aborted { "aborted them and " } else { "" },
                    t.connections.link
                ),
                Err(e) => tracing::warn!(job = %plan.id, "{}: it goes once they end", e.with_causes()),
            }
        }
    }
    // The host's conntrack entries of the job's connections: they outlive its link, and a
    // server of the job's that keeps answering would keep them for days, counted against
    // no job (a review: jobs one after another filled the host's table).
    if let Some(t) = tracked {
        match sys.forget_connections(&t.connections, crate::sys::net::Look::IfCounted) {
            Ok(f) if f.entries == 0 => {}
            Ok(f) => tracing::debug!(job = %plan.id, "forgot the job's {} tracked connections", f.entries),
            Err(e) => tracing::warn!(job = %plan.id, "{}: they expire on their own", e.with_causes()),
        }
        // Tried: a record is left only by a helper that did not get here.
        super::network::forget::forgotten(&job.connections_file(), &t);
    }
    // No unmount of the overlay here: it lives only in this process's mount namespace,
    // which the kernel tears down when we exit, before our parent's wait returns. An
    // unmount of its own costs one more RCU grace period (~0.7 ms per job measured).
    tracing::debug!(job = %plan.id, "container deleted");
    if left && outcome.is_ok() && deleted.is_ok() {
        reporter.done();
    }
    outcome
}

/// The job's own ids (see [`crate::identity`]): a user namespace with its maps, the lower
/// layers mounted idmapped with it in place of the plain ones (root mode: the rootfs's
/// root-owned files belong to the job's root), and the upper layer's root given to the
/// job's root (the overlay's root dir is the upper's). None: host ids.
fn own_ids(plan: &mut super::JobPlan, job: &JobDir, sys: &dyn Sys) -> Result<Option<OwnedFd>> {
    let Some(ids) = plan.userns.clone() else { return Ok(None) };
    let ns = sys.new_user_namespace(&ids.uid_map_text(), &ids.gid_map_text(), ids.owner())?;
    if ids.idmap_layers {
        for (k, layer) in plan.lower.iter_mut().enumerate() {
            let target = job.idmapped_lower(k);
            sys.idmap_layer(layer, ns.as_fd(), &target)?;
            *layer = target;
        }
    }
    let (uid, gid) = outside_ids(plan, 0, 0)?;
    sys.chown(&job.upper(), uid, gid)?;
    Ok(Some(ns))
}

/// The ids (host, or rootless: the process's namespace) of the job's `uid`/`gid`.
fn outside_ids(plan: &super::JobPlan, uid: u32, gid: u32) -> Result<(u32, u32)> {
    let Some(ids) = &plan.userns else { return Ok((uid, gid)) };
    match (ids.uid_outside(uid), ids.gid_outside(gid)) {
        (Some(u), Some(g)) => Ok((u, g)),
        _ => anyhow::bail!(
            "the job's user {uid}:{gid} is outside its user namespace (ids 0-65535): choose another --user"
        ),
    }
}

/// Puts the helper into the job's cgroup (see [`super::cgroup`]), so the job is born there,
/// and hides the host's cgroup tree from libcontainer. Root mode on a host without a
/// cgroup2 hierarchy leaves it all to libcontainer's v1 manager instead. Rootless without
/// delegation, the job gets no cgroup (the warning was printed at start). `hand_over`:
/// an early helper's, which may say that its runner made the dirs and wrote the limits.
/// `pasta`: the job's (rootless), which joins it too (found by a red-team pass: in its
/// runner's cgroup, pasta's CPU and socket buffers for the job's traffic were no job's).
fn enter_job_cgroup(
    plan: &super::JobPlan,
    host: &CgroupHost,
    sys: &dyn Sys,
    hand_over: Option<HandOver>,
    pasta: Option<i32>,
) -> Result<(spec::CgroupOwner, Option<sys::WayBack>)> {
    use super::cgroup::{plan_join, Setup};
    if plan.rootless {
        if !plan.cgroup_path.as_os_str().is_empty() {
            let join = plan_join(host, &plan.cgroup_path, &plan.limits, &Setup::Rootless);
            sys.join_cgroup(&join)?;
            if let Some(pid) = pasta {
                sys.charge_pasta(&join, pid)?;
            }
        }
        sys.hide_cgroupfs()?;
        return Ok((spec::CgroupOwner::Helper { leaf: None }, None));
    }
    let Some(join) = root_join(plan, host)? else {
        return Ok((spec::CgroupOwner::Libcontainer { memsw: host.v1_memsw() }, None));
    };
    // Opened while the host's tree is in view. Without it the helper stays in the job's
    // cgroup until it exits, as it did before it could leave: nothing is lost but time.
    let way_back = (!join.back.is_empty()).then(|| sys.open_cgroup_way_back(&join)).transpose().unwrap_or_else(|e| {
        tracing::debug!(job = %plan.id, "no way back out of the job's cgroup: {}", e.with_causes());
        None
    });
    if hand_over.is_some_and(HandOver::cgroup_prepared) {
        sys.enter_cgroup(&join)?;
    } else {
        sys.join_cgroup(&join)?;
    }
    sys.hide_cgroupfs()?;
    Ok((spec::CgroupOwner::Helper { leaf: Some(JOB_CGROUP_LEAF.into()) }, way_back))
}

/// The cgroup a helper of a root job joins itself: its dirs in every hierarchy, its
/// device rules and limits (see [`super::cgroup::plan_join`]). None where it joins none
/// (rootless: see [`enter_job_cgroup`]) or libcontainer's v1 manager makes it (no
/// cgroup2 hierarchy mounted), or the job has no cgroup.
pub fn root_join(plan: &super::JobPlan, host: &CgroupHost) -> Result<Option<sys::CgroupJoin>> {
    use super::cgroup::{plan_join, Setup};
    if plan.rootless || host.v2_mount.is_none() || plan.cgroup_path.as_os_str().is_empty() {
        return Ok(None);
    }
    let setup = Setup::Root { device_rules: spec::v1_device_allow_lines(plan)? };
    Ok(Some(plan_join(host, &plan.cgroup_path, &plan.limits, &setup)))
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

#[cfg(test)]
mod tests {
    //! The helper's straight line on the doubles: `sys::Recorder` for the privileged
    //! steps, [`FakeContainer`] for libcontainer, both logging into one list.
    use super::*;
    use crate::edits::BindMount;
    use crate::sandbox::jobdir::{JobLock, JobState};
    use crate::sandbox::plan::test_plan;
    use crate::sandbox::JobPlan;
    use crate::sys::Recorder;
    use nix::errno::Errno;
    use std::path::PathBuf;

    /// libcontainer's part, logged into the recorder's list (failing where it says).
    struct FakeContainer<'a> {
        rec: &'a Recorder,
        /// libcontainer's text for a failed create.
        create_fails_with: Option<&'static str>,
    }

    impl FakeContainer<'_> {
        fn step(&self, name: &str) -> Result<()> {
            self.rec.step(name.into()).map_err(|e| anyhow::Error::new(e).context(format!("container {name}")))
        }
    }

    impl Container for FakeContainer<'_> {
        fn prepare_stdio(&mut self) -> Result<()> {
            self.step("prepare_stdio")
        }
        fn create(&mut self, plan: &JobPlan, _job: &JobDir) -> Result<()> {
            self.step("create")?;
            match self.create_fails_with {
                Some(text) => Err(super::super::container::create_error(text, &plan.args).into()),
                None => Ok(()),
            }
        }
        fn init_pid(&self) -> Option<i32> {
            // A live process, so that init.pid gets its start time.
            Some(std::process::id() as i32)
        }
        fn start_and_wait(
            &mut self,
            started: &mut dyn FnMut(),
            _tend: &mut dyn FnMut() -> Result<()>,
        ) -> Result<HelperResult> {
            self.step("start_and_wait")?;
            started();
            Ok(HelperResult::Exited { code: 3, signal: None })
        }
        fn kill_unreaped_init(&mut self) {
            let _ = self.step("kill_unreaped_init");
        }
        fn delete(&mut self) -> Result<()> {
            self.step("delete")
        }
    }

    struct Setup {
        _t: tempfile::TempDir,
        home: Home,
        job: JobDir,
        cgroups: CgroupHost,
        _lock: JobLock,
    }

    /// A recorded job as `Sandbox::create` leaves it, over an empty rootfs dir, as the
    /// calling user; cgroups in plain dirs of a hybrid host.
    fn setup(change: impl FnOnce(&mut JobPlan, &Path)) -> Setup {
        let t = tempfile::tempdir().unwrap();
        // Searchable, so that the jobs' mount point is made in it (see Home::mount_point).
        std::fs::set_permissions(t.path(), std::os::unix::fs::PermissionsExt::from_mode(0o711)).unwrap();
        std::fs::create_dir_all(t.path().join("xdg")).unwrap();
        let home = Home::for_caller(t.path().join("home"), false, Some(t.path().join("xdg")));
        home.ensure().unwrap();
        let lower = t.path().join("rootfs");
        std::fs::create_dir_all(&lower).unwrap();
        let mut plan = test_plan("hp-1", vec![lower], "/azp-test-hp/hp-1");
        plan.owned_dirs = vec!["/home/agent".into()];
        // The network's own steps: see `the_network_steps_per_mode`.
        plan.network = crate::config::Network::Host;
        change(&mut plan, t.path());
        let job = JobDir::new(&home, &plan.id);
        let mut state = JobState::for_plan(&job, &plan);
        let lock = job.create(&plan, &mut state, None).unwrap();
        let cg = t.path().join("cg");
        let cgroups = CgroupHost {
            unified: false,
            v1_mounts: vec![cg.join("memory")],
            root: cg.clone(),
            own_v2: None,
            own_v1: vec![],
            v2_mount: Some(cg.join("unified")),
        };
        Setup { _t: t, home, job, cgroups, _lock: lock }
    }

    impl Setup {
        fn run(&self, rec: &Recorder, create_fails_with: Option<&'static str>, go: Option<OwnedFd>) -> HelperResult {
            let mut container = FakeContainer { rec, create_fails_with };
            let reporter = Reporter::new(None);
            into_result(run(
                &self.home,
                &self.job,
                &self.cgroups,
                rec,
                &mut container,
                &reporter,
                Start { go, first: None, hand_over: None },
            ))
        }

        /// Where the step named `name` (its first word) is in [`Setup::steps`].
        fn pos(&self, name: &str) -> usize {
            self.steps().iter().position(|c| c.split(' ').next() == Some(name)).unwrap()
        }

        /// The helper's steps for a root job with a cgroup and no GPU edits.
        fn steps(&self) -> Vec<String> {
            let cg = |h: &str| self.cgroups.root.join(h).join("azp-test-hp/hp-1").display().to_string();
            vec![
                "prepare_stdio".into(),
                "clear_groups".into(),
                "private_mount_namespace".into(),
                "own_ipc_namespace".into(),
                format!("mount_overlay {}", self.job.merged().display()),
            ]
            .into_iter()
            .chain(self.tree_steps())
            .chain([
                format!("join_cgroup {} {}", cg("memory"), cg("unified")),
                "hide_cgroupfs".into(),
                "create".into(),
                "start_and_wait".into(),
                "delete".into(),
            ])
            .collect()
        }

        /// Where the tree's own mounts begin in [`Setup::steps`].
        fn tree_start(&self) -> usize {
            let first = self.tree_steps().remove(0);
            self.steps().iter().position(|c| *c == first).unwrap()
        }

        /// The tree's own mounts (see [`treemount`]) as the helper makes them for this job.
        fn tree_steps(&self) -> Vec<String> {
            let plan = self.job.read_plan().unwrap();
            let root = outside_ids(&plan, 0, 0).unwrap();
            let mut steps = vec![];
            for m in treemount::list(&plan, root).unwrap() {
                let dst = m.dst.display();
                match &m.what {
                    treemount::What::Fs { fstype, source, data } => {
                        steps.push(format!("{fstype}_in_tree {dst} {source} {:?} {data}", m.flags));
                        if m.what.chowned() {
                            steps.push(format!("chown_in_tree {dst} {}:{}", root.0, root.1));
                        }
                    }
                    treemount::What::Bind { from, .. } => {
                        steps.push(format!("bind_in_tree {} {dst}", from.display()));
                        steps.push(format!("restrict_in_tree {dst} {:?}", m.flags));
                    }
                }
            }
            steps
        }
    }

    fn failed(r: &HelperResult) -> (FailureKind, &str) {
        match r {
            HelperResult::Failed { kind, error } => (*kind, error.as_str()),
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[test]
    fn the_straight_line_in_order() {
        let s = setup(|_, _| {});
        let rec = Recorder::default();
        let r = s.run(&rec, None, None);
        assert_eq!(r, HelperResult::Exited { code: 3, signal: None });
        assert_eq!(rec.calls(), s.steps());
        // What the steps between the mounts and the container wrote.
        assert!(s.job.bundle().join("config.json").is_file(), "the spec");
        assert!(s.job.merged().join("home/agent").is_dir(), "the owned dir, made in the tree");
        let init = std::fs::read_to_string(s.job.init_file()).unwrap();
        assert!(init.starts_with(&format!("{} ", std::process::id())), "init.pid for gc: {init}");
        let reported: HelperResult = serde_json::from_slice(&std::fs::read(s.job.result_file()).unwrap()).unwrap();
        assert_eq!(reported, r, "reported as soon as the job exited, before the delete");
    }

    #[test]
    fn a_root_helper_goes_back_to_its_cgroups_once_the_job_runs_and_says_done_last() {
        let mut s = setup(|_, _| {});
        s.cgroups.own_v1 = vec![("memory".into(), "/svc".into())];
        s.cgroups.own_v2 = Some("/svc".into());
        let run = |rec: &Recorder| {
            let (rx, tx) = nix::unistd::pipe().unwrap();
            let reporter = Reporter::new(Some(tx));
            let mut container = FakeContainer { rec, create_fails_with: None };
            let start = Start::default();
            let r = into_result(run(&s.home, &s.job, &s.cgroups, rec, &mut container, &reporter, start));
            drop(reporter);
            let mut sent = Vec::new();
            std::io::Read::read_to_end(&mut std::fs::File::from(rx), &mut sent).unwrap();
            (r, sent)
        };
        let rec = Recorder::default();
        let (r, sent) = run(&rec);
        let calls = rec.calls();
        let back = format!(
            "open_cgroup_way_back {} {}",
            s.cgroups.root.join("memory/svc").display(),
            s.cgroups.root.join("unified/svc").display()
        );
        let mut expected = s.steps();
        expected.insert(s.pos("join_cgroup"), back);
        expected.insert(expected.iter().position(|c| c == "start_and_wait").unwrap() + 1, "leave_cgroup".into());
        assert_eq!(calls, expected, "opened before the join, left once the job runs, before the delete");
        let mut result = serde_json::to_vec(&r).unwrap();
        result.push(END_OF_RESULT);
        result.extend_from_slice(DONE);
        assert_eq!(String::from_utf8_lossy(&sent), String::from_utf8_lossy(&result), "the result, then DONE");

        // A helper that could not leave stays in the job's cgroup: no DONE (its runner
        // waits for its exit before it removes the cgroup).
        let leave = calls.iter().position(|c| c == "leave_cgroup").unwrap();
        let rec = Recorder::failing_at(leave, nix::errno::Errno::EBUSY);
        let (r, sent) = run(&rec);
        assert_eq!(r, HelperResult::Exited { code: 3, signal: None }, "the job's result all the same");
        assert_eq!(sent.last(), Some(&END_OF_RESULT), "{}", String::from_utf8_lossy(&sent));
        // Nor after a failed delete (the runner's clean-up finds what is left, after
        // the helper's exit).
        let delete = calls.iter().position(|c| c == "delete").unwrap();
        let (_, sent) = run(&Recorder::failing_at(delete, nix::errno::Errno::EIO));
        assert_eq!(sent.last(), Some(&END_OF_RESULT));
        // Nor without a way back: the job runs, the helper stays.
        let at = calls.iter().position(|c| c.starts_with("open_cgroup_way_back")).unwrap();
        let rec = Recorder::failing_at(at, nix::errno::Errno::EACCES);
        let (r, sent) = run(&rec);
        assert_eq!(r, HelperResult::Exited { code: 3, signal: None });
        assert!(!rec.calls().contains(&"leave_cgroup".to_string()), "{:?}", rec.calls());
        assert_eq!(sent.last(), Some(&END_OF_RESULT));
    }

    #[test]
    fn an_early_helper_takes_the_same_steps_its_first_ones_before_the_plan() {
        use crate::config::Network;
        for network in [Network::None, Network::Isolated, Network::Host] {
            let s = setup(|p, _| p.network = network);
            let late = Recorder::default();
            assert_eq!(s.run(&late, None, None), HelperResult::Exited { code: 3, signal: None });
            let early = Recorder::default();
            let mut container = FakeContainer { rec: &early, create_fails_with: None };
            let first = first_steps(&s.home, network, &early, &mut container, None).unwrap();
            let before_plan = early.calls();
            let reporter = Reporter::new(None);
            let start = Start { go: None, first: Some(first), hand_over: None };
            let r = into_result(run(&s.home, &s.job, &s.cgroups, &early, &mut container, &reporter, start));
            assert_eq!(r, HelperResult::Exited { code: 3, signal: None }, "{network}");
            assert_eq!(early.calls(), late.calls(), "{network}: the same line");
            // Before the plan: up to the IPC namespace, and a `none` job's network.
            let upto = late.calls().iter().position(|c| c == "own_ipc_namespace").unwrap() + 1;
            let more = if network == Network::None { 2 } else { 0 };
            assert_eq!(before_plan, late.calls()[..upto + more], "{network}");
            if network == Network::None {
                assert_eq!(before_plan.last().map(String::as_str), Some("isolate_network loopback"));
            }
        }
        // A `none` namespace its runner started: adopted in place of made, the rest alike.
        let s = setup(|p, _| p.network = Network::None);
        let late = Recorder::default();
        s.run(&late, None, None);
        let early = Recorder::default();
        let mut container = FakeContainer { rec: &early, create_fails_with: None };
        let (started, _runner_end) = std::os::unix::net::UnixStream::pair().unwrap();
        let first = first_steps(&s.home, Network::None, &early, &mut container, Some(started.into())).unwrap();
        let reporter = Reporter::new(None);
        let start = Start { go: None, first: Some(first), hand_over: None };
        let r = into_result(run(&s.home, &s.job, &s.cgroups, &early, &mut container, &reporter, start));
        assert_eq!(r, HelperResult::Exited { code: 3, signal: None });
        let expected: Vec<String> = late
            .calls()
            .iter()
            .map(|c| if c == "isolate_network loopback" { "adopt_network loopback".to_string() } else { c.clone() })
            .collect();
        assert_ne!(expected, late.calls());
        assert_eq!(early.calls(), expected);
        // Started for another mode than its job's: the job fails, nothing more is done.
        let s = setup(|p, _| p.network = Network::Isolated);
        let rec = Recorder::default();
        let mut container = FakeContainer { rec: &rec, create_fails_with: None };
        let first = first_steps(&s.home, Network::None, &rec, &mut container, None).unwrap();
        let steps = rec.calls().len();
        let reporter = Reporter::new(None);
        let start = Start { go: None, first: Some(first), hand_over: None };
        let r = into_result(run(&s.home, &s.job, &s.cgroups, &rec, &mut container, &reporter, start));
        let (_, error) = failed(&r);
        assert!(error.contains("the helper started for a none network, the job's is isolated"), "{error}");
        assert_eq!(rec.calls().len(), steps, "{:?}", rec.calls());
    }

    /// What an early helper reads from a socket on which its runner sent `sent`, then EOF:
    /// the job dir, and whether the cgroup was prepared.
    fn hand_over_of(sent: &[u8]) -> Option<(std::path::PathBuf, bool)> {
        use std::io::Write;
        let (tx, rx) = std::os::unix::net::UnixStream::pair().unwrap();
        (&tx).write_all(sent).unwrap();
        drop(tx);
        read_job_dir(rx.into()).map(|(dir, rest)| (dir, rest.cgroup_prepared()))
    }

    #[test]
    fn an_early_helper_reads_its_job_dir_then_the_runners_word() {
        let path = "/run/azp-sandbox/h-1/jobs/exec-1";
        let dir = std::path::PathBuf::from(path);
        assert_eq!(hand_over_of(format!("{path}\0k").as_bytes()), Some((dir.clone(), true)));
        // EOF after the path: the runner made no cgroup (or could not).
        assert_eq!(hand_over_of(format!("{path}\0").as_bytes()), Some((dir.clone(), false)));
        assert_eq!(hand_over_of(path.as_bytes()), Some((dir.clone(), false)));
        // Anything but the word is not it.
        assert_eq!(hand_over_of(format!("{path}\0kk").as_bytes()), Some((dir.clone(), false)));
        assert_eq!(hand_over_of(format!("{path}\0x").as_bytes()), Some((dir, false)));
        // Nothing before EOF: the plan failed.
        assert_eq!(hand_over_of(b""), None);
        assert_eq!(hand_over_of(b"\0"), None);
    }

    #[test]
    fn an_early_helper_moves_into_the_cgroup_its_runner_prepared() {
        use std::io::Write;
        use std::os::unix::net::UnixStream;
        let s = setup(|_, _| {});
        let late = Recorder::default();
        s.run(&late, None, None);
        let word = |sent: &[u8]| {
            let (tx, rx) = UnixStream::pair().unwrap();
            (&tx).write_all(sent).unwrap();
            HandOver(std::io::BufReader::new(std::fs::File::from(OwnedFd::from(rx))))
        };
        let run_early = |hand_over: HandOver| {
            let rec = Recorder::default();
            let mut container = FakeContainer { rec: &rec, create_fails_with: None };
            let first = first_steps(&s.home, s.job.read_plan().unwrap().network, &rec, &mut container, None).unwrap();
            let reporter = Reporter::new(None);
            let start = Start { go: None, first: Some(first), hand_over: Some(hand_over) };
            let r = into_result(run(&s.home, &s.job, &s.cgroups, &rec, &mut container, &reporter, start));
            assert_eq!(r, HelperResult::Exited { code: 3, signal: None });
            rec.calls()
        };
        // Prepared: the same line, its join only the move.
        let expected: Vec<String> = late.calls().iter().map(|c| c.replace("join_cgroup ", "enter_cgroup ")).collect();
        assert_ne!(expected, late.calls());
        assert_eq!(run_early(word(b"k")), expected);
        // Not prepared: all of it, as a late helper does.
        assert_eq!(run_early(word(b"")), late.calls());
        // A rootless job's cgroup is its helper's whatever the socket says (its runner
        // sends no word: see `runner::prepare_job_cgroup`).
        let s = setup(|p, _| p.rootless = true);
        let rec = Recorder::default();
        let mut container = FakeContainer { rec: &rec, create_fails_with: None };
        let first = first_steps(&s.home, s.job.read_plan().unwrap().network, &rec, &mut container, None).unwrap();
        let reporter = Reporter::new(None);
        let start = Start { go: None, first: Some(first), hand_over: Some(word(b"k")) };
        into_result(run(&s.home, &s.job, &s.cgroups, &rec, &mut container, &reporter, start));
        assert!(rec.calls().iter().any(|c| c.starts_with("join_cgroup ")), "{:?}", rec.calls());
        assert!(!rec.calls().iter().any(|c| c.starts_with("enter_cgroup ")), "{:?}", rec.calls());
    }

    #[test]
    fn only_a_root_job_with_a_cgroup2_view_has_a_cgroup_its_runner_may_prepare() {
        let s = setup(|_, _| {});
        let plan = s.job.read_plan().unwrap();
        let join = root_join(&plan, &s.cgroups).unwrap().expect("root, cgroup2 mounted");
        let dirs: Vec<_> = join.dirs.iter().map(|d| d.dir.clone()).collect();
        assert_eq!(
            dirs,
            [s.cgroups.root.join("memory/azp-test-hp/hp-1"), s.cgroups.root.join("unified/azp-test-hp/hp-1")]
        );
        let mut rootless = plan.clone();
        rootless.rootless = true;
        assert!(root_join(&rootless, &s.cgroups).unwrap().is_none());
        let mut no_cgroup = plan.clone();
        no_cgroup.cgroup_path = PathBuf::new();
        assert!(root_join(&no_cgroup, &s.cgroups).unwrap().is_none());
        let mut v1_only = s.cgroups.clone();
        v1_only.v2_mount = None;
        assert!(root_join(&plan, &v1_only).unwrap().is_none(), "libcontainer's v1 manager makes it");
    }

    #[test]
    fn a_scratch_dir_is_given_to_the_job_user_before_the_container() {
        let s = setup(|plan, t| {
            plan.uid = 1000;
            plan.gid = 1001;
            plan.scratch =
                Some(crate::sandbox::ScratchDir { host: t.join("nvme/hp-1"), container: "/azp/agent/_work".into() });
        });
        let rec = Recorder::default();
        s.run(&rec, None, None);
        let mut want = s.steps();
        let at = s.tree_start();
        let host = s._t.path().join("nvme/hp-1");
        want.insert(at, format!("give_dir {} 1000:1001", host.display()));
        assert_eq!(rec.calls(), want);
        // Refused: the line ends there, before any container.
        let rec = Recorder::failing_at(at, Errno::EPERM);
        let (kind, error) = match s.run(&rec, None, None) {
            HelperResult::Failed { kind, error } => (kind, error),
            other => panic!("{other:?}"),
        };
        assert_eq!(kind, FailureKind::Other);
        assert!(error.starts_with(&format!("cannot give {} to uid 1000 gid 1001", host.display())), "{error}");
        assert_eq!(rec.calls(), want[..=at]);
    }

    #[test]
    fn a_failed_step_ends_the_line_and_only_a_created_container_is_deleted() {
        let s = setup(|_, _| {});
        let all = s.steps();
        for k in 0..all.len() {
            let rec = Recorder::failing_at(k, Errno::EIO);
            let r = s.run(&rec, None, None);
            let calls = rec.calls();
            match all[k].as_str() {
                // The job ran; a failed delete is only logged (gc finishes it).
                "delete" => {
                    assert_eq!(r, HelperResult::Exited { code: 3, signal: None });
                    assert_eq!(calls, all);
                }
                // The container exists: deleted all the same.
                "start_and_wait" => {
                    assert_eq!(failed(&r).0, FailureKind::Other);
                    assert_eq!(calls, all, "delete follows a failed start");
                }
                // Before the container: nothing after the failed step, nothing undone
                // here (the mounts go with the helper's namespace, the cgroup with the
                // runner's teardown).
                step => {
                    let (kind, error) = failed(&r);
                    assert_eq!(calls, all[..=k], "{step}");
                    assert_eq!(kind, FailureKind::Other, "{step}: EIO is no kind of its own");
                    let cause = error.ends_with("EIO: I/O error") || error.ends_with("Input/output error (os error 5)");
                    assert!(cause, "{step}: the cause is named: {error}");
                }
            }
        }
    }

    #[test]
    fn failures_are_reported_by_kind() {
        let s = setup(|_, _| {});
        let overlay = s.steps().iter().position(|c| c.starts_with("mount_overlay")).unwrap();
        let r = s.run(&Recorder::failing_at(overlay, Errno::ENOENT), None, None);
        let (kind, error) = failed(&r);
        assert_eq!(kind, FailureKind::RootfsMissing);
        assert!(
            error.starts_with(&format!("cannot mount the job's overlay on {}", s.job.merged().display())),
            "{error}"
        );
        let r = s.run(&Recorder::failing_at(s.pos("join_cgroup"), Errno::ENOSPC), None, None);
        assert_eq!(failed(&r).0, FailureKind::DiskFull, "the cgroup join, out of space");
        let r = s.run(&Recorder::failing_at(s.pos("private_mount_namespace"), Errno::EPERM), None, None);
        assert_eq!(failed(&r).0, FailureKind::NotPermitted);
        let r = s.run(&Recorder::default(), Some("failed: executable 'true' not found in $PATH"), None);
        let (kind, error) = failed(&r);
        assert_eq!(kind, FailureKind::CommandNotFound);
        assert!(error.starts_with("cannot create the sandbox: command 'true' not found in the sandbox's rootfs"));
        assert_eq!(exit_code(&r), 125);
    }

    #[test]
    fn a_prepared_sandbox_waits_for_go_and_a_cancel_undoes_the_container() {
        let s = setup(|_, _| {});
        let (rx, tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        drop(tx); // EOF: cancelled
        let rec = Recorder::default();
        let r = s.run(&rec, None, Some(rx));
        assert_eq!(r, HelperResult::Failed { kind: FailureKind::Cancelled, error: "cancelled before start".into() });
        let mut expected = s.steps()[..=s.pos("create")].to_vec();
        expected.extend(["kill_unreaped_init".into(), "delete".into()]);
        expected.push(format!("unmount {}", s.job.merged().display()));
        assert_eq!(rec.calls(), expected);
        let (rx, tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        std::io::Write::write_all(&mut std::fs::File::from(tx), b"g").unwrap();
        let rec = Recorder::default();
        assert_eq!(s.run(&rec, None, Some(rx)), HelperResult::Exited { code: 3, signal: None });
        assert_eq!(rec.calls(), s.steps());
    }

    #[test]
    fn which_cgroup_steps_a_job_takes() {
        // Rootless with a delegated cgroup: joined, then hidden.
        let s = setup(|p, _| p.rootless = true);
        let rec = Recorder::default();
        s.run(&rec, None, None);
        let calls = rec.calls();
        // Last before the container (see `run`).
        let before_create = calls.iter().position(|c| c == "create").unwrap();
        assert!(
            calls[before_create - 2].starts_with("join_cgroup ") && calls[before_create - 1] == "hide_cgroupfs",
            "{calls:?}"
        );
        // Rootless without one: only hidden.
        let s = setup(|p, _| {
            p.rootless = true;
            p.cgroup_path = PathBuf::new();
        });
        let rec = Recorder::default();
        s.run(&rec, None, None);
        let calls = rec.calls();
        let before_create = calls.iter().position(|c| c == "create").unwrap();
        assert_eq!(calls[before_create - 1], "hide_cgroupfs");
        assert!(!calls.iter().any(|c| c.starts_with("join_cgroup")), "{calls:?}");
        // Root on a host without cgroup2: libcontainer's v1 manager does it all.
        let mut s = setup(|_, _| {});
        s.cgroups.v2_mount = None;
        let rec = Recorder::default();
        s.run(&rec, None, None);
        let calls = rec.calls();
        assert!(!calls.iter().any(|c| c.starts_with("join_cgroup") || c == "hide_cgroupfs"), "{calls:?}");
        assert!(calls.iter().any(|c| c.starts_with("mount_overlay ")), "{calls:?}");
    }

    #[test]
    fn each_cache_is_an_overlay_of_its_snapshot_bound_at_its_path() {
        use crate::cache::CacheMount;
        use crate::identity::JobIds;
        let cache = |t: &Path, name: &str, at: &str| CacheMount {
            name: name.into(),
            store: t.join("home/caches").join(name),
            container: at.into(),
            commit: false,
            max_size: None,
        };
        for idmapped in [false, true] {
            let s = setup(|p, t| {
                p.uid = 1000;
                p.gid = 1000;
                p.owned_dirs = vec![];
                p.caches = vec![cache(t, "pip", "/root/.cache/pip"), cache(t, "cc", "/ccache")];
                if idmapped {
                    p.userns = Some(JobIds::block(2, (400_000, 400_000), (1000, 1000)));
                }
            });
            let plan = s.job.read_plan().unwrap();
            let rec = Recorder::default();
            assert_eq!(s.run(&rec, None, None), HelperResult::Exited { code: 3, signal: None });
            let dir = s.job.caches_dir();
            let owner = if idmapped { "401000:401000" } else { "1000:1000" };
            let mut steps = vec![format!("mount_cache_dir {}", dir.display())];
            for (k, c) in plan.caches.iter().enumerate() {
                if idmapped {
                    let snapshot = c.store.join("snapshots/1");
                    steps.push(format!(
                        "idmap_layer {} {}",
                        snapshot.display(),
                        dir.join(format!("{k}-lower")).display()
                    ));
                }
                steps.push(format!("chown {} {owner}", cachemount::upper(&s.job, k).display()));
                steps.push(format!("mount_overlay {}", dir.join(k.to_string()).display()));
            }
            // After the job's own overlay, before the IPC namespace and the tree's own
            // mounts, the cgroup and the container.
            let calls = rec.calls();
            let at = calls.iter().position(|c| c == &s.tree_steps()[0]).unwrap();
            assert_eq!(calls[at - steps.len()..at], steps[..], "idmapped={idmapped}");
            assert!(calls[at - steps.len() - 1].starts_with(&format!("mount_overlay {}", s.job.merged().display())));
            // The spec binds each at its path, last (after /tmp and the volumes).
            let spec = oci_spec::runtime::Spec::load(s.job.bundle().join("config.json")).unwrap();
            let mounts = spec.mounts().as_ref().unwrap();
            let last: Vec<(String, String)> = mounts[mounts.len() - 2..]
                .iter()
                .map(|m| (m.destination().display().to_string(), m.source().as_ref().unwrap().display().to_string()))
                .collect();
            assert_eq!(
                last,
                [
                    ("/root/.cache/pip".to_string(), dir.join("0").display().to_string()),
                    ("/ccache".to_string(), dir.join("1").display().to_string())
                ]
            );
            // Each step failing ends the line there: no container.
            for k in 0..steps.len() {
                let rec = Recorder::failing_at(at - steps.len() + k, Errno::EINVAL);
                let r = s.run(&rec, None, None);
                let error = failed(&r).1.to_string();
                assert!(!rec.calls().iter().any(|c| c == "create"), "step {k}: {error}");
                if steps[k].starts_with("mount_overlay") {
                    assert!(error.contains("must be on a filesystem overlayfs supports"), "{error}");
                }
            }
        }
    }

    #[test]
    fn a_job_with_ids_of_its_own_gets_its_namespace_idmapped_layers_and_upper() {
        use crate::identity::JobIds;
        let (uid, gid) = (2147483648 + 2 * 65536, 3000000000 + 2 * 65536);
        let s = setup(|p, t| {
            let agent = t.join("agent-pkg");
            std::fs::create_dir_all(&agent).unwrap();
            p.lower.insert(0, agent);
            p.owned_dirs = vec![]; // its chown is inroot's (real), tested elsewhere
            p.userns = Some(JobIds::block(2, (uid, gid), (1000, 1000)));
        });
        let plan = s.job.read_plan().unwrap();
        let rec = Recorder::default();
        assert_eq!(s.run(&rec, None, None), HelperResult::Exited { code: 3, signal: None });
        let mut want = s.steps();
        let at = s.pos("mount_overlay");
        want.splice(
            at..at,
            [
                format!("new_user_namespace 0 {uid} 65536 0 {gid} 65536 owner {uid}"),
                format!("idmap_layer {} {}", plan.lower[0].display(), s.job.idmapped_lower(0).display()),
                format!("idmap_layer {} {}", plan.lower[1].display(), s.job.idmapped_lower(1).display()),
                format!("chown {} {uid}:{gid}", s.job.upper().display()),
            ],
        );
        assert_eq!(rec.calls(), want);
        // The job joins that namespace; its devices are binds and /sys the host's.
        let spec = oci_spec::runtime::Spec::load(s.job.bundle().join("config.json")).unwrap();
        let ns = spec.linux().as_ref().unwrap().namespaces().as_ref().unwrap();
        let user = ns.iter().find(|n| n.typ() == oci_spec::runtime::LinuxNamespaceType::User).expect("a user ns");
        assert!(user.path().as_ref().unwrap().starts_with("/proc/self/fd/"), "{user:?}");
        // Any of the new steps failing ends the line before the overlay.
        for k in at..at + 4 {
            let r = s.run(&Recorder::failing_at(k, Errno::EINVAL), None, None);
            let (_, error) = failed(&r);
            assert!(error.contains("EINVAL") || error.contains("Invalid argument"), "step {k}: {error}");
        }
        let rec = Recorder::failing_at(at + 1, Errno::EINVAL);
        s.run(&rec, None, None);
        assert_eq!(rec.calls(), want[..=at + 1], "nothing after a failed idmap");
        let e = failed(&s.run(&Recorder::failing_at(at + 1, Errno::EINVAL), None, None)).1.to_string();
        assert!(e.contains("--userns host") && e.contains("5.19"), "the fallback is named: {e}");
    }

    #[test]
    fn a_rootless_job_gets_a_nested_namespace_and_no_idmapped_layers() {
        let s = setup(|p, _| {
            p.rootless = true;
            p.owned_dirs = vec![];
            p.userns = Some(crate::identity::JobIds::nested());
        });
        let rec = Recorder::default();
        s.run(&rec, None, None);
        let calls = rec.calls();
        let at = calls.iter().position(|c| c.starts_with("new_user_namespace")).expect("{calls:?}");
        assert_eq!(calls[at], "new_user_namespace 0 1 65536 0 1 65536");
        assert_eq!(calls[at + 1], format!("chown {} 1:1", s.job.upper().display()), "the upper is the job root's");
        assert!(calls[at + 2].starts_with("mount_overlay "), "{calls:?}");
    }

    #[test]
    fn a_gpu_job_builds_its_edit_layer_and_a_failed_build_removes_it() {
        let s = setup(|p, t| {
            let lib = t.join("libcuda.so.1");
            std::fs::write(&lib, "elf").unwrap();
            p.edits.mounts.push(BindMount {
                host_path: lib,
                container_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
                options: vec![],
                optional: false,
            });
        });
        let plan = s.job.read_plan().unwrap();
        let b = editlayer::dir(&s.home).join(format!(".build-{}-{}", editlayer::key(&plan), std::process::id()));
        let build = [
            format!("remove_tree {}", b.display()),
            format!("mount_overlay {}", b.join("merged").display()),
            format!("unmount {}", b.join("merged").display()),
            format!("remove_tree {}", b.join("work").display()),
            format!("remove_dir {}", b.join("merged").display()),
        ];
        // Built before the job's overlay, which then has it as its top layer.
        let rec = Recorder::default();
        assert_eq!(s.run(&rec, None, None), HelperResult::Exited { code: 3, signal: None });
        let at = s.pos("mount_overlay");
        let mut expected = s.steps();
        expected.splice(at..at, build.iter().cloned());
        assert_eq!(rec.calls(), expected);
        // The next job finds it built.
        let rec = Recorder::default();
        s.run(&rec, None, None);
        assert_eq!(rec.calls(), s.steps());
        std::fs::remove_dir_all(editlayer::dir(&s.home).join(editlayer::key(&plan))).unwrap();
        // The build's overlay or its unmount fails: the build dir goes, the job fails.
        for k in [at + 1, at + 2] {
            let rec = Recorder::failing_at(k, Errno::EIO);
            let r = s.run(&rec, None, None);
            let (_, error) = failed(&r);
            let mut expected = s.steps()[..at].to_vec();
            expected.extend(build[..=k - at].iter().cloned());
            expected.push(format!("remove_tree {}", b.display()));
            assert_eq!(rec.calls(), expected, "step {k}");
            assert!(error.starts_with("cannot build the sandbox's edit layer in "), "{error}");
            // The double removes nothing: clear the dir for the next round.
            std::fs::remove_dir_all(&b).unwrap();
        }
    }

    #[test]
    fn an_ipv6_job_reads_the_hosts_ipv6_addresses_too() {
        let link = crate::sandbox::network::link_name("hp-1", std::process::id());
        let s = setup(|p, _| {
            p.network = crate::config::Network::Isolated;
            p.net.ipv6 = true;
        });
        let rec = Recorder::default();
        assert_eq!(s.run(&rec, None, None), HelperResult::Exited { code: 3, signal: None });
        let calls = rec.calls();
        let at = calls.iter().position(|c| c == "own_ipc_namespace").unwrap() + 1;
        let net_dir = format!("mount_job_net_dir {}", s.job.net_dir().display());
        // One read of the host's local table gives its IPv4 and IPv6 addresses too.
        let want = ["watch_host_addresses ipv6".to_string(), net_dir, format!("isolate_network veth {link}")];
        assert_eq!(calls[at..at + 3], want[..], "{calls:?}");
    }

    #[test]
    fn a_rootless_jobs_pasta_joins_the_jobs_cgroup_and_ends_before_the_helper() {
        use crate::sys::RECORDED_PASTA;
        if crate::sandbox::network::find_program("pasta", &[]).is_none() {
            return crate::test_skip::skip("pasta (Debian passt) is not installed: the rootless network's plan");
        }
        let s = setup(|p, _| {
            p.network = crate::config::Network::Isolated;
            p.rootless = true;
        });
        let rec = Recorder::default();
        assert_eq!(s.run(&rec, None, None), HelperResult::Exited { code: 3, signal: None });
        let calls = rec.calls();
        let join = calls.iter().position(|c| c.starts_with("join_cgroup ")).expect("the job's cgroup");
        let dirs = calls[join].strip_prefix("join_cgroup ").unwrap();
        assert_eq!(calls[join + 1], format!("charge_pasta {RECORDED_PASTA} {dirs}"), "{calls:?}");
        let delete = calls.iter().position(|c| c == "delete").expect("delete");
        // Its TCP sockets set to reset as it stops, the job's own counted, then it stops.
        let linger = format!("linger_pasta {RECORDED_PASTA}");
        let stop = format!("stop_pasta {RECORDED_PASTA}");
        assert_eq!(calls[delete + 1..], [linger.clone(), "job_tcp_sockets".into(), stop.clone()], "{calls:?}");
        // Sockets the job left: aborted while pasta still runs, and no link to remove.
        let rec = Recorder::default();
        rec.tcp_sockets_left.set(2);
        assert_eq!(s.run(&rec, None, None), HelperResult::Exited { code: 3, signal: None });
        let calls = rec.calls();
        let want = [linger, "job_tcp_sockets".into(), "abort_job_tcp".into(), stop];
        assert_eq!(calls[delete + 1..], want, "{calls:?}");
        // A pasta whose sockets cannot be set: said, and stopped all the same.
        let rec = Recorder::failing_at(delete + 1, Errno::EPERM);
        assert_eq!(s.run(&rec, None, None), HelperResult::Exited { code: 3, signal: None });
        assert_eq!(rec.calls().last(), Some(&format!("stop_pasta {RECORDED_PASTA}")), "{:?}", rec.calls());
        // A pasta that cannot be charged to the job: no job.
        let rec = Recorder::failing_at(join + 1, Errno::EACCES);
        assert!(matches!(s.run(&rec, None, None), HelperResult::Failed { .. }));
        assert!(!rec.calls().iter().any(|c| c == "create"), "{:?}", rec.calls());
    }

    #[test]
    fn a_root_jobs_tracked_connections_are_forgotten_after_it() {
        let s = setup(|p, _| p.network = crate::config::Network::Isolated);
        let rec = Recorder::default();
        assert_eq!(s.run(&rec, None, None), HelperResult::Exited { code: 3, signal: None });
        let calls = rec.calls();
        let delete = calls.iter().position(|c| c == "delete").expect("delete");
        // No TCP socket outlives the job (the recorder's count): its link is left to the
        // kernel, with its namespace.
        let after = &calls[delete + 1..];
        assert!(after.len() == 2 && after[0] == "job_tcp_sockets", "{calls:?}");
        assert!(after[1].starts_with("forget_connections 10.87."), "{calls:?}");
        // Forgotten: no record left for the clean-up to act on.
        assert!(!s.job.connections_file().exists());
        // Its failure is said, not the job's, and not tried again by the clean-up.
        let rec = Recorder::failing_at(delete + 2, Errno::EPERM);
        assert_eq!(s.run(&rec, None, None), HelperResult::Exited { code: 3, signal: None });
        assert!(!s.job.connections_file().exists());
        // A count that fails: the link is left to the kernel, the rest as before.
        let rec = Recorder::failing_at(delete + 1, Errno::EIO);
        assert_eq!(s.run(&rec, None, None), HelperResult::Exited { code: 3, signal: None });
        let calls = rec.calls();
        assert!(calls[delete + 2].starts_with("forget_connections 10.87.") && calls.len() == delete + 3, "{calls:?}");
    }

    #[test]
    fn a_root_jobs_connections_that_outlive_it_are_aborted_and_its_link_removed_before_they_are_forgotten() {
        let s = setup(|p, _| p.network = crate::config::Network::Isolated);
        let rec = Recorder::default();
        rec.tcp_sockets_left.set(2);
        assert_eq!(s.run(&rec, None, None), HelperResult::Exited { code: 3, signal: None });
        let calls = rec.calls();
        // Counted in the job's namespace, before the helper leaves it.
        let counts = calls.iter().position(|c| c == "job_socket_counts").expect("job_socket_counts");
        let leave = calls.iter().position(|c| c == "leave_network").expect("leave_network");
        assert!(counts < leave, "{calls:?}");
        let delete = calls.iter().position(|c| c == "delete").expect("delete");
        let after = &calls[delete + 1..];
        assert!(after[0] == "job_tcp_sockets" && after[1] == "abort_job_tcp", "{calls:?}");
        assert!(after[2].starts_with("remove_job_link azp"), "aborted while the link is there: {calls:?}");
        let link = after[2].strip_prefix("remove_job_link ").unwrap();
        assert!(after[3].contains(&format!(" of {link} ")), "the job's own link: {calls:?}");
        assert!(after.len() == 4 && after[3].starts_with("forget_connections 10.87."), "{calls:?}");
        // Sockets that cannot be aborted (no CONFIG_INET_DIAG_DESTROY): said, and the
        // link removed and the connections forgotten all the same.
        let rec = Recorder::failing_at(delete + 2, Errno::EOPNOTSUPP);
        rec.tcp_sockets_left.set(2);
        assert_eq!(s.run(&rec, None, None), HelperResult::Exited { code: 3, signal: None });
        let calls = rec.calls();
        assert!(calls[delete + 3].starts_with("remove_job_link azp"), "{calls:?}");
        assert!(calls[delete + 4].starts_with("forget_connections 10.87."), "{calls:?}");
        // A link that cannot be removed: said, and the connections forgotten all the same.
        let rec = Recorder::failing_at(delete + 3, Errno::EPERM);
        rec.tcp_sockets_left.set(2);
        assert_eq!(s.run(&rec, None, None), HelperResult::Exited { code: 3, signal: None });
        assert!(rec.calls()[delete + 4].starts_with("forget_connections 10.87."), "{:?}", rec.calls());
        // No veth (`none`): nothing counted.
        let s = setup(|p, _| p.network = crate::config::Network::None);
        let rec = Recorder::default();
        rec.tcp_sockets_left.set(2);
        assert_eq!(s.run(&rec, None, None), HelperResult::Exited { code: 3, signal: None });
        let untouched =
            |c: &String| ["job_tcp_sockets", "abort_job_tcp", "remove_job_link"].iter().any(|p| c.starts_with(p));
        assert!(!rec.calls().iter().any(untouched));
    }

    #[test]
    fn a_root_job_on_a_killed_jobs_address_forgets_its_connections_before_it_starts() {
        // The recorder's veth gives 10.87.0.2: a killed job's helper left its marker.
        let s = setup(|p, t| {
            p.network = crate::config::Network::Isolated;
            p.net.connection_markers = Some(t.join("unforgotten-test"));
        });
        let dir = s._t.path().join("unforgotten-test");
        std::fs::create_dir(&dir).unwrap();
        let marker = dir.join("10.87.0.2@azp0000000000a1");
        std::fs::write(&marker, "").unwrap();
        let rec = Recorder::default();
        assert_eq!(s.run(&rec, None, None), HelperResult::Exited { code: 3, signal: None });
        let calls = rec.calls();
        let heir = calls
            .iter()
            .position(|c| c.starts_with("forget_connections 10.87.0.2 of azp0000000000a1 Always heir azp"))
            .unwrap_or_else(|| panic!("the killed job's connections are not forgotten: {calls:?}"));
        let start = calls.iter().position(|c| c == "start_and_wait").expect("start");
        assert!(heir < start, "{calls:?}");
        assert!(!marker.exists());
        // Not forgotten: no job (it would get their replies), and the marker stays.
        std::fs::write(&marker, "").unwrap();
        let rec = Recorder::failing_at(heir, Errno::EPERM);
        assert!(matches!(s.run(&rec, None, None), HelperResult::Failed { .. }));
        assert!(!rec.calls().iter().any(|c| c == "start_and_wait"), "{:?}", rec.calls());
        assert!(marker.exists());
    }

    #[test]
    fn a_cancelled_root_job_leaves_no_record_of_connections_it_never_made() {
        let s = setup(|p, t| {
            p.network = crate::config::Network::Isolated;
            p.net.connection_markers = Some(t.join("unforgotten-test"));
        });
        let (rx, tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        drop(tx); // EOF: cancelled
        let r = s.run(&Recorder::default(), None, Some(rx));
        assert!(matches!(r, HelperResult::Failed { kind: FailureKind::Cancelled, .. }), "{r:?}");
        assert!(!s.job.connections_file().exists());
        let left: Vec<_> = std::fs::read_dir(s._t.path().join("unforgotten-test")).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_root_jobs_connections_are_recorded_before_its_start() {
        // What a clean-up after this helper's death reads (see `network::forget`).
        // A prepared sandbox: the record is there while it waits for its go.
        let s = setup(|p, _| p.network = crate::config::Network::Isolated);
        let file = s.job.connections_file();
        let (go_rx, go_tx) = nix::unistd::pipe().unwrap();
        let runner = std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while !file.exists() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            let record = std::fs::read_to_string(&file).ok();
            nix::unistd::write(&go_tx, b"g").unwrap();
            record
        });
        let rec = Recorder::default();
        assert_eq!(s.run(&rec, None, Some(go_rx)), HelperResult::Exited { code: 3, signal: None });
        let record = runner.join().unwrap().expect("no record before the go");
        assert!(record.contains("\"sources\":[\"10.87."), "{record}");
    }

    #[test]
    fn the_network_steps_per_mode() {
        use crate::config::Network;
        let link = crate::sandbox::network::link_name("hp-1", std::process::id());
        for (network, rootless, net_steps) in [
            // The watch of the host's addresses is subscribed before they are read.
            (Network::Isolated, false, vec!["watch_host_addresses".into(), format!("isolate_network veth {link}")]),
            (Network::Isolated, true, vec!["watch_host_addresses".into(), "isolate_network pasta".into()]),
            (Network::None, false, vec!["isolate_network loopback".into()]),
            (Network::Host, false, vec![]),
        ] {
            if rootless && crate::sandbox::network::find_program("pasta", &[]).is_none() {
                crate::test_skip::skip_part("pasta (Debian passt) is not installed: the rootless network's plan");
                continue;
            }
            let s = setup(|p, _| {
                p.network = network;
                p.rootless = rootless;
            });
            let rec = Recorder::default();
            assert_eq!(s.run(&rec, None, None), HelperResult::Exited { code: 3, signal: None }, "{network}");
            let calls = rec.calls();
            // Right after the private mount and IPC namespaces (the sysfs is mounted in it), before
            // the overlay, the cgroup and the container: the dir for the namespace's sysfs,
            // then the namespace (made by a child meanwhile, see sys::net::isolate).
            let mut expected: Vec<String> = net_steps.clone();
            if network != Network::Host {
                expected.insert(expected.len() - 1, format!("mount_job_net_dir {}", s.job.net_dir().display()));
            }
            let at = calls.iter().position(|c| c == "own_ipc_namespace").unwrap() + 1;
            assert_eq!(calls[at..at + expected.len()], expected[..], "{network} rootless={rootless}: {calls:?}");
            if network != Network::Host {
                // The helper enters it after the job's overlay and the tree's other mounts
                // (made while a child makes the namespace), right before the bind of its
                // sysfs, the last of the tree's, and the cgroup.
                let pos = |name: &str| calls.iter().position(|c| c.starts_with(name));
                let enter = pos("enter_network").expect("enter_network");
                let sysfs = format!("bind_in_tree {} /sys", s.job.net_dir().join("sys").display());
                assert!(pos("mount_overlay") < pos("tmpfs_in_tree /dev ") && pos("tmpfs_in_tree /dev ") < Some(enter));
                assert_eq!(calls[enter + 1], sysfs, "{calls:?}");
                assert!(Some(enter) < pos("join_cgroup"), "{calls:?}");
                let rec = Recorder::failing_at(enter, Errno::EPERM);
                assert!(matches!(s.run(&rec, None, None), HelperResult::Failed { .. }), "{network}");
                assert_eq!(rec.calls().len(), enter + 1, "the line ends there: {:?}", rec.calls());
                // What is still under way (a veth configured in a child) is done after the
                // container's create and before the job starts; if it failed, the job never
                // starts and its container goes.
                let pos = |calls: &[String], name: &str| calls.iter().position(|c| c == name);
                let finish = pos(&calls, "finish_network").expect("finish_network");
                // Before that, once the container holds the job's namespace, the helper
                // goes back to its own (the namespace then goes with the job); rootless
                // it may not (its own is the host's).
                if rootless {
                    assert_eq!(pos(&calls, "leave_network"), None, "{calls:?}");
                } else {
                    let leave = pos(&calls, "leave_network").expect("leave_network");
                    assert!(pos(&calls, "create") < Some(leave) && leave + 1 == finish, "{network}: {calls:?}");
                    let rec = Recorder::failing_at(leave, Errno::EPERM);
                    assert!(matches!(s.run(&rec, None, None), HelperResult::Failed { .. }), "{network}");
                    let calls = rec.calls();
                    assert_eq!(calls[leave + 1..], ["kill_unreaped_init", "delete"], "{network}: {calls:?}");
                }
                assert!(Some(finish) < pos(&calls, "start_and_wait"), "{network}: {calls:?}");
                // The guard against new host addresses is armed in the job's namespace (its
                // sockets are the namespace the helper is in: armed after the helper left,
                // its refusals would be routes of the host's), before the job starts; a
                // guard that cannot be armed starts no job.
                if network == Network::Isolated {
                    let arm = pos(&calls, "arm_address_watch").expect("arm_address_watch");
                    assert!(pos(&calls, "enter_network") < Some(arm), "{calls:?}");
                    assert!(pos(&calls, "leave_network").is_none_or(|leave| arm < leave), "{calls:?}");
                    assert!(arm < finish, "{calls:?}");
                    let rec = Recorder::failing_at(arm, Errno::EPERM);
                    assert!(matches!(s.run(&rec, None, None), HelperResult::Failed { .. }), "{network}");
                    assert_eq!(pos(&rec.calls(), "start_and_wait"), None, "{network}: {:?}", rec.calls());
                } else {
                    assert_eq!(pos(&calls, "arm_address_watch"), None, "{network}: {calls:?}");
                }
                let rec = Recorder::failing_at(finish, Errno::EIO);
                assert!(matches!(s.run(&rec, None, None), HelperResult::Failed { .. }), "{network}");
                let calls = rec.calls();
                assert_eq!(pos(&calls, "start_and_wait"), None, "{network}: {calls:?}");
                assert_eq!(calls[finish + 1..], ["kill_unreaped_init", "delete"], "{network}: {calls:?}");
            }
            // What the helper binds on /sys and /etc/resolv.conf (see treemount).
            let source = |dst: &str| {
                let bind = calls.iter().find(|c| c.starts_with("bind_in_tree ") && c.ends_with(&format!(" {dst}")));
                bind.unwrap_or_else(|| panic!("no bind on {dst}: {calls:?}")).split(' ').nth(1).unwrap().to_string()
            };
            let own = |f: &str| s.job.net_dir().join(f).display().to_string();
            match network {
                Network::Host => assert_eq!(source("/etc/resolv.conf"), "/etc/resolv.conf"),
                Network::None => {
                    assert_eq!(source("/sys"), own("sys"));
                    assert_eq!(source("/etc/resolv.conf"), "/etc/resolv.conf", "no network: the host's file");
                }
                Network::Isolated => {
                    assert_eq!((source("/sys"), source("/etc/resolv.conf")), (own("sys"), own("resolv.conf")));
                    let r = std::fs::read_to_string(s.job.net_dir().join("resolv.conf")).unwrap();
                    assert!(!r.contains("nameserver 127."), "no loopback resolver for the job: {r}");
                }
            }
        }
        // A failed network step ends the line there.
        // (0 prepare_stdio, 1 clear_groups, 2 private_mount_namespace, 3 own_ipc_namespace,
        // then the network: the watch of the host's addresses (and its read of them), the
        // dir for its sysfs, the namespace.)
        let failing = [(4, FailureKind::Other), (5, FailureKind::Other), (6, FailureKind::NotPermitted)];
        for (k, want) in failing {
            let s = setup(|p, _| p.network = Network::Isolated);
            let rec = Recorder::failing_at(k, Errno::EPERM);
            let r = s.run(&rec, None, None);
            let (kind, error) = failed(&r);
            assert_eq!(rec.calls().len(), k + 1, "{error}");
            assert_eq!(kind, want, "{error}");
            assert!(error.ends_with("EPERM: Operation not permitted"), "{error}");
        }
    }
}
