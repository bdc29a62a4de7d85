//! Keeping the kernel's cgroup-move window open while an `exec` sets its job up.
//!
//! Every write to a `cgroup.procs` takes the kernel's global cgroup_threadgroup_rwsem
//! for writing. Its rcu_sync lets a writer through at once only while the sync is
//! "entered": from a first writer that waited for a normal RCU grace period (5-20 ms on
//! the CI VM) until about a grace period after the last writer left. A job's cycle makes
//! several moves spread over ~10 ms (the helper into the job's cgroups, libcontainer's
//! init into its leaf), and a move that came after the window had closed waited a whole
//! grace period again (traced: the helper's move waited 7-20 ms in half of 30
//! back-to-back cycles, bench/NOTES.md).
//!
//! So the first thing an `exec` does is start a keeper: a child that moves itself into
//! the cgroup it is already in (`procs`: its own `cgroup.procs`; "0" names the writer;
//! no process changes cgroups) once at once, starting the grace period while the command
//! line is still planning, and then every [`INTERVAL`] for at most [`ROUNDS`] rounds, so
//! that the window stays open until the job's own moves are made. Each of its writes
//! holds the lock for microseconds, as any container runtime's move does.
//!
//! The keeper is cheap: `clone(CLONE_VM|CLONE_FILES)` without CLONE_THREAD, a process of
//! its own that shares this one's memory and fd table (no page tables copied, no
//! copy-on-write faults), running one function of raw system calls on a small stack of
//! its own, with every signal blocked. It touches no memory of ours but [`Shared`], never
//! allocates, and never writes errno (it shares our thread pointer, so libc's errno would
//! be the main thread's): its system calls are made with `asm!`, on x86_64. Elsewhere
//! [`hold`] starts nothing and `sandbox::cgroup` falls back to one write in a forked
//! grandchild (`sys::cgroup::start_move_grace_period`): the asm of another architecture
//! belongs where it can be built and tested.

use super::error::{Error, Result};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

/// Time between the keeper's writes: shorter than the grace periods it spans (a window
/// stays open about one grace period after the last writer), long enough that its
/// writes cost nothing measurable.
pub const INTERVAL: std::time::Duration = std::time::Duration::from_millis(2);
/// At most this many writes after the first: ~40 ms, more than a job's set-up takes
/// from `exec`'s start to its container's start (~10 ms here, ~25 ms with a GPU's
/// first edit layer).
pub const ROUNDS: u32 = 20;

/// The keeper's stack: a few frames of raw system calls.
const STACK: usize = 16 * 1024;

/// What the keeper reads: its cgroup.procs fd and when to stop.
#[repr(C)]
struct Shared {
    fd: i32,
    parent: i32,
    stop: AtomicBool,
}

/// A running keeper. Dropping it stops, kills and reaps the keeper (it is our child
/// until then, so its pid cannot be reused); hold it until the job's moves are done.
/// Nothing else in the process may wait for any child (`waitpid(-1)`): that would reap
/// the keeper, and the drop would then kill a pid that may have been reused. `exec`
/// waits for its helper and threads by pid only.
pub struct MoveWindow {
    pid: i32,
    // Both freed only after the keeper is reaped: it runs on the stack and reads
    // `shared`. Raw, not a Box: a Box moved after the keeper got its address would
    // assert it is the only pointer to it.
    shared: NonNull<Shared>,
    stack: NonNull<[u8]>,
    _procs: OwnedFd,
}

// SAFETY: `shared` and `stack` are owned by this value alone on our side (the keeper
// reads `shared` and runs on `stack`, both freed only after it is reaped), and `Shared`
// holds only integers and an atomic: moving the value to another thread is sound.
unsafe impl Send for MoveWindow {}

impl std::fmt::Debug for MoveWindow {
    /// The pid only: the stack is the keeper's, being written while it runs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MoveWindow").field("pid", &self.pid).finish_non_exhaustive()
    }
}

/// Starts the keeper on `procs` (a cgroup.procs of the cgroup this process is in).
/// Ok(None) where the keeper's raw system calls are not written (other architectures).
pub fn hold(procs: &Path) -> Result<Option<MoveWindow>> {
    if !raw::AVAILABLE {
        return Ok(None);
    }
    // O_CLOEXEC (std's default): a re-executed helper never sees it.
    let fd = std::fs::OpenOptions::new()
        .write(true)
        .open(procs)
        .map_err(|source| Error::MoveWindowOpen { procs: procs.to_path_buf(), source })?;
    let fd = OwnedFd::from(fd);
    let shared =
        Box::new(Shared { fd: fd.as_raw_fd(), parent: std::process::id() as i32, stop: AtomicBool::new(false) });
    let shared = NonNull::from(Box::leak(shared));
    let stack = NonNull::from(Box::leak(vec![0u8; STACK].into_boxed_slice()));
    match clone_keeper(shared, stack) {
        Ok(pid) => Ok(Some(MoveWindow { pid, shared, stack, _procs: fd })),
        Err(e) => {
            // SAFETY: no keeper was made: both allocations are ours alone again, leaked
            // just above from these very boxes.
            unsafe {
                drop(Box::from_raw(shared.as_ptr()));
                drop(Box::from_raw(stack.as_ptr()));
            }
            Err(Error::MoveWindowClone(e))
        }
    }
}

