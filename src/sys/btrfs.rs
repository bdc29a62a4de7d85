//! btrfs qgroups as a job's disk quota, where project quotas are not to be had (the
//! way Docker's btrfs driver does `--storage-opt size`): the job's dir is a subvolume of
//! its own, and its level-0 qgroup (same id as the subvolume) gets a limit on the bytes
//! it references and holds exclusively. The job then gets EDQUOT at its limit, and the
//! rest of the filesystem keeps its space. btrfs has no inode limit.
//!
//! Needs quotas enabled on the filesystem (`btrfs quota enable MOUNTPOINT`) and, for the
//! limit, CAP_SYS_ADMIN in the initial user namespace (root mode, not rootless).
//!
//! Removal: an empty subvolume goes with a plain rmdir (Linux >= 4.18), so a job's
//! teardown and `gc` remove it as any dir. Its qgroup stays until the kernel has
//! dropped the subvolume in the background; kernels >= 6.10 then delete the qgroup
//! themselves (seen on 6.18 by the tests). Older kernels leave a "stale" qgroup of 0
//! bytes, which `btrfs qgroup clear-stale MOUNTPOINT` removes.
//!
//! Usage is read from sysfs (`/sys/fs/btrfs/<fsid>/qgroups/0_<id>/`), without privileges.

use super::error::{Error, Result};
use nix::errno::Errno;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// linux/btrfs.h ioctl numbers (type 0x94).
/// `_IOW(0x94, 14, struct btrfs_ioctl_vol_args)` (4096 bytes).
const BTRFS_IOC_SUBVOL_CREATE: libc::c_ulong = 0x5000_940e;
/// `_IOWR(0x94, 18, struct btrfs_ioctl_ino_lookup_args)` (4096 bytes).
const BTRFS_IOC_INO_LOOKUP: libc::c_ulong = 0xd000_9412;
/// `_IOR(0x94, 31, struct btrfs_ioctl_fs_info_args)` (1024 bytes).
const BTRFS_IOC_FS_INFO: libc::c_ulong = 0x8400_941f;
/// `_IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args)` (48 bytes).
const BTRFS_IOC_QGROUP_LIMIT: libc::c_ulong = 0x8030_942b;
const BTRFS_QGROUP_LIMIT_MAX_RFER: u64 = 1;
const BTRFS_QGROUP_LIMIT_MAX_EXCL: u64 = 2;
/// The inode number of every subvolume's root dir.
const BTRFS_FIRST_FREE_OBJECTID: u64 = 256;

/// `struct btrfs_ioctl_vol_args`.
#[repr(C)]
struct VolArgs {
    fd: i64,
    name: [u8; 4088],
}

/// `struct btrfs_ioctl_ino_lookup_args`.
#[repr(C)]
struct InoLookupArgs {
    treeid: u64,
    objectid: u64,
    name: [u8; 4080],
}

/// `struct btrfs_ioctl_qgroup_limit_args` (with its `struct btrfs_qgroup_limit`).
#[repr(C)]
#[derive(Default)]
struct QgroupLimitArgs {
    qgroupid: u64,
    flags: u64,
    max_rfer: u64,
    max_excl: u64,
    rsv_rfer: u64,
    rsv_excl: u64,
}

/// `struct btrfs_ioctl_fs_info_args`: only `fsid` (bytes 16..32) is read.
#[repr(C)]
struct FsInfoArgs {
    bytes: [u8; 1024],
}

/// Whether `dir` is on btrfs (statfs, for anyone).
pub fn is_btrfs(dir: &Path) -> bool {
    nix::sys::statfs::statfs(dir).is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::BTRFS_SUPER_MAGIC)
}

/// Whether jobs can get qgroup limits on the filesystem of `dir`: btrfs, with quotas
/// enabled (`/sys/fs/btrfs/<fsid>/qgroups/enabled` is 1).
pub fn probe(dir: &Path) -> Result<()> {
    if !is_btrfs(dir) {
        return Err(Error::NotBtrfs { dir: dir.into() });
    }
    let enabled = std::fs::read_to_string(sysfs_dir(dir)?.join("qgroups/enabled")).unwrap_or_default();
    if enabled.trim() != "1" {
        return Err(Error::BtrfsQuotaOff { dir: dir.into() });
    }
    Ok(())
}

