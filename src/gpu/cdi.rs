//! Container Device Interface specs (cdiVersion 0.3.0 to 1.1.x, JSON or YAML) ->
//! [`ContainerEdits`].
//!
//! Every device node is checked against the host node before use: a spec generated
//! before a driver/kernel update carries a stale `nvidia-uvm` major and CUDA would fail
//! inside the job (`cuInit`) while nvidia-smi works. The `nvidia-cdi-hook` /
//! `nvidia-ctk hook` hooks `create-symlinks` and `update-ldcache` are translated into
//! native edits (symlinks, `update_ldcache`), so the NVIDIA Container Toolkit does not
//! have to be installed; other hooks are passed through as OCI hooks.

use super::devices::stat_node;
use super::DiscoverOptions;
use crate::edits::{BindMount, ContainerEdits, DeviceKind, DeviceNode, Hook, HookStage};
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Kind assumed for bare device names (`0`, `all`, `GPU-...`).
pub const DEFAULT_KIND: &str = "nvidia.com/gpu";
/// Spec dirs in increasing priority (a later dir overrides an earlier one).
pub const SPEC_DIRS: &[&str] = &["/etc/cdi", "/var/run/cdi"];

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    #[serde(default)]
    pub devices: Vec<SpecDevice>,
    #[serde(default)]
    pub container_edits: SpecEdits,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecDevice {
    pub name: String,
    #[serde(default)]
    pub container_edits: SpecEdits,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecEdits {
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub device_nodes: Vec<SpecNode>,
    #[serde(default)]
    pub mounts: Vec<SpecMount>,
    #[serde(default)]
    pub hooks: Vec<SpecHook>,
    #[serde(default)]
    pub additional_gids: Vec<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecNode {
    pub path: PathBuf,
    pub host_path: Option<PathBuf>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub major: Option<i64>,
    pub minor: Option<i64>,
    pub file_mode: Option<u32>,
    pub permissions: Option<String>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecMount {
    pub host_path: PathBuf,
    pub container_path: PathBuf,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub options: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecHook {
    pub hook_name: String,
    pub path: PathBuf,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: Vec<String>,
    pub timeout: Option<i64>,
}

#[derive(Debug, Clone)]
pub struct SpecFile {
    pub file: PathBuf,
    pub spec: Spec,
}

impl SpecFile {
    pub fn load(file: &Path) -> Result<SpecFile> {
        let text = std::fs::read_to_string(file).with_context(|| format!("cannot read CDI spec {}", file.display()))?;
        let ext = file.extension().and_then(|e| e.to_str()).unwrap_or("");
        let spec: Spec = if ext == "json" {
            serde_json::from_str(&text).map_err(|e| anyhow!("CDI spec {} is not valid JSON: {e}", file.display()))?
        } else {
            // YAML is a superset of JSON: covers .yaml, .yml and extension-less files.
            serde_yaml::from_str(&text)
                .map_err(|e| anyhow!("CDI spec {} is not valid YAML/JSON: {e}", file.display()))?
        };
        check_version(&spec.cdi_version).with_context(|| format!("CDI spec {}", file.display()))?;
        if !spec.kind.contains('/') {
            bail!("CDI spec {}: kind '{}' is not vendor.com/class", file.display(), spec.kind);
        }
        Ok(SpecFile { file: file.to_path_buf(), spec })
    }
}

fn check_version(v: &str) -> Result<()> {
    let nums: Vec<u32> = v.trim_start_matches('v').split('.').map(|p| p.parse().unwrap_or(u32::MAX)).collect();
    let ok = match nums.as_slice() {
        [0, minor, _] => (3..=8).contains(minor),
        [1, minor, _] => *minor <= 1,
        _ => false,
    };
    if !ok {
        bail!("unsupported cdiVersion '{v}': supported are 0.3.0 to 1.1.x");
    }
    Ok(())
}

/// The CDI specs a job can use.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    /// In increasing priority.
    pub specs: Vec<SpecFile>,
    /// Loaded from `--cdi-spec`: every GPU request then goes through CDI.
    pub explicit: bool,
    /// Spec files in the dirs that could not be used (reported, not fatal).
    pub errors: Vec<String>,
}

impl Registry {
    /// `--cdi-spec FILE` when given (errors are fatal), else the spec dirs under the
    /// driver root (bad files are recorded in `errors`).
    pub fn load(opts: &DiscoverOptions) -> Result<Registry> {
        if let Some(f) = &opts.cdi_spec {
            return Ok(Registry { specs: vec![SpecFile::load(f)?], explicit: true, errors: Vec::new() });
        }
        let dirs: Vec<PathBuf> =
            SPEC_DIRS.iter().map(|d| super::paths::host_path(&opts.driver_root, Path::new(d))).collect();
        Ok(Registry::from_dirs(&dirs))
    }

    pub fn from_dirs(dirs: &[PathBuf]) -> Registry {
        let mut r = Registry::default();
        for d in dirs {
            let Ok(rd) = std::fs::read_dir(d) else {
                continue;
            };
            let mut files: Vec<PathBuf> = rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("json" | "yaml" | "yml")))
                .collect();
            files.sort();
            for f in files {
                match SpecFile::load(&f) {
                    Ok(s) => r.specs.push(s),
                    Err(e) => r.errors.push(format!("{e:#}")),
                }
            }
        }
        r
    }

    /// Fully-qualified names of every device (`nvidia.com/gpu=0`).
    pub fn device_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .specs
            .iter()
            .flat_map(|s| s.spec.devices.iter().map(move |d| format!("{}={}", s.spec.kind, d.name)))
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// `nvidia.com/gpu=0` or a bare `0` (kind [`DEFAULT_KIND`]).
    pub fn resolve(&self, name: &str) -> Result<(&SpecFile, &SpecDevice)> {
        let (kind, dev) = name.split_once('=').unwrap_or((DEFAULT_KIND, name));
        self.specs
            .iter()
            .rev()
            .filter(|s| s.spec.kind == kind)
            .find_map(|s| s.spec.devices.iter().find(|d| d.name == dev).map(|d| (s, d)))
            .ok_or_else(|| {
                let known = self.device_names();
                anyhow!(
                    "unknown CDI device '{kind}={dev}'; available: {}",
                    if known.is_empty() { "none (no CDI specs loaded)".to_string() } else { known.join(", ") }
                )
            })
    }
}

/// Edits for the named devices: each spec's top-level edits once, then each device's.
/// Fails when any device node no longer matches the host.
pub fn edits(reg: &Registry, names: &[String]) -> Result<ContainerEdits> {
    if names.is_empty() {
        bail!("no CDI device requested");
    }
    let mut out = ContainerEdits::default();
    let mut specs_applied: Vec<&Path> = Vec::new();
    for name in names {
        let (sf, dev) = reg.resolve(name)?;
        if !specs_applied.contains(&sf.file.as_path()) {
            specs_applied.push(&sf.file);
            out.merge(convert(&sf.file, &sf.spec.container_edits)?);
        }
        out.merge(convert(&sf.file, &dev.container_edits)?);
    }
    // The same node or mount reached through two devices: keep the first.
    let mut seen = Vec::new();
    out.device_nodes.retain(|n| {
        let new = !seen.contains(&n.path);
        seen.push(n.path.clone());
        new
    });
    let mut seen = Vec::new();
    out.mounts.retain(|m| {
        let new = !seen.contains(&m.container_path);
        seen.push(m.container_path.clone());
        new
    });
    out.ld_library_dirs.dedup();
    Ok(out)
}

/// One `containerEdits` block -> our edits, with the host-node check.
pub fn convert(file: &Path, e: &SpecEdits) -> Result<ContainerEdits> {
    let mut out = ContainerEdits::default();
    for kv in &e.env {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow!("CDI spec {}: env entry '{kv}' is not KEY=VALUE", file.display()))?;
        out.env.push((k.to_string(), v.to_string()));
    }
    for n in &e.device_nodes {
        out.device_nodes.push(check_node(file, n)?);
    }
    for m in &e.mounts {
        let kind = m.kind.as_deref().unwrap_or("bind");
        if kind != "bind" && kind != "rbind" {
            bail!(
                "CDI spec {}: mount {} has type '{kind}'; only bind mounts are supported",
                file.display(),
                m.container_path.display()
            );
        }
        let mut options = m.options.clone();
        if !options.iter().any(|o| o == "bind" || o == "rbind") {
            options.push("bind".into());
        }
        out.mounts.push(BindMount {
            host_path: m.host_path.clone(),
            container_path: m.container_path.clone(),
            options,
            optional: false,
        });
    }
    for h in &e.hooks {
        translate_hook(file, h, &mut out)?;
    }
    if !e.additional_gids.is_empty() {
        tracing::warn!(spec = %file.display(), gids = ?e.additional_gids, "CDI additionalGids are not applied");
    }
    Ok(out)
}

