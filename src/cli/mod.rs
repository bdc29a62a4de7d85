//! The command line, as youki's `commands/`: the top-level parser with the global
//! options here, one file per verb (its flags and what it runs), and what every verb
//! gets before it runs (logging, root or rootless mode, the home).
//!
//! Adding a verb: a file `src/cli/<verb>.rs` with its flags (clap) and an impl of
//! [`Verb`]; here, its `mod` line, a variant of [`Command`] (its doc comment is the help
//! line) and its arm in [`Command::into_verb`].

mod agents;
mod args;
mod cache;
mod check;
mod exec;
mod gc;
mod gpu;
mod helper;
mod rootfs;
mod run;
mod service;
pub mod setuid;
mod shell;
mod slurm;
mod status;

use anyhow::Result;
use azp_sandbox::config::Home;
use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};

#[derive(Parser)]
#[command(
    name = "azp-sandbox",
    version,
    about = "Self-hosted Azure Pipelines agents, one fresh sandbox per job",
    after_help = "Examples:
  sudo azp-sandbox rootfs build debian-bookworm-minbase      # a small rootfs, ~1 min
  sudo azp-sandbox shell --rootfs debian-bookworm-minbase    # a throwaway shell in it
  sudo azp-sandbox run --config /etc/azp-sandbox/config.toml # the agent pool

Each command has its own examples: azp-sandbox COMMAND --help",
    next_help_heading = "Global options (any command)"
)]
pub struct Cli {
    #[command(flatten)]
    globals: Globals,
    #[command(subcommand)]
    command: Command,
}

