//! Project quotas on a job's layer dir (ext4 with the `project` and `quota` features, or
//! XFS, mounted with `prjquota`): the dir that holds the overlay's upper and work dirs
//! gets a project id of its own with PROJINHERIT (everything made below it inherits the
//! id), and the filesystem a limit in bytes and inodes for that id. The job then gets
//! EDQUOT (ext4) or ENOSPC (XFS) at its limit, and the host and the other jobs keep
//! their space.
//!
//! Both upper and work are below the one dir: overlayfs renames files from work into
//! upper, and a rename into a PROJINHERIT dir of another project id is EXDEV.
//!
//! Project ids come from [`PROJECT_IDS`], a range no site assigns by hand (their
//! /etc/projid ids are small), and are taken under a host-wide lock: an id is free when
//! nothing is charged to it (a job's layer dir always is, from its claim to its
//! removal), so an id left with a limit by a crash is taken again, never two jobs'.
//!
//! The quotactl calls go through quotactl_fd(2) (Linux 5.14), with an fd of the dir; on
//! older kernels through quotactl(2) and the filesystem's device, from mountinfo.

use super::error::{errno_of, Error, Result};
use nix::errno::Errno;
use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The project ids jobs get: 2052000000 to 2052999999. Sites that use project quotas
/// for other dirs must not assign these.
pub const PROJECT_IDS: std::ops::RangeInclusive<u32> = 2_052_000_000..=2_052_999_999;

/// The limit one job's layer dir gets, and the host-wide lock under which ids are taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskQuota {
    pub bytes: u64,
    pub inodes: Option<u64>,
    pub lock: PathBuf,
    /// How the filesystem enforces it.
    pub mechanism: Mechanism,
}

/// How a filesystem limits a job's dir: a project id (ext4, XFS) or a btrfs subvolume
/// with a qgroup limit (see [`super::btrfs`]; no inode limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mechanism {
    #[default]
    Project,
    BtrfsQgroup,
}

impl Mechanism {
    /// For logs and `status`.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Project => "project quota",
            Mechanism::BtrfsQgroup => "btrfs qgroup",
        }
    }
}

/// What a project has used, and its limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub bytes: u64,
    pub inodes: u64,
    pub bytes_limit: u64,
    pub inodes_limit: u64,
}

impl Usage {
    /// The job reached its limit (within a filesystem block of it).
    pub fn full(&self) -> bool {
        (self.bytes_limit > 0 && self.bytes + 4096 >= self.bytes_limit)
            || (self.inodes_limit > 0 && self.inodes >= self.inodes_limit)
    }
}

/// PRJQUOTA of linux/quota.h (libc names only USRQUOTA's and GRPQUOTA's commands).
const PRJQUOTA: libc::c_int = 2;
/// linux/fs.h: `_IOR('X', 31, struct fsxattr)` and `_IOW('X', 32, struct fsxattr)`.
const FS_IOC_FSGETXATTR: libc::c_ulong = 0x801c_581f;
const FS_IOC_FSSETXATTR: libc::c_ulong = 0x401c_5820;
const FS_XFLAG_PROJINHERIT: u32 = 0x0000_0200;
/// The generic quota interface counts space in blocks of 1 KiB (QIF_DQBLKSIZE).
const QUOTA_BLOCK: u64 = 1024;

/// `struct fsxattr` of linux/fs.h (28 bytes).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct FsXattr {
    xflags: u32,
    extsize: u32,
    nextents: u32,
    projid: u32,
    cowextsize: u32,
    pad: [u8; 8],
}

/// Whether project quotas are on for the filesystem of `dir` (Q_GETINFO): ESRCH when
/// they are off, ENOSYS without quota support in the kernel.
pub fn probe(dir: &Path) -> Result<()> {
    let fd = open_dir(dir).map_err(|e| Error::QuotaProbe { dir: dir.into(), source: errno_of(&e) })?;
    let mut info: libc::dqblk = zeroed_dqblk();
    // Q_GETINFO fills a struct if_dqinfo (24 bytes), smaller than the dqblk given.
    quotactl(&fd, dir, libc::Q_GETINFO, 0, &mut info).map_err(|source| Error::QuotaProbe { dir: dir.into(), source })
}

