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
    ["/bin/sh", "-c", script, "azp-configure", job.url, job.pool, job.agent_name, WORK_DIR]
        .iter()
        .map(|s| s.to_string())
        .collect()
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
/// are case-sensitive): see the capabilities table in docs/agent-runner.md.
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

/// Tools the real agent looks for on PATH, as (capability, program).
const TOOLS: &[(&str, &str)] = &[
    ("sh", "sh"),
    ("git", "git"),
    ("make", "make"),
    ("cmake", "cmake"),
    ("curl", "curl"),
    ("clang", "clang"),
    ("docker", "docker"),
    ("java", "java"),
    ("node.js", "node"),
    ("npm", "npm"),
    ("python", "python"),
    ("python3", "python3"),
];

/// The system capabilities a slot's listener will advertise, for matching the queue's
/// demands before the agent exists: its whole environment as the sandbox builds it
/// (PATH/HOME, GPU and dataset variables, [`agent_env`], [`capability_env`]), the
/// agent's own `Agent.*` entries, and the tools of [`TOOLS`] found in the rootfs on PATH.
/// The listener drops TERM, SHLVL, LS_COLORS and values of 1024+ characters; so do we.
pub fn advertised_capabilities(
    plan: &crate::sandbox::JobPlan,
    agent_name: &str,
    agent_version: &str,
    rootfs: &std::path::Path,
) -> std::collections::BTreeMap<String, String> {
    let mut caps = std::collections::BTreeMap::new();
    let mut path = String::new();
    for kv in crate::sandbox::spec::environment(plan) {
        let Some((k, v)) = kv.split_once('=') else { continue };
        if k == "PATH" {
            path = v.to_string();
        }
        if ["TERM", "SHLVL", "LS_COLORS"].contains(&k) || k.starts_with("VSTS_AGENT_INPUT_") || v.len() >= 1024 {
            continue;
        }
        caps.insert(k.to_string(), v.to_string());
    }
    for (cap, prog) in TOOLS {
        let found = path
            .split(':')
            .filter(|d| d.starts_with('/'))
            .map(|d| format!("{d}/{prog}"))
            .find(|p| std::fs::symlink_metadata(rootfs.join(p.trim_start_matches('/'))).is_ok());
        if let Some(p) = found {
            caps.insert(cap.to_string(), p);
        }
    }
    caps.insert("Agent.Name".into(), agent_name.into());
    caps.insert("Agent.Version".into(), agent_version.into());
    caps.insert("Agent.OS".into(), "Linux".into());
    caps.insert("Agent.HomeDirectory".into(), AGENT_DIR.into());
    caps
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
    fn advertised_capabilities_are_the_listener_environment() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("bin")).unwrap();
        std::fs::write(root.path().join("bin/sh"), "").unwrap();
        let job = AgentJob { url: "u", pool: "p", agent_name: "h-0", as_root: true };
        let f = SlotFacts { slot: 0, rootfs: "bb".into(), rootfs_cuda: Some("12.4".into()), ..Default::default() };
        let plan = crate::sandbox::JobPlan {
            id: "h-0-1".into(),
            lower: vec![],
            args: vec![],
            env: [agent_env(&job), capability_env(&f)].concat(),
            cwd: agent_dir(),
            uid: 0,
            gid: 0,
            hostname: "h-0".into(),
            volumes: vec!["/data:/datasets/d:DATASET".parse().unwrap()],
            limits: Default::default(),
            network: crate::config::Network::Host,
            net: Default::default(),
            edits: Default::default(),
            cgroup_path: PathBuf::new(),
            owned_dirs: vec![],
            rootless: false,
            process: Default::default(),
            userns: None,
            scratch: None,
            caches: vec![],
        };
        let caps = advertised_capabilities(&plan, "h-0", "4.252.0", root.path());
        for (k, v) in [
            ("cuda_version", "12.4"),
            ("azp_sandbox_rootfs", "bb"),
            ("DATASET", "/datasets/d"),
            ("AGENT_ALLOW_RUNASROOT", "1"),
            ("HOME", "/root"),
            ("sh", "/bin/sh"),
            ("Agent.Version", "4.252.0"),
        ] {
            assert_eq!(caps.get(k).map(String::as_str), Some(v), "{k}: {caps:?}");
        }
        assert!(!caps.contains_key("git"), "{caps:?}");
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
