//! `azp-sandbox exec` as data: what the command line asks for ([`ExecRequest`]) and the
//! job plan it becomes. Shared by the plain `exec` and by setuid mode, where the request
//! is parsed by the unprivileged side and checked against site policy before this runs.

use super::limits::{self, LimitsAsk};
use super::plan::JobPlan;
use crate::config::{Home, Network, Volume};
use crate::gpu::{self, Capabilities, DiscoverOptions, GpuRequest};
use crate::rootfs::{RootfsLease, Store};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    pub rootfs: String,
    pub volumes: Vec<Volume>,
    pub env: Vec<(String, String)>,
    /// As asked; the node's defaults fill in what was not said (see [`limits::resolve`]).
    pub limits: LimitsAsk,
    pub network: Network,
    /// Blocked destinations the job may reach (`--network-allow`).
    #[serde(default)]
    pub network_allow: Vec<crate::config::NetworkAllow>,
    /// `--ipv6`: whether the job gets outbound IPv6 too.
    #[serde(default)]
    pub ipv6: crate::config::Ipv6,
    /// `--gpus` as given (all, none, indexes, UUIDs, CDI names).
    pub gpus: String,
    /// `--gpu-capabilities` as given.
    pub gpu_capabilities: String,
    pub cdi_spec: Option<PathBuf>,
    pub name: Option<String>,
    pub workdir: PathBuf,
    pub user: Option<(u32, u32)>,
    /// Empty: the rootfs's shell (see [`default_shell`]).
    pub command: Vec<String>,
    /// A pseudo-terminal for the job (`exec -t`, `shell`; see `sandbox::console`).
    #[serde(default)]
    pub terminal: bool,
    /// `--cache NAME:PATH[:commit]` (see [`crate::cache`]).
    #[serde(default)]
    pub caches: Vec<String>,
    /// A proxy variable of `env` naming the host's loopback (`http_proxy=http://127.0.0.1:3128`)
    /// makes that port reachable from the job (see [`super::network::job_proxy_env`]).
    /// The command line's own `exec` only: never part of a request (setuid mode), whose
    /// caller must not open the host's loopback ports to jobs.
    #[serde(skip)]
    pub host_loopback_proxy: bool,
}

/// `--name`: it becomes a directory name, the container id and the hostname.
pub fn parse_job_name(s: &str) -> Result<String> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if !ok {
        bail!("bad --name '{s}': use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit");
    }
    Ok(s.to_string())
}

impl ExecRequest {
    /// The checks the command line makes, again: a request that arrives as JSON (setuid
    /// mode) did not go through the parsers.
    pub fn validate(&self) -> Result<()> {
        if let Some(n) = &self.name {
            parse_job_name(n)?;
        }
        for v in &self.volumes {
            let text = format!(
                "{}:{}{}",
                v.host.display(),
                v.container.display(),
                v.env.as_deref().map(|e| format!(":{e}")).unwrap_or_default()
            );
            if text.parse::<Volume>().ok().as_ref() != Some(v) {
                bail!("malformed volume in the request: {text}");
            }
        }
        if let Some((k, _)) = self.env.iter().find(|(k, _)| !crate::config::is_env_name(k)) {
            bail!("malformed environment variable name in the request: '{k}'");
        }
        self.cache_decls()?;
        Ok(())
    }

    /// The `--cache` flags, checked.
    pub fn cache_decls(&self) -> Result<Vec<crate::cache::CacheDecl>> {
        let decls = self.caches.iter().map(|c| c.parse()).collect::<Result<Vec<crate::cache::CacheDecl>>>()?;
        crate::cache::check_unique(&decls)?;
        Ok(decls)
    }
}

