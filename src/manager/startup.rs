//! Start-up checks of `run`, in order, before any slot starts; each fails with what to
//! fix: the home (and gc of what a crashed run left), the server (PAT, pool,
//! permission), the GPUs and their split among the slots, the rootfs, the agent
//! package, and the pool's stale records of this host.

use super::{prune, RunContext};
use crate::agent::package::{AgentPackage, PackageCache};
use crate::agent::preflight::{self, UserRule};
use crate::azure::AzureClient;
use crate::config::Home;
use crate::gpu::{self, DiscoverOptions, GpuInfo, PerAgent};
use crate::rootfs::{RootfsLease, Store};
use crate::settings::{self, RunSettings};
use anyhow::{bail, Result};
use std::path::Path;

/// What the checks found, for the slots.
pub struct Ready {
    pub token: String,
    pub client: AzureClient,
    pub pool_id: u64,
    pub driver: gpu::Driver,
    /// Per slot: its GPUs (none for CPU-only slots).
    pub split: Vec<Vec<GpuInfo>>,
    /// `<prefix>-<slot>`, per slot.
    pub names: Vec<String>,
    pub rootfs_name: String,
    /// Held for the manager's lifetime: the rootfs cannot be removed under the slots.
    pub lease: RootfsLease,
    /// Who the agents run as: None for root (the rootfs has no `azp` user).
    pub user: Option<(u32, u32)>,
    pub packages: PackageCache,
    pub package: AgentPackage,
    /// The rootfs's CUDA against the driver's (GPU slots only; see [`gpu::compat`]).
    pub compat: Option<gpu::compat::Compat>,
    /// The jobs' network settings, and the service's proxy variables as jobs get them.
    pub net: crate::sandbox::network::JobNetwork,
    pub proxy_env: Vec<(String, String)>,
}

pub fn check(home: &Home, settings: &RunSettings, ctx: RunContext) -> Result<Ready> {
    crate::sandbox::prepare_home(home)?;
    crate::sandbox::gc(home)?.log();
    for stale in super::workdir::prepare(home, settings)? {
        tracing::info!("removed the work dir {} left by an earlier run", stale.display());
    }
    if let Some(why) = super::workdir::no_quota(settings, crate::rootless::mode().rootless) {
        tracing::warn!("{why}");
    }
    // Local checks first: a local mistake is reported at once, not after the network's
    // retries (which is all an unreachable server would have said).
    let (mut net, proxy_env) = network(settings)?;
    if settings.network == crate::config::Network::Isolated {
        let rootless = crate::rootless::mode().rootless;
        tracing::info!("jobs' network: {}", crate::sandbox::network::ipv6_note(settings.network_ipv6, rootless));
    }
    let (driver, split) = gpus(settings, &ctx.driver_root)?;
    let (rootfs_name, lease) = rootfs(home, settings, &driver)?;
    let compat = cuda_compat(&rootfs_name, &lease, &driver, &split)?;
    let (token, client, pool_id) = server(settings, ctx.env_token)?;
    // The git mirrors' remotes answer, and each mirror exists for the jobs' plans to bind.
    crate::mirror::keeper::prepare(home, &settings.git_mirrors)?;
    let packages = PackageCache::new(home);
    let package = match &settings.agent_package {
        Some(src) => packages.ensure_from(src)?,
        None => packages.ensure_latest(&client, crate::azure::host_platform())?,
    };
    tracing::info!("agent package {} at {}", package.version, package.dir.display());
    agent_preflight(&rootfs_name, &lease, &package, settings, ctx.job_user.is_some())?;
    let user = ctx.job_user.or_else(|| preflight::rootfs_user(lease.path()));
    if user.is_none() {
        tracing::warn!(
            "rootfs '{rootfs_name}' has no '{}' user: agents run as root in the sandbox (AGENT_ALLOW_RUNASROOT is set)",
            preflight::AGENT_USER
        );
    }
    let names = slot_names(&settings.name_prefix, split.len());
    let autoscaling = settings.autoscale.is_some();
    // Autoscaling re-registers a slot's agent when it starts: no record is kept meanwhile.
    prune(&client, pool_id, &settings.name_prefix, |n| !autoscaling && names.iter().any(|m| m == n))?;
    if settings.network == crate::config::Network::Isolated && !crate::rootless::mode().rootless {
        // Last, once nothing else can fail: the host's table, with the proxy's port and
        // the allowed destinations.
        crate::sandbox::network::ensure_table(&mut net, true, settings.network_ipv6)?;
    }
    Ok(Ready {
        token,
        client,
        pool_id,
        driver,
        split,
        names,
        rootfs_name,
        lease,
        user,
        packages,
        package,
        compat,
        net,
        proxy_env,
    })
}

