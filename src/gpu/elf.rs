//! Just enough ELF to pick driver libraries: class, machine and `DT_SONAME`.
//!
//! Reads only the header, program headers, the dynamic segment and one string, with
//! positioned reads (libcuda is ~30 MB; nothing is mapped or read whole).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

pub const EM_386: u16 = 3;
pub const EM_PPC64: u16 = 21;
pub const EM_X86_64: u16 = 62;
pub const EM_AARCH64: u16 = 183;

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const DT_NULL: u64 = 0;
const DT_STRTAB: u64 = 5;
const DT_SONAME: u64 = 14;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfInfo {
    pub class64: bool,
    pub machine: u16,
    pub soname: Option<String>,
}

impl ElfInfo {
    /// 64-bit and built for the machine this program runs on.
    pub fn is_host_native(&self) -> bool {
        self.class64 && self.machine == host_machine()
    }
}

/// ELF machine of this build (the sandbox rootfs is the same architecture).
pub const fn host_machine() -> u16 {
    if cfg!(target_arch = "x86_64") {
        EM_X86_64
    } else if cfg!(target_arch = "aarch64") {
        EM_AARCH64
    } else if cfg!(target_arch = "powerpc64") {
        EM_PPC64
    } else {
        0
    }
}

pub fn machine_name(m: u16) -> &'static str {
    match m {
        EM_386 => "i386",
        EM_PPC64 => "ppc64",
        EM_X86_64 => "x86-64",
        EM_AARCH64 => "aarch64",
        _ => "other",
    }
}

/// `Ok(None)` when the file is not ELF.
pub fn read(path: &Path) -> io::Result<Option<ElfInfo>> {
    let f = File::open(path)?;
    let mut ident = [0u8; 64];
    let n = read_at_most(&f, &mut ident, 0)?;
    if n < 52 || &ident[..4] != b"\x7fELF" {
        return Ok(None);
    }
    let class64 = match ident[4] {
        1 => false,
        2 => true,
        _ => return Ok(None),
    };
    let le = match ident[5] {
        1 => true,
        2 => false,
        _ => return Ok(None),
    };
    let r = Reader { f: &f, le, class64 };
    let machine = r.u16_from(&ident, 18);
    let soname = r.soname(&ident).unwrap_or(None);
    Ok(Some(ElfInfo { class64, machine, soname }))
}

struct Reader<'a> {
    f: &'a File,
    le: bool,
    class64: bool,
}