/// The whole `exec`: gc of what crashed runs left ([`super::gc_before_job`]), the plan, the job (signals to this
/// process forwarded to it), its clean-up. The rootfs stays leased until the job is gone.
pub fn run(home: &Home, driver_root: &Path, req: &ExecRequest) -> Result<super::JobOutcome> {
    let rootless = crate::rootless::mode().rootless;
    // A `none` job's network namespace: its socket now, for the early helper to take at
    // its fork; the namespace right after that fork, made by a thread while this plans
    // (the kernel's part, ~0.6 ms here, more while the last job's namespace is being torn
    // down, is otherwise what the helper waits for before the job's tree is done). Not
    // rootless: the thread makes the namespace's sysfs in our mount namespace, the
    // host's there, where a user namespace may not mount (fsopen: EPERM); the helper's
    // child does, in the helper's own.
    let (maker, netns) = match req.network {
        Network::None if !req.terminal && !rootless => crate::sys::net::loopback_maker()
            .map_err(|e| tracing::debug!("the job's namespace is left to its helper: {e}"))
            .ok(),
        _ => None,
    }
    .unzip();
    // Held until this returns (see the function).
    let _move_window = super::cgroup::move_window(crate::rootless::cgroups::CgroupHost::get(), rootless);
    super::prepare_home(home)?;
    let mut opts = super::RunOptions { forward_signals: true, ..Default::default() };
    // The job's helper, now: its first steps overlap the plan (see EarlyHelper). A job
    // with a terminal gets its helper after the plan (its console socket is in the job
    // dir); one that cannot be forked here gets it then too.
    let early = if req.terminal {
        None
    } else {
        super::EarlyHelper::fork(home, req.network, &opts, netns).unwrap_or_else(|e| {
            tracing::debug!("no early helper ({e:#}): forked after the plan");
            None
        })
    };
    // Joined when this returns (done long before). Without an early helper nobody takes
    // the namespace: its own helper makes it.
    let _loopback = maker.filter(|_| early.is_some()).map(crate::sys::net::LoopbackMaker::start);
    let mut net = super::network::JobNetwork { allow: req.network_allow.clone(), ..Default::default() };
    let mut env = None;
    if req.host_loopback_proxy && req.network == Network::Isolated {
        let (e, ports) = super::network::job_proxy_env(&req.env, &net, rootless);
        (env, net.host_ports) = (Some(e), ports);
    }
    super::network::check_host(req.network, &net, rootless)?;
    net.ipv6 = super::network::resolve_ipv6(req.network, req.ipv6, rootless)?;
    let register = !(net.allow.is_empty() && net.host_ports.is_empty());
    if req.network == Network::Isolated && !rootless && (register || net.ipv6) {
        // The allowed destinations' and the proxy's elements in the host's table; with
        // IPv6, its uplinks forwarding (`--ipv6 on` and a table without IPv6: an error).
        super::network::ensure_table(&mut net, true, req.ipv6)?;
    }
    super::gc_before_job(home).context("gc before exec failed")?.log();
    let (mut plan, lease) = prepare(home, driver_root, req)?;
    if let Some(env) = env {
        (plan.env, plan.net.host_ports) = (env, net.host_ports);
    }
    plan.net.ipv6 = net.ipv6;
    if req.network == Network::Isolated && !rootless {
        opts.keep_table = Some(plan.net.clone());
    }
    let outcome = if plan.caches.iter().any(|c| c.commit) {
        run_and_commit(home, plan, &opts, early)
    } else {
        super::run_job(home, plan, &opts, early)
    };
    drop(lease);
    outcome
}

/// [`super::run_job`] that commits the caches marked `commit` after the job, whatever
/// its exit (the operator asked for it), before its layers go.
fn run_and_commit(
    home: &Home,
    plan: JobPlan,
    opts: &super::RunOptions,
    early: Option<super::EarlyHelper>,
) -> Result<super::JobOutcome> {
    let mut sandbox = super::Sandbox::create(home, plan)?;
    sandbox.adopt_early_helper(early);
    let outcome = sandbox.run(&super::Phase::default(), opts);
    let all: Vec<usize> = (0..sandbox.plan().caches.len()).filter(|k| sandbox.plan().caches[*k].commit).collect();
    sandbox.commit_caches(&all, "exec --cache ...:commit");
    let cleanup = sandbox.teardown(false)?;
    outcome.map(|o| super::JobOutcome { cleanup, ..o })
}

