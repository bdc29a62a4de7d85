//! The `azp-sandbox` command line: parse, call into the library, map errors to exit codes.
//! Errors print as one line (`azp-sandbox: error: ...`) and exit 125; `exec` otherwise
//! exits with the job's own exit code.

use anyhow::{bail, Context, Result};
use azp_sandbox::config::{parse_size, EnvVar, Home, Network, Volume};
use azp_sandbox::gpu::{self, Capabilities, DiscoverOptions, GpuRequest};
use azp_sandbox::rootfs::Store;
use azp_sandbox::sandbox::{self, Limits};
use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// Exit code for failures of azp-sandbox itself (as `docker run` uses 125).
const EXIT_SANDBOX_ERROR: i32 = 125;

#[derive(Parser)]
#[command(name = "azp-sandbox", version, about = "Self-hosted Azure Pipelines agents, one fresh sandbox per job")]
struct Cli {
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
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Keep N Azure Pipelines agent slots, one job per fresh sandbox (the main job)
    Run(RunArgs),
    /// What a running `azp-sandbox run` is doing: slots, agents, jobs, GPUs, autoscaling
    Status {
        #[arg(long)]
        json: bool,
        /// Show the `azp-sandbox slurm` of this home instead
        #[arg(long)]
        slurm: bool,
    },
    /// On a Slurm login node: submit batch jobs running agents while matching jobs wait
    Slurm(SlurmArgs),
    /// Manage this host's agent records in the pool
    #[command(subcommand)]
    Agents(AgentsCommand),
    /// Install azp-sandbox as a systemd service
    #[command(subcommand)]
    Service(ServiceCommand),
    /// Run a command in a fresh, throwaway sandbox
    Exec(ExecArgs),
    /// Manage root filesystems (the read-only lower layers of sandboxes)
    #[command(subcommand)]
    Rootfs(RootfsCommand),
    /// Remove what crashed runs left behind (cgroups, job dirs, container state)
    Gc,
    /// GPUs and driver files a sandbox would get (see why something is missing)
    #[command(subcommand)]
    Gpu(GpuCommand),
    /// Internal: the single-threaded helper that owns one sandbox
    #[command(name = "__sandbox-helper", hide = true)]
    SandboxHelper { job_dir: PathBuf },
}

