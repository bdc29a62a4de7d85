//! Directory-fd-relative filesystem calls (the `*at` family and `openat2`), on `nix`
//! where it has them, used by the unpacker, the store, the sandbox's in-tree writes and
//! the GPU path resolver.
//!
//! Nothing here follows a symlink unless the name says so: the unpacker runs as root on
//! hostile input. Errors are plain `io::Error`s carrying the errno; the callers know the
//! path or archive entry and put it into their own error.

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FchmodatFlags, Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid};
use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

pub(crate) fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

pub(crate) fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL byte in name"))
}

pub(crate) fn path_cstring(p: &Path) -> io::Result<CString> {
    cstring(p.as_os_str().as_bytes())
}

fn io(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// Retries on EINTR.
fn retry<T>(mut f: impl FnMut() -> nix::Result<T>) -> io::Result<T> {
    loop {
        match f() {
            Err(Errno::EINTR) => continue,
            r => return r.map_err(io),
        }
    }
}

/// Takes ownership of a descriptor an open-like call just returned.
fn owned(fd: RawFd) -> OwnedFd {
    // SAFETY: every caller passes the fd a successful openat/openat2 returned to it a
    // moment ago; nothing else in the process knows that number yet, so this is its only
    // owner and it is closed exactly once, when the OwnedFd drops.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

pub(crate) fn openat(dirfd: RawFd, name: &CStr, flags: libc::c_int, mode: libc::mode_t) -> io::Result<OwnedFd> {
    let flags = OFlag::from_bits_retain(flags | libc::O_CLOEXEC);
    let fd = retry(|| nix::fcntl::openat(Some(dirfd), name, flags, Mode::from_bits_retain(mode)))?;
    Ok(owned(fd))
}

/// Opens the directory `name` in `dirfd` without following a symlink at `name`: a symlink
/// gives ELOOP, a non-directory ENOTDIR. Falls back to an `O_PATH` fd when the directory
/// is not readable (non-root, mode 0111), which still serves as a dirfd.
pub(crate) fn open_dir_at(dirfd: RawFd, name: &CStr) -> io::Result<OwnedFd> {
    match openat(dirfd, name, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW, 0) {
        Err(e) if errno(&e) == libc::EACCES => {
            openat(dirfd, name, libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW, 0)
        }
        r => r,
    }
}

/// Opens a directory by absolute/relative path (the path itself is trusted; the final
/// component is not followed if it is a symlink).
pub(crate) fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    let c = path_cstring(path)?;
    openat(libc::AT_FDCWD, &c, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW, 0)
}

pub(crate) const RESOLVE_NO_MAGICLINKS: u64 = libc::RESOLVE_NO_MAGICLINKS;
pub(crate) const RESOLVE_IN_ROOT: u64 = libc::RESOLVE_IN_ROOT;

/// `openat2(2)`. ENOSYS on kernels before 5.6 or under seccomp profiles that hide it.
/// Retried on EINTR and EAGAIN (a rename elsewhere raced a RESOLVE_IN_ROOT walk).
pub(crate) fn openat2(dirfd: RawFd, path: &CStr, flags: libc::c_int, resolve: u64) -> io::Result<OwnedFd> {
    use nix::fcntl::{OpenHow, ResolveFlag};
    let how = || {
        OpenHow::new()
            .flags(OFlag::from_bits_retain(flags | libc::O_CLOEXEC))
            .resolve(ResolveFlag::from_bits_retain(resolve))
    };
    loop {
        match nix::fcntl::openat2(dirfd, path, how()) {
            Ok(fd) => return Ok(owned(fd)),
            Err(Errno::EINTR | Errno::EAGAIN) => continue,
            Err(e) => return Err(io(e)),
        }
    }
}

pub(crate) fn fstatat_nofollow(dirfd: RawFd, name: &CStr) -> io::Result<libc::stat> {
    nix::sys::stat::fstatat(Some(dirfd), name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(io)
}

/// `/proc/self/fd/N`: the file open as `fd`, as a path other calls can take (a bind
/// source, a root to resolve in).
pub(crate) fn proc_fd(fd: RawFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{fd}"))
}

/// The path of the file open as `fd`, as the kernel prints it.
pub(crate) fn fd_path(fd: RawFd) -> io::Result<PathBuf> {
    std::fs::read_link(proc_fd(fd))
}

pub(crate) fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    nix::sys::stat::fstat(fd).map_err(io)
}

pub(crate) fn is_dir(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

pub(crate) fn is_symlink(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFLNK
}

pub(crate) fn mkdirat(dirfd: RawFd, name: &CStr, mode: libc::mode_t) -> io::Result<()> {
    nix::sys::stat::mkdirat(Some(dirfd), name, Mode::from_bits_retain(mode)).map_err(io)
}

/// `unlinkat(2)`; `flags` is 0 or `AT_REMOVEDIR`.
pub(crate) fn unlinkat(dirfd: RawFd, name: &CStr, flags: libc::c_int) -> io::Result<()> {
    use nix::unistd::UnlinkatFlags;
    let how = if flags & libc::AT_REMOVEDIR != 0 { UnlinkatFlags::RemoveDir } else { UnlinkatFlags::NoRemoveDir };
    nix::unistd::unlinkat(Some(dirfd), name, how).map_err(io)
}

/// `flock(2)` on a borrowed fd; `op` is `LOCK_SH`/`LOCK_EX`, optionally `| LOCK_NB`.
/// (nix's `Flock` takes the file by value; our callers keep using theirs.) Retried on
/// EINTR.
pub(crate) fn flock(fd: BorrowedFd<'_>, op: libc::c_int) -> io::Result<()> {
    retry(|| {
        // SAFETY: flock(2) takes an fd and an integer and touches no memory of ours; the
        // fd is open for the call (borrowed); an error comes back as -1 and errno.
        Errno::result(unsafe { libc::flock(fd.as_raw_fd(), op) }).map(drop)
    })
}

/// `renameat2(RENAME_NOREPLACE)`: EEXIST if `to` exists.
pub(crate) fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    use nix::fcntl::RenameFlags;
    match nix::fcntl::renameat2(None, from, None, to, RenameFlags::RENAME_NOREPLACE) {
        Ok(()) => Ok(()),
        // Filesystems without RENAME_NOREPLACE support: the caller checked for existence
        // already, and plain rename(2) onto a non-empty directory fails anyway.
        Err(Errno::EINVAL) => std::fs::rename(from, to),
        Err(e) => Err(io(e)),
    }
}

/// Owner of the open file `fd`.
pub(crate) fn fchown(fd: RawFd, uid: u32, gid: u32) -> io::Result<()> {
    nix::unistd::fchown(fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid))).map_err(io)
}

