//! One throwaway sandbox per job: job dirs, overlay, OCI spec, libcontainer (in a
//! single-threaded helper process), teardown and gc.

pub mod cgroup;
pub mod container;
pub mod editlayer;
pub mod exec;
pub mod helper;
pub mod inroot;
pub mod jobdir;
pub mod plan;
pub mod report;
pub mod runner;
pub mod seccomp;
pub mod spec;
pub mod teardown;

pub use plan::{JobPlan, Limits, ScratchDir};
pub use report::{FailureKind, SandboxError};
pub use runner::{run_job, wait_for_background_cleanups, JobOutcome, Phase, RunOptions, Sandbox};
pub use teardown::{gc, gc_all, gc_before_job, GcReport};

use crate::config::Home;

/// What a verb that runs sandboxes (`exec`, `run`) does to its home once at start: the
/// home's dirs, and as root the tmpfs that holds the job records
/// ([`crate::sys::runtime_tmpfs`]).
pub fn prepare_home(home: &Home) -> anyhow::Result<()> {
    home.ensure()?;
    if let Some(dir) = home.runtime_tmpfs_dir() {
        crate::sys::runtime_tmpfs::ensure(&dir)?;
    }
    Ok(())
}
