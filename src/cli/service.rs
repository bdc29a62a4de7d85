//! `azp-sandbox service`: install azp-sandbox as a systemd service.

use super::{Context, Verb};
use anyhow::Result;
use clap::Subcommand;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum ServiceCommand {
    /// Write a systemd unit running `azp-sandbox run` with the given settings file
    Install {
        /// Where to write the unit
        #[arg(long, default_value = "/etc/systemd/system")]
        unit_dir: PathBuf,
        #[arg(long, default_value = "azp-sandbox")]
        name: String,
        /// Settings file the service reads
        #[arg(long, default_value = "/etc/azp-sandbox/config.toml")]
        config: PathBuf,
    },
}

impl Verb for ServiceCommand {
    fn run(self: Box<Self>, ctx: &Context) -> Result<i32> {
        let ServiceCommand::Install { unit_dir, name, config } = *self;
        let path = azp_sandbox::manager::service::install(&unit_dir, &name, &config, &ctx.home)?;
        println!("wrote {}; now: systemctl daemon-reload && systemctl enable --now {name}", path.display());
        Ok(0)
    }
}
