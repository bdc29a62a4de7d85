//! Thin fd-relative filesystem helpers (libc) used by the unpacker and the store.
//!
//! Everything here works relative to directory file descriptors and never follows a
//! symlink unless the name says so: the unpacker runs as root on hostile input.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

pub(crate) fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Retries on EINTR.
pub(crate) fn cvt_r(mut f: impl FnMut() -> libc::c_int) -> io::Result<libc::c_int> {
    loop {
        match cvt(f()) {
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            other => return other,
        }
    }
}

pub(crate) fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

pub(crate) fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL byte in name"))
}

pub(crate) fn path_cstring(p: &Path) -> io::Result<CString> {
    cstring(p.as_os_str().as_bytes())
}

fn owned(fd: libc::c_int) -> OwnedFd {
    // SAFETY: `fd` was just returned by a successful open-like syscall and is owned by no one else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

pub(crate) fn openat(dirfd: RawFd, name: &CStr, flags: libc::c_int, mode: libc::mode_t) -> io::Result<OwnedFd> {
    // SAFETY: `name` is a NUL-terminated string borrowed for the call; `dirfd` is the
    // caller's fd (or AT_FDCWD); the result is checked and the new fd owned below.
    let fd = cvt_r(|| unsafe { libc::openat(dirfd, name.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) })?;
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

pub(crate) const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
pub(crate) const RESOLVE_IN_ROOT: u64 = 0x10;

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// `openat2(2)`. ENOSYS on kernels before 5.6 or under seccomp profiles that hide it.
pub(crate) fn openat2(dirfd: RawFd, path: &CStr, flags: libc::c_int, resolve: u64) -> io::Result<OwnedFd> {
    let how = OpenHow { flags: (flags | libc::O_CLOEXEC) as u64, mode: 0, resolve };
    loop {
        // SAFETY: valid pointers for the duration of the call; size matches the struct.
        let r = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dirfd,
                path.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        if r >= 0 {
            return Ok(owned(r as libc::c_int));
        }
        let e = io::Error::last_os_error();
        if errno(&e) != libc::EINTR && errno(&e) != libc::EAGAIN {
            return Err(e);
        }
    }
}

pub(crate) fn fstatat_nofollow(dirfd: RawFd, name: &CStr) -> io::Result<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: a plain syscall on fds and NUL-terminated C strings owned by this function and valid for the whole call; its result is checked.
    cvt(unsafe { libc::fstatat(dirfd, name.as_ptr(), st.as_mut_ptr(), libc::AT_SYMLINK_NOFOLLOW) })?;
    // SAFETY: fstatat succeeded and filled the struct.
    Ok(unsafe { st.assume_init() })
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
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: a plain syscall on fds and NUL-terminated C strings owned by this function and valid for the whole call; its result is checked.
    cvt(unsafe { libc::fstat(fd, st.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded and filled the struct.
    Ok(unsafe { st.assume_init() })
}

pub(crate) fn is_dir(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

pub(crate) fn is_symlink(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFLNK
}

pub(crate) fn mkdirat(dirfd: RawFd, name: &CStr, mode: libc::mode_t) -> io::Result<()> {
    // SAFETY: a plain syscall on fds and NUL-terminated C strings owned by this function and valid for the whole call; its result is checked.
    cvt(unsafe { libc::mkdirat(dirfd, name.as_ptr(), mode) }).map(drop)
}

pub(crate) fn unlinkat(dirfd: RawFd, name: &CStr, flags: libc::c_int) -> io::Result<()> {
    // SAFETY: a plain syscall on fds and NUL-terminated C strings owned by this function and valid for the whole call; its result is checked.
    cvt(unsafe { libc::unlinkat(dirfd, name.as_ptr(), flags) }).map(drop)
}

/// `flock(2)`; `op` is `LOCK_SH`/`LOCK_EX`, optionally `| LOCK_NB`.
pub(crate) fn flock(fd: BorrowedFd<'_>, op: libc::c_int) -> io::Result<()> {
    // SAFETY: a plain syscall on fds and NUL-terminated C strings owned by this function and valid for the whole call; its result is checked.
    cvt_r(|| unsafe { libc::flock(fd.as_raw_fd(), op) }).map(drop)
}

/// `renameat2(RENAME_NOREPLACE)`: EEXIST if `to` exists.
pub(crate) fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    let (f, t) = (path_cstring(from)?, path_cstring(to)?);
    const RENAME_NOREPLACE: libc::c_uint = 1;
    // SAFETY: both paths are NUL-terminated CStrings that outlive the call; the result is checked below.
    let r = unsafe {
        libc::syscall(libc::SYS_renameat2, libc::AT_FDCWD, f.as_ptr(), libc::AT_FDCWD, t.as_ptr(), RENAME_NOREPLACE)
    };
    if r == -1 {
        let e = io::Error::last_os_error();
        // Filesystems without RENAME_NOREPLACE support: the caller checked for existence
        // already, and plain rename(2) onto a non-empty directory fails anyway.
        if errno(&e) == libc::EINVAL {
            return std::fs::rename(from, to);
        }
        return Err(e);
    }
    Ok(())
}

/// Removes `name` in `dirfd` and, if it is a directory, everything below it, without
/// following symlinks (a symlink is unlinked, never traversed). ENOENT is success.
pub(crate) fn remove_all_at(dirfd: RawFd, name: &CStr) -> io::Result<()> {
    match unlinkat(dirfd, name, 0) {
        Ok(()) => return Ok(()),
        Err(e) if errno(&e) == libc::ENOENT => return Ok(()),
        Err(e) if errno(&e) == libc::EISDIR || errno(&e) == libc::EPERM => {}
        Err(e) => return Err(e),
    }
    let st = match fstatat_nofollow(dirfd, name) {
        Ok(st) => st,
        Err(e) if errno(&e) == libc::ENOENT => return Ok(()),
        Err(e) => return Err(e),
    };
    if !is_dir(&st) {
        return unlinkat(dirfd, name, 0);
    }
    let dir = match openat(dirfd, name, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW, 0) {
        Ok(fd) => fd,
        Err(e) if errno(&e) == libc::EACCES => {
            // Our own tree with a mode-000 directory (non-root): make it listable. The name
            // was just seen as a directory, so fchmodat's symlink following cannot apply.
            // SAFETY: a plain syscall on fds and NUL-terminated C strings owned by this function and valid for the whole call; its result is checked.
            cvt(unsafe { libc::fchmodat(dirfd, name.as_ptr(), 0o700, 0) })?;
            openat(dirfd, name, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW, 0)?
        }
        Err(e) => return Err(e),
    };
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    if st.st_mode & 0o700 != 0o700 && unsafe { libc::geteuid() } != 0 {
        // SAFETY: a plain syscall on fds and NUL-terminated C strings owned by this function and valid for the whole call; its result is checked.
        let _ = unsafe { libc::fchmod(dir.as_raw_fd(), 0o700) };
    }
    for child in read_dir_names(dir.as_raw_fd())? {
        remove_all_at(dir.as_raw_fd(), &child)?;
    }
    drop(dir);
    match unlinkat(dirfd, name, libc::AT_REMOVEDIR) {
        Err(e) if errno(&e) == libc::ENOENT => Ok(()),
        r => r,
    }
}

/// Names in a directory (without `.` and `..`), read through a dup of `dir`.
pub(crate) fn read_dir_names(dir: RawFd) -> io::Result<Vec<CString>> {
    // SAFETY: a plain syscall on fds and NUL-terminated C strings owned by this function and valid for the whole call; its result is checked.
    let dup = cvt(unsafe { libc::fcntl(dir, libc::F_DUPFD_CLOEXEC, 0) })?;
    // SAFETY: `dup` is a fresh fd that fdopendir takes over (closed by closedir).
    let dp = unsafe { libc::fdopendir(dup) };
    if dp.is_null() {
        let e = io::Error::last_os_error();
        unsafe { libc::close(dup) };
        return Err(e);
    }
    // SAFETY: a plain syscall on fds and NUL-terminated C strings owned by this function and valid for the whole call; its result is checked.
    unsafe { libc::rewinddir(dp) };
    let mut names = Vec::new();
    let result = loop {
        // SAFETY: errno is thread-local; reset it to tell end-of-dir from an error.
        unsafe { *libc::__errno_location() = 0 };
        let ent = unsafe { libc::readdir64(dp) };
        if ent.is_null() {
            let e = io::Error::last_os_error();
            break if errno(&e) == 0 { Ok(()) } else { Err(e) };
        }
        // SAFETY: d_name is a NUL-terminated string inside the dirent readdir returned.
        let name = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) };
        let b = name.to_bytes();
        if b != b"." && b != b".." {
            names.push(name.to_owned());
        }
    };
    // SAFETY: a plain syscall on fds and NUL-terminated C strings owned by this function and valid for the whole call; its result is checked.
    unsafe { libc::closedir(dp) };
    result.map(|()| names)
}

/// Removes a directory tree by path (our own store dirs: temp imports, removed rootfs).
/// `std::fs::remove_dir_all` does not follow symlinks; on EACCES (non-root, mode-000
/// directories left by an interrupted import) fall back to the chmod-as-we-go walker.
pub(crate) fn remove_tree(path: &Path) -> io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(_) => {
            let parent = path.parent().unwrap_or(Path::new("/"));
            let name = path.file_name().unwrap_or(OsStr::new("."));
            let pfd = open_dir(parent)?;
            remove_all_at(pfd.as_raw_fd(), &cstring(name.as_bytes())?)
        }
    }
}

pub(crate) fn fsync_dir(path: &Path) -> io::Result<()> {
    let fd = open_dir(path)?;
    // SAFETY: a plain syscall on fds and NUL-terminated C strings owned by this function and valid for the whole call; its result is checked.
    cvt(unsafe { libc::fsync(fd.as_raw_fd()) }).map(drop)
}

/// 16 hex chars from getrandom (falls back to time and a counter).
pub(crate) fn random_suffix() -> String {
    let mut b = [0u8; 8];
    // SAFETY: a plain syscall on fds and NUL-terminated C strings owned by this function and valid for the whole call; its result is checked.
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
