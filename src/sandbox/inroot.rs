//! Writing into a job's merged tree from the host side (the helper runs as root there),
//! resolving every path *inside* that tree: a rootfs is image content, and a symlink in it
//! such as `/etc -> /root` or `lib -> /` must lead to the tree's `/root` or `/`, never to
//! the host's. `openat2(RESOLVE_IN_ROOT)` does the resolution; the final component is
//! never followed.

use crate::sys::fs_at;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

const RESOLVE: u64 = fs_at::RESOLVE_IN_ROOT | fs_at::RESOLVE_NO_MAGICLINKS;

fn rel_cstring(p: &Path) -> io::Result<CString> {
    let rel: Vec<&std::ffi::OsStr> = p
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    let joined = rel.iter().map(|c| c.as_bytes()).collect::<Vec<_>>().join(&b'/');
    fs_at::cstring(if joined.is_empty() { b"." } else { &joined })
}

/// The directory `dir` (a container path) of the tree at `root`, created (0755, root-owned
/// like mkdir -p) where missing when `create`. A symlink on the way whose target does not
/// exist inside the tree is an error (ENOENT): it is not followed out, nor created through.
pub fn open_dir(root: &Path, dir: &Path, create: bool) -> io::Result<OwnedFd> {
    open_dir_with(root, dir, create, None)
}

/// [`open_dir`] creating what is missing, each dir it makes given to `owner` (the job's
/// root, as if the job had made it: a runtime makes mount points in the job's namespace).
pub fn open_dir_as(root: &Path, dir: &Path, owner: (u32, u32)) -> io::Result<OwnedFd> {
    open_dir_with(root, dir, true, Some(owner))
}

fn open_dir_with(root: &Path, dir: &Path, create: bool, owner: Option<(u32, u32)>) -> io::Result<OwnedFd> {
    let rootfd = fs_at::open_dir(root)?;
    let mut at = std::path::PathBuf::new();
    let mut fd = fs_at::openat2(rootfd.as_raw_fd(), c".", libc::O_PATH | libc::O_DIRECTORY, RESOLVE)?;
    for c in dir.components() {
        let Component::Normal(name) = c else { continue };
        at.push(name);
        let path = rel_cstring(&at)?;
        fd = match fs_at::openat2(rootfd.as_raw_fd(), &path, libc::O_PATH | libc::O_DIRECTORY, RESOLVE) {
            Err(e) if create && fs_at::errno(&e) == libc::ENOENT => {
                let n = fs_at::cstring(name.as_bytes())?;
                match fs_at::mkdirat(fd.as_raw_fd(), &n, 0o755) {
                    Ok(()) => {
                        if let Some((uid, gid)) = owner {
                            fs_at::fchownat_nofollow(reopen(&fd)?.as_raw_fd(), &n, uid, gid)?;
                        }
                    }
                    Err(e) if fs_at::errno(&e) == libc::EEXIST => {}
                    Err(e) => return Err(e),
                }
                fs_at::openat2(rootfd.as_raw_fd(), &path, libc::O_PATH | libc::O_DIRECTORY, RESOLVE)?
            }
            r => r?,
        };
    }
    Ok(fd)
}

fn split(path: &Path) -> io::Result<(&Path, CString)> {
    let name = path.file_name().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    Ok((path.parent().unwrap_or(Path::new("/")), fs_at::cstring(name.as_bytes())?))
}

/// Replaces whatever is at `path` (not following it) with a new regular file.
pub fn write_file(root: &Path, path: &Path, bytes: &[u8], mode: libc::mode_t) -> io::Result<()> {
    let (parent, name) = split(path)?;
    let dir = open_dir(root, parent, true)?;
    let dirfd = reopen(&dir)?;
    // Whatever was there (or nothing: ENOENT); a failure shows in the O_EXCL open below.
    let _ = fs_at::unlinkat(dirfd.as_raw_fd(), &name, 0);
    let fd = fs_at::openat(
        dirfd.as_raw_fd(),
        &name,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
        mode,
    )?;
    io::Write::write_all(&mut std::fs::File::from(fd), bytes)
}

