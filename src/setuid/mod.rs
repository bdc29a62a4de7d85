//! Setuid mode: the binary installed setuid-root lets ordinary users run `exec` under the
//! site policy in the root-owned `/etc/azp-sandbox/config.toml` (see [`policy`]).
//!
//! Privilege separation, as a short straight line (each step its own function and error):
//! 1. `harden`: non-dumpable (no ptrace, no /proc/PID/mem or environ for the caller),
//!    refuse file capabilities on the binary, snapshot then clear the environment;
//! 2. `split`: fork. The child drops to the caller's uid/gid for good, gets the caller's
//!    environment back and does everything else: parses the command line and, for `exec`,
//!    sends the request (JSON) through a pipe and exits. Any other command simply runs in
//!    the child as the ordinary user (rootless mode);
//! 3. the privileged parent (`Monitor::serve`) reads one bounded request, loads the
//!    policy (refusing a config that is not root-owned or is writable by others), checks
//!    the caller and the request (paths resolved with the caller's filesystem identity),
//!    becomes root entirely (so the caller can no longer signal it) and runs the job as
//!    the caller, with no capabilities, in a sandbox from the site store.
//!
//! Nothing user-controlled is parsed with privileges except that one JSON request, into a
//! closed struct (`deny_unknown_fields`).

pub mod policy;
pub mod seats;

use crate::config::Home;
use crate::sandbox::exec::ExecRequest;
use crate::sys::{self, process::Forked};
use anyhow::{bail, Context, Result};
use nix::unistd::{Gid, Pid, Uid};
use policy::{Caller, Policy};
use std::ffi::OsString;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// The site policy (and `run`'s settings): root-owned, not writable by others.
pub const POLICY_FILE: &str = "/etc/azp-sandbox/config.toml";
/// Largest request accepted from the unprivileged side.
const MAX_REQUEST: u64 = 1 << 20;

/// True when this process is a setuid-root binary run by an ordinary user.
pub fn invoked_setuid() -> bool {
    !nix::unistd::getuid().is_root() && nix::unistd::geteuid().is_root()
}

/// The two sides after [`split`].
pub enum Side {
    /// The caller's side (no privileges): parse, then [`RequestSender::send`] for `exec`.
    Unprivileged(RequestSender),
    Privileged(Monitor),
}

/// Steps 1 and 2. Call first thing in main, before threads or anything reads the env.
pub fn split() -> Result<Side> {
    let env = harden()?;
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("cannot create a pipe")?;
    let caller = (nix::unistd::getuid(), nix::unistd::getgid());
    // Called first thing in main: the process is single-threaded (checked by the fork),
    // so the child may do anything (it continues as an ordinary program).
    match sys::process::fork("the unprivileged side")? {
        Forked::Child => {
            drop(read);
            drop_privileges_for_good(caller.0, caller.1)?;
            for (k, v) in env {
                std::env::set_var(k, v);
            }
            Ok(Side::Unprivileged(RequestSender { pipe: write }))
        }
        Forked::Parent(child) => {
            drop(write);
            Ok(Side::Privileged(Monitor { pipe: read, child, caller }))
        }
    }
}

/// Step 1. Returns the environment it cleared (for the unprivileged side only).
fn harden() -> Result<Vec<(OsString, OsString)>> {
    sys::ids::make_undumpable()?;
    if sys::ids::has_file_capabilities(Path::new("/proc/self/exe")) {
        bail!("refusing to run: the setuid binary also carries file capabilities; install it with mode 4755 and no capabilities (setcap -r)");
    }
    let env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    for (k, _) in &env {
        std::env::remove_var(k);
    }
    std::env::set_var("PATH", crate::sandbox::plan::DEFAULT_PATH);
    Ok(env)
}

/// The caller's side: real, effective and saved ids all become the caller's; then check
/// that root cannot be regained.
fn drop_privileges_for_good(uid: Uid, gid: Gid) -> Result<()> {
    sys::ids::drop_privileges_for_good(uid, gid).context("cannot drop root")
}

/// What the unprivileged side asks for.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub enum Request {
    Exec(ExecRequest),
    Run(RunRequest),
}

