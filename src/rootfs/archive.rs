//! The archive stream: compression detection by magic bytes (never by file name),
//! SHA-256 and byte counting of the stream as read, and a two-thread pipeline: the
//! calling thread reads and decompresses, a worker thread consumes the tar stream.

use crate::digest::hex;
use sha2::{Digest, Sha256};
use std::io::{self, BufRead, BufReader, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

/// Read buffer on the source and size of the chunks handed to the tar consumer.
pub const CHUNK: usize = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    /// `tar`, `tar+gzip`, `tar+zstd`.
    pub fn describe(self) -> &'static str {
        match self {
            Compression::None => "tar",
            Compression::Gzip => "tar+gzip",
            Compression::Zstd => "tar+zstd",
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    #[error("unsupported compression: {0}; recompress with gzip or zstd")]
    Unsupported(&'static str),
    #[error("not a tar archive ({0}); expected tar, tar.gz or tar.zst")]
    NotTar(&'static str),
    #[error("empty input: no archive data was read")]
    Empty,
}

/// Identifies the stream from its first bytes (up to 512).
pub fn detect(head: &[u8]) -> Result<Compression, FormatError> {
    let starts = |m: &[u8]| head.starts_with(m);
    if head.is_empty() {
        return Err(FormatError::Empty);
    }
    if starts(&[0x1f, 0x8b]) {
        return Ok(Compression::Gzip);
    }
    if starts(&[0x28, 0xb5, 0x2f, 0xfd]) {
        return Ok(Compression::Zstd);
    }
    if starts(&[0xfd, b'7', b'z', b'X', b'Z', 0x00]) {
        return Err(FormatError::Unsupported("xz"));
    }
    if starts(b"BZh") {
        return Err(FormatError::Unsupported("bzip2"));
    }
    if starts(&[0x04, 0x22, 0x4d, 0x18]) {
        return Err(FormatError::Unsupported("lz4"));
    }
    if starts(&[0x1f, 0x9d]) {
        return Err(FormatError::Unsupported("compress (.Z)"));
    }
    if starts(b"LZIP") {
        return Err(FormatError::Unsupported("lzip"));
    }
    if head.len() >= 512 && is_tar_header(&head[..512]) {
        return Ok(Compression::None);
    }
    if starts(&[0x5d, 0x00, 0x00]) {
        return Err(FormatError::Unsupported("lzma"));
    }
    if starts(b"PK\x03\x04") {
        return Err(FormatError::NotTar("it is a zip file"));
    }
    if head.len() < 512 {
        return Err(FormatError::NotTar("too short"));
    }
    Err(FormatError::NotTar("unrecognised format"))
}

/// A valid tar header (checksum matches), or a zero block (an empty archive).
fn is_tar_header(b: &[u8]) -> bool {
    if b.iter().all(|&x| x == 0) {
        return true;
    }
    let field = &b[148..156];
    let digits: Vec<u8> =
        field.iter().copied().skip_while(|c| *c == b' ').take_while(|c| (b'0'..=b'7').contains(c)).collect();
    let Some(stored) = std::str::from_utf8(&digits).ok().and_then(|s| u32::from_str_radix(s, 8).ok()) else {
        return false;
    };
    let (mut unsigned, mut signed) = (8 * 32u32, 8 * 32i64);
    for (i, &x) in b.iter().enumerate() {
        if !(148..156).contains(&i) {
            unsigned += u32::from(x);
            signed += i64::from(x as i8);
        }
    }
    stored == unsigned || i64::from(stored) == signed
}

/// Facts about the stream as read, once it was read to its end.
#[derive(Debug, Clone)]
pub struct StreamInfo {
    pub compression: Compression,
    pub bytes_read: u64,
    /// Hex SHA-256 of every byte read from the source.
    pub sha256: String,
    /// Bytes after the end of the last gzip member that were ignored (zero padding).
    pub trailing_bytes: u64,
}

/// Counts, hashes and reports every byte read from the source.
struct Source<'a> {
    inner: &'a mut dyn Read,
    n: u64,
    hasher: Sha256,
    progress: &'a mut dyn FnMut(u64),
    error: Option<String>,
}

impl Read for Source<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.inner.read(buf) {
                Ok(n) => {
                    self.hasher.update(&buf[..n]);
                    self.n += n as u64;
                    if n > 0 {
                        (self.progress)(self.n);
                    }
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.error = Some(e.to_string());
                    return Err(e);
                }
            }
        }
    }
}

/// gzip with any number of members (like `gzip -d`); bytes after the last member are
/// drained (so the hash covers them) and counted instead of failing the import.
struct MultiGz<R: BufRead> {
    dec: Option<flate2::bufread::GzDecoder<R>>,
    trailing: u64,
}

