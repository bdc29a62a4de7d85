//! Settings of `azp-sandbox run` (and of `agents prune` and `slurm`, which take the
//! pool's part), merged once: flags > AZP_* environment > config file. Validated here
//! into one typed value, with one-line errors naming the setting and where it came from.

use super::env::Env;
use super::file::{read_file, FileSettings};
use crate::config::{parse_size, parse_subnet, Network, NetworkAllow, Volume};
use crate::gpu::PerAgent;
use crate::sandbox::limits::{self, LimitsAsk};
use crate::scaler::AutoscaleSettings;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What the command line gave (None = not given).
#[derive(Debug, Default, Clone)]
pub struct FlagSettings {
    pub url: Option<String>,
    pub token_file: Option<PathBuf>,
    pub pool: Option<String>,
    pub agents: Option<usize>,
    pub rootfs: Option<String>,
    pub volumes: Vec<Volume>,
    pub gpus_per_agent: Option<String>,
    pub limits: LimitsAsk,
    pub agent_package: Option<String>,
    pub name_prefix: Option<String>,
    pub drain_timeout: Option<Duration>,
    pub cancel_grace: Option<Duration>,
    pub hooks_dir: Option<PathBuf>,
    /// Stop after this long without a job (Slurm batch jobs).
    pub exit_when_idle: Option<Duration>,
    pub autoscale: bool,
    pub min_agents: Option<usize>,
    pub max_agents: Option<usize>,
    pub idle_timeout: Option<Duration>,
    pub poll_interval: Option<Duration>,
    /// `--userns`.
    pub userns: Option<crate::identity::Choice>,
    pub network: Option<Network>,
    pub network_allow: Vec<NetworkAllow>,
    /// `--ipv6`.
    pub network_ipv6: Option<crate::config::Ipv6>,
    /// The service's HTTP(S)_PROXY and NO_PROXY (either case), from the environment.
    pub proxy_env: Vec<(String, String)>,
    /// Setuid mode: the caller's proxy variables reach jobs as they are, and no port of
    /// the host's loopback is forwarded for them (the host's table is shared by every
    /// job: an ordinary user's HTTP_PROXY must not open a host port to all of them).
    pub proxy_as_is: bool,
    /// Where each job's agent work folder lives on the host (AZP_WORK).
    pub work_dir: Option<PathBuf>,
    /// Keep the layers and logs of this many failed jobs.
    pub keep_failed: Option<usize>,
    /// The most bytes of agent `_diag` logs kept per agent.
    pub diag_logs_max: Option<u64>,
    /// AGENT_ALLOW_RUNASROOT: agents may run as root when the rootfs has no `azp` user.
    pub agents_as_root: bool,
}

/// The service's proxy variables that jobs get.
pub const PROXY_VARS: &[&str] = &["HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"];