fn check_node(file: &Path, n: &SpecNode) -> Result<DeviceNode> {
    let host = n.host_path.clone().unwrap_or_else(|| n.path.clone());
    let regen = "regenerate it with `nvidia-ctk cdi generate`";
    let where_ = if host != n.path { format!(" (host node {})", host.display()) } else { String::new() };
    let actual = stat_node(Path::new("/"), &host)
        .map_err(|e| anyhow!("CDI spec {} is stale: {e}; {regen}", file.display()))?
        .ok_or_else(|| {
            anyhow!("CDI spec {} is stale: {} does not exist on the host; {regen}", file.display(), host.display())
        })?;
    let want_kind = match n.kind.as_deref() {
        None => actual.kind,
        Some("c") | Some("u") => DeviceKind::Char,
        Some("b") => DeviceKind::Block,
        Some(other) => {
            bail!("CDI spec {}: device node {} has unsupported type '{other}'", file.display(), n.path.display())
        }
    };
    if want_kind != actual.kind {
        bail!(
            "CDI spec {} is stale: {}{where_} is a {:?} device in the spec but a {:?} device on the host; {regen}",
            file.display(),
            n.path.display(),
            want_kind,
            actual.kind
        );
    }
    let (maj, min) = (n.major.unwrap_or(actual.major), n.minor.unwrap_or(actual.minor));
    if (maj, min) != (actual.major, actual.minor) {
        bail!(
            "CDI spec {} is stale: {}{where_} is {maj}:{min} in the spec but {}:{} on the host; {regen}",
            file.display(),
            n.path.display(),
            actual.major,
            actual.minor
        );
    }
    Ok(DeviceNode {
        path: n.path.clone(),
        host_path: host,
        kind: actual.kind,
        major: actual.major,
        minor: actual.minor,
        file_mode: n.file_mode.unwrap_or(actual.mode),
        uid: n.uid.unwrap_or(actual.uid),
        gid: n.gid.unwrap_or(actual.gid),
        access: n.permissions.clone().unwrap_or_else(|| "rwm".into()),
    })
}