/// Resolves the rootfs (leased for the job's life), discovers the GPUs' edits and builds
/// the job plan.
pub fn prepare(home: &Home, driver_root: &Path, req: &ExecRequest) -> Result<(JobPlan, RootfsLease)> {
    let store = Store::new(home);
    let rootfs_name = if req.rootfs == "auto" {
        use crate::gpu::GpuInventory;
        let inv = gpu::NvmlInventory::load(driver_root, &DiscoverOptions::default().extra_lib_dirs);
        crate::rootfs::select::resolve(&store, "auto", inv.cuda_driver_version().ok())?
    } else {
        req.rootfs.clone()
    };
    let lease = store.lease(&rootfs_name)?;
    let gpu_opts = DiscoverOptions {
        driver_root: driver_root.to_path_buf(),
        cdi_spec: req.cdi_spec.clone(),
        ..Default::default()
    };
    let gpus = GpuRequest::parse(&req.gpus)?;
    let caps: Capabilities = req.gpu_capabilities.parse()?;
    let rootfs = gpu::compat::RootfsCuda {
        name: &rootfs_name,
        tree: lease.path(),
        cuda_version: lease.info().cuda_version.as_deref(),
        disable_require: gpu::compat::disable_require(&req.env),
    };
    let edits = gpu::job_edits(&gpu_opts, &gpus, &caps, Some(&rootfs))?;
    let id = req.name.clone().unwrap_or_else(|| super::jobdir::new_job_id("exec"));
    if home.jobs_dir().join(&id).exists() {
        bail!("a job named '{id}' is already running: choose another --name");
    }
    let uid = req.user.map(|u| u.0).unwrap_or(0);
    let args = match req.command.is_empty() {
        true => vec![default_shell(lease.path(), uid)],
        false => req.command.clone(),
    };
    // One job: the node's defaults for one slot.
    // Its notes go to the debug log (below): read what only they need when it is shown.
    let notes = tracing::enabled!(tracing::Level::DEBUG);
    let node = limits::node::Node::read(home, crate::rootless::mode().rootless, notes);
    let resolved = limits::resolve(&req.limits, &node, 1);
    let plan = JobPlan {
        id: id.clone(),
        lower: vec![lease.path().to_path_buf()],
        args,
        env: req.env.clone(),
        cwd: req.workdir.clone(),
        uid,
        gid: req.user.map(|u| u.1).unwrap_or(0),
        hostname: id.clone(),
        volumes: req.volumes.clone(),
        limits: resolved.limits,
        network: req.network,
        net: super::network::JobNetwork { allow: req.network_allow.clone(), ..Default::default() },
        edits,
        cgroup_path: super::teardown::cgroup_path_for(home, &id),
        owned_dirs: vec![],
        rootless: false,
        process: super::plan::ProcessPlan { init: None, terminal: req.terminal },
        userns: None,
        scratch: None,
        caches: req.cache_decls()?.iter().map(|d| d.mount(home)).collect(),
    };
    // Bad input fails in one line first; then the limits' warnings (what was asked and is
    // not given), once per exec; what the node cannot give unasked goes to the log only.
    super::runner::validate(&plan)?;
    for w in &resolved.warnings {
        tracing::warn!("{w}");
    }
    for n in &resolved.notes {
        tracing::debug!("{n}");
    }
    Ok((plan, lease))
}

/// What `exec` with no command runs: the job user's login shell from the rootfs's
/// `/etc/passwd` (when it is one: not nologin or false, and present in the rootfs), else
/// `/bin/bash`, else `/bin/sh`. Paths are looked up inside the tree, never followed out.
pub fn default_shell(tree: &Path, uid: u32) -> String {
    let exists = |p: &str| super::inroot::open_existing(tree, Path::new(p)).is_ok();
    let passwd = super::inroot::read_file(tree, Path::new("/etc/passwd"), 1 << 20).unwrap_or_default();
    let passwd = String::from_utf8_lossy(&passwd);
    let from_passwd = login_shell(&passwd, uid).filter(|s| exists(s));
    from_passwd.map(str::to_owned).unwrap_or_else(|| if exists("/bin/bash") { "/bin/bash" } else { "/bin/sh" }.into())
}

