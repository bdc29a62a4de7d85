//! The mirror's git commands: made (an empty bare repository, at once), checked (the remote
//! answers, at start) and fetched (on the keeper's timer). Each is a `git` process of its
//! own with a clean environment: no job's variables or credentials, no user or system git
//! config, no terminal prompt; the mirror's own token (if any) goes in through git's
//! environment config, never on a command line.

use super::MirrorSpec;
use crate::config::Home;
use anyhow::{bail, Context, Result};
use base64::Engine;
use std::path::Path;
use std::process::{Command, Stdio};

/// Makes the bare mirror (empty) if it is not there, readable by every id (jobs run as ids
/// of their own): dirs 0755, files 0644.
pub fn create(home: &Home, spec: &MirrorSpec) -> Result<()> {
    let dir = spec.dir(home);
    if dir.join("objects").is_dir() {
        return Ok(());
    }
    let parent = super::mirrors_dir(home);
    std::fs::create_dir_all(&parent)
        .with_context(|| format!("cannot create {}: check the home and free space", parent.display()))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o711))?;
    // Made aside and renamed: a half-made mirror is never found at its path.
    let partial = parent.join(format!(".{}.partial", spec.name));
    let _ = std::fs::remove_dir_all(&partial);
    let p = partial.display().to_string();
    git(None, &["init", "--quiet", "--bare", &p]).map_err(|e| disk_or(e, &parent, "cannot create the git mirror"))?;
    for (k, v) in [
        ("remote.origin.url", spec.url.as_str()),
        ("remote.origin.fetch", "+refs/*:refs/*"),
        ("remote.origin.mirror", "true"),
        // Objects are never removed under readers (see the module doc).
        ("gc.auto", "0"),
        ("core.sharedRepository", "0644"),
    ] {
        git(None, &["--git-dir", &p, "config", k, v])?;
    }
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&partial, &dir).with_context(|| format!("cannot rename {} to {}", p, dir.display()))?;
    Ok(())
}

/// Whether the remote answers (`git ls-remote`), for a one-line error at start.
pub fn check_remote(spec: &MirrorSpec) -> Result<()> {
    remote_git(spec, &["ls-remote", "--heads", &spec.url]).map(|_| ())
}

/// Fetches every ref of the remote into the mirror, all refs in one transaction
/// (`--atomic`): on failure the mirror is as it was.
pub fn fetch(home: &Home, spec: &MirrorSpec) -> Result<()> {
    let dir = spec.dir(home);
    let d = dir.display().to_string();
    remote_git(spec, &["--git-dir", &d, "fetch", "--quiet", "--atomic", "--prune", "--no-auto-gc", "origin"])
        .map(|_| ())
        .map_err(|e| disk_or(e, &dir, "cannot fetch"))
}

/// A git command that talks to the remote: bounded (a stalled transfer ends), with the
/// mirror's credentials if it has any.
fn remote_git(spec: &MirrorSpec, args: &[&str]) -> Result<String> {
    let mut config: Vec<(String, String)> = vec![
        // A remote that stops sending for a minute fails the fetch instead of hanging.
        ("http.lowSpeedLimit".into(), "1000".into()),
        ("http.lowSpeedTime".into(), "60".into()),
    ];
    if let Some(f) = &spec.credentials_file {
        let token = std::fs::read_to_string(f)
            .with_context(|| format!("cannot read the git mirror's credentials_file {}", f.display()))?;
        let token = token.trim();
        if token.is_empty() || token.contains('\n') {
            bail!("the git mirror's credentials_file {} must hold one token on one line", f.display());
        }
        let basic = base64::engine::general_purpose::STANDARD.encode(format!(":{token}"));
        config.push(("http.extraHeader".into(), format!("Authorization: Basic {basic}")));
    }
    git(Some(&config), args).map_err(|e| anyhow::anyhow!("git mirror of {}: {}", spec.url, explain(&e.to_string())))
}

