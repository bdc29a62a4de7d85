//! The isolation of one `rootfs build` step, set up in the forked child between fork and
//! exec: SIGKILL when the builder dies, a mount namespace of its own with private
//! propagation (nothing it mounts reaches the host, and its mounts vanish with its
//! processes, even after SIGKILL), and for a step in the chroot the tree's `/proc`,
//! `/sys`, `/dev` and the .deb cache mounted, then `chroot` + `chdir("/")`. A short
//! straight line of named steps, each with its own [`Error`] variant.
//!
//! Between fork and exec only async-signal-safe calls may run: the builder may have
//! other threads, and one of them may hold the allocator's lock at the fork. So the
//! child allocates nothing: every path is a `CString` made before the fork
//! ([`ChrootPlan::new`]), and the calls are nix's wrappers on `&CStr` (nix passes a
//! `CStr` straight through, where a `Path` would be copied) returning an `Errno`, a
//! number. No raw libc call is left: nix has each one.
//!
//! How a failed step reaches the parent: std's `pre_exec` sends back one `i32`, meant
//! for an errno, through its pipe, and `spawn` returns it as an `io::Error`. The child
//! sends [`Failed::code`]: the step's number and up to two errnos (each below 4096, the
//! kernel's MAX_ERRNO), and [`Error::from_spawn`] reads them back.

use super::Error;
use nix::errno::Errno;
use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::Signal;
use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

/// Runs `cmd` in a mount namespace of its own, killed when this process dies.
pub fn private_mounts(cmd: &mut Command) {
    // SAFETY: the closure runs in the forked child before exec and is async-signal-safe:
    // syscalls through nix on static `CStr`s, no allocation, no lock (see the module doc).
    unsafe { cmd.pre_exec(|| own_mount_namespace().map_err(Failed::into_io)) };
}

/// Runs `cmd` as [`private_mounts`] does, chrooted into the plan's tree with its mounts.
pub fn chroot(cmd: &mut Command, plan: ChrootPlan) {
    // SAFETY: as in `private_mounts`; the plan's paths were allocated before the fork and
    // are only read in the child.
    unsafe { cmd.pre_exec(move || plan.enter().map_err(Failed::into_io)) };
}

/// What a step in the chroot mounts, every path made before the fork.
#[derive(Debug)]
pub struct ChrootPlan {
    root: CString,
    proc_: CString,
    sys: CString,
    dev: CString,
    /// The .deb cache and its mount point `var/cache/apt/archives` in the tree.
    apt_cache: Option<(CString, CString)>,
}

impl ChrootPlan {
    /// The tree's `proc`, `sys` and `dev` (made when missing; a symlink is refused, as
    /// mount(2) would follow it out of the tree), and with `apt_cache` its mount point.
    pub fn new(tree: &Path, apt_cache: Option<&Path>) -> Result<ChrootPlan, Error> {
        Ok(ChrootPlan {
            root: cpath(tree)?,
            proc_: mount_point(tree, "proc")?,
            sys: mount_point(tree, "sys")?,
            dev: mount_point(tree, "dev")?,
            apt_cache: match apt_cache {
                Some(cache) => Some((cpath(cache)?, mount_point(tree, "var/cache/apt/archives")?)),
                None => None,
            },
        })
    }

    /// In the child: the steps, in order.
    fn enter(&self) -> Result<(), Failed> {
        own_mount_namespace()?;
        mount_or_bind(c"proc", &self.proc_, c"/proc").map_err(|(a, b)| Failed::two(Step::MountProc, a, b))?;
        mount_or_bind(c"sysfs", &self.sys, c"/sys").map_err(|(a, b)| Failed::two(Step::MountSys, a, b))?;
        bind(c"/dev", &self.dev, MsFlags::MS_REC).map_err(Failed::at(Step::BindDev))?;
        if let Some((cache, target)) = &self.apt_cache {
            bind(cache, target, MsFlags::empty()).map_err(Failed::at(Step::BindAptCache))?;
        }
        nix::unistd::chroot(self.root.as_c_str()).map_err(Failed::at(Step::Chroot))?;
        nix::unistd::chdir(c"/").map_err(Failed::at(Step::Chdir))
    }
}

