//! Site policy for setuid mode: the `[setuid]` table of the root-owned
//! `/etc/azp-sandbox/config.toml`, and the check of one request against it. Pure (the
//! file's trust checks are in `mod.rs`), so every rule has a unit test without root.
//!
//! ```toml
//! [setuid]
//! users = ["alice"]            # who may run sandboxes (names), and/or
//! groups = ["gpu-users"]       # members of these groups
//! rootfs = ["cuda12", "bb"]    # rootfs names from the site store ("*": any)
//! volumes = ["/datasets"]      # host dirs that may be bound (read-only), with what is below
//! gpus = ["0", "1"]            # GPU indexes users may request ("all" = every GPU)
//! max_memory = "32G"           # per job: the node's default is capped to it
//! max_pids = 4096
//! max_cpus = 8
//! max_disk = "100G"            # disk quota per job (where the home has project quotas)
//! max_huge_pages = "1G"        # huge pages per job, of each size (default "0": none)
//! max_jobs = 4                 # sandboxes one user keeps at once (exec, run's slots; default 4)
//! network = ["isolated", "none"]  # network modes users may choose (default; "host" opts in)
//! network_allow = ["169.254.169.254:80"]  # blocked destinations users may allow
//! network_ipv6 = "auto"        # "off": IPv4 only for users' jobs (`--ipv6 on` refused)
//! home = "/var/lib/azp-sandbox"  # the site store and job dirs
//! ```

use crate::config::{parse_size, Ipv6, Network, NetworkAllow};
use crate::sandbox::exec::ExecRequest;
use crate::sandbox::limits::{Ask, LimitsAsk};
use crate::settings::keys;
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::path::{Component, Path, PathBuf};

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    #[serde(default)]
    pub users: Vec<String>,
    #[serde(default)]
    pub groups: Vec<String>,
    #[serde(default)]
    pub rootfs: Vec<String>,
    #[serde(default)]
    pub volumes: Vec<PathBuf>,
    #[serde(default)]
    pub gpus: Vec<String>,
    #[serde(default, deserialize_with = "keys::word")]
    pub max_memory: Option<String>,
    #[serde(default, deserialize_with = "keys::count")]
    pub max_pids: Option<i64>,
    pub max_cpus: Option<f64>,
    #[serde(default, deserialize_with = "keys::word")]
    pub max_disk: Option<String>,
    /// Huge pages a user's job may ask for, of each size: absent, none (they count in no
    /// memory limit, and few jobs need them; see `sandbox::limits::defaults`).
    #[serde(default, deserialize_with = "keys::word")]
    pub max_huge_pages: Option<String>,
    #[serde(default = "default_network")]
    pub network: Vec<String>,
    /// Entries of `--network-allow` users may give (`IP[:PORT]`).
    #[serde(default)]
    pub network_allow: Vec<String>,
    /// "off": users' jobs get IPv4 only; "auto"/"on" (absent: "auto"): the caller's
    /// `--ipv6` as asked.
    #[serde(default, deserialize_with = "keys::word")]
    pub network_ipv6: Option<String>,
    #[serde(default = "default_home")]
    pub home: PathBuf,
    #[serde(default = "default_driver_root")]
    pub driver_root: PathBuf,
    /// Sandboxes one caller keeps at once, `exec`s and `run`'s slots together (see
    /// [`super::seats`]); absent: [`super::seats::DEFAULT_MAX_JOBS`].
    #[serde(default, deserialize_with = "keys::count")]
    pub max_jobs: Option<usize>,
    /// Agent slots one caller's `run` may keep; absent: `run` is not allowed in setuid mode.
    #[serde(default, deserialize_with = "keys::count")]
    pub max_agents: Option<usize>,
    /// Whose ids jobs run as: "auto" (the default: a user namespace and host ids of their
    /// own), or "host" (as the caller, without one: kernels < 5.19 only).
    #[serde(default)]
    pub userns: crate::identity::Choice,
}

