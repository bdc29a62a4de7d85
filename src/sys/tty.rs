//! The terminal of `exec -t` and `shell`: the console socket on which libcontainer sends
//! the master side of the job's pseudo-terminal (made in the job's own devpts, so `tty`
//! names a path that exists inside), the user's terminal in raw mode while the master is
//! relayed to it (restored when the guard drops), and window sizes.

use super::error::{Error, Result};
use nix::sys::termios::{self, SetArg, Termios};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

/// Listens on `dir/name`. A path too long for a socket address (108 bytes) is bound
/// through `/proc/self/fd/N/name`, N an fd of `dir`.
pub fn console_listener(dir: &Path, name: &str) -> Result<UnixListener> {
    let path = dir.join(name);
    let err = |source| Error::ConsoleSocket { path: path.clone(), source };
    if path.as_os_str().len() < 100 {
        return UnixListener::bind(&path).map_err(err);
    }
    let d = std::fs::File::open(dir).map_err(err)?;
    UnixListener::bind(format!("/proc/self/fd/{}/{name}", d.as_raw_fd())).map_err(err)
}

/// The pty master libcontainer's init sent on `stream` (SCM_RIGHTS), close-on-exec.
pub fn receive_console(stream: &UnixStream) -> Result<OwnedFd> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut buf = [0u8; 64];
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let mut cmsg = nix::cmsg_space!([RawFd; 1]);
    let msg = recvmsg::<()>(stream.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC)
        .map_err(Error::ReceiveConsole)?;
    for c in msg.cmsgs().map_err(Error::ReceiveConsole)? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            if let Some(&fd) = fds.first() {
                // SAFETY: SCM_RIGHTS just installed `fd` in this process: a new fd that
                // nothing else owns (any further ones are left open: libcontainer sends one).
                return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    Err(Error::ReceiveConsole(nix::errno::Errno::EBADMSG))
}

/// The user's terminal in raw mode, as it was before once dropped (on every path out of
/// the relay, a panic's unwinding included).
pub struct RawMode {
    fd: RawFd,
    saved: Termios,
}

/// Puts the terminal on `fd` in raw mode (keys go to the job as bytes: Ctrl-C becomes the
/// job's terminal's SIGINT, not ours). None when `fd` is not a terminal.
pub fn raw_mode(fd: BorrowedFd<'_>) -> Result<Option<RawMode>> {
    if !std::io::IsTerminal::is_terminal(&fd) {
        return Ok(None);
    }
    let err = |source| Error::TerminalAttributes { fd: fd.as_raw_fd(), source };
    let saved = termios::tcgetattr(fd).map_err(err)?;
    let mut raw = saved.clone();
    termios::cfmakeraw(&mut raw);
    termios::tcsetattr(fd, SetArg::TCSADRAIN, &raw).map_err(err)?;
    Ok(Some(RawMode { fd: fd.as_raw_fd(), saved }))
}

/// Whether the terminal `fd` turns `\n` into a new line's start (output processing,
/// OPOST with ONLCR): not while it is in raw mode. Not a terminal: true.
pub fn output_processed(fd: BorrowedFd<'_>) -> bool {
    use termios::OutputFlags;
    termios::tcgetattr(fd).map(|t| t.output_flags.contains(OutputFlags::OPOST | OutputFlags::ONLCR)).unwrap_or(true)
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // SAFETY: the fd was a live terminal when the guard was made and belongs to the
        // process (stdin), which outlives the guard.
        let fd = unsafe { BorrowedFd::borrow_raw(self.fd) };
        let _ = termios::tcsetattr(fd, SetArg::TCSADRAIN, &self.saved);
    }
}

/// SIGWINCH as a readable fd: blocked in the calling thread (its default action is to
/// ignore it, so a thread that does not block it would lose it: call this in a
/// single-threaded process) and read from a signalfd.
pub fn window_change_fd() -> Result<nix::sys::signalfd::SignalFd> {
    use nix::sys::signal::{SigSet, Signal};
    use nix::sys::signalfd::{SfdFlags, SignalFd};
    let mut set = SigSet::empty();
    set.add(Signal::SIGWINCH);
    set.thread_block().map_err(Error::BlockSignals)?;
    SignalFd::with_flags(&set, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK).map_err(Error::BlockSignals)
}

