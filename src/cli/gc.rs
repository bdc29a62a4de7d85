//! `azp-sandbox gc`: remove what crashed runs left behind.

use super::{Context, Needs, Verb};
use anyhow::{bail, Result};

#[derive(clap::Args)]
pub struct GcArgs {
    /// Also remove the failed jobs kept by `run --keep-failed` (HOME/failed)
    #[arg(long)]
    failed: bool,
}

impl Verb for GcArgs {
    fn needs(&self) -> Needs {
        Needs::Namespace
    }

    fn run(self: Box<Self>, ctx: &Context) -> Result<i32> {
        let mut report = azp_sandbox::sandbox::gc_all(&ctx.home)?;
        if self.failed {
            report.removed.extend(azp_sandbox::manager::failed::remove_all(&ctx.home)?);
        }
        report.log();
        if !report.failed.is_empty() {
            bail!("gc could not remove {} item(s) (see warnings above)", report.failed.len());
        }
        tracing::info!("gc: {} item(s) removed, {} live job(s) untouched", report.removed.len(), report.live_jobs);
        Ok(0)
    }
}
