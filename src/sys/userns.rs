//! A job's own user namespace, made by its helper before the job exists: the namespace
//! (an fd; libcontainer joins it), the read-only layers mounted idmapped with it, and
//! the chowns that give the job's root its upper layer. What ids to map is decided in
//! [`crate::identity`].

use super::error::{Error, Result};
use super::process;
use nix::errno::Errno;
use nix::unistd::{Gid, Uid};
use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// A new user namespace with these maps (`/proc/PID/uid_map` text), as an fd, owned by
/// host uid `owner` when given (root and setuid modes: the job's root's host uid; see
/// [`as_owner`]), else by this process's uid.
///
/// A namespace needs a process to be made in and its maps written for: clone a child
/// into a new one (it exists when clone returns: no hand-shake with the child), write
/// the maps from here (root of the parent namespace may map any of its ids), keep an fd
/// to the namespace, and kill the child. The fd keeps the namespace alive; it holds no
/// process. The child shares our memory (see [`process::clone_waiting`]): a fork of the
/// helper cost ~0.1 ms and the wait for the child to run and unshare up to ~0.6 ms on a
/// busy machine. It is killed, not waited for: the caller reaps it with
/// `process::reap_killed` before it waits for any child.
pub fn new_user_namespace(uid_map: &str, gid_map: &str, owner: Option<u32>) -> Result<OwnedFd> {
    // Step 1: the child, in its new namespace, owned by `owner`.
    let clone = || process::clone_waiting(nix::sched::CloneFlags::CLONE_NEWUSER);
    let child = match owner {
        Some(uid) => as_owner(uid, clone)?,
        None => clone(),
    }
    .map_err(Error::UserNamespaceChild)?;
    let pid = child.pid().as_raw();
    // Step 2: its namespace, then the maps.
    let made = (|| -> Result<OwnedFd> {
        let ns = PathBuf::from(format!("/proc/{pid}/ns/user"));
        let fd = std::fs::File::open(&ns).map_err(|source| Error::OpenUserNs { path: ns, source })?;
        write_map(pid, "uid_map", uid_map)?;
        write_map(pid, "gid_map", gid_map)?;
        Ok(OwnedFd::from(fd))
    })();
    // Step 3: the child goes; reaped later (see `process::reap_killed`), not waited for.
    child.kill_and_reap_later();
    made
}

/// Runs `make` with this process's effective uid `owner`, so that a user namespace it
/// creates is `owner`'s. The kernel charges what a namespace's processes hold of the
/// per-user budgets (inotify instances and watches, POSIX message queue bytes, queued
/// signals, user namespaces) to its owner in the parent namespace, on top of the
/// namespace's own (unlimited) counts: owned by root, a job used up host root's budgets
/// and root's services' inotify, mq_open and sigqueue failed host-wide while it ran
/// (found by a red-team pass). Owned by the job's own host uid, a job has the host's
/// per-user budgets to itself, as any host account has.
///
/// The real and saved uids stay root's, so the effective uid can come back; the
/// capabilities are kept across both changes (SECBIT_NO_SETUID_FIXUP), so the namespace
/// is made by a capable process (no unprivileged-namespace restriction, e.g. Ubuntu's
/// AppArmor one, applies). A change of effective uid also clears the parent-death
/// signal and the dumpable flag: both are put back, and a runner that died meanwhile
/// (its signal lost) is an error.
fn as_owner<T>(owner: u32, make: impl FnOnce() -> T) -> Result<T> {
    let parent = nix::unistd::getppid();
    let death_signal = nix::sys::prctl::get_pdeathsig().map_err(Error::HelperStateRead)?;
    let dumpable = nix::sys::prctl::get_dumpable().map_err(Error::HelperStateRead)?;
    // SAFETY: prctl(PR_GET_SECUREBITS) takes no pointer and only returns an integer.
    let bits = unsafe { libc::prctl(libc::PR_GET_SECUREBITS) };
    if bits < 0 {
        return Err(Error::HelperStateRead(Errno::last()));
    }
    let set_bits = |b: libc::c_int| {
        // SAFETY: prctl(PR_SET_SECUREBITS) takes the bits as an integer, no pointer.
        Errno::result(unsafe { libc::prctl(libc::PR_SET_SECUREBITS, b as libc::c_ulong) }).map(drop)
    };
    let keep = Uid::from_raw(u32::MAX); // -1: unchanged
                                        // Step 1: capabilities kept across uid changes, then the owner's effective uid.
    set_bits(bits | libc::SECBIT_NO_SETUID_FIXUP).map_err(Error::KeepCapabilities)?;
    if let Err(source) = nix::unistd::setresuid(keep, Uid::from_raw(owner), keep) {
        let _ = set_bits(bits);
        return Err(Error::BecomeNamespaceOwner { uid: owner, source });
    }
    // Step 2: the namespace.
    let made = make();
    // Step 3: root again, and what the uid changes cleared.
    nix::unistd::setresuid(keep, Uid::from_raw(0), keep).map_err(Error::ResumeRoot)?;
    set_bits(bits).map_err(Error::RestoreHelperState)?;
    nix::sys::prctl::set_dumpable(dumpable).map_err(Error::RestoreHelperState)?;
    if let Some(signal) = death_signal {
        nix::sys::prctl::set_pdeathsig(signal).map_err(Error::RestoreHelperState)?;
        // Checked after the prctl: a runner that died before it sent nothing.
        if nix::unistd::getppid() != parent {
            return Err(Error::RunnerGoneMeanwhile);
        }
    }
    Ok(made)
}

