//! The helper's seam around libcontainer: create the job's container from the bundle,
//! start it and wait for it (forwarding signals), delete it. Behind the [`Container`]
//! trait so that the helper's straight line around it is unit-tested without root (see
//! the tests in `helper.rs`); this part itself is covered by the integration tests.

use super::jobdir::JobDir;
use super::plan::JobPlan;
use super::report::{classify_libcontainer, FailureKind, HelperResult, SandboxError};
use crate::sys::signals::wait_timeout;
use anyhow::{Context, Result};
use libcontainer::container::builder::ContainerBuilder;
use libcontainer::syscall::syscall::SyscallType;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// What the helper does with the job's container, in this order: `prepare_stdio`,
/// `create`, then `start_and_wait` (or `kill_unreaped_init` when cancelled), `delete`.
pub trait Container {
    /// Before anything else: the helper's stdio as the job will inherit it.
    fn prepare_stdio(&mut self) -> Result<()>;
    /// Builds the container from the job's bundle; its init waits before exec.
    fn create(&mut self, plan: &JobPlan, job: &JobDir) -> Result<()>;
    /// The pid of the container's init, once created.
    fn init_pid(&self) -> Option<i32>;
    /// Starts the job and waits for its init to exit, forwarding stop signals; `started`
    /// is called once the job runs (not when the start fails); `tend` once before the
    /// start and on each `sys::address_watch::SIGNAL` (an error: the job is not started,
    /// or killed).
    fn start_and_wait(
        &mut self,
        started: &mut dyn FnMut(),
        tend: &mut dyn FnMut() -> Result<()>,
    ) -> Result<HelperResult>;
    /// SIGKILLs an init that was never started (cancelled).
    fn kill_unreaped_init(&mut self);
    /// Removes the container (forced), with libcontainer's state.
    fn delete(&mut self) -> Result<()>;
}

/// Time a job gets after SIGTERM, SIGHUP or SIGQUIT before it is SIGKILLed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// What the helper does with a signal it receives while the job runs. Each goes to the
/// job's init, which passes it to the job's whole process group. SIGINT is an interrupt,
/// as a terminal's Ctrl-C: the job decides (the agent cancels its job, reports it and
/// exits; the drain's deadline is the runner's to keep). SIGTERM, SIGHUP and SIGQUIT
/// stop the job: SIGKILL follows after [`STOP_GRACE`]. Any signal after a first one
/// kills the job at once (a second Ctrl-C, or the drain's cancel grace running out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnSignal {
    /// Forward it; SIGKILL at the deadline, if any.
    Forward { kill_after: Option<Duration> },
    /// SIGKILL now.
    Kill,
}

/// See [`OnSignal`]; `already`: a signal came before this one.
pub fn on_signal(sig: Signal, already: bool) -> OnSignal {
    match sig {
        _ if already => OnSignal::Kill,
        Signal::SIGINT => OnSignal::Forward { kill_after: None },
        _ => OnSignal::Forward { kill_after: Some(STOP_GRACE) },
    }
}

/// A stop signal that arrived before the job was started (while the helper was still
/// setting up): forwarded to the job as soon as it runs. Without this, a SIGTERM in that
/// window killed the helper outright and orphaned the container's init, which kept our
/// pipes open and hung the supervisor's shutdown. Set by the helper's handlers.
pub(super) static EARLY_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// The real thing.
#[derive(Default)]
pub struct Libcontainer {
    container: Option<libcontainer::container::Container>,
    /// The write end of the job's lifeline (see `sys::lifeline`), held until the helper
    /// exits: its death, by any signal, ends the job.
    lifeline: Option<std::os::fd::OwnedFd>,
}

impl Container for Libcontainer {
    fn prepare_stdio(&mut self) -> Result<()> {
        keep_dev_null_writable()
    }

