//! The init's system calls on x86_64, made directly: no libc at all. A static glibc
//! spends ~0.3 ms of every start on its own set-up (CPU feature detection, each `cpuid`
//! a trap to the hypervisor in a VM; ifunc relocations; TLS), and the init starts once
//! per job (bench/NOTES.md). Names and signatures follow libc's, so that `main.rs` reads
//! the same with either backend (`glibc.rs` elsewhere). Errors come back as -1 with
//! [`errno`] set, as from libc.
//!
//! Also here, as the program's own (the binary links no C runtime): `_start`, and the
//! memory functions the compiler may call (`memcpy`, `memmove`, `memset`, `memcmp`).

pub use super::abi::*;
use super::*;
use core::sync::atomic::{AtomicI32, AtomicPtr, Ordering};

/// The kernel's sigset: 64 signals (what the rt_sig* calls take, with size 8).
#[repr(C)]
pub struct sigset_t {
    pub val: u64,
}

/// The kernel's struct sigaction on x86_64.
#[repr(C)]
struct kernel_sigaction {
    handler: usize,
    flags: c_ulong,
    restorer: usize,
    mask: u64,
}

const ENOEXEC: c_int = 8;
const ENOTDIR: c_int = 20;
const ENODEV: c_int = 19;
const ETIMEDOUT: c_int = 110;
const ESTALE: c_int = 116;
const ENAMETOOLONG: c_int = 36;
const AT_FDCWD: c_int = -100;
const SIGCHLD: c_ulong = 17;
const TIOCSPGRP: c_ulong = 0x5410;
const TIOCGSID: c_ulong = 0x5429;

/// x86_64 system call numbers.
mod nr {
    pub const READ: usize = 0;
    pub const WRITE: usize = 1;
    pub const RT_SIGACTION: usize = 13;
    pub const RT_SIGPROCMASK: usize = 14;
    pub const IOCTL: usize = 16;
    pub const GETPID: usize = 39;
    pub const CLONE: usize = 56;
    pub const EXECVE: usize = 59;
    pub const WAIT4: usize = 61;
    pub const KILL: usize = 62;
    pub const FCNTL: usize = 72;
    pub const SETPGID: usize = 109;
    pub const GETSID: usize = 124;
    pub const PRCTL: usize = 157;
    pub const EXIT_GROUP: usize = 231;
    pub const FACCESSAT: usize = 269;
    pub const PPOLL: usize = 271;
    pub const SIGNALFD4: usize = 289;
}

/// The last failed call's error number (the init is one thread; a forked child has its
/// own copy).
static ERRNO: AtomicI32 = AtomicI32::new(0);
/// The environment `_start` found (for `execvp`'s PATH).
static ENVIRON: AtomicPtr<*const c_char> = AtomicPtr::new(core::ptr::null_mut());

pub fn errno() -> c_int {
    ERRNO.load(Ordering::Relaxed)
}

pub fn empty_sigset() -> sigset_t {
    sigset_t { val: 0 }
}

