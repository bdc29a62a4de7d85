//! A job's own user namespace, made by its helper before the job exists: the namespace
//! (an fd; libcontainer joins it), the read-only layers mounted idmapped with it, and
//! the chowns that give the job's root its upper layer. What ids to map is decided in
//! [`crate::identity`].

use super::error::{Error, Result};
use super::process::{self, Forked};
use nix::errno::Errno;
use nix::unistd::{read, write, Gid, Uid};
use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// A new user namespace with these maps (`/proc/PID/uid_map` text), as an fd.
///
/// A namespace needs a process to be made in and its maps written for: fork a child that
/// unshares one and waits, write the maps from here (root of the parent namespace may
/// map any of its ids), keep an fd to the namespace, and let the child go. The fd keeps
/// the namespace alive; it holds no process.
pub fn new_user_namespace(uid_map: &str, gid_map: &str) -> Result<OwnedFd> {
    let (ready_r, ready_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(Error::Pipe)?;
    let (done_r, done_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(Error::Pipe)?;
    // Step 1: the child, which makes the namespace and reports the errno (0: done).
    let child = match process::fork("the job's user namespace")? {
        Forked::Child => {
            drop(ready_r);
            drop(done_w);
            let errno = match nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER) {
                Ok(()) => 0,
                Err(e) => e as i32,
            };
            let _ = write(&ready_w, &errno.to_ne_bytes());
            // Wait until the parent has what it needs (EOF when it closes its end).
            let mut b = [0u8; 1];
            let _ = read(done_r.as_raw_fd(), &mut b);
            process::exit_now(0);
        }
        Forked::Parent(child) => child,
    };
    drop(ready_w);
    drop(done_r);
    let made = (|| {
        // Step 2: the child's answer.
        let mut b = [0u8; 4];
        match read(ready_r.as_raw_fd(), &mut b) {
            Ok(4) => {}
            Ok(_) => return Err(Error::UserNamespaceChild(Errno::ECHILD)),
            Err(e) => return Err(Error::UserNamespaceChild(e)),
        }
        match i32::from_ne_bytes(b) {
            0 => {}
            e => return Err(Error::UserNamespaceChild(Errno::from_raw(e))),
        }
        // Step 3: its namespace, then the maps.
        let ns = PathBuf::from(format!("/proc/{child}/ns/user"));
        let fd = std::fs::File::open(&ns).map_err(|source| Error::OpenUserNs { path: ns, source })?;
        write_map(child.as_raw(), "uid_map", uid_map)?;
        write_map(child.as_raw(), "gid_map", gid_map)?;
        Ok(OwnedFd::from(fd))
    })();
    // Step 4: let the child exit, and reap it.
    drop(done_w);
    let waited = nix::sys::wait::waitpid(child, None);
    let fd = made?;
    waited.map_err(|source| Error::Wait { what: "the job's user namespace", source })?;
    Ok(fd)
}

fn write_map(pid: i32, file: &str, map: &str) -> Result<()> {
    let path = PathBuf::from(format!("/proc/{pid}/{file}"));
    std::fs::write(&path, map).map_err(|source| Error::WriteIdMap { file: path, map: map.trim().into(), source })
}

// From <linux/mount.h> (not in the libc crate).
const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOUNT_ATTR_RDONLY: u64 = 0x0000_0001;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x0000_0004;

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
    let c_target = cstring(target)?;
    // SAFETY: move_mount(2) reads the two NUL-terminated paths during the call only.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            c_target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if r < 0 {
        return Err(Error::IdmapMove { layer: layer.into(), target: target.into(), source: Errno::last() });
    }
    Ok(())
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