/// Jobs get their own network; sharing the host's is for the site to allow.
fn default_network() -> Vec<String> {
    vec!["isolated".into(), "none".into()]
}
fn default_home() -> PathBuf {
    PathBuf::from("/var/lib/azp-sandbox")
}
fn default_driver_root() -> PathBuf {
    PathBuf::from("/")
}

/// The `[setuid]` table of the config file's text (other tables belong to `run`).
pub fn parse(text: &str, file: &Path) -> Result<Policy> {
    #[derive(Deserialize)]
    struct File {
        setuid: Option<toml::Value>,
    }
    let f: File =
        toml::from_str(text).map_err(|e| anyhow::anyhow!("bad config file {}: {}", file.display(), one_line(&e)))?;
    let table = f.setuid.with_context(|| {
        format!("{} has no [setuid] table: setuid mode is not enabled on this host (see SECURITY.md)", file.display())
    })?;
    let p: Policy = table.try_into().map_err(|e: toml::de::Error| {
        anyhow::anyhow!("bad [setuid] table in {}: {}", file.display(), keys::one_line(&e, "", Some("[setuid]")))
    })?;
    for v in &p.volumes {
        if !v.is_absolute() || v.components().any(|c| c == Component::ParentDir) || v == Path::new("/") {
            bail!("bad [setuid] volumes entry {} in {}: use absolute dataset dirs, not /", v.display(), file.display());
        }
    }
    for n in &p.network {
        if n.parse::<Network>().is_err() {
            bail!("bad [setuid] network entry '{n}' in {}: use \"isolated\", \"none\" and/or \"host\"", file.display());
        }
    }
    for a in &p.network_allow {
        a.parse::<NetworkAllow>().map_err(|e| anyhow::anyhow!("bad [setuid] {e} in {}", file.display()))?;
    }
    if let Some(v) = &p.network_ipv6 {
        v.parse::<Ipv6>().map_err(|e| anyhow::anyhow!("bad [setuid] {e} in {}", file.display()))?;
    }
    p.memory_cap()?;
    p.disk_cap()?;
    p.huge_pages_cap()?;
    Ok(p)
}

fn one_line(e: &toml::de::Error) -> String {
    e.to_string().lines().next().unwrap_or_default().to_string()
}

/// Who is asking: the real ids of the process that ran the setuid binary.
#[derive(Debug, Clone)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub name: String,
    /// Names of the caller's groups (primary and supplementary).
    pub groups: Vec<String>,
}

impl Policy {
    /// Sandboxes one caller keeps at once (see [`super::seats`]).
    pub fn jobs_cap(&self) -> usize {
        self.max_jobs.unwrap_or(super::seats::DEFAULT_MAX_JOBS)
    }

    fn memory_cap(&self) -> Result<Option<u64>> {
        self.max_memory
            .as_deref()
            .map(|m| parse_size(m).map_err(|e| anyhow::anyhow!("bad [setuid] max_memory: {e}")))
            .transpose()
    }

    fn disk_cap(&self) -> Result<Option<u64>> {
        self.max_disk
            .as_deref()
            .map(|m| parse_size(m).map_err(|e| anyhow::anyhow!("bad [setuid] max_disk: {e}")))
            .transpose()
    }

    /// At most 0 unless the site says more.
    fn huge_pages_cap(&self) -> Result<u64> {
        match self.max_huge_pages.as_deref() {
            None => Ok(0),
            Some(m) => {
                crate::config::parse_size_or_zero(m).map_err(|e| anyhow::anyhow!("bad [setuid] max_huge_pages: {e}"))
            }
        }
    }

    pub fn allows_caller(&self, c: &Caller) -> Result<()> {
        if self.users.iter().any(|u| u == &c.name) || self.groups.iter().any(|g| c.groups.contains(g)) {
            return Ok(());
        }
        bail!(
            "user {} may not run sandboxes on this host: ask an administrator to add it to [setuid] users or groups",
            c.name
        )
    }