impl<R: BufRead> Read for MultiGz<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let Some(dec) = self.dec.as_mut() else { return Ok(0) };
            let n = dec.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            let mut inner = self.dec.take().expect("decoder present").into_inner();
            let next = inner.fill_buf()?;
            if next.is_empty() {
                return Ok(0);
            }
            if next.starts_with(&[0x1f, 0x8b]) {
                self.dec = Some(flate2::bufread::GzDecoder::new(inner));
                continue;
            }
            loop {
                let k = inner.fill_buf()?.len();
                if k == 0 {
                    return Ok(0);
                }
                inner.consume(k);
                self.trailing += k as u64;
            }
        }
    }
}

/// Decompressed stream for the consumer: chunks from the reading thread, as a `BufRead`
/// (data is handed out in place, no copy).
pub struct ChunkReader {
    rx: Receiver<io::Result<(Vec<u8>, usize)>>,
    back: SyncSender<Vec<u8>>,
    buf: Vec<u8>,
    len: usize,
    pos: usize,
    failed: Option<(io::ErrorKind, String)>,
    eof: bool,
}

impl Read for ChunkReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let avail = self.fill_buf()?;
        let n = avail.len().min(out.len());
        out[..n].copy_from_slice(&avail[..n]);
        self.consume(n);
        Ok(n)
    }
}

impl BufRead for ChunkReader {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if self.pos < self.len {
            return Ok(&self.buf[self.pos..self.len]);
        }
        if let Some((kind, msg)) = &self.failed {
            return Err(io::Error::new(*kind, msg.clone()));
        }
        if self.eof {
            return Ok(&[]);
        }
        let old = std::mem::take(&mut self.buf);
        if old.capacity() > 0 {
            let _ = self.back.try_send(old);
        }
        match self.rx.recv() {
            Ok(Ok((b, n))) => {
                self.buf = b;
                self.len = n;
                self.pos = 0;
                Ok(&self.buf[..n])
            }
            Ok(Err(e)) => {
                self.len = 0;
                self.pos = 0;
                self.failed = Some((e.kind(), e.to_string()));
                Err(e)
            }
            Err(_) => {
                self.len = 0;
                self.pos = 0;
                self.eof = true;
                Ok(&[])
            }
        }
    }
    fn consume(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.len);
    }
}

/// Failures of the reading side that are not the consumer's to report.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("cannot read the archive: {0}")]
    Source(String),
    #[error("corrupt archive: {0}")]
    Decode(String),
    #[error("{0}")]
    Other(String),
}

/// Error kind the consumer sees when `cancel` was set.
pub const CANCELLED: &str = "import interrupted";

fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    match fill(r, buf) {
        (n, None) => Ok(n),
        (_, Some(e)) => Err(e),
    }
}

/// Reads until `buf` is full, EOF or an error; returns what was read before the error too.
fn fill(r: &mut dyn Read, buf: &mut [u8]) -> (usize, Option<io::Error>) {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return (n, Some(e)),
        }
    }
    (n, None)
}

/// Detects the compression of `src`, then reads, hashes and decompresses it on this
/// thread while `consume` runs on a worker thread with the decompressed tar stream.
/// `consume` should read its input to the end (so the stream's trailer is checked and
/// the hash covers everything); when it stops early, reading stops too.
///
/// Returns the consumer's value; an `Err` only for problems the consumer cannot see
/// (unrecognised format, a read error on the source itself).
pub fn pipeline<T: Send>(
    src: &mut dyn Read,
    progress: &mut dyn FnMut(u64),
    cancel: &AtomicBool,
    consume: impl FnOnce(Compression, &mut ChunkReader) -> T + Send,
) -> Result<(StreamInfo, T), StreamError> {
    let mut source = Source { inner: src, n: 0, hasher: Sha256::new(), progress, error: None };
    let mut head = vec![0u8; 512];
    let n = read_full(&mut source, &mut head).map_err(|e| StreamError::Source(e.to_string()))?;
    head.truncate(n);
    let compression = detect(&head)?;

    let raw = BufReader::with_capacity(CHUNK, io::Cursor::new(head).chain(&mut source));
    let mut gz_trailing = 0u64;
    let value = {
        let mut gz = None;
        let mut zs;
        let mut plain;
        let dec: &mut dyn Read = match compression {
            Compression::Gzip => gz.insert(MultiGz { dec: Some(flate2::bufread::GzDecoder::new(raw)), trailing: 0 }),
            Compression::Zstd => {
                let mut d =
                    zstd::stream::read::Decoder::with_buffer(raw).map_err(|e| StreamError::Decode(e.to_string()))?;
                // Accept archives made with `zstd --long=31`.
                let _ = d.window_log_max(31);
                zs = d;
                &mut zs
            }
            Compression::None => {
                plain = raw;
                &mut plain
            }
        };
        let r = run(dec, cancel, compression, consume);
        if let Some(gz) = &gz {
            gz_trailing = gz.trailing;
        }
        r
    };
    if let Some(e) = source.error {
        return Err(StreamError::Source(e));
    }
    let value = value.map_err(|e| StreamError::Other(format!("cannot start the unpacking thread: {e}")))?;
    let info = StreamInfo {
        compression,
        bytes_read: source.n,
        sha256: hex(&source.hasher.finalize()),
        trailing_bytes: gz_trailing,
    };
    Ok((info, value))
}

