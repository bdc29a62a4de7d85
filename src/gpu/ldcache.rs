//! Parser for glibc's dynamic linker cache (`etc/ld.so.cache`), both formats:
//! the old `ld.so-1.7.0` (possibly followed by a new-format cache, "compat"), and the new
//! `glibc-ld.so.cache1.1`. Same layout as glibc's `sysdeps/generic/dl-cache.h`; no
//! `ldconfig -p` needed, and it reads a driver root's cache, not only the host's.

use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};

const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
const OLD_HEADER: usize = 16; // magic[11] + pad + u32 nlibs
const OLD_ENTRY: usize = 12; // i32 flags, u32 key, u32 value
const NEW_HEADER: usize = 48; // magic+version[20], nlibs, len_strings, flags u8 + pad[3], ext off, unused[3]
const NEW_ENTRY: usize = 24; // i32 flags, u32 key, u32 value, u32 osversion, u64 hwcap
const NEW_FLAGS_LITTLE: u8 = 2;
const NEW_FLAGS_BIG: u8 = 3;

pub const FLAG_TYPE_MASK: i32 = 0x00ff;
pub const FLAG_ELF_LIBC6: i32 = 0x0003;
pub const FLAG_REQUIRED_MASK: i32 = 0xff00;
pub const FLAG_X8664_LIB64: i32 = 0x0300;
pub const FLAG_AARCH64_LIB64: i32 = 0x0a00;
pub const FLAG_POWERPC_LIB64: i32 = 0x0500;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum CacheFormat {
    /// `ld.so-1.7.0` only.
    Old,
    /// `glibc-ld.so.cache1.1` only (glibc >= 2.32 default).
    New,
    /// Old header and entries followed by a new-format cache; the new part is used.
    Compat,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CacheEntry {
    /// The key ld.so looks up: the SONAME (`libcuda.so.1`).
    pub name: String,
    /// Path as stored, absolute in the cache owner's view (join under the driver root).
    pub path: PathBuf,
    pub flags: i32,
    /// Non-zero for glibc-hwcaps subdirectory entries (new format only).
    pub hwcap: u64,
}

impl CacheEntry {
    /// The flags ldconfig gives a 64-bit glibc library of this build's architecture
    /// (x86-64: 0x0303, aarch64: 0x0a03).
    pub const fn host_flags() -> i32 {
        FLAG_ELF_LIBC6
            | if cfg!(target_arch = "x86_64") {
                FLAG_X8664_LIB64
            } else if cfg!(target_arch = "aarch64") {
                FLAG_AARCH64_LIB64
            } else if cfg!(target_arch = "powerpc64") {
                FLAG_POWERPC_LIB64
            } else {
                0
            }
    }

    pub fn is_host_native(&self) -> bool {
        self.flags == Self::host_flags()
    }

    /// What `ldconfig -p` prints in parentheses, e.g. `libc6,x86-64`.
    pub fn describe_flags(&self) -> String {
        let ty = match self.flags & FLAG_TYPE_MASK {
            0x0000 => "libc4",
            0x0001 => "ELF",
            0x0002 => "libc5",
            0x0003 => "libc6",
            _ => "unknown",
        };
        let arch = match self.flags & FLAG_REQUIRED_MASK {
            0x0000 => "",
            0x0100 => ",64bit",
            0x0200 => ",IA-64",
            FLAG_X8664_LIB64 => ",x86-64",
            0x0400 => ",64bit",
            FLAG_POWERPC_LIB64 => ",64bit",
            0x0600 => ",N32",
            0x0700 => ",64bit",
            0x0800 => ",x32",
            0x0900 => ",hard-float",
            FLAG_AARCH64_LIB64 => ",AArch64",
            0x0b00 => ",soft-float",
            _ => ",other",
        };
        format!("{ty}{arch}")
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct LdCache {
    /// Host path of the cache file that was read.
    pub file: PathBuf,
    pub format: CacheFormat,
    pub entries: Vec<CacheEntry>,
}

impl LdCache {
    /// Reads `<driver_root>/etc/ld.so.cache`.
    pub fn load(driver_root: &Path) -> Result<LdCache> {
        Self::load_file(&driver_root.join("etc/ld.so.cache"))
    }

    pub fn load_file(file: &Path) -> Result<LdCache> {
        let bytes =
            std::fs::read(file).with_context(|| format!("cannot read the dynamic linker cache {}", file.display()))?;
        let (format, entries) = parse(&bytes)
            .with_context(|| format!("{} is not a valid ld.so.cache (run ldconfig to rebuild it)", file.display()))?;
        Ok(LdCache { file: file.to_path_buf(), format, entries })
    }

    /// Entries for `name` usable by this architecture, in ld.so's preference order.
    pub fn lookup<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a CacheEntry> + 'a {
        self.entries.iter().filter(move |e| e.name == name && e.is_host_native())
    }
}

/// Parses a cache image. For the compat layout the new-format part wins (as in ld.so).
pub fn parse(bytes: &[u8]) -> Result<(CacheFormat, Vec<CacheEntry>)> {
    if bytes.starts_with(NEW_MAGIC) {
        return Ok((CacheFormat::New, parse_new(bytes)?));
    }
    if !bytes.starts_with(OLD_MAGIC) {
        bail!("unknown magic (neither ld.so-1.7.0 nor glibc-ld.so.cache1.1)");
    }
    if bytes.len() < OLD_HEADER {
        bail!("truncated header");
    }
    let nlibs = u32_le(bytes, 12) as usize;
    let entries_end = nlibs
        .checked_mul(OLD_ENTRY)
        .and_then(|n| n.checked_add(OLD_HEADER))
        .filter(|&end| end <= bytes.len())
        .context("old-format entry table runs past the end of the file")?;
    // A new-format cache may follow, 8-byte aligned (glibc's ALIGN_CACHE).
    let new_off = (entries_end + 7) & !7;
    if bytes.len() >= new_off + NEW_HEADER && bytes[new_off..].starts_with(NEW_MAGIC) {
        return Ok((CacheFormat::Compat, parse_new(&bytes[new_off..])?));
    }
    // Old-format string offsets count from the end of the entry table.
    let strings = &bytes[entries_end..];
    let mut entries = Vec::with_capacity(nlibs);
    for i in 0..nlibs {
        let e = OLD_HEADER + i * OLD_ENTRY;
        let flags = u32_le(bytes, e) as i32;
        let name = c_str(strings, u32_le(bytes, e + 4) as usize)?;
        let path = c_str(strings, u32_le(bytes, e + 8) as usize)?;
        entries.push(CacheEntry { name, path: PathBuf::from(path), flags, hwcap: 0 });
    }
    Ok((CacheFormat::Old, entries))
}

/// `bytes` starts at the new-format header; string offsets count from there.
fn parse_new(bytes: &[u8]) -> Result<Vec<CacheEntry>> {
    if bytes.len() < NEW_HEADER {
        bail!("truncated glibc-ld.so.cache1.1 header");
    }
    let endian = bytes[28];
    let native_big = cfg!(target_endian = "big");
    if (endian == NEW_FLAGS_BIG && !native_big) || (endian == NEW_FLAGS_LITTLE && native_big) {
        bail!("cache was written for the other byte order");
    }
    let nlibs = u32_le(bytes, 20) as usize;
    nlibs
        .checked_mul(NEW_ENTRY)
        .and_then(|n| n.checked_add(NEW_HEADER))
        .filter(|&end| end <= bytes.len())
        .context("entry table runs past the end of the file")?;
    let mut entries = Vec::with_capacity(nlibs);
    for i in 0..nlibs {
        let e = NEW_HEADER + i * NEW_ENTRY;
        let flags = u32_le(bytes, e) as i32;
        let name = c_str(bytes, u32_le(bytes, e + 4) as usize)?;
        let path = c_str(bytes, u32_le(bytes, e + 8) as usize)?;
        let hwcap = u64::from_le_bytes(bytes[e + 16..e + 24].try_into().unwrap());
        entries.push(CacheEntry { name, path: PathBuf::from(path), flags, hwcap });
    }
    Ok(entries)
}

fn u32_le(b: &[u8], off: usize) -> u32 {
    let a: [u8; 4] = b[off..off + 4].try_into().unwrap();
    if cfg!(target_endian = "big") {
        u32::from_be_bytes(a)
    } else {
        u32::from_le_bytes(a)
    }
}

fn c_str(b: &[u8], off: usize) -> Result<String> {
    let tail = b.get(off..).context("string offset past the end of the file")?;
    let len = tail.iter().position(|&c| c == 0).context("unterminated string")?;
    Ok(String::from_utf8_lossy(&tail[..len]).into_owned())
}

/// Builds an old-format (`ld.so-1.7.0`) cache image; for tests and fixtures.
#[doc(hidden)]
pub fn build_old_format(entries: &[(&str, &str, i32)]) -> Vec<u8> {
    let mut strings = Vec::new();
    let mut table = Vec::new();
    for (name, path, flags) in entries {
        let k = strings.len() as u32;
        strings.extend_from_slice(name.as_bytes());
        strings.push(0);
        let v = strings.len() as u32;
        strings.extend_from_slice(path.as_bytes());
        strings.push(0);
        table.extend_from_slice(&flags.to_le_bytes());
        table.extend_from_slice(&k.to_le_bytes());
        table.extend_from_slice(&v.to_le_bytes());
    }
    let mut out = Vec::new();
    out.extend_from_slice(OLD_MAGIC);
    out.push(0);
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    out.extend(table);
    out.extend(strings);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::process::Command;

    /// `(name, path)` pairs as `ldconfig -p -C FILE` prints them.
    fn ldconfig_p(cache: &Path) -> BTreeSet<(String, String)> {
        let out = Command::new("ldconfig").arg("-p").arg("-C").arg(cache).output().expect("run ldconfig -p");
        assert!(out.status.success(), "ldconfig -p failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .filter(|l| l.starts_with('\t'))
            .map(|l| {
                let (lhs, path) = l.trim().split_once(" => ").expect("ldconfig -p line");
                let name = lhs.split(" (").next().unwrap();
                (name.to_string(), path.to_string())
            })
            .collect()
    }

    fn ours(cache: &LdCache) -> BTreeSet<(String, String)> {
        cache.entries.iter().map(|e| (e.name.clone(), e.path.display().to_string())).collect()
    }

    #[test]
    fn host_cache_matches_ldconfig_p() {
        let cache = LdCache::load(Path::new("/")).unwrap();
        assert!(cache.entries.len() > 10, "suspiciously small host cache");
        assert_eq!(ours(&cache), ldconfig_p(Path::new("/etc/ld.so.cache")));
        let libc: Vec<_> = cache.lookup("libc.so.6").collect();
        assert!(!libc.is_empty(), "libc.so.6 not found for this architecture");
        assert_eq!(libc[0].flags, CacheEntry::host_flags());
        assert!(libc[0].describe_flags().starts_with("libc6,"));
    }

    /// `ldconfig -c old|compat` still writes the old layouts; ours must read both exactly.
    #[test]
    fn old_and_compat_formats_written_by_ldconfig() {
        let t = tempfile::tempdir().unwrap();
        for (fmt, want) in [("old", CacheFormat::Old), ("compat", CacheFormat::Compat), ("new", CacheFormat::New)] {
            let file = t.path().join(format!("{fmt}.cache"));
            // -X: do not touch symlinks in the scanned dirs.
            let st = Command::new("ldconfig").args(["-X", "-c", fmt, "-C"]).arg(&file).status().unwrap();
            assert!(st.success(), "ldconfig -c {fmt}");
            let cache = LdCache::load_file(&file).unwrap();
            assert_eq!(cache.format, want, "{fmt}");
            assert_eq!(ours(&cache), ldconfig_p(&file), "{fmt}");
        }
    }

    #[test]
    fn synthetic_old_format() {
        let img = build_old_format(&[
            ("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", 0x0303),
            ("libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1", 0x0003),
            ("libnvidia-ml.so.1", "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1", 0x0a03),
        ]);
        let (fmt, e) = parse(&img).unwrap();
        assert_eq!(fmt, CacheFormat::Old);
        assert_eq!(e.len(), 3);
        assert_eq!(e[0].name, "libcuda.so.1");
        assert_eq!(e[0].path, PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so.1"));
        assert_eq!(e[0].describe_flags(), "libc6,x86-64");
        assert_eq!(e[1].describe_flags(), "libc6");
        assert_eq!(e[2].describe_flags(), "libc6,AArch64");
        assert_eq!(e[2].path, PathBuf::from("/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1"));
        // Corruption is an error, never a panic.
        assert!(parse(&img[..20]).is_err());
        assert!(parse(b"garbage").is_err());
        let mut bad = img.clone();
        bad[12] = 0xff; // nlibs far too large
        assert!(parse(&bad).is_err());
        let mut bad = img;
        let n = bad.len();
        bad[n - 1] = b'x'; // last string unterminated
        assert!(parse(&bad).is_err());
    }
}