    /// Checks `req` and returns it as it will run: volumes canonicalised, limits capped
    /// (a default: the node's, at most the site's maximum), the job's user forced to the
    /// caller. `canonical` resolves a host path
    /// (std::fs::canonicalize in production).
    pub fn authorize(
        &self,
        mut req: ExecRequest,
        caller: &Caller,
        canonical: &dyn Fn(&Path) -> std::io::Result<PathBuf>,
    ) -> Result<ExecRequest> {
        self.check_rootfs(&req.rootfs)?;
        req.volumes = self.resolve_volumes(&req.volumes, canonical)?;
        self.check_gpus(&req.gpus)?;
        if req.cdi_spec.is_some() {
            bail!("--cdi-spec is not allowed in setuid mode: the site's GPUs come from the policy");
        }
        if !req.caches.is_empty() {
            // The home's caches are shared by every caller's jobs: one could poison them.
            bail!("--cache is not allowed in setuid mode: caches are the operator's (`run` with [[cache]])");
        }
        self.check_network(req.network, &req.network_allow)?;
        req.ipv6 = self.check_ipv6(req.ipv6)?;
        req.limits = self.cap_limits(&req.limits)?;
        if let Some((u, g)) = req.user {
            if (u, g) != (caller.uid, caller.gid) {
                bail!("--user is not allowed in setuid mode: jobs run as you ({}:{})", caller.uid, caller.gid);
            }
        }
        req.user = Some((caller.uid, caller.gid));
        Ok(req)
    }

    fn check_network(&self, mode: Network, allow: &[NetworkAllow]) -> Result<()> {
        if !self.network.iter().any(|n| n == mode.name()) {
            bail!("--network {mode} is not allowed by site policy (allowed: {})", self.network.join(", "));
        }
        for a in allow {
            if !self.network_allow.iter().any(|p| p.parse::<NetworkAllow>().is_ok_and(|p| p == *a)) {
                bail!(
                    "--network-allow {a} is not allowed by site policy (allowed: {})",
                    if self.network_allow.is_empty() { "none".into() } else { self.network_allow.join(", ") }
                );
            }
        }
        Ok(())
    }

    /// The caller's `--ipv6` under the policy: a site's "off" makes it off, and refuses "on".
    fn check_ipv6(&self, asked: Ipv6) -> Result<Ipv6> {
        let site_off = self.network_ipv6.as_deref().and_then(|v| v.parse::<Ipv6>().ok()) == Some(Ipv6::Off);
        match (site_off, asked) {
            (false, asked) => Ok(asked),
            (true, Ipv6::On) => {
                bail!("--ipv6 on is not allowed by site policy ([setuid] network_ipv6 = \"off\": IPv4 only)")
            }
            (true, _) => Ok(Ipv6::Off),
        }
    }

    fn check_rootfs(&self, name: &str) -> Result<()> {
        if !self.rootfs.iter().any(|r| r == "*" || r == name) {
            bail!("rootfs '{name}' is not allowed by site policy (allowed: {})", self.rootfs.join(", "));
        }
        Ok(())
    }

    /// Every volume's source, canonicalised by `canonical` and under an allowed dir; the
    /// volumes with their canonical sources (what gets bound).
    fn resolve_volumes(
        &self,
        volumes: &[crate::config::Volume],
        canonical: &dyn Fn(&Path) -> std::io::Result<PathBuf>,
    ) -> Result<Vec<crate::config::Volume>> {
        volumes
            .iter()
            .map(|v| {
                let real =
                    canonical(&v.host).with_context(|| format!("volume source {} does not exist", v.host.display()))?;
                if !self.volumes.iter().filter_map(|p| canonical(p).ok()).any(|p| real.starts_with(&p)) {
                    bail!(
                        "--volume {} is not allowed by site policy (allowed under: {})",
                        v.host.display(),
                        self.volumes.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
                    );
                }
                Ok(crate::config::Volume { host: real, ..v.clone() })
            })
            .collect()
    }

