//! The runner's side of a job with a terminal (`exec -t`, `shell`), as `apptainer shell`
//! and `enroot start` do it: libcontainer's init makes a pseudo-terminal in the job's own
//! devpts (so `tty` in the job names a path that exists there) and sends its master to the
//! job's console socket, where the runner waits. The runner then relays the master and its
//! own terminal, which it puts in raw mode (keys reach the job as bytes: Ctrl-C becomes a
//! SIGINT of the job's foreground process group only, Ctrl-Z job control works), and
//! passes its window size on at start and at each SIGWINCH. The terminal is restored on
//! every way out of the relay (the guard drops, a panic's unwinding included).
//!
//! SIGWINCH is blocked in this thread and read from a signalfd: any other thread of the
//! runner while it relays must block it too (`exec`'s keeper of the host's table, see
//! `network::table_keeper`, blocks every signal).

use super::jobdir::JobDir;
use crate::sys::tty;
use anyhow::{Context, Result};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixListener;

/// What the user types before EOF on a stdin that is not a terminal: the pty's default
/// end-of-file character (Ctrl-D), so that a shell reading it ends.
const VEOF: u8 = 4;

/// The job's console socket, listening before the helper is started.
pub struct Console {
    listener: UnixListener,
}

impl Console {
    pub fn listen(job: &JobDir) -> Result<Console> {
        let listener = tty::console_listener(&job.root, super::jobdir::CONSOLE_SOCKET)?;
        Ok(Console { listener })
    }

    /// The job's pty master, once libcontainer's init has sent it; None when `helper_done`
    /// (the helper's result pipe) becomes readable first: the helper ended or reported a
    /// failure before any terminal existed, which its result says.
    pub fn accept(self, helper_done: BorrowedFd<'_>) -> Result<Option<OwnedFd>> {
        loop {
            let mut fds =
                [PollFd::new(self.listener.as_fd(), PollFlags::POLLIN), PollFd::new(helper_done, PollFlags::POLLIN)];
            match nix::poll::poll(&mut fds, PollTimeout::NONE) {
                Err(nix::errno::Errno::EINTR) => continue,
                r => r.context("cannot wait for the job's terminal")?,
            };
            let ready = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
            if ready(&fds[0]) {
                let (stream, _) = self.listener.accept().context("cannot accept the job's console connection")?;
                return Ok(Some(tty::receive_console(&stream)?));
            }
            if ready(&fds[1]) {
                return Ok(None);
            }
        }
    }
}

/// The runner's own terminal and the job's, connected: see the module doc. Returns when
/// the job's side of the terminal is closed (every process of the job is gone).
pub struct Relay<'a> {
    pub master: OwnedFd,
    /// What the user types (our stdin).
    pub input: BorrowedFd<'a>,
    /// Where the job's output goes (our stdout).
    pub output: BorrowedFd<'a>,
}

impl Relay<'_> {
    pub fn run(self) -> Result<()> {
        let winch = tty::window_change_fd()?;
        let size_source = [self.input, self.output].into_iter().find_map(|fd| tty::window_size(fd).map(|_| fd));
        if let Some(ws) = size_source.and_then(tty::window_size) {
            let _ = tty::set_window_size(&self.master, &ws);
        }
        let _raw = tty::raw_mode(self.input)?;
        nix::fcntl::fcntl(self.master.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK))
            .context("cannot make the job's terminal non-blocking")?;
        let mut master = std::fs::File::from(self.master);
        let mut output = Some(std::fs::File::from(self.output.try_clone_to_owned()?));
        let mut input = std::fs::File::from(self.input.try_clone_to_owned()?);
        let mut input_open = true;
        // Typed but not yet taken by the job's terminal: no more is read from the user
        // until it is (the job's output keeps flowing meanwhile).
        let mut pending: Vec<u8> = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let master_events =
                if pending.is_empty() { PollFlags::POLLIN } else { PollFlags::POLLIN | PollFlags::POLLOUT };
            let input_events = if input_open && pending.is_empty() { PollFlags::POLLIN } else { PollFlags::empty() };
            let mut fds = [
                PollFd::new(master.as_fd(), master_events),
                PollFd::new(self.input, input_events),
                PollFd::new(winch.as_fd(), PollFlags::POLLIN),
            ];
            match nix::poll::poll(&mut fds, PollTimeout::NONE) {
                Err(nix::errno::Errno::EINTR) => continue,
                r => r.context("cannot wait on the job's terminal")?,
            };
            let got = |i: usize| fds[i].revents().unwrap_or(PollFlags::empty());
            let (m, inp, w) = (got(0), got(1), got(2));
            if m.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR) {
                // Drain what the job wrote; EIO (or EOF) once its side is closed.
                match drain(&mut master, &mut buf, &mut output) {
                    Drained::More => {}
                    Drained::Closed => return Ok(()),
                }
            }
            if m.contains(PollFlags::POLLOUT) && !pending.is_empty() {
                match master.write(&pending) {
                    Ok(n) => drop(pending.drain(..n)),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => pending.clear(),
                }
            }
            if inp.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR) {
                match input.read(&mut buf) {
                    Ok(0) | Err(_) => {
                        input_open = false;
                        pending.push(VEOF);
                    }
                    Ok(n) => pending.extend_from_slice(&buf[..n]),
                }
            }
            if !w.is_empty() {
                while let Ok(Some(_)) = winch.read_signal() {}
                if let Some(ws) = size_source.and_then(tty::window_size) {
                    let _ = tty::set_window_size(&master, &ws);
                }
            }
        }
    }
}

