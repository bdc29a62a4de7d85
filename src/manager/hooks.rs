//! Admin-provided lifecycle hooks: executables in `<hooks_dir>/pre-job.d/` and
//! `<hooks_dir>/post-job.d/`, run on the host in name order with the slot's context in
//! the environment and a timeout. A failing hook pauses the slot (e.g. a GPU with ECC
//! errors must not take jobs); the reason is logged and shown by `status`.

use anyhow::{bail, Context, Result};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    PreJob,
    PostJob,
}

impl Stage {
    fn dir(self) -> &'static str {
        match self {
            Stage::PreJob => "pre-job.d",
            Stage::PostJob => "post-job.d",
        }
    }
}

/// Executable files of a stage, sorted by name (non-executables are skipped, as run-parts).
pub fn list(hooks_dir: &Path, stage: Stage) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(hooks_dir.join(stage.dir()))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_file() && p.metadata().map(|m| m.permissions().mode() & 0o111 != 0).unwrap_or(false))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Runs every hook of a stage; the first failure is returned as the pause reason.
pub fn run(hooks_dir: &Path, stage: Stage, env: &[(String, String)], timeout: Duration) -> Result<()> {
    for hook in list(hooks_dir, stage) {
        run_one(&hook, env, timeout)?;
    }
    Ok(())
}

fn run_one(hook: &Path, env: &[(String, String)], timeout: Duration) -> Result<()> {
    let mut child = Command::new(hook)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("hook {} could not start", hook.display()))?;
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("hook {} timed out after {}s", hook.display(), timeout.as_secs());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output()?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let last = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_string();
    if !status.success() {
        bail!(
            "hook {} failed ({status}){}",
            hook.display(),
            if last.is_empty() { String::new() } else { format!(": {last}") }
        );
    }
    if !last.is_empty() {
        tracing::debug!("hook {}: {last}", hook.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(dir: &Path, name: &str, body: &str) {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn hooks_run_in_order_with_env_and_fail_with_reason() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("pre-job.d");
        std::fs::create_dir_all(&d).unwrap();
        let log = t.path().join("log");
        script(&d, "10-a", &format!("echo a-$AZP_SLOT >> {}", log.display()));
        script(&d, "20-b", &format!("echo b-$AZP_AGENT_NAME >> {}", log.display()));
        std::fs::write(d.join("30-not-executable"), "exit 1").unwrap();
        let env = vec![("AZP_SLOT".to_string(), "3".to_string()), ("AZP_AGENT_NAME".into(), "n-3".into())];
        run(t.path(), Stage::PreJob, &env, Duration::from_secs(5)).unwrap();
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "a-3\nb-n-3\n");
        script(&d, "25-ecc", "echo 'GPU 0: 2 uncorrected ECC errors' >&2; exit 1");
        let e = run(t.path(), Stage::PreJob, &env, Duration::from_secs(5)).unwrap_err().to_string();
        assert!(e.contains("25-ecc") && e.contains("uncorrected ECC errors"), "{e}");
        script(&d, "26-slow", "sleep 5");
        std::fs::remove_file(d.join("25-ecc")).unwrap();
        let e = run(t.path(), Stage::PreJob, &env, Duration::from_millis(200)).unwrap_err().to_string();
        assert!(e.contains("timed out"), "{e}");
        assert!(run(t.path(), Stage::PostJob, &env, Duration::from_secs(1)).is_ok(), "no post-job hooks: ok");
    }
}