    /// Checks a `run` request and returns the settings it runs with: the same rules as
    /// `exec` for rootfs, volumes and limits, at most `max_agents` slots, GPUs only when the
    /// policy allows all of them, and nothing that would run the caller's code or files as
    /// root on the host (hooks, a chosen agent package).
    pub fn authorize_run(
        &self,
        req: &super::RunRequest,
        canonical: &dyn Fn(&Path) -> std::io::Result<PathBuf>,
    ) -> Result<crate::settings::RunSettings> {
        let Some(max) = self.max_agents else {
            bail!("`run` is not enabled for setuid use on this host: ask an administrator to set [setuid] max_agents");
        };
        let agents = req.agents.unwrap_or(1);
        if agents == 0 || agents > max {
            bail!("--agents {agents} is not allowed by site policy (at most {max})");
        }
        if agents > self.jobs_cap() {
            bail!(
                "--agents {agents} is above the site's {} sandboxes at once per user ([setuid] max_jobs)",
                self.jobs_cap()
            );
        }
        if req.agent_package.is_some() {
            bail!("--agent-package is not allowed in setuid mode: the agent comes from the organization's server");
        }
        if req.hooks_dir.is_some() {
            bail!("--hooks-dir is not allowed in setuid mode: hooks run as root on the host");
        }
        if req.autoscale {
            bail!("--autoscale is not allowed in setuid mode");
        }
        let per_agent: crate::gpu::PerAgent = req.gpus_per_agent.parse()?;
        if per_agent != crate::gpu::PerAgent::None && !self.gpus.iter().any(|g| g == "all") {
            bail!(
                "--gpus-per-agent {} is not allowed by site policy: GPUs for `run` need [setuid] gpus = [\"all\"]",
                req.gpus_per_agent
            );
        }
        // Rootfs, volumes, limits and the network: the exec rules.
        self.check_rootfs(&req.rootfs)?;
        self.check_network(req.network, &req.network_allow)?;
        let volumes = self.resolve_volumes(&req.volumes, canonical)?;
        let limits = self.cap_limits(&req.limits)?;
        let flags = crate::settings::FlagSettings {
            url: Some(req.url.clone()),
            pool: Some(req.pool.clone()),
            agents: Some(agents),
            rootfs: Some(req.rootfs.clone()),
            volumes,
            gpus_per_agent: Some(req.gpus_per_agent.clone()),
            limits,
            name_prefix: Some(req.name_prefix.clone()),
            drain_timeout: Some(std::time::Duration::from_secs(req.drain_timeout_secs)),
            cancel_grace: req.cancel_grace_secs.map(std::time::Duration::from_secs),
            exit_when_idle: req.exit_when_idle_secs.map(std::time::Duration::from_secs),
            network: Some(req.network),
            network_allow: req.network_allow.clone(),
            network_ipv6: Some(self.check_ipv6(req.network_ipv6)?),
            // As `exec` in setuid mode: the variables reach the jobs as they are, opening
            // no port of the host's loopback in the table every job shares.
            proxy_env: req.proxy_env.clone(),
            proxy_as_is: true,
            ..Default::default()
        };
        // No config file and no environment here: only what was checked.
        crate::settings::merge(Default::default(), Default::default(), flags)
    }

    fn check_gpus(&self, gpus: &str) -> Result<()> {
        if gpus == "none" || gpus.is_empty() {
            return Ok(());
        }
        if self.gpus.iter().any(|g| g == "all") {
            return Ok(());
        }
        let asked: Vec<&str> = if gpus == "all" { vec!["all"] } else { gpus.split(',').map(str::trim).collect() };
        for g in asked {
            if !self.gpus.iter().any(|a| a == g) {
                bail!(
                    "--gpus {g} is not allowed by site policy (allowed: {})",
                    if self.gpus.is_empty() { "none".into() } else { self.gpus.join(",") }
                );
            }
        }
        Ok(())
    }