/// Replaces whatever is at `path` (not following it) with a symlink to `target`.
pub fn symlink(root: &Path, path: &Path, target: &Path) -> io::Result<()> {
    let (parent, name) = split(path)?;
    let dirfd = reopen(&open_dir(root, parent, true)?)?;
    let t = fs_at::path_cstring(target)?;
    // Whatever was there (or nothing: ENOENT); a failure shows in the symlinkat below.
    let _ = fs_at::unlinkat(dirfd.as_raw_fd(), &name, 0);
    fs_at::symlinkat(&t, dirfd.as_raw_fd(), &name)
}

/// mkdir -p `dir` inside the tree, then gives it to uid:gid (not following a symlink).
pub fn create_owned_dir(root: &Path, dir: &Path, uid: u32, gid: u32) -> io::Result<()> {
    let fd = open_dir(root, dir, true)?;
    fs_at::chown_fd_inode(fd.as_raw_fd(), uid, gid)
}

/// An `O_PATH` fd of what is at `path` inside the tree, the final symlink followed
/// (inside the tree too), as the runtime resolves a mount destination.
pub fn open_existing(root: &Path, path: &Path) -> io::Result<OwnedFd> {
    let rootfd = fs_at::open_dir(root)?;
    fs_at::openat2(rootfd.as_raw_fd(), &rel_cstring(path)?, libc::O_PATH, RESOLVE)
}

/// The first `max` bytes of the regular file at `path` inside the tree (symlinks resolved
/// inside the tree too).
pub fn read_file(root: &Path, path: &Path, max: u64) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let rootfd = fs_at::open_dir(root)?;
    // O_NONBLOCK: a FIFO planted there must not block the caller.
    let fd = fs_at::openat2(rootfd.as_raw_fd(), &rel_cstring(path)?, libc::O_RDONLY | libc::O_NONBLOCK, RESOLVE)?;
    let f = std::fs::File::from(fd);
    if !f.metadata()?.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
    }
    let mut out = Vec::new();
    f.take(max).read_to_end(&mut out)?;
    Ok(out)
}

/// Makes sure something exists at `path` inside the tree for a bind mount to land on:
/// when nothing does, an empty dir (`dir`) or an empty file (0644), with the parent dirs
/// (as mkdir -p). Whatever is already there, a dangling symlink included, is left alone:
/// the runtime resolves it as it did before.
pub fn create_mount_target(root: &Path, path: &Path, dir: bool) -> io::Result<()> {
    create_mount_target_with(root, path, dir, None).map(drop)
}

/// [`create_mount_target`], what it makes given to `owner` (see [`open_dir_as`]);
/// returns the target as [`open_existing`] would, for the mount to land on.
pub fn create_mount_target_as(root: &Path, path: &Path, dir: bool, owner: (u32, u32)) -> io::Result<OwnedFd> {
    match create_mount_target_with(root, path, dir, Some(owner))? {
        Some(fd) => Ok(fd),
        None => open_existing(root, path),
    }
}

/// The target when it was there already or is a dir just made (resolved once), None
/// when a file was made or something left alone (a dangling symlink).
fn create_mount_target_with(
    root: &Path,
    path: &Path,
    dir: bool,
    owner: Option<(u32, u32)>,
) -> io::Result<Option<OwnedFd>> {
    match open_existing(root, path) {
        Err(e) if fs_at::errno(&e) == libc::ENOENT => {}
        r => return r.map(Some),
    }
    if dir {
        return open_dir_with(root, path, true, owner).map(Some);
    }
    let (parent, name) = split(path)?;
    let dirfd = reopen(&open_dir_with(root, parent, true, owner)?)?;
    match fs_at::openat(
        dirfd.as_raw_fd(),
        &name,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
        0o644,
    ) {
        Err(e) if fs_at::errno(&e) == libc::EEXIST => Ok(None),
        Ok(fd) => match owner {
            Some((uid, gid)) => fs_at::fchown(fd.as_raw_fd(), uid, gid).map(|()| None),
            None => Ok(None),
        },
        Err(e) => Err(e),
    }
}

