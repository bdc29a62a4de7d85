//! The root-mode runtime dir (`/run/azp-sandbox`) on a tmpfs.
//!
//! `/run` is a tmpfs on a normal host, but not in some containers and VMs (this
//! project's CI VM: `/run` is a plain dir on an ext4 mounted `discard` without a journal).
//! Every job creates and deletes a dozen small records there; on such a disk each freed
//! block is a synchronous discard (~0.4 ms each, ~4 ms per job measured). So, as root and
//! only then, a small tmpfs is mounted at `/run/azp-sandbox` once, as logind does for
//! `/run/user/UID`. It stays mounted: it holds the records of every home on the host.

use super::error::{Error, Result};
use std::path::Path;

/// Room for the records of some thousand jobs (a few KiB each).
const SIZE: &str = "64m";

/// Makes `dir` (mode 0711) and, unless it already is on a tmpfs, mounts one there.
pub fn ensure(dir: &Path) -> Result<()> {
    create_dir(dir)?;
    if on_tmpfs(dir)? {
        return Ok(());
    }
    // Two starts at once: the flock is on the dir under the mount point, so the second
    // waits here, then sees the first one's tmpfs and leaves it alone.
    let _lock = lock(dir)?;
    if on_tmpfs(dir)? {
        return Ok(());
    }
    super::mount::mount_tmpfs(dir, SIZE)?;
    tracing::info!("mounted a {SIZE} tmpfs at {} for job records (the host's /run is not a tmpfs)", dir.display());
    Ok(())
}

fn create_dir(dir: &Path) -> Result<()> {
    let mut b = std::fs::DirBuilder::new();
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o711);
    b.recursive(true).create(dir).map_err(|source| Error::CreateRuntimeDir { dir: dir.to_path_buf(), source })
}

fn on_tmpfs(dir: &Path) -> Result<bool> {
    let st = nix::sys::statfs::statfs(dir).map_err(|source| Error::Statfs { path: dir.to_path_buf(), source })?;
    Ok(st.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
}

fn lock(dir: &Path) -> Result<nix::fcntl::Flock<std::fs::File>> {
    let locked = std::fs::File::open(dir)
        .map_err(|e| super::error::errno_of(&e))
        .and_then(|f| nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| e));
    locked.map_err(|source| Error::Lock { path: dir.to_path_buf(), source })
}
