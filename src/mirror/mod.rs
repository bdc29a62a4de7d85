//! Git mirror caches (issue 24): for repositories the operator names (`[[git_mirror]]` in
//! config.toml), the manager keeps a bare mirror under the home fresh, fetching on a timer
//! in a process of its own, never in a job and never with a job's credentials
//! ([`keeper`], [`fetch`]). Every job gets each mirror bound read-only (a volume: ro,
//! nosuid, nodev) and `GIT_ALTERNATE_OBJECT_DIRECTORIES` naming their object dirs
//! ([`job_volumes`]), so the agent's checkout fetches only what the mirrors lack.
//!
//! Why a reader never sees a half-updated mirror: git writes objects and packs under
//! temporary names and renames them into place (a pack's `.idx` after its `.pack`), and
//! updates each ref by renaming a lock file over it (`packed-refs` likewise). A job using
//! the mirror as an alternate only ever looks objects up: an object is either absent
//! (fetched from the remote) or complete. The mirror is never pruned of objects by the
//! manager (`gc.auto=0`, no `--prune` of objects), so an object a job found stays.

pub mod fetch;
pub mod keeper;
pub mod summary;

use crate::config::{Home, Volume};
use anyhow::{bail, Result};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where jobs see the mirrors: `<this>/<name>.git`.
pub const JOB_ROOT: &str = "/opt/azp-git-mirrors";

/// The default time between two fetches of a mirror.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(600);

/// One `[[git_mirror]]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorSpec {
    /// The remote, `https://`, `http://` or `file://`.
    pub url: String,
    /// The mirror's dir name (without `.git`): the repository's name and a digest of the
    /// URL, so two remotes never share a mirror.
    pub name: String,
    pub interval: Duration,
    /// A file holding a token (e.g. an Azure DevOps PAT with Code (read)) sent as HTTP
    /// basic auth; None: anonymous.
    pub credentials_file: Option<PathBuf>,
}

/// `[[git_mirror]]` as written in the config file.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MirrorEntry {
    pub url: String,
    /// "10m", "1h", "90s" (default 10m).
    pub interval: Option<String>,
    pub credentials_file: Option<PathBuf>,
}

impl MirrorSpec {
    /// Validates a config entry into a mirror, with a one-line error naming what to fix.
    pub fn from_entry(e: &MirrorEntry) -> Result<MirrorSpec> {
        let url = e.url.trim();
        let rest = ["https://", "http://", "file://"]
            .iter()
            .find_map(|s| url.strip_prefix(s))
            .filter(|r| !r.is_empty() && !r.starts_with('/') || url.starts_with("file:///"));
        let Some(rest) = rest else {
            bail!("bad [[git_mirror]] url '{url}': expected https://HOST/PATH (or http://, file:///PATH)");
        };
        if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
            bail!("bad [[git_mirror]] url '{url}': it may not contain spaces or control characters");
        }
        if rest.split('/').next().is_some_and(|host| host.contains('@')) {
            bail!("bad [[git_mirror]] url '{url}': put credentials in credentials_file, not in the URL");
        }
        let interval = match &e.interval {
            None => DEFAULT_INTERVAL,
            Some(s) => parse_interval(s)
                .map_err(|why| anyhow::anyhow!("bad [[git_mirror]] interval '{s}' for {url}: {why}"))?,
        };
        if let Some(f) = &e.credentials_file {
            if !f.is_absolute() {
                bail!("bad [[git_mirror]] credentials_file '{}' for {url}: give an absolute path", f.display());
            }
        }
        Ok(MirrorSpec {
            url: url.to_string(),
            name: mirror_name(url),
            interval,
            credentials_file: e.credentials_file.clone(),
        })
    }

    /// The bare mirror on the host.
    pub fn dir(&self, home: &Home) -> PathBuf {
        mirrors_dir(home).join(format!("{}.git", self.name))
    }

    /// Where jobs see it.
    pub fn job_dir(&self) -> PathBuf {
        Path::new(JOB_ROOT).join(format!("{}.git", self.name))
    }
}

/// Validates every `[[git_mirror]]`; two entries for one URL are refused.
pub fn specs(entries: &[MirrorEntry]) -> Result<Vec<MirrorSpec>> {
    let mut out: Vec<MirrorSpec> = Vec::new();
    for e in entries {
        let s = MirrorSpec::from_entry(e)?;
        if out.iter().any(|o| o.name == s.name) {
            bail!("[[git_mirror]] url '{}' is given twice: keep one", s.url);
        }
        out.push(s);
    }
    Ok(out)
}

/// `HOME/git-mirrors`.
pub fn mirrors_dir(home: &Home) -> PathBuf {
    home.root().join("git-mirrors")
}

/// "90s", "10m", "2h", or plain seconds; at least 10 s.
pub fn parse_interval(s: &str) -> std::result::Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().map_err(|_| "expected a number and s, m or h, e.g. \"10m\"".to_string())?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err("expected a number and s, m or h, e.g. \"10m\"".into()),
    };
    if secs < 10 {
        return Err("at least 10s".into());
    }
    Ok(Duration::from_secs(secs))
}

