//! The few privileged syscalls the sandbox needs, behind one narrow trait so the job
//! lifecycle around them is unit-testable without root (see [`Recorder`]).
//!
//! Everything here runs in the single-threaded sandbox helper process, except
//! [`runtime_tmpfs`], which `exec` and `run` call once at start (as root).

pub mod isolate;
pub mod nvml_mig;
pub mod runtime_tmpfs;

use anyhow::{bail, Context, Result};
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
            let s = p.to_str().with_context(|| format!("overlay path {} is not UTF-8", p.display()))?;
            if s.contains([',', ':', '\n']) {
                bail!("overlay path {s} contains ',' or ':'; choose a --home without them");
            }
        }
        if self.lower.is_empty() {
            bail!("overlay needs at least one lower layer");
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

/// `chattr +T` (linux/fs.h; libc does not name it).
const FS_TOPDIR_FL: libc::c_long = 0x0002_0000;

/// Marks `dir` as the top of a directory hierarchy for ext4's Orlov allocator
/// (`chattr +T`): its subdirs, the buckets of the jobs' layer dirs (see
/// [`crate::config::Home::job_layers_dir`]), are spread over the block groups instead of
/// packed next to each other. A job starting while the previous one's tens of
/// thousands of files are deleted then allocates its inodes in another group, instead
/// of waiting for the same inode bitmap and table blocks to be written back (seen in the
/// refill after big jobs). Best effort: other filesystems ignore or refuse it.
pub fn spread_subdirs(dir: &Path) {
    use std::os::fd::AsRawFd;
    let Ok(f) = std::fs::File::open(dir) else { return };
    let mut flags: libc::c_long = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one long into `flags`, which lives for the call.
    if unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) } != 0 || flags & FS_TOPDIR_FL != 0 {
        return;
    }
    flags |= FS_TOPDIR_FL;
    // SAFETY: FS_IOC_SETFLAGS reads one long from `flags`, which lives for the call.
    let _ = unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_SETFLAGS, &flags) };
}

pub trait Sys {
    /// Gives the calling process its own mount namespace with private propagation, so the
    /// job's mounts exist only there and vanish with it (even on SIGKILL).
    fn private_mount_namespace(&self) -> Result<()>;
    fn mount_overlay(&self, overlay: &Overlay) -> Result<()>;
    /// Lazy unmount (MNT_DETACH), of the mounts below `target` too.
    fn unmount(&self, target: &Path) -> Result<()>;
    /// A plain bind mount of `source` on `target` (a `/proc/self/fd/N` of a target
    /// resolved inside a tree), in this process's private mount namespace.
    fn bind_mount(&self, source: &Path, target: &Path) -> Result<()>;
    /// For a job without a cgroup: covers the host's cgroup tree in this (private) mount
    /// namespace with a view that libcontainer's cgroup manager cannot change anything in.
    fn hide_cgroupfs(&self) -> Result<()>;
}

/// The real thing.
pub struct Real;

impl Sys for Real {
    fn private_mount_namespace(&self) -> Result<()> {
        use nix::mount::{mount, MsFlags};
        use nix::sched::{unshare, CloneFlags};
        unshare(CloneFlags::CLONE_NEWNS)
            .context("cannot create a mount namespace (unshare CLONE_NEWNS): run as root or enable user namespaces")?;
        mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
            .context("cannot make / private in the helper's mount namespace")?;
        Ok(())
    }

    fn mount_overlay(&self, overlay: &Overlay) -> Result<()> {
        use nix::mount::{mount, MsFlags};
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
        let mount_with =
            |d: &str| mount(Some("azp-sandbox"), &overlay.target, Some("overlay"), MsFlags::empty(), Some(d));
        match mount_with(&volatile) {
            Err(nix::errno::Errno::EINVAL) => mount_with(&data),
            r => r,
        }
        .with_context(|| format!("cannot mount the job's overlay on {} ({data})", overlay.target.display()))?;
        Ok(())
    }

    fn unmount(&self, target: &Path) -> Result<()> {
        nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH)
            .with_context(|| format!("cannot unmount {}", target.display()))
    }

    fn bind_mount(&self, source: &Path, target: &Path) -> Result<()> {
        use nix::mount::{mount, MsFlags};
        mount(Some(source), target, None::<&str>, MsFlags::MS_BIND, None::<&str>)
            .with_context(|| format!("cannot bind-mount {} on {}", source.display(), target.display()))
    }

    fn hide_cgroupfs(&self) -> Result<()> {
        use nix::mount::{mount, MsFlags};
        use nix::sched::{unshare, CloneFlags};
        // A cgroup namespace of our own (rooted at the job's cgroup, which the helper has
        // joined) and a cgroup2 view of it over /sys/fs/cgroup: the host's v1 hierarchies
        // are covered, so libcontainer uses its v2 manager on the view. As root it puts the
        // job's init into a leaf of the job's cgroup; in a user namespace it skips the
        // dirs it may not create.
        unshare(CloneFlags::CLONE_NEWCGROUP).context("cannot create a cgroup namespace for the helper")?;
        mount(
            Some("cgroup2"),
            "/sys/fs/cgroup",
            Some("cgroup2"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            None::<&str>,
        )
        .context("cannot mount a private cgroup2 view on /sys/fs/cgroup in the helper")
    }
}

/// Records calls instead of making them; for unit tests of the logic around mounts.
#[derive(Default)]
pub struct Recorder {
    pub calls: std::cell::RefCell<Vec<String>>,
    /// When set, `mount_overlay` fails (to test clean-up on failure).
    pub fail_overlay: bool,
}

impl Sys for Recorder {
    fn private_mount_namespace(&self) -> Result<()> {
        self.calls.borrow_mut().push("private_mount_namespace".into());
        Ok(())
    }
    fn mount_overlay(&self, overlay: &Overlay) -> Result<()> {
        self.calls.borrow_mut().push(format!("mount_overlay {}", overlay.target.display()));
        if self.fail_overlay {
            bail!("injected overlay failure");
        }
        overlay.options().map(|_| ())
    }
    fn unmount(&self, target: &Path) -> Result<()> {
        self.calls.borrow_mut().push(format!("unmount {}", target.display()));
        Ok(())
    }
    fn bind_mount(&self, source: &Path, target: &Path) -> Result<()> {
        self.calls.borrow_mut().push(format!("bind_mount {} {}", source.display(), target.display()));
        Ok(())
    }
    fn hide_cgroupfs(&self) -> Result<()> {
        self.calls.borrow_mut().push("hide_cgroupfs".into());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_dirs_are_spread_on_ext4() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        spread_subdirs(dir.path());
        let fs = nix::sys::statfs::statfs(dir.path()).unwrap();
        if fs.filesystem_type() != nix::sys::statfs::EXT4_SUPER_MAGIC {
            return crate::test_skip::skip(format!("{} is not on ext4", dir.path().display()));
        }
        let f = std::fs::File::open(dir.path()).unwrap();
        let mut flags: libc::c_long = 0;
        // SAFETY: FS_IOC_GETFLAGS writes one long into `flags`.
        assert_eq!(unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) }, 0);
        assert_ne!(flags & FS_TOPDIR_FL, 0, "FS_TOPDIR_FL (chattr +T) is set");
        spread_subdirs(dir.path()); // again: a no-op
    }

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
}
