//! `azp-sandbox check` (and `run --check`): the whole configuration of `run`, one line per
//! check, `OK`, `WARN` or `FAIL` with the fix. Every local check runs before the first
//! network call (config keys, the token file, the job ids, cgroups, the jobs' network,
//! GPUs, the rootfs and whether it can run the agent, volumes, disk quotas), then the
//! Azure side (server, PAT, pool, permission), each through the same code `run` starts
//! with (`manager::startup`), so a check that passes is one `run` passes.

use crate::agent::package::PackageCache;
use crate::agent::preflight::{self, UserRule};
use crate::azure::AzureClient;
use crate::config::Home;
use crate::manager::startup;
use crate::mirror::MirrorSpec;
use crate::settings::{self, Env, FlagSettings, RunSettings};
use anyhow::Result;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// A check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    Warn,
    Fail,
}

/// One line of the report: the verdict, what was checked, what was found (with the fix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub verdict: Verdict,
    pub what: &'static str,
    pub text: String,
}

#[derive(Debug, Default)]
pub struct Report {
    pub lines: Vec<Line>,
}

impl Report {
    fn add(&mut self, verdict: Verdict, what: &'static str, text: impl Into<String>) {
        // One line each, whatever the error chain held.
        let text = text.into().replace('\n', " ");
        // The verdict column says it already.
        let text = text.strip_prefix("WARNING: ").map(str::to_string).unwrap_or(text);
        self.lines.push(Line { verdict, what, text });
    }

    /// OK with `ok`'s text, or FAIL with the error (its whole chain, one line).
    fn result<T>(&mut self, what: &'static str, r: Result<T>, ok: impl FnOnce(&T) -> String) -> Option<T> {
        match r {
            Ok(v) => {
                self.add(Verdict::Ok, what, ok(&v));
                Some(v)
            }
            Err(e) => {
                self.add(Verdict::Fail, what, format!("{e:#}"));
                None
            }
        }
    }

    pub fn failed(&self) -> bool {
        self.lines.iter().any(|l| l.verdict == Verdict::Fail)
    }

    /// The lines as printed, and a last line counting them.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for l in &self.lines {
            let v = match l.verdict {
                Verdict::Ok => "OK",
                Verdict::Warn => "WARN",
                Verdict::Fail => "FAIL",
            };
            let _ = writeln!(out, "{v:<4}  {:<11} {}", l.what, l.text);
        }
        let count = |v| self.lines.iter().filter(|l| l.verdict == v).count();
        let (fails, warns) = (count(Verdict::Fail), count(Verdict::Warn));
        let _ = writeln!(
            out,
            "{}: {} checks, {fails} failed, {warns} warning(s)",
            if fails > 0 { "NOT READY" } else { "ready" },
            self.lines.len()
        );
        out
    }
}

/// What `check` reads: the home, the config file, the environment and `run`'s flags.
pub struct Inputs<'a> {
    pub home: &'a Home,
    pub config: Option<&'a Path>,
    pub env: &'a Env,
    pub flags: FlagSettings,
    pub driver_root: PathBuf,
}

/// Every check: the local ones, then (unless `local_only`) the Azure side.
pub fn run(inputs: Inputs, local_only: bool) -> Report {
    let mut report = Report::default();
    let token = inputs.env.token();
    let settings = local(&mut report, &inputs);
    if let (Some(s), false) = (settings, local_only) {
        azure(&mut report, &s, token);
    }
    report
}

/// The local checks; the merged settings when they could be made.
pub fn local(report: &mut Report, inputs: &Inputs) -> Option<RunSettings> {
    let file = config_file(report, inputs.config);
    let env = settings::env_settings(|k| inputs.env.var(k));
    let s = report.result("settings", settings::merge(file, env, inputs.flags.clone()), |s| {
        format!("pool '{}' at {}, agents named {}-N", s.pool, s.url, s.name_prefix)
    })?;
    token_file(report, &s, inputs.env);
    job_ids(report, &s);
    cgroups(report);
    let net = startup::network(&s);
    report.result("network", net, |_| match s.network {
        crate::config::Network::Isolated => {
            let note = crate::sandbox::network::ipv6_note(s.network_ipv6, crate::rootless::mode().rootless);
            format!("--network isolated can be set up on this host; {note}")
        }
        n => format!("--network {} can be set up on this host", n.name()),
    });
    let gpus = report.result("gpus", startup::gpus(&s, &inputs.driver_root), |(_, split)| {
        let n: usize = split.iter().map(Vec::len).sum();
        format!("{} slot(s), {n} GPU(s) given to them", split.len())
    });
    rootfs(report, inputs.home, &s, gpus.as_ref().map(|(d, split)| (d, split.as_slice())));
    volumes(report, &s);
    disk_quota(report, inputs.home, &s);
    caches(report, inputs.home, &s.caches, &s.git_mirrors);
    Some(s)
}