/// Makes `dir` (its parent must exist, it must not) a subvolume of its own, private
/// (0700), whose qgroup is limited to `bytes`; returns the subvolume's (and qgroup's) id.
/// On an error after the subvolume exists, the caller removes it (rmdir).
pub fn create_limited_subvolume(dir: &Path, bytes: u64) -> Result<u64> {
    let (parent, name) = split(dir)?;
    let pfd = open_dir_at(libc::AT_FDCWD, parent).map_err(|source| Error::BtrfsOpen { dir: parent.into(), source })?;
    subvol_create(&pfd, dir, name)?;
    let limited = limit_new_subvolume(&pfd, dir, name, bytes);
    if limited.is_err() {
        // Still empty: rmdir deletes a subvolume (Linux >= 4.18).
        let _ = nix::unistd::unlinkat(Some(pfd.as_raw_fd()), name, nix::unistd::UnlinkatFlags::RemoveDir);
    }
    limited
}

fn limit_new_subvolume(pfd: &OwnedFd, dir: &Path, name: &[u8], bytes: u64) -> Result<u64> {
    let fd = open_dir_at(pfd.as_raw_fd(), Path::new(std::ffi::OsStr::from_bytes(name)))
        .map_err(|source| Error::BtrfsOpen { dir: dir.into(), source })?;
    nix::sys::stat::fchmod(fd.as_raw_fd(), nix::sys::stat::Mode::from_bits_truncate(0o700))
        .map_err(|source| Error::BtrfsChmod { dir: dir.into(), source })?;
    let id = subvolume_id(&fd).map_err(|source| Error::BtrfsSubvolId { dir: dir.into(), source })?;
    limit(&fd, id, bytes).map_err(|source| Error::BtrfsQgroupLimit { dir: dir.into(), id, source })?;
    Ok(id)
}

/// What qgroup `id` (of subvolume `dir`, or of any dir on its filesystem) has used, and
/// its limit: referenced bytes, plus data reserved for writes not yet committed (the
/// kernel updates the count at each transaction commit).
pub fn usage(dir: &Path, id: u64) -> Result<super::quota::Usage> {
    let q = sysfs_dir(dir)?.join(format!("qgroups/0_{id}"));
    let read = |f: &str| -> Result<u64> {
        let p = q.join(f);
        let text = std::fs::read_to_string(&p).map_err(|source| Error::BtrfsUsage { path: p.clone(), source })?;
        text.trim().parse().map_err(|_| Error::BtrfsUsage { path: p, source: std::io::Error::other("not a number") })
    };
    Ok(super::quota::Usage {
        bytes: read("referenced")? + read("rsv_data").unwrap_or(0),
        inodes: 0,
        bytes_limit: read("max_referenced")?,
        inodes_limit: 0,
    })
}

/// `/sys/fs/btrfs/<fsid>` of the filesystem of `dir` (BTRFS_IOC_FS_INFO: unprivileged).
fn sysfs_dir(dir: &Path) -> Result<PathBuf> {
    let fd = open_dir_at(libc::AT_FDCWD, dir).map_err(|source| Error::BtrfsOpen { dir: dir.into(), source })?;
    let mut info = FsInfoArgs { bytes: [0; 1024] };
    // SAFETY: BTRFS_IOC_FS_INFO reads and writes one struct btrfs_ioctl_fs_info_args
    // (1024 bytes) at the pointer: `info` is a live local of exactly that size, borrowed
    // mutably for the call; the result is checked.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), BTRFS_IOC_FS_INFO, &mut info as *mut FsInfoArgs) };
    if r != 0 {
        return Err(Error::BtrfsFsInfo { dir: dir.into(), source: Errno::last() });
    }
    Ok(Path::new("/sys/fs/btrfs").join(uuid(&info.bytes[16..32])))
}