/// `--flag value` and `--flag=value` occurrences in `args`.
fn flag_values(args: &[String], flag: &str) -> Vec<String> {
    let mut v = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == flag {
            if let Some(x) = it.next() {
                v.push(x.clone());
            }
        } else if let Some(x) = a.strip_prefix(&format!("{flag}=")) {
            v.push(x.to_string());
        }
    }
    v
}

fn translate_hook(file: &Path, h: &SpecHook, out: &mut ContainerEdits) -> Result<()> {
    let stage = match h.hook_name.as_str() {
        "prestart" | "createRuntime" => HookStage::CreateRuntime,
        "createContainer" => HookStage::CreateContainer,
        "startContainer" => HookStage::StartContainer,
        "poststart" => HookStage::Poststart,
        "poststop" => HookStage::Poststop,
        other => bail!("CDI spec {}: unknown hookName '{other}'", file.display()),
    };
    // nvidia-cdi-hook <sub> ...   or   nvidia-ctk hook <sub> ...
    let prog = Path::new(h.args.first().map(String::as_str).unwrap_or_default())
        .file_name()
        .or_else(|| h.path.file_name())
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    let sub = match prog.as_str() {
        "nvidia-cdi-hook" => h.args.get(1),
        "nvidia-ctk" if h.args.get(1).map(String::as_str) == Some("hook") => h.args.get(2),
        _ => None,
    };
    match sub.map(String::as_str) {
        Some("create-symlinks") => {
            for l in flag_values(&h.args, "--link") {
                let (target, link) = l.split_once("::").ok_or_else(|| {
                    anyhow!("CDI spec {}: create-symlinks --link '{l}' is not TARGET::LINK", file.display())
                })?;
                out.symlinks.push((PathBuf::from(link), PathBuf::from(target)));
            }
        }
        Some("update-ldcache") => {
            out.update_ldcache = true;
            out.ld_library_dirs.extend(flag_values(&h.args, "--folder").into_iter().map(PathBuf::from));
        }
        _ => out.hooks.push(Hook {
            stage,
            path: h.path.clone(),
            args: h.args.clone(),
            env: h.env.clone(),
            timeout: h.timeout,
        }),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        for ok in ["0.3.0", "0.5.0", "0.8.0", "1.0.0", "1.1.0"] {
            check_version(ok).unwrap();
        }
        for bad in ["0.2.0", "1.2.0", "2.0.0", "x"] {
            assert!(check_version(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hooks_are_translated() {
        let mut out = ContainerEdits::default();
        let h = SpecHook {
            hook_name: "createContainer".into(),
            path: "/usr/bin/nvidia-cdi-hook".into(),
            args: vec![
                "nvidia-cdi-hook".into(),
                "create-symlinks".into(),
                "--link".into(),
                "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so".into(),
                "--link=../x::/y".into(),
            ],
            ..Default::default()
        };
        translate_hook(Path::new("s.json"), &h, &mut out).unwrap();
        assert_eq!(
            out.symlinks,
            vec![
                (PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so"), PathBuf::from("libcuda.so.1")),
                (PathBuf::from("/y"), PathBuf::from("../x"))
            ]
        );
        let h = SpecHook {
            hook_name: "createContainer".into(),
            path: "/usr/bin/nvidia-ctk".into(),
            args: ["nvidia-ctk", "hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"]
                .map(String::from)
                .to_vec(),
            ..Default::default()
        };
        translate_hook(Path::new("s.json"), &h, &mut out).unwrap();
        assert!(out.update_ldcache);
        assert_eq!(out.ld_library_dirs, vec![PathBuf::from("/usr/lib/x86_64-linux-gnu")]);
        let h = SpecHook {
            hook_name: "createContainer".into(),
            path: "/usr/bin/nvidia-cdi-hook".into(),
            args: ["nvidia-cdi-hook", "chmod", "--mode", "755"].map(String::from).to_vec(),
            ..Default::default()
        };
        translate_hook(Path::new("s.json"), &h, &mut out).unwrap();
        assert_eq!(out.hooks.len(), 1);
        assert_eq!(out.hooks[0].stage, HookStage::CreateContainer);
        let bad = SpecHook { hook_name: "later".into(), ..Default::default() };
        assert!(translate_hook(Path::new("s.json"), &bad, &mut out).is_err());
    }

    #[test]
    fn node_check_against_host_dev_null() {
        let ok = SpecNode {
            path: "/dev/null".into(),
            major: Some(1),
            minor: Some(3),
            kind: Some("c".into()),
            ..Default::default()
        };
        let n = check_node(Path::new("/etc/cdi/x.yaml"), &ok).unwrap();
        assert_eq!((n.major, n.minor, n.access.as_str()), (1, 3, "rwm"));
        let stale = SpecNode { major: Some(511), minor: Some(0), ..ok.clone() };
        assert_eq!(
            check_node(Path::new("/etc/cdi/x.yaml"), &stale).unwrap_err().to_string(),
            "CDI spec /etc/cdi/x.yaml is stale: /dev/null is 511:0 in the spec but 1:3 on the host; regenerate it with `nvidia-ctk cdi generate`"
        );
        let block = SpecNode { kind: Some("b".into()), ..ok.clone() };
        assert!(check_node(Path::new("x"), &block).unwrap_err().to_string().contains("Block device in the spec"));
        let gone = SpecNode { path: "/dev/nvidia-absent-xyz".into(), ..Default::default() };
        assert!(check_node(Path::new("x"), &gone).unwrap_err().to_string().contains("does not exist"));
        // Missing major/minor are filled from the host.
        let bare = SpecNode { path: "/dev/null".into(), ..Default::default() };
        assert_eq!(check_node(Path::new("x"), &bare).unwrap().minor, 3);
    }
}