/// Owner of `name` in `dirfd`, not following a symlink there (`lchown`).
pub(crate) fn fchownat_nofollow(dirfd: RawFd, name: &CStr, uid: u32, gid: u32) -> io::Result<()> {
    let (u, g) = (Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)));
    nix::unistd::fchownat(Some(dirfd), name, u, g, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(io)
}

/// Owner of the very inode `fd` refers to (an `O_PATH` fd too: `AT_EMPTY_PATH`).
pub(crate) fn chown_fd_inode(fd: RawFd, uid: u32, gid: u32) -> io::Result<()> {
    let (u, g) = (Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)));
    nix::unistd::fchownat(Some(fd), c"", u, g, AtFlags::AT_EMPTY_PATH).map_err(io)
}

/// Mode of the open file `fd` (not subject to the umask).
pub(crate) fn fchmod(fd: RawFd, mode: libc::mode_t) -> io::Result<()> {
    nix::sys::stat::fchmod(fd, Mode::from_bits_retain(mode)).map_err(io)
}

/// Mode of `name` in `dirfd`. Follows a symlink at `name` (Linux cannot chmod a symlink):
/// only for names the caller just created or saw as a non-symlink in its own tree.
pub(crate) fn fchmodat(dirfd: RawFd, name: &CStr, mode: libc::mode_t) -> io::Result<()> {
    nix::sys::stat::fchmodat(Some(dirfd), name, Mode::from_bits_retain(mode), FchmodatFlags::FollowSymlink).map_err(io)
}

