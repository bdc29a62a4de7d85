//! The Linux ABI the init's two backends share (`raw_x86_64.rs`, `glibc.rs`): the
//! structs and numbers are the kernel's, the same on x86_64 and aarch64 and what glibc
//! passes through. What differs stays in each backend: the signal set (glibc's 1024 bits,
//! the kernel's 64) and how a call is made.

use super::*;

pub type pid_t = c_int;

#[repr(C)]
pub struct pollfd {
    pub fd: c_int,
    pub events: c_short,
    pub revents: c_short,
}

/// struct signalfd_siginfo: 128 bytes, of which the init reads the signal number.
#[repr(C)]
pub struct signalfd_siginfo {
    pub ssi_signo: u32,
    pub rest: [u8; 124],
}

/// struct sock_fprog: a seccomp BPF program (`len` instructions of 8 bytes).
#[repr(C)]
pub struct sock_fprog {
    pub len: u16,
    pub filter: *const c_void,
}

pub const SIG_SETMASK: c_int = 2;
pub const SIG_BLOCK: c_int = 0;
pub const SFD_CLOEXEC: c_int = 0o2000000;
pub const POLLIN: c_short = 1;
pub const POLLHUP: c_short = 0x10;
pub const POLLERR: c_short = 0x8;
pub const WNOHANG: c_int = 1;
pub const F_GETFD: c_int = 1;
pub const F_SETFD: c_int = 2;
pub const FD_CLOEXEC: c_int = 1;
pub const PR_SET_CHILD_SUBREAPER: c_int = 36;
pub const PR_SET_NO_NEW_PRIVS: c_int = 38;
pub const PR_SET_SECCOMP: c_int = 22;
pub const SECCOMP_MODE_FILTER: c_ulong = 2;
pub const PR_SET_DUMPABLE: c_int = 4;
pub const EINTR: c_int = 4;
pub const ENOENT: c_int = 2;
pub const EACCES: c_int = 13;
pub const ESRCH: c_int = 3;
pub const F_OK: c_int = 0;
pub const SIG_DFL: usize = 0;