/// The jobs' network, checked on this host (nothing made yet), and the proxy variables
/// jobs get.
pub fn network(settings: &RunSettings) -> Result<(crate::sandbox::network::JobNetwork, Vec<(String, String)>)> {
    use crate::sandbox::network;
    let rootless = crate::rootless::mode().rootless;
    let mut net = network::JobNetwork {
        allow: settings.network_allow.clone(),
        subnet: settings.network_subnet,
        ..Default::default()
    };
    let (env, ports) = jobs_proxy(settings, &net, rootless);
    if settings.network == crate::config::Network::Isolated {
        net.host_ports = ports;
    }
    network::check_host(settings.network, &net, rootless)?;
    net.ipv6 = network::resolve_ipv6(settings.network, settings.network_ipv6, rootless)?;
    Ok((net, env))
}

/// What jobs get of the service's proxy variables, and the ports of the host's loopback
/// forwarded for them: none in setuid mode (`proxy_as_is`), where the variables are the
/// caller's and the host's table is shared by every job.
fn jobs_proxy(
    settings: &RunSettings,
    net: &crate::sandbox::network::JobNetwork,
    rootless: bool,
) -> (Vec<(String, String)>, crate::sandbox::network::HostPorts) {
    if settings.proxy_as_is {
        return (settings.proxy_env.clone(), vec![]);
    }
    crate::sandbox::network::proxy_env(&settings.proxy_env, net, rootless)
}

/// The PAT works, the pool exists and we may manage its agents. Returns the PAT, the
/// client and the pool's id.
fn server(settings: &RunSettings, env_token: Option<String>) -> Result<(String, AzureClient, u64)> {
    let token = settings::read_token(settings.token_file.as_deref(), env_token)?;
    let client = AzureClient::new(&settings.url, &token)?;
    client.check_connection()?;
    let pool = client.find_pool(&settings.pool)?;
    client.check_manage_permission(pool.id)?;
    tracing::info!("connected to {} (pool '{}', id {})", settings.url, pool.name, pool.id);
    Ok((token, client, pool.id))
}

/// The driver and the GPUs, and which slot gets which.
pub fn gpus(settings: &RunSettings, driver_root: &Path) -> Result<(gpu::Driver, Vec<Vec<GpuInfo>>)> {
    let gpu_opts = DiscoverOptions {
        driver_root: driver_root.to_path_buf(),
        extra_lib_dirs: [DiscoverOptions::default().extra_lib_dirs, settings.extra_lib_dirs.clone()].concat(),
        cdi_spec: None,
    };
    let inventory = gpu::NvmlInventory::load(&gpu_opts.driver_root, &gpu_opts.extra_lib_dirs);
    let mut driver = gpu::discover(&gpu_opts, &inventory)?;
    let slurm = slurm_gpus(std::env::var_os("SLURM_JOB_ID").is_some(), std::env::var("SLURM_JOB_GPUS").ok().as_deref());
    if let Some(ids) = slurm {
        driver.gpus.retain(|g| ids.contains(&g.index));
        tracing::info!("Slurm job: using the GPUs it was given ({ids:?}): {} found", driver.gpus.len());
    }
    let split = split_slots(settings, &driver.gpus, || driver.unavailable_reason().map(|r| run_hint(&r)))?;
    Ok((driver, split))
}

/// In a Slurm batch job (`SLURM_JOB_ID` set), only the GPUs Slurm gave the job:
/// `SLURM_JOB_GPUS`, a comma list of indexes. None: use every GPU found.
pub fn slurm_gpus(in_slurm_job: bool, job_gpus: Option<&str>) -> Option<Vec<u32>> {
    let ids = job_gpus.filter(|v| !v.is_empty())?;
    in_slurm_job.then(|| ids.split(',').filter_map(|i| i.trim().parse().ok()).collect())
}