#[derive(clap::Args)]
struct ExecArgs {
    /// Rootfs name from `azp-sandbox rootfs list`, or auto: the newest CUDA the host
    /// driver supports
    #[arg(long)]
    rootfs: String,
    /// Read-only dataset: HOST:CONTAINER[:ENVVAR] (ENVVAR is set to CONTAINER)
    #[arg(long = "volume", value_name = "HOST:CTR[:ENV]")]
    volumes: Vec<Volume>,
    /// Environment variable for the command
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    env: Vec<EnvVar>,
    #[command(flatten)]
    limits: LimitArgs,
    /// host: share the host network (default); none: empty network namespace
    #[arg(long, value_enum, default_value_t = Network::Host)]
    network: Network,
    /// GPUs for the job: all, none, or a comma list of indexes or UUIDs (as
    /// NVIDIA_VISIBLE_DEVICES), or CDI names like nvidia.com/gpu=0
    #[arg(long, default_value = "none", value_parser = checked::<GpuRequest>)]
    gpus: String,
    /// Driver capabilities to inject: compute,utility,video,graphics,display or all
    #[arg(long, default_value = "compute,utility", value_parser = checked::<Capabilities>)]
    gpu_capabilities: String,
    /// Use this CDI spec for the GPUs instead of native discovery
    #[arg(long)]
    cdi_spec: Option<PathBuf>,
    /// Job name (container id, cgroup leaf, hostname) [default: exec-<random>]
    #[arg(long, value_parser = parse_job_name)]
    name: Option<String>,
    /// Working directory inside the sandbox
    #[arg(long, short = 'w', default_value = "/")]
    workdir: PathBuf,
    /// Run as UID[:GID] inside the sandbox (numeric; default 0:0)
    #[arg(long, short = 'u', value_parser = parse_user)]
    user: Option<(u32, u32)>,
    /// Command and arguments
    #[arg(trailing_var_arg = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

/// Per-job cgroup limits, the same flags for `exec` and `run`.
#[derive(clap::Args, Clone, Copy, Default)]
struct LimitArgs {
    /// Memory limit per job, e.g. 4G (the job is OOM-killed above it)
    #[arg(long, value_parser = parse_size)]
    memory: Option<u64>,
    /// Maximum number of processes/threads per job
    #[arg(long, value_parser = parse_pids)]
    pids: Option<i64>,
    /// CPU quota per job in CPUs, e.g. 2 or 0.5
    #[arg(long, value_parser = parse_cpus)]
    cpus: Option<u64>,
}

impl ExecArgs {
    fn request(self) -> sandbox::exec::ExecRequest {
        sandbox::exec::ExecRequest {
            rootfs: self.rootfs,
            volumes: self.volumes,
            env: self.env.into_iter().map(|e| (e.key, e.value)).collect(),
            limits: self.limits.limits(),
            network: self.network,
            gpus: self.gpus,
            gpu_capabilities: self.gpu_capabilities,
            cdi_spec: self.cdi_spec,
            name: self.name,
            workdir: self.workdir,
            user: self.user,
            command: self.command,
        }
    }
}

/// A clap value parser that checks the value parses as `T` but keeps the text.
fn checked<T: std::str::FromStr>(s: &str) -> Result<String, String>
where
    T::Err: std::fmt::Display,
{
    s.parse::<T>().map(|_| s.to_string()).map_err(|e| e.to_string())
}

impl LimitArgs {
    fn limits(self) -> Limits {
        Limits { memory_bytes: self.memory, pids: self.pids, cpus_milli: self.cpus }
    }
}

#[derive(clap::Args, Default)]
struct PoolArgs {
    /// Agent pool [env: AZP_POOL]
    #[arg(long)]
    pool: Option<String>,
    /// Organization URL, e.g. https://dev.azure.com/ORG [env: AZP_URL]
    #[arg(long)]
    url: Option<String>,
    /// File holding the PAT (scope: Agent Pools read & manage) [env: AZP_TOKEN_FILE]
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Agent names are <prefix>-<slot> [env: AZP_AGENT_NAME] [default: host name]
    #[arg(long)]
    name_prefix: Option<String>,
    /// Settings file [default: /etc/azp-sandbox/config.toml when present]
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(clap::Args)]
struct RunArgs {
    #[command(flatten)]
    pool: PoolArgs,
    /// Number of agent slots [default: one per GPU]
    #[arg(long)]
    agents: Option<usize>,
    /// Rootfs name, or auto: the newest CUDA the host driver supports
    #[arg(long)]
    rootfs: Option<String>,
    /// Read-only dataset for every job: HOST:CONTAINER[:ENVVAR]
    #[arg(long = "volume", value_name = "HOST:CTR[:ENV]")]
    volumes: Vec<Volume>,
    /// GPUs per agent: N (own GPUs), all (shared) or none
    #[arg(long)]
    gpus_per_agent: Option<String>,
    #[command(flatten)]
    limits: LimitArgs,
    /// Agent package (FILE or URL) for air-gapped sites [default: the server's newest]
    #[arg(long)]
    agent_package: Option<String>,
    /// Seconds running jobs get after SIGTERM before they are killed
    #[arg(long)]
    drain_timeout: Option<u64>,
    /// Dir with pre-job.d/ and post-job.d/ hooks
    #[arg(long)]
    hooks_dir: Option<PathBuf>,
    /// Start and stop slots with the pool's queue (README: "Clusters: autoscaling and Slurm")
    #[arg(long)]
    autoscale: bool,
    /// With --autoscale: slots kept running without jobs [default: 0]
    #[arg(long)]
    min_agents: Option<usize>,
    /// With --autoscale: the most slots at once [default: one per GPU]
    #[arg(long)]
    max_agents: Option<usize>,
    /// With --autoscale: seconds an agent waits without a job before it is stopped [default: 300]
    #[arg(long, value_name = "SECS")]
    idle_timeout: Option<u64>,
    /// With --autoscale: seconds between reads of the pool's queue [default: 15]
    #[arg(long, value_name = "SECS")]
    poll_interval: Option<u64>,
    /// Exit when no job ran for this many seconds (what Slurm batch jobs use)
    #[arg(long, value_name = "SECS")]
    exit_when_idle: Option<u64>,
}

#[derive(clap::Args)]
struct SlurmArgs {
    #[command(flatten)]
    pool: PoolArgs,
    /// Slurm partition of the GPU nodes
    #[arg(long)]
    partition: String,
    /// The most batch jobs (pending + running) at once
    #[arg(long, default_value_t = 4)]
    max_jobs: usize,
    /// GPUs per batch job (--gres=gpu:K), one agent each; 0: one CPU-only agent
    #[arg(long, default_value_t = 1)]
    gpus_per_job: usize,
    /// Extra sbatch argument, e.g. --sbatch-arg=--time=04:00:00 (repeatable)
    #[arg(long = "sbatch-arg", value_name = "ARG", allow_hyphen_values = true)]
    sbatch_args: Vec<String>,
    /// Seconds between reads of the pool's queue and of squeue
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    poll_interval: u64,
    /// A batch job exits when no job came for this many seconds (its run --exit-when-idle)
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    idle_timeout: u64,
    /// Seconds a batch job's running CI jobs get when Slurm stops it (SIGTERM this + 60 s before the time limit)
    #[arg(long, value_name = "SECS", default_value_t = 240)]
    drain_timeout: u64,
    /// Rootfs the batch jobs use [default: the config file's, else auto]
    #[arg(long)]
    rootfs: Option<String>,
    /// How compute nodes start azp-sandbox, e.g. "sudo -n /usr/local/bin/azp-sandbox" [default: this binary's path]
    #[arg(long)]
    remote_exe: Option<String>,
    /// --home on the compute nodes (node-local: the rootfs store and agent package stay cached)
    #[arg(long)]
    remote_home: Option<PathBuf>,
    /// --config for the batch jobs' run
    #[arg(long)]
    remote_config: Option<PathBuf>,
    /// Extra argument for the batch jobs' run, e.g. --run-arg=--memory=64G (repeatable)
    #[arg(long = "run-arg", value_name = "ARG", allow_hyphen_values = true)]
    run_args: Vec<String>,
    /// A capability the compute nodes' agents have that this node cannot see, for matching demands (repeatable)
    #[arg(long = "capability", value_name = "NAME=VALUE")]
    capabilities: Vec<String>,
}

#[derive(Subcommand)]
enum AgentsCommand {
    /// Delete this host's offline agent records (<prefix>-N) from the pool
    Prune(PoolArgs),
}

#[derive(Subcommand)]
enum ServiceCommand {
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

#[derive(Subcommand)]
enum GpuCommand {
    /// Driver and CUDA version, GPUs, every file and device node with its source
    List {
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

#[derive(Subcommand)]
enum RootfsCommand {
    /// Unpack a rootfs tarball (tar, tar.gz, tar.zst; detected by content) into the store
    Import {
        /// Archive file, or - for standard input
        file: PathBuf,
        #[arg(long)]
        name: String,
    },
    /// List imported root filesystems
    List {
        #[arg(long)]
        json: bool,
    },
    /// Remove a root filesystem (refused while a sandbox uses it)
    Rm { name: String },
    /// Pull an image from an OCI/Docker registry into the store (no Docker needed)
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
    Build {
        /// Recipe: a .toml file, or a name from rootfs-recipes/ (/etc/azp-sandbox/rootfs-recipes, next to the binary, /usr/share/azp-sandbox/rootfs-recipes, built in)
        recipe: String,
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

fn parse_job_name(s: &str) -> Result<String> {
    sandbox::exec::parse_job_name(s)
}

fn parse_user(s: &str) -> Result<(u32, u32)> {
    let (u, g) = s.split_once(':').unwrap_or((s, s));
    match (u.parse::<u32>(), g.parse::<u32>()) {
        (Ok(u), Ok(g)) => Ok((u, g)),
        _ => bail!("bad --user '{s}': use numeric UID or UID:GID, e.g. 1000:1000"),
    }
}

fn parse_pids(s: &str) -> Result<i64> {
    match s.parse::<i64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => bail!("bad --pids '{s}': use a positive number of processes"),
    }
}

/// CPUs -> milli-CPUs.
fn parse_cpus(s: &str) -> Result<u64> {
    match s.parse::<f64>() {
        Ok(c) if c > 0.0 && c <= 4096.0 => Ok((c * 1000.0).round().max(1.0) as u64),
        _ => bail!("bad --cpus '{s}': use a positive number of CPUs such as 2 or 0.5"),
    }
}

fn main() {
    // Before any thread or I/O exists, so `azp-sandbox gpu list | head` ends quietly
    // instead of panicking.
    azp_sandbox::sys::signals::restore_default(azp_sandbox::sys::Signal::SIGPIPE);
    if azp_sandbox::setuid::invoked_setuid() {
        std::process::exit(setuid_main());
    }
    main_with(Cli::parse());
}

/// Installed setuid-root and run by an ordinary user (see azp_sandbox::setuid): `exec` goes
/// to the privileged side as a request checked against site policy; any other command
/// runs right here, with the caller's ids only.
fn setuid_main() -> i32 {
    use azp_sandbox::setuid::{split, Side};
    match split() {
        Ok(Side::Privileged(monitor)) => monitor.serve(),
        Ok(Side::Unprivileged(sender)) => {
            let cli = Cli::parse();
            let request = match cli.command {
                Command::Exec(args) => Ok(azp_sandbox::setuid::Request::Exec(args.request())),
                Command::Run(args) => run_settings(&args.pool, Some(&args)).and_then(|(settings, env_token)| {
                    let token = azp_sandbox::manager::settings::read_token(settings.token_file.as_deref(), env_token)?;
                    Ok(azp_sandbox::setuid::Request::Run(azp_sandbox::setuid::RunRequest::from_settings(
                        &settings, token,
                    )))
                }),
                other => {
                    drop(sender);
                    main_with(Cli { command: other, ..cli });
                    return 0;
                }
            };
            match request.and_then(|r| sender.send(&r)) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("azp-sandbox: error: {}", one_line(&e));
                    EXIT_SANDBOX_ERROR
                }
            }
        }
        Err(e) => {
            eprintln!("azp-sandbox: error: {}", one_line(&e));
            EXIT_SANDBOX_ERROR
        }
    }
}

fn main_with(cli: Cli) {
    let home = Home::resolve(cli.home.clone());
    if let Command::SandboxHelper { job_dir } = &cli.command {
        azp_sandbox::logging::init(if cli.quiet { -1 } else { cli.verbose as i8 });
        std::process::exit(sandbox::helper::main(&home, job_dir));
    }
    azp_sandbox::logging::init(if cli.quiet { -1 } else { cli.verbose as i8 });
    if let Err(e) = enter_mode(&cli, &home) {
        eprintln!("azp-sandbox: error: {}", one_line(&e));
        std::process::exit(EXIT_SANDBOX_ERROR);
    }
    match run(cli, home) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("azp-sandbox: error: {}", one_line(&e));
            std::process::exit(EXIT_SANDBOX_ERROR);
        }
    }
}

/// `a: b: c` on one line, without repeating a cause the context already quotes.
fn one_line(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if out.contains(&s) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&s);
    }
    out.replace('\n', " ")
}

