//! azp-sandbox: one throwaway sandbox per Azure Pipelines job.
//!
//! Data flow of one job (each stage is a module):
//! `config` -> `rootfs` (pick the lower layer) -> `gpu` (driver files, device nodes,
//! as [`edits::ContainerEdits`]) -> `sandbox` (job dirs, overlay, OCI spec,
//! libcontainer in a single-threaded helper, teardown, gc), with `identity` deciding
//! which host ids each job runs as (its own user namespace and block of ids).
//! Privileged syscalls live in `sys` behind a narrow interface.
//!
//! Around it: `settings` turns the config file, the AZP_* environment and the flags
//! into each verb's validated settings; `manager` (`run`), `slurm` and `setuid` drive
//! sandboxes with them; `check` validates all of it before `run` (and on its own); the command line itself (one file per verb) is the binary's
//! `src/cli/`.

pub mod agent;
pub mod azure;
pub mod cache;
pub mod check;
pub mod clock;
pub mod config;
pub mod digest;
pub mod edits;
pub mod gpu;
pub mod http;
pub mod identity;
pub mod json_file;
pub mod lock_file;
pub mod logging;
pub mod manager;
pub mod mirror;
pub mod progress;
pub mod rootfs;
pub mod rootless;
pub mod sandbox;
pub mod scaler;
pub mod settings;
pub mod setuid;
pub mod slurm;
pub mod sys;

/// Visible skips for unit tests that cannot run here (shared with the integration tests).
#[cfg(test)]
#[path = "../tests/common/skip.rs"]
mod test_skip;