/// Gives `dir` (a job's empty layer dir) a free project id with PROJINHERIT and sets
/// that id's limits; returns the id. Holds `quota.lock` meanwhile.
pub fn claim(dir: &Path, quota: &DiskQuota) -> Result<u32> {
    let fd = open_dir(dir).map_err(|source| Error::ProjectOpen { dir: dir.into(), source })?;
    let _lock = lock(&quota.lock)?;
    let id = free_id(&fd, dir)?;
    let mut limits = zeroed_dqblk();
    limits.dqb_bhardlimit = quota.bytes.div_ceil(QUOTA_BLOCK);
    limits.dqb_ihardlimit = quota.inodes.unwrap_or(0);
    limits.dqb_valid = libc::QIF_LIMITS;
    quotactl(&fd, dir, libc::Q_SETQUOTA, id, &mut limits).map_err(|source| Error::QuotaSet {
        dir: dir.into(),
        id,
        source,
    })?;
    set_project(&fd, dir, id)?;
    Ok(id)
}

/// Clears the limits of project `id` if `dir` still has that id (it is then still this
/// job's: nobody takes an id while the dir holds usage). A missing dir: nothing to do.
pub fn release(dir: &Path, id: u32) -> Result<()> {
    let fd = match open_dir(dir) {
        Ok(fd) => fd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(Error::ProjectOpen { dir: dir.into(), source }),
    };
    if get_xattr(&fd).map_err(|source| Error::ProjectGet { dir: dir.into(), source })?.projid != id {
        return Ok(());
    }
    let mut none = zeroed_dqblk();
    none.dqb_valid = libc::QIF_LIMITS;
    quotactl(&fd, dir, libc::Q_SETQUOTA, id, &mut none).map_err(|source| Error::QuotaSet {
        dir: dir.into(),
        id,
        source,
    })
}

/// Usage and limits of project `id` on the filesystem of `dir`.
pub fn usage(dir: &Path, id: u32) -> Result<Usage> {
    let fd = open_dir(dir).map_err(|source| Error::ProjectOpen { dir: dir.into(), source })?;
    let mut q = zeroed_dqblk();
    quotactl(&fd, dir, libc::Q_GETQUOTA, id, &mut q).map_err(|source| Error::QuotaGet {
        dir: dir.into(),
        id,
        source,
    })?;
    Ok(Usage {
        bytes: q.dqb_curspace,
        inodes: q.dqb_curinodes,
        bytes_limit: q.dqb_bhardlimit * QUOTA_BLOCK,
        inodes_limit: q.dqb_ihardlimit,
    })
}

/// The first id of [`PROJECT_IDS`] that nothing is charged to (XFS: ENOENT, no record).
/// Ids are taken from the start of the range, so only as many exist as jobs ran at once.
fn free_id(fd: &OwnedFd, dir: &Path) -> Result<u32> {
    for id in PROJECT_IDS {
        let mut q = zeroed_dqblk();
        match quotactl(fd, dir, libc::Q_GETQUOTA, id, &mut q) {
            Err(Errno::ENOENT) => return Ok(id),
            Ok(()) if q.dqb_curspace == 0 && q.dqb_curinodes == 0 => return Ok(id),
            Ok(()) => continue,
            Err(source) => return Err(Error::QuotaGet { dir: dir.into(), id, source }),
        }
    }
    Err(Error::ProjectIdsExhausted { dir: dir.into() })
}

/// The project id and PROJINHERIT on `dir`: the dir itself is charged to the project
/// from here on, and what is made below it inherits the id.
fn set_project(fd: &OwnedFd, dir: &Path, id: u32) -> Result<()> {
    let mut x = get_xattr(fd).map_err(|source| Error::ProjectGet { dir: dir.into(), source })?;
    x.projid = id;
    x.xflags |= FS_XFLAG_PROJINHERIT;
    // SAFETY: FS_IOC_FSSETXATTR reads one struct fsxattr from `x`, a live local of that
    // exact layout (28 bytes, repr(C)) borrowed for the call; the result is checked.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), FS_IOC_FSSETXATTR, &x as *const FsXattr) };
    if r != 0 {
        return Err(Error::ProjectSet { dir: dir.into(), id, source: Errno::last() });
    }
    Ok(())
}

fn get_xattr(fd: &OwnedFd) -> std::result::Result<FsXattr, Errno> {
    let mut x = FsXattr::default();
    // SAFETY: FS_IOC_FSGETXATTR writes one struct fsxattr into `x`, a live local of that
    // exact layout borrowed mutably for the call; the result is checked.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), FS_IOC_FSGETXATTR, &mut x as *mut FsXattr) };
    if r != 0 {
        return Err(Errno::last());
    }
    Ok(x)
}