    /// Each limit at most the site's maximum: a value above it or `unlimited` is refused,
    /// a default becomes "the node's default, at most the maximum".
    fn cap_limits(&self, asked: &LimitsAsk) -> Result<LimitsAsk> {
        fn cap<T: PartialOrd + Copy + std::fmt::Display>(what: &str, asked: Ask<T>, max: Option<T>) -> Result<Ask<T>> {
            let Some(m) = max else { return Ok(asked) };
            match asked {
                Ask::Value(a) if a > m => bail!("{what} {a} is above the site maximum {m}"),
                Ask::Unlimited => bail!("{what} unlimited is above the site maximum {m}"),
                Ask::Default => Ok(Ask::DefaultUpTo(m)),
                Ask::DefaultUpTo(a) => Ok(Ask::DefaultUpTo(if a < m { a } else { m })),
                a => Ok(a),
            }
        }
        let cpus_max = self.max_cpus.map(|c| (c * 1000.0).round() as u64);
        Ok(LimitsAsk {
            memory: cap("--memory", asked.memory, self.memory_cap()?)?,
            pids: cap("--pids", asked.pids, self.max_pids)?,
            cpus_milli: cap("--cpus (milli-CPUs)", asked.cpus_milli, cpus_max)?,
            disk: cap("--disk", asked.disk, self.disk_cap()?)?,
            huge_pages: cap("--huge-pages", asked.huge_pages, Some(self.huge_pages_cap()?))?,
            ..*asked
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Volume;

    const GOOD: &str = r#"
url = "https://dev.azure.com/org"   # run's settings live beside [setuid]
[setuid]
users = ["alice"]
groups = ["gpu"]
rootfs = ["cuda"]
volumes = ["/data"]
gpus = ["0", "1"]
max_memory = "1G"
max_pids = 100
max_disk = "10G"
network = ["isolated", "host", "none"]
network_allow = ["169.254.169.254:80"]
"#;

    fn policy() -> Policy {
        parse(GOOD, Path::new("/etc/azp-sandbox/config.toml")).unwrap()
    }

    fn caller(name: &str, groups: &[&str]) -> Caller {
        Caller { uid: 1001, gid: 1001, name: name.into(), groups: groups.iter().map(|g| g.to_string()).collect() }
    }

    fn req() -> ExecRequest {
        ExecRequest {
            rootfs: "cuda".into(),
            volumes: vec![],
            env: vec![],
            limits: LimitsAsk::default(),
            network: Network::Host,
            network_allow: vec![],
            ipv6: Default::default(),
            gpus: "none".into(),
            gpu_capabilities: "compute,utility".into(),
            cdi_spec: None,
            name: None,
            workdir: "/".into(),
            user: None,
            command: vec!["true".into()],
            terminal: false,
            caches: vec![],
            host_loopback_proxy: false,
        }
    }

    /// A fake filesystem: /data/x is real, /data/link points to /etc.
    fn canon(p: &Path) -> std::io::Result<PathBuf> {
        match p.to_str().unwrap() {
            "/data" | "/data/x" | "/etc" | "/etc/shadow" | "/" => Ok(p.into()),
            "/data/link" => Ok("/etc".into()),
            "/data/../etc" => Ok("/etc".into()),
            _ => Err(std::io::ErrorKind::NotFound.into()),
        }
    }

    #[test]
    fn parse_errors_are_one_line_and_name_the_fix() {
        let f = Path::new("/etc/azp-sandbox/config.toml");
        let e = parse("url = 1\n", f).unwrap_err().to_string();
        assert!(e.contains("no [setuid] table"), "{e}");
        let e = parse("[setuid]\nusers = [\"a\"]\nallow_everything = true\n", f).unwrap_err().to_string();
        assert!(e.contains("bad [setuid] table") && !e.contains('\n'), "{e}");
        let e = parse("[setuid]\nuser = [\"a\"]\n", f).unwrap_err().to_string();
        assert!(e.ends_with("unknown key `user` in [setuid]: did you mean `users`?"), "{e}");
        let p = parse("[setuid]\nmax_agents = \"2\"\nmax_pids = 100\nmax_memory = 4096\n", f).unwrap();
        assert_eq!((p.max_agents, p.max_pids, p.max_memory.as_deref()), (Some(2), Some(100), Some("4096")));
        let e = parse("[setuid]\nvolumes = [\"/\"]\n", f).unwrap_err().to_string();
        assert!(e.contains("not /"), "{e}");
        let e = parse("[setuid]\nnetwork = [\"bridge\"]\n", f).unwrap_err().to_string();
        assert!(e.contains("bridge"), "{e}");
        let e = parse("[setuid]\nnetwork_allow = [\"metadata\"]\n", f).unwrap_err().to_string();
        assert!(e.starts_with("bad [setuid] bad network_allow entry 'metadata'") && !e.contains('\n'), "{e}");
        let e = parse("[setuid]\nmax_memory = \"lots\"\n", f).unwrap_err().to_string();
        assert!(e.contains("max_memory"), "{e}");
        let e = parse("[setuid]\nmax_disk = \"lots\"\n", f).unwrap_err().to_string();
        assert!(e.contains("max_disk"), "{e}");
        let e = parse("[setuid\n", f).unwrap_err().to_string();
        assert!(e.contains("bad config file") && !e.contains('\n'), "{e}");
    }

    #[test]
    fn callers_by_name_or_group() {
        let p = policy();
        assert!(p.allows_caller(&caller("alice", &[])).is_ok());
        assert!(p.allows_caller(&caller("bob", &["users", "gpu"])).is_ok());
        let e = p.allows_caller(&caller("mallory", &["users"])).unwrap_err().to_string();
        assert!(e.contains("mallory may not run sandboxes"), "{e}");
    }

    #[test]
    fn a_sites_ipv6_off_makes_every_job_ipv4_only() {
        let c = caller("alice", &[]);
        let open = policy();
        let got = |p: &Policy, asked| p.authorize(ExecRequest { ipv6: asked, ..req() }, &c, &canon).map(|r| r.ipv6);
        assert_eq!(got(&open, Ipv6::On).unwrap(), Ipv6::On, "absent: the caller's choice");
        let off = Policy { network_ipv6: Some("off".into()), ..policy() };
        assert_eq!(got(&off, Ipv6::Auto).unwrap(), Ipv6::Off);
        let e = got(&off, Ipv6::On).unwrap_err().to_string();
        assert!(e.contains("--ipv6 on is not allowed by site policy"), "{e}");
        let run = Policy { max_agents: Some(1), ..off };
        let s = run.authorize_run(&run_req(), &canon).unwrap();
        assert_eq!(s.network_ipv6, Ipv6::Off, "run too");
        let e = parse("[setuid]\nnetwork_ipv6 = \"sometimes\"\n", Path::new("/etc/x.toml")).unwrap_err().to_string();
        assert!(e.contains("bad [setuid] unknown network_ipv6 'sometimes'"), "{e}");
    }

    #[test]
    fn requests_outside_policy_are_refused() {
        let p = policy();
        let c = caller("alice", &[]);
        let refuse = |r: ExecRequest, want: &str| {
            let e = p.authorize(r, &c, &canon).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        };
        refuse(ExecRequest { rootfs: "other".into(), ..req() }, "rootfs 'other' is not allowed");
        let vol = |h: &str| Volume { host: h.into(), container: "/d".into(), env: None };
        refuse(ExecRequest { volumes: vec![vol("/")], ..req() }, "--volume / is not allowed");
        refuse(ExecRequest { volumes: vec![vol("/etc/shadow")], ..req() }, "--volume /etc/shadow is not allowed");
        refuse(ExecRequest { volumes: vec![vol("/data/link")], ..req() }, "--volume /data/link is not allowed");
        refuse(ExecRequest { volumes: vec![vol("/data/../etc")], ..req() }, "is not allowed");
        refuse(ExecRequest { volumes: vec![vol("/data/missing")], ..req() }, "does not exist");
        refuse(ExecRequest { gpus: "2".into(), ..req() }, "--gpus 2 is not allowed");
        refuse(ExecRequest { gpus: "all".into(), ..req() }, "--gpus all is not allowed");
        refuse(
            ExecRequest { limits: LimitsAsk { memory: Ask::Value(2 << 30), ..Default::default() }, ..req() },
            "above the site maximum",
        );
        refuse(
            ExecRequest { limits: LimitsAsk { pids: Ask::Value(101), ..Default::default() }, ..req() },
            "--pids 101",
        );
        refuse(
            ExecRequest { limits: LimitsAsk { memory: Ask::Unlimited, ..Default::default() }, ..req() },
            "--memory unlimited is above the site maximum",
        );
        refuse(
            ExecRequest { limits: LimitsAsk { disk: Ask::Value(20 << 30), ..Default::default() }, ..req() },
            "--disk 21474836480 is above the site maximum",
        );
        refuse(ExecRequest { user: Some((0, 0)), ..req() }, "--user is not allowed");
        refuse(ExecRequest { caches: vec!["pip:/c".into()], ..req() }, "--cache is not allowed in setuid mode");
        refuse(ExecRequest { cdi_spec: Some("/tmp/x.json".into()), ..req() }, "--cdi-spec");
        let p2 = Policy { network: vec!["none".into()], ..policy() };
        let e = p2.authorize(req(), &c, &canon).unwrap_err().to_string();
        assert!(e.contains("--network host is not allowed"), "{e}");
        let e = p2.authorize(ExecRequest { network: Network::Isolated, ..req() }, &c, &canon).unwrap_err().to_string();
        assert!(e.contains("--network isolated is not allowed"), "{e}");
        let allow = |s: &str| vec![s.parse::<NetworkAllow>().unwrap()];
        refuse(
            ExecRequest { network_allow: allow("169.254.169.254"), ..req() },
            "--network-allow 169.254.169.254 is not",
        );
        assert!(p.authorize(ExecRequest { network_allow: allow("169.254.169.254:80"), ..req() }, &c, &canon).is_ok());
        // The default policy: a job's own network, never the host's.
        let d = parse("[setuid]\nusers = [\"alice\"]\nrootfs = [\"*\"]\n", Path::new("/p")).unwrap();
        assert_eq!(d.network, ["isolated", "none"]);
        assert!(d.authorize(ExecRequest { network: Network::Isolated, ..req() }, &c, &canon).is_ok());
        let e = d.authorize(req(), &c, &canon).unwrap_err().to_string();
        assert_eq!(e, "--network host is not allowed by site policy (allowed: isolated, none)");
    }

    #[test]
    fn allowed_requests_run_as_the_caller_with_capped_limits() {
        let p = policy();
        let c = caller("alice", &[]);
        let r = ExecRequest {
            volumes: vec![Volume { host: "/data/x".into(), container: "/d".into(), env: Some("D".into()) }],
            gpus: "0,1".into(),
            limits: LimitsAsk { pids: Ask::Value(50), cpus_milli: Ask::Unlimited, ..Default::default() },
            ..req()
        };
        let ok = p.authorize(r, &c, &canon).unwrap();
        assert_eq!(ok.user, Some((1001, 1001)));
        assert_eq!(ok.limits.memory, Ask::DefaultUpTo(1 << 30), "the node's default, at most the site maximum");
        assert_eq!(ok.limits.pids, Ask::Value(50));
        assert_eq!(ok.limits.cpus_milli, Ask::Unlimited, "no site maximum: as asked");
        assert_eq!(ok.limits.disk, Ask::DefaultUpTo(10 << 30));
        assert_eq!(ok.volumes[0].host, PathBuf::from("/data/x"));
    }

    #[test]
    fn huge_pages_are_none_unless_the_site_allows_some() {
        let c = caller("alice", &[]);
        let ask = |a| ExecRequest { limits: LimitsAsk { huge_pages: a, ..Default::default() }, ..req() };
        let ok = policy().authorize(ask(Ask::Default), &c, &canon).unwrap();
        assert_eq!(ok.limits.huge_pages, Ask::DefaultUpTo(0), "no max_huge_pages: none");
        for a in [Ask::Value(2 << 20), Ask::Unlimited] {
            let e = policy().authorize(ask(a), &c, &canon).unwrap_err().to_string();
            assert!(e.contains("--huge-pages") && e.contains("above the site maximum 0"), "{e}");
        }
        let some = Policy { max_huge_pages: Some("1G".into()), ..policy() };
        assert_eq!(
            some.authorize(ask(Ask::Value(2 << 20)), &c, &canon).unwrap().limits.huge_pages,
            Ask::Value(2 << 20)
        );
        let zero = parse("[setuid]\nmax_huge_pages = \"0\"\n", Path::new("/etc/azp-sandbox/config.toml")).unwrap();
        assert_eq!(zero.huge_pages_cap().unwrap(), 0, "the README's example");
        let e = parse("[setuid]\nmax_huge_pages = \"lots\"\n", Path::new("/etc/azp-sandbox/config.toml"));
        assert!(e.unwrap_err().to_string().contains("max_huge_pages"));
    }

    fn run_req() -> super::super::RunRequest {
        super::super::RunRequest {
            url: "https://dev.azure.com/org".into(),
            pool: "gpu".into(),
            token: "pat".into(),
            agents: Some(1),
            rootfs: "cuda".into(),
            volumes: vec![],
            gpus_per_agent: "none".into(),
            limits: LimitsAsk::default(),
            name_prefix: "alice".into(),
            drain_timeout_secs: 60,
            cancel_grace_secs: Some(7),
            exit_when_idle_secs: None,
            agent_package: None,
            hooks_dir: None,
            autoscale: false,
            network: Network::Isolated,
            network_allow: vec![],
            network_ipv6: Default::default(),
            proxy_env: vec![],
        }
    }

    #[test]
    fn run_requests_follow_the_exec_rules_and_the_agent_cap() {
        let e = policy().authorize_run(&run_req(), &canon).unwrap_err().to_string();
        assert!(e.contains("set [setuid] max_agents"), "{e}");
        let p = Policy { max_agents: Some(2), ..policy() };
        let s = p.authorize_run(&run_req(), &canon).unwrap();
        assert_eq!(
            (s.agents, s.limits.memory, s.rootfs.as_str()),
            (Some(1), Ask::DefaultUpTo(1 << 30), "cuda"),
            "site memory cap applied"
        );
        assert_eq!(s.cancel_grace, std::time::Duration::from_secs(7), "the caller's cancel grace");
        // Each slot is a sandbox: more slots than the caller's sandboxes at once is refused.
        let p8 = Policy { max_agents: Some(8), max_jobs: Some(2), ..policy() };
        let e = p8
            .authorize_run(&super::super::RunRequest { agents: Some(3), ..run_req() }, &canon)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--agents 3 is above the site's 2 sandboxes at once per user"), "{e}");
        assert_eq!(policy().jobs_cap(), super::super::seats::DEFAULT_MAX_JOBS);
        assert!(s.hooks_dir.is_none() && s.agent_package.is_none() && s.token_file.is_none());
        let refuse = |r: super::super::RunRequest, want: &str| {
            let e = p.authorize_run(&r, &canon).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        };
        refuse(super::super::RunRequest { agents: Some(3), ..run_req() }, "at most 2");
        refuse(super::super::RunRequest { rootfs: "other".into(), ..run_req() }, "rootfs 'other'");
        refuse(super::super::RunRequest { gpus_per_agent: "1".into(), ..run_req() }, "gpus = [\"all\"]");
        refuse(super::super::RunRequest { hooks_dir: Some("/h".into()), ..run_req() }, "--hooks-dir");
        refuse(super::super::RunRequest { autoscale: true, ..run_req() }, "--autoscale");
        let p3 = Policy { network: vec!["isolated".into()], ..p.clone() };
        let e =
            p3.authorize_run(&super::super::RunRequest { network: Network::Host, ..run_req() }, &canon).unwrap_err();
        assert!(e.to_string().contains("--network host is not allowed"), "{e}");
        assert_eq!(p.authorize_run(&run_req(), &canon).unwrap().network, Network::Isolated);
        // A proxy on the host's loopback in the caller's environment opens nothing.
        let proxy = vec![("HTTP_PROXY".to_string(), "http://127.0.0.1:5432".to_string())];
        let s = p.authorize_run(&super::super::RunRequest { proxy_env: proxy.clone(), ..run_req() }, &canon).unwrap();
        assert!(s.proxy_as_is && s.proxy_env == proxy, "{:?}", s.proxy_env);
        let vol = Volume { host: "/etc".into(), container: "/e".into(), env: None };
        refuse(super::super::RunRequest { volumes: vec![vol], ..run_req() }, "--volume /etc is not allowed");
    }
}
