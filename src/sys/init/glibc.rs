//! The init's system calls through glibc's static archive (targets other than x86_64,
//! see `raw_x86_64.rs`): glibc's x86_64/aarch64 ABI, declared here, since the init links
//! nothing but libc.

pub use super::abi::*;
use super::*;

/// glibc's sigset_t: 1024 bits.
#[repr(C)]
pub struct sigset_t {
    pub val: [u64; 16],
}

// As the libc crate links std when crt-static: glibc's archive, then the unwinder
// bits its archive refers to.
#[cfg_attr(azp_init_bin, link(name = "c", kind = "static", modifiers = "-bundle"))]
#[cfg_attr(azp_init_bin, link(name = "gcc_eh", kind = "static", modifiers = "-bundle"))]
#[cfg_attr(azp_init_bin, link(name = "gcc", kind = "static", modifiers = "-bundle"))]
#[cfg_attr(azp_init_bin, link(name = "c", kind = "static", modifiers = "-bundle"))]
extern "C" {
    pub fn __errno_location() -> *mut c_int;
    pub fn sigfillset(set: *mut sigset_t) -> c_int;
    pub fn sigemptyset(set: *mut sigset_t) -> c_int;
    pub fn sigdelset(set: *mut sigset_t, sig: c_int) -> c_int;
    pub fn sigprocmask(how: c_int, set: *const sigset_t, old: *mut sigset_t) -> c_int;
    pub fn signalfd(fd: c_int, mask: *const sigset_t, flags: c_int) -> c_int;
    pub fn signal(sig: c_int, handler: usize) -> usize;
    pub fn poll(fds: *mut pollfd, nfds: u64, timeout: c_int) -> c_int;
    pub fn fork() -> pid_t;
    pub fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int;
    pub fn waitpid(pid: pid_t, status: *mut c_int, options: c_int) -> pid_t;
    pub fn kill(pid: pid_t, sig: c_int) -> c_int;
    pub fn getpid() -> pid_t;
    pub fn setpgid(pid: pid_t, pgid: pid_t) -> c_int;
    pub fn tcsetpgrp(fd: c_int, pgrp: pid_t) -> c_int;
    pub fn tcgetsid(fd: c_int) -> pid_t;
    pub fn getsid(pid: pid_t) -> pid_t;
    pub fn read(fd: c_int, buf: *mut c_void, n: usize) -> isize;
    pub fn write(fd: c_int, buf: *const c_void, n: usize) -> isize;
    #[link_name = "fcntl"]
    fn fcntl_variadic(fd: c_int, cmd: c_int, ...) -> c_int;
    #[link_name = "prctl"]
    fn prctl_variadic(option: c_int, ...) -> c_int;
    pub fn access(path: *const c_char, mode: c_int) -> c_int;
    pub fn _exit(code: c_int) -> !;
}

/// fcntl(2) with an integer argument (F_GETFD, F_SETFD).
pub unsafe fn fcntl(fd: c_int, cmd: c_int, arg: c_int) -> c_int {
    // SAFETY: the caller's fd and command take an integer argument.
    unsafe { fcntl_variadic(fd, cmd, arg) }
}

/// prctl(2) with all four arguments given (unused ones 0).
pub unsafe fn prctl(option: c_int, a2: c_ulong, a3: c_ulong, a4: c_ulong, a5: c_ulong) -> c_int {
    // SAFETY: the caller passes what `option` expects.
    unsafe { prctl_variadic(option, a2, a3, a4, a5) }
}

pub fn errno() -> c_int {
    // SAFETY: glibc's errno location is valid for the calling thread.
    unsafe { *__errno_location() }
}

pub fn empty_sigset() -> sigset_t {
    sigset_t { val: [0; 16] }
}