/// Runs git with a clean environment; Err: its first fatal line (or its last line).
fn git(config: Option<&[(String, String)]>, args: &[&str]) -> Result<String> {
    let mut c = Command::new("git");
    c.args(args).env_clear().stdin(Stdio::null());
    c.env("PATH", std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()));
    c.env("HOME", "/nonexistent").env("LC_ALL", "C").env("GIT_TERMINAL_PROMPT", "0");
    c.env("GIT_CONFIG_NOSYSTEM", "1").env("GIT_CONFIG_GLOBAL", "/dev/null");
    let config = config.unwrap_or(&[]);
    c.env("GIT_CONFIG_COUNT", config.len().to_string());
    for (i, (k, v)) in config.iter().enumerate() {
        c.env(format!("GIT_CONFIG_KEY_{i}"), k).env(format!("GIT_CONFIG_VALUE_{i}"), v);
    }
    let out = c.output().context("cannot run git: install git (the git mirrors need it)")?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        // git's own reason is its first fatal/error line (advice follows it).
        let lines: Vec<&str> = err.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        let line = lines
            .iter()
            .find(|l| l.starts_with("fatal:") || l.starts_with("error:"))
            .or(lines.last())
            .copied()
            .unwrap_or("no message");
        bail!("{line}");
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// git's last line, said as what to do.
fn explain(line: &str) -> String {
    let l = line.to_ascii_lowercase();
    if l.contains("no space left on device") {
        format!("disk full ({line})")
    } else if l.contains("could not resolve host")
        || l.contains("failed to connect")
        || l.contains("connection refused")
        || l.contains("timed out")
        || l.contains("network is unreachable")
    {
        format!("the remote cannot be reached ({line}): check the URL and this host's network or proxy")
    } else if l.contains("authentication") || l.contains(" 401") || l.contains(" 403") {
        format!("the remote refused access ({line}): check credentials_file")
    } else if l.contains("not found") || l.contains(" 404") || l.contains("does not appear to be a git repository") {
        format!("no repository at this URL ({line}): check the url")
    } else {
        line.to_string()
    }
}

fn disk_or(e: anyhow::Error, dir: &Path, what: &str) -> anyhow::Error {
    let s = format!("{e:#}");
    if s.to_ascii_lowercase().contains("no space left on device") || s.contains("disk full") {
        anyhow::anyhow!("{what} {}: disk full: free space on its filesystem (the old mirror is kept)", dir.display())
    } else {
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mirror::MirrorEntry;

    fn spec(url: &str) -> MirrorSpec {
        MirrorSpec::from_entry(&MirrorEntry { url: url.into(), ..Default::default() }).unwrap()
    }

    /// A local upstream with one commit (git, no network: `file://`).
    fn upstream(dir: &Path) -> String {
        let run = |args: &[&str]| {
            let st = Command::new("git")
                .args(args)
                .current_dir(dir)
                .env("GIT_CONFIG_GLOBAL", "/dev/null")
                .env("GIT_AUTHOR_NAME", "t")
                .env("GIT_AUTHOR_EMAIL", "t@t")
                .env("GIT_COMMITTER_NAME", "t")
                .env("GIT_COMMITTER_EMAIL", "t@t")
                .output()
                .unwrap();
            assert!(st.status.success(), "{args:?}: {}", String::from_utf8_lossy(&st.stderr));
            String::from_utf8_lossy(&st.stdout).trim().to_string()
        };
        run(&["init", "-q", "-b", "main"]);
        std::fs::write(dir.join("f"), "one").unwrap();
        run(&["add", "f"]);
        run(&["commit", "-q", "-m", "one"]);
        run(&["rev-parse", "HEAD"])
    }

    #[test]
    fn create_then_fetch_a_local_remote_and_keep_it_when_the_remote_goes() {
        let t = tempfile::tempdir().unwrap();
        let up = t.path().join("up");
        std::fs::create_dir(&up).unwrap();
        let head = upstream(&up);
        let home = Home::new(t.path().join("home"));
        let s = spec(&format!("file://{}", up.display()));
        check_remote(&s).unwrap();
        create(&home, &s).unwrap();
        fetch(&home, &s).unwrap();
        let d = s.dir(&home).display().to_string();
        assert_eq!(git(None, &["--git-dir", &d, "rev-parse", "refs/heads/main"]).unwrap().trim(), head);
        std::fs::remove_dir_all(&up).unwrap();
        let e = fetch(&home, &s).unwrap_err().to_string();
        assert!(e.contains("git mirror of file://") && !e.contains('\n'), "{e}");
        assert_eq!(git(None, &["--git-dir", &d, "rev-parse", "refs/heads/main"]).unwrap().trim(), head, "kept");
        let e = check_remote(&s).unwrap_err().to_string();
        assert!(e.contains("check the url") || e.contains("does not appear"), "{e}");
    }

    #[test]
    fn unreachable_remotes_say_so() {
        // A port on loopback with nothing listening: refused at once, nothing leaves the host.
        let s = spec("http://127.0.0.1:9/nothing.git");
        let e = check_remote(&s).unwrap_err().to_string();
        assert!(e.contains("cannot be reached") && !e.contains('\n'), "{e}");
    }

    #[test]
    fn disk_full_is_named() {
        assert!(explain("error: No space left on device").starts_with("disk full"));
        let e = disk_or(anyhow::anyhow!("x: disk full (y)"), Path::new("/h/m.git"), "cannot fetch").to_string();
        assert!(e.contains("disk full: free space") && e.contains("old mirror is kept"), "{e}");
    }
}
