//! Mounts: the job's overlay, binds, unmounts, and the mount table read back.

use super::error::{Error, Result};
use nix::mount::{mount, MsFlags};
use std::path::{Path, PathBuf};

/// An overlay mount: read-only lower layers (first = topmost), a per-job upper and work dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlay {
    pub lower: Vec<PathBuf>,
    pub upper: PathBuf,
    pub work: PathBuf,
    pub target: PathBuf,
    /// Inside a user namespace overlayfs must keep its metadata in `user.` xattrs.
    pub userxattr: bool,
}

impl Overlay {
    /// The `-o` data string. overlayfs splits options on ',' and lower dirs on ':', and
    /// cannot escape ','; we refuse such paths instead of producing a wrong mount.
    pub fn options(&self) -> Result<String> {
        let mut all: Vec<&Path> = self.lower.iter().map(PathBuf::as_path).collect();
        all.push(&self.upper);
        all.push(&self.work);
        for p in &all {
            let s = p.to_str().ok_or_else(|| Error::OverlayPathNotUtf8 { path: p.to_path_buf() })?;
            if s.contains([',', ':', '\n']) {
                return Err(Error::OverlayPathSeparator { path: p.to_path_buf() });
            }
        }
        if self.lower.is_empty() {
            return Err(Error::OverlayNoLower);
        }
        let lower: Vec<&str> = self.lower.iter().filter_map(|p| p.to_str()).collect();
        Ok(format!(
            "lowerdir={},upperdir={},workdir={}{}",
            lower.join(":"),
            self.upper.display(),
            self.work.display(),
            if self.userxattr { ",userxattr" } else { "" }
        ))
    }
}

pub fn mount_overlay(overlay: &Overlay) -> Result<()> {
    let data = overlay.options()?;
    // "volatile" (Linux 5.10+): the upper layer is thrown away with the job, so
    // overlayfs may skip every sync to it: the job's fsync() calls and the sync of
    // the upper filesystem at unmount, which made a job's dirty gigabytes delay the
    // next one. Older kernels refuse the option: mount without it.
    // An earlier phase of the same sandbox mounted this upper layer volatile, and
    // overlayfs refuses it again until that marker is gone. The marker is for upper
    // layers that may have lost writes in a crash; ours passes from one phase to the
    // next of a live job (a crash ends the job, and gc removes the layer).
    let _ = std::fs::remove_dir_all(overlay.work.join("work/incompat/volatile"));
    let volatile = format!("{data},volatile");
    let mount_with = |d: &str| mount(Some("azp-sandbox"), &overlay.target, Some("overlay"), MsFlags::empty(), Some(d));
    match mount_with(&volatile) {
        Err(nix::errno::Errno::EINVAL) => mount_with(&data),
        r => r,
    }
    .map_err(|source| Error::MountOverlay { target: overlay.target.clone(), options: data, source })
}

/// Where in a job's tree a mount goes: `fd` is the target resolved inside the tree (an
/// `O_PATH` fd, see `sandbox::inroot`), mounted on through `/proc/self/fd/N`; `dst` is
/// its path in the job, for messages.
#[derive(Clone, Copy)]
pub struct InTree<'a> {
    pub fd: std::os::fd::BorrowedFd<'a>,
    pub dst: &'a Path,
}

impl InTree<'_> {
    fn proc_path(&self) -> PathBuf {
        use std::os::fd::AsRawFd;
        super::fs_at::proc_fd(self.fd.as_raw_fd())
    }
}

/// A new filesystem of `fstype` (tmpfs, devpts, mqueue; `source` names it in the mount
/// table) with `flags` and `data` (e.g. a tmpfs's mode, size and owner) on a target in a
/// job's tree.
pub fn mount_fs_in_tree(at: InTree, fstype: &'static str, source: &str, flags: MsFlags, data: &str) -> Result<()> {
    mount(Some(source), &at.proc_path(), Some(fstype), flags, Some(data)).map_err(|source| Error::MountFsInTree {
        fstype,
        dst: at.dst.to_path_buf(),
        options: data.into(),
        source,
    })
}

/// Gives the root dir of the mount whose root `at` is to `owner` (the job's root): what a
/// tmpfs gets with its uid=/gid= options, for filesystems without them (devpts, mqueue),
/// whose root is whoever mounted them, the helper, as when the job had mounted them.
pub fn chown_in_tree(at: InTree, owner: (u32, u32)) -> Result<()> {
    // Through the fd's magic link, followed: the mount's root, not the link.
    std::os::unix::fs::chown(at.proc_path(), Some(owner.0), Some(owner.1)).map_err(|e| Error::ChownInTree {
        dst: at.dst.to_path_buf(),
        uid: owner.0,
        gid: owner.1,
        source: nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
    })
}