/// The options every verb takes, before or after its name.
#[derive(clap::Args)]
struct Globals {
    /// State directory (rootfs store, job dirs, caches) [env: AZP_SANDBOX_HOME]
    /// [default: /var/lib/azp-sandbox as root, $XDG_DATA_HOME/azp-sandbox otherwise]
    #[arg(long, global = true)]
    home: Option<PathBuf>,
    /// Root of the NVIDIA driver installation to inject (like nvidia-ctk --driver-root)
    #[arg(long, global = true, default_value = "/", env = "AZP_SANDBOX_DRIVER_ROOT")]
    driver_root: PathBuf,
    /// More logging (-v: debug, -vv: also libcontainer)
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Only warnings and errors
    #[arg(short, long, global = true)]
    quiet: bool,
    /// Parent of the jobs' cgroups [default: /azp-sandbox as root; rootless: the delegated
    /// /azp-sandbox/user-UID (cgroup v1) or user@UID.service/azp-sandbox (cgroup v2)]
    #[arg(long, global = true, env = "AZP_SANDBOX_CGROUP_PARENT")]
    cgroup_parent: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Keep N Azure Pipelines agent slots, one job per fresh sandbox (the main job)
    #[command(after_help = "Examples:
  sudo azp-sandbox run --config /etc/azp-sandbox/config.toml
  sudo azp-sandbox run --url https://dev.azure.com/ORG --pool gpu --token-file /etc/azp-sandbox/pat
  sudo azp-sandbox run --pool cpu --agents 4 --gpus-per-agent none --memory 8G")]
    Run(run::RunArgs),
    /// Check run's whole configuration (config, PAT, rootfs, GPUs, network, Azure): one line each
    #[command(after_help = "Examples:
  sudo azp-sandbox check --config /etc/azp-sandbox/config.toml
  azp-sandbox check --local --rootfs debian-bookworm-minbase    # no network call")]
    Check(check::CheckArgs),
    /// What a running `azp-sandbox run` is doing: slots, agents, jobs, GPUs, autoscaling
    #[command(after_help = "Examples:
  azp-sandbox status
  azp-sandbox status --json | jq .slots")]
    Status(status::StatusArgs),
    /// On a Slurm login node: submit batch jobs running agents while matching jobs wait
    #[command(after_help = "Example:
  azp-sandbox slurm --config ~/azp.toml --partition gpu --max-jobs 8 --sbatch-arg=--time=04:00:00")]
    Slurm(slurm::SlurmArgs),
    /// Manage this host's agent records in the pool
    #[command(
        subcommand,
        after_help = "Example:
  azp-sandbox agents prune --config /etc/azp-sandbox/config.toml"
    )]
    Agents(agents::AgentsCommand),
    /// Install azp-sandbox as a systemd service
    #[command(
        subcommand,
        after_help = "Example:
  sudo azp-sandbox service install --dry-run"
    )]
    Service(service::ServiceCommand),
    /// Run a command in a fresh, throwaway sandbox
    #[command(after_help = "Examples:
  sudo azp-sandbox exec --rootfs debian-bookworm-minbase -- cat /etc/os-release
  sudo azp-sandbox exec --rootfs auto --gpus all -- nvidia-smi
  sudo azp-sandbox exec --rootfs r --volume /data/imagenet:/data:DATA --memory 8G -- ./train.sh")]
    Exec(exec::ExecArgs),
    /// An interactive shell in a fresh, throwaway sandbox (exec -t of the rootfs's shell)
    #[command(after_help = "Examples:
  sudo azp-sandbox shell --rootfs debian-bookworm-minbase
  sudo azp-sandbox shell --rootfs auto --gpus 0 --network none")]
    Shell(shell::ShellArgs),
    /// Manage root filesystems (the read-only lower layers of sandboxes)
    #[command(
        subcommand,
        after_help = "Examples:
  azp-sandbox rootfs build --list
  sudo azp-sandbox rootfs build debian-bookworm-minbase
  azp-sandbox rootfs list"
    )]
    Rootfs(rootfs::RootfsCommand),
    /// Remove what crashed runs left behind (cgroups, job dirs, container state)
    #[command(after_help = "Examples:
  sudo azp-sandbox gc
  sudo azp-sandbox gc --failed")]
    Gc(gc::GcArgs),
    /// Named caches jobs start warm from: list, empty, collect old snapshots
    #[command(
        subcommand,
        after_help = "Examples:
  azp-sandbox cache ls
  sudo azp-sandbox cache rm pip"
    )]
    Cache(cache::CacheCommand),
    /// GPUs and driver files a sandbox would get (see why something is missing)
    #[command(
        subcommand,
        after_help = "Example:
  azp-sandbox gpu list"
    )]
    Gpu(gpu::GpuCommand),
    /// Internal: the single-threaded helper that owns one sandbox
    #[command(name = "__sandbox-helper", hide = true)]
    SandboxHelper(helper::HelperArgs),
}

impl Command {
    fn into_verb(self) -> Box<dyn Verb> {
        match self {
            Command::Run(v) => Box::new(v),
            Command::Check(v) => Box::new(v),
            Command::Status(v) => Box::new(v),
            Command::Slurm(v) => Box::new(v),
            Command::Agents(v) => Box::new(v),
            Command::Service(v) => Box::new(v),
            Command::Exec(v) => Box::new(v),
            Command::Shell(v) => Box::new(v),
            Command::Rootfs(v) => Box::new(v),
            Command::Gc(v) => Box::new(v),
            Command::Cache(v) => Box::new(v),
            Command::Gpu(v) => Box::new(v),
            Command::SandboxHelper(v) => Box::new(v),
        }
    }
}

/// One verb of the command line.
trait Verb {
    /// What the process must set up before the verb runs.
    fn needs(&self) -> Needs {
        Needs::Mode
    }
    /// Runs the verb; Ok is the process's exit code.
    fn run(self: Box<Self>, ctx: &Context) -> Result<i32>;
}

/// What a verb needs before it runs (see [`enter_mode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Needs {
    /// Nothing: the sandbox helper runs as its parent set it up.
    Nothing,
    /// Root or rootless mode known (and the jobs' cgroup parent), no namespace entered.
    Mode,
    /// The rootfs store: an ordinary user runs the verb inside the user namespace.
    Namespace,
    /// Sandboxes: the user namespace too, and a warning when limits cannot be enforced.
    Sandboxes,
    /// Sandboxes, from a long-running service (`run`): under a systemd unit that
    /// delegates its cgroup, the jobs' cgroups go below it.
    Service,
}