/// The raw call: the kernel's return value (-errno on failure).
///
/// # Safety
/// The arguments must be what system call `n` expects (pointers valid for it).
unsafe fn syscall6(n: usize, a: [usize; 6]) -> isize {
    let ret: isize;
    // SAFETY: the x86_64 system call ABI: number in rax, arguments in rdi, rsi, rdx, r10,
    // r8, r9; the kernel clobbers rcx and r11 and returns in rax. The caller guarantees
    // the arguments are valid for the call.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") n as isize => ret,
            in("rdi") a[0], in("rsi") a[1], in("rdx") a[2], in("r10") a[3], in("r8") a[4], in("r9") a[5],
            lateout("rcx") _, lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

/// libc's convention: -1 and [`errno`] on failure.
fn ret(r: isize) -> isize {
    if (-4095..0).contains(&r) {
        ERRNO.store(-r as c_int, Ordering::Relaxed);
        -1
    } else {
        r
    }
}

/// # Safety
/// As [`syscall6`].
unsafe fn call(n: usize, a: [usize; 6]) -> c_int {
    // SAFETY: forwarded from the caller.
    ret(unsafe { syscall6(n, a) }) as c_int
}

pub unsafe fn sigfillset(set: *mut sigset_t) -> c_int {
    // SAFETY: the caller passes a live sigset_t.
    unsafe { (*set).val = !0 };
    0
}

pub unsafe fn sigemptyset(set: *mut sigset_t) -> c_int {
    // SAFETY: the caller passes a live sigset_t.
    unsafe { (*set).val = 0 };
    0
}

pub unsafe fn sigdelset(set: *mut sigset_t, sig: c_int) -> c_int {
    // SAFETY: the caller passes a live sigset_t; signals are numbered from 1.
    unsafe { (*set).val &= !(1u64 << (sig - 1)) };
    0
}

pub unsafe fn sigprocmask(how: c_int, set: *const sigset_t, old: *mut sigset_t) -> c_int {
    // SAFETY: live sigsets (or null `old`) of the kernel's 8 bytes.
    unsafe { call(nr::RT_SIGPROCMASK, [how as usize, set as usize, old as usize, 8, 0, 0]) }
}

pub unsafe fn signalfd(fd: c_int, mask: *const sigset_t, flags: c_int) -> c_int {
    // SAFETY: a live 8-byte sigset.
    unsafe { call(nr::SIGNALFD4, [fd as usize, mask as usize, 8, flags as usize, 0, 0]) }
}

/// Only SIG_DFL (or SIG_IGN) dispositions: no handler, so no restorer is needed.
pub unsafe fn signal(sig: c_int, handler: usize) -> usize {
    let act = kernel_sigaction { handler, flags: 0, restorer: 0, mask: 0 };
    // SAFETY: a live kernel_sigaction; no old action asked for.
    unsafe { call(nr::RT_SIGACTION, [sig as usize, &act as *const _ as usize, 0, 8, 0, 0]) as usize }
}

pub unsafe fn poll(fds: *mut pollfd, nfds: u64, timeout: c_int) -> c_int {
    // Only an infinite wait is used (`timeout` < 0): ppoll with no timespec.
    debug_assert!(timeout < 0);
    // SAFETY: a live array of `nfds` pollfds; no timeout, no signal mask.
    unsafe { call(nr::PPOLL, [fds as usize, nfds as usize, 0, 0, 8, 0]) }
}

/// fork(2) as clone(2) with SIGCHLD and nothing shared.
pub unsafe fn fork() -> pid_t {
    // SAFETY: no stack, no shared memory: the child continues on a copy of this stack.
    unsafe { call(nr::CLONE, [SIGCHLD as usize, 0, 0, 0, 0, 0]) }
}

pub unsafe fn waitpid(pid: pid_t, status: *mut c_int, options: c_int) -> pid_t {
    // SAFETY: a live int for the status; no rusage.
    unsafe { call(nr::WAIT4, [pid as usize, status as usize, options as usize, 0, 0, 0]) }
}

pub unsafe fn kill(pid: pid_t, sig: c_int) -> c_int {
    // SAFETY: integers only.
    unsafe { call(nr::KILL, [pid as usize, sig as usize, 0, 0, 0, 0]) }
}

pub unsafe fn getpid() -> pid_t {
    // SAFETY: no arguments.
    unsafe { call(nr::GETPID, [0; 6]) }
}

pub unsafe fn getsid(pid: pid_t) -> pid_t {
    // SAFETY: an integer only.
    unsafe { call(nr::GETSID, [pid as usize, 0, 0, 0, 0, 0]) }
}

pub unsafe fn setpgid(pid: pid_t, pgid: pid_t) -> c_int {
    // SAFETY: integers only.
    unsafe { call(nr::SETPGID, [pid as usize, pgid as usize, 0, 0, 0, 0]) }
}

pub unsafe fn tcsetpgrp(fd: c_int, pgrp: pid_t) -> c_int {
    // SAFETY: TIOCSPGRP reads one pid_t from a live local.
    unsafe { call(nr::IOCTL, [fd as usize, TIOCSPGRP as usize, &pgrp as *const pid_t as usize, 0, 0, 0]) }
}

pub unsafe fn tcgetsid(fd: c_int) -> pid_t {
    let mut sid: pid_t = -1;
    // SAFETY: TIOCGSID writes one pid_t into a live local.
    let r = unsafe { call(nr::IOCTL, [fd as usize, TIOCGSID as usize, &mut sid as *mut pid_t as usize, 0, 0, 0]) };
    if r < 0 {
        -1
    } else {
        sid
    }
}

pub unsafe fn read(fd: c_int, buf: *mut c_void, n: usize) -> isize {
    // SAFETY: the caller's buffer is live for `n` bytes.
    ret(unsafe { syscall6(nr::READ, [fd as usize, buf as usize, n, 0, 0, 0]) })
}

pub unsafe fn write(fd: c_int, buf: *const c_void, n: usize) -> isize {
    // SAFETY: the caller's buffer is live for `n` bytes.
    ret(unsafe { syscall6(nr::WRITE, [fd as usize, buf as usize, n, 0, 0, 0]) })
}

pub unsafe fn fcntl(fd: c_int, cmd: c_int, arg: c_int) -> c_int {
    // SAFETY: F_GETFD and F_SETFD take integers only.
    unsafe { call(nr::FCNTL, [fd as usize, cmd as usize, arg as usize, 0, 0, 0]) }
}

pub unsafe fn prctl(option: c_int, a2: c_ulong, a3: c_ulong, a4: c_ulong, a5: c_ulong) -> c_int {
    // SAFETY: the caller passes what `option` expects (integers, or for PR_SET_SECCOMP a
    // live sock_fprog).
    unsafe { call(nr::PRCTL, [option as usize, a2 as usize, a3 as usize, a4 as usize, a5 as usize, 0]) }
}

pub unsafe fn access(path: *const c_char, mode: c_int) -> c_int {
    // SAFETY: a NUL-terminated path.
    unsafe { call(nr::FACCESSAT, [AT_FDCWD as usize, path as usize, mode as usize, 0, 0, 0]) }
}

pub unsafe fn _exit(code: c_int) -> ! {
    // SAFETY: exit_group(2) takes an integer and does not return.
    unsafe { syscall6(nr::EXIT_GROUP, [code as usize, 0, 0, 0, 0, 0]) };
    #[allow(clippy::empty_loop)]
    loop {}
}

unsafe fn execve(path: *const c_char, argv: *const *const c_char) -> c_int {
    let envp = ENVIRON.load(Ordering::Relaxed);
    // SAFETY: a NUL-terminated path, NULL-terminated argv and envp.
    unsafe { call(nr::EXECVE, [path as usize, argv as usize, envp as usize, 0, 0, 0]) }
}

/// What glibc's execvp(3) does: `file` as is when it names a path, else each directory
/// of `$PATH` in turn (glibc's default, `/bin:/usr/bin`, without one), going on past
/// the directories where it is missing or not allowed (EACCES then, if nothing ran);
/// a file the kernel cannot run (ENOEXEC: no `#!`) is run by `/bin/sh`. Returns -1 with
/// [`errno`] set when nothing ran.
///
/// # Safety
/// `file` NUL-terminated; `argv` NULL-terminated, starting with `file`'s own entry, and
/// preceded by one more writable slot (the init's own arguments come before CMD), which
/// the `/bin/sh` fallback takes.
pub unsafe fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: the caller's strings and vector (see above).
    unsafe {
        let name = CStr::from_ptr(file).to_bytes();
        if name.is_empty() {
            ERRNO.store(ENOENT, Ordering::Relaxed);
            return -1;
        }
        if name.contains(&b'/') {
            execve(file, argv);
            if errno() == ENOEXEC {
                run_as_script(file, argv);
            }
            return -1;
        }
        let path = path_var().unwrap_or(b"/bin:/usr/bin");
        let mut buf = [0u8; 4096];
        let mut denied = false;
        for dir in path.split(|&b| b == b':') {
            // An empty entry is the current directory.
            let dir: &[u8] = if dir.is_empty() { b"." } else { dir };
            if dir.len() + 1 + name.len() + 1 > buf.len() {
                ERRNO.store(ENAMETOOLONG, Ordering::Relaxed);
                continue;
            }
            buf[..dir.len()].copy_from_slice(dir);
            buf[dir.len()] = b'/';
            buf[dir.len() + 1..dir.len() + 1 + name.len()].copy_from_slice(name);
            buf[dir.len() + 1 + name.len()] = 0;
            let full = buf.as_ptr() as *const c_char;
            execve(full, argv);
            match errno() {
                ENOEXEC => {
                    run_as_script(full, argv);
                    return -1;
                }
                EACCES => denied = true,
                ENOENT | ENOTDIR | ENODEV | ETIMEDOUT | ESTALE | ENAMETOOLONG => {}
                _ => return -1,
            }
        }
        ERRNO.store(if denied { EACCES } else { ENOENT }, Ordering::Relaxed);
        -1
    }
}