enum Drained {
    More,
    Closed,
}

/// Copies what the job's terminal has to `output` (dropped at its first failure: the
/// job's output is then read and discarded, so it never blocks on a full terminal).
fn drain(master: &mut std::fs::File, buf: &mut [u8], output: &mut Option<std::fs::File>) -> Drained {
    loop {
        match master.read(buf) {
            Ok(0) => return Drained::Closed,
            Ok(n) => {
                if let Some(out) = output.as_mut() {
                    if out.write_all(&buf[..n]).is_err() {
                        *output = None;
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Drained::More,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // EIO: no process holds the job's side any more.
            Err(_) => return Drained::Closed,
        }
    }
}

#[cfg(test)]
mod tests {
    //! The relay over a real pty pair standing in for the job's (no root needed): its
    //! slave side plays the job.
    use super::*;

    fn pipe() -> (std::fs::File, std::fs::File) {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        (std::fs::File::from(r), std::fs::File::from(w))
    }

    #[test]
    fn output_input_and_eof_pass_and_the_relay_ends_with_the_job() {
        let pty = tty::tests::cloexec_pty();
        let (in_r, mut in_w) = pipe();
        let (out_r, out_w) = pipe();
        let master = pty.master;
        let relay = std::thread::spawn(move || {
            Relay { master, input: in_r.as_fd(), output: out_w.as_fd() }.run().unwrap();
            drop(out_w);
        });
        let mut slave = std::fs::File::from(pty.slave);
        // The job's side in raw mode: bytes through unchanged, no echo.
        let mut t = nix::sys::termios::tcgetattr(&slave).unwrap();
        nix::sys::termios::cfmakeraw(&mut t);
        nix::sys::termios::tcsetattr(&slave, nix::sys::termios::SetArg::TCSANOW, &t).unwrap();
        in_w.write_all(b"typed").unwrap();
        let mut got = [0u8; 5];
        slave.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"typed", "the user's input reaches the job");
        drop(in_w); // EOF on a stdin that is no terminal: Ctrl-D for the job
        slave.read_exact(&mut got[..1]).unwrap();
        assert_eq!(got[0], VEOF);
        slave.write_all(b"job output").unwrap();
        drop(slave); // the job's last process is gone
        let mut out = String::new();
        std::fs::File::from(out_r.as_fd().try_clone_to_owned().unwrap()).read_to_string(&mut out).unwrap();
        relay.join().unwrap();
        assert_eq!(out, "job output");
        drop(out_r);
    }

    #[test]
    fn the_users_window_size_is_the_jobs() {
        let user = tty::tests::cloexec_pty();
        let ws = libc::winsize { ws_row: 33, ws_col: 111, ws_xpixel: 0, ws_ypixel: 0 };
        tty::set_window_size(&user.master, &ws).unwrap();
        let job = tty::tests::cloexec_pty();
        let (out_r, out_w) = pipe();
        let user_slave = user.slave;
        let master = job.master;
        let probe = job.slave.try_clone().unwrap();
        let relay = std::thread::spawn(move || {
            Relay { master, input: user_slave.as_fd(), output: out_w.as_fd() }.run().unwrap();
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            if tty::window_size(probe.as_fd()).is_some_and(|w| (w.ws_row, w.ws_col) == (33, 111)) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "the size never arrived");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        drop(probe);
        drop(job.slave);
        relay.join().unwrap();
        drop(out_r);
    }
}