/// Clones the keeper (see the module doc); its pid.
fn clone_keeper(shared: NonNull<Shared>, stack: NonNull<[u8]>) -> std::result::Result<i32, nix::errno::Errno> {
    // SAFETY: `keep_window` makes raw system calls only and reads only `shared` (but for
    // its atomic `stop`, unchanged while the keeper lives); both it and `stack` are owned
    // by the returned MoveWindow, which frees them only after the keeper is reaped.
    let pid = unsafe { super::process::clone_sharing_memory(keep_window, shared.as_ptr().cast(), stack, 0) }?;
    Ok(pid.as_raw())
}

/// The keeper's whole life (see the module doc). Raw system calls only.
extern "C" fn keep_window(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Shared` that `clone_keeper` was given; the MoveWindow keeps it
    // alive and unmoved until this process is reaped. Only `stop` changes meanwhile, and
    // it is atomic.
    let shared = unsafe { &*(arg as *const Shared) };
    // Killed with the `exec` that started it; gone at once if that exec is already gone.
    raw::die_with_parent();
    if raw::parent() != shared.parent {
        raw::exit(0);
    }
    for _ in 0..=ROUNDS {
        if raw::write_zero(shared.fd) < 0 || shared.stop.load(Ordering::Relaxed) {
            break;
        }
        raw::sleep(INTERVAL);
    }
    raw::exit(0)
}

impl MoveWindow {
    /// The keeper's pid (for tests).
    pub fn pid(&self) -> i32 {
        self.pid
    }
}

impl Drop for MoveWindow {
    fn drop(&mut self) {
        // SAFETY: `shared` is live until the end of this function; `stop` is atomic.
        unsafe { self.shared.as_ref() }.stop.store(true, Ordering::Relaxed);
        // Our unreaped child: its pid cannot have been reused. SIGKILL ends it in its
        // sleep; a write under way finishes first (the kernel's lock is not interrupted).
        let pid = nix::unistd::Pid::from_raw(self.pid);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        if nix::sys::wait::waitpid(pid, None).is_err() {
            // Not reaped here (it cannot be: it is our child, and nothing else waits for
            // any child): leak both rather than free what it might still use.
            return;
        }
        // SAFETY: the keeper is reaped: nothing else uses these allocations, leaked from
        // these boxes in `hold`.
        unsafe {
            drop(Box::from_raw(self.shared.as_ptr()));
            drop(Box::from_raw(self.stack.as_ptr()));
        }
    }
}

/// The keeper's system calls, made directly on x86_64 (another architecture needs its
/// numbers and its instruction here, built and tested there). Each returns the kernel's
/// result (-errno on failure) and writes no errno.
#[cfg(target_arch = "x86_64")]
mod raw {
    pub const AVAILABLE: bool = true;
    const WRITE: usize = 1;
    const NANOSLEEP: usize = 35;
    const EXIT: usize = 60;
    const GETPPID: usize = 110;
    const PRCTL: usize = 157;

    /// A system call of up to three arguments (unused ones 0, ignored by the kernel).
    #[inline(always)]
    fn syscall3(nr: usize, a: usize, b: usize, c: usize) -> isize {
        let ret: isize;
        // SAFETY: the x86_64 system call ABI: number in rax, arguments in rdi, rsi and
        // rdx, result in rax; the kernel clobbers rcx and r11 and touches no other
        // register or memory of ours but what each call's arguments point to (checked
        // below, call by call).
        unsafe {
            core::arch::asm!("syscall", inlateout("rax") nr as isize => ret, in("rdi") a, in("rsi") b, in("rdx") c,
                lateout("rcx") _, lateout("r11") _, options(nostack));
        }
        ret
    }

    pub fn write_zero(fd: i32) -> isize {
        // "0": the writer itself. The kernel reads the one byte and nothing else.
        syscall3(WRITE, fd as usize, b"0".as_ptr() as usize, 1)
    }

    pub fn sleep(d: std::time::Duration) {
        let ts = libc::timespec { tv_sec: d.as_secs() as libc::time_t, tv_nsec: d.subsec_nanos() as libc::c_long };
        // The kernel reads `ts` (a live local) and writes nothing (no remainder pointer).
        syscall3(NANOSLEEP, &ts as *const libc::timespec as usize, 0, 0);
    }

    pub fn die_with_parent() {
        syscall3(PRCTL, libc::PR_SET_PDEATHSIG as usize, libc::SIGKILL as usize, 0);
    }

    pub fn parent() -> i32 {
        syscall3(GETPPID, 0, 0, 0) as i32
    }

    pub fn exit(code: i32) -> ! {
        syscall3(EXIT, code as usize, 0, 0);
        // exit(2) does not return.
        loop {
            core::hint::spin_loop();
        }
    }
}

/// Other architectures: no keeper (see [`hold`]).
#[cfg(not(target_arch = "x86_64"))]
mod raw {
    pub const AVAILABLE: bool = false;
    pub fn write_zero(_: i32) -> isize {
        -1
    }
    pub fn sleep(_: std::time::Duration) {}
    pub fn die_with_parent() {}
    pub fn parent() -> i32 {
        0
    }
    pub fn exit(_: i32) -> ! {
        loop {
            core::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a plain file instead of a cgroup.procs: the keeper writes its "0" at once, again
    /// every INTERVAL, stops after ROUNDS, and is reaped by the drop (no zombie, no
    /// process left), all without touching this process's errno or signal mask.
    /// A keeper on an empty plain file standing in for a cgroup.procs (or a visible skip
    /// where there is no keeper); the dir holds the file.
    fn keeper_on_a_plain_file() -> Option<(tempfile::TempDir, std::path::PathBuf, MoveWindow)> {
        if !raw::AVAILABLE {
            eprintln!("SKIPPED: no keeper on this architecture");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cgroup.procs");
        std::fs::write(&file, "").unwrap();
        let window = hold(&file).unwrap().expect("a keeper");
        Some((dir, file, window))
    }

    #[test]
    fn the_keeper_writes_at_once_then_every_interval_and_is_reaped() {
        let mask_before = nix::sys::signal::SigSet::thread_get_mask().unwrap();
        let Some((_dir, file, window)) = keeper_on_a_plain_file() else { return };
        let pid = window.pid();
        assert_eq!(nix::sys::signal::SigSet::thread_get_mask().unwrap(), mask_before, "our mask is back");
        // The first write comes at once; then one every INTERVAL.
        let start = std::time::Instant::now();
        let written = || std::fs::read_to_string(&file).unwrap().len();
        while written() < 3 && start.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let n = written();
        assert!(n >= 3, "the keeper keeps writing ({n} writes)");
        assert!(std::fs::read_to_string(&file).unwrap().chars().all(|c| c == '0'), "only \"0\": the writer itself");
        assert!(std::path::Path::new(&format!("/proc/{pid}")).exists(), "alive while held");
        // Every signal blocked, glibc's internal 32 and 33 too; the kernel keeps SIGKILL
        // and SIGSTOP out of any mask.
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let blocked = status.lines().find_map(|l| l.strip_prefix("SigBlk:")).unwrap().trim();
        let blocked = u64::from_str_radix(blocked, 16).unwrap();
        let unblockable = (1u64 << (libc::SIGKILL - 1)) | (1u64 << (libc::SIGSTOP - 1));
        assert_eq!(blocked, !unblockable, "SigBlk {blocked:x}");
        drop(window);
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "killed and reaped by the drop");
        let after = written();
        std::thread::sleep(INTERVAL * 3);
        assert_eq!(written(), after, "no write after the drop");
    }

    /// Left alone, the keeper stops by itself after ROUNDS more writes and waits as a
    /// zombie for the drop to reap it.
    #[test]
    fn the_keeper_stops_by_itself_after_its_rounds() {
        let Some((_dir, file, window)) = keeper_on_a_plain_file() else { return };
        let state = || {
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", window.pid())).unwrap_or_default();
            stat.rsplit(')').next().and_then(|r| r.split_whitespace().next()).unwrap_or("").to_string()
        };
        let start = std::time::Instant::now();
        while state() != "Z" && start.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(INTERVAL);
        }
        assert_eq!(state(), "Z", "the keeper exited by itself");
        assert_eq!(std::fs::read_to_string(&file).unwrap().len(), ROUNDS as usize + 1, "one write, then ROUNDS more");
        drop(window);
    }

    #[test]
    fn a_missing_procs_file_is_an_error_that_names_it() {
        if !raw::AVAILABLE {
            return;
        }
        let e = hold(Path::new("/nonexistent/cgroup.procs")).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/cgroup.procs"), "{e}");
    }
}