/// Root or rootless (see azp_sandbox::rootless). Commands that create sandboxes or touch
/// the store run inside the user namespace when started by an ordinary user; this must
/// happen before any thread exists.
fn enter_mode(cli: &Cli, home: &Home) -> Result<()> {
    let needs_namespace = matches!(cli.command, Command::Run(_) | Command::Exec(_) | Command::Rootfs(_) | Command::Gc);
    if needs_namespace && !nix::unistd::geteuid().is_root() {
        // Jobs of a crashed rootless run live in a user namespace that is a child of ours
        // only from out here: kill them before entering a new one (gc does the rest).
        sandbox::teardown::kill_abandoned_inits(home);
    }
    let mode = azp_sandbox::rootless::init(cli.cgroup_parent.as_deref(), needs_namespace)?;
    if let (Some(warning), Command::Run(_) | Command::Exec(_)) = (mode.limits_warning(), &cli.command) {
        tracing::warn!("{warning}");
    }
    Ok(())
}

fn run(cli: Cli, home: Home) -> Result<i32> {
    match cli.command {
        Command::Run(args) => {
            let (settings, env_token) = run_settings(&args.pool, Some(&args))?;
            let ctx = azp_sandbox::manager::RunContext { driver_root: cli.driver_root, env_token, job_user: None };
            azp_sandbox::manager::run(&home, settings, ctx)?;
            Ok(0)
        }
        Command::Status { json, slurm: true } => {
            let path = azp_sandbox::slurm::status_path(&home);
            let bytes = std::fs::read(&path).with_context(|| {
                format!("no Slurm status at {}: is `azp-sandbox slurm` running with this --home?", path.display())
            })?;
            let st: azp_sandbox::slurm::SlurmStatus =
                serde_json::from_slice(&bytes).with_context(|| format!("corrupt {}", path.display()))?;
            let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(st.pid as i32), None).is_ok();
            if json {
                println!("{}", serde_json::to_string_pretty(&st)?);
            } else {
                print!("{}", st.render(alive));
            }
            Ok(if alive { 0 } else { 3 })
        }
        Command::Slurm(args) => {
            let (settings, env_token) = run_settings(&args.pool, None)?;
            let s = slurm_settings(args, settings)?;
            azp_sandbox::slurm::run(&home, s, env_token)?;
            Ok(0)
        }
        Command::Status { json, slurm: false } => {
            let st = azp_sandbox::manager::status::read(&home.root().join("status.json"))?;
            let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(st.pid as i32), None).is_ok();
            if json {
                println!("{}", serde_json::to_string_pretty(&st)?);
            } else {
                print!("{}", azp_sandbox::manager::status::render(&st, alive));
            }
            Ok(if alive { 0 } else { 3 })
        }
        Command::Agents(AgentsCommand::Prune(pool)) => {
            let (settings, env_token) = run_settings(&pool, None)?;
            let removed = azp_sandbox::manager::prune_command(&settings, env_token)?;
            tracing::info!(
                "removed {} offline agent record(s){}",
                removed.len(),
                if removed.is_empty() { String::new() } else { format!(": {}", removed.join(", ")) }
            );
            Ok(0)
        }
        Command::Service(ServiceCommand::Install { unit_dir, name, config }) => {
            let path = azp_sandbox::manager::service::install(&unit_dir, &name, &config, &home)?;
            println!("wrote {}; now: systemctl daemon-reload && systemctl enable --now {name}", path.display());
            Ok(0)
        }
        Command::Exec(args) => exec(&home, &cli.driver_root, args),
        Command::Gpu(GpuCommand::List { json, capabilities, cdi_spec }) => {
            let opts = DiscoverOptions { driver_root: cli.driver_root, cdi_spec, ..Default::default() };
            let report = gpu::list(&opts, &capabilities)?;
            if json {
                println!("{}", report.to_json());
            } else {
                print!("{report}");
            }
            Ok(0)
        }
        Command::Rootfs(cmd) => rootfs(&home, cmd),
        Command::Gc => {
            let report = sandbox::gc_all(&home)?;
            report.log();
            if !report.failed.is_empty() {
                bail!("gc could not remove {} item(s) (see warnings above)", report.failed.len());
            }
            tracing::info!("gc: {} item(s) removed, {} live job(s) untouched", report.removed.len(), report.live_jobs);
            Ok(0)
        }
        Command::SandboxHelper { .. } => unreachable!("handled in main"),
    }
}