/// `<last path segment without .git>-<8 hex of the URL's sha256>`, in [A-Za-z0-9._-].
fn mirror_name(url: &str) -> String {
    let last = url.trim_end_matches('/').rsplit('/').next().unwrap_or("repo");
    let last = last.strip_suffix(".git").unwrap_or(last);
    let mut base: String =
        last.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
    base.truncate(60);
    if base.is_empty() {
        base = "repo".into();
    }
    format!("{base}-{}", &crate::digest::sha256_hex(url.as_bytes())[..8])
}

/// What every job gets: each mirror that exists (its first fetch done) as a read-only
/// volume, and the environment that makes git use them as alternates.
pub fn job_volumes(home: &Home, specs: &[MirrorSpec]) -> (Vec<Volume>, Vec<(String, String)>) {
    let ready: Vec<&MirrorSpec> = specs.iter().filter(|s| s.dir(home).join("objects").is_dir()).collect();
    if ready.is_empty() {
        return (vec![], vec![]);
    }
    let volumes = ready.iter().map(|s| Volume { host: s.dir(home), container: s.job_dir(), env: None }).collect();
    let objects: Vec<String> = ready.iter().map(|s| s.job_dir().join("objects").display().to_string()).collect();
    let mut env = vec![("GIT_ALTERNATE_OBJECT_DIRECTORIES".to_string(), objects.join(":"))];
    // The mirror is owned by an id the job does not have: git would refuse to read its
    // refs (safe.directory) when a fetch asks the alternates for "haves". Trust exactly
    // these read-only dirs, through git's environment config (no file in the job).
    env.push(("GIT_CONFIG_COUNT".into(), ready.len().to_string()));
    for (i, s) in ready.iter().enumerate() {
        env.push((format!("GIT_CONFIG_KEY_{i}"), "safe.directory".into()));
        env.push((format!("GIT_CONFIG_VALUE_{i}"), s.job_dir().display().to_string()));
    }
    (volumes, env)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(url: &str) -> MirrorEntry {
        MirrorEntry { url: url.into(), ..Default::default() }
    }

    #[test]
    fn urls_are_checked_with_one_line_errors() {
        let ok = MirrorSpec::from_entry(&entry("https://dev.azure.com/org/proj/_git/repo")).unwrap();
        assert!(ok.name.starts_with("repo-") && ok.name.len() == 13, "{}", ok.name);
        assert_eq!(ok.interval, DEFAULT_INTERVAL);
        assert!(MirrorSpec::from_entry(&entry("file:///srv/git/big.git")).unwrap().name.starts_with("big-"));
        for (bad, says) in [
            ("ssh://git@host/repo", "expected https://"),
            ("https://", "expected https://"),
            ("git@github.com:o/r.git", "expected https://"),
            ("https://user:pat@dev.azure.com/o/_git/r", "credentials_file"),
            ("https://host/a b", "spaces"),
        ] {
            let e = MirrorSpec::from_entry(&entry(bad)).unwrap_err().to_string();
            assert!(e.contains(says) && !e.contains('\n'), "{bad}: {e}");
        }
        let e = MirrorEntry { interval: Some("5".into()), ..entry("https://h/r") };
        assert!(MirrorSpec::from_entry(&e).unwrap_err().to_string().contains("at least 10s"));
        let e = MirrorEntry { credentials_file: Some("pat".into()), ..entry("https://h/r") };
        assert!(MirrorSpec::from_entry(&e).unwrap_err().to_string().contains("absolute"));
        let e = specs(&[entry("https://h/r"), entry("https://h/r")]).unwrap_err().to_string();
        assert!(e.contains("twice"), "{e}");
    }

    #[test]
    fn intervals() {
        assert_eq!(parse_interval("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_interval("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_interval("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_interval("30"), Ok(Duration::from_secs(30)));
        assert!(parse_interval("10 min").is_err() && parse_interval("m").is_err());
    }

    #[test]
    fn jobs_get_only_mirrors_that_exist_read_only_with_alternates() {
        let t = tempfile::tempdir().unwrap();
        let home = Home::new(t.path());
        let a = MirrorSpec::from_entry(&entry("https://h/a.git")).unwrap();
        let b = MirrorSpec::from_entry(&entry("https://h/b")).unwrap();
        assert_eq!(job_volumes(&home, &[a.clone(), b.clone()]), (vec![], vec![]));
        std::fs::create_dir_all(a.dir(&home).join("objects")).unwrap();
        std::fs::create_dir_all(b.dir(&home).join("objects")).unwrap();
        let (vols, env) = job_volumes(&home, &[a.clone(), b.clone()]);
        assert_eq!(vols.len(), 2);
        assert_eq!(vols[0].host, a.dir(&home));
        assert!(vols[0].container.starts_with(JOB_ROOT));
        let alt = &env.iter().find(|(k, _)| k == "GIT_ALTERNATE_OBJECT_DIRECTORIES").unwrap().1;
        assert_eq!(*alt, format!("{}/objects:{}/objects", a.job_dir().display(), b.job_dir().display()));
        assert!(env.contains(&("GIT_CONFIG_COUNT".into(), "2".into())));
        assert!(env.contains(&("GIT_CONFIG_VALUE_1".into(), b.job_dir().display().to_string())));
    }
}
