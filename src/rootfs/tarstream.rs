//! A streaming tar reader: frames the archive (ustar, GNU, PAX), merges long names and
//! extended headers into one [`Entry`], and hands file data out as borrowed slices of the
//! input buffer (no copy, no buffering of data in memory).
//!
//! Field decoding (octal / base-256 numbers, the ustar prefix) uses `tar::Header`; the
//! framing is ours so that (a) the metadata records that are read into memory (GNU long
//! names, PAX headers, sparse maps) are bounded, (b) sparse maps are visible to the writer
//! (holes become holes, not gigabytes of zeros), (c) truncation is always detected.

use std::io::{self, BufRead};

pub(crate) const BLOCK: usize = 512;
/// Upper bound for metadata read into memory: one GNU long name / PAX header / sparse map.
pub(crate) const MAX_META: u64 = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    File,
    Dir,
    Symlink,
    HardLink,
    Char,
    Block,
    Fifo,
    /// Anything else (volume labels, Solaris headers, unknown type flags): skipped.
    Other(u8),
}

#[derive(Debug)]
pub(crate) struct Entry {
    pub kind: Kind,
    pub path: Vec<u8>,
    pub link: Option<Vec<u8>>,
    /// Bytes of data stored in the archive for this entry (for a sparse file: the sum of
    /// its data segments).
    pub size: u64,
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    pub mtime: (i64, u32),
    pub dev: (u32, u32),
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    pub sparse: Option<Sparse>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sparse {
    /// (offset, length) of each data segment in the file, in order.
    pub map: Vec<(u64, u64)>,
    pub real_size: u64,
}

/// What went wrong while reading the archive. `path` is the entry's path when the header
/// was already decoded.
#[derive(Debug)]
pub(crate) struct TarError {
    pub what: String,
    pub path: Option<Vec<u8>>,
    pub io: Option<io::Error>,
}

impl TarError {
    fn new(what: impl Into<String>) -> TarError {
        TarError { what: what.into(), path: None, io: None }
    }
    fn io(e: io::Error) -> TarError {
        let what = if e.kind() == io::ErrorKind::UnexpectedEof {
            "unexpected end of archive (truncated?)".to_string()
        } else {
            e.to_string()
        };
        TarError { what, path: None, io: Some(e) }
    }
    fn at(mut self, path: &[u8]) -> TarError {
        self.path = Some(path.to_vec());
        self
    }
}

type Result<T> = std::result::Result<T, TarError>;

pub(crate) struct TarReader<R> {
    r: R,
    /// Data bytes of the current entry not yet consumed, then its padding.
    remaining: u64,
    pad: u64,
    done: bool,
}

fn eof() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, "unexpected end of archive")
}

impl<R: BufRead> TarReader<R> {
    pub fn new(r: R) -> TarReader<R> {
        TarReader { r, remaining: 0, pad: 0, done: false }
    }

    /// Reads into `buf` until full or EOF; returns the count.
    fn read_full(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut n = 0;
        while n < buf.len() {
            let avail = match self.r.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if avail.is_empty() {
                break;
            }
            let k = avail.len().min(buf.len() - n);
            buf[n..n + k].copy_from_slice(&avail[..k]);
            self.r.consume(k);
            n += k;
        }
        Ok(n)
    }