/// The validated settings of one `run`.
#[derive(Debug, Clone)]
pub struct RunSettings {
    pub url: String,
    pub token_file: Option<PathBuf>,
    pub pool: String,
    /// None: one per GPU (or 1 without GPUs).
    pub agents: Option<usize>,
    pub rootfs: String,
    pub volumes: Vec<Volume>,
    pub gpus_per_agent: PerAgent,
    /// Per-job limits as asked (flags over keys); the slots resolve them against the node.
    pub limits: LimitsAsk,
    pub agent_package: Option<String>,
    pub name_prefix: String,
    pub drain_timeout: Duration,
    /// After the drain timeout, a running job is cancelled (SIGINT to the agent); it is
    /// killed if still there this much later.
    pub cancel_grace: Duration,
    pub hooks_dir: Option<PathBuf>,
    pub hook_timeout: Duration,
    pub extra_lib_dirs: Vec<PathBuf>,
    pub exit_when_idle: Option<Duration>,
    /// Some: slots start and stop with the queue.
    pub autoscale: Option<AutoscaleSettings>,
    /// Whose ids jobs run as (see [`crate::identity`]).
    pub userns: crate::identity::Choice,
    pub network: Network,
    pub network_allow: Vec<NetworkAllow>,
    /// None: the default (see `sandbox::network::DEFAULT_SUBNET`).
    pub network_subnet: Option<crate::sys::net::Ipv4Net>,
    /// Whether jobs get outbound IPv6 (see `sandbox::network::ipv6`).
    pub network_ipv6: crate::config::Ipv6,
    /// What jobs get of HTTP(S)_PROXY and NO_PROXY, as the service has them (a proxy on
    /// the host's loopback is rewritten to the jobs' gateway when the job plan is made,
    /// unless `proxy_as_is`).
    pub proxy_env: Vec<(String, String)>,
    /// See [`FlagSettings::proxy_as_is`].
    pub proxy_as_is: bool,
    /// A host dir (absolute) holding a fresh dir per job for the agent's work folder
    /// (`_work`), bound read-write; None: in the job's writable layer.
    pub work_dir: Option<PathBuf>,
    /// The layers and logs of the last this-many failed jobs are kept (`HOME/failed`).
    pub keep_failed: usize,
    /// The most bytes of `_diag` logs kept per agent under `HOME/logs/<agent>/`.
    pub diag_logs_max: u64,
    /// The rootfs may lack an unprivileged user: agents then run as root in the sandbox
    /// (the agent's own opt-in, `AGENT_ALLOW_RUNASROOT`, set for `run`).
    pub agents_as_root: bool,
    /// Bare mirrors kept fresh by the manager, bound read-only into every job as git
    /// alternates (see [`crate::mirror`]).
    pub git_mirrors: Vec<crate::mirror::MirrorSpec>,
    /// `[[cache]]`: the caches every job gets (see [`crate::cache`]).
    pub caches: Vec<crate::cache::CacheDecl>,
    /// `trusted_branches`: builds of these commit the caches (empty: `refs/heads/main`).
    pub trusted_branches: Vec<String>,
}

/// How long a cancelled agent gets to report its job and exit before it is killed: the
/// real listener cancels the job's steps (SIGINT, SIGTERM, then kill), reports the result
/// and deletes its session within a few seconds.
pub const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(30);

/// Default of [`RunSettings::diag_logs_max`]: 200 MiB.
pub const DEFAULT_DIAG_LOGS_MAX: u64 = 200 << 20;

/// `--diag-logs-max`: a size (`200M`), or 0 to keep none.
pub fn parse_logs_max(s: &str) -> Result<u64> {
    if s.trim() == "0" {
        return Ok(0);
    }
    parse_size(s)
}

/// Environment overrides (AZP_URL, AZP_TOKEN_FILE, AZP_POOL, AZP_AGENT_NAME as the prefix,
/// AZP_WORK as `--work-dir`), and AGENT_ALLOW_RUNASROOT (no flag: the agent's own opt-in).
pub fn env_settings(get: impl Fn(&str) -> Option<String>) -> FlagSettings {
    FlagSettings {
        url: get("AZP_URL"),
        token_file: get("AZP_TOKEN_FILE").map(PathBuf::from),
        pool: get("AZP_POOL"),
        name_prefix: get("AZP_AGENT_NAME"),
        proxy_env: PROXY_VARS.iter().filter_map(|k| Some((k.to_string(), get(k)?))).collect(),
        work_dir: get("AZP_WORK").map(PathBuf::from),
        agents_as_root: get("AGENT_ALLOW_RUNASROOT").is_some(),
        ..Default::default()
    }
}

/// `run`'s settings from the three sources: the config file (`config`, or the default
/// path when present), the environment, the flags.
pub fn for_run(config: Option<&Path>, env: &Env, flags: FlagSettings) -> Result<RunSettings> {
    let file = read_file(config)?;
    merge(file, env_settings(|k| env.var(k)), flags)
}

/// A setting given as a flag (or its environment variable), else the config file's
/// `key` parsed, else the default.
fn flag_or_key<T>(flag: Option<T>, file: Option<&str>, key: &str) -> Result<T>
where
    T: std::str::FromStr<Err = anyhow::Error> + Default,
{
    match flag {
        Some(v) => Ok(v),
        None => Ok(file
            .map(str::parse)
            .transpose()
            .with_context(|| format!("bad {key} in the config file"))?
            .unwrap_or_default()),
    }
}

