//! `azp-sandbox service`: install azp-sandbox as a systemd service.

use super::{Context, Verb};
use anyhow::Result;
use azp_sandbox::manager::service;
use clap::Subcommand;
use std::path::PathBuf;

#[derive(Subcommand)]
#[command(after_help = "Example:
  sudo azp-sandbox service install && sudo systemctl enable --now azp-sandbox")]
pub enum ServiceCommand {
    /// Write a systemd unit running `azp-sandbox run` with the given settings file
    #[command(after_help = "Examples:
  azp-sandbox service install --dry-run                 # print the unit, write nothing
  sudo azp-sandbox service install
  sudo azp-sandbox service install --name azp-gpu --config /etc/azp-sandbox/gpu.toml")]
    Install {
        /// Where to write the unit; - prints it to standard output (as --dry-run)
        #[arg(long, default_value = "/etc/systemd/system")]
        unit_dir: PathBuf,
        /// Service name: the unit is NAME.service (several pools on one host need one each)
        #[arg(long, default_value = "azp-sandbox")]
        name: String,
        /// Settings file the service reads
        #[arg(long, default_value = "/etc/azp-sandbox/config.toml")]
        config: PathBuf,
        /// Print the unit instead of writing it (nothing is changed)
        #[arg(long)]
        dry_run: bool,
    },
}

impl Verb for ServiceCommand {
    fn run(self: Box<Self>, ctx: &Context) -> Result<i32> {
        let ServiceCommand::Install { unit_dir, name, config, dry_run } = *self;
        let path = service::unit_path(&unit_dir, &name)?;
        let exe = service::current_exe()?;
        if let Some(w) = service::build_tree_warning(&exe) {
            tracing::warn!("{w}");
        }
        if dry_run || unit_dir.as_os_str() == "-" {
            if unit_dir.as_os_str() != "-" {
                eprintln!("# would write {}", path.display());
            }
            print!("{}", service::unit_text(&exe, &config, &ctx.home));
            return Ok(0);
        }
        let path = service::install(&unit_dir, &name, &config, &ctx.home)?;
        println!("wrote {}; now: systemctl daemon-reload && systemctl enable --now {name}", path.display());
        Ok(0)
    }
}
