//! Signal dispositions and waits. Every handler installed here only does atomic loads
//! and stores and kill(2) (errno saved around it), which are async-signal-safe; what it
//! acts on is a `'static` atomic the caller registers first.

use nix::sys::signal::{SigHandler, SigSet, Signal};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, Ordering};
use std::time::Duration;

/// Starts a thread that has every signal blocked (glibc keeps its own two open), so
/// that signals meant for the process go to the threads that take them: a terminal
/// relay's SIGWINCH, read from a signalfd by a thread that blocks it and no other
/// (`sandbox::console`), would otherwise be taken by this thread and lost.
pub fn spawn_blocking_all<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<T>> {
    use nix::sys::signal::SigmaskHow;
    let mut old = SigSet::empty();
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::all()), Some(&mut old))?;
    let spawned = std::thread::Builder::new().name(name.into()).spawn(f);
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None)?;
    spawned
}

/// Restores the default action of `sig` (e.g. SIGPIPE, which Rust's runtime ignores:
/// `azp-sandbox gpu list | head` then ends quietly instead of failing on EPIPE).
pub fn restore_default(sig: Signal) {
    // SAFETY: SIG_DFL installs no handler code of ours, so nothing can run in signal
    // context because of this call.
    let _ = unsafe { nix::sys::signal::signal(sig, SigHandler::SigDfl) };
}

static FLAG: AtomicPtr<AtomicBool> = AtomicPtr::new(std::ptr::null_mut());
static RECORD: AtomicPtr<AtomicI32> = AtomicPtr::new(std::ptr::null_mut());
static FORWARD: AtomicPtr<AtomicI32> = AtomicPtr::new(std::ptr::null_mut());

extern "C" fn set_flag(_: libc::c_int) {
    let p = FLAG.load(Ordering::SeqCst);
    // SAFETY: FLAG is null or was set from a `&'static AtomicBool` (see set_flag_on), so
    // the pointer is valid for the whole life of the process and only read shared.
    if let Some(flag) = unsafe { p.as_ref() } {
        flag.store(true, Ordering::SeqCst);
    }
}

extern "C" fn record(sig: libc::c_int) {
    let p = RECORD.load(Ordering::SeqCst);
    // SAFETY: RECORD is null or was set from a `&'static AtomicI32` (see record_on).
    if let Some(slot) = unsafe { p.as_ref() } {
        slot.store(sig, Ordering::SeqCst);
    }
}

extern "C" fn forward(sig: libc::c_int) {
    let p = FORWARD.load(Ordering::SeqCst);
    // SAFETY: FORWARD is null or was set from a `&'static AtomicI32` (see forward_on).
    let pid = unsafe { p.as_ref() }.map_or(0, |pid| pid.load(Ordering::SeqCst));
    if pid > 0 {
        // kill(2) may set errno, which belongs to the code this handler interrupted.
        let saved = nix::errno::Errno::last_raw();
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::try_from(sig).ok());
        nix::errno::Errno::set_raw(saved);
    }
}

fn install(sigs: &[Signal], handler: extern "C" fn(libc::c_int)) {
    for &sig in sigs {
        // SAFETY: every handler in this module only loads and stores atomics and calls
        // kill(2), all async-signal-safe, and reads no state that the interrupted code
        // could be changing non-atomically. glibc's signal() sets SA_RESTART, so
        // interrupted syscalls resume.
        let _ = unsafe { nix::sys::signal::signal(sig, SigHandler::Handler(handler)) };
    }
}

extern "C" fn absorb(_: libc::c_int) {}

/// Makes `sigs` harmless to this process: a handler that returns at once, so that e.g. a
/// write to a pipe whose reader is gone fails with EPIPE instead of killing it. Unlike
/// SIG_IGN, which execve keeps, a handler goes back to the default at execve: what this
/// process execs (a job) gets the default action.
pub fn absorb_on(sigs: &[Signal]) {
    install(sigs, absorb);
}

/// On any of `sigs`, sets `flag` (e.g. to stop an import at the next entry).
pub fn set_flag_on(sigs: &[Signal], flag: &'static AtomicBool) {
    FLAG.store(std::ptr::from_ref(flag).cast_mut(), Ordering::SeqCst);
    install(sigs, set_flag);
}

/// On any of `sigs`, stores the signal's number in `slot` (the last one wins).
pub fn record_on(sigs: &[Signal], slot: &'static AtomicI32) {
    RECORD.store(std::ptr::from_ref(slot).cast_mut(), Ordering::SeqCst);
    install(sigs, record);
}

/// On any of `sigs`, sends the same signal to the pid in `pid` (when it is above 0).
pub fn forward_on(sigs: &[Signal], pid: &'static AtomicI32) {
    FORWARD.store(std::ptr::from_ref(pid).cast_mut(), Ordering::SeqCst);
    install(sigs, forward);
}

/// Waits up to `timeout` for one of the signals in `set` (which the caller has
/// blocked); None on timeout or interruption.
pub fn wait_timeout(set: &SigSet, timeout: Duration) -> Option<Signal> {
    let ts = libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as _ };
    // SAFETY: `set` is an initialised sigset_t and `ts` a timespec, both borrowed for the
    // call, which only reads them; a null siginfo pointer is allowed by sigtimedwait(2).
    let r = unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), &ts) };
    (r > 0).then(|| Signal::try_from(r).ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_signal_is_waited_for_and_a_timeout_gives_none() {
        // Blocked on this thread only; sent to this thread only.
        let mut set = SigSet::empty();
        set.add(Signal::SIGUSR2);
        set.thread_block().unwrap();
        assert_eq!(wait_timeout(&set, Duration::from_millis(1)), None);
        nix::sys::signal::raise(Signal::SIGUSR2).unwrap(); // to this thread
        assert_eq!(wait_timeout(&set, Duration::from_secs(5)), Some(Signal::SIGUSR2));
        set.thread_unblock().unwrap();
    }

    #[test]
    fn a_thread_started_blocking_all_takes_no_signal_of_the_process() {
        let mask = |set: &mut SigSet| {
            nix::sys::signal::pthread_sigmask(nix::sys::signal::SigmaskHow::SIG_BLOCK, None, Some(set)).unwrap()
        };
        let mut ours = SigSet::empty();
        mask(&mut ours);
        let theirs = spawn_blocking_all("t", move || {
            let mut m = SigSet::empty();
            mask(&mut m);
            m
        })
        .unwrap()
        .join()
        .unwrap();
        for sig in [Signal::SIGWINCH, Signal::SIGINT, Signal::SIGTERM, Signal::SIGCHLD, Signal::SIGIO] {
            assert!(theirs.contains(sig), "{sig} open in the thread");
        }
        // The caller's own mask is as it was.
        let mut after = SigSet::empty();
        mask(&mut after);
        assert_eq!(
            Signal::iterator().map(|s| after.contains(s)).collect::<Vec<_>>(),
            Signal::iterator().map(|s| ours.contains(s)).collect::<Vec<_>>()
        );
    }
}