    fn create(&mut self, plan: &JobPlan, job: &JobDir) -> Result<()> {
        // libcontainer gives its caller the job's oom_score_adj; ours goes back after build().
        let own_oom_score_adj = std::fs::read_to_string("/proc/self/oom_score_adj").ok();
        // The job's init reads its lifeline at fd 3 (libcontainer passes fds 3.. on, as
        // many as preserved); without an init, nothing would read it.
        let preserved = if plan.process.init.is_some() {
            self.lifeline = Some(crate::sys::lifeline::create()?);
            1
        } else {
            0
        };
        // With a terminal, libcontainer's init makes a pty in the job's devpts and sends
        // its master to the runner's console socket (libcontainer calls that "detached").
        let console = plan.process.terminal.then(|| job.console_socket());
        let built = ContainerBuilder::new(plan.id.clone(), SyscallType::default())
            .with_root_path(job.container_root())
            .context("bad libcontainer state dir")?
            .with_preserved_fds(preserved)
            .with_console_socket(console.as_ref())
            .as_init(job.bundle())
            .with_systemd(false)
            .with_detach(plan.process.terminal)
            .build();
        if preserved > 0 {
            crate::sys::lifeline::release_read_end();
        }
        let container = built.map_err(|e| create_error(&e.to_string(), &plan.args))?;
        if let Some(v) = own_oom_score_adj {
            // In the job's cgroup (see sandbox::cgroup), a memory-limit OOM must pick the
            // job's processes, not the helper. Lowering needs root; rootless it stays.
            let _ = std::fs::write("/proc/self/oom_score_adj", v.trim());
        }
        self.container = Some(container);
        Ok(())
    }

    fn init_pid(&self) -> Option<i32> {
        self.container.as_ref()?.pid().map(Pid::as_raw)
    }

    fn start_and_wait(
        &mut self,
        started: &mut dyn FnMut(),
        tend: &mut dyn FnMut() -> Result<()>,
    ) -> Result<HelperResult> {
        let container = self.container.as_mut().context("no container to start")?;
        start_and_wait(container, started, tend)
    }

    fn kill_unreaped_init(&mut self) {
        if let Some(c) = &self.container {
            kill_unreaped_init(c);
        }
    }

    fn delete(&mut self) -> Result<()> {
        match &mut self.container {
            Some(c) => c.delete(true).map_err(anyhow::Error::from),
            None => Ok(()),
        }
    }
}

/// libcontainer's errors are precise but not always actionable; translate the common ones.
pub(super) fn create_error(text: &str, args: &[String]) -> SandboxError {
    let kind = classify_libcontainer(text);
    let message = match kind {
        FailureKind::CommandNotFound => {
            let cmd = args.first().map(String::as_str).unwrap_or("");
            format!("cannot create the sandbox: command '{cmd}' not found in the sandbox's rootfs ({text})")
        }
        _ => format!("cannot create the sandbox: {text}"),
    };
    SandboxError { kind, message }
}