    fn skip(&mut self, mut n: u64) -> io::Result<()> {
        while n > 0 {
            let avail = match self.r.fill_buf() {
                Ok(b) => b.len(),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if avail == 0 {
                return Err(eof());
            }
            let k = (avail as u64).min(n) as usize;
            self.r.consume(k);
            n -= k as u64;
        }
        Ok(())
    }

    /// Reads the data of a metadata record (long name, PAX header) of `size` bytes.
    fn read_meta(&mut self, size: u64, what: &str) -> Result<Vec<u8>> {
        if size > MAX_META {
            return Err(TarError::new(format!("{what} of {size} bytes (more than the {MAX_META}-byte limit)")));
        }
        let mut v = vec![0u8; size as usize];
        if self.read_full(&mut v).map_err(TarError::io)? != v.len() {
            return Err(TarError::io(eof()));
        }
        self.skip(pad_of(size)).map_err(TarError::io)?;
        Ok(v)
    }

    /// Reads one 512-byte block; `None` at a clean end of input.
    fn read_block(&mut self) -> Result<Option<[u8; BLOCK]>> {
        let mut b = [0u8; BLOCK];
        match self.read_full(&mut b).map_err(TarError::io)? {
            0 => Ok(None),
            BLOCK => Ok(Some(b)),
            _ => Err(TarError::io(eof())),
        }
    }

    /// The next entry, after skipping what is left of the previous one. `None` at the end
    /// of the archive (a zero block, or end of input on a block boundary like GNU tar).
    pub fn next_entry(&mut self) -> Result<Option<Entry>> {
        if self.done {
            return Ok(None);
        }
        self.skip(self.remaining + self.pad).map_err(TarError::io)?;
        self.remaining = 0;
        self.pad = 0;

        let mut long_name: Option<Vec<u8>> = None;
        let mut long_link: Option<Vec<u8>> = None;
        let mut pax: Option<Vec<u8>> = None;
        loop {
            let Some(block) = self.read_block()? else {
                if long_name.is_some() || long_link.is_some() || pax.is_some() {
                    return Err(TarError::io(eof()));
                }
                self.done = true;
                return Ok(None);
            };
            if block.iter().all(|&b| b == 0) {
                if long_name.is_some() || long_link.is_some() || pax.is_some() {
                    return Err(TarError::new("extended header not followed by an entry"));
                }
                self.done = true;
                return Ok(None);
            }
            let header = tar::Header::from_byte_slice(&block);
            check_checksum(header)?;
            let hpath = header.path_bytes().into_owned();
            let typeflag = header.as_old().linkflag[0];
            let size = header.entry_size().map_err(|e| TarError::new(e.to_string()).at(&hpath))?;
            match typeflag {
                b'L' => {
                    long_name = Some(nul_trim(self.read_meta(size, "GNU long name")?));
                    continue;
                }
                b'K' => {
                    long_link = Some(nul_trim(self.read_meta(size, "GNU long link name")?));
                    continue;
                }
                b'x' => {
                    pax = Some(self.read_meta(size, "PAX extended header")?);
                    continue;
                }
                b'g' => {
                    // Global PAX records (e.g. git-archive's comment): nothing we apply.
                    self.skip(size + pad_of(size)).map_err(TarError::io)?;
                    continue;
                }
                b'M' => return Err(TarError::new("multi-volume archives are not supported").at(&hpath)),
                _ => {}
            }
            return self.build(header, typeflag, size, hpath, long_name, long_link, pax).map(Some);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        &mut self,
        header: &tar::Header,
        typeflag: u8,
        mut size: u64,
        hpath: Vec<u8>,
        long_name: Option<Vec<u8>>,
        long_link: Option<Vec<u8>>,
        pax: Option<Vec<u8>>,
    ) -> Result<Entry> {
        let num = |r: io::Result<u64>, p: &[u8]| r.map_err(|e| TarError::new(e.to_string()).at(p));
        let mut path = long_name.unwrap_or(hpath);
        let mut link = long_link.or_else(|| header.link_name_bytes().map(|c| c.into_owned()));
        // Some writers leave numeric fields blank: read those as 0 like GNU tar.
        let blank = |f: &[u8]| f.iter().all(|&b| b == 0 || b == b' ');
        let old = header.as_old();
        let mode = if blank(&old.mode) { 0 } else { num(header.mode().map(u64::from), &path)? as u32 };
        let mut uid = if blank(&old.uid) { 0 } else { num(header.uid(), &path)? };
        let mut gid = if blank(&old.gid) { 0 } else { num(header.gid(), &path)? };
        let mtime_s = if blank(&old.mtime) { 0 } else { num(header.mtime(), &path)? };
        let mut mtime = (mtime_s.min(i64::MAX as u64) as i64, 0u32);
        let mut xattrs = Vec::new();

        // PAX records override the header (and GNU long names).
        let mut psparse = PaxSparse::default();
        if let Some(pax) = &pax {
            for ext in tar::PaxExtensions::new(pax) {
                let ext = ext.map_err(|_| TarError::new("malformed PAX extended header").at(&path))?;
                let (k, v) = (ext.key_bytes(), ext.value_bytes());
                let number = |v: &[u8]| -> Result<u64> {
                    std::str::from_utf8(v)
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| TarError::new(format!("bad PAX value {}", String::from_utf8_lossy(k))))
                };
                match k {
                    b"path" => path = v.to_vec(),
                    b"linkpath" => link = Some(v.to_vec()),
                    b"size" => size = number(v).map_err(|e| e.at(&path))?,
                    b"uid" => uid = number(v).map_err(|e| e.at(&path))?,
                    b"gid" => gid = number(v).map_err(|e| e.at(&path))?,
                    b"mtime" => {
                        if let Some(t) = parse_pax_time(v) {
                            mtime = t;
                        }
                    }
                    b"GNU.sparse.major" => psparse.major = Some(number(v).map_err(|e| e.at(&path))?),
                    b"GNU.sparse.minor" => psparse.minor = Some(number(v).map_err(|e| e.at(&path))?),
                    b"GNU.sparse.name" => psparse.name = Some(v.to_vec()),
                    b"GNU.sparse.realsize" | b"GNU.sparse.size" => {
                        psparse.real_size = Some(number(v).map_err(|e| e.at(&path))?)
                    }
                    b"GNU.sparse.map" => psparse.map_text = Some(v.to_vec()),
                    b"GNU.sparse.offset" => psparse.offsets.push(number(v).map_err(|e| e.at(&path))?),
                    b"GNU.sparse.numbytes" => psparse.lengths.push(number(v).map_err(|e| e.at(&path))?),
                    _ => {
                        if let Some(name) = k.strip_prefix(b"SCHILY.xattr.") {
                            xattrs.push((name.to_vec(), v.to_vec()));
                        }
                    }
                }
            }
        }

        let mut kind = match typeflag {
            b'0' | 0 | b'7' | b'S' => Kind::File,
            b'1' => Kind::HardLink,
            b'2' => Kind::Symlink,
            b'3' => Kind::Char,
            b'4' => Kind::Block,
            b'5' | b'D' => Kind::Dir,
            b'6' => Kind::Fifo,
            other => Kind::Other(other),
        };
        // Pre-POSIX archives mark directories by a trailing slash only.
        if typeflag == 0 && path.ends_with(b"/") {
            kind = Kind::Dir;
        }
        let dev = if matches!(kind, Kind::Char | Kind::Block) {
            let maj = header.device_major().map_err(|e| TarError::new(e.to_string()).at(&path))?;
            let min = header.device_minor().map_err(|e| TarError::new(e.to_string()).at(&path))?;
            (maj.unwrap_or(0), min.unwrap_or(0))
        } else {
            (0, 0)
        };

        self.remaining = size;
        self.pad = pad_of(size);

        let mut sparse = None;
        if typeflag == b'S' {
            sparse = Some(self.gnu_sparse(header, size).map_err(|e| e.at(&path))?);
        } else if kind == Kind::File
            && (psparse.major.is_some() || psparse.map_text.is_some() || !psparse.offsets.is_empty())
        {
            if let Some(name) = psparse.name.take() {
                path = name;
            }
            sparse = Some(self.pax_sparse(&psparse).map_err(|e| e.at(&path))?);
        }
        if let Some(s) = &sparse {
            let stored: u64 = s.map.iter().map(|&(_, l)| l).sum();
            if stored != self.remaining {
                return Err(TarError::new(format!(
                    "sparse map lists {stored} bytes of data but the entry holds {}",
                    self.remaining
                ))
                .at(&path));
            }
        }
        let size = self.remaining;
        Ok(Entry { kind, path, link, size, mode, uid, gid, mtime, dev, xattrs, sparse })
    }

    /// Old GNU sparse ('S'): map in the header, continued in extension blocks.
    fn gnu_sparse(&mut self, header: &tar::Header, _size: u64) -> Result<Sparse> {
        let gnu = header.as_gnu().ok_or_else(|| TarError::new("sparse entry without a GNU header"))?;
        let real_size = gnu.real_size().map_err(|e| TarError::new(e.to_string()))?;
        let mut map = Vec::new();
        let push = |map: &mut Vec<(u64, u64)>, s: &tar::GnuSparseHeader| -> Result<()> {
            if s.is_empty() {
                return Ok(());
            }
            let o = s.offset().map_err(|e| TarError::new(e.to_string()))?;
            let l = s.length().map_err(|e| TarError::new(e.to_string()))?;
            if map.len() as u64 >= MAX_META / 16 {
                return Err(TarError::new("sparse map too large"));
            }
            map.push((o, l));
            Ok(())
        };
        for s in &gnu.sparse {
            push(&mut map, s)?;
        }
        let mut extended = gnu.is_extended();
        while extended {
            let block = self.read_block()?.ok_or_else(|| TarError::io(eof()))?;
            let mut ext = tar::GnuExtSparseHeader::new();
            ext.as_mut_bytes().copy_from_slice(&block);
            for s in &ext.sparse {
                push(&mut map, s)?;
            }
            extended = ext.is_extended();
        }
        validate_map(&map, real_size)?;
        Ok(Sparse { map, real_size })
    }

    /// PAX sparse formats 0.0 (offset/numbytes records), 0.1 (`GNU.sparse.map`) and 1.0
    /// (map at the start of the data, in decimal lines, padded to a block).
    fn pax_sparse(&mut self, p: &PaxSparse) -> Result<Sparse> {
        let real_size = p.real_size.ok_or_else(|| TarError::new("PAX sparse entry without GNU.sparse.realsize"))?;
        let mut map = Vec::new();
        if p.major == Some(1) {
            let mut nums = Vec::new();
            let mut consumed = 0u64;
            let mut cur: Option<u64> = None;
            let mut want: Option<u64> = None;
            while want.is_none_or(|w| (nums.len() as u64) < 1 + 2 * w) {
                let mut b = [0u8; 1];
                if self.remaining == 0 || self.read_full(&mut b).map_err(TarError::io)? != 1 {
                    return Err(TarError::new("truncated PAX sparse map"));
                }
                self.remaining -= 1;
                consumed += 1;
                if consumed > MAX_META {
                    return Err(TarError::new("sparse map too large"));
                }
                match b[0] {
                    b'0'..=b'9' => {
                        let d = u64::from(b[0] - b'0');
                        cur = Some(
                            cur.unwrap_or(0)
                                .checked_mul(10)
                                .and_then(|v| v.checked_add(d))
                                .ok_or_else(|| TarError::new("bad PAX sparse map"))?,
                        );
                    }
                    b'\n' => {
                        let v = cur.take().ok_or_else(|| TarError::new("bad PAX sparse map"))?;
                        if want.is_none() {
                            if v > MAX_META / 16 {
                                return Err(TarError::new("sparse map too large"));
                            }
                            want = Some(v);
                        }
                        nums.push(v);
                    }
                    _ => return Err(TarError::new("bad PAX sparse map")),
                }
            }
            let pad = pad_of(consumed);
            if self.remaining < pad {
                return Err(TarError::new("truncated PAX sparse map"));
            }
            self.skip(pad).map_err(TarError::io)?;
            self.remaining -= pad;
            map.extend(nums[1..].chunks(2).map(|c| (c[0], c[1])));
        } else if let Some(text) = &p.map_text {
            let nums: Vec<u64> = std::str::from_utf8(text)
                .ok()
                .map(|s| {
                    s.split(',')
                        .filter(|x| !x.is_empty())
                        .map(|x| x.trim().parse::<u64>())
                        .collect::<std::result::Result<Vec<_>, _>>()
                })
                .and_then(|r| r.ok())
                .ok_or_else(|| TarError::new("bad GNU.sparse.map"))?;
            if nums.len() % 2 == 1 {
                return Err(TarError::new("bad GNU.sparse.map"));
            }
            map.extend(nums.chunks(2).map(|c| (c[0], c[1])));
        } else {
            if p.offsets.len() != p.lengths.len() {
                return Err(TarError::new("bad PAX sparse offsets"));
            }
            map.extend(p.offsets.iter().copied().zip(p.lengths.iter().copied()));
        }
        validate_map(&map, real_size)?;
        Ok(Sparse { map, real_size })
    }

    /// The next slice of the current entry's data (empty when all was consumed). Errors at
    /// a premature end of input.
    pub fn data(&mut self) -> io::Result<&[u8]> {
        if self.remaining == 0 {
            return Ok(&[]);
        }
        let remaining = self.remaining;
        loop {
            match self.r.fill_buf() {
                Ok(_) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        // Buffered now: this second call does not read.
        let buf = self.r.fill_buf()?;
        if buf.is_empty() {
            return Err(eof());
        }
        let n = (buf.len() as u64).min(remaining) as usize;
        Ok(&buf[..n])
    }

    pub fn consume(&mut self, n: usize) {
        debug_assert!(n as u64 <= self.remaining);
        self.r.consume(n);
        self.remaining -= n as u64;
    }

    /// Reads the input to its end (the zero blocks, record padding, and for compressed
    /// input the trailer, whose checksum the decoder verifies at EOF).
    pub fn finish(mut self) -> io::Result<R> {
        loop {
            let n = match self.r.fill_buf() {
                Ok(b) => b.len(),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if n == 0 {
                return Ok(self.r);
            }
            self.r.consume(n);
        }
    }
}

#[derive(Default)]
struct PaxSparse {
    major: Option<u64>,
    minor: Option<u64>,
    name: Option<Vec<u8>>,
    real_size: Option<u64>,
    map_text: Option<Vec<u8>>,
    offsets: Vec<u64>,
    lengths: Vec<u64>,
}

fn validate_map(map: &[(u64, u64)], real_size: u64) -> Result<()> {
    let mut end = 0u64;
    for &(o, l) in map {
        let e = o.checked_add(l).ok_or_else(|| TarError::new("bad sparse map (overflow)"))?;
        if o < end || e > real_size {
            return Err(TarError::new("bad sparse map (overlapping or beyond the file size)"));
        }
        end = e;
    }
    Ok(())
}

fn pad_of(size: u64) -> u64 {
    (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64
}

fn nul_trim(mut v: Vec<u8>) -> Vec<u8> {
    if let Some(i) = v.iter().position(|&b| b == 0) {
        v.truncate(i);
    }
    v
}

fn check_checksum(h: &tar::Header) -> Result<()> {
    let bytes = h.as_bytes();
    let field = h.cksum().map_err(|_| TarError::new("header checksum field is not a number"))?;
    let (mut unsigned, mut signed) = (8 * 32u32, 8 * 32i64);
    for (i, &b) in bytes.iter().enumerate() {
        if !(148..156).contains(&i) {
            unsigned += u32::from(b);
            signed += i64::from(b as i8);
        }
    }
    if field == unsigned || i64::from(field) == signed {
        Ok(())
    } else {
        Err(TarError::new("header checksum mismatch (not a tar archive, or corrupt)"))
    }
}

/// PAX time: `SECONDS[.FRACTION]`; negative times are ignored (fall back to the header).
fn parse_pax_time(v: &[u8]) -> Option<(i64, u32)> {
    let s = std::str::from_utf8(v).ok()?;
    let (secs, frac) = s.split_once('.').unwrap_or((s, ""));
    let secs: i64 = secs.parse().ok().filter(|&x| x >= 0)?;
    let mut nsec = 0u32;
    for (i, c) in frac.chars().take(9).enumerate() {
        nsec += c.to_digit(10)? * 10u32.pow(8 - i as u32);
    }
    Some((secs, nsec))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        b.into_inner().unwrap()
    }

    fn file_header(path: &str, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_path(path).unwrap();
        h.set_size(size);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        h
    }

    fn entries(data: &[u8]) -> Result<Vec<(Entry, Vec<u8>)>> {
        let mut r = TarReader::new(data);
        let mut out = Vec::new();
        while let Some(e) = r.next_entry()? {
            let mut d = Vec::new();
            loop {
                let chunk = r.data().map_err(TarError::io)?;
                if chunk.is_empty() {
                    break;
                }
                let n = chunk.len();
                d.extend_from_slice(chunk);
                r.consume(n);
            }
            out.push((e, d));
        }
        Ok(out)
    }

    #[test]
    fn long_names_and_pax() {
        let long = "d/".repeat(100) + "file";
        let data = archive(|b| {
            b.append_data(&mut file_header("x", 5), &long, &b"hello"[..]).unwrap();
            b.append_pax_extensions([("SCHILY.xattr.user.k", &b"v"[..]), ("mtime", &b"12.5"[..])]).unwrap();
            b.append_data(&mut file_header("y", 0), "y", &b""[..]).unwrap();
        });
        let es = entries(&data).unwrap();
        assert_eq!(es.len(), 2);
        assert_eq!(es[0].0.path, long.as_bytes());
        assert_eq!(es[0].1, b"hello");
        assert_eq!(es[1].0.xattrs, vec![(b"user.k".to_vec(), b"v".to_vec())]);
        assert_eq!(es[1].0.mtime, (12, 500_000_000));
    }

    #[test]
    fn truncation_and_checksum() {
        let data = archive(|b| {
            b.append_data(&mut file_header("x", 1000), "x", &[7u8; 1000][..]).unwrap();
        });
        // Cut inside the data.
        let e = entries(&data[..800]).unwrap_err();
        assert!(e.what.contains("unexpected end"), "{}", e.what);
        // Cut inside a header.
        let e = entries(&data[..100]).unwrap_err();
        assert!(e.what.contains("unexpected end"), "{}", e.what);
        // Flip a byte of the header.
        let mut bad = data.clone();
        bad[10] ^= 1;
        let e = entries(&bad).unwrap_err();
        assert!(e.what.contains("checksum"), "{}", e.what);
        // End of input on a block boundary without the zero blocks is accepted (GNU tar does).
        assert_eq!(entries(&data[..512 + 1024]).unwrap().len(), 1);
    }

    #[test]
    fn oversized_long_name_is_refused_without_allocating() {
        let mut h = tar::Header::new_gnu();
        h.as_gnu_mut().unwrap().name[..13].copy_from_slice(b"././@LongLink");
        h.set_entry_type(tar::EntryType::GNULongName);
        h.set_size(10 << 30);
        h.set_cksum();
        let mut data = h.as_bytes().to_vec();
        data.extend_from_slice(&[0u8; 1024]);
        let e = entries(&data).unwrap_err();
        assert!(e.what.contains("GNU long name of 10737418240 bytes"), "{}", e.what);
    }

    #[test]
    fn pax_sparse_1_0() {
        // map: 2 segments: (0,3) and (1000,2); real size 2000.
        let map = b"2\n0\n3\n1000\n2\n";
        let mut data = map.to_vec();
        data.resize(512, 0);
        data.extend_from_slice(b"abcXY");
        let data_len = data.len() as u64;
        let tarball = archive(|b| {
            b.append_pax_extensions([
                ("GNU.sparse.major", &b"1"[..]),
                ("GNU.sparse.minor", &b"0"[..]),
                ("GNU.sparse.name", &b"real/name"[..]),
                ("GNU.sparse.realsize", &b"2000"[..]),
            ])
            .unwrap();
            b.append_data(&mut file_header("x", data_len), "GNUSparseFile.0/name", &data[..]).unwrap();
        });
        let es = entries(&tarball).unwrap();
        assert_eq!(es[0].0.path, b"real/name");
        assert_eq!(es[0].0.sparse, Some(Sparse { map: vec![(0, 3), (1000, 2)], real_size: 2000 }));
        assert_eq!(es[0].1, b"abcXY");
    }

    #[test]
    fn gnu_sparse_with_extension_block() {
        let mut h = tar::Header::new_gnu();
        h.set_path("s").unwrap();
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_entry_type(tar::EntryType::GNUSparse);
        h.set_size(7);
        {
            let g = h.as_gnu_mut().unwrap();
            g.sparse[0].set_offset(0);
            g.sparse[0].set_length(4);
            g.sparse[1].set_offset(1000);
            g.sparse[1].set_length(3);
            g.set_real_size(2000);
            g.set_is_extended(true);
        }
        h.set_cksum();
        let mut ext = tar::GnuExtSparseHeader::new();
        ext.sparse[0].set_offset(1990);
        ext.sparse[0].set_length(0);
        let mut data = h.as_bytes().to_vec();
        data.extend_from_slice(ext.as_bytes());
        let mut body = b"headend".to_vec();
        body.resize(512, 0);
        data.extend_from_slice(&body);
        data.extend_from_slice(&[0u8; 1024]);
        let es = entries(&data).unwrap();
        assert_eq!(es.len(), 1);
        assert_eq!(es[0].0.kind, Kind::File);
        assert_eq!(es[0].0.sparse, Some(Sparse { map: vec![(0, 4), (1000, 3), (1990, 0)], real_size: 2000 }));
        assert_eq!(es[0].1, b"headend");
        // A map reaching past the real size is refused.
        let mut bad = data.clone();
        let g = tar::Header::from_byte_slice(&bad[..512]).clone();
        let mut g = g;
        g.as_gnu_mut().unwrap().set_real_size(1500);
        g.set_cksum();
        bad[..512].copy_from_slice(g.as_bytes());
        let e = entries(&bad).unwrap_err();
        assert!(e.what.contains("bad sparse map"), "{}", e.what);
    }

    #[test]
    fn pax_times() {
        assert_eq!(parse_pax_time(b"1700000000.123456789123"), Some((1700000000, 123456789)));
        assert_eq!(parse_pax_time(b"5"), Some((5, 0)));
        assert_eq!(parse_pax_time(b"-5.5"), None);
        assert_eq!(parse_pax_time(b"x"), None);
    }
}
