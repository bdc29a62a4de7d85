//! The step runner: each build step is a child process in its own process group and,
//! through [`crate::sys::isolate`], its own mount namespace (the chroot steps also with
//! the tree's /proc, /sys, /dev and the .deb cache). Its output goes to the build log;
//! a failing step prints the log's last 20 lines; Ctrl-C ([`CANCEL`]) stops it.

use super::ui::{tail_lines, Ui};
use crate::rootfs::CANCEL;
use crate::sys::isolate;
use anyhow::{bail, Context, Result};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::fs::File;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Runs the steps of one build, in order, into one log.
pub(super) struct Steps<'a> {
    /// The rootfs being built, for messages.
    pub name: &'a str,
    pub log: File,
    pub log_path: &'a Path,
    pub ui: Ui,
}

impl Steps<'_> {
    pub fn log_line(&mut self, s: &str) {
        let _ = writeln!(self.log, "{s}");
    }

    /// `cmd` (on the host, in its own mount namespace).
    pub fn host(&mut self, label: &str, mut cmd: Command) -> Result<()> {
        base_env(&mut cmd);
        isolate::private_mounts(&mut cmd);
        let detail = format!("$ {cmd:?}");
        self.run(label, &detail, cmd)
    }

    /// `script` with /bin/sh in `tree`, chrooted, with /proc, /sys and /dev (and with
    /// `apt_cache`, the .deb cache on /var/cache/apt/archives) mounted.
    pub fn chroot(&mut self, label: &str, tree: &Path, script: &str, apt_cache: Option<&Path>) -> Result<()> {
        let plan = isolate::ChrootPlan::new(tree, apt_cache)?;
        let mut cmd = Command::new("/bin/sh");
        base_env(&mut cmd);
        cmd.arg("-c").arg(script);
        isolate::chroot(&mut cmd, plan);
        self.run(label, &format!("$ chroot {} /bin/sh -c '{}'", tree.display(), script.trim_end()), cmd)
    }

    /// Runs one step to completion, its output in the log; on failure prints the log's
    /// last 20 lines and fails with a one-line error.
    fn run(&mut self, label: &str, detail: &str, mut cmd: Command) -> Result<()> {
        self.ui.begin(label);
        self.log_line(&format!("\n==> [{}/{}] {label}\n{detail}", self.ui.index, self.ui.total));
        let out = self.log.try_clone().context("cannot duplicate the log file")?;
        let err = self.log.try_clone().context("cannot duplicate the log file")?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err).process_group(0);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                let e = match crate::sys::Error::from_spawn(&e) {
                    Some(step) => anyhow::Error::new(step),
                    None => anyhow::Error::new(e),
                };
                return Err(e.context(format!("cannot start {label}")));
            }
        };
        let group = Pid::from_raw(child.id() as i32);
        let status = loop {
            match child.try_wait() {
                Ok(Some(st)) => break st,
                Ok(None) => {}
                Err(e) => return Err(e).with_context(|| format!("cannot wait for {label}")),
            }
            if CANCEL.load(Ordering::SeqCst) {
                let _ = killpg(group, Signal::SIGTERM);
                std::thread::sleep(Duration::from_millis(500));
                let _ = killpg(group, Signal::SIGKILL);
                let _ = child.wait();
                self.ui.end(false);
                bail!("build of '{}' interrupted during {label}", self.name);
            }
            self.ui.tick(self.log_path);
            std::thread::sleep(Duration::from_millis(100));
        };
        // Anything the step left behind in its group (the leader is gone; ESRCH when
        // nothing is).
        let _ = killpg(group, Signal::SIGKILL);
        self.ui.end(status.success());
        if !status.success() {
            let tail = tail_lines(self.log_path, 20, 64 << 10);
            let mut e = std::io::stderr().lock();
            let _ = writeln!(e, "--- last {} lines of {} ---", tail.len(), self.log_path.display());
            for l in tail {
                let _ = writeln!(e, "  | {l}");
            }
            let what = match status.code() {
                Some(c) => format!("exit status {c}"),
                None => format!("{status}"),
            };
            bail!("{label} failed ({what}); its last lines are above, full log: {}", self.log_path.display());
        }
        Ok(())
    }
}

/// Environment passed to every step: a fixed PATH and locale, plus the caller's proxies.
fn base_env(cmd: &mut Command) {
    cmd.env_clear()
        .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        .env("LC_ALL", "C")
        .env("LANG", "C")
        .env("HOME", "/root")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .env("DEBCONF_NONINTERACTIVE_SEEN", "true");
    for k in ["http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ftp_proxy"] {
        if let Some(v) = std::env::var_os(k) {
            cmd.env(k, v);
        }
    }
}