/// Each declared cache and git mirror as `status` shows it (size, snapshot age, last
/// committer job, hits; a mirror's last fetch), and caches left on disk undeclared.
fn caches(report: &mut Report, home: &Home, declared: &[crate::cache::CacheDecl], git_mirrors: &[MirrorSpec]) {
    let on_disk = crate::cache::store::summaries(home);
    for d in declared {
        match on_disk.iter().find(|c| c.name == d.name) {
            Some(c) => report.add(Verdict::Ok, "cache", format!("{} at {}", c.line(), d.path.display())),
            None => report.add(
                Verdict::Ok,
                "cache",
                format!("{} at {}: empty until a job makes it", d.name, d.path.display()),
            ),
        }
    }
    for c in on_disk.iter().filter(|c| !declared.iter().any(|d| d.name == c.name)) {
        report.add(
            Verdict::Warn,
            "cache",
            format!("{}: not in the config (no job gets it); `azp-sandbox cache rm {}` frees it", c.line(), c.name),
        );
    }
    let mirrors = crate::mirror::summary::summaries(home);
    for spec in git_mirrors {
        match mirrors.iter().find(|m| m.name == spec.name) {
            Some(m) => report.add(Verdict::Ok, "git mirror", m.line()),
            None => report.add(
                Verdict::Ok,
                "git mirror",
                format!("{} ({}): not made yet: `run` makes and fetches it at start", spec.name, spec.url),
            ),
        }
    }
}

/// The config file's keys (and the `[setuid]` table's), with the nearest valid key for a
/// typo. A bad file is reported and the rest checked without it.
fn config_file(report: &mut Report, explicit: Option<&Path>) -> settings::FileSettings {
    let path = explicit.unwrap_or(Path::new(settings::DEFAULT_CONFIG));
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if explicit.is_none() && e.kind() == std::io::ErrorKind::NotFound => {
            report.add(Verdict::Ok, "config", format!("no {} (flags and AZP_* only)", path.display()));
            return Default::default();
        }
        Err(e) => {
            report.add(Verdict::Fail, "config", format!("cannot read {}: {e}: check --config", path.display()));
            return Default::default();
        }
    };
    let file = match settings::parse_file(&text) {
        Ok(f) => {
            report.add(Verdict::Ok, "config", format!("{}: every key known", path.display()));
            f
        }
        Err(e) => {
            report.add(Verdict::Fail, "config", format!("{}: {e}", path.display()));
            good_keys(&text)
        }
    };
    // The site policy's keys too, even when run's are wrong (its own table, its own reader).
    if text.parse::<toml::Table>().is_ok_and(|t| t.contains_key("setuid")) {
        let p = crate::setuid::policy::parse(&text, path);
        report.result("setuid", p, |p| {
            format!("[setuid] policy: {} user(s), {} group(s) allowed", p.users.len(), p.groups.len())
        });
    }
    file
}

/// The keys of a file that fails to parse that are right on their own, so that the other
/// checks still see the URL, the pool, ... (the bad key is already a FAIL line).
fn good_keys(text: &str) -> settings::FileSettings {
    let Ok(table) = text.parse::<toml::Table>() else { return Default::default() };
    let good: toml::Table = table
        .into_iter()
        .filter(|(k, v)| {
            let one = toml::Table::from_iter([(k.clone(), v.clone())]);
            toml::Value::Table(one).try_into::<settings::FileSettings>().is_ok()
        })
        .collect();
    toml::Value::Table(good).try_into().unwrap_or_default()
}