/// `run` as data: the settings the caller gave (flags, AZP_* env, the site config file),
/// resolved by the unprivileged side, and the PAT it read from the caller's token file.
/// (No Debug: it holds the PAT.)
#[derive(Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    pub url: String,
    pub pool: String,
    pub token: String,
    pub agents: Option<usize>,
    pub rootfs: String,
    pub volumes: Vec<crate::config::Volume>,
    /// `--gpus-per-agent`: none, all or N.
    pub gpus_per_agent: String,
    pub limits: crate::sandbox::LimitsAsk,
    pub name_prefix: String,
    pub drain_timeout_secs: u64,
    #[serde(default)]
    pub cancel_grace_secs: Option<u64>,
    pub exit_when_idle_secs: Option<u64>,
    /// Not allowed in setuid mode (the privileged side refuses them when set): a package
    /// the caller chose, hooks (they run as root on the host), autoscaling.
    pub agent_package: Option<String>,
    pub hooks_dir: Option<PathBuf>,
    pub autoscale: bool,
    #[serde(default)]
    pub network: crate::config::Network,
    #[serde(default)]
    pub network_allow: Vec<crate::config::NetworkAllow>,
    #[serde(default)]
    pub network_ipv6: crate::config::Ipv6,
    /// The caller's HTTP(S)_PROXY and NO_PROXY, for its jobs.
    #[serde(default)]
    pub proxy_env: Vec<(String, String)>,
}

impl RunRequest {
    /// From `run`'s merged settings, read on the unprivileged side.
    pub fn from_settings(s: &crate::settings::RunSettings, token: String) -> RunRequest {
        use crate::gpu::PerAgent;
        RunRequest {
            url: s.url.clone(),
            pool: s.pool.clone(),
            token,
            agents: s.agents,
            rootfs: s.rootfs.clone(),
            volumes: s.volumes.clone(),
            gpus_per_agent: match s.gpus_per_agent {
                PerAgent::None => "none".into(),
                PerAgent::All => "all".into(),
                PerAgent::Count(n) => n.to_string(),
            },
            limits: s.limits,
            name_prefix: s.name_prefix.clone(),
            drain_timeout_secs: s.drain_timeout.as_secs(),
            cancel_grace_secs: Some(s.cancel_grace.as_secs()),
            exit_when_idle_secs: s.exit_when_idle.map(|d| d.as_secs()),
            agent_package: s.agent_package.clone(),
            hooks_dir: s.hooks_dir.clone(),
            autoscale: s.autoscale.is_some(),
            network: s.network,
            network_allow: s.network_allow.clone(),
            network_ipv6: s.network_ipv6,
            proxy_env: s.proxy_env.clone(),
        }
    }
}

pub struct RequestSender {
    pipe: OwnedFd,
}

impl RequestSender {
    pub fn send(self, req: &Request) -> Result<()> {
        let bytes = serde_json::to_vec(req)?;
        let mut f = std::fs::File::from(self.pipe);
        std::io::Write::write_all(&mut f, &bytes).context("the privileged side is gone")
    }
}

pub struct Monitor {
    pipe: OwnedFd,
    child: Pid,
    caller: (Uid, Gid),
}

impl Monitor {
    /// Step 3. Returns the process exit code.
    pub fn serve(self) -> i32 {
        match self.serve_inner() {
            Ok(code) => code,
            Err(e) => {
                eprintln!("azp-sandbox: error: {}", format!("{e:#}").replace('\n', " "));
                125
            }
        }
    }

    fn serve_inner(self) -> Result<i32> {
        let mut bytes = Vec::new();
        std::fs::File::from(self.pipe)
            .take(MAX_REQUEST + 1)
            .read_to_end(&mut bytes)
            .context("cannot read the request")?;
        let code = match nix::sys::wait::waitpid(self.child, None).context("lost the unprivileged side")? {
            nix::sys::wait::WaitStatus::Exited(_, c) => c,
            nix::sys::wait::WaitStatus::Signaled(_, s, _) => 128 + s as i32,
            _ => 125,
        };
        if bytes.is_empty() || code != 0 {
            // Not an exec (it ran unprivileged in the child), or the child failed (it said why).
            return Ok(code);
        }
        if bytes.len() as u64 > MAX_REQUEST {
            bail!("request too large");
        }
        let request: Request =
            serde_json::from_slice(&bytes).context("malformed request from the unprivileged side")?;
        let policy = load_policy(Path::new(POLICY_FILE))?;
        let caller = caller(self.caller.0, self.caller.1)?;
        policy.allows_caller(&caller)?;
        let resolve = |p: &Path| resolve_as(self.caller, p);
        crate::identity::init(policy.userns)?;
        match request {
            Request::Exec(request) => {
                request.validate()?;
                let request = policy.authorize(request, &caller, &resolve)?;
                become_root()?;
                // The runtime tmpfs first (a host whose /run is not one): the seats live on
                // it. The rest of the home: `exec`'s own start.
                crate::sandbox::prepare_runtime_tmpfs(&Home::new(&policy.home))?;
                let _seat = seats::take(Path::new(seats::SEATS_DIR), caller.uid, 1, policy.jobs_cap())?;
                run_exec(&policy, request)
            }
            Request::Run(request) => {
                let settings = policy.authorize_run(&request, &resolve)?;
                become_root()?;
                // The site's home (the callers' homes are below it), and the seats' tmpfs.
                crate::sandbox::prepare_home(&Home::new(&policy.home))?;
                let _seats = seats::take(
                    Path::new(seats::SEATS_DIR),
                    caller.uid,
                    settings.agents.unwrap_or(1),
                    policy.jobs_cap(),
                )?;
                run_agents(&policy, &caller, settings, request.token)
            }
        }
    }
}