/// In the child: killed with the builder, then a mount namespace whose mounts propagate
/// nowhere.
fn own_mount_namespace() -> Result<(), Failed> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(Failed::at(Step::DeathSignal))?;
    unshare(CloneFlags::CLONE_NEWNS).map_err(Failed::at(Step::UnshareMountNamespace))?;
    mount(None::<&CStr>, c"/", None::<&CStr>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&CStr>)
        .map_err(Failed::at(Step::MakeMountsPrivate))
}

/// A new `fstype` at `target`, or a bind of `fallback` when that is not allowed (some
/// container hosts forbid new proc/sysfs instances). Err: both errnos.
fn mount_or_bind(fstype: &CStr, target: &CStr, fallback: &CStr) -> Result<(), (Errno, Errno)> {
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let fresh = match mount(Some(fstype), target, Some(fstype), flags, None::<&CStr>) {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    bind(fallback, target, MsFlags::MS_REC).map_err(|bind| (fresh, bind))
}

fn bind(source: &CStr, target: &CStr, extra: MsFlags) -> nix::Result<()> {
    mount(Some(source), target, None::<&CStr>, MsFlags::MS_BIND | extra, None::<&CStr>)
}

fn cpath(p: &Path) -> Result<CString, Error> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| Error::StepNulInPath(p.to_path_buf()))
}

fn mount_point(tree: &Path, rel: &str) -> Result<CString, Error> {
    let p = tree.join(rel);
    match p.symlink_metadata() {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(Error::StepMountPointNotADirectory(rel.to_string())),
        Err(_) => std::fs::create_dir_all(&p)
            .map_err(|e| Error::StepCreateMountPoint { path: p.clone(), reason: e.to_string() })?,
    }
    cpath(&p)
}

/// The child's steps, numbered for the trip through std's errno pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    DeathSignal = 1,
    UnshareMountNamespace,
    MakeMountsPrivate,
    MountProc,
    MountSys,
    BindDev,
    BindAptCache,
    Chroot,
    Chdir,
}

const STEPS: [Step; 9] = [
    Step::DeathSignal,
    Step::UnshareMountNamespace,
    Step::MakeMountsPrivate,
    Step::MountProc,
    Step::MountSys,
    Step::BindDev,
    Step::BindAptCache,
    Step::Chroot,
    Step::Chdir,
];

/// Errnos are below 4096 (MAX_ERRNO): 12 bits each.
const ERRNO_BITS: u32 = 12;
const ERRNO_MASK: i32 = (1 << ERRNO_BITS) - 1;

/// A step that failed in the child: the step and its errno (and, for a mount with a
/// fallback, the first try's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Failed {
    step: Step,
    first: Errno,
    last: Errno,
}

impl Failed {
    fn at(step: Step) -> impl Fn(Errno) -> Failed {
        move |e| Failed { step, first: Errno::UnknownErrno, last: e }
    }

    fn two(step: Step, first: Errno, last: Errno) -> Failed {
        Failed { step, first, last }
    }

    /// `step << 24 | first << 12 | last`: positive, above every errno.
    fn code(self) -> i32 {
        ((self.step as i32) << (2 * ERRNO_BITS))
            | ((self.first as i32 & ERRNO_MASK) << ERRNO_BITS)
            | (self.last as i32 & ERRNO_MASK)
    }

    fn from_code(code: i32) -> Option<Failed> {
        let step = *STEPS.iter().find(|s| **s as i32 == code >> (2 * ERRNO_BITS))?;
        let errno = |bits: i32| Errno::from_raw(bits & ERRNO_MASK);
        Some(Failed { step, first: errno(code >> ERRNO_BITS), last: errno(code) })
    }

    /// What the child returns to std (no allocation: an OS error is a number).
    fn into_io(self) -> std::io::Error {
        std::io::Error::from_raw_os_error(self.code())
    }
}

impl From<Failed> for Error {
    fn from(f: Failed) -> Error {
        let (fresh, bind, e) = (f.first, f.last, f.last);
        match f.step {
            Step::DeathSignal => Error::StepDeathSignal(e),
            Step::UnshareMountNamespace => Error::StepUnshareMountNs(e),
            Step::MakeMountsPrivate => Error::StepMakeMountsPrivate(e),
            Step::MountProc => Error::StepMountProc { fresh, bind },
            Step::MountSys => Error::StepMountSys { fresh, bind },
            Step::BindDev => Error::StepBindDev(e),
            Step::BindAptCache => Error::StepBindAptCache(e),
            Step::Chroot => Error::StepChroot(e),
            Step::Chdir => Error::StepChdir(e),
        }
    }
}

