//! How many sandboxes one caller keeps at once in setuid mode (`[setuid] max_jobs`): a
//! seat per sandbox (`exec`: one; `run`: one per agent slot), each a lock file the
//! caller's privileged process holds for its life. The kernel lets the locks go when it
//! ends, however it ends, so a seat is never left taken by a dead process.
//!
//! Without a cap, one permitted user's concurrent `exec`s took every job id block of the
//! host (1024, shared with the root `run` service and the other users), and no job of
//! anyone else could start until they ended (found by a red-team pass).

use anyhow::{bail, Context, Result};
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

/// Where the seats are (root-only, per boot): `<uid>/<k>.lock`.
pub const SEATS_DIR: &str = "/run/azp-sandbox/setuid-seats";

/// Sandboxes a caller keeps at once when the policy says nothing.
pub const DEFAULT_MAX_JOBS: usize = 4;

/// The seats taken; dropped (or the process gone), they are free again.
#[derive(Debug)]
pub struct Seats {
    _locks: Vec<nix::fcntl::Flock<std::fs::File>>,
}

/// Takes `want` of caller `uid`'s `max` seats in `dir` (on the runtime tmpfs: the caller
/// prepares it first, see `sandbox::prepare_runtime_tmpfs`), or says how many the caller holds
/// already.
pub fn take(dir: &Path, uid: u32, want: usize, max: usize) -> Result<Seats> {
    let mine = dir.join(uid.to_string());
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&mine)
        .with_context(|| format!("cannot make {}", mine.display()))?;
    let mut held = Vec::new();
    for k in 0..max {
        if held.len() == want {
            break;
        }
        held.extend(crate::lock_file::try_lock(&mine.join(format!("{k}.lock")))?);
    }
    if held.len() < want {
        let running = max - held.len();
        bail!(
            "you run {running} sandbox(es) already and this needs {want} more: the site allows {max} at once per user \
             ([setuid] max_jobs); wait for one to end"
        );
    }
    Ok(Seats { _locks: held })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_gets_at_most_max_seats_and_a_seat_let_go_is_free_again() {
        let t = tempfile::tempdir().unwrap();
        let a = take(t.path(), 1000, 1, 2).unwrap();
        let b = take(t.path(), 1000, 1, 2).unwrap();
        let e = take(t.path(), 1000, 1, 2).unwrap_err().to_string();
        assert!(e.contains("you run 2 sandbox(es) already") && e.contains("max_jobs"), "{e}");
        // Another caller has seats of its own.
        let _other = take(t.path(), 1001, 2, 2).unwrap();
        drop(a);
        let _c = take(t.path(), 1000, 1, 2).unwrap();
        drop(b);
        // `run` asks for one per agent, all or nothing.
        let e = take(t.path(), 1000, 2, 2).unwrap_err().to_string();
        assert!(e.contains("you run 1 sandbox(es) already and this needs 2 more"), "{e}");
    }
}