/// Access and modification times of the open file `fd` (`UTIME_OMIT` keeps one).
pub(crate) fn futimens(fd: RawFd, times: &[libc::timespec; 2]) -> io::Result<()> {
    nix::sys::stat::futimens(fd, &TimeSpec::from(times[0]), &TimeSpec::from(times[1])).map_err(io)
}

/// Times of `name` in `dirfd`, not following a symlink there.
pub(crate) fn utimensat_nofollow(dirfd: RawFd, name: &CStr, times: &[libc::timespec; 2]) -> io::Result<()> {
    let (a, m) = (TimeSpec::from(times[0]), TimeSpec::from(times[1]));
    nix::sys::stat::utimensat(Some(dirfd), name, &a, &m, UtimensatFlags::NoFollowSymlink).map_err(io)
}

/// A symlink `name` in `dirfd` whose content is `target`.
pub(crate) fn symlinkat(target: &CStr, dirfd: RawFd, name: &CStr) -> io::Result<()> {
    nix::unistd::symlinkat(target, Some(dirfd), name).map_err(io)
}

/// A hard link `name` in `dirfd` to `target` in `target_dir` (a symlink there is linked
/// itself, not followed).
pub(crate) fn linkat(target_dir: RawFd, target: &CStr, dirfd: RawFd, name: &CStr) -> io::Result<()> {
    nix::unistd::linkat(Some(target_dir), target, Some(dirfd), name, AtFlags::empty()).map_err(io)
}

/// A device node or fifo: `mode` holds the file type bits (`S_IFCHR`, ...) and the
/// permissions.
pub(crate) fn mknodat(dirfd: RawFd, name: &CStr, mode: libc::mode_t, dev: libc::dev_t) -> io::Result<()> {
    let kind = SFlag::from_bits_truncate(mode & libc::S_IFMT);
    let perm = Mode::from_bits_truncate(mode & !libc::S_IFMT);
    nix::sys::stat::mknodat(Some(dirfd), name, kind, perm, dev).map_err(io)
}

