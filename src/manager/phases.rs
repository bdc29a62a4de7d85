//! The two phases of one agent job, as commands inside the sandbox, and the capability
//! environment that pipelines can `demands:`.
//!
//! Phase 1 registers the agent (`config.sh ... --replace`: a new RSA key per job, so a key
//! stolen by job N is useless for job N+1). The PAT reaches only that process, through its
//! standard input: never argv (visible in /proc), never a file. Phase 2 (`run.sh --once`)
//! runs in a fresh container over the same upper dir, without the PAT anywhere.

use crate::gpu::GpuInfo;
use std::path::PathBuf;

/// Where the agent package appears inside the sandbox (a lower layer, copied up on write).
pub const AGENT_DIR: &str = "/azp/agent";
/// The agent's work folder (inside the job's upper dir).
pub const WORK_DIR: &str = "_work";

pub struct AgentJob<'a> {
    pub url: &'a str,
    pub pool: &'a str,
    pub agent_name: &'a str,
    /// True when the job runs as root (the rootfs has no `azp` user).
    pub as_root: bool,
}

/// `sh -c` script of phase 1: read the PAT from stdin into VSTS_AGENT_INPUT_TOKEN (the
/// agent deletes VSTS_AGENT_INPUT_* from its own environment), then configure.
pub fn configure_args(job: &AgentJob) -> Vec<String> {
    let script = "IFS= read -r VSTS_AGENT_INPUT_TOKEN || exit 97; export VSTS_AGENT_INPUT_TOKEN; \
                  exec ./config.sh --unattended --url \"$1\" --auth pat --pool \"$2\" --agent \"$3\" \
                  --replace --acceptTeeEula --work \"$4\"";
    ["/bin/sh", "-c", script, "azp-configure", job.url, job.pool, job.agent_name, WORK_DIR].iter().map(|s| s.to_string()).collect()
}

pub fn run_args() -> Vec<String> {
    vec!["./run.sh".into(), "--once".into()]
}

/// Environment of both phases: what the agent needs, plus AGENT_ALLOW_RUNASROOT only
/// when there is no unprivileged user to run as.
pub fn agent_env(job: &AgentJob) -> Vec<(String, String)> {
    let mut env = vec![("AZP_AGENT_NAME".to_string(), job.agent_name.to_string())];
    if job.as_root {
        env.push(("AGENT_ALLOW_RUNASROOT".into(), "1".into()));
    }
    env
}

/// Capabilities advertised by a slot (every env var of the listener becomes one; names
/// are case-sensitive): see the README's table.
#[derive(Debug, Clone, Default)]
pub struct SlotFacts {
    pub slot: usize,
    pub rootfs: String,
    pub rootfs_cuda: Option<String>,
    pub driver_version: Option<String>,
    pub cuda_driver_version: Option<String>,
    pub gpus: Vec<GpuInfo>,
}

pub fn capability_env(f: &SlotFacts) -> Vec<(String, String)> {
    let mut env = vec![
        ("azp_sandbox".to_string(), env!("CARGO_PKG_VERSION").to_string()),
        ("azp_sandbox_slot".into(), f.slot.to_string()),
        ("azp_sandbox_rootfs".into(), f.rootfs.clone()),
        ("gpu_count".into(), f.gpus.len().to_string()),
    ];
    if let Some(v) = &f.rootfs_cuda {
        env.push(("cuda_version".into(), v.clone()));
    }
    if let Some(v) = &f.driver_version {
        env.push(("nvidia_driver_version".into(), v.clone()));
    }
    if let Some(v) = &f.cuda_driver_version {
        env.push(("cuda_driver_version".into(), v.clone()));
    }
    if let Some(g) = f.gpus.first() {
        if g.source == crate::gpu::GpuSource::Nvml && !g.name.is_empty() {
            env.push(("gpu_model".into(), g.name.clone()));
        }
        if let Some(m) = g.memory_total_bytes {
            env.push(("gpu_memory_mib".into(), (m >> 20).to_string()));
        }
        if let Some((a, b)) = g.compute_capability {
            env.push(("gpu_compute_capability".into(), format!("{a}.{b}")));
        }
    }
    env
}

pub fn agent_dir() -> PathBuf {
    PathBuf::from(AGENT_DIR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pat_never_in_argv() {
        let job = AgentJob { url: "https://dev.azure.com/o", pool: "gpu", agent_name: "node-0", as_root: false };
        let args = configure_args(&job);
        assert_eq!(args[0], "/bin/sh");
        assert!(args[2].contains("--replace") && args[2].contains("read -r VSTS_AGENT_INPUT_TOKEN"));
        assert_eq!(&args[4..], ["https://dev.azure.com/o", "gpu", "node-0", "_work"]);
        assert!(!agent_env(&job).iter().any(|(k, _)| k == "AGENT_ALLOW_RUNASROOT"));
        let root = AgentJob { as_root: true, ..job };
        assert!(agent_env(&root).contains(&("AGENT_ALLOW_RUNASROOT".into(), "1".into())));
    }

    #[test]
    fn capabilities() {
        let f = SlotFacts { slot: 1, rootfs: "cuda12".into(), rootfs_cuda: Some("12.4".into()), ..Default::default() };
        let env = capability_env(&f);
        assert!(env.contains(&("cuda_version".into(), "12.4".into())));
        assert!(env.contains(&("gpu_count".into(), "0".into())));
        assert!(env.contains(&("azp_sandbox_slot".into(), "1".into())));
    }
}
