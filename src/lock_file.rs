//! Lock files held for a process's life: a private file (mode 0600, never opened through
//! a symlink) locked exclusively without waiting. The kernel lets the lock go when the
//! holder ends, however it ends. Setuid callers' seats (`setuid::seats`) and the leases
//! of job id blocks (`identity::lease`) are such files.

use anyhow::{Context, Result};
use nix::fcntl::{Flock, FlockArg};
use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// `path` (made if missing, kept as it is) locked by this process; None: another holds it.
pub fn try_lock(path: &Path) -> Result<Option<Flock<File>>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(f) => Ok(Some(f)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(e).with_context(|| format!("cannot lock {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_is_refused_then_free_once_dropped_and_a_symlink_is_not_followed() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("a.lock");
        let held = try_lock(&path).unwrap().expect("free");
        assert!(try_lock(&path).unwrap().is_none(), "held");
        drop(held);
        assert!(try_lock(&path).unwrap().is_some(), "free again");
        let link = t.path().join("link.lock");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let e = format!("{:#}", try_lock(&link).unwrap_err());
        assert!(e.starts_with(&format!("cannot open {}", link.display())), "{e}");
    }
}
