//! `azp-sandbox cache ls|rm|gc`: the home's named caches (see docs/caches.md).

use super::{Context, Needs, Verb};
use anyhow::Result;
use azp_sandbox::cache::store;
use azp_sandbox::sandbox::limits::human_size;

#[derive(clap::Subcommand)]
pub enum CacheCommand {
    /// List the caches: size, snapshot, age, last committer job, hits
    #[command(after_help = "Examples:
  azp-sandbox cache ls
  azp-sandbox cache ls --json")]
    Ls {
        /// One JSON object per cache instead of a table
        #[arg(long)]
        json: bool,
    },
    /// Empty a cache: new jobs start cold at once; running jobs keep what they have
    #[command(after_help = "Example:
  sudo azp-sandbox cache rm pip")]
    Rm {
        /// The cache's name (`cache ls`)
        name: String,
    },
    /// Remove snapshots no job uses any more, and what killed commits left
    #[command(after_help = "Example:
  sudo azp-sandbox cache gc")]
    Gc,
}

impl Verb for CacheCommand {
    fn needs(&self) -> Needs {
        Needs::Namespace
    }

    fn run(self: Box<Self>, ctx: &Context) -> Result<i32> {
        match *self {
            CacheCommand::Ls { json } => {
                let all = store::summaries(&ctx.home);
                if json {
                    for s in &all {
                        println!("{}", serde_json::to_string(s)?);
                    }
                    return Ok(0);
                }
                if all.is_empty() {
                    println!(
                        "no caches in {} (declare them with [[cache]] or exec --cache)",
                        ctx.home.root().display()
                    );
                    return Ok(0);
                }
                print!("{}", store::render(&all));
            }
            CacheCommand::Rm { name } => {
                let swept = store::remove(&ctx.home, &name)?;
                tracing::info!(
                    "cache {name} removed ({} snapshot(s), {} freed; snapshots running jobs hold go with `cache gc` after them)",
                    swept.snapshots,
                    human_size(swept.bytes)
                );
            }
            CacheCommand::Gc => {
                let mut total = store::sweep_removed(&ctx.home)?;
                for name in store::names(&ctx.home) {
                    let s = store::gc(&store::dir(&ctx.home, &name))?;
                    total.snapshots += s.snapshots;
                    total.bytes += s.bytes;
                }
                tracing::info!("cache gc: {} snapshot(s) removed, {} freed", total.snapshots, human_size(total.bytes));
            }
        }
        Ok(0)
    }
}
