//! One manager per home: `run` (and `slurm`) hold an exclusive `flock` on a file in the
//! home for their whole life, with their pid written in it. Two managers on one home would
//! run the same agent names and job dirs against each other; the second is refused in one
//! line naming the pid that holds the home. The kernel drops the lock when the holder
//! dies, so a crashed run never blocks the next one.

use crate::config::Home;
use anyhow::{bail, Context, Result};
use nix::fcntl::{Flock, FlockArg};
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::PathBuf;

/// Held while the manager runs; dropping it (or dying) releases the home.
#[derive(Debug)]
pub struct HomeLock {
    _file: Flock<File>,
}

/// The lock file of `verb` (`run` or `slurm`) in this home.
pub fn path(home: &Home, verb: &str) -> PathBuf {
    home.root().join(format!("{verb}.lock"))
}

/// Takes the home for `verb`, or fails naming the pid that holds it.
pub fn acquire(home: &Home, verb: &str) -> Result<HomeLock> {
    let path = path(home, verb);
    home.ensure()?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("cannot open the lock file {}", path.display()))?;
    let mut file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(f) => f,
        Err((mut f, nix::errno::Errno::EWOULDBLOCK)) => {
            let mut pid = String::new();
            let _ = f.read_to_string(&mut pid);
            let pid = match pid.trim() {
                "" => "unknown".to_string(),
                p => p.to_string(),
            };
            bail!(
                "another `azp-sandbox {verb}` (pid {pid}) already runs with the home {}: stop it first, or give this one its own --home",
                home.root().display()
            )
        }
        Err((_, e)) => bail!("cannot lock {}: {e}", path.display()),
    };
    file.set_len(0).and_then(|_| file.rewind()).with_context(|| format!("cannot write {}", path.display()))?;
    write!(file, "{}", std::process::id()).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(HomeLock { _file: file })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_with_the_pid_then_the_home_is_free_again() {
        let tmp = tempfile::tempdir().unwrap();
        let home = Home::new(tmp.path().join("home"));
        let first = acquire(&home, "run").unwrap();
        let text = std::fs::read_to_string(path(&home, "run")).unwrap();
        assert_eq!(text, std::process::id().to_string());
        // flock locks belong to the open file: a second open in this process conflicts.
        let e = acquire(&home, "run").unwrap_err().to_string();
        assert!(e.contains(&format!("(pid {})", std::process::id())) && e.contains("--home"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        let slurm = acquire(&home, "slurm").expect("slurm has its own lock");
        drop(first);
        let again = acquire(&home, "run").expect("free after the holder is gone");
        drop((again, slurm));
    }
}
