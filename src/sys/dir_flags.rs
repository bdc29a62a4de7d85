//! Inode flags of directories (`chattr`), through the FS_IOC_GETFLAGS/SETFLAGS ioctls.

use std::os::fd::AsRawFd;
use std::path::Path;

/// `chattr +T` (linux/fs.h; libc does not name it).
pub(crate) const FS_TOPDIR_FL: libc::c_long = 0x0002_0000;

/// The inode flags of the open file `f`.
pub(crate) fn flags(f: &std::fs::File) -> std::io::Result<libc::c_long> {
    let mut flags: libc::c_long = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one long into `flags`, a live local borrowed
    // mutably for the call; the result is checked.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(flags)
}

/// Marks `dir` as the top of a directory hierarchy for ext4's Orlov allocator
/// (`chattr +T`): its subdirs, the buckets of the jobs' layer dirs (see
/// [`crate::config::Home::job_layers_dir`]), are spread over the block groups instead of
/// packed next to each other. A job starting while the previous one's tens of
/// thousands of files are deleted then allocates its inodes in another group, instead
/// of waiting for the same inode bitmap and table blocks to be written back (seen in the
/// refill after big jobs). Best effort: other filesystems ignore or refuse it.
pub fn spread_subdirs(dir: &Path) {
    let Ok(f) = std::fs::File::open(dir) else { return };
    let Ok(mut flags) = flags(&f) else { return };
    if flags & FS_TOPDIR_FL != 0 {
        return;
    }
    flags |= FS_TOPDIR_FL;
    // SAFETY: FS_IOC_SETFLAGS reads one long from `flags`, a live local borrowed for the
    // call. Its result is ignored on purpose: a filesystem without the flag keeps
    // allocating as before, which is only slower.
    let _ = unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_SETFLAGS, &flags) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_dirs_are_spread_on_ext4() {
        let dir = tempfile::tempdir().unwrap();
        spread_subdirs(dir.path());
        let fs = nix::sys::statfs::statfs(dir.path()).unwrap();
        if fs.filesystem_type() != nix::sys::statfs::EXT4_SUPER_MAGIC {
            return crate::test_skip::skip(format!("{} is not on ext4", dir.path().display()));
        }
        let f = std::fs::File::open(dir.path()).unwrap();
        assert_ne!(flags(&f).unwrap() & FS_TOPDIR_FL, 0, "FS_TOPDIR_FL (chattr +T) is set");
        spread_subdirs(dir.path()); // again: a no-op
    }
}