fn write_map(pid: i32, file: &str, map: &str) -> Result<()> {
    let path = PathBuf::from(format!("/proc/{pid}/{file}"));
    std::fs::write(&path, map).map_err(|source| Error::WriteIdMap { file: path, map: map.trim().into(), source })
}

// From <linux/mount.h> (not in the libc crate).
const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOUNT_ATTR_RDONLY: u64 = 0x0000_0001;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// `struct mount_attr` of mount_setattr(2).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Mounts `layer` read-only at `target` (made here, 0700), idmapped with the namespace
/// `userns`: a file owned by id N on disk belongs to whatever N is in that namespace
/// (its root for 0), for whoever looks through this mount. Only in the caller's mount
/// namespace (the helper's private one).
pub fn idmap_layer(layer: &Path, userns: BorrowedFd, target: &Path) -> Result<()> {
    let mut dir = std::fs::DirBuilder::new();
    std::os::unix::fs::DirBuilderExt::mode(&mut dir, 0o700);
    dir.recursive(true);
    match dir.create(target) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(Error::IdmapMove {
                layer: layer.into(),
                target: target.into(),
                source: super::error::errno_of(&e),
            })
        }
        _ => {}
    }
    let c_layer = cstring(layer)?;
    // Step 1: a detached copy of the layer's mount.
    // SAFETY: open_tree(2) reads the NUL-terminated path we own for the call's duration
    // and returns a new fd (or -1); no memory of ours is kept.
    let tree = unsafe {
        libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c_layer.as_ptr(), OPEN_TREE_CLONE | libc::O_CLOEXEC as u32)
    };
    if tree < 0 {
        return Err(Error::IdmapOpenTree { layer: layer.into(), source: Errno::last() });
    }
    // SAFETY: `tree` is a new fd that nothing else owns; the OwnedFd closes it once.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as i32) };
    // Step 2: read-only and idmapped.
    let attr = MountAttr { attr_set: MOUNT_ATTR_RDONLY | MOUNT_ATTR_IDMAP, attr_clr: 0, propagation: 0, userns_fd: 0 };
    let attr = MountAttr { userns_fd: userns.as_raw_fd() as u64, ..attr };
    // SAFETY: mount_setattr(2) reads `attr` (a live, correctly laid out struct whose size
    // we pass) and the empty path literal during the call only.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        return Err(Error::IdmapLayer { layer: layer.into(), source: Errno::last() });
    }
    // Step 3: attach it at `target`.
    super::mount::attach_detached(std::os::fd::AsFd::as_fd(&tree), target).map_err(|source| Error::IdmapMove {
        layer: layer.into(),
        target: target.into(),
        source,
    })
}

fn cstring(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| Error::IdmapOpenTree { layer: p.into(), source: Errno::EINVAL })
}

/// Owner of `path` (not followed if a symlink).
pub fn chown(path: &Path, uid: u32, gid: u32) -> Result<()> {
    nix::unistd::fchownat(
        None,
        path,
        Some(Uid::from_raw(uid)),
        Some(Gid::from_raw(gid)),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(|source| Error::Chown { path: path.into(), uid, gid, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_attr_has_the_kernels_layout() {
        // MOUNT_ATTR_SIZE_VER0 is 32.
        assert_eq!(std::mem::size_of::<MountAttr>(), 32);
    }
}
