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
//! Steps: [`open_here`] in the job's namespace (the files keep showing the namespace they
//! were opened in), then [`tcp_in_use`] after the job. An open file holds the namespace
//! as the helper's watch sockets do: drop it right after the count.

use super::error::{errno_of, Error, Result};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

/// The sockstat files of the namespace they were opened in.
#[derive(Debug)]
pub struct SocketCounts {
    files: Vec<(PathBuf, File)>,
}

impl SocketCounts {
    /// No files: counts nothing (the test double's).
    pub fn none() -> SocketCounts {
        SocketCounts { files: vec![] }
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
    Ok(SocketCounts { files })
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
}
