//! `azp-sandbox exec`: run a command in a fresh, throwaway sandbox (no command: the
//! rootfs's shell). The sandbox's flags ([`JobArgs`]) are `shell`'s too.

use super::args::{checked, parse_job_name, parse_user, LimitArgs, NetworkArgs};
use super::{Context, Needs, Verb};
use anyhow::Result;
use azp_sandbox::config::{EnvVar, Volume};
use azp_sandbox::gpu::{Capabilities, GpuRequest};
use azp_sandbox::sandbox::exec::ExecRequest;
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ExecArgs {
    #[command(flatten)]
    pub job: JobArgs,
    /// Give the command a terminal of its own (a pty in the sandbox, relayed to yours):
    /// for interactive programs, job control, `tty`. The default when no command is given
    /// and stdin is a terminal
    #[arg(long, short = 't')]
    tty: bool,
    /// Command and arguments [default: the rootfs's shell: the user's login shell in its
    /// /etc/passwd, else /bin/bash, else /bin/sh]
    #[arg(trailing_var_arg = true, value_name = "CMD")]
    command: Vec<String>,
}

/// What the sandbox of one job looks like: the flags `exec` and `shell` share.
#[derive(clap::Args)]
pub struct JobArgs {
    /// Rootfs name from `azp-sandbox rootfs list`, or auto: the newest CUDA the host
    /// driver supports
    #[arg(help_heading = "Sandbox", long)]
    rootfs: String,
    /// Read-only dataset: HOST:CONTAINER[:ENVVAR] (ENVVAR is set to CONTAINER)
    #[arg(help_heading = "Sandbox", long = "volume", value_name = "HOST:CTR[:ENV]")]
    volumes: Vec<Volume>,
    /// Environment variable for the command
    #[arg(help_heading = "Sandbox", long = "env", short = 'e', value_name = "K=V")]
    env: Vec<EnvVar>,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    network: NetworkArgs,
    /// GPUs for the job: all, none, or a comma list of indexes or UUIDs (as
    /// NVIDIA_VISIBLE_DEVICES), or CDI names like nvidia.com/gpu=0
    #[arg(help_heading = "GPUs", long, default_value = "none", value_parser = checked::<GpuRequest>)]
    gpus: String,
    /// Driver capabilities to inject: compute,utility,video,graphics,display or all
    #[arg(help_heading = "GPUs", long, default_value = "compute,utility", value_parser = checked::<Capabilities>)]
    gpu_capabilities: String,
    /// Use this CDI spec for the GPUs instead of native discovery
    #[arg(help_heading = "GPUs", long)]
    cdi_spec: Option<PathBuf>,
    /// Job name (container id, cgroup leaf, hostname) [default: exec-<random>]
    #[arg(help_heading = "Sandbox", long, value_parser = parse_job_name)]
    name: Option<String>,
    /// Working directory inside the sandbox
    #[arg(help_heading = "Sandbox", long, short = 'w', default_value = "/")]
    workdir: PathBuf,
    /// Run as UID[:GID] inside the sandbox (numeric; default 0:0)
    #[arg(help_heading = "Sandbox", long, short = 'u', value_parser = parse_user)]
    user: Option<(u32, u32)>,
    /// auto: the job in a user namespace of its own, as host ids no account has; host:
    /// as host ids (NOT recommended: kernels < 5.19) [default: auto]
    #[arg(help_heading = "Sandbox", long, value_enum)]
    pub userns: Option<azp_sandbox::identity::Choice>,
    /// A cache: NAME:PATH[:commit]. The job sees a copy-on-write view of the cache's
    /// current snapshot at PATH; with `commit` its changes become the next snapshot
    /// after the job (see docs/caches.md)
    #[arg(long = "cache", value_name = "NAME:PATH[:commit]", value_parser = checked::<azp_sandbox::cache::CacheDecl>)]
    caches: Vec<String>,
}

impl ExecArgs {
    /// What the library runs (in setuid mode: what the privileged side is asked to run).
    pub fn request(self) -> ExecRequest {
        let terminal = self.tty || (self.command.is_empty() && std::io::stdin().is_terminal());
        self.job.request(self.command, terminal)
    }
}

impl JobArgs {
    /// The request for `command` (empty: the rootfs's shell), with a terminal or not. A
    /// job with a terminal gets our TERM (else `xterm`) unless `--env` sets one.
    pub fn request(mut self, command: Vec<String>, terminal: bool) -> ExecRequest {
        if terminal && !self.env.iter().any(|e| e.key == "TERM") {
            let term = std::env::var("TERM").ok().filter(|t| !t.is_empty()).unwrap_or_else(|| "xterm".into());
            self.env.push(EnvVar { key: "TERM".into(), value: term });
        }
        ExecRequest {
            rootfs: self.rootfs,
            volumes: self.volumes,
            env: self.env.into_iter().map(|e| (e.key, e.value)).collect(),
            limits: self.limits.ask(),
            network: self.network.network.unwrap_or_default(),
            network_allow: self.network.network_allow,
            ipv6: self.network.ipv6.unwrap_or_default(),
            gpus: self.gpus,
            gpu_capabilities: self.gpu_capabilities,
            cdi_spec: self.cdi_spec,
            name: self.name,
            workdir: self.workdir,
            user: self.user,
            command,
            terminal,
            caches: self.caches,
            host_loopback_proxy: true,
        }
    }
}