/// The PAT's file: present, not empty, and not readable by others (a PAT that manages
/// the pool lets whoever reads it register agents and take the pool's jobs).
fn token_file(report: &mut Report, s: &RunSettings, env: &Env) {
    let Some(path) = &s.token_file else {
        match env.token() {
            Some(_) => report.add(
                Verdict::Warn,
                "token",
                "the PAT comes from AZP_TOKEN, visible in /proc: put it in a file (chmod 600) and pass --token-file",
            ),
            None => report.add(
                Verdict::Fail,
                "token",
                "no PAT: pass --token-file FILE (or AZP_TOKEN_FILE, token_file) with a PAT of scope Agent Pools (read, manage)",
            ),
        }
        return;
    };
    if report
        .result("token", settings::token::read_token_file(path), |_| format!("{} holds a PAT", path.display()))
        .is_none()
    {
        return;
    }
    if let Some(w) = settings::token::mode_warning(path) {
        report.lines.pop();
        report.add(Verdict::Warn, "token", w);
    }
}

/// Root mode: the reserved range of host ids jobs get blocks of (`/etc/subuid` of the
/// range's user), or `--userns host`'s warning.
fn job_ids(report: &mut Report, s: &RunSettings) {
    use crate::identity::Mode;
    match crate::identity::init(s.userns) {
        Ok(Mode::Blocks(r)) => {
            report.add(Verdict::Ok, "job ids", format!("{} blocks of host ids for jobs", r.blocks()))
        }
        Ok(Mode::Nested) => report.add(Verdict::Ok, "job ids", "rootless: jobs get the user's subordinate ids"),
        Ok(Mode::Host) => report.add(Verdict::Warn, "job ids", crate::identity::HOST_WARNING),
        Err(e) => report.add(Verdict::Fail, "job ids", format!("{e:#}")),
    }
}

/// Whether memory, pids and CPU limits can be enforced (a cgroup the jobs may use).
fn cgroups(report: &mut Report) {
    match crate::rootless::mode().limits_warning() {
        None => report.add(Verdict::Ok, "cgroups", "jobs' memory, pids and CPU limits are enforced"),
        Some(w) => report.add(Verdict::Warn, "cgroups", w),
    }
}

/// The rootfs: imported, able to run the agent (the newest cached agent package's needs,
/// else Microsoft's), and its CUDA against the driver's.
fn rootfs(
    report: &mut Report,
    home: &Home,
    s: &RunSettings,
    gpus: Option<(&crate::gpu::Driver, &[Vec<crate::gpu::GpuInfo>])>,
) {
    // Without the GPUs' check passing, a rootfs named is still checked; `auto` needs the driver.
    let leased = match gpus {
        Some((driver, _)) => startup::rootfs(home, s, driver),
        None if s.rootfs == "auto" => {
            let why =
                "--rootfs auto: not checked without the driver (see the gpus line); or name one with --rootfs NAME";
            return report.add(Verdict::Fail, "rootfs", why);
        }
        None => crate::rootfs::Store::new(home).lease(&s.rootfs).map(|l| (s.rootfs.clone(), l)),
    };
    let Some((name, lease)) = report.result("rootfs", leased, |(n, l)| format!("'{n}' at {}", l.path().display()))
    else {
        return;
    };
    let packages = PackageCache::new(home);
    // A package file (`--agent-package FILE`) is read here; a URL is left to `run`.
    let given = s.agent_package.as_deref().filter(|p| !p.starts_with("http://") && !p.starts_with("https://"));
    let package = match given {
        Some(file) => match packages.ensure_from(file) {
            Ok(p) => Some(p),
            Err(e) => return report.add(Verdict::Fail, "agent", format!("{e:#}")),
        },
        None => {
            let newest = packages.cached_versions().into_iter().max_by(|a, b| version_key(a).cmp(&version_key(b)));
            newest.as_deref().and_then(|v| packages.cached(v))
        }
    };
    let (needs, whose) = match package {
        Some(p) => (preflight::Needs::of_package(&p.dir, &s.url), format!("agent package {}", p.version)),
        None => (preflight::Needs::real_agent(), "the Azure Pipelines agent".to_string()),
    };
    let r = preflight::check(lease.path(), &needs, UserRule::Rootfs { allow_root: s.agents_as_root });
    if r.ready {
        let user = if preflight::rootfs_user(lease.path()).is_some() { preflight::AGENT_USER } else { "root" };
        report.add(Verdict::Ok, "agent", format!("'{name}' can run {whose} (as {user})"));
    } else {
        report.add(Verdict::Fail, "agent", r.error_line(&name));
    }
    if let Some(Err(e)) = gpus.map(|(driver, split)| startup::cuda_compat(&name, &lease, driver, split)) {
        report.add(Verdict::Fail, "cuda", format!("{e:#}"));
    }
}

