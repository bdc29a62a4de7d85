//! The dir where a job's cache overlays are mounted (see `sandbox::cachemount`).

use super::error::{Error, Result};
use std::path::Path;

/// A tiny tmpfs (0755) on `dir`, in the helper's private mount namespace: libcontainer
/// binds each cache from below it as the job's root, which, in a user namespace of its
/// own, could not pass the private record dir.
pub fn mount_cache_dir(dir: &Path) -> Result<()> {
    use nix::mount::{mount, MsFlags};
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("azp-sandbox-caches"), dir, Some("tmpfs"), flags, Some("mode=0755,size=64k"))
        .map_err(|source| Error::MountCacheDir { dir: dir.to_path_buf(), source })
}