pub fn merge(file: FileSettings, env: FlagSettings, flags: FlagSettings) -> Result<RunSettings> {
    let autoscale = autoscale_settings(&file, &flags)?;
    let limits = flags.limits.or(file_limits(&file)?);
    let git_mirrors = crate::mirror::specs(&file.git_mirror).context("in the config file")?;
    let pick = |f: Option<String>, e: Option<String>, c: Option<String>| f.or(e).or(c);
    let url = pick(flags.url, env.url, file.url)
        .context("no Azure DevOps URL: pass --url https://dev.azure.com/ORG, set AZP_URL, or url in the config file")?;
    let url = url.trim_end_matches('/').to_string();
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        bail!("bad URL '{url}': use the organization URL, e.g. https://dev.azure.com/ORG");
    }
    let pool = pick(flags.pool, env.pool, file.pool)
        .context("no agent pool: pass --pool NAME, set AZP_POOL, or pool in the config file")?;
    let rootfs = flags.rootfs.or(file.rootfs).unwrap_or_else(|| "auto".into());
    let mut volumes = flags.volumes;
    if volumes.is_empty() {
        volumes = file
            .volumes
            .iter()
            .map(|v| v.parse())
            .collect::<Result<Vec<Volume>>>()
            .context("bad volumes in the config file")?;
    }
    let gpus_per_agent = match flags.gpus_per_agent.or(file.gpus_per_agent).as_deref() {
        None => PerAgent::Count(1),
        Some(s) => parse_per_agent(s)?,
    };
    let name_prefix = pick(flags.name_prefix, env.name_prefix, file.name_prefix).unwrap_or_else(hostname);
    if name_prefix.is_empty() || !name_prefix.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        bail!("bad agent name prefix '{name_prefix}': use letters, digits, '-', '_' or '.'");
    }
    if flags.agents == Some(0) || file.agents == Some(0) {
        bail!("--agents must be at least 1");
    }
    let userns = flag_or_key(flags.userns, file.userns.as_deref(), "userns")?;
    let network = flag_or_key(flags.network, file.network.as_deref(), "network")?;
    let mut network_allow = flags.network_allow;
    if network_allow.is_empty() {
        network_allow = file
            .network_allow
            .iter()
            .map(|a| a.parse())
            .collect::<Result<Vec<NetworkAllow>>>()
            .context("bad network_allow in the config file")?;
    }
    let network_ipv6 = flag_or_key(flags.network_ipv6, file.network_ipv6.as_deref(), "network_ipv6")?;
    let network_subnet = file
        .network_subnet
        .as_deref()
        .map(parse_subnet)
        .transpose()
        .context("bad network_subnet in the config file")?;
    let mut proxy_env = if flags.proxy_env.is_empty() { env.proxy_env } else { flags.proxy_env };
    if let Some(p) = file.proxy.filter(|_| {
        !proxy_env.iter().any(|(k, _)| k.eq_ignore_ascii_case("HTTPS_PROXY") || k.eq_ignore_ascii_case("HTTP_PROXY"))
    }) {
        if !(p.starts_with("http://") || p.starts_with("https://")) {
            bail!("bad proxy '{p}' in the config file: use a URL, e.g. http://127.0.0.1:3128");
        }
        for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            proxy_env.push((k.to_string(), p.clone()));
        }
    }
    let work_dir = flags.work_dir.or(env.work_dir).or(file.work_dir);
    if let Some(w) = work_dir.as_ref().filter(|w| !w.is_absolute()) {
        bail!("bad work dir '{}': give an absolute host path to --work-dir (AZP_WORK, work_dir)", w.display());
    }
    let diag_logs_max = match flags.diag_logs_max {
        Some(m) => m,
        None => file
            .diag_logs_max
            .as_deref()
            .map(parse_logs_max)
            .transpose()
            .context("bad diag_logs_max in the config file")?
            .unwrap_or(DEFAULT_DIAG_LOGS_MAX),
    };
    Ok(RunSettings {
        git_mirrors,
        url,
        token_file: flags.token_file.or(env.token_file).or(file.token_file),
        pool,
        agents: flags.agents.or(file.agents),
        rootfs,
        volumes,
        gpus_per_agent,
        limits,
        agent_package: flags.agent_package.or(file.agent_package),
        name_prefix,
        drain_timeout: flags
            .drain_timeout
            .or(file.drain_timeout_secs.map(Duration::from_secs))
            .unwrap_or(Duration::from_secs(600)),
        cancel_grace: flags
            .cancel_grace
            .or(file.cancel_grace_secs.map(Duration::from_secs))
            .unwrap_or(DEFAULT_CANCEL_GRACE),
        hooks_dir: flags.hooks_dir.or(file.hooks_dir),
        hook_timeout: Duration::from_secs(file.hook_timeout_secs.unwrap_or(60)),
        extra_lib_dirs: file.extra_lib_dirs,
        exit_when_idle: flags.exit_when_idle,
        autoscale,
        userns,
        network,
        network_allow,
        network_subnet,
        network_ipv6,
        proxy_env,
        proxy_as_is: flags.proxy_as_is,
        work_dir,
        keep_failed: flags.keep_failed.or(file.keep_failed).unwrap_or(0),
        diag_logs_max,
        agents_as_root: flags.agents_as_root || env.agents_as_root,
        caches: file_caches(&file.cache)?,
        trusted_branches: file.trusted_branches.clone(),
    })
}