/// quotactl_fd(2) for PRJQUOTA; on a kernel without it (ENOSYS, before 5.14),
/// quotactl(2) on the device the filesystem of `dir` is mounted from.
fn quotactl(
    fd: &OwnedFd,
    dir: &Path,
    cmd: libc::c_int,
    id: u32,
    data: &mut libc::dqblk,
) -> std::result::Result<(), Errno> {
    let cmd = libc::QCMD(cmd, PRJQUOTA);
    // SAFETY: quotactl_fd reads or writes at most one struct dqblk (or the smaller
    // if_dqinfo) at `data`, a live, exclusively borrowed dqblk; `fd` is an open fd.
    let r = unsafe {
        libc::syscall(libc::SYS_quotactl_fd, fd.as_raw_fd(), cmd, id as libc::c_int, data as *mut libc::dqblk)
    };
    if r == 0 {
        return Ok(());
    }
    match Errno::last() {
        Errno::ENOSYS => {}
        e => return Err(e),
    }
    let device = device_of(dir).ok_or(Errno::ENODEV)?;
    // SAFETY: as above; `device` is a NUL-terminated path that outlives the call.
    let r = unsafe {
        libc::quotactl(cmd, device.as_ptr(), id as libc::c_int, data as *mut libc::dqblk as *mut libc::c_char)
    };
    if r == 0 {
        Ok(())
    } else {
        Err(Errno::last())
    }
}

/// The device the filesystem of `dir` is mounted from (mountinfo's source of the mount
/// with its device number).
fn device_of(dir: &Path) -> Option<CString> {
    let dev = std::fs::metadata(dir).ok()?.dev();
    let want = format!("{}:{}", libc::major(dev), libc::minor(dev));
    let info = super::procfile::read("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        (pre.split(' ').nth(2)? == want).then(|| CString::new(post.split(' ').nth(1)?).ok()).flatten()
    })
}

fn open_dir(dir: &Path) -> std::io::Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)?;
    Ok(f.into())
}

fn lock(path: &Path) -> Result<nix::fcntl::Flock<std::fs::File>> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::Lock { path: path.into(), source: errno_of(&e) })?;
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, source)| Error::Lock { path: path.into(), source })
}

fn zeroed_dqblk() -> libc::dqblk {
    libc::dqblk {
        dqb_bhardlimit: 0,
        dqb_bsoftlimit: 0,
        dqb_curspace: 0,
        dqb_ihardlimit: 0,
        dqb_isoftlimit: 0,
        dqb_curinodes: 0,
        dqb_btime: 0,
        dqb_itime: 0,
        dqb_valid: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_structs_have_the_kernels_layout() {
        assert_eq!(std::mem::size_of::<FsXattr>(), 28, "struct fsxattr");
        assert_eq!(std::mem::size_of::<libc::dqblk>(), 72, "struct if_dqblk");
        // _IOR('X', 31, 28 bytes) and _IOW('X', 32, 28 bytes).
        let ioc =
            |dir: libc::c_ulong, nr: libc::c_ulong| (dir << 30) | (28 << 16) | ((b'X' as libc::c_ulong) << 8) | nr;
        assert_eq!(FS_IOC_FSGETXATTR, ioc(2, 31));
        assert_eq!(FS_IOC_FSSETXATTR, ioc(1, 32));
        assert_eq!(libc::QCMD(libc::Q_SETQUOTA, PRJQUOTA), 0x8000_0802_u32 as i32);
    }

    #[test]
    fn full_within_a_block_or_at_the_inode_limit() {
        let u = |bytes, inodes| Usage { bytes, inodes, bytes_limit: 1 << 20, inodes_limit: 100 };
        assert!(!u(0, 1).full());
        assert!(u((1 << 20) - 1024, 1).full());
        assert!(u(0, 100).full());
        assert!(!Usage { bytes: 5, inodes: 5, bytes_limit: 0, inodes_limit: 0 }.full(), "no limit: never full");
    }

    #[test]
    fn probe_says_why_there_is_no_quota() {
        // The test machines' filesystems have no project quotas: the probe fails with the
        // step's own error (ESRCH: off; ENOSYS: no kernel support; ENOTTY/EOPNOTSUPP).
        let t = tempfile::tempdir().unwrap();
        match probe(t.path()) {
            Ok(()) => crate::test_skip::skip_part(format!("{} has project quotas", t.path().display())),
            Err(e) => {
                assert!(matches!(e, Error::QuotaProbe { .. }), "{e}");
                assert!(e.to_string().contains(&t.path().display().to_string()), "{e}");
            }
        }
        let e = probe(&t.path().join("missing")).unwrap_err();
        assert_eq!(e.errno(), Some(Errno::ENOENT));
    }
}