/// `/bin/sh FILE ARGS...` in place of `FILE ARGS...`, in the slot before `argv` (see
/// [`execvp`]); errno is ENOEXEC's again if the shell cannot run either.
///
/// # Safety
/// As [`execvp`].
unsafe fn run_as_script(file: *const c_char, argv: *const *const c_char) {
    // SAFETY: the slot before argv is ours to write (this is a forked child about to exec
    // or exit); the vector stays NULL-terminated.
    unsafe {
        let v = (argv as *mut *const c_char).sub(1);
        *v = c"/bin/sh".as_ptr();
        *v.add(1) = file;
        execve(*v, v);
    }
    ERRNO.store(ENOEXEC, Ordering::Relaxed);
}

/// `$PATH` from the environment `_start` found.
fn path_var() -> Option<&'static [u8]> {
    let mut e = ENVIRON.load(Ordering::Relaxed) as *const *const c_char;
    if e.is_null() {
        return None;
    }
    // SAFETY: envp from the kernel: NUL-terminated strings, then NULL; they live as long
    // as the process.
    unsafe {
        while !(*e).is_null() {
            let s = CStr::from_ptr(*e).to_bytes();
            if let Some(v) = s.strip_prefix(b"PATH=") {
                return Some(v);
            }
            e = e.add(1);
        }
    }
    None
}

