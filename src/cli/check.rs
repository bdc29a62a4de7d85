//! `azp-sandbox check`: `run`'s whole configuration, checked without starting anything
//! (see `azp_sandbox::check`). Takes `run`'s flags; `run --check` is the same.

use super::{Context, Needs, Verb};
use anyhow::Result;

#[derive(clap::Args)]
pub struct CheckArgs {
    /// Only the checks on this host: no call to Azure DevOps
    #[arg(long)]
    local: bool,
    #[command(flatten)]
    run: super::run::RunArgs,
}

impl Verb for CheckArgs {
    fn needs(&self) -> Needs {
        // As `run`: the same mode, namespace and cgroups, so the same verdicts.
        Needs::Service
    }

    fn run(self: Box<Self>, ctx: &Context) -> Result<i32> {
        self.run.check(ctx, self.local)
    }
}