/// Runs the two threads; `Err` only if the worker could not be started.
fn run<T: Send>(
    dec: &mut dyn Read,
    cancel: &AtomicBool,
    compression: Compression,
    consume: impl FnOnce(Compression, &mut ChunkReader) -> T + Send,
) -> io::Result<T> {
    let (tx, rx) = sync_channel::<io::Result<(Vec<u8>, usize)>>(4);
    let (back_tx, back_rx) = sync_channel::<Vec<u8>>(6);
    std::thread::scope(|s| {
        let worker = std::thread::Builder::new().name("azp-unpack".into()).spawn_scoped(s, move || {
            let mut r = ChunkReader { rx, back: back_tx, buf: Vec::new(), len: 0, pos: 0, failed: None, eof: false };
            consume(compression, &mut r)
        })?;
        loop {
            if cancel.load(Ordering::Relaxed) {
                let _ = tx.send(Err(io::Error::other(CANCELLED)));
                break;
            }
            let mut buf = back_rx.try_recv().unwrap_or_else(|_| vec![0u8; CHUNK]);
            let (n, err) = fill(dec, &mut buf);
            if n > 0 && tx.send(Ok((buf, n))).is_err() {
                break; // the consumer stopped (and reports why)
            }
            if let Some(e) = err {
                // Decoder errors go to the consumer, which names the entry they hit.
                let _ = tx.send(Err(e));
                break;
            }
            if n < CHUNK {
                break; // end of stream
            }
        }
        drop(tx);
        match worker.join() {
            Ok(v) => Ok(v),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_block() -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        h.set_mode(0o644);
        b.append_data(&mut h, "a", &b"x"[..]).unwrap();
        b.into_inner().unwrap()
    }

    #[test]
    fn detects_by_magic() {
        assert_eq!(detect(&[0x1f, 0x8b, 8, 0]), Ok(Compression::Gzip));
        assert_eq!(detect(&[0x28, 0xb5, 0x2f, 0xfd, 0]), Ok(Compression::Zstd));
        assert_eq!(detect(&tar_block()[..512]), Ok(Compression::None));
        assert_eq!(detect(&[0u8; 512]), Ok(Compression::None));
        let xz = detect(&[0xfd, b'7', b'z', b'X', b'Z', 0, 0]).unwrap_err();
        assert_eq!(xz.to_string(), "unsupported compression: xz; recompress with gzip or zstd");
        assert_eq!(detect(b"BZh91AY&SY"), Err(FormatError::Unsupported("bzip2")));
        assert_eq!(detect(&[0x04, 0x22, 0x4d, 0x18, 1]), Err(FormatError::Unsupported("lz4")));
        assert_eq!(detect(b""), Err(FormatError::Empty));
        assert_eq!(detect(b"hello world"), Err(FormatError::NotTar("too short")));
        assert_eq!(detect(&[b'x'; 600]), Err(FormatError::NotTar("unrecognised format")));
    }

    #[test]
    fn pipeline_hashes_and_counts() {
        use std::io::Write;
        let tarball = tar_block();
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(&tarball).unwrap();
        let mut gz = enc.finish().unwrap();
        // A second member and zero padding after it, like some tools write.
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(b"tail").unwrap();
        gz.extend(enc.finish().unwrap());
        gz.extend([0u8; 100]);
        let mut last = 0;
        let cancel = AtomicBool::new(false);
        let (info, out) = pipeline(&mut &gz[..], &mut |n| last = n, &cancel, |c, r| {
            assert_eq!(c, Compression::Gzip);
            let mut v = Vec::new();
            r.read_to_end(&mut v).unwrap();
            v
        })
        .unwrap();
        let mut want = tarball.clone();
        want.extend(b"tail");
        assert_eq!(out, want);
        assert_eq!(info.bytes_read, gz.len() as u64);
        assert_eq!(last, gz.len() as u64);
        assert_eq!(info.trailing_bytes, 100);
        assert_eq!(info.sha256, hex(&Sha256::digest(&gz)));
    }

    #[test]
    fn corrupt_gzip_reaches_the_consumer() {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut enc, &vec![7u8; 300_000]).unwrap();
        let gz = enc.finish().unwrap();
        let cancel = AtomicBool::new(false);
        let (_, res) = pipeline(&mut &gz[..gz.len() / 2], &mut |_| {}, &cancel, |_, r| {
            let mut v = Vec::new();
            r.read_to_end(&mut v).map(|_| v.len())
        })
        .unwrap();
        assert!(res.is_err(), "truncated gzip must fail: {res:?}");
    }
}