fn version_key(v: &str) -> Vec<u32> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

/// Each volume's host dir exists (jobs would fail at the bind otherwise).
fn volumes(report: &mut Report, s: &RunSettings) {
    for v in &s.volumes {
        match std::fs::metadata(&v.host) {
            Ok(_) => report.add(Verdict::Ok, "volume", format!("{} -> {}", v.host.display(), v.container.display())),
            Err(e) => report.add(
                Verdict::Fail,
                "volume",
                format!("{}: {e}: create it or fix the --volume HOST:CONTAINER", v.host.display()),
            ),
        }
    }
    for (what, dir) in [("work dir", &s.work_dir), ("hooks dir", &s.hooks_dir)] {
        if let Some(d) = dir.as_ref().filter(|d| !d.is_dir()) {
            report.add(Verdict::Fail, "volume", format!("the {what} {} is not a directory: create it", d.display()));
        }
    }
}

/// Project quotas on the home's layer dirs (a per-job disk limit), or why not.
fn disk_quota(report: &mut Report, home: &Home, s: &RunSettings) {
    if !home.layers_dir().is_dir() {
        report.add(
            Verdict::Warn,
            "disk quota",
            format!("{} does not exist yet: not checked", home.layers_dir().display()),
        );
        return;
    }
    let node = crate::sandbox::limits::node::Node::read(home, crate::rootless::mode().rootless, true);
    match (node.no_quota, s.limits.disk) {
        (None, _) => report.add(
            Verdict::Ok,
            "disk quota",
            format!("{}s work: each job gets a disk limit", node.disk_mechanism.unwrap_or_default().name()),
        ),
        (Some(why), crate::sandbox::Ask::Unlimited) => {
            report.add(Verdict::Ok, "disk quota", format!("none asked (disk unlimited); {why}"))
        }
        (Some(why), _) => report.add(Verdict::Warn, "disk quota", format!("jobs get no disk limit: {why}")),
    }
    if let Some(why) = crate::manager::workdir::no_quota(s, crate::rootless::mode().rootless) {
        report.add(Verdict::Warn, "disk quota", why.trim_start_matches("WARNING: ").to_string());
    }
}