/// The `[[cache]]` tables, checked: names, paths, sizes, no overlap.
fn file_caches(tables: &[super::file::CacheFile]) -> Result<Vec<crate::cache::CacheDecl>> {
    let decls = tables
        .iter()
        .map(|c| {
            let name = crate::cache::check_name(&c.name).context("bad [[cache]] in the config file")?;
            let path = crate::cache::check_path(&name, &c.path).context("bad [[cache]] in the config file")?;
            let max_size = c
                .max_size
                .as_deref()
                .map(crate::config::parse_size)
                .transpose()
                .with_context(|| format!("bad max_size of cache '{name}' in the config file"))?;
            Ok(crate::cache::CacheDecl { name, path, max_size, commit: false })
        })
        .collect::<Result<Vec<_>>>()?;
    crate::cache::check_unique(&decls).context("bad [[cache]] in the config file")?;
    Ok(decls)
}

/// The limit keys of the config file, parsed as their flags are.
fn file_limits(file: &FileSettings) -> Result<LimitsAsk> {
    fn key<T>(name: &str, r: Result<T>) -> Result<T> {
        r.with_context(|| format!("bad {name} in the config file"))
    }
    let size = |name: &str, v: &Option<String>, flag: &str| -> Result<Option<u64>> {
        v.as_deref().map(|s| key(name, limits::parse_tmpfs_size(flag, s))).transpose()
    };
    Ok(LimitsAsk {
        memory: file.memory.as_deref().map(|s| key("memory", limits::parse_memory(s))).transpose()?.unwrap_or_default(),
        pids: file.pids.as_ref().map(|v| key("pids", limits::parse_pids(&v.text()))).transpose()?.unwrap_or_default(),
        cpus_milli: file
            .cpus
            .as_ref()
            .map(|v| key("cpus", limits::parse_cpus(&v.text())))
            .transpose()?
            .unwrap_or_default(),
        disk: file.disk.as_deref().map(|s| key("disk", limits::parse_disk(s))).transpose()?.unwrap_or_default(),
        tmp_size: size("tmp_size", &file.tmp_size, "--tmp-size")?,
        shm_size: size("shm_size", &file.shm_size, "--shm-size")?,
        huge_pages: file
            .huge_pages
            .as_deref()
            .map(|s| key("huge_pages", limits::parse_huge_pages(s)))
            .transpose()?
            .unwrap_or_default(),
    })
}

fn autoscale_settings(file: &FileSettings, flags: &FlagSettings) -> Result<Option<AutoscaleSettings>> {
    let on = flags.autoscale || file.autoscale == Some(true);
    if !on {
        if flags.min_agents.is_some()
            || flags.max_agents.is_some()
            || flags.idle_timeout.is_some()
            || flags.poll_interval.is_some()
        {
            bail!("--min-agents, --max-agents, --idle-timeout and --poll-interval need --autoscale");
        }
        return Ok(None);
    }
    let d = AutoscaleSettings::default();
    let a = AutoscaleSettings {
        min_agents: flags.min_agents.or(file.min_agents).unwrap_or(d.min_agents),
        max_agents: flags.max_agents.or(file.max_agents),
        idle_timeout: flags.idle_timeout.or(file.idle_timeout_secs.map(Duration::from_secs)).unwrap_or(d.idle_timeout),
        poll_interval: flags
            .poll_interval
            .or(file.poll_interval_secs.map(Duration::from_secs))
            .unwrap_or(d.poll_interval),
    };
    if a.max_agents == Some(0) {
        bail!("--max-agents must be at least 1");
    }
    if let Some(max) = a.max_agents {
        if a.min_agents > max {
            bail!("--min-agents {} is more than --max-agents {max}", a.min_agents);
        }
    }
    if a.poll_interval < Duration::from_secs(1) {
        bail!("--poll-interval must be at least 1 second (the queue call is not free)");
    }
    if flags.agents.is_some() && flags.max_agents.is_some() {
        bail!("with --autoscale, give --max-agents (the most slots), not --agents");
    }
    Ok(Some(a))
}

