//! How many TCP sockets a job's network namespace still has once its processes are gone.
//!
//! A TCP connection outlives the process that closed it while it has something left to
//! send: its socket, orphaned, retransmits its data and FIN for up to minutes when the
//! far end stops answering (it went away, a firewall reload dropped the flow) or keeps
//! its window shut. Such a socket holds its network namespace, and with it the job's
//! veth, whose host end then stays on the host after the job (seen: a CI run's last job
//! kept its link past the end of `run` and gc's 30 s wait). The kernel counts the
//! namespace's TCP sockets that are still hashed (any state but closed and TIME_WAIT,
//! orphans among them) in its `sockstat` files: `TCP: inuse N`, `TCP6: inuse N`.
//!
//! Such sockets also count in the node's one budget of orphans (`net.ipv4.tcp_max_orphans`,
//! which no namespace has of its own: past it, every TCP close of the node with data
//! still to send is a reset) and keep their buffers after the job's memory limit is gone:
//! a slot's jobs one after another add them up (a red-team class). So the job's are
//! aborted once it is over ([`abort_tcp`]), as `ss -K` would: its far ends get a reset;
//! nothing of the job is left to read what they would send. (Rootless, the far ends'
//! side is its pasta's host sockets: see [`super::pasta_linger`].)
//!
//! Steps: [`open_here`] in the job's namespace (the files, and the socket-diagnostics
//! socket opened with them, keep showing the namespace they were opened in), then
//! [`tcp_in_use`] after the job, and [`abort_tcp`] where any are left. An open file holds
//! the namespace as the helper's watch sockets do: drop them right after.

use super::error::{errno_of, Error, Result};
use super::netlink::{self as nl, Message, Proto, Socket};
use nix::errno::Errno;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

/// The sockstat files of the namespace they were opened in, and a socket-diagnostics
/// socket of it (or why there is none: nothing can be aborted then).
pub struct SocketCounts {
    files: Vec<(PathBuf, File)>,
    diag: std::result::Result<Socket, Errno>,
}

impl std::fmt::Debug for SocketCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SocketCounts").field("files", &self.files).field("diag", &self.diag.as_ref().err()).finish()
    }
}

impl SocketCounts {
    /// No files: counts nothing (the test double's).
    pub fn none() -> SocketCounts {
        SocketCounts { files: vec![], diag: Err(Errno::EPROTONOSUPPORT) }
    }
}

/// The IPv4 file and, where the kernel has IPv6, the IPv6 one.
const FILES: [(&str, bool); 2] = [("/proc/thread-self/net/sockstat", true), ("/proc/thread-self/net/sockstat6", false)];

/// Step 1, in the job's namespace.
pub fn open_here() -> Result<SocketCounts> {
    let mut files = Vec::with_capacity(FILES.len());
    for (path, required) in FILES {
        match File::open(path) {
            Ok(f) => files.push((PathBuf::from(path), f)),
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::OpenSocketCounts { path: path.into(), source: errno_of(&e) }),
        }
    }
    // Without CONFIG_INET_DIAG the count still says what is left; nothing is aborted.
    let diag = Socket::open(Proto::SockDiag);
    Ok(SocketCounts { files, diag })
}

/// Step 2: the TCP sockets the namespace has now, IPv4 and IPv6.
pub fn tcp_in_use(counts: &SocketCounts) -> Result<u64> {
    let mut total = 0;
    for (path, file) in &counts.files {
        // One read from the start: the kernel makes the whole text anew for it.
        let mut buf = [0u8; 1024];
        let n = file
            .read_at(&mut buf, 0)
            .map_err(|e| Error::ReadSocketCounts { path: path.clone(), source: errno_of(&e) })?;
        let text = String::from_utf8_lossy(&buf[..n]);
        total += tcp_inuse(&text).ok_or_else(|| Error::ParseSocketCounts { path: path.clone() })?;
    }
    Ok(total)
}