#[cfg(azp_init_bin)]
core::arch::global_asm!(
    ".globl _start",
    "_start:",
    // The kernel's stack: argc, argv[], NULL, envp[], NULL, auxv. Aligned for the call.
    "xor ebp, ebp",
    "mov rdi, rsp",
    "and rsp, -16",
    "call {entry}",
    "ud2",
    entry = sym start,
);

/// The program's entry (from `_start`): the arguments and environment off the stack, then
/// the init's `main`.
#[cfg(azp_init_bin)]
unsafe extern "C" fn start(sp: *const usize) -> ! {
    // SAFETY: `sp` is the initial stack the kernel built: argc, then argc argument
    // pointers and a NULL, then the environment's pointers and a NULL.
    unsafe {
        let argc = *sp as c_int;
        let argv = sp.add(1) as *const *const c_char;
        ENVIRON.store(argv.add(argc as usize + 1) as *mut *const c_char, Ordering::Relaxed);
        _exit(super::main(argc, argv))
    }
}

// The memory functions the compiler emits calls to. `rep movsb`/`rep stosb`: short and
// fast on current x86_64 (ERMS), and no loop the compiler could turn back into a call.

#[cfg(azp_init_bin)]
#[no_mangle]
unsafe extern "C" fn memcpy(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the compiler calls this with non-overlapping buffers of `n` bytes.
    unsafe {
        core::arch::asm!("rep movsb", inout("rcx") n => _, inout("rdi") dst => _, inout("rsi") src => _,
            options(nostack, preserves_flags));
    }
    dst
}

#[cfg(azp_init_bin)]
#[no_mangle]
unsafe extern "C" fn memmove(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dst as usize).wrapping_sub(src as usize) >= n {
        // SAFETY: a forward copy is safe when dst is not inside (src, src + n).
        return unsafe { memcpy(dst, src, n) };
    }
    // SAFETY: backwards (direction flag set for the copy, cleared after, as the ABI
    // requires), from the last byte of each buffer.
    unsafe {
        core::arch::asm!("std", "rep movsb", "cld", inout("rcx") n => _,
            inout("rdi") dst.add(n - 1) => _, inout("rsi") src.add(n - 1) => _, options(nostack));
    }
    dst
}

#[cfg(azp_init_bin)]
#[no_mangle]
unsafe extern "C" fn memset(dst: *mut u8, c: c_int, n: usize) -> *mut u8 {
    // SAFETY: the compiler calls this with a buffer of `n` bytes.
    unsafe {
        core::arch::asm!("rep stosb", inout("rcx") n => _, inout("rdi") dst => _, in("al") c as u8,
            options(nostack, preserves_flags));
    }
    dst
}

#[cfg(azp_init_bin)]
#[no_mangle]
unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> c_int {
    let mut i = 0;
    while i < n {
        // SAFETY: both buffers hold `n` bytes; volatile, so this loop stays a loop.
        let (x, y) = unsafe { (core::ptr::read_volatile(a.add(i)), core::ptr::read_volatile(b.add(i))) };
        if x != y {
            return x as c_int - y as c_int;
        }
        i += 1;
    }
    0
}

#[cfg(azp_init_bin)]
#[no_mangle]
unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> c_int {
    // SAFETY: forwarded.
    unsafe { memcmp(a, b, n) }
}

#[cfg(azp_init_bin)]
#[no_mangle]
unsafe extern "C" fn strlen(s: *const c_char) -> usize {
    let mut n = 0;
    // SAFETY: `s` is NUL-terminated (CStr::from_ptr's contract); volatile, so this loop
    // stays a loop.
    while unsafe { core::ptr::read_volatile(s.add(n)) } != 0 {
        n += 1;
    }
    n
}
