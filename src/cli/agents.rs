//! `azp-sandbox agents`: this host's agent records in the pool.

use super::args::PoolArgs;
use super::{Context, Verb};
use anyhow::Result;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum AgentsCommand {
    /// Delete this host's offline agent records (<prefix>-N) from the pool
    #[command(after_help = "Examples:
  azp-sandbox agents prune --config /etc/azp-sandbox/config.toml
  AZP_TOKEN_FILE=~/pat azp-sandbox agents prune --url https://dev.azure.com/ORG --pool gpu")]
    Prune(PoolArgs),
}

impl Verb for AgentsCommand {
    fn run(self: Box<Self>, _: &Context) -> Result<i32> {
        let AgentsCommand::Prune(pool) = *self;
        let (settings, env_token) = pool.settings(pool.flags())?;
        let removed = azp_sandbox::manager::prune_command(&settings, env_token)?;
        tracing::info!(
            "removed {} offline agent record(s){}",
            removed.len(),
            if removed.is_empty() { String::new() } else { format!(": {}", removed.join(", ")) }
        );
        Ok(0)
    }
}
