//! What a device provider (the GPU module, a CDI spec) wants changed in a sandbox.
//!
//! This mirrors CDI's `containerEdits` so that NVIDIA discovery and CDI files feed the
//! sandbox through one path. The sandbox spec builder is the only consumer.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerEdits {
    /// `KEY=VALUE` pairs added to the job's environment.
    pub env: Vec<(String, String)>,
    pub device_nodes: Vec<DeviceNode>,
    pub mounts: Vec<BindMount>,
    /// Symlinks created inside the job's writable layer before start
    /// (e.g. `libcuda.so.1 -> libcuda.so.550.54.15`). `(link path in container, target)`.
    pub symlinks: Vec<(PathBuf, PathBuf)>,
    /// OCI hooks (CDI `hooks`), applied as given.
    pub hooks: Vec<Hook>,
    /// Refresh the dynamic linker cache inside the sandbox after the mounts are in place.
    pub update_ldcache: bool,
    /// Directories (container paths) the dynamic linker must search, written as an
    /// `ld.so.conf.d` entry before the cache is refreshed.
    pub ld_library_dirs: Vec<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceKind {
    Char,
    Block,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceNode {
    /// Path inside the sandbox, e.g. `/dev/nvidia0`.
    pub path: PathBuf,
    /// Host node it corresponds to (majors/minors were read from it).
    pub host_path: PathBuf,
    pub kind: DeviceKind,
    pub major: i64,
    pub minor: i64,
    /// Permission bits of the node inside the sandbox (e.g. 0o666).
    pub file_mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// cgroup device access string: some of `r`, `w`, `m`.
    pub access: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindMount {
    pub host_path: PathBuf,
    pub container_path: PathBuf,
    /// Mount options as in an OCI spec (`ro`, `nosuid`, `nodev`, `rbind`, ...).
    pub options: Vec<String>,
    /// When true, a missing or unmountable source is skipped instead of failing the job
    /// (sockets, firmware, MIG capability files).
    pub optional: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HookStage {
    CreateRuntime,
    CreateContainer,
    StartContainer,
    Poststart,
    Poststop,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hook {
    pub stage: HookStage,
    pub path: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<String>,
    pub timeout: Option<i64>,
}

impl ContainerEdits {
    /// Appends `other` to `self` (later edits win for env keys at apply time).
    pub fn merge(&mut self, other: ContainerEdits) {
        self.env.extend(other.env);
        self.device_nodes.extend(other.device_nodes);
        self.mounts.extend(other.mounts);
        self.symlinks.extend(other.symlinks);
        self.hooks.extend(other.hooks);
        self.update_ldcache |= other.update_ldcache;
        self.ld_library_dirs.extend(other.ld_library_dirs);
    }

    pub fn is_empty(&self) -> bool {
        *self == ContainerEdits::default()
    }
}
