//! `azp-sandbox status`: what a running `run` (or, with `--slurm`, `slurm`) of this home
//! is doing. One printer for both: each writes a status file; this reads it, checks its
//! writer is alive, and shows it as JSON or as text. Exit 0 while it runs, 3 when not.

use super::{Context, Verb};
use anyhow::{Context as _, Result};
use azp_sandbox::config::Home;
use azp_sandbox::manager::status::Status;
use azp_sandbox::slurm::SlurmStatus;
use serde::{de::DeserializeOwned, Serialize};
use std::path::PathBuf;

/// Exit code when the status file's writer is gone (as `systemctl status` uses 3).
const EXIT_NOT_RUNNING: i32 = 3;

#[derive(clap::Args)]
pub struct StatusArgs {
    /// Print the status as JSON (for scripts and monitoring)
    #[arg(long)]
    json: bool,
    /// Show the `azp-sandbox slurm` of this home instead
    #[arg(long)]
    slurm: bool,
}

impl Verb for StatusArgs {
    fn run(self: Box<Self>, ctx: &Context) -> Result<i32> {
        let (text, code) =
            if self.slurm { show::<SlurmStatus>(&ctx.home, self.json)? } else { show::<Status>(&ctx.home, self.json)? };
        print!("{text}");
        Ok(code)
    }
}

/// A status file that `status` shows.
trait Report: Serialize + DeserializeOwned {
    /// Whose status it is, and the verb that writes it (for the error when there is none).
    const WHAT: &'static str;
    const WRITER: &'static str;
    fn path(home: &Home) -> PathBuf;
    fn pid(&self) -> u32;
    fn render(&self, alive: bool) -> String;
    /// Adds what is read from the home rather than the file.
    fn add_from_home(&mut self, _home: &Home) {}
}

impl Report for Status {
    const WHAT: &'static str = "manager";
    const WRITER: &'static str = "run";
    fn path(home: &Home) -> PathBuf {
        azp_sandbox::manager::status::path(home)
    }
    fn pid(&self) -> u32 {
        self.pid
    }
    fn render(&self, alive: bool) -> String {
        azp_sandbox::manager::status::render(self, alive)
    }
    fn add_from_home(&mut self, home: &Home) {
        self.failed_jobs = azp_sandbox::manager::failed::list(home);
        self.caches = azp_sandbox::cache::store::summaries(home);
        self.mirrors = azp_sandbox::mirror::summary::summaries(home);
    }
}

impl Report for SlurmStatus {
    const WHAT: &'static str = "Slurm";
    const WRITER: &'static str = "slurm";
    fn path(home: &Home) -> PathBuf {
        azp_sandbox::slurm::status_path(home)
    }
    fn pid(&self) -> u32 {
        self.pid
    }
    fn render(&self, alive: bool) -> String {
        SlurmStatus::render(self, alive)
    }
}

/// The text to print and the exit code: 3 (as `systemctl status`) when nothing runs,
/// with "not running" (or `{"running": false}`) when there is no status file at all.
fn show<R: Report>(home: &Home, json: bool) -> Result<(String, i32)> {
    let path = R::path(home);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let text = if json {
                "{\"running\": false}\n".to_string()
            } else {
                format!("not running: no `azp-sandbox {}` has run with the home {}\n", R::WRITER, home.root().display())
            };
            return Ok((text, EXIT_NOT_RUNNING));
        }
        Err(e) => return Err(e).with_context(|| format!("cannot read the {} status {}", R::WHAT, path.display())),
    };
    let mut status: R = serde_json::from_slice(&bytes).with_context(|| format!("corrupt {}", path.display()))?;
    status.add_from_home(home);
    let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(status.pid() as i32), None).is_ok();
    let text = if json {
        let mut v = serde_json::to_value(&status)?;
        if let Some(o) = v.as_object_mut() {
            o.insert("running".into(), alive.into());
        }
        format!("{}\n", serde_json::to_string_pretty(&v)?)
    } else {
        status.render(alive)
    };
    Ok((text, if alive { 0 } else { EXIT_NOT_RUNNING }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_printer_for_both_files() {
        let tmp = tempfile::tempdir().unwrap();
        let home = Home::new(tmp.path());
        let (text, code) = show::<Status>(&home, false).unwrap();
        assert!(text.starts_with("not running") && text.contains("`azp-sandbox run`"), "{text}");
        assert_eq!(code, EXIT_NOT_RUNNING);
        let (text, code) = show::<SlurmStatus>(&home, true).unwrap();
        assert_eq!(serde_json::from_str::<serde_json::Value>(&text).unwrap(), serde_json::json!({"running": false}));
        assert_eq!(code, EXIT_NOT_RUNNING);

        let me = std::process::id();
        let st = Status { pid: me, pool: "gpu".into(), limits_enforced: true, ..Default::default() };
        std::fs::write(Status::path(&home), serde_json::to_vec(&st).unwrap()).unwrap();
        let (text, code) = show::<Status>(&home, false).unwrap();
        assert_eq!(code, 0);
        assert!(text.contains(&format!("pid {me} (running)")) && text.contains("pool      gpu"), "{text}");
        let (text, _) = show::<Status>(&home, true).unwrap();
        assert_eq!(serde_json::from_str::<Status>(&text).unwrap().pool, "gpu");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&text).unwrap()["running"], true);
        assert!(text.ends_with("}\n"), "{text}");

        // A writer that is gone: pid_max is at most 2^22, so this pid never runs.
        let st = SlurmStatus { pid: 1 << 23, partition: "p".into(), ..Default::default() };
        std::fs::write(SlurmStatus::path(&home), serde_json::to_vec(&st).unwrap()).unwrap();
        let (text, code) = show::<SlurmStatus>(&home, false).unwrap();
        assert_eq!(code, EXIT_NOT_RUNNING);
        assert!(text.contains("NOT RUNNING") && text.contains("partition p"), "{text}");
        let (text, _) = show::<SlurmStatus>(&home, true).unwrap();
        assert_eq!(serde_json::from_str::<serde_json::Value>(&text).unwrap()["running"], false);

        std::fs::write(Status::path(&home), b"{").unwrap();
        let e = format!("{:#}", show::<Status>(&home, false).unwrap_err());
        assert!(e.starts_with("corrupt "), "{e}");
    }
}
