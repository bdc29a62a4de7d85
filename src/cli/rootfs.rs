//! `azp-sandbox rootfs`: the root filesystems (the read-only lower layers of sandboxes)
//! in the store: import, list, rm, pull, build.

use super::{Context, Needs, Verb};
use anyhow::{Context as _, Result};
use azp_sandbox::agent::preflight::{self, Readiness, UserRule};
use azp_sandbox::config::Home;
use azp_sandbox::rootfs::{RootfsInfo, Store};
use clap::Subcommand;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum RootfsCommand {
    /// Unpack a rootfs tarball (tar, tar.gz, tar.zst; detected by content) into the store
    #[command(after_help = "Examples:
  azp-sandbox rootfs import cuda-12.4.tar.zst            # named cuda-12.4
  docker export $(docker create IMAGE) | azp-sandbox rootfs import - --name mine")]
    Import {
        /// Archive file (tar, tar.gz, tar.zst, a `docker save` archive or an OCI layout
        /// dir), or - for standard input
        file: PathBuf,
        /// Rootfs name [default: the file name without .tar/.tar.gz/.tar.zst/.tgz;
        /// required with -]
        #[arg(long)]
        name: Option<String>,
    },
    /// List imported root filesystems
    #[command(after_help = "Examples:
  azp-sandbox rootfs list
  azp-sandbox rootfs list --json | jq -r '.[].name'")]
    List {
        /// Print JSON (one object per rootfs) instead of a table
        #[arg(long)]
        json: bool,
    },
    /// Remove a root filesystem (refused while a sandbox uses it)
    #[command(after_help = "Example:
  azp-sandbox rootfs rm debian-bookworm-minbase")]
    Rm {
        /// Rootfs name, as `azp-sandbox rootfs list` shows it
        name: String,
    },
    /// Pull an image from an OCI/Docker registry into the store (no Docker needed)
    #[command(after_help = "Examples:
  azp-sandbox rootfs pull nvidia/cuda:12.4.1-runtime-ubuntu22.04
  azp-sandbox rootfs pull registry.example.com/team/ci:2024 --name ci --auth-file ~/auth.json")]
    Pull {
        /// [REGISTRY/]REPO[:TAG][@sha256:DIGEST], e.g. nvidia/cuda:12.4.1-runtime-ubuntu22.04
        reference: String,
        /// Rootfs name [default: REPO-TAG, e.g. nvidia-cuda-12.4.1-runtime-ubuntu22.04]
        #[arg(long)]
        name: Option<String>,
        /// OS/ARCH[/VARIANT] to take from a multi-platform image [default: this host's]
        #[arg(long)]
        platform: Option<String>,
        /// Registry credentials, Docker config.json format [default: $REGISTRY_AUTH_FILE, ~/.docker/config.json]
        #[arg(long)]
        auth_file: Option<PathBuf>,
        /// Plain http (localhost / 127.x registries only)
        #[arg(long)]
        insecure: bool,
    },
    /// Build a rootfs from a recipe with debootstrap + apt (no Docker), e.g. debian-trixie-cuda12.4
    #[command(after_help = "Examples:
  azp-sandbox rootfs build --list
  sudo azp-sandbox rootfs build debian-bookworm-minbase     # ~1 min, no CUDA
  sudo azp-sandbox rootfs build debian-trixie-cuda12.4 --mirror http://mirror.example/debian")]
    Build {
        /// Recipe: a .toml file, or a name from rootfs-recipes/ (/etc/azp-sandbox/rootfs-recipes, next to the binary, /usr/share/azp-sandbox/rootfs-recipes, built in)
        #[arg(required_unless_present = "list")]
        recipe: Option<String>,
        /// List the recipes (name and what it builds) and exit
        #[arg(long, conflicts_with_all = ["recipe", "name", "mirror", "cache_dir", "keep_cache"])]
        list: bool,
        /// Rootfs name [default: the recipe's name]
        #[arg(long)]
        name: Option<String>,
        /// Distribution mirror instead of the recipe's, e.g. http://mirror.example/debian
        #[arg(long)]
        mirror: Option<String>,
        /// Where downloaded .debs are kept for the next build [default: HOME/cache/apt]
        #[arg(long)]
        cache_dir: Option<PathBuf>,
        /// Keep apt's package lists in the rootfs (jobs can apt-get install without apt-get update)
        #[arg(long)]
        keep_cache: bool,
    },
}

impl Verb for RootfsCommand {
    fn needs(&self) -> Needs {
        match self {
            // Reads recipes only: no store, so no user namespace to enter.
            RootfsCommand::Build { list: true, .. } => Needs::Mode,
            _ => Needs::Namespace,
        }
    }

