//! `azp-sandbox gpu`: the GPUs and driver files a sandbox would get.

use super::{Context, Verb};
use anyhow::Result;
use azp_sandbox::gpu::{self, Capabilities, DiscoverOptions};
use clap::Subcommand;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum GpuCommand {
    /// Driver and CUDA version, GPUs, every file and device node with its source
    #[command(after_help = "Examples:
  azp-sandbox gpu list
  azp-sandbox gpu list --capabilities all --json")]
    List {
        /// Print JSON instead of the report
        #[arg(long)]
        json: bool,
        /// Driver capabilities, as NVIDIA_DRIVER_CAPABILITIES
        #[arg(long, default_value = "compute,utility")]
        capabilities: Capabilities,
        /// Also read this CDI spec (besides /etc/cdi and /var/run/cdi)
        #[arg(long)]
        cdi_spec: Option<PathBuf>,
    },
}

impl Verb for GpuCommand {
    fn run(self: Box<Self>, ctx: &Context) -> Result<i32> {
        let GpuCommand::List { json, capabilities, cdi_spec } = *self;
        let opts = DiscoverOptions { driver_root: ctx.driver_root.clone(), cdi_spec, ..Default::default() };
        let report = gpu::list(&opts, &capabilities)?;
        if json {
            println!("{}", report.to_json());
        } else {
            print!("{report}");
        }
        Ok(0)
    }
}
