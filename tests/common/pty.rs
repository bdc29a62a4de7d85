//! A command on a pseudo-terminal of the test's own, as in a user's terminal: the command
//! is the session leader and the terminal's foreground process group, so a Ctrl-C
//! written to the master is the kernel's SIGINT to it, and a resize its SIGWINCH.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct PtySession {
    master: std::fs::File,
    child: Child,
    /// Everything the terminal showed so far.
    seen: Arc<Mutex<Vec<u8>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

pub const CTRL_C: &[u8] = b"\x03";

impl PtySession {
    /// Starts `cmd` on a new terminal of `rows` x `cols`.
    pub fn spawn(mut cmd: Command, rows: u16, cols: u16) -> PtySession {
        let ws = libc::winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
        let pty = nix::pty::openpty(Some(&ws), None).unwrap();
        // Not inherited by what other tests spawn meanwhile (only by ours, as its stdio).
        for fd in [&pty.master, &pty.slave] {
            nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC)).unwrap();
        }
        let slave = |fd: &OwnedFd| Stdio::from(fd.try_clone().unwrap());
        cmd.stdin(slave(&pty.slave)).stdout(slave(&pty.slave)).stderr(slave(&pty.slave));
        // SAFETY: between fork and exec only setsid(2) and ioctl(2), async-signal-safe;
        // stdin is the terminal's slave by then.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("cannot start the command on a pty");
        drop(pty.slave);
        let master = std::fs::File::from(pty.master);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let reader = {
            let mut m = master.try_clone().unwrap();
            let seen = seen.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                // EIO once the command and everything it started closed the terminal.
                while let Ok(n) = m.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    seen.lock().unwrap().extend_from_slice(&buf[..n]);
                }
            })
        };
        PtySession { master, child, seen, reader: Some(reader) }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// What the terminal showed so far (control characters kept).
    pub fn output(&self) -> String {
        String::from_utf8_lossy(&self.seen.lock().unwrap()).into_owned()
    }

    /// Types `bytes`.
    pub fn send(&mut self, bytes: &[u8]) {
        self.master.write_all(bytes).unwrap();
    }

    /// Waits until the terminal has shown `needle` (after the first `from` bytes); the
    /// length of the output up to its end.
    pub fn expect_after(&self, from: usize, needle: &str, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            let out = self.output();
            if let Some(i) = out.get(from..).and_then(|s| s.find(needle)) {
                return from + i + needle.len();
            }
            assert!(Instant::now() < deadline, "timed out waiting for {needle:?}; the terminal shows:\n{out}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn expect(&self, needle: &str, timeout: Duration) -> usize {
        self.expect_after(0, needle, timeout)
    }

    /// Resizes the terminal: the kernel sends SIGWINCH to its foreground process group.
    pub fn resize(&self, rows: u16, cols: u16) {
        let ws = libc::winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
        // SAFETY: TIOCSWINSZ reads one struct winsize from a live local.
        let r = unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
        assert_eq!(r, 0, "cannot resize the test's pty");
    }

    /// The terminal's settings (a pty master reports its slave's).
    pub fn termios(&self) -> nix::sys::termios::Termios {
        nix::sys::termios::tcgetattr(self.master.as_fd()).unwrap()
    }

    /// Waits for the command to exit (at most `timeout`, then kills it); its status and
    /// everything the terminal showed.
    pub fn wait(&mut self, timeout: Duration) -> (ExitStatus, String) {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("did not exit within {timeout:?}; the terminal shows:\n{}", self.output());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // What the command printed last is read before its end is reported.
        let end = Instant::now() + Duration::from_secs(5);
        while self.reader.as_ref().is_some_and(|r| !r.is_finished()) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
        }
        (status, self.output())
    }
}

impl Drop for PtySession {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
