//! Cheap facts about an unpacked tree: CPU architecture (from an ELF header) and CUDA
//! version. Files are opened with `openat2(RESOLVE_IN_ROOT)` (symlinks such as
//! `/usr/local/cuda -> cuda-12.4` resolve inside the tree) and only if they are regular
//! files (a fifo or device at `bin/sh` must not block or touch hardware).

use crate::sys::fs_at;
use std::io::Read;
use std::os::fd::{AsRawFd, RawFd};

/// Opens `path` (relative, inside `root`) for reading if it is a regular file, and reads
/// at most `limit` bytes.
pub(crate) fn read_in_root(root: RawFd, path: &str, limit: u64) -> Option<Vec<u8>> {
    let c = fs_at::cstring(path.as_bytes()).ok()?;
    let resolve = fs_at::RESOLVE_IN_ROOT | fs_at::RESOLVE_NO_MAGICLINKS;
    let p = fs_at::openat2(root, &c, libc::O_PATH, resolve).ok()?;
    let st = fs_at::fstat(p.as_raw_fd()).ok()?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return None;
    }
    let fd = fs_at::openat2(root, &c, libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY, resolve).ok()?;
    let st2 = fs_at::fstat(fd.as_raw_fd()).ok()?;
    if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino) {
        return None;
    }
    let mut v = Vec::new();
    std::fs::File::from(fd).take(limit).read_to_end(&mut v).ok()?;
    Some(v)
}

/// What is at `path` (relative, inside `root`; symlinks resolved inside the tree), if
/// anything.
pub(crate) fn stat_in_root(root: RawFd, path: &str) -> Option<libc::stat> {
    let c = fs_at::cstring(path.as_bytes()).ok()?;
    let fd = fs_at::openat2(root, &c, libc::O_PATH, fs_at::RESOLVE_IN_ROOT | fs_at::RESOLVE_NO_MAGICLINKS).ok()?;
    fs_at::fstat(fd.as_raw_fd()).ok()
}