/// What every verb gets: the global options, resolved.
struct Context {
    home: Home,
    driver_root: PathBuf,
}

/// The parser, with the global options listed once: in `azp-sandbox --help`, and named in
/// one line under every command's own help instead of repeated in each.
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    // Propagates the global options into every subcommand, so they can be hidden there.
    cmd.build();
    let globals: Vec<String> = cmd
        .get_arguments()
        .filter(|a| a.is_global_set())
        .map(|a| a.get_long().map(|l| format!("--{l}")).unwrap_or_else(|| a.get_id().to_string()))
        .collect();
    let note = format!("Global options ({}): see azp-sandbox --help", globals.join(", "));
    for sub in cmd.get_subcommands_mut() {
        hide_globals(sub, &note);
    }
    cmd
}

fn hide_globals(cmd: &mut clap::Command, note: &str) {
    let mut c = std::mem::take(cmd).mut_args(|a| if a.is_global_set() { a.hide(true) } else { a });
    let after = c.get_after_help().map(|h| format!("{h}\n\n{note}")).unwrap_or_else(|| note.to_string());
    c = c.after_help(after);
    for sub in c.get_subcommands_mut() {
        hide_globals(sub, note);
    }
    *cmd = c;
}

/// The command line, parsed (exits with clap's message on a bad one).
pub fn parse() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // The help's rewrite (see [`command`]) builds and walks every subcommand: ~0.4 ms of
    // each `exec`'s start, for text that only help shows. Arguments parse the same
    // without it (hiding an option and an after-help note change no match).
    let help = asks_for_help(args.iter().skip(1).cloned());
    if !help {
        if let Some(cli) = parse_job_verb(&args) {
            return cli;
        }
    }
    let cmd = if help { command() } else { Cli::command() };
    Cli::from_arg_matches(&cmd.get_matches_from(args)).unwrap_or_else(|e| e.exit())
}

/// `exec` and `shell`, whose start is part of every job's latency, parsed by a command
/// line that holds the global options and that one verb: building the whole tree (every
/// verb and its flags) is most of clap's time at each start. None for anything that
/// parser does not take; the whole one then parses it, and its errors and help are
/// what the user sees. What this parser takes, the whole one takes the same way: the
/// same global options and the verb's own derived flags.
fn parse_job_verb(args: &[std::ffi::OsString]) -> Option<Cli> {
    use clap::{Args, FromArgMatches};
    let verb = args.iter().skip(1).find(|a| *a == "exec" || *a == "shell")?;
    let root = Globals::augment_args(clap::Command::new("azp-sandbox"));
    let sub = clap::Command::new(if verb == "exec" { "exec" } else { "shell" });
    let sub = if verb == "exec" { exec::ExecArgs::augment_args(sub) } else { shell::ShellArgs::augment_args(sub) };
    let matches = root.subcommand(sub).try_get_matches_from(args).ok()?;
    let globals = Globals::from_arg_matches(&matches).ok()?;
    let command = match matches.subcommand()? {
        ("exec", m) => Command::Exec(exec::ExecArgs::from_arg_matches(m).ok()?),
        ("shell", m) => Command::Shell(shell::ShellArgs::from_arg_matches(m).ok()?),
        _ => return None,
    };
    Some(Cli { globals, command })
}

/// Whether these arguments may show a help text: `-h`, `--help` or `help` anywhere
/// (before `--` or not: erring on the side of the rewritten help costs only time).
fn asks_for_help(mut args: impl Iterator<Item = std::ffi::OsString>) -> bool {
    args.any(|a| a == "-h" || a == "--help" || a == "help")
}

/// Runs the verb `cli` names, after logging and the mode are set up.
pub fn dispatch(cli: Cli) -> Result<i32> {
    let is_root = nix::unistd::geteuid().is_root();
    let g = cli.globals;
    let home = azp_sandbox::settings::home(g.home, &azp_sandbox::settings::Env::process(), is_root);
    azp_sandbox::logging::init(if g.quiet { -1 } else { g.verbose as i8 });
    let verb = cli.command.into_verb();
    let needs = verb.needs();
    if needs != Needs::Nothing {
        enter_mode(needs, g.cgroup_parent.as_deref(), &home)?;
    }
    verb.run(&Context { home, driver_root: g.driver_root })
}