/// 16 bytes as a UUID's text (8-4-4-4-12 lowercase hex).
fn uuid(b: &[u8]) -> String {
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

fn subvol_create(parent: &OwnedFd, dir: &Path, name: &[u8]) -> Result<()> {
    let mut args = VolArgs { fd: 0, name: [0; 4088] };
    if name.is_empty() || name.len() >= args.name.len() || name.contains(&0) {
        return Err(Error::BtrfsSubvolCreate { dir: dir.into(), source: Errno::ENAMETOOLONG });
    }
    args.name[..name.len()].copy_from_slice(name);
    // SAFETY: BTRFS_IOC_SUBVOL_CREATE reads one struct btrfs_ioctl_vol_args (4096 bytes)
    // at the pointer: `args` is a live local of that layout whose name is NUL-terminated
    // (checked shorter than the buffer above); the result is checked.
    let r = unsafe { libc::ioctl(parent.as_raw_fd(), BTRFS_IOC_SUBVOL_CREATE, &args as *const VolArgs) };
    if r != 0 {
        return Err(Error::BtrfsSubvolCreate { dir: dir.into(), source: Errno::last() });
    }
    Ok(())
}

/// The id of the subvolume `fd` is in (BTRFS_IOC_INO_LOOKUP with treeid 0 and the root
/// dir's objectid: the one lookup the kernel answers without CAP_SYS_ADMIN).
fn subvolume_id(fd: &OwnedFd) -> std::result::Result<u64, Errno> {
    let mut args = InoLookupArgs { treeid: 0, objectid: BTRFS_FIRST_FREE_OBJECTID, name: [0; 4080] };
    // SAFETY: BTRFS_IOC_INO_LOOKUP reads and writes one struct btrfs_ioctl_ino_lookup_args
    // (4096 bytes) at the pointer: `args`, a live local of that layout borrowed mutably
    // for the call; the result is checked.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), BTRFS_IOC_INO_LOOKUP, &mut args as *mut InoLookupArgs) };
    if r != 0 {
        return Err(Errno::last());
    }
    Ok(args.treeid)
}

fn limit(fd: &OwnedFd, id: u64, bytes: u64) -> std::result::Result<(), Errno> {
    let args = QgroupLimitArgs {
        qgroupid: id,
        flags: BTRFS_QGROUP_LIMIT_MAX_RFER | BTRFS_QGROUP_LIMIT_MAX_EXCL,
        max_rfer: bytes,
        max_excl: bytes,
        ..Default::default()
    };
    // SAFETY: BTRFS_IOC_QGROUP_LIMIT reads one struct btrfs_ioctl_qgroup_limit_args
    // (48 bytes) at the pointer: `args`, a live local of that layout; the kernel copies
    // it in and never writes it back (the _IOR direction notwithstanding). Checked.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), BTRFS_IOC_QGROUP_LIMIT, &args as *const QgroupLimitArgs) };
    if r != 0 {
        return Err(Errno::last());
    }
    Ok(())
}

fn split(dir: &Path) -> Result<(&Path, &[u8])> {
    match (dir.parent(), dir.file_name()) {
        (Some(p), Some(n)) => Ok((p, n.as_bytes())),
        _ => Err(Error::BtrfsSubvolCreate { dir: dir.into(), source: Errno::EINVAL }),
    }
}

/// A dir (never a symlink) relative to `at`.
fn open_dir_at(at: libc::c_int, path: &Path) -> std::result::Result<OwnedFd, Errno> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    // SAFETY: openat(2) with a NUL-terminated path that outlives the call; a returned fd
    // is new and owned by nobody else, so OwnedFd takes it.
    let fd = unsafe {
        libc::openat(at, c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
    };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: `fd` was just returned by openat and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_structs_have_the_kernels_layout() {
        assert_eq!(std::mem::size_of::<VolArgs>(), 4096);
        assert_eq!(std::mem::size_of::<InoLookupArgs>(), 4096);
        assert_eq!(std::mem::size_of::<FsInfoArgs>(), 1024);
        assert_eq!(std::mem::size_of::<QgroupLimitArgs>(), 48);
        let ioc =
            |dir: libc::c_ulong, size: libc::c_ulong, nr: libc::c_ulong| (dir << 30) | (size << 16) | (0x94 << 8) | nr;
        assert_eq!(BTRFS_IOC_SUBVOL_CREATE, ioc(1, 4096, 14));
        assert_eq!(BTRFS_IOC_INO_LOOKUP, ioc(3, 4096, 18));
        assert_eq!(BTRFS_IOC_FS_INFO, ioc(2, 1024, 31));
        assert_eq!(BTRFS_IOC_QGROUP_LIMIT, ioc(2, 48, 43));
    }

    #[test]
    fn fsid_as_sysfs_names_it() {
        let b: Vec<u8> = (0..16).collect();
        assert_eq!(uuid(&b), "00010203-0405-0607-0809-0a0b0c0d0e0f");
    }

    #[test]
    fn probe_says_not_btrfs_off_it() {
        let t = tempfile::tempdir().unwrap();
        if is_btrfs(t.path()) {
            return crate::test_skip::skip_part(format!("{} is on btrfs", t.path().display()));
        }
        let e = probe(t.path()).unwrap_err();
        assert!(matches!(e, Error::NotBtrfs { .. }), "{e}");
    }
}
