//! Process plumbing: forks (the helper, setuid mode's split, the uid mapper), the
//! re-executed helper's set-up between fork and exec, waits, kills and priorities.

use super::error::{Error, Result};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::ptr::NonNull;

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

/// A child made in new namespaces (`clone(2)` with e.g. CLONE_NEWUSER: they exist once
/// this returns, whether or not the child has run yet) that shares this process's memory
/// (CLONE_VM, as posix_spawn's child does: no page tables copied for it, no copy-on-write
/// faults here while it lives) and fd table, and does nothing but wait to be killed. Its namespaces
/// live as long as it does, or as an fd opened on them. Its drop kills and reaps it;
/// [`WaitingChild::kill_and_reap_later`] kills it and leaves the reaping to
/// [`reap_killed`].
#[derive(Debug)]
pub struct WaitingChild {
    pid: Pid,
    /// Its stack, which must outlive it (it is reaped before this is freed).
    _stack: Vec<u8>,
    reaped: bool,
}

/// The stack of a [`WaitingChild`]: one system call deep.
const WAITING_CHILD_STACK: usize = 16 * 1024;

/// The [`WaitingChild`]'s whole life: wait for a signal with every signal blocked (it
/// starts so: see [`clone_waiting`]), so that none comes but SIGKILL, which its
/// parent's death sends too: a helper killed before it released the child (its
/// manager's death kills it) must not leave it waiting forever, holding the helper's fd
/// table and with it the firewall's shared lock (every later job's wait for that lock
/// hung). `parent`: the caller's pid, as a pointer-sized integer; gone already, the child
/// exits at once. Raw system calls that cannot fail: the child shares our memory, thread
/// pointer included, so it must neither allocate nor write errno. Returning, glibc's
/// clone() exits the child.
extern "C" fn wait_to_be_killed(parent: *mut libc::c_void) -> libc::c_int {
    // SAFETY: prctl(PR_SET_PDEATHSIG) with a valid signal and getppid(2) take integers,
    // touch no memory and cannot fail (no errno written). ppoll with no fds, no timeout
    // and no mask (the current one, which blocks every signal) reads and writes no memory
    // and returns only for a handled signal.
    unsafe {
        libc::syscall(libc::SYS_prctl, libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0usize, 0usize, 0usize);
        // Checked after the prctl: a parent that died before it sent nothing.
        if libc::syscall(libc::SYS_getppid) as usize != parent as usize {
            return 0;
        }
        libc::syscall(libc::SYS_ppoll, 0usize, 0usize, 0usize, 0usize, 0usize)
    };
    0
}

/// Clones a [`WaitingChild`] into new namespaces (`flags`: CLONE_NEW* flags only). It
/// dies with the thread that calls this (its parent-death signal: see
/// [`wait_to_be_killed`]).
pub fn clone_waiting(flags: nix::sched::CloneFlags) -> std::result::Result<WaitingChild, nix::errno::Errno> {
    let mut stack = vec![0u8; WAITING_CHILD_STACK];
    // What the child's getppid() returns while we live: our process's pid.
    let parent = std::process::id() as usize as *mut libc::c_void;
    // SAFETY: `wait_to_be_killed` reads its argument as an integer (no memory behind it)
    // and touches nothing of ours but `stack`, which WaitingChild owns and frees only
    // after the child is reaped (its drop, `kill_and_reap_later` and `reap_killed` reap
    // first).
    let pid =
        unsafe { clone_sharing_memory(wait_to_be_killed, parent, NonNull::from(stack.as_mut_slice()), flags.bits()) }?;
    Ok(WaitingChild { pid, _stack: stack, reaped: false })
}