/// Step 3, once the job's processes are gone: every TCP socket of the namespace but
/// those in TIME_WAIT (which hold neither the namespace nor an orphan's place) aborted
/// with `SOCK_DESTROY`, IPv4 and IPv6; how many. One gone meanwhile is not an error.
/// Err where the kernel cannot abort sockets (no CONFIG_INET_DIAG_DESTROY: EOPNOTSUPP).
pub fn abort_tcp(counts: &SocketCounts) -> Result<u64> {
    let diag = counts.diag.as_ref().map_err(|e| Error::DumpJobSockets(*e))?;
    const TIME_WAIT: u32 = 6;
    let mut aborted = 0;
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        let tcp = libc::IPPROTO_TCP as u8;
        let sockets = match diag.call(Message::inet_diag_dump(family, tcp, !(1 << TIME_WAIT))) {
            Ok(s) => s,
            // A kernel without IPv6.
            Err(Errno::EAFNOSUPPORT | Errno::ENOENT) if family == libc::AF_INET6 as u8 => continue,
            Err(e) => return Err(Error::DumpJobSockets(e)),
        };
        for reply in &sockets {
            // inet_diag_msg: family, state, timer, retransmits, then the socket's id.
            let Some(id) = reply.get(4..4 + nl::INET_DIAG_SOCKID_LEN) else { continue };
            match diag.request(Message::inet_diag_destroy(family, tcp, id)) {
                Ok(()) => aborted += 1,
                Err(Errno::ENOENT) => {}
                Err(e) => return Err(Error::AbortJobSocket(e)),
            }
        }
    }
    Ok(aborted)
}

/// `N` of the line `TCP: inuse N ...` (`TCP6: inuse N` in sockstat6).
fn tcp_inuse(text: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut words = l.split_ascii_whitespace();
        match (words.next(), words.next(), words.next()) {
            (Some("TCP:" | "TCP6:"), Some("inuse"), Some(n)) => n.parse().ok(),
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tcp_line_of_either_file_is_read() {
        let v4 = "sockets: used 180\nTCP: inuse 3 orphan 2 tw 0 alloc 5 mem 1\nUDP: inuse 1 mem 0\n";
        assert_eq!(tcp_inuse(v4), Some(3));
        assert_eq!(tcp_inuse("TCP6: inuse 0\nUDP6: inuse 2\n"), Some(0));
        assert_eq!(tcp_inuse("UDP: inuse 1 mem 0\n"), None);
        assert_eq!(tcp_inuse("TCP: inuse x\n"), None);
    }

    #[test]
    fn this_namespace_is_counted() {
        let counts = open_here().unwrap();
        let before = tcp_in_use(&counts).unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        // A listener and both ends, whatever else this process's namespace has (other
        // tests' sockets come and go meanwhile: at least these three are there).
        assert!(tcp_in_use(&counts).unwrap() >= 3, "before: {before}");
        drop((c, s, l));
    }

    #[test]
    #[cfg_attr(not(test_as_root), ignore = "needs root: a network namespace of its own")]
    fn what_is_left_in_a_namespace_is_aborted() {
        use std::io::Read;
        if !nix::unistd::geteuid().is_root() {
            return crate::test_skip::skip("needs root: a network namespace of its own");
        }
        // This thread alone in a fresh network namespace: its sockets are all there is.
        nl::in_fresh_namespace(|| {
            let counts = open_here().unwrap();
            assert_eq!(tcp_in_use(&counts).unwrap(), 0);
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (s, _) = l.accept().unwrap();
            // Both ends of the connection (a job's listeners close with its processes).
            drop(l);
            assert_eq!(tcp_in_use(&counts).unwrap(), 2);
            // One end aborted resets the other (gone by its turn, not an error).
            let aborted = abort_tcp(&counts).unwrap();
            assert!((1..=2).contains(&aborted), "{aborted}");
            assert_eq!(tcp_in_use(&counts).unwrap(), 0);
            let mut buf = [0u8; 1];
            let e = c.read(&mut buf).unwrap_err();
            assert!(matches!(e.raw_os_error(), Some(libc::ECONNABORTED | libc::ECONNRESET)), "{e}");
            drop((c, s));
        });
    }
}