/// The window size of the terminal on `fd`; None when it is none.
pub fn window_size(fd: BorrowedFd<'_>) -> Option<libc::winsize> {
    let mut ws = libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCGWINSZ writes one struct winsize into the live local `ws`.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) };
    (r == 0 && ws.ws_row > 0 && ws.ws_col > 0).then_some(ws)
}

/// Gives the job's terminal (its master, `fd`) the size `ws`; the kernel sends SIGWINCH
/// to the job's foreground process group when it changes.
pub fn set_window_size(fd: impl AsFd, ws: &libc::winsize) -> Result<()> {
    // SAFETY: TIOCSWINSZ reads one struct winsize from the live borrow `ws`.
    let r = unsafe { libc::ioctl(fd.as_fd().as_raw_fd(), libc::TIOCSWINSZ, ws as *const libc::winsize) };
    if r != 0 {
        return Err(Error::TerminalSize(nix::errno::Errno::last()));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A pty pair whose fds the children other tests spawn meanwhile do not inherit (a
    /// child holding our slave would keep the master from ever seeing its end).
    pub(crate) fn cloexec_pty() -> nix::pty::OpenptyResult {
        let pty = nix::pty::openpty(None, None).unwrap();
        for fd in [&pty.master, &pty.slave] {
            nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC)).unwrap();
        }
        pty
    }

    #[test]
    fn raw_mode_is_restored_and_sizes_pass_through_a_pty() {
        let pty = cloexec_pty();
        let before = termios::tcgetattr(&pty.slave).unwrap();
        assert!(before.local_flags.contains(termios::LocalFlags::ICANON));
        {
            let _raw = raw_mode(pty.slave.as_fd()).unwrap().expect("a pty is a terminal");
            let now = termios::tcgetattr(&pty.slave).unwrap();
            assert!(!now.local_flags.contains(termios::LocalFlags::ICANON | termios::LocalFlags::ISIG));
        }
        let after = termios::tcgetattr(&pty.slave).unwrap();
        assert_eq!(after.local_flags, before.local_flags, "restored when the guard dropped");
        let (r, _w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        assert!(raw_mode(r.as_fd()).unwrap().is_none(), "a pipe is no terminal");
        let ws = libc::winsize { ws_row: 40, ws_col: 100, ws_xpixel: 0, ws_ypixel: 0 };
        set_window_size(&pty.master, &ws).unwrap();
        let got = window_size(pty.slave.as_fd()).unwrap();
        assert_eq!((got.ws_row, got.ws_col), (40, 100));
        assert!(window_size(r.as_fd()).is_none());
    }

    #[test]
    fn a_console_fd_arrives_through_a_socket_with_a_long_path() {
        let t = tempfile::tempdir().unwrap();
        let deep = t.path().join("x".repeat(60)).join("y".repeat(60));
        std::fs::create_dir_all(&deep).unwrap();
        let listener = console_listener(&deep, "console.sock").unwrap();
        assert!(deep.join("console.sock").exists(), "bound in the dir itself");
        let client = std::thread::spawn({
            let path = deep.join("console.sock");
            move || {
                // What libcontainer does: connect through a short relative symlink.
                let link = path.with_file_name("l");
                std::os::unix::fs::symlink(&path, &link).unwrap();
                let dir = std::fs::File::open(link.parent().unwrap()).unwrap();
                let s = UnixStream::connect(format!("/proc/self/fd/{}/l", dir.as_raw_fd())).unwrap();
                let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
                let fds = [r.as_raw_fd()];
                let iov = [std::io::IoSlice::new(b"/dev/ptmx")];
                let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
                nix::sys::socket::sendmsg::<()>(s.as_raw_fd(), &iov, &cmsg, nix::sys::socket::MsgFlags::empty(), None)
                    .unwrap();
                w
            }
        });
        let (stream, _) = listener.accept().unwrap();
        let got = receive_console(&stream).unwrap();
        let w = client.join().unwrap();
        nix::unistd::write(&w, b"hi").unwrap();
        let mut buf = [0u8; 2];
        nix::unistd::read(got.as_raw_fd(), &mut buf).unwrap();
        assert_eq!(&buf, b"hi", "the fd that was sent");
    }
}
