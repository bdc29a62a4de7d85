//! A rootless job's TCP connections, which end on the host in its pasta's sockets, reset
//! when pasta stops rather than left there.
//!
//! Once a rootless job is over its helper stops the job's pasta. pasta's host sockets of
//! the job's connections then close as any process's do: one with data still to send
//! (its far end keeps its window shut, or stopped answering) lives on, orphaned, for
//! minutes, in the node's one budget of orphans (`net.ipv4.tcp_max_orphans`, which no
//! namespace has of its own: past it every TCP close of the node with data unsent is a
//! reset), with its buffers. Measured: a job that left 40 such connections left 40
//! orphans on the host, and the far end saw all 40 still open (escape test `t67`, run
//! rootless). The job's own sockets in its namespace are aborted as root mode's are (see
//! [`super::sockstat`]), but only after this step: their resets make pasta close some
//! of its sockets itself, orphaned (21 of 40 in a scratch build that aborted first).
//! pasta's sockets are the host's, which the account cannot abort.
//!
//! What it can do: pasta is its child, running as the account, so the helper may take
//! copies of pasta's fds (`pidfd_getfd`, the same right as ptrace) and set `SO_LINGER`
//! with a zero timeout on each TCP socket among them: the kernel then resets such a
//! socket when it closes, with pasta's exit, instead of orphaning it. Steps: [`open`]
//! pasta's pidfd, [`reset_on_close`] each of its TCP sockets; then the caller kills it.
//! Where that right is withheld (Yama's `ptrace_scope` 2 or 3) or the kernel is older
//! than 5.6 (no `pidfd_getfd`), the step fails, the helper says so, and pasta's sockets
//! close as before.

use super::error::{Error, Result};
use nix::errno::Errno;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Step 1: a pidfd of `pid` (pasta, the caller's unreaped child).
pub fn open(pid: i32) -> Result<OwnedFd> {
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(Error::LingerPastaPidfd(Errno::last()));
    }
    // SAFETY: a new fd that nothing else owns; the OwnedFd closes it once.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Step 2: every TCP socket among the fds of the process of `pidfd` (`pid`) set to reset
/// when it closes (`SO_LINGER` on, 0 s); how many. An fd closed meanwhile is skipped.
pub fn reset_on_close(pid: i32, pidfd: &OwnedFd) -> Result<u32> {
    let dir = format!("/proc/{pid}/fd");
    let entries = std::fs::read_dir(&dir).map_err(|e| Error::LingerPastaFds(super::error::errno_of(&e)))?;
    let mut set = 0;
    for entry in entries.flatten() {
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse::<RawFd>().ok()) else { continue };
        let is_socket = std::fs::read_link(entry.path()).is_ok_and(|t| t.to_string_lossy().starts_with("socket:"));
        if !is_socket {
            continue;
        }
        // SAFETY: pidfd_getfd(2) takes the pidfd, a fd number of that process and flags,
        // and returns a new fd of ours (a copy of that file) or -1.
        let copy = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
        if copy < 0 {
            match Errno::last() {
                Errno::EBADF => continue,
                e => return Err(Error::LingerPastaFdCopy(e)),
            }
        }
        // SAFETY: a new fd that nothing else owns; the OwnedFd closes it once.
        let copy = unsafe { OwnedFd::from_raw_fd(copy as RawFd) };
        if !is_tcp(&copy) {
            continue;
        }
        let linger = libc::linger { l_onoff: 1, l_linger: 0 };
        // SAFETY: setsockopt(2) reads `size_of::<linger>()` bytes from `linger`, alive for
        // the call; the fd is our copy.
        let r = unsafe {
            libc::setsockopt(
                copy.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&linger as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(Error::LingerPastaSocket(Errno::last()));
        }
        set += 1;
    }
    Ok(set)
}

/// Whether `fd` is a TCP socket (`SO_PROTOCOL`).
fn is_tcp(fd: &OwnedFd) -> bool {
    let mut protocol: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt(2) writes at most `len` bytes into `protocol`, an int alive for
    // the call; the fd is ours.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PROTOCOL,
            (&mut protocol as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    r == 0 && protocol == libc::IPPROTO_TCP
}