/// How many slots, and the GPUs of each: `--agents` (with autoscaling `--max-agents`),
/// by default one per GPU; `--gpus-per-agent` each, except on a host without GPUs where
/// an agent count was given and the split was left at its default: plain CPU slots.
/// `unavailable` says why no GPU was found, for the error.
pub fn split_slots(
    settings: &RunSettings,
    gpus: &[GpuInfo],
    unavailable: impl FnOnce() -> Option<String>,
) -> Result<Vec<Vec<GpuInfo>>> {
    let agents_given = settings.agents.or(settings.autoscale.as_ref().and_then(|a| a.max_agents));
    let per_agent = if gpus.is_empty() && settings.gpus_per_agent == PerAgent::Count(1) && agents_given.is_some() {
        PerAgent::None
    } else {
        settings.gpus_per_agent
    };
    let agents = agents_given.unwrap_or_else(|| gpu::select::default_agents(gpus));
    if let Some(a) = &settings.autoscale {
        if a.min_agents > agents {
            bail!(
                "--min-agents {} is more than the {agents} slot(s) this host has: lower it or raise --max-agents",
                a.min_agents
            );
        }
    }
    if per_agent == PerAgent::None {
        return Ok(vec![vec![]; agents]);
    }
    if gpus.is_empty() {
        bail!(
            "{}",
            unavailable()
                .unwrap_or_else(|| "no NVIDIA GPU found: use --gpus-per-agent none for CPU-only agents".into())
        );
    }
    gpu::select::split(gpus, agents, per_agent)
}

/// The driver's reason names `exec`'s flag; `run`'s is `--gpus-per-agent`.
pub fn run_hint(reason: &str) -> String {
    reason.replace("--gpus none", "--gpus-per-agent none")
}

fn slot_names(prefix: &str, slots: usize) -> Vec<String> {
    (0..slots).map(|i| format!("{prefix}-{i}")).collect()
}

/// The rootfs the settings name (or the newest the driver's CUDA supports), leased.
pub fn rootfs(home: &Home, settings: &RunSettings, driver: &gpu::Driver) -> Result<(String, RootfsLease)> {
    let store = Store::new(home);
    let driver_cuda = gpu::compat::driver_cuda(driver).map(|(c, _)| c);
    let name = crate::rootfs::select::resolve(&store, &settings.rootfs, driver_cuda)?;
    let lease = store.lease(&name)?;
    Ok((name, lease))
}

/// The rootfs against what the agent package needs, before any slot: a rootfs that cannot
/// run the agent fails here in one line naming what is missing and how to add it, instead
/// of as a config.sh failure that every slot would retry forever.
fn agent_preflight(
    rootfs_name: &str,
    lease: &RootfsLease,
    package: &AgentPackage,
    settings: &RunSettings,
    user_given: bool,
) -> Result<()> {
    let needs = preflight::Needs::of_package(&package.dir, &settings.url);
    let rule = if user_given { UserRule::Given } else { UserRule::Rootfs { allow_root: settings.agents_as_root } };
    let r = preflight::check(lease.path(), &needs, rule);
    if !r.ready {
        bail!("{}", r.error_line(rootfs_name));
    }
    tracing::info!(
        "rootfs '{rootfs_name}' can run agent package {} (glibc {})",
        package.version,
        r.glibc.as_deref().unwrap_or("-")
    );
    Ok(())
}

