//! One throwaway sandbox per job: job dirs, overlay, OCI spec, libcontainer (in a
//! single-threaded helper process), teardown and gc.

pub mod cachemount;
pub mod cgroup;
pub mod console;
pub mod container;
pub mod editlayer;
pub mod exec;
pub mod helper;
pub mod init;
pub mod inroot;
pub mod jobdir;
pub mod limits;
pub mod network;
pub mod plan;
pub mod report;
pub mod runner;
pub mod seccomp;
pub mod spec;
pub mod teardown;
pub mod treemount;

pub use limits::{Ask, LimitsAsk};
pub use plan::{JobPlan, Limits, ScratchDir};
pub use report::{FailureKind, SandboxError};
pub use runner::{run_job, wait_for_background_cleanups, EarlyHelper, JobOutcome, Phase, RunOptions, Sandbox};
pub use teardown::{gc, gc_all, gc_before_job, GcReport};

use crate::config::Home;

/// What a verb that runs sandboxes (`exec`, `run`) does to its home once at start: the
/// home's dirs, and as root the tmpfs that holds the job records
/// ([`crate::sys::runtime_tmpfs`]).
pub fn prepare_home(home: &Home) -> anyhow::Result<()> {
    home.ensure()?;
    prepare_runtime_tmpfs(home)?;
    if !matches!(crate::identity::mode()?, crate::identity::Mode::Host) {
        use anyhow::Context;
        let point = home.mount_point();
        check_reachable(&point)
            .with_context(|| format!("jobs run as ids of their own, which cannot reach {}", point.display()))?;
    }
    Ok(())
}

/// Of [`prepare_home`], the tmpfs alone (as root; nothing otherwise): for what must be
/// on it before the verb prepares its home (a setuid exec's seat, before `exec`'s own
/// start prepares the rest).
pub fn prepare_runtime_tmpfs(home: &Home) -> anyhow::Result<()> {
    if let Some(dir) = home.runtime_tmpfs_dir() {
        crate::sys::runtime_tmpfs::ensure(&dir)?;
    }
    Ok(())
}

pub use crate::config::check_reachable;

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_path_is_reachable_when_every_dir_above_it_is_searchable() {
        let t = tempfile::tempdir().unwrap();
        let deep = t.path().join("a/b/c");
        std::fs::create_dir_all(&deep).unwrap();
        for d in [t.path().to_path_buf(), t.path().join("a"), t.path().join("a/b")] {
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o711)).unwrap();
        }
        check_reachable(&deep.join("file")).unwrap();
        std::fs::set_permissions(t.path().join("a"), std::fs::Permissions::from_mode(0o750)).unwrap();
        let e = check_reachable(&deep.join("file")).unwrap_err().to_string();
        let a = t.path().join("a");
        assert!(
            e.starts_with(&format!(
                "{} (mode 750) is not searchable by others: `chmod o+x {}`",
                a.display(),
                a.display()
            )),
            "{e}"
        );
    }
}
