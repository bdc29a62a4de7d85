//! Process plumbing: forks (the helper, setuid mode's split, the uid mapper), the
//! re-executed helper's set-up between fork and exec, waits, kills and priorities.

use super::error::{Error, Result};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};

/// Threads of this process (from /proc/self/task; 0 when it cannot be read).
pub fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}

/// Which side of a fork this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forked {
    Parent(Pid),
    Child,
}

/// Forks this process, which must have a single thread (checked: an error otherwise).
pub fn fork(what: &'static str) -> Result<Forked> {
    match fork_if_single_threaded(what)? {
        Some(f) => Ok(f),
        None => Err(Error::ForkThreaded { what, threads: thread_count() }),
    }
}

/// Forks this process if it has a single thread; None (and no fork) when it has more.
pub fn fork_if_single_threaded(what: &'static str) -> Result<Option<Forked>> {
    if thread_count() != 1 {
        return Ok(None);
    }
    // SAFETY: this process has exactly one thread (counted just above, and only this
    // thread could have started another since), so no lock or allocator state can be
    // held by a thread that does not exist in the child: the child may run any code.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Parent { child }) => Ok(Some(Forked::Parent(child))),
        Ok(nix::unistd::ForkResult::Child) => Ok(Some(Forked::Child)),
        Err(source) => Err(Error::Fork { what, source }),
    }
}

/// Runs `f(data)` in a forked child, which then exits with its return value (125 if it
/// panics) and never returns here: Ok(child's pid). When this process has threads,
/// nothing is forked and `data` comes back: Err(data).
pub fn run_forked<T>(what: &'static str, data: T, f: impl FnOnce(T) -> i32) -> Result<std::result::Result<Pid, T>> {
    match fork_if_single_threaded(what)? {
        None => Ok(Err(data)),
        Some(Forked::Parent(child)) => Ok(Ok(child)),
        Some(Forked::Child) => {
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(data))).unwrap_or(125);
            exit_now(code)
        }
    }
}

/// Ends a forked child at once: without the parent's exit handlers, destructors or
/// buffered output, which belong to the parent.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit(2) takes an integer, touches no memory of ours and does not return.
    unsafe { libc::_exit(code) }
}

/// The fds a re-executed helper gets from its runner, as fds 3 (result) and 4 (go);
/// -1 for none.
#[derive(Debug, Clone, Copy)]
pub struct HelperPipes {
    pub result: RawFd,
    pub go: RawFd,
}

/// In the helper, before it runs: PDEATHSIG ties it to its runner (if the runner dies,
/// it dies, and with it the job: see `sys::lifeline`); a session of its own, so that a
/// terminal's Ctrl-C (or the SIGHUP of its hang-up) reaches only the runner, which passes
/// it on once, and not the helper too (issue 21: one Ctrl-C was counted twice); the
/// pipes move to fds 3 and 4, kept across exec; the signal mask is cleared, because a
/// supervisor may block signals and masks survive execve: the job must receive its
/// SIGTERM. Only async-signal-safe calls (prctl, setsid, dup2, fcntl, sigprocmask), no
/// allocation: it also runs between fork and exec of a threaded parent.
pub fn child_setup(pipes: HelperPipes) -> std::io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    use nix::sys::signal::{sigprocmask, SigSet, SigmaskHow};
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
    // EPERM only for a process group leader, which a fresh child never is.
    let _ = nix::unistd::setsid();
    for (fd, to) in [(pipes.result, 3), (pipes.go, 4)] {
        if fd < 0 {
            continue;
        }
        if fd == to {
            fcntl(to, FcntlArg::F_SETFD(FdFlag::empty()))?;
        } else {
            nix::unistd::dup2(fd, to)?;
        }
    }
    sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)?;
    Ok(())
}

/// Spawns `cmd` (this binary re-executed as the helper) with [`child_setup`] run
/// between fork and exec.
pub fn spawn_helper_command(cmd: &mut std::process::Command, pipes: HelperPipes) -> Result<std::process::Child> {
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed: child_setup makes only such calls, allocates
    // nothing and captures two integers by value.
    unsafe {
        cmd.pre_exec(move || child_setup(pipes));
    }
    cmd.spawn().map_err(Error::SpawnHelper)
}

