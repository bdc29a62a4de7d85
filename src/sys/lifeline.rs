//! The job's lifeline (see `src/sys/init/main.rs`): a pipe whose read end the job's init gets
//! as fd 3 and whose write end only the sandbox helper holds. When the helper dies, by
//! any signal, the kernel closes the write end; the init sees EOF and ends the job at
//! once. No other process may hold the write end: it is close-on-exec, and the helper
//! forks nothing but libcontainer's processes, which exec or exit.

use super::error::{Error, Result};
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The fd number the job's init reads its lifeline from.
pub const FD: RawFd = 3;

/// Moves `fd` to a number above [`FD`] (close-on-exec) when it sits at or below it, so
/// that fd 3 is free for the lifeline: the helper's own pipes from its runner may have
/// been handed over there.
pub fn move_above(fd: OwnedFd) -> Result<OwnedFd> {
    if fd.as_raw_fd() > FD {
        return Ok(fd);
    }
    let moved = fcntl(fd.as_raw_fd(), FcntlArg::F_DUPFD_CLOEXEC(FD + 1)).map_err(Error::MoveFd)?;
    // SAFETY: F_DUPFD_CLOEXEC just returned `moved`, a new fd that nothing else owns; the
    // original closes when `fd` drops at the end of this function.
    Ok(unsafe { OwnedFd::from_raw_fd(moved) })
}

/// Puts /dev/null (close-on-exec) at fd 3, so that nothing the helper opens lands there
/// before the lifeline does. What was there is closed: in a forked helper, a copy of one
/// of its runner's fds, which the helper never uses (its own pipes are moved first).
pub fn reserve() -> Result<()> {
    let null = nix::fcntl::open("/dev/null", OFlag::O_RDONLY | OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty())
        .map_err(Error::ReserveLifelineFd)?;
    if null != FD {
        nix::unistd::dup3(null, FD, OFlag::O_CLOEXEC).map_err(Error::ReserveLifelineFd)?;
        let _ = nix::unistd::close(null);
    }
    Ok(())
}

/// The write end of a new lifeline, whose read end is now fd 3, inheritable: libcontainer
/// keeps it open for the job's init (`with_preserved_fds(1)`). Call [`release_read_end`]
/// once the container is created.
pub fn create() -> Result<OwnedFd> {
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(Error::Pipe)?;
    nix::unistd::dup3(read.as_raw_fd(), FD, OFlag::empty()).map_err(Error::LifelineFd)?;
    Ok(write)
}

/// The helper's copy of the read end: only the job's init keeps one.
pub fn release_read_end() {
    let _ = reserve();
}

/// Makes `fd` the child's fd 3, where the init reads its lifeline, for a command started
/// by hand (the init's own tests; jobs get it from libcontainer's preserved fds). `fd`
/// must stay open in the parent until `cmd` is spawned.
pub fn pass_as_fd3(cmd: &mut std::process::Command, fd: &OwnedFd) {
    use std::os::unix::process::CommandExt;
    let raw = fd.as_raw_fd();
    // SAFETY: the closure runs between fork and exec and calls only fcntl and dup2, both
    // async-signal-safe; it allocates nothing. `raw` is open in the child (inherited from
    // the parent, which keeps `fd` open until spawn returns).
    unsafe {
        cmd.pre_exec(move || {
            let r = if raw == FD { libc::fcntl(FD, libc::F_SETFD, 0) } else { libc::dup2(raw, FD) };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipes_move_above_fd_3_and_the_lifeline_lands_there() {
        // Test threads share the fd table: work on fds this test made, never on fd 3
        // itself (another test's files could sit there).
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let high = move_above(w).unwrap();
        assert!(high.as_raw_fd() > FD);
        let flags = fcntl(high.as_raw_fd(), FcntlArg::F_GETFD).unwrap();
        assert_ne!(flags & libc::FD_CLOEXEC, 0, "still close-on-exec after the move");
        let same = high.as_raw_fd();
        assert_eq!(move_above(high).unwrap().as_raw_fd(), same, "already above: untouched");
        drop(r);
    }
}