/// The Azure side, as `run` starts: the server answers, the PAT is valid, the pool
/// exists, and the PAT may manage its agents.
pub fn azure(report: &mut Report, s: &RunSettings, env_token: Option<String>) {
    let token = match &s.token_file {
        Some(path) => settings::token::read_token_file(path).ok(),
        None => env_token.filter(|t| !t.is_empty()),
    };
    let Some(token) = token else {
        report.add(Verdict::Fail, "azure", "not checked: no PAT (see the token line)");
        return;
    };
    let client = match AzureClient::new(&s.url, &token) {
        Ok(c) => c,
        Err(e) => return report.add(Verdict::Fail, "azure", format!("{e:#}")),
    };
    let conn = client.check_connection().map_err(anyhow::Error::from);
    if report.result("azure", conn, |_| format!("{} answers and the PAT is valid", s.url)).is_none() {
        return;
    }
    let pool = client.find_pool(&s.pool).map_err(anyhow::Error::from);
    let Some(pool) = report.result("pool", pool, |p| format!("'{}' (id {})", p.name, p.id)) else {
        return;
    };
    let perm = client.check_manage_permission(pool.id).map_err(anyhow::Error::from);
    report.result("permission", perm, |_| format!("the PAT may manage the agents of pool '{}'", pool.name));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_check_and_a_verdict() {
        let mut r = Report::default();
        r.add(Verdict::Ok, "config", "fine");
        r.add(Verdict::Warn, "token", "mode 0644\nchmod 600");
        assert!(!r.failed());
        let _ = r.result::<()>("rootfs", Err(anyhow::anyhow!("no rootfs 'x'").context("rootfs")), |_| String::new());
        assert!(r.failed());
        let text = r.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert_eq!(lines[0], "OK    config      fine");
        assert_eq!(lines[1], "WARN  token       mode 0644 chmod 600");
        r.add(Verdict::Warn, "cgroups", "WARNING: limits are NOT enforced");
        assert_eq!(r.lines.last().unwrap().text, "limits are NOT enforced", "no WARN WARNING");
        r.lines.pop();
        assert_eq!(lines[2], "FAIL  rootfs      rootfs: no rootfs 'x'");
        assert_eq!(lines[3], "NOT READY: 3 checks, 1 failed, 1 warning(s)");
    }

    #[test]
    fn a_bad_config_is_named_and_the_rest_still_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = tmp.path().join("config.toml");
        std::fs::write(&cfg, "pool = \"p\"\ngpus_per_agnet = 1\n[setuid]\nuser = []\n").unwrap();
        let mut r = Report::default();
        let f = config_file(&mut r, Some(&cfg));
        assert_eq!(f.pool.as_deref(), Some("p"), "the good keys still count");
        assert!(f.gpus_per_agent.is_none());
        assert_eq!(r.lines.len(), 2, "{:?}", r.lines);
        assert_eq!((r.lines[0].verdict, r.lines[1].verdict), (Verdict::Fail, Verdict::Fail));
        assert!(r.lines[1].text.contains("did you mean `users`?"), "{:?}", r.lines);
        let want = "line 2 (`gpus_per_agnet = 1`): unknown key `gpus_per_agnet`: did you mean `gpus_per_agent`?";
        assert!(r.lines[0].text.ends_with(want), "{:?}", r.lines);

        std::fs::write(&cfg, "pool = \"p\"\ngpus_per_agent = 1\n[setuid]\nuser = []\n").unwrap();
        let mut r = Report::default();
        let f = config_file(&mut r, Some(&cfg));
        assert_eq!(f.gpus_per_agent.as_deref(), Some("1"));
        assert_eq!((r.lines[0].verdict, r.lines[1].verdict), (Verdict::Ok, Verdict::Fail), "{:?}", r.lines);
        assert!(r.lines[1].text.contains("did you mean `users`?"), "{:?}", r.lines);

        let mut r = Report::default();
        config_file(&mut r, Some(&tmp.path().join("nope.toml")));
        assert_eq!(r.lines[0].verdict, Verdict::Fail);
        assert!(r.lines[0].text.contains("check --config"), "{:?}", r.lines);
    }

    #[test]
    fn each_cache_and_git_mirror_is_a_line() {
        let tmp = tempfile::tempdir().unwrap();
        let home = Home::new(tmp.path());
        let decl = |s: &str| s.parse::<crate::cache::CacheDecl>().unwrap();
        let store = crate::cache::store::dir(&home, "pip");
        crate::cache::store::ensure(&store).unwrap();
        crate::cache::store::ensure(&crate::cache::store::dir(&home, "old")).unwrap();
        let upper = tmp.path().join("upper");
        std::fs::create_dir(&upper).unwrap();
        std::fs::write(upper.join("wheel"), vec![0u8; 8192]).unwrap();
        crate::cache::commit::commit(&store, &upper, None, "gpu-0-7", None).unwrap();
        let mirror = MirrorSpec::from_entry(&crate::mirror::MirrorEntry {
            url: "https://h/big.git".into(),
            ..Default::default()
        })
        .unwrap();
        let mut r = Report::default();
        caches(&mut r, &home, &[decl("pip:/root/.cache/pip"), decl("conda:/opt/conda")], std::slice::from_ref(&mirror));
        let text: Vec<String> = r.lines.iter().map(|l| format!("{:?} {} {}", l.verdict, l.what, l.text)).collect();
        assert_eq!(text.len(), 4, "{text:?}");
        assert!(
            text[0].starts_with("Ok cache pip: snapshot 2, ")
                && text[0].contains("ago by job gpu-0-7, 0 hit(s) at /root/.cache/pip"),
            "{text:?}"
        );
        assert_eq!(text[1], "Ok cache conda at /opt/conda: empty until a job makes it");
        assert!(
            text[2].starts_with("Warn cache old: snapshot 1, ") && text[2].contains("`azp-sandbox cache rm old`"),
            "{text:?}"
        );
        assert!(
            text[3].starts_with(&format!("Ok git mirror {} (https://h/big.git): not made yet", mirror.name)),
            "{text:?}"
        );
        std::fs::create_dir_all(mirror.dir(&home).join("objects")).unwrap();
        std::fs::write(mirror.dir(&home).join("config"), "\turl = https://h/big.git\n").unwrap();
        let mut r = Report::default();
        caches(&mut r, &home, &[], std::slice::from_ref(&mirror));
        let last = &r.lines.last().unwrap().text;
        assert!(
            last.starts_with(&format!("{} (https://h/big.git): ", mirror.name)) && last.ends_with("never fetched"),
            "{last}"
        );
    }
}