fn start_and_wait(
    container: &mut libcontainer::container::Container,
    started: &mut dyn FnMut(),
    tend: &mut dyn FnMut() -> Result<()>,
) -> Result<HelperResult> {
    // Block the signals we handle before the job starts, so none is lost; the job's
    // init was forked during build() and does not inherit this mask.
    let mut set = SigSet::empty();
    let watched = crate::sys::address_watch::SIGNAL;
    for s in [Signal::SIGCHLD, Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP, Signal::SIGQUIT, watched] {
        set.add(s);
    }
    set.thread_block().map_err(crate::sys::Error::BlockSignals)?;
    // What the watch saw before its signal was blocked (and dropped, ignored).
    if let Err(e) = tend() {
        kill_unreaped_init(container);
        return Err(e);
    }

    if let Err(e) = container.start() {
        kill_unreaped_init(container);
        let text = e.to_string();
        return Err(SandboxError::new(classify_libcontainer(&text), format!("cannot start the sandbox: {text}")).into());
    }
    let init = container.pid().context("sandbox started but has no init pid")?;
    started();
    let kill = |sig: Signal| {
        let _ = crate::sys::process::kill(init.as_raw(), sig);
    };

    let mut kill_at: Option<Instant> = None;
    let mut signalled = false;
    let mut act = |sig: Signal, when: &str, kill_at: &mut Option<Instant>| {
        match on_signal(sig, signalled) {
            OnSignal::Forward { kill_after } => {
                let then = kill_after.map(|d| format!(", SIGKILL in {}s", d.as_secs())).unwrap_or_default();
                tracing::info!("received {sig}{when}: forwarding to the job{then}");
                kill(sig);
                *kill_at = kill_after.map(|d| Instant::now() + d);
            }
            OnSignal::Kill => {
                tracing::info!("received {sig} after a first signal: killing the job");
                kill(Signal::SIGKILL);
            }
        }
        signalled = true;
    };
    // Signals are blocked now (sigtimedwait below takes them); one that came earlier is
    // the job's too.
    if let Ok(sig) = Signal::try_from(EARLY_SIGNAL.swap(0, Ordering::SeqCst)) {
        act(sig, " while starting", &mut kill_at);
    }
    // A guard that could not refuse a new host address (see `tend`): the job is killed,
    // and its end is that failure, not an exit code.
    let mut guard_failed: Option<anyhow::Error> = None;
    let mut tend_or_kill = |guard_failed: &mut Option<anyhow::Error>| {
        if let Err(e) = tend() {
            tracing::error!("{e:#}: killing the job");
            kill(Signal::SIGKILL);
            guard_failed.get_or_insert(e);
        }
    };
    loop {
        // Reap everything (libcontainer's intermediate too); stop when init is gone.
        loop {
            let ended = match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == init => HelperResult::Exited { code, signal: None },
                Ok(WaitStatus::Signaled(pid, sig, _)) if pid == init => {
                    HelperResult::Exited { code: 128 + sig as i32, signal: Some(sig as i32) }
                }
                Ok(WaitStatus::StillAlive) | Err(nix::errno::Errno::ECHILD) => break,
                Ok(_) => continue,
                Err(e) => return Err(e).context("waitpid failed"),
            };
            return match guard_failed.take() {
                Some(e) => Err(SandboxError::new(FailureKind::Other, format!("{e:#}: the job was killed")).into()),
                None => Ok(ended),
            };
        }
        let timeout = kill_at.map(|t| t.saturating_duration_since(Instant::now())).unwrap_or(Duration::from_secs(60));
        match wait_timeout(&set, timeout) {
            Some(Signal::SIGCHLD) => {}
            Some(sig) if sig == watched => tend_or_kill(&mut guard_failed),
            Some(sig) => act(sig, "", &mut kill_at),
            None => {
                if kill_at.is_some_and(|t| Instant::now() >= t) {
                    kill(Signal::SIGKILL);
                }
                // A backstop, should a signal of the watch never come.
                tend_or_kill(&mut guard_failed);
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

/// SIGKILLs the container's init when it was never started (cancelled, or start failed).
/// libcontainer's forced delete kills through the cgroup, and a rootless job's processes
/// are not in one libcontainer knows; init still holds our pipes, so without this the
/// runner would wait for it forever. Init is pid 1 of the job's pid namespace: the kernel
/// kills the rest. Only for an init not yet reaped, whose pid cannot have been reused.
fn kill_unreaped_init(container: &libcontainer::container::Container) {
    if let Some(pid) = container.pid() {
        let _ = crate::sys::process::kill(pid.as_raw(), Signal::SIGKILL);
        let _ = waitpid(pid, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interrupt_is_passed_on_a_stop_is_enforced_and_a_second_signal_kills() {
        assert_eq!(on_signal(Signal::SIGINT, false), OnSignal::Forward { kill_after: None });
        for s in [Signal::SIGTERM, Signal::SIGHUP, Signal::SIGQUIT] {
            assert_eq!(on_signal(s, false), OnSignal::Forward { kill_after: Some(STOP_GRACE) }, "{s}");
        }
        for s in [Signal::SIGINT, Signal::SIGTERM] {
            assert_eq!(on_signal(s, true), OnSignal::Kill, "{s} after another");
        }
    }

    #[test]
    fn a_missing_command_is_named_and_classified() {
        let args = ["no-such-command".to_string()];
        let e = create_error("executable 'no-such-command' not found in $PATH", &args);
        assert_eq!(e.kind, FailureKind::CommandNotFound);
        assert_eq!(
            e.message,
            "cannot create the sandbox: command 'no-such-command' not found in the sandbox's rootfs \
             (executable 'no-such-command' not found in $PATH)"
        );
        let e = create_error("failed to prepare rootfs", &args);
        assert_eq!(
            (e.kind, e.message.as_str()),
            (FailureKind::Other, "cannot create the sandbox: failed to prepare rootfs")
        );
    }
}