/// Settings of `run` / `agents prune`: flags > AZP_* env > config file.
fn run_settings(
    p: &PoolArgs,
    run: Option<&RunArgs>,
) -> Result<(azp_sandbox::manager::settings::RunSettings, Option<String>)> {
    use azp_sandbox::manager::settings::{self, FlagSettings};
    let file = settings::read_file(p.config.as_deref())?;
    let env = settings::env_settings(|k| std::env::var(k).ok().filter(|v| !v.is_empty()));
    let mut flags = FlagSettings {
        url: p.url.clone(),
        token_file: p.token_file.clone(),
        pool: p.pool.clone(),
        name_prefix: p.name_prefix.clone(),
        ..Default::default()
    };
    if let Some(r) = run {
        flags.agents = r.agents;
        flags.rootfs = r.rootfs.clone();
        flags.volumes = r.volumes.clone();
        flags.gpus_per_agent = r.gpus_per_agent.clone();
        flags.memory = r.limits.memory;
        flags.pids = r.limits.pids;
        flags.cpus_milli = r.limits.cpus;
        flags.agent_package = r.agent_package.clone();
        flags.drain_timeout = r.drain_timeout.map(std::time::Duration::from_secs);
        flags.hooks_dir = r.hooks_dir.clone();
        flags.autoscale = r.autoscale;
        flags.min_agents = r.min_agents;
        flags.max_agents = r.max_agents;
        flags.idle_timeout = r.idle_timeout.map(std::time::Duration::from_secs);
        flags.poll_interval = r.poll_interval.map(std::time::Duration::from_secs);
        flags.exit_when_idle = r.exit_when_idle.map(std::time::Duration::from_secs);
    }
    let s = settings::merge(file, env, flags)?;
    Ok((s, std::env::var("AZP_TOKEN").ok()))
}