    fn run(self: Box<Self>, ctx: &Context) -> Result<i32> {
        let home = &ctx.home;
        let store = Store::new(home);
        match *self {
            RootfsCommand::Import { file, name } => {
                let name = match name {
                    Some(n) => n,
                    None if file.as_os_str() == "-" => {
                        anyhow::bail!("reading the rootfs from standard input: give it a name with --name NAME")
                    }
                    None => azp_sandbox::rootfs::name_from_file(&file)?,
                };
                import(home, &store, file, &name)?
            }
            RootfsCommand::List { json } => list(&store, json)?,
            RootfsCommand::Pull { reference, name, platform, auth_file, insecure } => {
                home.ensure()?;
                let opts = azp_sandbox::rootfs::oci::PullOptions {
                    reference,
                    name,
                    platform,
                    auth_file,
                    insecure,
                    ..Default::default()
                };
                let report = azp_sandbox::rootfs::oci::pull(&store, &home.cache_dir(), &opts)?;
                tracing::info!("{}", report.summary("pulled"));
            }
            RootfsCommand::Build { list: true, .. } => list_recipes(),
            RootfsCommand::Build { recipe, name, mirror, cache_dir, keep_cache, .. } => {
                let recipe = recipe.expect("clap: required unless --list");
                cancel_import_on_signals();
                let report =
                    azp_sandbox::rootfs::recipe::build_command(home, &recipe, name, mirror, cache_dir, keep_cache)?;
                tracing::info!("{}", report.summary());
            }
            RootfsCommand::Rm { name } => {
                store.remove(&name)?;
                tracing::info!("removed rootfs '{name}'");
                // The GPU edit layers built over it are of no use any more.
                for r in azp_sandbox::sandbox::editlayer::prune(home) {
                    tracing::info!("removed {r}");
                }
            }
        }
        Ok(0)
    }
}

/// `rootfs build --list`: one line per recipe, its name and what it builds.
fn list_recipes() {
    let recipes = azp_sandbox::rootfs::recipe::list();
    let width = recipes.iter().map(|(n, ..)| n.len()).max().unwrap_or(0);
    for (name, description, _) in recipes {
        println!("{name:<width$}  {description}");
    }
}

/// A tarball (file or stdin) or a local OCI layout / `docker save` archive.
fn import(home: &Home, store: &Store, file: PathBuf, name: &str) -> Result<()> {
    home.ensure()?;
    if let Some(img) = azp_sandbox::rootfs::oci::detect_local(&file)? {
        let report = azp_sandbox::rootfs::oci::import_local(store, &img, name, &Default::default())?;
        tracing::info!("{}", report.summary("imported"));
        return Ok(());
    }
    let mut input: Box<dyn std::io::Read> = if file.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(std::fs::File::open(&file).with_context(|| format!("cannot open {}", file.display()))?)
    };
    let mut progress = azp_sandbox::progress::Progress::new(&format!("importing {name}"));
    cancel_import_on_signals();
    let label = if file.as_os_str() == "-" { "stdin".to_string() } else { file.display().to_string() };
    let info = store.import_labeled(&mut input, name, &label, &mut |n| progress.update(n))?;
    progress.finish();
    tracing::info!(
        "imported rootfs '{}': {} entries, {:.1} MB{}",
        info.name,
        info.entries,
        info.size_bytes as f64 / 1e6,
        info.arch.as_deref().map(|a| format!(", {a}")).unwrap_or_default()
    );
    Ok(())
}

/// One row of `rootfs list`: what the store recorded, and whether the rootfs can run the
/// Azure Pipelines agent (checked now, on the tree: see `agent::preflight`).
#[derive(serde::Serialize)]
struct Listed {
    #[serde(flatten)]
    info: RootfsInfo,
    agent: Readiness,
}

fn list(store: &Store, json: bool) -> Result<()> {
    let rule = UserRule::Rootfs { allow_root: false };
    let list: Vec<Listed> = store
        .list()?
        .into_iter()
        .map(|info| Listed { agent: preflight::check(&info.path, &preflight::Needs::real_agent(), rule), info })
        .collect();
    if json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    println!(
        "{:<24} {:>10} {:>9} {:<8} {:<6} {:<20} {:<40} AGENT",
        "NAME", "SIZE", "ENTRIES", "ARCH", "CUDA", "IMPORTED", "SOURCE"
    );
    for Listed { info: r, agent } in list {
        println!(
            "{:<24} {:>9.1}M {:>9} {:<8} {:<6} {:<20} {:<40} {}",
            r.name,
            r.size_bytes as f64 / 1e6,
            r.entries,
            r.arch.as_deref().unwrap_or("-"),
            r.cuda_version.as_deref().unwrap_or("-"),
            r.imported_at,
            r.source,
            agent.column()
        );
    }
    Ok(())
}

/// Ctrl-C / SIGTERM during an import: stop at the next entry and remove the temp dir
/// (instead of dying and leaving it to gc).
fn cancel_import_on_signals() {
    use azp_sandbox::sys::Signal;
    azp_sandbox::sys::signals::set_flag_on(&[Signal::SIGINT, Signal::SIGTERM], &azp_sandbox::rootfs::CANCEL);
}
