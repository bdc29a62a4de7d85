//! `azp-init`: pid 1 of every job, as `docker run --init` (tini) and catatonit.
//!
//! A separate, tiny, statically linked program (build.rs compiles it with `$RUSTC`; the
//! main binary embeds it, see `sandbox::init`): the job's rootfs has its own libc, so
//! the init must need none. It runs as the job's user with the job's capabilities,
//! seccomp filter and no_new_privileges: it needs no privilege at all.
//!
//! `azp-init CMD [ARGS...]`:
//! - runs CMD (searched in `$PATH`) as its child, in a process group of its own; when
//!   its stdin is its controlling terminal (`exec -t`, `shell`), that group is made the
//!   terminal's foreground group, so the keyboard's Ctrl-C reaches the foreground job only;
//! - forwards every signal it gets (TERM, INT, HUP, QUIT, USR1, USR2, WINCH, ...) to that
//!   process group (tini -g): the kernel drops a signal sent from outside a pid namespace
//!   to its pid 1 unless pid 1 handles it, and a shell would not pass it on anyway;
//! - reaps every zombie (orphans of the job are reparented to it);
//! - exits with CMD's exit code, 128+n when CMD was killed by signal n, once CMD is gone
//!   (the kernel then kills what is left of the job: pid 1 ended its pid namespace);
//! - when CMD cannot run: one line, exit 127 (not found) or 126 (not executable), as
//!   shells, docker and podman do;
//! - is not dumpable, so the job cannot write its memory through `/proc/1/mem`;
//! - fd 3, when open, is the lifeline from the job's supervisor (the sandbox helper holds
//!   the write end): at its EOF the supervisor is gone, by whatever signal, and the init
//!   ends the job at once instead of leaving it to a later `gc`.
//!
//! Every signal stays blocked in the init and is read from a signalfd, so nothing runs
//! in signal context; the child gets an empty mask and default dispositions back.
//!
//! Built as its own crate (`--cfg azp_init_bin`) with `no_std` and, on x86_64, no libc
//! either (`raw_x86_64.rs`): it is an exec on every job's path, and a static glibc's own
//! start (CPU feature detection, each `cpuid` a hypervisor trap in a VM) cost ~0.3 ms of
//! it (bench/NOTES.md). Also compiled into the library's unit tests, which test the pure parts
//! here and the built binary as an ordinary process (`sandbox::init`).
#![cfg_attr(azp_init_bin, no_std, no_main)]
#![allow(non_camel_case_types, clippy::upper_case_acronyms)]

use core::ffi::{c_char, c_int, c_short, c_ulong, c_void, CStr};

/// The kernel structs and numbers both backends use.
#[path = "abi.rs"]
mod abi;
/// The few system calls the init makes, with libc's names: raw system calls on x86_64
/// (no libc at all: nothing to set up at start, see `raw_x86_64.rs`), glibc's static
/// archive elsewhere.
#[cfg(target_arch = "x86_64")]
#[path = "raw_x86_64.rs"]
mod c;
#[cfg(not(target_arch = "x86_64"))]
#[path = "glibc.rs"]
mod c;

/// Signals the kernel raises on a fault of the process itself: never blocked (a blocked
/// synchronous signal still kills) and never forwarded.
const SYNCHRONOUS: [c_int; 7] = [
    4,  /*ILL*/
    5,  /*TRAP*/
    6,  /*ABRT*/
    7,  /*BUS*/
    8,  /*FPE*/
    11, /*SEGV*/
    31, /*SYS*/
];
const SIGKILL: c_int = 9;
const SIGSTOP: c_int = 19;
const SIGCHLD: c_int = 17;
/// The lifeline's fd number (see the module doc).
const LIFELINE_FD: c_int = 3;

/// A byte string aligned as `A`: the filter below is read in place by the kernel as an
/// array of `struct sock_filter` (u16, u8, u8, u32), which needs 4-byte alignment.
#[repr(C)]
struct AlignedAs<A, T: ?Sized> {
    _align: [A; 0],
    bytes: T,
}

