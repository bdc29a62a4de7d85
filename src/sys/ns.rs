//! Namespaces: the helper's private mount and cgroup namespaces, and the rootless
//! user namespace.

use super::error::{Error, Result};
use super::process::{self, Forked};
use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{read, write, Pid};
use std::os::fd::AsRawFd;
use std::path::PathBuf;

/// Gives the calling process its own mount namespace with private propagation, so its
/// mounts exist only there and vanish with it (even on SIGKILL).
pub fn private_mount_namespace() -> Result<()> {
    unshare(CloneFlags::CLONE_NEWNS).map_err(Error::UnshareMountNs)?;
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .map_err(Error::MakeRootPrivate)
}

/// Gives the calling process the job's IPC namespace (System V IPC, POSIX message
/// queues), for the container to inherit, so that the helper can mount its `/dev/mqueue`
/// in the job's tree (a plain mount; in the spec it cost the job's init ~50 system calls
/// of libcontainer's checks).
pub fn own_ipc_namespace() -> Result<()> {
    unshare(CloneFlags::CLONE_NEWIPC).map_err(Error::UnshareIpcNs)
}

/// A cgroup namespace of our own (rooted at the cgroup the caller has joined) and a
/// cgroup2 view of it over /sys/fs/cgroup, in the caller's private mount namespace.
///
/// On a cgroup v2 host /sys/fs/cgroup is the cgroup2 mount itself, and the kernel
/// refuses to mount a filesystem on the root of a mount of the same superblock (EBUSY):
/// there a small tmpfs covers it first (found in a v2 guest; the test VM is hybrid).
pub fn private_cgroup_view() -> Result<()> {
    unshare(CloneFlags::CLONE_NEWCGROUP).map_err(Error::UnshareCgroupNs)?;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let view = || mount(Some("cgroup2"), "/sys/fs/cgroup", Some("cgroup2"), flags, None::<&str>);
    match view() {
        Err(nix::errno::Errno::EBUSY) => {
            mount(Some("tmpfs"), "/sys/fs/cgroup", Some("tmpfs"), flags, Some("mode=755,size=4k"))
                .map_err(Error::MountCgroupView)?;
            view()
        }
        r => r,
    }
    .map_err(Error::MountCgroupView)
}

/// How to map the ids of a new user namespace: the setuid tools and their arguments
/// after the pid (`0 UID 1 1 START COUNT`).
pub struct IdMapTools {
    pub newuidmap: PathBuf,
    pub newgidmap: PathBuf,
    pub uid_args: Vec<String>,
    pub gid_args: Vec<String>,
}

/// Moves the calling (single-threaded) process into a new user namespace mapped by
/// `tools`, as uid/gid 0 there.
///
/// A process cannot write its own uid/gid map beyond its own id; `newuidmap` and
/// `newgidmap` (setuid root) can, but only for a process in a namespace they are not in.
/// So: fork a child that waits, unshare the user namespace here, let the child run the
/// two tools on our pid, then become uid/gid 0 inside.
pub fn enter_user_namespace(tools: &IdMapTools) -> Result<()> {
    let (go_read, go_write) = nix::unistd::pipe().map_err(Error::Pipe)?;
    let parent = Pid::this();
    // Step 1: the mapper child, forked while this process is still single-threaded
    // (unshare(CLONE_NEWUSER) fails in a threaded process anyway).
    let child = match process::fork("the uid mapper")? {
        Forked::Child => {
            drop(go_write);
            let mut b = [0u8; 1];
            let code = match read(go_read.as_raw_fd(), &mut b) {
                Ok(1) => {
                    let ok = run_map(&tools.newuidmap, parent, &tools.uid_args)
                        && run_map(&tools.newgidmap, parent, &tools.gid_args);
                    if ok {
                        0
                    } else {
                        1
                    }
                }
                _ => 2,
            };
            process::exit_now(code);
        }
        Forked::Parent(child) => child,
    };
    drop(go_read);
    // Step 2: the namespace.
    let unshared = unshare(CloneFlags::CLONE_NEWUSER);
    // Step 3: let the child map us (or tell it to give up: EOF).
    if unshared.is_ok() {
        let _ = write(&go_write, b"1");
    }
    drop(go_write);
    let status = waitpid(child, None).map_err(|source| Error::Wait { what: "the uid mapper", source })?;
    unshared.map_err(Error::UnshareUserNs)?;
    if !matches!(status, WaitStatus::Exited(_, 0)) {
        return Err(Error::MapIds { uid_args: tools.uid_args.clone(), gid_args: tools.gid_args.clone() });
    }
    // Step 4: uid/gid 0 inside (we are already mapped to 0; this also drops supplementary
    // groups, which would show up as unmapped "nogroup" in jobs).
    super::ids::become_root()
}

fn run_map(tool: &std::path::Path, pid: Pid, args: &[String]) -> bool {
    std::process::Command::new(tool).arg(pid.to_string()).args(args).status().map(|s| s.success()).unwrap_or(false)
}