impl Verb for ExecArgs {
    fn needs(&self) -> Needs {
        Needs::Sandboxes
    }

    /// The job's own exit code.
    fn run(self: Box<Self>, ctx: &Context) -> Result<i32> {
        let userns = self.job.userns;
        run_job(ctx, userns, self.request())
    }
}

/// One job of `exec` or `shell`: its ids chosen, run, logged; its exit code.
pub fn run_job(ctx: &Context, userns: Option<azp_sandbox::identity::Choice>, request: ExecRequest) -> Result<i32> {
    azp_sandbox::identity::init(userns.unwrap_or_default())?;
    let outcome = azp_sandbox::sandbox::exec::run(&ctx.home, &ctx.driver_root, &request)?;
    tracing::debug!(
        "job {} rootfs={} exit={} duration={:.3}s limits: {}{} cleanup: {}",
        outcome.id,
        request.rootfs,
        outcome.code,
        outcome.duration.as_secs_f64(),
        outcome.limits,
        azp_sandbox::sandbox::limits::disk_note(outcome.disk.as_ref()),
        outcome.cleanup
    );
    Ok(outcome.code)
}

#[cfg(test)]
mod tests {
    use super::super::{Cli, Command};
    use clap::Parser;
    use std::path::Path;

    fn request(args: &[&str]) -> azp_sandbox::sandbox::exec::ExecRequest {
        // (No terminal here: stdin of the test binary is not one, or is ignored: -t says.)
        match Cli::try_parse_from([&["azp-sandbox", "exec"], args].concat()).unwrap().command {
            Command::Exec(a) => a.request(),
            _ => unreachable!(),
        }
    }

    #[test]
    fn flags_make_the_request() {
        let r = request(&[
            "--rootfs=r",
            "-e",
            "A=1=2",
            "--volume=/d:/data:DATA",
            "--memory=2G",
            "--pids=5",
            "--cpus=2",
            "--network=none",
            "--network-allow=169.254.169.254:80",
            "--gpus=0,1",
            "--name=job-1",
            "-w",
            "/tmp",
            "-u",
            "1000:100",
            "--",
            "sh",
            "-c",
            "x",
        ]);
        assert_eq!(r.rootfs, "r");
        assert_eq!(r.env, vec![("A".to_string(), "1=2".to_string())]);
        assert_eq!(r.volumes[0].env.as_deref(), Some("DATA"));
        use azp_sandbox::sandbox::Ask;
        assert_eq!(
            (r.limits.memory, r.limits.pids, r.limits.cpus_milli),
            (Ask::Value(2 << 30), Ask::Value(5), Ask::Value(2000))
        );
        assert_eq!(r.network, azp_sandbox::config::Network::None);
        assert_eq!(r.network_allow[0].to_string(), "169.254.169.254:80");
        assert_eq!((r.gpus.as_str(), r.gpu_capabilities.as_str()), ("0,1", "compute,utility"));
        assert_eq!(
            (r.name.as_deref(), r.workdir.as_path(), r.user),
            (Some("job-1"), Path::new("/tmp"), Some((1000, 100)))
        );
        assert_eq!(r.command, ["sh", "-c", "x"]);
        assert!(!r.terminal);
        let r = request(&["--rootfs=auto", "true"]);
        assert_eq!((r.gpus.as_str(), r.workdir.as_path(), r.user, r.name), ("none", Path::new("/"), None, None));
        assert_eq!(r.limits, Default::default(), "no flag: every limit is the node's default");
        let r = request(&["--rootfs=r", "--memory=unlimited", "--disk=50G", "--tmp-size=1G", "--shm-size=512M", "x"]);
        assert_eq!((r.limits.memory, r.limits.disk), (Ask::Unlimited, Ask::Value(50 << 30)));
        assert_eq!((r.limits.tmp_size, r.limits.shm_size), (Some(1 << 30), Some(512 << 20)));
        let r = request(&["--rootfs=r", "-t", "-e", "TERM=vt100", "--", "top"]);
        assert!(r.terminal);
        assert_eq!(r.env, [("TERM".to_string(), "vt100".to_string())], "--env wins over ours");
        let r = request(&["--rootfs=r", "--tty", "top"]);
        assert!(r.terminal && r.env.iter().any(|(k, _)| k == "TERM"), "a terminal gets a TERM");
        // No command: the rootfs's shell (the library picks it from the rootfs).
        let r = request(&["--rootfs=r"]);
        assert!(r.command.is_empty());
        assert_eq!(r.network, azp_sandbox::config::Network::Isolated, "a network of its own by default");
        let e = Cli::try_parse_from(["azp-sandbox", "exec", "--rootfs=r", "--network=bridge", "true"]).err().unwrap();
        assert!(e.to_string().contains("invalid value 'bridge' for '--network <MODE>'"), "{e}");
        let e = Cli::try_parse_from(["azp-sandbox", "exec", "--rootfs=r", "--network-allow=x", "true"]).err().unwrap();
        assert!(e.to_string().contains("bad --network-allow entry 'x'"), "{e}");
    }
}