impl Reader<'_> {
    fn u16_from(&self, b: &[u8], off: usize) -> u16 {
        let a = [b[off], b[off + 1]];
        if self.le {
            u16::from_le_bytes(a)
        } else {
            u16::from_be_bytes(a)
        }
    }
    fn u32_from(&self, b: &[u8], off: usize) -> u32 {
        let a: [u8; 4] = b[off..off + 4].try_into().unwrap();
        if self.le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    }
    fn u64_from(&self, b: &[u8], off: usize) -> u64 {
        let a: [u8; 8] = b[off..off + 8].try_into().unwrap();
        if self.le {
            u64::from_le_bytes(a)
        } else {
            u64::from_be_bytes(a)
        }
    }
    /// Native word (u32 for ELF32, u64 for ELF64), widened.
    fn word(&self, b: &[u8], off: usize) -> u64 {
        if self.class64 {
            self.u64_from(b, off)
        } else {
            self.u32_from(b, off) as u64
        }
    }

    fn soname(&self, hdr: &[u8]) -> io::Result<Option<String>> {
        let (phoff, phentsize, phnum) = if self.class64 {
            (self.u64_from(hdr, 0x20), self.u16_from(hdr, 0x36), self.u16_from(hdr, 0x38))
        } else {
            (self.u32_from(hdr, 0x1c) as u64, self.u16_from(hdr, 0x2a), self.u16_from(hdr, 0x2c))
        };
        let min = if self.class64 { 56 } else { 32 };
        if (phentsize as usize) < min || phnum == 0 || phnum > 4096 {
            return Ok(None);
        }
        let mut ph = vec![0u8; phentsize as usize * phnum as usize];
        self.f.read_exact_at(&mut ph, phoff)?;
        // (vaddr, memsz, offset) of each PT_LOAD, and the dynamic segment.
        let mut loads = Vec::new();
        let mut dynamic = None;
        for i in 0..phnum as usize {
            let p = &ph[i * phentsize as usize..];
            let p_type = self.u32_from(p, 0);
            let (offset, vaddr, filesz) = if self.class64 {
                (self.u64_from(p, 8), self.u64_from(p, 16), self.u64_from(p, 32))
            } else {
                (self.u32_from(p, 4) as u64, self.u32_from(p, 8) as u64, self.u32_from(p, 16) as u64)
            };
            match p_type {
                PT_LOAD => loads.push((vaddr, filesz, offset)),
                PT_DYNAMIC => dynamic = Some((offset, filesz)),
                _ => {}
            }
        }
        let Some((dyn_off, dyn_size)) = dynamic else {
            return Ok(None);
        };
        if dyn_size > (1 << 20) {
            return Ok(None);
        }
        let mut d = vec![0u8; dyn_size as usize];
        self.f.read_exact_at(&mut d, dyn_off)?;
        let ent = if self.class64 { 16 } else { 8 };
        let half = ent / 2;
        let (mut strtab, mut soname) = (None, None);
        for e in d.chunks_exact(ent) {
            let tag = self.word(e, 0);
            let val = self.word(e, half);
            match tag {
                DT_NULL => break,
                DT_STRTAB => strtab = Some(val),
                DT_SONAME => soname = Some(val),
                _ => {}
            }
        }
        let (Some(strtab), Some(soname)) = (strtab, soname) else {
            return Ok(None);
        };
        // DT_STRTAB is a virtual address: map it to a file offset through the PT_LOADs.
        let Some(file_off) =
            loads.iter().find(|(va, sz, _)| strtab >= *va && strtab < va + sz).map(|(va, _, off)| strtab - va + off)
        else {
            return Ok(None);
        };
        let mut s = [0u8; 256];
        let n = read_at_most(self.f, &mut s, file_off + soname)?;
        let end = s[..n].iter().position(|&c| c == 0).unwrap_or(n);
        Ok(std::str::from_utf8(&s[..end]).ok().filter(|s| !s.is_empty()).map(str::to_owned))
    }
}

fn read_at_most(f: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], off + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// A minimal ELF32 header (no program headers), for tests that need a 32-bit "library".
#[doc(hidden)]
pub fn fake_elf32_header(machine: u16) -> Vec<u8> {
    let mut h = vec![0u8; 52];
    h[..4].copy_from_slice(b"\x7fELF");
    h[4] = 1; // ELFCLASS32
    h[5] = 1; // little endian
    h[6] = 1;
    h[16] = 3; // ET_DYN
    h[18..20].copy_from_slice(&machine.to_le_bytes());
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_class_machine_and_soname_of_a_real_library() {
        // libc is on every glibc host; its SONAME is libc.so.6.
        let out = std::process::Command::new("ldconfig").args(["-p"]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let path = text
            .lines()
            .filter(|l| l.trim_start().starts_with("libc.so.6 (") && (l.contains("x86-64") || l.contains("AArch64")))
            .filter_map(|l| l.split(" => ").nth(1))
            .find(|p| p.contains("libc.so.6"))
            .expect("libc.so.6 in ldconfig -p");
        let info = read(Path::new(path)).unwrap().unwrap();
        assert!(info.is_host_native(), "{info:?}");
        assert_eq!(info.soname.as_deref(), Some("libc.so.6"));
    }

    #[test]
    fn non_elf_and_elf32() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("x");
        std::fs::write(&p, b"#!/bin/sh\necho not elf, but long enough to pass the size check....\n").unwrap();
        assert_eq!(read(&p).unwrap(), None);
        std::fs::write(&p, fake_elf32_header(EM_386)).unwrap();
        let info = read(&p).unwrap().unwrap();
        assert_eq!(info, ElfInfo { class64: false, machine: EM_386, soname: None });
        assert!(!info.is_host_native());
    }
}