impl Error {
    /// The step that failed in the child, from the error of `spawn` of a command set up
    /// here; None when the spawn failed otherwise (the fork, or the exec of the program).
    pub fn from_spawn(e: &std::io::Error) -> Option<Error> {
        e.raw_os_error().filter(|c| *c > ERRNO_MASK).and_then(Failed::from_code).map(Error::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_step_survives_the_trip_through_one_errno() {
        for step in STEPS {
            let f = Failed::two(step, Errno::EPERM, Errno::ENOENT);
            let io = f.into_io();
            assert!(io.raw_os_error().unwrap() > 4095, "{step:?} must not read as an errno");
            assert_eq!(Failed::from_code(io.raw_os_error().unwrap()), Some(f), "{step:?}");
        }
        let e = Error::from_spawn(&Failed::at(Step::BindAptCache)(Errno::ENOENT).into_io()).unwrap();
        assert!(matches!(e, Error::StepBindAptCache(Errno::ENOENT)), "{e}");
        let e = Error::from_spawn(&Failed::two(Step::MountProc, Errno::EPERM, Errno::EACCES).into_io()).unwrap();
        assert!(matches!(e, Error::StepMountProc { fresh: Errno::EPERM, bind: Errno::EACCES }), "{e}");
        assert!(e.to_string().contains("a new proc: EPERM") && e.to_string().contains("host's: EACCES"), "{e}");
        // A plain errno (the exec of the program failed) is not a step's.
        assert!(Error::from_spawn(&std::io::Error::from_raw_os_error(libc::ENOENT)).is_none());
        assert!(Error::from_spawn(&std::io::Error::other("x")).is_none());
    }

    #[test]
    fn mount_points_are_real_directories_in_the_tree() {
        let tmp = tempfile::tempdir().unwrap();
        let tree = tmp.path().join("tree");
        std::fs::create_dir_all(tree.join("proc")).unwrap();
        std::os::unix::fs::symlink("/", tree.join("sys")).unwrap();
        assert!(matches!(ChrootPlan::new(&tree, None), Err(Error::StepMountPointNotADirectory(d)) if d == "sys"));
        std::fs::remove_file(tree.join("sys")).unwrap();
        std::fs::write(tree.join("dev"), b"").unwrap();
        assert!(matches!(ChrootPlan::new(&tree, None), Err(Error::StepMountPointNotADirectory(d)) if d == "dev"));
        std::fs::remove_file(tree.join("dev")).unwrap();
        let plan = ChrootPlan::new(&tree, Some(tmp.path())).unwrap();
        assert!(tree.join("sys").is_dir() && tree.join("dev").is_dir() && tree.join("var/cache/apt/archives").is_dir());
        assert_eq!(plan.apt_cache.unwrap().0.as_bytes(), tmp.path().as_os_str().as_bytes());
        assert!(matches!(ChrootPlan::new(Path::new("/a\0b"), None), Err(Error::StepNulInPath(_))));
    }

    /// Through a real fork: the step that fails in the child comes back named. As root
    /// the bind of a missing .deb cache fails (after proc, sys and dev were mounted, in
    /// the child's namespace only); otherwise the unshare does.
    #[test]
    fn the_failing_step_is_named_by_spawn() {
        let tmp = tempfile::tempdir().unwrap();
        let tree = tmp.path().join("tree");
        let plan = ChrootPlan::new(&tree, Some(&tmp.path().join("no-such-cache"))).unwrap();
        let mut cmd = Command::new("/bin/true");
        chroot(&mut cmd, plan);
        let e = cmd.spawn().map(|mut c| c.wait()).expect_err("the cache does not exist");
        let got = Error::from_spawn(&e);
        if nix::unistd::geteuid().is_root() {
            assert!(matches!(got, Some(Error::StepBindAptCache(Errno::ENOENT))), "{e}: {got:?}");
        } else {
            assert!(matches!(got, Some(Error::StepUnshareMountNs(Errno::EPERM))), "{e}: {got:?}");
        }
        assert!(!tree.join("proc/self").exists(), "nothing stays mounted out here");
    }
}