/// A bind mount of the host's `from` on a target in a job's tree; its flags come with
/// [`restrict_in_tree`].
pub fn bind_in_tree(from: &Path, at: InTree) -> Result<()> {
    mount(Some(from), &at.proc_path(), None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .map_err(|source| Error::BindInTree { from: from.to_path_buf(), dst: at.dst.to_path_buf(), source })
}

/// Remounts the bind mount at `at` (its fd must be the mount's root: resolved after
/// [`bind_in_tree`]) with `flags` added to those it has. Keeping the ones it has matters:
/// the kernel refuses to clear a flag that a less privileged namespace has locked.
pub fn restrict_in_tree(at: InTree, flags: MsFlags) -> Result<()> {
    use nix::sys::statvfs::fstatvfs;
    let err = |source| Error::RestrictInTree { dst: at.dst.to_path_buf(), source };
    let kept = flags_to_keep(fstatvfs(at.fd).map_err(err)?.flags());
    let all = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | kept | flags;
    mount(None::<&str>, &at.proc_path(), None::<&str>, all, None::<&str>).map_err(err)
}

/// The mount flags a bind remount must repeat, from what statvfs says the mount has.
/// Neither noatime nor relatime means strictatime: without it the remount would default
/// to relatime, refused where the atime flags are locked.
fn flags_to_keep(has: nix::sys::statvfs::FsFlags) -> MsFlags {
    use nix::sys::statvfs::FsFlags;
    let kept = [
        (FsFlags::ST_RDONLY, MsFlags::MS_RDONLY),
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ]
    .into_iter()
    .filter(|(st, _)| has.contains(*st))
    .fold(MsFlags::empty(), |all, (_, ms)| all | ms);
    if has.intersects(FsFlags::ST_NOATIME | FsFlags::ST_RELATIME) {
        kept
    } else {
        kept | MsFlags::MS_STRICTATIME
    }
}

/// Lazy unmount (MNT_DETACH), of the mounts below `target` too.
/// Attaches a detached mount (`fd`: from open_tree(2) or fsmount(2)) at `target` in the
/// caller's mount namespace; the errno as such, for the caller's own error variant.
pub(super) fn attach_detached(
    fd: std::os::fd::BorrowedFd,
    target: &Path,
) -> std::result::Result<(), nix::errno::Errno> {
    use std::os::fd::AsRawFd;
    // From <linux/mount.h>: `fd` itself is what moves ("" as its path).
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x0000_0004;
    let c_target =
        std::ffi::CString::new(target.as_os_str().as_encoded_bytes()).map_err(|_| nix::errno::Errno::EINVAL)?;
    // SAFETY: move_mount(2) reads the two NUL-terminated paths during the call only; `fd`
    // is borrowed, open for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            c_target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if r < 0 {
        return Err(nix::errno::Errno::last());
    }
    Ok(())
}

pub fn unmount(target: &Path) -> Result<()> {
    nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH)
        .map_err(|source| Error::Unmount { target: target.to_path_buf(), source })
}

/// A small tmpfs (nosuid, nodev, noexec, mode 0711) at `dir`.
pub fn mount_tmpfs(dir: &Path, size: &str) -> Result<()> {
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let data = format!("mode=0711,size={size}");
    mount(Some("azp-sandbox-run"), dir, Some("tmpfs"), flags, Some(data.as_str()))
        .map_err(|source| Error::MountTmpfs { dir: dir.to_path_buf(), source })
}

/// Mount points at or below `dir` in this process's mount namespace, deepest first.
pub fn mounts_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let info = super::procfile::read("/proc/self/mountinfo").map_err(Error::ReadMountinfo)?;
    Ok(mount_points_under(&info, dir))
}

fn mount_points_under(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mountinfo)
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found
}

fn unescape_mountinfo(s: &str) -> String {
    s.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ov(lower: &str) -> Overlay {
        Overlay {
            lower: vec![PathBuf::from(lower), PathBuf::from("/store/base")],
            upper: "/h/jobs/j1/upper".into(),
            work: "/h/jobs/j1/work".into(),
            target: "/h/jobs/j1/merged".into(),
            userxattr: false,
        }
    }

    #[test]
    fn overlay_options() {
        assert_eq!(
            ov("/cache/agent").options().unwrap(),
            "lowerdir=/cache/agent:/store/base,upperdir=/h/jobs/j1/upper,workdir=/h/jobs/j1/work"
        );
        let rootless = Overlay { userxattr: true, ..ov("/c") };
        assert!(rootless.options().unwrap().ends_with(",workdir=/h/jobs/j1/work,userxattr"));
        assert!(ov("/a,b").options().unwrap_err().to_string().contains("contains ','"));
        assert!(ov("/a:b").options().is_err());
    }

    #[test]
    fn a_remount_keeps_the_flags_a_mount_has_and_its_atime_kind() {
        use nix::sys::statvfs::FsFlags;
        let host = FsFlags::ST_NOSUID | FsFlags::ST_NODEV | FsFlags::ST_RELATIME;
        assert_eq!(flags_to_keep(host), MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_RELATIME);
        assert_eq!(flags_to_keep(FsFlags::ST_RDONLY | FsFlags::ST_NOATIME), MsFlags::MS_RDONLY | MsFlags::MS_NOATIME);
        // strictatime (no atime flag at all), with nodiratime: said again, not relatime.
        assert_eq!(flags_to_keep(FsFlags::ST_NODIRATIME), MsFlags::MS_NODIRATIME | MsFlags::MS_STRICTATIME);
    }

    #[test]
    fn mountinfo_unescape() {
        assert_eq!(unescape_mountinfo("/a\\040b"), "/a b");
    }

    #[test]
    fn mounts_below_a_dir_deepest_first() {
        let info = "36 35 98:0 / /h/jobs/j1/merged rw - overlay x rw\n\
                    37 36 98:0 / /h/jobs/j1/merged/dev\\040x rw - tmpfs x rw\n\
                    38 35 98:0 / /h/jobs/j10 rw - tmpfs x rw\n";
        let found = mount_points_under(info, Path::new("/h/jobs/j1"));
        assert_eq!(found, [PathBuf::from("/h/jobs/j1/merged/dev x"), PathBuf::from("/h/jobs/j1/merged")]);
    }
}