/// Clones a child that shares this process's memory and fd table and runs `entry(arg)`
/// on `stack`, with every signal blocked from its first instruction (ours come back
/// before this returns); `flags`: more clone flags (CLONE_NEW*). It is a process of its
/// own (no CLONE_THREAD), our child to reap (SIGCHLD).
///
/// # Safety
/// `entry` must touch nothing of ours but `arg` (which must stay valid and, but for
/// atomics, unchanged while the child lives) and `stack`: no allocation, no errno, no
/// thread-local (it runs on our thread pointer). `stack` must stay allocated until the
/// child is reaped.
pub unsafe fn clone_sharing_memory(
    entry: extern "C" fn(*mut libc::c_void) -> libc::c_int,
    arg: *mut libc::c_void,
    stack: NonNull<[u8]>,
    flags: libc::c_int,
) -> std::result::Result<Pid, nix::errno::Errno> {
    // The stack grows down: its top, aligned down to 16 bytes as the ABIs want.
    let top = (stack.as_ptr() as *mut u8 as usize + stack.len()) & !15;
    // Every signal blocked in the child, glibc's own two included, so no handler of ours
    // or glibc's (shared code, statics, our thread's TLS) can run in it.
    let ours = block_every_signal()?;
    // SAFETY: the caller's contract for `entry`, `arg` and `stack`. CLONE_VM without
    // CLONE_THREAD or CLONE_SETTLS: a process of its own that shares our memory, as
    // posix_spawn's child (glibc >= 2.25's clone, which this binary's symbol versions
    // require, writes nothing through the shared thread pointer for it). CLONE_FILES: it
    // shares our fd table, so it holds no copy of any open file (a pipe's write end that
    // would not see EOF, a lock, a file being written that another thread would then fail
    // to exec with ETXTBSY). SIGCHLD when it exits.
    let pid = unsafe {
        libc::clone(entry, top as *mut libc::c_void, flags | libc::CLONE_VM | libc::CLONE_FILES | libc::SIGCHLD, arg)
    };
    let cloned = match pid {
        -1 => Err(nix::errno::Errno::last()),
        pid => Ok(Pid::from_raw(pid)),
    };
    // Restored whatever happened: a child running on `stack` must not be left behind by
    // an early return.
    restore_signals(&ours);
    cloned
}

/// The size of the kernel's signal set, which rt_sigprocmask(2) takes (_NSIG / 8).
const KERNEL_SIGSET_BYTES: usize = if cfg!(any(target_arch = "mips", target_arch = "mips64")) { 16 } else { 8 };

/// This thread's signal mask as it was before [`block_every_signal`].
struct SavedSignalMask([u64; 2]);

/// Blocks every signal in this thread, with rt_sigprocmask(2) itself: glibc's
/// sigprocmask leaves its two internal signals (thread cancellation and set*id) open,
/// and a child cloned to share our memory must start with none of their handlers able
/// to run. SIGKILL and SIGSTOP cannot be blocked (the kernel drops them from the set).
fn block_every_signal() -> std::result::Result<SavedSignalMask, nix::errno::Errno> {
    let all = [u64::MAX; 2];
    let mut old = [0u64; 2];
    // SAFETY: rt_sigprocmask reads KERNEL_SIGSET_BYTES (at most 16) from `all` and writes
    // as many into `old`, two live 16-byte locals.
    let r = unsafe {
        libc::syscall(libc::SYS_rt_sigprocmask, libc::SIG_SETMASK, all.as_ptr(), old.as_mut_ptr(), KERNEL_SIGSET_BYTES)
    };
    if r == -1 {
        return Err(nix::errno::Errno::last());
    }
    Ok(SavedSignalMask(old))
}

/// Puts back the mask [`block_every_signal`] saved. It cannot fail: the mask is one the
/// kernel itself returned, and SIG_SETMASK is valid.
fn restore_signals(saved: &SavedSignalMask) {
    // SAFETY: rt_sigprocmask reads KERNEL_SIGSET_BYTES from `saved` (16 bytes) and writes
    // nothing (no old set).
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            saved.0.as_ptr(),
            std::ptr::null_mut::<u64>(),
            KERNEL_SIGSET_BYTES,
        )
    };
}

impl WaitingChild {
    pub fn pid(&self) -> Pid {
        self.pid
    }
}

/// Children killed and not reaped yet (see [`WaitingChild::kill_and_reap_later`]), with
/// their stacks.
static KILLED: std::sync::Mutex<Vec<WaitingChild>> = std::sync::Mutex::new(Vec::new());

impl WaitingChild {
    /// SIGKILLs the child and goes on without waiting for it to go: its run to exit needs
    /// a CPU, and waiting for that took up to ~0.8 ms of the helper's path on a busy
    /// machine (traced). [`reap_killed`] reaps it; until then it keeps its stack.
    pub fn kill_and_reap_later(self) {
        // Our unreaped child: its pid cannot have been reused.
        let _ = nix::sys::signal::kill(self.pid, Signal::SIGKILL);
        KILLED.lock().unwrap_or_else(|e| e.into_inner()).push(self);
    }
}

/// Reaps the children of [`WaitingChild::kill_and_reap_later`] (SIGKILLed: dead or about
/// to be) and frees their stacks. Call it before anything waits for any child
/// (`waitpid(-1)`), which would reap them while their stacks are still held here, and
/// free their pids for reuse while [`WaitingChild`]'s drop would still kill them.
pub fn reap_killed() -> nix::Result<()> {
    let killed = std::mem::take(&mut *KILLED.lock().unwrap_or_else(|e| e.into_inner()));
    let mut first_error = Ok(());
    for mut child in killed {
        child.reaped = true;
        if let Err(e) = nix::sys::wait::waitpid(child.pid, None) {
            first_error = first_error.and(Err(e));
        }
    }
    first_error
}