pub fn parse_per_agent(s: &str) -> Result<PerAgent> {
    match s {
        "all" => Ok(PerAgent::All),
        "none" | "0" => Ok(PerAgent::None),
        n => match n.parse::<usize>() {
            Ok(k) if k > 0 => Ok(PerAgent::Count(k)),
            _ => bail!("bad --gpus-per-agent '{s}': use a number, all or none"),
        },
    }
}

pub fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .map(|h| h.split('.').next().unwrap_or("").to_string())
        .unwrap_or_else(|| "azp".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::{parse_file, read_token};

    fn flags() -> FlagSettings {
        FlagSettings { pool: Some("gpu".into()), url: Some("https://dev.azure.com/org/".into()), ..Default::default() }
    }

    #[test]
    fn flags_beat_env_beat_file() {
        let file = parse_file(
            "url = \"https://file\"\npool = \"filepool\"\nagents = 3\nname_prefix = \"fromfile\"\nmemory = \"2G\"",
        )
        .unwrap();
        let env = env_settings(|k| match k {
            "AZP_POOL" => Some("envpool".into()),
            "AZP_URL" => Some("https://env".into()),
            _ => None,
        });
        let s = merge(file, env, FlagSettings { pool: Some("flagpool".into()), ..Default::default() }).unwrap();
        assert_eq!(s.pool, "flagpool");
        assert_eq!(s.url, "https://env");
        assert_eq!(s.agents, Some(3));
        assert_eq!(s.name_prefix, "fromfile");
        assert_eq!(s.limits.memory, crate::sandbox::Ask::Value(2 << 30));
        assert_eq!(s.rootfs, "auto");
    }

    #[test]
    fn the_three_sources_in_order() {
        let tmp = tempfile::tempdir().unwrap();
        let config = tmp.path().join("config.toml");
        std::fs::write(&config, "url = \"https://file\"\npool = \"filepool\"\nname_prefix = \"f\"\nagents = 2\n")
            .unwrap();
        let env = Env::fixed(&[("AZP_POOL", "envpool"), ("AZP_AGENT_NAME", "e"), ("AZP_URL", "")]);
        let s = for_run(Some(&config), &env, FlagSettings { name_prefix: Some("flag".into()), ..Default::default() })
            .unwrap();
        assert_eq!(s.url, "https://file", "an empty AZP_URL is unset");
        assert_eq!(s.pool, "envpool");
        assert_eq!(s.name_prefix, "flag");
        assert_eq!(s.agents, Some(2));
        let e = for_run(Some(&tmp.path().join("missing.toml")), &env, flags()).unwrap_err();
        assert!(e.to_string().contains("missing.toml"), "{e}");
    }

    #[test]
    fn defaults_and_trailing_slash() {
        let s = merge(FileSettings::default(), FlagSettings::default(), flags()).unwrap();
        assert_eq!(s.url, "https://dev.azure.com/org");
        assert_eq!(s.gpus_per_agent, PerAgent::Count(1));
        assert_eq!(s.drain_timeout, Duration::from_secs(600));
        assert_eq!(s.cancel_grace, Duration::from_secs(30));
        let file = parse_file("cancel_grace_secs = 5").unwrap();
        assert_eq!(merge(file, FlagSettings::default(), flags()).unwrap().cancel_grace, Duration::from_secs(5));
        let file = parse_file("cancel_grace_secs = 5").unwrap();
        let f = FlagSettings { cancel_grace: Some(Duration::from_secs(2)), ..flags() };
        assert_eq!(merge(file, FlagSettings::default(), f).unwrap().cancel_grace, Duration::from_secs(2), "flag wins");
    }

    #[test]
    fn limit_keys_and_flags() {
        use crate::sandbox::Ask;
        let file = parse_file(
            "memory = \"unlimited\"\npids = 100\ncpus = 1.5\ndisk = \"50G\"\ntmp_size = \"2G\"\nshm_size = \"1G\"",
        )
        .unwrap();
        let s = merge(file, FlagSettings::default(), flags()).unwrap();
        let l = s.limits;
        assert_eq!(
            (l.memory, l.pids, l.cpus_milli, l.disk),
            (Ask::Unlimited, Ask::Value(100), Ask::Value(1500), Ask::Value(50 << 30))
        );
        assert_eq!((l.tmp_size, l.shm_size), (Some(2 << 30), Some(1 << 30)));
        assert_eq!(l.huge_pages, Ask::Default);
        let l = merge(parse_file("huge_pages = \"1G\"").unwrap(), FlagSettings::default(), flags()).unwrap().limits;
        assert_eq!(l.huge_pages, Ask::Value(1 << 30));
        let file = parse_file("pids = \"unlimited\"\ncpus = 2").unwrap();
        let f = FlagSettings { limits: LimitsAsk { pids: Ask::Value(7), ..Default::default() }, ..flags() };
        let l = merge(file, FlagSettings::default(), f).unwrap().limits;
        assert_eq!((l.pids, l.cpus_milli, l.memory), (Ask::Value(7), Ask::Value(2000), Ask::Default), "flag over key");
        for (text, key) in [
            ("memory = \"lots\"", "memory"),
            ("pids = 0", "pids"),
            ("cpus = -1", "cpus"),
            ("disk = \"x\"", "disk"),
            ("huge_pages = \"x\"", "huge_pages"),
        ] {
            let e = merge(parse_file(text).unwrap(), FlagSettings::default(), flags()).unwrap_err();
            let e = format!("{e:#}");
            assert!(e.starts_with(&format!("bad {key} in the config file: bad --")) && !e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn autoscale_knobs() {
        let s = merge(FileSettings::default(), FlagSettings::default(), flags()).unwrap();
        assert!(s.autoscale.is_none());
        let f = FlagSettings {
            autoscale: true,
            max_agents: Some(4),
            idle_timeout: Some(Duration::from_secs(30)),
            ..flags()
        };
        let a = merge(FileSettings::default(), FlagSettings::default(), f).unwrap().autoscale.unwrap();
        assert_eq!(
            (a.min_agents, a.max_agents, a.idle_timeout, a.poll_interval),
            (0, Some(4), Duration::from_secs(30), Duration::from_secs(15))
        );
        let file = parse_file("autoscale = true\nmin_agents = 1\nmax_agents = 2\npoll_interval_secs = 5").unwrap();
        let a = merge(file, FlagSettings::default(), flags()).unwrap().autoscale.unwrap();
        assert_eq!((a.min_agents, a.max_agents, a.poll_interval), (1, Some(2), Duration::from_secs(5)));
        let e =
            merge(FileSettings::default(), FlagSettings::default(), FlagSettings { max_agents: Some(2), ..flags() })
                .unwrap_err();
        assert!(e.to_string().contains("need --autoscale"), "{e}");
        let e = merge(
            FileSettings::default(),
            FlagSettings::default(),
            FlagSettings { autoscale: true, min_agents: Some(3), max_agents: Some(2), ..flags() },
        )
        .unwrap_err();
        assert!(e.to_string().contains("more than --max-agents"), "{e}");
        let e = merge(
            FileSettings::default(),
            FlagSettings::default(),
            FlagSettings { autoscale: true, poll_interval: Some(Duration::ZERO), ..flags() },
        )
        .unwrap_err();
        assert!(e.to_string().contains("--poll-interval"), "{e}");
    }

    #[test]
    fn network_ipv6_key_and_flag() {
        use crate::config::Ipv6;
        let s = merge(FileSettings::default(), FlagSettings::default(), flags()).unwrap();
        assert_eq!(s.network_ipv6, Ipv6::Auto, "IPv6 where the host has it");
        let s = merge(parse_file("network_ipv6 = \"off\"").unwrap(), FlagSettings::default(), flags()).unwrap();
        assert_eq!(s.network_ipv6, Ipv6::Off);
        let f = FlagSettings { network_ipv6: Some(Ipv6::On), ..flags() };
        let s = merge(parse_file("network_ipv6 = \"off\"").unwrap(), FlagSettings::default(), f).unwrap();
        assert_eq!(s.network_ipv6, Ipv6::On, "the flag wins");
        let e = merge(parse_file("network_ipv6 = \"yes\"").unwrap(), FlagSettings::default(), flags()).unwrap_err();
        assert_eq!(
            format!("{e:#}"),
            "bad network_ipv6 in the config file: unknown network_ipv6 'yes': use auto (the default: where the host \
             has IPv6), on or off"
        );
        let e = parse_file("network_ipv4 = \"on\"").unwrap_err().to_string();
        assert!(e.contains("unknown key `network_ipv4`: did you mean `network_ipv6`?"), "{e}");
    }

    #[test]
    fn work_dir_keep_failed_and_logs() {
        let s = merge(FileSettings::default(), FlagSettings::default(), flags()).unwrap();
        assert_eq!((s.work_dir, s.keep_failed, s.diag_logs_max, s.agents_as_root), (None, 0, 200 << 20, false));
        let file = parse_file("work_dir = \"/file\"\nkeep_failed = 3\ndiag_logs_max = \"50M\"").unwrap();
        let env = env_settings(|k| match k {
            "AZP_WORK" => Some("/env".into()),
            "AGENT_ALLOW_RUNASROOT" => Some("1".into()),
            _ => None,
        });
        let s = merge(file, env, flags()).unwrap();
        assert_eq!(s.work_dir.as_deref(), Some(Path::new("/env")), "the environment beats the file");
        assert_eq!((s.keep_failed, s.diag_logs_max, s.agents_as_root), (3, 50 << 20, true));
        assert_eq!(parse_logs_max("0").unwrap(), 0);
        assert_eq!(parse_logs_max("1K").unwrap(), 1024);
        let f = FlagSettings { work_dir: Some("scratch".into()), ..flags() };
        let e = merge(FileSettings::default(), FlagSettings::default(), f).unwrap_err();
        assert!(e.to_string().contains("give an absolute host path to --work-dir"), "{e}");
    }

    #[test]
    fn errors_say_what_to_fix() {
        let e = merge(
            FileSettings::default(),
            FlagSettings::default(),
            FlagSettings { pool: Some("p".into()), ..Default::default() },
        )
        .unwrap_err();
        assert!(e.to_string().contains("--url"), "{e}");
        let e = parse_file("agentz = 3").unwrap_err();
        assert!(e.to_string().contains("agentz"), "{e}");
        assert!(parse_per_agent("x").unwrap_err().to_string().contains("--gpus-per-agent"));
        let e = read_token(Some(Path::new("/nonexistent/pat")), None).unwrap_err();
        assert!(format!("{e:#}").contains("token file"));
    }

    #[test]
    fn caches_and_trusted_branches_from_the_file() {
        let flags = || FlagSettings {
            url: Some("https://dev.azure.com/o".into()),
            pool: Some("p".into()),
            name_prefix: Some("h".into()),
            ..Default::default()
        };
        let file = parse_file(
            "trusted_branches = [\"refs/heads/release/*\"]\n[[cache]]\nname = \"pip\"\npath = \"/root/.cache/pip\"\nmax_size = \"50G\"\n",
        )
        .unwrap();
        let s = merge(file, Default::default(), flags()).unwrap();
        assert_eq!(s.caches.len(), 1);
        assert_eq!((s.caches[0].name.as_str(), s.caches[0].max_size), ("pip", Some(50 << 30)));
        assert_eq!(s.trusted_branches, ["refs/heads/release/*"]);
        let bad =
            |text: &str| format!("{:#}", merge(parse_file(text).unwrap(), Default::default(), flags()).unwrap_err());
        let e = bad("[[cache]]\nname = \"pip\"\npath = \"cache\"\n");
        assert!(e.contains("bad [[cache]] in the config file") && e.contains("must be absolute"), "{e}");
        let e = bad("[[cache]]\nname = \"pip\"\npath = \"/c\"\nmax_size = \"lots\"\n");
        assert!(e.contains("bad max_size of cache 'pip'"), "{e}");
        let e = bad("[[cache]]\nname = \"a\"\npath = \"/c\"\n[[cache]]\nname = \"a\"\npath = \"/d\"\n");
        assert!(e.contains("cache 'a' is given twice"), "{e}");
        assert!(parse_file("[[cache]]\nname = \"a\"\npath = \"/c\"\nsize = 1\n").is_err(), "unknown keys refused");
    }
}