/// `slurm`'s settings: the pool's from flags > env > config file, the rest from its flags.
fn slurm_settings(
    a: SlurmArgs,
    s: azp_sandbox::manager::settings::RunSettings,
) -> Result<azp_sandbox::slurm::SlurmSettings> {
    use std::time::Duration;
    let mut capabilities = Vec::new();
    for c in &a.capabilities {
        match c.split_once('=') {
            Some((k, v)) if !k.is_empty() => capabilities.push((k.to_string(), v.to_string())),
            _ => bail!("bad --capability '{c}': use NAME=VALUE, e.g. gpu_model=NVIDIA A100-SXM4-80GB"),
        }
    }
    if a.poll_interval == 0 {
        bail!("--poll-interval must be at least 1 second");
    }
    let remote_exe = match a.remote_exe {
        Some(e) => e,
        None => std::env::current_exe()
            .context("cannot find the azp-sandbox binary: give --remote-exe")?
            .display()
            .to_string(),
    };
    Ok(azp_sandbox::slurm::SlurmSettings {
        url: s.url,
        token_file: s.token_file,
        pool: s.pool,
        name_prefix: s.name_prefix,
        partition: a.partition,
        max_jobs: a.max_jobs,
        gpus_per_job: a.gpus_per_job,
        sbatch_args: a.sbatch_args,
        poll_interval: Duration::from_secs(a.poll_interval),
        idle_timeout: Duration::from_secs(a.idle_timeout),
        drain_timeout: Duration::from_secs(a.drain_timeout),
        rootfs: a.rootfs.or(Some(s.rootfs)),
        remote_exe,
        remote_home: a.remote_home,
        remote_config: a.remote_config.or(a.pool.config),
        run_args: a.run_args,
        capabilities,
    })
}