/// The names in the directory `path` (relative, inside `root`), empty when there is none.
pub(crate) fn list_in_root(root: RawFd, path: &str) -> Vec<String> {
    let Ok(c) = fs_at::cstring(path.as_bytes()) else { return vec![] };
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NONBLOCK;
    let Ok(fd) = fs_at::openat2(root, &c, flags, fs_at::RESOLVE_IN_ROOT | fs_at::RESOLVE_NO_MAGICLINKS) else {
        return vec![];
    };
    fs_at::read_dir_names(fd.as_raw_fd())
        .map(|v| v.into_iter().map(|n| n.to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

/// `uname -m` style name of the ELF machine in `head` (the first 20 bytes of a file).
pub(crate) fn elf_arch(head: &[u8]) -> Option<String> {
    if head.len() < 20 || &head[..4] != b"\x7fELF" {
        return None;
    }
    let class64 = head[4] == 2;
    let le = head[5] == 1;
    let machine = if le { u16::from_le_bytes([head[18], head[19]]) } else { u16::from_be_bytes([head[18], head[19]]) };
    let name = match machine {
        0x03 => "i386",
        0x3e => "x86_64",
        0xb7 => "aarch64",
        0x28 => "arm",
        0xf3 if class64 => "riscv64",
        0xf3 => "riscv32",
        0x15 if le => "ppc64le",
        0x15 => "ppc64",
        0x14 => "ppc",
        0x16 => "s390x",
        0x102 => "loongarch64",
        0x08 if class64 && le => "mips64el",
        0x08 if class64 => "mips64",
        0x08 if le => "mipsel",
        0x08 => "mips",
        other => return Some(format!("elf-machine-{other}")),
    };
    Some(name.to_string())
}

pub(crate) fn arch(root: RawFd) -> Option<String> {
    ["bin/sh", "usr/bin/env", "bin/busybox", "usr/bin/sh", "bin/bash"]
        .iter()
        .find_map(|p| read_in_root(root, p, 20).and_then(|h| elf_arch(&h)))
}

pub(crate) fn cuda_version(root: RawFd) -> Option<String> {
    if let Some(v) = read_in_root(root, "usr/local/cuda/version.json", 1 << 20) {
        if let Ok(j) = serde_json::from_slice::<serde_json::Value>(&v) {
            if let Some(s) = j.pointer("/cuda/version").and_then(|v| v.as_str()) {
                return Some(s.to_string());
            }
        }
    }
    if let Some(v) = read_in_root(root, "usr/local/cuda/version.txt", 1 << 16) {
        // "CUDA Version 10.2.89"
        if let Some(s) = String::from_utf8_lossy(&v).split_whitespace().last() {
            if s.starts_with(|c: char| c.is_ascii_digit()) {
                return Some(s.to_string());
            }
        }
    }
    read_in_root(root, "var/lib/dpkg/status", 64 << 20).and_then(|v| cuda_from_dpkg(&String::from_utf8_lossy(&v)))
}

/// CUDA version from a dpkg status file: `nvidia-cuda-toolkit` (Debian/Ubuntu), else
/// `cuda-cudart-X-Y` (NVIDIA's repository), else `libcudartN` (Debian runtime only).
pub(crate) fn cuda_from_dpkg(status: &str) -> Option<String> {
    let mut best: Option<(u8, String)> = None;
    for stanza in status.split("\n\n") {
        let (mut pkg, mut ver, mut installed) = (None, None, false);
        for line in stanza.lines() {
            if let Some(v) = line.strip_prefix("Package: ") {
                pkg = Some(v.trim());
            } else if let Some(v) = line.strip_prefix("Version: ") {
                ver = Some(v.trim());
            } else if let Some(v) = line.strip_prefix("Status: ") {
                installed = v.trim().ends_with(" installed");
            }
        }
        let (Some(pkg), Some(ver)) = (pkg, ver) else { continue };
        if !installed {
            continue;
        }
        let rank = if pkg == "nvidia-cuda-toolkit" {
            0
        } else if pkg.starts_with("cuda-cudart-") && !pkg.starts_with("cuda-cudart-dev") {
            1
        } else if pkg.starts_with("libcudart") && !pkg.contains("-dev") {
            2
        } else {
            continue;
        };
        if best.as_ref().is_none_or(|(r, _)| rank < *r) {
            best = Some((rank, upstream_version(ver)));
        }
    }
    best.map(|(_, v)| v)
}

/// `1:12.0.140~12.0.1-4build4` -> `12.0.1`; `12.4.127-1` -> `12.4.127`.
fn upstream_version(v: &str) -> String {
    let v = v.split_once(':').map_or(v, |(_, r)| r);
    let v = v.split_once('~').map_or(v, |(_, r)| r);
    v.rsplit_once('-').map_or(v, |(l, _)| l).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elf_machines() {
        let mut h = [0u8; 20];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = 2;
        h[5] = 1;
        h[18] = 0x3e;
        assert_eq!(elf_arch(&h).as_deref(), Some("x86_64"));
        h[18] = 0xb7;
        assert_eq!(elf_arch(&h).as_deref(), Some("aarch64"));
        assert_eq!(elf_arch(b"#!/bin/sh\n echo hi there"), None);
        assert_eq!(elf_arch(&h[..10]), None);
    }

    #[test]
    fn dpkg_versions() {
        let status = "Package: libcudart12\nStatus: install ok installed\nVersion: 12.0.146~12.0.1-4build4\n\n\
                      Package: nvidia-cuda-toolkit\nStatus: deinstall ok config-files\nVersion: 12.0.140~12.0.1-4build4\n\n\
                      Package: bash\nStatus: install ok installed\nVersion: 5.2-1\n";
        assert_eq!(cuda_from_dpkg(status).as_deref(), Some("12.0.1"));
        let nv = "Package: cuda-cudart-12-4\nStatus: install ok installed\nVersion: 12.4.127-1\n";
        assert_eq!(cuda_from_dpkg(nv).as_deref(), Some("12.4.127"));
        assert_eq!(cuda_from_dpkg("Package: bash\nStatus: install ok installed\nVersion: 5\n"), None);
    }
}