/// Loads the policy, refusing a file or directory that someone other than root could change.
pub fn load_policy(file: &Path) -> Result<Policy> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let dir = file.parent().context("policy file has no directory")?;
    let d = std::fs::symlink_metadata(dir)
        .with_context(|| format!("setuid mode is not configured: {} is missing", dir.display()))?;
    if !d.is_dir() || d.uid() != 0 || d.mode() & 0o022 != 0 {
        bail!("refusing {}: it must be a root-owned directory not writable by group or others", dir.display());
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(file)
        .with_context(|| format!("setuid mode is not configured: cannot open {}", file.display()))?;
    let m = f.metadata()?;
    if !m.is_file() || m.uid() != 0 || m.mode() & 0o022 != 0 {
        bail!(
            "refusing {}: it must be a root-owned file not writable by group or others (chown root:root, chmod 644)",
            file.display()
        );
    }
    let mut text = String::new();
    f.take(MAX_REQUEST).read_to_string(&mut text).with_context(|| format!("cannot read {}", file.display()))?;
    policy::parse(&text, file)
}

fn caller(uid: Uid, gid: Gid) -> Result<Caller> {
    let user =
        nix::unistd::User::from_uid(uid).ok().flatten().with_context(|| format!("uid {uid} has no user name"))?;
    let mut gids = nix::unistd::getgroups().unwrap_or_default();
    gids.push(gid);
    let groups =
        gids.into_iter().filter_map(|g| nix::unistd::Group::from_gid(g).ok().flatten()).map(|g| g.name).collect();
    Ok(Caller { uid: uid.as_raw(), gid: gid.as_raw(), name: user.name, groups })
}

/// Canonicalizes `p` with the caller's filesystem identity: what the caller cannot reach
/// on the host cannot be named in a request either.
fn resolve_as(caller: (Uid, Gid), p: &Path) -> std::io::Result<PathBuf> {
    sys::ids::with_fs_identity(caller.0.as_raw(), caller.1.as_raw(), || std::fs::canonicalize(p))
}

/// Real, effective and saved ids 0 and no supplementary groups: the caller can no longer
/// signal or trace any process from here on.
fn become_root() -> Result<()> {
    Ok(sys::ids::become_root()?)
}

fn run_exec(policy: &Policy, request: ExecRequest) -> Result<i32> {
    crate::logging::init(0);
    let outcome = crate::sandbox::exec::run(&Home::new(&policy.home), &policy.driver_root, &request)?;
    tracing::info!(
        "setuid job {} exit={} duration={:.3}s limits: {}{}",
        outcome.id,
        outcome.code,
        outcome.duration.as_secs_f64(),
        outcome.limits,
        crate::sandbox::limits::disk_note(outcome.disk.as_ref())
    );
    Ok(outcome.code)
}

/// The caller's agents, run by root under the policy: in the caller's own home below the
/// site's (`<home>/users/<uid>`: job dirs, status, logs, agent package cache), over the
/// site's rootfs store, the agents running as the caller.
fn run_agents(policy: &Policy, caller: &Caller, settings: crate::settings::RunSettings, token: String) -> Result<i32> {
    crate::logging::init(0);
    let site = Home::new(&policy.home);
    site.ensure()?;
    let home = Home::new(site.root().join("users").join(caller.uid.to_string()));
    home.ensure()?;
    // The store is the site's: a link the caller cannot change (the dirs are root's).
    let store_link = home.rootfs_dir();
    if std::fs::symlink_metadata(&store_link).map(|m| !m.file_type().is_symlink()).unwrap_or(true) {
        let _ = std::fs::remove_dir(&store_link);
        std::os::unix::fs::symlink(site.rootfs_dir(), &store_link)
            .with_context(|| format!("cannot link {} to the site store", store_link.display()))?;
    }
    tracing::info!("setuid run for {} (uid {}): home {}", caller.name, caller.uid, home.root().display());
    let ctx = crate::manager::RunContext {
        driver_root: policy.driver_root.clone(),
        env_token: Some(token),
        job_user: Some((caller.uid, caller.gid)),
    };
    crate::manager::run(&home, settings, ctx)?;
    Ok(0)
}