/// Sets the extended attribute `name` of the open file `fd` to `value`.
pub(crate) fn fsetxattr(fd: RawFd, name: &CStr, value: &[u8]) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated and `value` is `value.len()` readable bytes, both
    // borrowed for the whole call, which only reads them; the result is checked.
    let r = unsafe { libc::fsetxattr(fd, name.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    Errno::result(r).map(drop).map_err(io)
}

/// Whether the file at `path` has the extended attribute `name` (following symlinks).
/// Anything but a clean "no such attribute" (ENODATA) counts as having it: the caller
/// refuses then, rather than guessing.
pub(crate) fn has_xattr(path: &Path, name: &CStr) -> bool {
    let Ok(p) = path_cstring(path) else { return true };
    // SAFETY: both strings are NUL-terminated and borrowed for the call; with a null
    // buffer and size 0 getxattr(2) writes nothing and only returns the value's size.
    let r = unsafe { libc::getxattr(p.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
    r >= 0 || Errno::last() != Errno::ENODATA
}

/// Whether this process runs with effective uid 0.
pub(crate) fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Removes `name` in `dirfd` and, if it is a directory, everything below it, without
/// following symlinks (a symlink is unlinked, never traversed). ENOENT is success.
///
/// No stack frame per level, and a bounded number of descriptors, whatever the depth: a
/// job's layer is a stranger's tree, and one of 100000 nested dirs took a descriptor per
/// level (EMFILE past the nofile limit) and a frame per level (a stack overflow aborted
/// `exec`, and its layer stayed for ever) in a recursive walk. The names still to remove
/// are on the heap, level by level; the first [`KEPT_FDS`] levels keep their
/// descriptors, deeper ones let them go and are found again through `..`, checked against
/// the device and inode the walk came down from. A listing gives each name's type, so a
/// dir is opened at once and a file unlinked at once.
pub(crate) fn remove_all_at(dirfd: RawFd, name: &CStr) -> io::Result<()> {
    let Some(top) = open_for_removal(dirfd, name, None)? else { return Ok(()) };
    let mut cur = top.fd;
    let mut down = vec![top.level];
    loop {
        let depth = down.len();
        let level = down.last_mut().expect("the top is popped last");
        if let Some((child, is_dir)) = level.left.pop() {
            if let Some(below) = open_for_removal(cur.as_raw_fd(), &child, is_dir)? {
                let above = std::mem::replace(&mut cur, below.fd);
                level.fd = (depth <= KEPT_FDS).then_some(above);
                down.push(below.level);
            }
            continue;
        }
        // `cur` is empty: remove it from the level above (the caller's `dirfd` for the top).
        let done = down.pop().expect("a level was taken above");
        let Some(parent) = down.last_mut() else {
            drop(cur);
            return match unlinkat(dirfd, &done.name, libc::AT_REMOVEDIR) {
                Err(e) if errno(&e) != libc::ENOENT => Err(e),
                _ => Ok(()),
            };
        };
        let up = match parent.fd.take() {
            Some(fd) => fd,
            None => {
                let up = openat(cur.as_raw_fd(), c"..", libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW, 0)?;
                if dev_ino(&fstat(up.as_raw_fd())?) != parent.id {
                    return Err(io::Error::other("the tree was moved while it was being removed"));
                }
                up
            }
        };
        cur = up;
        match unlinkat(cur.as_raw_fd(), &done.name, libc::AT_REMOVEDIR) {
            Err(e) if errno(&e) != libc::ENOENT => return Err(e),
            _ => {}
        }
    }
}

/// How many levels of [`remove_all_at`]'s walk keep their descriptors.
const KEPT_FDS: usize = 64;

/// A directory on the way down in [`remove_all_at`].
struct Level {
    /// Its name in the directory above.
    name: CString,
    /// Its device and inode, checked when the walk comes back up to it through `..`.
    id: (u64, u64),
    /// Its entries not yet removed, with whether each is a dir (None: the listing did not
    /// say).
    left: Vec<(CString, Option<bool>)>,
    /// Its descriptor while the walk is below it (the first [`KEPT_FDS`] levels).
    fd: Option<OwnedFd>,
}

/// A directory [`remove_all_at`] goes down into.
struct Opened {
    fd: OwnedFd,
    level: Level,
}

/// Removes `name` in `dirfd` if it is not a directory (`None`, ENOENT included), or
/// opens it to be emptied: listed, and made listable and writable for us first when we
/// are not root (our own tree with a mode-000 directory, left by an interrupted import).
/// `is_dir`: what the listing said of it.
fn open_for_removal(dirfd: RawFd, name: &CStr, is_dir: Option<bool>) -> io::Result<Option<Opened>> {
    if is_dir != Some(true) {
        match unlinkat(dirfd, name, 0) {
            Ok(()) => return Ok(None),
            Err(e) if errno(&e) == libc::ENOENT => return Ok(None),
            Err(e) if errno(&e) == libc::EISDIR || errno(&e) == libc::EPERM => {}
            Err(e) => return Err(e),
        }
    }
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
    let fd = match openat(dirfd, name, flags, 0) {
        Ok(fd) => fd,
        Err(e) if errno(&e) == libc::ENOENT => return Ok(None),
        // Not a dir after all (a symlink, or the listing was wrong): unlinked.
        Err(e) if errno(&e) == libc::ENOTDIR || errno(&e) == libc::ELOOP => {
            return unlinkat(dirfd, name, 0).map(|()| None)
        }
        Err(e) if errno(&e) == libc::EACCES => {
            // A dir (O_DIRECTORY | O_NOFOLLOW got that far), so fchmodat's symlink
            // following cannot apply.
            fchmodat(dirfd, name, 0o700)?;
            openat(dirfd, name, flags, 0)?
        }
        Err(e) => return Err(e),
    };
    let st = fstat(fd.as_raw_fd())?;
    if st.st_mode & 0o700 != 0o700 && !is_root() {
        // Readable but not writable or searchable by us: the unlinks below need both.
        // Ignored on failure: the unlink that then fails says so with its own errno.
        let _ = fchmod(fd.as_raw_fd(), 0o700);
    }
    let left = read_dir_entries(fd.as_raw_fd(), false)?;
    Ok(Some(Opened { fd, level: Level { name: name.to_owned(), id: dev_ino(&st), left, fd: None } }))
}

/// The entries of a directory (without `.` and `..`) and whether each is a dir (None:
/// the listing did not say), read through a dup of `dir`. The dup shares `dir`'s file
/// offset: `rewind` for a descriptor an earlier listing may have moved, not for one just
/// opened.
fn read_dir_entries(dir: RawFd, rewind: bool) -> io::Result<Vec<(CString, Option<bool>)>> {
    let dup = owned(nix::fcntl::fcntl(dir, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(0)).map_err(io)?);
    if rewind {
        nix::unistd::lseek(dup.as_raw_fd(), 0, nix::unistd::Whence::SeekSet).map_err(io)?;
    }
    let mut d = nix::dir::Dir::from(dup).map_err(io)?;
    let mut entries = Vec::new();
    for ent in d.iter() {
        let ent = ent.map_err(io)?;
        let b = ent.file_name().to_bytes();
        if b != b"." && b != b".." {
            let is_dir = ent.file_type().map(|t| t == nix::dir::Type::Directory);
            entries.push((ent.file_name().to_owned(), is_dir));
        }
    }
    Ok(entries)
}

fn dev_ino(st: &libc::stat) -> (u64, u64) {
    (st.st_dev, st.st_ino)
}

/// Names in a directory (without `.` and `..`), from the start whatever `dir`'s offset
/// (see [`read_dir_entries`]).
pub(crate) fn read_dir_names(dir: RawFd) -> io::Result<Vec<CString>> {
    Ok(read_dir_entries(dir, true)?.into_iter().map(|(name, _)| name).collect())
}

/// Removes a directory tree by path (jobs' layers, our own store dirs) with
/// [`remove_all_at`]: not `std::fs::remove_dir_all`, which takes a descriptor and a
/// stack frame per level of a job's tree.
pub(crate) fn remove_tree(path: &Path) -> io::Result<()> {
    let parent = path.parent().unwrap_or(Path::new("/"));
    let name = path.file_name().unwrap_or(OsStr::new("."));
    let pfd = match open_dir(parent) {
        Err(e) if errno(&e) == libc::ENOENT => return Ok(()),
        r => r?,
    };
    remove_all_at(pfd.as_raw_fd(), &cstring(name.as_bytes())?)
}

pub(crate) fn fsync_dir(path: &Path) -> io::Result<()> {
    let fd = open_dir(path)?;
    nix::unistd::fsync(fd.as_raw_fd()).map_err(io)
}

/// 16 hex chars from getrandom (falls back to time and a counter).
pub(crate) fn random_suffix() -> String {
    let mut b = [0u8; 8];
    // SAFETY: getrandom(2) writes at most `b.len()` bytes into `b`, which is that long
    // and borrowed mutably for the call; a short or failed read is handled below.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), libc::GRND_NONBLOCK) };
    if n != b.len() as isize {
        use std::sync::atomic::{AtomicU64, Ordering};
        static CTR: AtomicU64 = AtomicU64::new(0);
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let v = (t.as_nanos() as u64) ^ (CTR.fetch_add(1, Ordering::Relaxed) << 48) ^ std::process::id() as u64;
        b = v.to_le_bytes();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_a_dir_twice_through_the_same_fd_sees_every_name() {
        let t = tempfile::tempdir().unwrap();
        for n in ["a", "b", "c"] {
            std::fs::write(t.path().join(n), n).unwrap();
        }
        let fd = open_dir(t.path()).unwrap();
        let mut first = read_dir_names(fd.as_raw_fd()).unwrap();
        let mut again = read_dir_names(fd.as_raw_fd()).unwrap();
        first.sort();
        again.sort();
        assert_eq!(first, [c"a", c"b", c"c"].map(CStr::to_owned));
        assert_eq!(again, first, "the shared offset is rewound");
    }

    #[test]
    fn remove_all_at_takes_unlistable_dirs_and_never_follows_symlinks() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let (tree, outside) = (t.path().join("tree"), t.path().join("outside"));
        std::fs::create_dir_all(tree.join("a/b")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("keep"), "x").unwrap();
        std::fs::write(tree.join("a/b/f"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("a/link")).unwrap();
        std::fs::set_permissions(tree.join("a/b"), std::fs::Permissions::from_mode(0o500)).unwrap();
        std::fs::set_permissions(tree.join("a"), std::fs::Permissions::from_mode(0o000)).unwrap();
        let pfd = open_dir(t.path()).unwrap();
        remove_all_at(pfd.as_raw_fd(), c"tree").unwrap();
        assert!(!tree.exists());
        assert!(outside.join("keep").exists(), "a symlink is unlinked, not followed");
        remove_all_at(pfd.as_raw_fd(), c"tree").unwrap(); // ENOENT is success
    }

    /// A job's tree of 2000 nested dirs (each with a file and a sibling), removed by
    /// a thread with a 64 KiB stack: the recursive walk's frame per level overflowed it
    /// and aborted the process (its descriptor per level went with the recursion).
    #[test]
    fn a_tree_too_deep_for_a_recursive_walk_is_removed() {
        const DEPTH: usize = 2000;
        let t = tempfile::tempdir().unwrap();
        let mut fd = open_dir(t.path()).unwrap();
        for _ in 0..DEPTH {
            nix::sys::stat::mkdirat(Some(fd.as_raw_fd()), c"d", Mode::from_bits_retain(0o755)).unwrap();
            nix::sys::stat::mkdirat(Some(fd.as_raw_fd()), c"e", Mode::from_bits_retain(0o755)).unwrap();
            drop(openat(fd.as_raw_fd(), c"f", libc::O_WRONLY | libc::O_CREAT, 0o644).unwrap());
            fd = open_dir_at(fd.as_raw_fd(), c"d").unwrap();
        }
        drop(fd);
        let path = t.path().join("d");
        let removal = std::thread::Builder::new().stack_size(64 << 10).spawn(move || remove_tree(&path)).unwrap();
        removal.join().expect("the walk's thread").unwrap();
        let mut left: Vec<_> = std::fs::read_dir(t.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        left.sort();
        assert_eq!(left, ["e", "f"], "the tree's top level's siblings stay");
    }

    #[test]
    fn rename_noreplace_refuses_an_existing_target() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        std::fs::write(b.join("x"), "x").unwrap();
        let e = rename_noreplace(&a, &b).unwrap_err();
        assert!(matches!(errno(&e), libc::EEXIST | libc::ENOTEMPTY), "{e}");
        std::fs::remove_dir_all(&b).unwrap();
        rename_noreplace(&a, &b).unwrap();
        assert!(b.is_dir() && !a.exists());
    }

    #[test]
    fn random_suffixes_differ() {
        let (a, b) = (random_suffix(), random_suffix());
        assert_eq!(a.len(), 16);
        assert_ne!(a, b);
    }
}