fn exec(home: &Home, driver_root: &std::path::Path, args: ExecArgs) -> Result<i32> {
    let request = args.request();
    let outcome = sandbox::exec::run(home, driver_root, &request)?;
    tracing::debug!(
        "job {} rootfs={} exit={} duration={:.3}s cleanup: {}",
        outcome.id,
        request.rootfs,
        outcome.code,
        outcome.duration.as_secs_f64(),
        outcome.cleanup
    );
    Ok(outcome.code)
}

/// Ctrl-C / SIGTERM during an import: stop at the next entry and remove the temp dir
/// (instead of dying and leaving it to gc).
fn cancel_import_on_signals() {
    use azp_sandbox::sys::Signal;
    azp_sandbox::sys::signals::set_flag_on(&[Signal::SIGINT, Signal::SIGTERM], &azp_sandbox::rootfs::CANCEL);
}

fn rootfs(home: &Home, cmd: RootfsCommand) -> Result<i32> {
    let store = Store::new(home);
    match cmd {
        RootfsCommand::Import { file, name } => {
            home.ensure()?;
            if let Some(img) = azp_sandbox::rootfs::oci::detect_local(&file)? {
                let report = azp_sandbox::rootfs::oci::import_local(&store, &img, &name, &Default::default())?;
                tracing::info!("{}", report.summary("imported"));
                return Ok(0);
            }
            let mut input: Box<dyn std::io::Read> = if file.as_os_str() == "-" {
                Box::new(std::io::stdin().lock())
            } else {
                Box::new(std::fs::File::open(&file).with_context(|| format!("cannot open {}", file.display()))?)
            };
            let mut progress = azp_sandbox::progress::Progress::new(&format!("importing {name}"));
            cancel_import_on_signals();
            let label = if file.as_os_str() == "-" { "stdin".to_string() } else { file.display().to_string() };
            let info = store.import_labeled(&mut input, &name, &label, &mut |n| progress.update(n))?;
            progress.finish();
            tracing::info!(
                "imported rootfs '{}': {} entries, {:.1} MB{}",
                info.name,
                info.entries,
                info.size_bytes as f64 / 1e6,
                info.arch.as_deref().map(|a| format!(", {a}")).unwrap_or_default()
            );
            Ok(0)
        }
        RootfsCommand::List { json } => {
            let list = store.list()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                println!(
                    "{:<24} {:>10} {:>9} {:<8} {:<6} {:<20} SOURCE",
                    "NAME", "SIZE", "ENTRIES", "ARCH", "CUDA", "IMPORTED"
                );
                for r in list {
                    println!(
                        "{:<24} {:>9.1}M {:>9} {:<8} {:<6} {:<20} {}",
                        r.name,
                        r.size_bytes as f64 / 1e6,
                        r.entries,
                        r.arch.as_deref().unwrap_or("-"),
                        r.cuda_version.as_deref().unwrap_or("-"),
                        r.imported_at,
                        r.source
                    );
                }
            }
            Ok(0)
        }
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
            Ok(0)
        }
        RootfsCommand::Build { recipe, name, mirror, cache_dir, keep_cache } => {
            cancel_import_on_signals();
            let report =
                azp_sandbox::rootfs::recipe::build_command(home, &recipe, name, mirror, cache_dir, keep_cache)?;
            tracing::info!("{}", report.summary());
            Ok(0)
        }
        RootfsCommand::Rm { name } => {
            store.remove(&name)?;
            tracing::info!("removed rootfs '{name}'");
            // The GPU edit layers built over it are of no use any more.
            for r in azp_sandbox::sandbox::editlayer::prune(home) {
                tracing::info!("removed {r}");
            }
            Ok(0)
        }
    }
}