/// Root or rootless (see `azp_sandbox::rootless`). Verbs that create sandboxes or touch
/// the store run inside the user namespace when started by an ordinary user; this must
/// happen before any thread exists.
fn enter_mode(needs: Needs, cgroup_parent: Option<&Path>, home: &Home) -> Result<()> {
    let namespace = matches!(needs, Needs::Namespace | Needs::Sandboxes | Needs::Service);
    if namespace && !nix::unistd::geteuid().is_root() {
        // Jobs of a crashed rootless run live in a user namespace that is a child of ours
        // only from out here: kill them before entering a new one (gc does the rest).
        azp_sandbox::sandbox::teardown::kill_abandoned_inits(home);
    }
    let mode = azp_sandbox::rootless::init(cgroup_parent, namespace, needs == Needs::Service)?;
    if needs == Needs::Sandboxes {
        // The job's cgroup moves come in a few ms: their grace period starts now.
        use azp_sandbox::{rootless::cgroups::CgroupHost, sandbox::cgroup};
        cgroup::open_move_window_early(CgroupHost::get(), mode.rootless);
    }
    if let (Some(warning), Needs::Sandboxes | Needs::Service) = (mode.limits_warning(), needs) {
        tracing::warn!("{warning}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches};

    #[test]
    fn the_parser_is_consistent() {
        Cli::command().debug_assert();
        command().debug_assert();
        let help = |v: &[&str]| asks_for_help(v.iter().map(std::ffi::OsString::from));
        assert!(help(&["exec", "--help"]) && help(&["help", "exec"]) && help(&["-h"]));
        assert!(!help(&["exec", "--rootfs", "bb", "--", "true"]), "a job's start skips the help's rewrite");
    }

    /// Every visible command has an example and every visible argument a description
    /// (`azp-sandbox COMMAND --help` is the reference a sysadmin reads).
    #[test]
    fn every_command_has_examples_and_every_argument_a_description() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            let path = format!("{path} {}", cmd.get_name()).trim().to_string();
            let after = cmd.get_after_help().map(|h| h.to_string()).unwrap_or_default();
            let examples = after
                .lines()
                .filter(|l| {
                    l.trim_start().starts_with("azp-sandbox ")
                        || l.trim_start().starts_with("sudo azp-sandbox ")
                        || l.contains("| azp-sandbox ")
                })
                .count();
            if !(after.contains("Example") && (1..=3).contains(&examples)) {
                missing.push(format!("{path}: {examples} examples (want 1 to 3 under \"Example(s):\")"));
            }
            for a in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
                let id = a.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if a.get_help().is_none_or(|h| h.to_string().trim().is_empty()) {
                    missing.push(format!("{path}: argument {id} has no description"));
                }
            }
            for sub in cmd.get_subcommands().filter(|c| !c.is_hide_set() && c.get_name() != "help") {
                walk(sub, &path, missing);
            }
        }
        let mut missing = vec![];
        walk(&command(), "", &mut missing);
        assert!(missing.is_empty(), "help is incomplete:\n{}", missing.join("\n"));
    }

    /// The fast parser of `exec` and `shell` takes what the whole one takes, the same
    /// way, and leaves everything else to it.
    #[test]
    fn exec_and_shell_parse_the_same_without_the_other_verbs() {
        let os = |v: &[&str]| v.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        let same = [
            &["azp-sandbox", "--home", "/h", "-q", "exec", "--rootfs", "bb", "--network", "none", "--", "/bin/true"][..],
            &["azp-sandbox", "exec", "--rootfs=r", "-e", "A=1=2", "--volume=/d:/data:DATA", "--memory=2G", "-v"],
            &["azp-sandbox", "exec", "--cgroup-parent", "/x", "--rootfs", "r", "--", "sh", "-c", "x"],
            &["azp-sandbox", "exec", "--rootfs", "r", "--gpus", "0,1", "--network-allow", "169.254.169.254:80", "true"],
            &["azp-sandbox", "exec", "--rootfs", "r", "true", "--home", "/an-argument-of-true"],
            &["azp-sandbox", "exec", "--rootfs", "r", "--userns", "host", "-u", "1000:100", "--name", "j1", "id"],
            &["azp-sandbox", "-vv", "shell", "--rootfs", "r", "-u", "1000", "-w", "/tmp", "--home=/h2"],
        ];
        for args in same {
            let fast = parse_job_verb(&os(args)).unwrap_or_else(|| panic!("not taken: {args:?}"));
            let full = Cli::try_parse_from(args).unwrap();
            let (f, w) = (&fast.globals, &full.globals);
            assert_eq!(
                (&f.home, &f.driver_root, f.verbose, f.quiet, &f.cgroup_parent),
                (&w.home, &w.driver_root, w.verbose, w.quiet, &w.cgroup_parent),
                "{args:?}"
            );
            let request = |c: Command| match c {
                Command::Exec(a) => (a.job.userns, a.request()),
                Command::Shell(a) => (a.job.userns, a.request()),
                _ => unreachable!(),
            };
            assert_eq!(request(fast.command), request(full.command), "{args:?}");
        }
        let others = [
            &["azp-sandbox", "run", "--pool", "exec"][..],
            &["azp-sandbox", "rootfs", "list"],
            &["azp-sandbox", "exec", "--rootfs=r", "--network=bridge", "true"],
            &["azp-sandbox", "exec", "true"],
            &["azp-sandbox", "exec", "--version"],
        ];
        for args in others {
            assert!(parse_job_verb(&os(args)).is_none(), "left to the whole parser: {args:?}");
        }
    }

    #[test]
    fn global_options_are_listed_once() {
        let mut cmd = command();
        let top = cmd.render_help().to_string();
        assert!(top.contains("--home <HOME>") && top.contains("Global options"), "{top}");
        let exec = cmd.find_subcommand_mut("exec").unwrap().render_help().to_string();
        assert!(!exec.contains("--home <HOME>") && exec.contains("Global options (--home"), "{exec}");
        // Hidden from the help, still taken after the verb.
        let cli =
            Cli::from_arg_matches(&command().try_get_matches_from(["azp-sandbox", "gc", "--home", "/h"]).unwrap())
                .unwrap();
        assert_eq!(cli.globals.home.as_deref(), Some(Path::new("/h")));
    }

    #[test]
    fn each_verb_says_what_it_needs() {
        let needs = |args: &[&str]| Cli::try_parse_from(args).unwrap().command.into_verb().needs();
        assert_eq!(needs(&["azp-sandbox", "run"]), Needs::Service);
        assert_eq!(needs(&["azp-sandbox", "check"]), Needs::Service);
        assert_eq!(needs(&["azp-sandbox", "exec", "--rootfs", "r", "true"]), Needs::Sandboxes);
        assert_eq!(needs(&["azp-sandbox", "shell", "--rootfs", "r"]), Needs::Sandboxes);
        assert_eq!(needs(&["azp-sandbox", "rootfs", "list"]), Needs::Namespace);
        assert_eq!(needs(&["azp-sandbox", "gc"]), Needs::Namespace);
        assert_eq!(needs(&["azp-sandbox", "status"]), Needs::Mode);
        assert_eq!(needs(&["azp-sandbox", "gpu", "list"]), Needs::Mode);
        assert_eq!(needs(&["azp-sandbox", "agents", "prune"]), Needs::Mode);
        assert_eq!(needs(&["azp-sandbox", "slurm", "--partition", "p"]), Needs::Mode);
        assert_eq!(needs(&["azp-sandbox", "service", "install"]), Needs::Mode);
        assert_eq!(needs(&["azp-sandbox", "__sandbox-helper", "/j"]), Needs::Nothing);
    }
}