/// An O_PATH directory fd cannot be used for *at writes everywhere; reopen it for real.
fn reopen(fd: &OwnedFd) -> io::Result<OwnedFd> {
    fs_at::openat(fd.as_raw_fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_symlinks_in_the_tree_resolve_inside_it() {
        let t = tempfile::tempdir().unwrap();
        let (root, outside) = (t.path().join("root"), t.path().join("outside"));
        std::fs::create_dir_all(root.join("real")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        // /etc -> <host path outside the tree>, /lib -> /real (absolute, meant inside).
        std::os::unix::fs::symlink(&outside, root.join("etc")).unwrap();
        std::os::unix::fs::symlink("/real", root.join("lib")).unwrap();
        // /etc leads to a path that does not exist inside the tree: refused, not created
        // on the host.
        let e = write_file(&root, Path::new("/etc/ld.so.conf.d/000-x.conf"), b"/usr/lib\n", 0o644).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "nothing written outside the tree");
        // Once that path exists inside the tree, the write lands there.
        let inside = root.join(outside.strip_prefix("/").unwrap());
        std::fs::create_dir_all(&inside).unwrap();
        write_file(&root, Path::new("/etc/ld.so.conf.d/000-x.conf"), b"/usr/lib\n", 0o644).unwrap();
        assert_eq!(std::fs::read(inside.join("ld.so.conf.d/000-x.conf")).unwrap(), b"/usr/lib\n");
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "nothing written outside the tree");
        symlink(&root, Path::new("/lib/libcuda.so"), Path::new("libcuda.so.1")).unwrap();
        assert_eq!(std::fs::read_link(root.join("real/libcuda.so")).unwrap(), Path::new("libcuda.so.1"));
        // A symlink at the final component is replaced, not followed.
        std::os::unix::fs::symlink(&outside, root.join("real/f")).unwrap();
        write_file(&root, Path::new("/real/f"), b"x", 0o644).unwrap();
        assert!(std::fs::symlink_metadata(root.join("real/f")).unwrap().is_file());
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    }

    #[test]
    fn mount_targets_are_made_inside_the_tree_and_existing_ones_kept() {
        let t = tempfile::tempdir().unwrap();
        let (root, outside) = (t.path().join("root"), t.path().join("outside"));
        std::fs::create_dir_all(root.join("usr/bin")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink("usr/bin", root.join("bin")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("opt")).unwrap();
        create_mount_target(&root, Path::new("/bin/nvidia-smi"), false).unwrap();
        let m = std::fs::symlink_metadata(root.join("usr/bin/nvidia-smi")).unwrap();
        assert!(m.is_file() && m.len() == 0, "an empty file through the tree's own symlink");
        create_mount_target(&root, Path::new("/lib/firmware/nvidia/1.2"), true).unwrap();
        assert!(root.join("lib/firmware/nvidia/1.2").is_dir());
        // An existing file is kept as it is.
        std::fs::write(root.join("usr/bin/tool"), "x").unwrap();
        create_mount_target(&root, Path::new("/usr/bin/tool"), false).unwrap();
        assert_eq!(std::fs::read(root.join("usr/bin/tool")).unwrap(), b"x");
        // A symlink to a host dir resolves inside the tree: nothing is made on the host.
        let e = create_mount_target(&root, Path::new("/opt/data"), true);
        assert!(e.is_ok() || e.as_ref().unwrap_err().raw_os_error() == Some(libc::ENOENT), "{e:?}");
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "nothing written outside the tree");
        assert!(open_existing(&root, Path::new("/usr/bin/nvidia-smi")).is_ok());
    }
}
