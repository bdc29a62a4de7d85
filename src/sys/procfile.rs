//! Reading a small file of /proc (or cgroupfs) in one `read`: `std::fs::read_to_string`
//! sizes its buffer from the file's size, which both report as 0, so it probes with 32
//! bytes and doubles from there (eight reads for this VM's 2.5 KB mountinfo, seven for a
//! v1 memory.stat), and the kernel generates the file again up to the offset of every
//! read. `exec` reads a few such files on its path (its cgroups and their memory limit,
//! the stray-mount check of its clean-up).

use std::io::Read;
use std::path::Path;

/// Enough for every file read this way in one read; a longer one (mountinfo of a host
/// with hundreds of mounts) takes more.
const FIRST_READ: usize = 16 << 10;

/// The whole of `path` (UTF-8).
pub fn read(path: impl AsRef<Path>) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut buf = vec![0u8; FIRST_READ];
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(len);
    String::from_utf8(buf).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_what_read_to_string_reads() {
        for p in ["/proc/self/mountinfo", "/proc/self/cgroup", "/proc/sys/kernel/pid_max"] {
            assert_eq!(super::read(p).unwrap(), std::fs::read_to_string(p).unwrap(), "{p}");
        }
        // Longer than the first read: the rest comes too.
        let t = tempfile::tempdir().unwrap();
        let long: String = (0..super::FIRST_READ * 3).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
        std::fs::write(t.path().join("f"), &long).unwrap();
        assert_eq!(super::read(t.path().join("f")).unwrap(), long);
        assert!(super::read(t.path().join("missing")).is_err());
    }
}
