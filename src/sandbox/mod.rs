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

pub use plan::{JobPlan, Limits};
pub use report::{FailureKind, SandboxError};
pub use runner::{run_job, JobOutcome, Phase, RunOptions, Sandbox};
pub use teardown::{gc, gc_all, gc_before_job, GcReport};