/// The rootfs's CUDA against the driver's, before any slot takes a job: a rootfs newer
/// than the driver fails here in one line, not with CUDA error 803/804 in every job.
pub fn cuda_compat(
    rootfs_name: &str,
    lease: &RootfsLease,
    driver: &gpu::Driver,
    split: &[Vec<GpuInfo>],
) -> Result<Option<gpu::compat::Compat>> {
    let gpus: Vec<GpuInfo> = split.iter().flatten().cloned().collect();
    if gpus.is_empty() {
        return Ok(None);
    }
    let rootfs = gpu::compat::RootfsCuda {
        name: rootfs_name,
        tree: lease.path(),
        cuda_version: lease.info().cuda_version.as_deref(),
        disable_require: false,
    };
    let verdict = gpu::compat::check(&rootfs, driver, &gpus)?;
    gpu::log_compat(rootfs_name, &verdict);
    Ok(Some(verdict))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scaler::AutoscaleSettings;

    fn settings(agents: Option<usize>, per_agent: PerAgent) -> RunSettings {
        let flags = settings::FlagSettings {
            url: Some("https://dev.azure.com/o".into()),
            pool: Some("p".into()),
            name_prefix: Some("h".into()),
            agents,
            ..Default::default()
        };
        RunSettings {
            gpus_per_agent: per_agent,
            ..settings::merge(Default::default(), Default::default(), flags).unwrap()
        }
    }

    fn gpus(n: u32) -> Vec<GpuInfo> {
        (0..n)
            .map(|i| GpuInfo {
                index: i,
                uuid: None,
                name: String::new(),
                minor: i,
                memory_total_bytes: None,
                compute_capability: None,
                mig_enabled: None,
                mig: None,
                pci_bus_id: None,
                source: gpu::GpuSource::DeviceNodes,
            })
            .collect()
    }

    fn no_reason() -> Option<String> {
        None
    }

    #[test]
    fn a_loopback_proxy_is_forwarded_unless_it_is_a_setuid_callers() {
        let mut s = settings(Some(1), PerAgent::None);
        s.proxy_env = vec![("HTTP_PROXY".into(), "http://127.0.0.1:3128".into())];
        let net = crate::sandbox::network::JobNetwork::default();
        let (env, ports) = jobs_proxy(&s, &net, false);
        assert_eq!(env[0].1, "http://10.87.0.1:3128");
        assert_eq!(ports.len(), 1, "{ports:?}");
        s.proxy_as_is = true;
        let (env, ports) = jobs_proxy(&s, &net, false);
        assert_eq!((env, ports.len()), (s.proxy_env.clone(), 0), "as it is, and no host port");
    }

    #[test]
    fn one_slot_per_gpu_by_default() {
        let split = split_slots(&settings(None, PerAgent::Count(1)), &gpus(3), no_reason).unwrap();
        assert_eq!(
            split.iter().map(|s| s.iter().map(|g| g.index).collect::<Vec<_>>()).collect::<Vec<_>>(),
            [vec![0], vec![1], vec![2]]
        );
        let split = split_slots(&settings(Some(2), PerAgent::All), &gpus(3), no_reason).unwrap();
        assert_eq!(split.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3], "shared GPUs");
        let e = split_slots(&settings(Some(4), PerAgent::Count(1)), &gpus(3), no_reason).unwrap_err();
        assert!(e.to_string().contains("this host has 3 GPUs"), "{e}");
    }

    #[test]
    fn no_gpu_host() {
        // An agent count and the default split: CPU slots.
        let split = split_slots(&settings(Some(2), PerAgent::Count(1)), &[], no_reason).unwrap();
        assert_eq!(split, vec![Vec::<GpuInfo>::new(); 2]);
        assert_eq!(split_slots(&settings(None, PerAgent::None), &[], no_reason).unwrap().len(), 1);
        // No count: GPUs were expected; the error says why none was found, or what to do.
        let e = split_slots(&settings(None, PerAgent::Count(1)), &[], no_reason).unwrap_err();
        assert!(e.to_string().contains("--gpus-per-agent none"), "{e}");
        let e = split_slots(&settings(None, PerAgent::Count(1)), &[], || Some("NVML: driver not loaded".into()));
        assert_eq!(e.unwrap_err().to_string(), "NVML: driver not loaded");
        // The driver's own reason names exec's flag: run's hint names run's.
        let empty = tempfile::tempdir().unwrap();
        let opts = DiscoverOptions { driver_root: empty.path().into(), extra_lib_dirs: vec![], cdi_spec: None };
        let inventory = gpu::NvmlInventory::load(empty.path(), &[]);
        let driver = gpu::discover(&opts, &inventory).unwrap();
        let reason = driver.unavailable_reason().unwrap();
        assert!(reason.contains("--gpus none"), "{reason}");
        let e =
            split_slots(&settings(None, PerAgent::Count(1)), &[], || driver.unavailable_reason().map(|r| run_hint(&r)));
        let e = e.unwrap_err().to_string();
        assert!(e.contains("use --gpus-per-agent none") && !e.contains("--gpus none"), "{e}");
        let e = split_slots(&settings(Some(2), PerAgent::All), &[], no_reason).unwrap_err();
        assert!(e.to_string().contains("no NVIDIA GPU found"), "{e}");
    }

    #[test]
    fn autoscaling_counts_max_agents_and_checks_min() {
        let mut s = settings(None, PerAgent::None);
        s.autoscale = Some(AutoscaleSettings { max_agents: Some(3), min_agents: 1, ..Default::default() });
        assert_eq!(split_slots(&s, &gpus(1), no_reason).unwrap().len(), 3, "--max-agents slots");
        s.autoscale = Some(AutoscaleSettings { max_agents: None, min_agents: 3, ..Default::default() });
        let e = split_slots(&s, &gpus(2), no_reason).unwrap_err();
        assert!(e.to_string().contains("--min-agents 3 is more than the 2 slot(s)"), "{e}");
    }

    #[test]
    fn slurm_jobs_keep_their_gpus() {
        assert_eq!(slurm_gpus(true, Some("0, 2")), Some(vec![0, 2]));
        assert_eq!(slurm_gpus(false, Some("0,2")), None, "not in a batch job: ignored");
        assert_eq!(slurm_gpus(true, Some("")), None);
        assert_eq!(slurm_gpus(true, None), None);
    }
}