/// The name `ps -o comm` and top show for this process (at most 15 bytes).
pub fn set_name(name: &std::ffi::CStr) {
    let _ = nix::sys::prctl::set_name(name);
}

/// Closes the given fds of this process (a forked child's copies of its parent's pipe
/// ends); ones already closed are skipped.
pub fn close_all(fds: &[RawFd]) {
    for fd in fds {
        let _ = nix::unistd::close(*fd);
    }
}

/// Makes `to` (0, 1 or 2) a copy of `fd`.
pub fn dup_onto(fd: &OwnedFd, to: RawFd) -> std::io::Result<()> {
    nix::unistd::dup2(fd.as_raw_fd(), to).map(drop).map_err(std::io::Error::from)
}

/// Takes the fd number `fd`, handed down by our parent (named in an env var), as ours:
/// marked close-on-exec, so that the job never inherits it. None when it is no open fd
/// above the standard three.
pub fn adopt_inherited_fd(fd: RawFd) -> Option<OwnedFd> {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    if fd <= 2 || fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).is_err() {
        return None;
    }
    // SAFETY: `fd` is open (F_SETFD just succeeded on it) and was passed down to this
    // process for this one use: the env var naming it is read once and removed, so no
    // other owner exists and the OwnedFd closes it exactly once.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Waits for our child `pid` to end (retrying on EINTR) and returns its raw status.
pub fn wait_exit_status(pid: i32) -> std::io::Result<std::process::ExitStatus> {
    let mut status = 0;
    loop {
        // SAFETY: waitpid(2) writes one int into `status`, a live local borrowed mutably
        // for the call; the result is checked.
        if unsafe { libc::waitpid(pid, &mut status, 0) } == pid {
            // The raw wait status is what ExitStatus wraps.
            return Ok(std::process::ExitStatus::from_raw(status));
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Sends `signal` to `pid`.
pub fn kill(pid: i32, signal: Signal) -> Result<()> {
    nix::sys::signal::kill(Pid::from_raw(pid), signal).map_err(|source| Error::Kill { pid, signal, source })
}

/// Background clean-up must not slow the next job down: nice 19 and the idle I/O class
/// for the calling thread only (both are per-thread on Linux). Best effort: a thread
/// that cannot lower them keeps its normal priority.
pub fn lower_priority_of_this_thread() {
    let tid = nix::unistd::gettid().as_raw();
    const IOPRIO_WHO_PROCESS: libc::c_int = 1;
    const IOPRIO_CLASS_IDLE: libc::c_int = 3;
    // SAFETY: setpriority(2) and ioprio_set(2) take integers only and touch no memory of
    // ours; a failure leaves the priority as it was, which is acceptable here.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
        libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, tid, IOPRIO_CLASS_IDLE << 13);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_threaded_process_is_not_forked() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || rx.recv());
        assert!(thread_count() > 1);
        assert_eq!(fork_if_single_threaded("a test").unwrap(), None);
        let e = fork("a test").unwrap_err();
        assert!(e.to_string().starts_with("cannot fork a test: it must be forked before any thread exists"), "{e}");
        assert_eq!(run_forked("a test", 7, |_| 0).unwrap(), Err(7), "the data comes back");
        drop(tx);
        let _ = other.join();
    }

    #[test]
    fn only_open_fds_above_stdio_are_adopted() {
        assert!(adopt_inherited_fd(1).is_none());
        assert!(adopt_inherited_fd(987_654).is_none());
        let (r, _w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let raw = std::os::fd::IntoRawFd::into_raw_fd(r);
        let fd = adopt_inherited_fd(raw).expect("an open pipe end");
        let flags = nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_GETFD).unwrap();
        assert_ne!(flags & libc::FD_CLOEXEC, 0, "close-on-exec, never inherited by the job");
    }
}
