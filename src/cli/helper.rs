//! `azp-sandbox __sandbox-helper JOB_DIR` (hidden): the single-threaded helper that owns
//! one sandbox, started by `exec` and `run` (see `azp_sandbox::sandbox::helper`).

use super::{Context, Needs, Verb};
use anyhow::Result;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct HelperArgs {
    job_dir: PathBuf,
}

impl Verb for HelperArgs {
    /// Its parent set up the mode and the namespaces; the helper only logs and runs.
    fn needs(&self) -> Needs {
        Needs::Nothing
    }

    fn run(self: Box<Self>, ctx: &Context) -> Result<i32> {
        Ok(azp_sandbox::sandbox::helper::main(&ctx.home, &self.job_dir))
    }
}