/// The login shell of `uid` in the text of a passwd file, when it is a usable one.
fn login_shell(passwd: &str, uid: u32) -> Option<&str> {
    let entry = passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() == 7 && f[2].parse::<u32>().ok() == Some(uid))?;
    let shell = entry[6].trim();
    let usable = shell.starts_with('/') && !shell.ends_with("/nologin") && !shell.ends_with("/false");
    usable.then_some(shell)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> ExecRequest {
        serde_json::from_str(
            r#"{"rootfs":"bb","volumes":[],"env":[],"limits":{},
               "network":"Host","gpus":"none","gpu_capabilities":"compute","cdi_spec":null,"name":null,
               "workdir":"/","user":null,"command":["true"]}"#,
        )
        .unwrap()
    }

    #[test]
    fn a_request_that_skipped_the_parsers_is_checked_again() {
        assert!(req().validate().is_ok());
        let bad_name = ExecRequest { name: Some("../../etc".into()), ..req() };
        assert!(bad_name.validate().unwrap_err().to_string().contains("bad --name"));
        let vol = Volume { host: "/data".into(), container: "/a/../../x".into(), env: None };
        let bad_vol = ExecRequest { volumes: vec![vol], ..req() };
        assert!(bad_vol.validate().unwrap_err().to_string().contains("malformed volume"));
        let bad_env = ExecRequest { env: vec![("A=B".into(), "x".into())], ..req() };
        assert!(bad_env.validate().unwrap_err().to_string().contains("malformed environment"));
        assert!(ExecRequest { command: vec![], ..req() }.validate().is_ok(), "no command: the rootfs's shell");
        assert!(!req().terminal, "a request without the field (an older unprivileged side): no terminal");
        let extra = r#"{"rootfs":"bb","privileged":true}"#;
        assert!(serde_json::from_str::<ExecRequest>(extra).is_err(), "unknown fields are refused");
        // A setuid caller cannot ask for the host's loopback proxy ports: the field is
        // never sent, and a request that names it is refused.
        let asked = ExecRequest { host_loopback_proxy: true, ..req() };
        let json = serde_json::to_string(&asked).unwrap();
        assert!(!json.contains("host_loopback_proxy"), "{json}");
        assert!(!serde_json::from_str::<ExecRequest>(&json).unwrap().host_loopback_proxy);
        let forged = json.replacen('{', r#"{"host_loopback_proxy":true,"#, 1);
        assert!(serde_json::from_str::<ExecRequest>(&forged).is_err(), "{forged}");
    }

    #[test]
    fn the_shell_of_an_exec_without_command() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nazp:x:1000:1000::/home/azp:/bin/sh\n\
                      daemon:x:1:1::/:/usr/sbin/nologin\nbad line\n";
        assert_eq!(login_shell(passwd, 0), Some("/bin/bash"));
        assert_eq!(login_shell(passwd, 1000), Some("/bin/sh"));
        assert_eq!(login_shell(passwd, 1), None, "nologin is no shell");
        assert_eq!(login_shell(passwd, 4242), None);
        let t = tempfile::tempdir().unwrap();
        let tree = t.path();
        std::fs::create_dir_all(tree.join("etc")).unwrap();
        std::fs::create_dir_all(tree.join("bin")).unwrap();
        std::fs::write(tree.join("bin/sh"), "").unwrap();
        assert_eq!(default_shell(tree, 0), "/bin/sh", "no passwd, no bash");
        std::fs::write(tree.join("bin/bash"), "").unwrap();
        assert_eq!(default_shell(tree, 0), "/bin/bash");
        std::fs::write(tree.join("etc/passwd"), passwd).unwrap();
        assert_eq!(default_shell(tree, 1000), "/bin/sh", "the user's own");
        std::fs::write(tree.join("etc/passwd"), "root:x:0:0::/root:/usr/bin/zsh\n").unwrap();
        assert_eq!(default_shell(tree, 0), "/bin/bash", "a shell the rootfs lacks");
        // A link out of the tree is resolved inside it (and not found there).
        std::fs::remove_file(tree.join("etc/passwd")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", tree.join("etc/passwd")).unwrap();
        std::fs::remove_file(tree.join("bin/bash")).unwrap();
        assert_eq!(default_shell(tree, 0), "/bin/sh");
    }
}