impl Drop for WaitingChild {
    fn drop(&mut self) {
        if !self.reaped {
            // Never free the stack under a live child.
            let _ = nix::sys::signal::kill(self.pid, Signal::SIGKILL);
            let _ = nix::sys::wait::waitpid(self.pid, None);
        }
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

    /// A child cloned into a new user namespace (or a visible skip where this kernel
    /// refuses one to us).
    fn waiting_child_or_skip() -> Option<WaitingChild> {
        match clone_waiting(nix::sched::CloneFlags::CLONE_NEWUSER) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("SKIPPED: no user namespace for this test ({e})");
                None
            }
        }
    }

    #[test]
    fn a_waiting_child_is_in_its_new_namespace_until_released_and_reaped() {
        let Some(child) = waiting_child_or_skip() else { return };
        let pid = child.pid();
        let ours = std::fs::read_link("/proc/self/ns/user").unwrap();
        let theirs = std::fs::read_link(format!("/proc/{pid}/ns/user")).unwrap();
        assert_ne!(ours, theirs, "the child is in a user namespace of its own");
        // Alive (waiting, or not yet run), not exited.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let state = stat.rsplit(')').next().unwrap().split_whitespace().next();
        assert!(matches!(state, Some("S" | "R")), "{stat}");
        drop(child);
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "killed and reaped");
    }

    #[test]
    fn a_waiting_child_holds_no_copy_of_our_files() {
        // A pipe open when the child is made: once we close its write end, its read end
        // is at EOF only if the child holds no copy of it (else: EAGAIN, no EOF ever).
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let Some(child) = waiting_child_or_skip() else { return };
        drop(w);
        let mut b = [0u8; 1];
        assert_eq!(nix::unistd::read(r.as_raw_fd(), &mut b), Ok(0), "EOF while the child lives");
        drop(child);
    }

    #[test]
    fn a_child_killed_for_later_is_reaped_by_reap_killed() {
        let Some(child) = waiting_child_or_skip() else { return };
        let pid = child.pid();
        child.kill_and_reap_later();
        // Killed: it exits without us waiting, and stays our zombie until reaped.
        let state = || {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            stat.rsplit(')').next().and_then(|r| r.split_whitespace().next()).unwrap_or("").to_string()
        };
        let start = std::time::Instant::now();
        while state() != "Z" && start.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(state(), "Z", "dead, not reaped yet");
        reap_killed().unwrap();
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "reaped");
        reap_killed().unwrap();
    }

    /// A helper killed before it released its child (its manager's death sends it
    /// SIGKILL) must not leave the child waiting forever, holding the helper's fd table
    /// (the firewall's shared lock among its files): the child dies with the thread that
    /// made it. Found when a killed manager's prepared helper left one behind and every
    /// later job's wait for the lock hung.
    #[test]
    fn a_waiting_child_dies_with_the_thread_that_made_it() {
        // Made by a thread that then ends without dropping it, as a killed helper would;
        // once the child waits (in its ppoll: its parent-death signal is set). A thread
        // that ended before that would go unnoticed: the child's new parent is another
        // thread of this process, whose pid getppid() returns just the same. A helper has
        // one thread: its death changes the child's getppid().
        let made = std::thread::spawn(|| {
            waiting_child_or_skip().map(|c| {
                let pid = c.pid();
                let wchan = || std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
                let start = std::time::Instant::now();
                while !wchan().contains("poll") && start.elapsed() < std::time::Duration::from_secs(5) {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                // Its stack stays allocated: leaked with it.
                std::mem::forget(c);
                pid
            })
        })
        .join()
        .unwrap();
        let Some(pid) = made else { return };
        // Still this process's child to reap (the thread's children pass to the others).
        let start = std::time::Instant::now();
        let status = loop {
            match nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG)).unwrap() {
                nix::sys::wait::WaitStatus::StillAlive if start.elapsed() < std::time::Duration::from_secs(5) => {
                    std::thread::sleep(std::time::Duration::from_millis(5))
                }
                nix::sys::wait::WaitStatus::StillAlive => {
                    let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
                    let _ = nix::sys::wait::waitpid(pid, None);
                    panic!("the child outlived the thread that made it by 5 s");
                }
                st => break st,
            }
        };
        assert_eq!(status, nix::sys::wait::WaitStatus::Signaled(pid, Signal::SIGKILL, false));
    }

    #[test]
    fn a_dropped_waiting_child_is_reaped() {
        let Some(child) = waiting_child_or_skip() else { return };
        let pid = child.pid();
        drop(child);
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "killed and reaped");
    }

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