/// The jobs' seccomp filter: the BPF program build.rs compiles from
/// `src/sandbox/seccomp.rs` with libseccomp, carried here so that no job pays for its
/// compilation.
static SECCOMP_FILTER: &AlignedAs<u64, [u8]> =
    &AlignedAs { _align: [], bytes: *include_bytes!(concat!(env!("OUT_DIR"), "/seccomp.bpf")) };

/// The same with the job's core dump limit fixed (`sandbox::seccomp::core_fixed_rules`),
/// for hosts that pipe core dumps to a program.
static SECCOMP_FILTER_CORE_FIXED: &AlignedAs<u64, [u8]> =
    &AlignedAs { _align: [], bytes: *include_bytes!(concat!(env!("OUT_DIR"), "/seccomp-core-fixed.bpf")) };

/// Which filter the init installs: `--seccomp`, `--seccomp-core-fixed`, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    None,
    Jobs,
    JobsCoreFixed,
}

/// Installs `filter` on the init, so that CMD inherits it through fork and exec.
/// no_new_privs first: seccomp needs it from a process without CAP_SYS_ADMIN (a job's
/// spec sets it already; here it costs one call and makes the init sufficient). Err: the
/// step that failed (for its message) and its errno.
fn install_seccomp_filter(filter: &'static AlignedAs<u64, [u8]>) -> Result<(), (&'static [u8], c_int)> {
    let bytes = &filter.bytes;
    let prog = c::sock_fprog { len: (bytes.len() / 8) as u16, filter: bytes.as_ptr().cast() };
    // SAFETY: prctl(2) with integers only.
    if unsafe { c::prctl(c::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err((b"cannot set no_new_privs", errno()));
    }
    // SAFETY: prctl(2) with a pointer to a live sock_fprog whose `filter` points at `len`
    // 8-byte instructions (build.rs checks the size) in a static, 8-byte aligned buffer;
    // the kernel copies the program.
    if unsafe { c::prctl(c::PR_SET_SECCOMP, c::SECCOMP_MODE_FILTER, &prog as *const c::sock_fprog as c_ulong, 0, 0) }
        != 0
    {
        return Err((b"cannot install the job's seccomp filter", errno()));
    }
    Ok(())
}

/// `[--seccomp | --seccomp-core-fixed] [--] CMD [ARGS...]`: which filter to install, and
/// the index of CMD in `args` (`args.len()` when there is none).
pub fn parse_options(args: &[&[u8]]) -> (Filter, usize) {
    let mut i = 1;
    let filter = match args.get(i).copied() {
        Some(b"--seccomp") => Filter::Jobs,
        Some(b"--seccomp-core-fixed") => Filter::JobsCoreFixed,
        _ => Filter::None,
    };
    if filter != Filter::None {
        i += 1;
    }
    if args.get(i) == Some(&&b"--"[..]) {
        i += 1;
    }
    (filter, i)
}

/// The init's exit code for the way CMD ended (a raw wait status).
pub fn exit_code(status: c_int) -> c_int {
    let signal = status & 0x7f;
    if signal == 0 {
        (status >> 8) & 0xff
    } else {
        128 + signal
    }
}

/// Whether a signal the init received goes on to the job (not its own child's end).
pub fn forwarded(sig: c_int) -> bool {
    sig != SIGCHLD && sig != SIGKILL && sig != SIGSTOP && !SYNCHRONOUS.contains(&sig)
}

/// Exit code and what follows `azp-sandbox: CMD: ` in the one line printed when
/// `execvp(CMD)` failed with `errno`; `exists`: a file named by CMD (a path) exists, so
/// ENOENT came from its interpreter or loader.
pub fn exec_failure(errno: c_int, exists: bool) -> (c_int, &'static str) {
    match errno {
        c::ENOENT if exists => (126, "cannot run: its interpreter (#!) or ELF loader is missing"),
        c::ENOENT => (127, "command not found"),
        c::EACCES => (126, "permission denied (not an executable file)"),
        _ => (126, "cannot run"),
    }
}

fn errno() -> c_int {
    c::errno()
}

fn write_stderr(msg: &[u8]) {
    // SAFETY: write(2) reads `msg.len()` bytes from a live buffer; a short or failed
    // write of a diagnostic is acceptable.
    unsafe { c::write(2, msg.as_ptr().cast(), msg.len()) };
}

/// A short message built without an allocator (what does not fit is dropped).
struct Line {
    buf: [u8; 512],
    len: usize,
}

impl Default for Line {
    fn default() -> Line {
        Line { buf: [0; 512], len: 0 }
    }
}

impl Line {
    fn push(&mut self, part: &[u8]) {
        let n = part.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&part[..n]);
        self.len += n;
    }
    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// `n` in decimal, into the end of `buf`; the digits.
fn decimal(mut n: u32, buf: &mut [u8; 10]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// Every signal but the synchronous ones (and KILL/STOP, which cannot be blocked).
fn blockable() -> c::sigset_t {
    let mut set = c::empty_sigset();
    // SAFETY: sigfillset/sigdelset write into a live, properly sized sigset_t.
    unsafe {
        c::sigfillset(&mut set);
        for s in SYNCHRONOUS {
            c::sigdelset(&mut set, s);
        }
    }
    set
}

/// In the forked child, before exec: its own process group (the terminal's foreground
/// one when there is a terminal), default signal dispositions, an empty mask. Then CMD.
/// Only async-signal-safe calls until exec; allocation only on the failure path, after
/// which the child ends with `_exit`.
fn child(cmd_argv: *const *const c_char) -> ! {
    // SAFETY: cmd_argv is the tail of main's argument vector from CMD on (NULL-terminated,
    // CMD present); every call below takes integers or that vector and returns an int.
    unsafe {
        c::setpgid(0, 0);
        // A terminal that is ours (the session's controlling terminal, set up for
        // `exec -t`): hand it to the job's group. Not a terminal merely passed through as
        // stdin (then tcgetsid fails or names another session).
        if c::tcgetsid(0) == c::getsid(0) && c::tcgetsid(0) > 0 {
            c::tcsetpgrp(0, c::getpid());
        }
        // Handlers are reset by exec anyway; what a supervisor ignored (SIG_IGN) would
        // stay ignored in the job. The standard signals only: an ignored real-time one is
        // not worth 30 more syscalls on every job's path.
        for sig in 1..=31 {
            if sig != SIGKILL && sig != SIGSTOP {
                c::signal(sig, c::SIG_DFL);
            }
        }
        let mut empty = c::empty_sigset();
        c::sigemptyset(&mut empty);
        c::sigprocmask(c::SIG_SETMASK, &empty, core::ptr::null_mut());
        let cmd = *cmd_argv;
        c::execvp(cmd, cmd_argv);
        let e = errno();
        let name = CStr::from_ptr(cmd).to_bytes();
        let exists = name.contains(&b'/') && c::access(cmd, c::F_OK) == 0;
        let (code, what) = exec_failure(e, exists);
        let mut errno_buf = [0u8; 10];
        let mut line = Line::default();
        line.push(b"azp-sandbox: ");
        line.push(&name[..name.len().min(400)]);
        line.push(b": ");
        line.push(what.as_bytes());
        if what == "cannot run" {
            line.push(b" (errno ");
            line.push(decimal(e as u32, &mut errno_buf));
            line.push(b")");
        }
        line.push(b"\n");
        // One write, so that the line is not torn by other output.
        write_stderr(line.bytes());
        c::_exit(code)
    }
}

/// Sends `sig` to the job: CMD's process group, or CMD alone if it left that group.
fn forward(child: c::pid_t, sig: c_int) {
    // SAFETY: kill(2) takes integers only.
    unsafe {
        if c::kill(-child, sig) != 0 && errno() == c::ESRCH {
            c::kill(child, sig);
        }
    }
}

/// The supervisor is gone: end the job now. As pid 1, exiting is enough (the kernel
/// kills the rest of the pid namespace); otherwise (tests) the init kills CMD's group.
fn lifeline_lost(child: c::pid_t) -> ! {
    // SAFETY: kill(2) and _exit(2) take integers only.
    unsafe {
        if c::getpid() != 1 {
            c::kill(-child, SIGKILL);
            c::kill(child, SIGKILL);
        }
        c::_exit(128 + SIGKILL)
    }
}

/// Reaps every child that has ended; Some(status) when CMD is among them.
fn reap(child: c::pid_t) -> Option<c_int> {
    let mut main = None;
    loop {
        let mut status: c_int = 0;
        // SAFETY: waitpid(2) writes one int into a live local.
        let pid = unsafe { c::waitpid(-1, &mut status, c::WNOHANG) };
        if pid <= 0 {
            return main;
        }
        if pid == child {
            main = Some(status);
        }
    }
}

/// The init: see the module doc. Returns the exit code.
///
/// # Safety
/// `argv` must be a NULL-terminated vector of `argc` C strings (as the C runtime passes
/// to main).
pub unsafe fn run(argc: c_int, argv: *const *const c_char) -> c_int {
    // The options come in argv[1] and argv[2] at most: argv[0..3], as far as there are.
    let n = argc.clamp(0, 3) as usize;
    let mut first = [&b""[..]; 3];
    for (i, slot) in first.iter_mut().enumerate().take(n) {
        // SAFETY: i < argc, so argv[i] is one of main's NUL-terminated strings.
        *slot = unsafe { CStr::from_ptr(*argv.add(i)) }.to_bytes();
    }
    let (filter, cmd) = parse_options(&first[..n]);
    if cmd >= argc as usize {
        write_stderr(b"usage: azp-init [--seccomp | --seccomp-core-fixed] [--] CMD [ARGS...]\n");
        return 2;
    }
    let program = match filter {
        Filter::None => None,
        Filter::Jobs => Some(SECCOMP_FILTER),
        Filter::JobsCoreFixed => Some(SECCOMP_FILTER_CORE_FIXED),
    };
    if let Some(program) = program {
        if let Err((what, e)) = install_seccomp_filter(program) {
            let mut line = Line::default();
            let mut errno_buf = [0u8; 10];
            line.push(b"azp-init: ");
            line.push(what);
            line.push(b" (errno ");
            line.push(decimal(e as u32, &mut errno_buf));
            line.push(b")\n");
            write_stderr(line.bytes());
            return 125;
        }
    }
    let blocked = blockable();
    // SAFETY: each call takes integers or the live sigset above; results are checked
    // where a failure changes what the init can do.
    let (sfd, lifeline) = unsafe {
        // Never handed on to CMD; absent (EBADF) when the init runs without one.
        let lifeline = c::fcntl(LIFELINE_FD, c::F_GETFD, 0) >= 0;
        if lifeline {
            c::fcntl(LIFELINE_FD, c::F_SETFD, c::FD_CLOEXEC);
        }
        // Orphans of CMD come back to us when we are not pid 1 (tests): reaped all the same.
        c::prctl(c::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        // The init is the job's lifeline: the job (same uid, no CAP_SYS_PTRACE) must not
        // open its /proc/1/mem and rewrite it (nor ptrace it: seccomp also refuses that).
        // Not dumpable, /proc/1/{mem,root,cwd,exe,environ,fd} are closed to the job;
        // CMD is dumpable again once it execs.
        if c::prctl(c::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 {
            write_stderr(b"azp-init: cannot make itself undumpable\n");
            return 125;
        }
        if c::sigprocmask(c::SIG_BLOCK, &blocked, core::ptr::null_mut()) != 0 {
            write_stderr(b"azp-init: cannot block signals\n");
            return 125;
        }
        let sfd = c::signalfd(-1, &blocked, c::SFD_CLOEXEC);
        if sfd < 0 {
            write_stderr(b"azp-init: cannot create a signalfd\n");
            return 125;
        }
        (sfd, lifeline)
    };
    // SAFETY: fork(2) in a single-threaded process; the child only runs `child`.
    let pid = unsafe { c::fork() };
    if pid < 0 {
        write_stderr(b"azp-init: cannot fork\n");
        return 125;
    }
    if pid == 0 {
        // SAFETY: cmd < argc: CMD and what follows it, up to argv's NULL.
        child(unsafe { argv.add(cmd) });
    }
    // Also from this side, so that a signal forwarded before the child ran setpgid
    // reaches its group (whichever runs first wins; the other is a no-op or EACCES).
    // SAFETY: setpgid(2) takes integers only.
    unsafe { c::setpgid(pid, pid) };
    let mut fds = [
        c::pollfd { fd: sfd, events: c::POLLIN, revents: 0 },
        c::pollfd { fd: if lifeline { LIFELINE_FD } else { -1 }, events: c::POLLIN, revents: 0 },
    ];
    loop {
        // SAFETY: poll(2) on a live array of two pollfds (a negative fd is skipped).
        let n = unsafe { c::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if errno() == c::EINTR {
                continue;
            }
            write_stderr(b"azp-init: poll failed\n");
            return 125;
        }
        if fds[1].revents & (c::POLLIN | c::POLLHUP | c::POLLERR) != 0 {
            let mut b = [0u8; 64];
            // SAFETY: read(2) into a live local buffer of its length.
            let r = unsafe { c::read(LIFELINE_FD, b.as_mut_ptr().cast(), b.len()) };
            if r <= 0 {
                lifeline_lost(pid);
            }
        }
        if fds[0].revents & c::POLLIN != 0 {
            let mut infos: [c::signalfd_siginfo; 8] =
                core::array::from_fn(|_| c::signalfd_siginfo { ssi_signo: 0, rest: [0; 124] });
            let size = core::mem::size_of::<c::signalfd_siginfo>();
            // SAFETY: read(2) into a live array of signalfd_siginfo (128 bytes each).
            let r = unsafe { c::read(sfd, infos.as_mut_ptr().cast(), size * infos.len()) };
            let got = if r > 0 { r as usize / size } else { 0 };
            for info in &infos[..got] {
                let sig = info.ssi_signo as c_int;
                if sig == SIGCHLD {
                    if let Some(status) = reap(pid) {
                        return exit_code(status);
                    }
                } else if forwarded(sig) {
                    forward(pid, sig);
                }
            }
        }
    }
}

#[cfg(azp_init_bin)]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    write_stderr(b"azp-init: internal error\n");
    // SAFETY: _exit(2) takes an integer and does not return.
    unsafe { c::_exit(125) }
}

#[cfg(azp_init_bin)]
#[no_mangle]
pub extern "C" fn main(argc: c_int, argv: *const *const c_char) -> c_int {
    // SAFETY: the C runtime passes main a NULL-terminated argv of argc strings.
    let code = unsafe { run(argc, argv) };
    // Straight out: nothing of the init's to flush or unwind.
    // SAFETY: _exit(2) takes an integer and does not return.
    unsafe { c::_exit(code) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell() {
        assert_eq!(exit_code(7 << 8), 7);
        assert_eq!(exit_code(0), 0);
        assert_eq!(exit_code(2), 130, "SIGINT");
        assert_eq!(exit_code(9 | 0x80), 137, "SIGKILL with a core flag");
    }

    #[test]
    fn which_signals_go_on_to_the_job() {
        for s in [1, 2, 3, 10, 12, 15, 20, 28, 34, 64] {
            assert!(forwarded(s), "{s}");
        }
        for s in [SIGCHLD, SIGKILL, SIGSTOP, 11, 7] {
            assert!(!forwarded(s), "{s}");
        }
    }

    #[test]
    fn a_command_that_cannot_run_gets_the_shells_code() {
        assert_eq!(exec_failure(c::ENOENT, false), (127, "command not found"));
        assert_eq!(exec_failure(c::EACCES, true), (126, "permission denied (not an executable file)"));
        let (code, what) = exec_failure(c::ENOENT, true);
        assert!(code == 126 && what.contains("interpreter"), "{what}");
        assert_eq!(exec_failure(8, false), (126, "cannot run"));
        let mut buf = [0u8; 10];
        assert_eq!(decimal(0, &mut buf), b"0");
        assert_eq!(decimal(4_294_967_295, &mut buf), b"4294967295");
    }
}
