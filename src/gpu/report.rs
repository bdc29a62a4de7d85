//! What `azp-sandbox gpu list [--json]` prints: what a sandbox would get and what is
//! missing, so a sysadmin sees why before a job fails.

use super::cdi::Registry;
use super::driver::Capabilities;
use super::inject::{self, BIN_DIR, LIB_DIR};
use super::{Driver, GpuInfo, GpuSource, Missing, NvmlStatus};
use crate::edits::DeviceKind;
use serde::Serialize;
use std::fmt;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ItemKind {
    Device,
    Library,
    Symlink,
    Binary,
    Firmware,
    Socket,
    Directory,
    /// A loader JSON file, Xorg module or configuration (`graphics`, `display`).
    File,
}

impl fmt::Display for ItemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ItemKind::Device => "device",
            ItemKind::Library => "library",
            ItemKind::Symlink => "symlink",
            ItemKind::Binary => "binary",
            ItemKind::Firmware => "firmware",
            ItemKind::Socket => "socket",
            ItemKind::Directory => "directory",
            ItemKind::File => "file",
        })
    }
}

/// One file or node a sandbox gets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Item {
    pub kind: ItemKind,
    pub container_path: PathBuf,
    /// Host path (for a symlink: its target).
    pub source: PathBuf,
    /// `c 195:0 rw-rw-rw-`, `soname libcuda.so.1 (compute), via ...`.
    pub detail: String,
    pub optional: bool,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct CdiSummary {
    pub explicit: bool,
    pub specs: Vec<PathBuf>,
    pub devices: Vec<String>,
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub driver_root: PathBuf,
    pub driver_version: Option<String>,
    pub version_source: Option<String>,
    /// `12.2`.
    pub cuda_driver_version: Option<String>,
    pub nvml: NvmlStatus,
    pub gpu_source: Option<GpuSource>,
    pub gpus: Vec<GpuInfo>,
    /// MIG devices of MIG-enabled GPUs (`--gpus MIG-<uuid>`).
    pub mig_devices: Vec<GpuInfo>,
    pub capabilities: String,
    /// Why `--gpus all` would fail right now; `None` when it would work.
    pub error: Option<String>,
    /// Host services GPU jobs need that are absent ([`super::services::warnings`]).
    pub warnings: Vec<String>,
    /// What `--gpus all` with `capabilities` gives a sandbox.
    pub items: Vec<Item>,
    pub env: Vec<(String, String)>,
    pub missing: Vec<Missing>,
    pub notes: Vec<String>,
    pub cdi: Option<CdiSummary>,
}

impl Report {
    pub fn build(driver: &Driver, caps: &Capabilities, cdi: Option<&Registry>) -> Report {
        let mut items = Vec::new();
        let dev = &driver.devices;
        for n in dev.gpus.iter().chain(dev.control_nodes()).chain(dev.gdrdrv.iter()) {
            items.push(Item {
                kind: ItemKind::Device,
                container_path: n.path.clone(),
                source: n.host_path.clone(),
                detail: format!(
                    "{} {}:{} {}",
                    if n.kind == DeviceKind::Char { "c" } else { "b" },
                    n.major,
                    n.minor,
                    mode_string(n.mode)
                ),
                optional: false,
            });
        }
        let lib_dir = Path::new(LIB_DIR);
        let libs = inject::libraries_for(driver, caps);
        for l in &libs {
            items.push(Item {
                kind: ItemKind::Library,
                container_path: lib_dir.join(&l.file_name),
                source: l.host_path.clone(),
                detail: format!("soname {} ({}), via {}", l.soname, l.group, l.found_via),
                optional: false,
            });
            if l.soname != l.file_name {
                items.push(Item {
                    kind: ItemKind::Symlink,
                    container_path: lib_dir.join(&l.soname),
                    source: PathBuf::from(&l.file_name),
                    detail: String::new(),
                    optional: false,
                });
            }
        }
        let groups = caps.groups();
        for b in driver.binaries.iter().filter(|b| groups.contains(&b.group)) {
            items.push(Item {
                kind: ItemKind::Binary,
                container_path: Path::new(BIN_DIR).join(&b.name),
                source: b.host_path.clone(),
                detail: format!("{} (found at {})", b.group, b.found_at.display()),
                optional: false,
            });
        }
        for f in inject::files_for(driver, caps, &libs) {
            let names: Vec<String> = f
                .libraries
                .iter()
                .map(|r| match &r.bind_at {
                    Some(at) => format!("{} (bound at {})", r.library, at.display()),
                    None => r.written.clone(),
                })
                .collect();
            items.push(Item {
                kind: ItemKind::File,
                container_path: f.container_path.clone(),
                source: f.host_path.clone(),
                detail: if names.is_empty() {
                    f.kind.describe().to_string()
                } else {
                    format!("names {}", names.join(", "))
                },
                optional: false,
            });
        }
        for f in &driver.firmware {
            items.push(Item {
                kind: ItemKind::Firmware,
                container_path: f.container_path.clone(),
                source: f.host_path.clone(),
                detail: String::new(),
                optional: true,
            });
        }
        for s in &driver.sockets {
            items.push(Item {
                kind: ItemKind::Socket,
                container_path: s.container_path.clone(),
                source: s.host_path.clone(),
                detail: s.name.clone(),
                optional: true,
            });
        }
        if let (true, Some(d)) = (caps.compute, &driver.mps_pipe_dir) {
            items.push(Item {
                kind: ItemKind::Directory,
                container_path: PathBuf::from(super::driver::MPS_PIPE_DIR),
                source: d.clone(),
                detail: "MPS pipe directory".into(),
                optional: true,
            });
        }

        let (error, env) = match super::select::select(driver, &super::GpuRequest::All)
            .and_then(|g| inject::edits(driver, &g, caps))
        {
            Ok(e) => (None, e.env),
            Err(e) => (Some(format!("{e:#}")), Vec::new()),
        };
        Report {
            driver_root: driver.root.clone(),
            driver_version: driver.version.clone(),
            version_source: driver.version_source.clone(),
            cuda_driver_version: driver.cuda_version.map(|(a, b)| format!("{a}.{b}")),
            nvml: driver.nvml.clone(),
            gpu_source: driver.gpu_source,
            gpus: driver.gpus.clone(),
            mig_devices: driver.mig_devices.clone(),
            capabilities: caps.to_string(),
            error,
            warnings: super::services::warnings(&driver.services, &driver.gpus, &driver.devices),
            items,
            env,
            missing: driver.missing.clone(),
            notes: driver.notes.clone(),
            cdi: cdi.map(|r| CdiSummary {
                explicit: r.explicit,
                specs: r.specs.iter().map(|s| s.file.clone()).collect(),
                devices: r.device_names(),
                errors: r.errors.clone(),
            }),
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("report serializes")
    }
}

fn mode_string(mode: u32) -> String {
    let mut s = String::new();
    for shift in [6, 3, 0] {
        let b = (mode >> shift) & 7;
        s.push(if b & 4 != 0 { 'r' } else { '-' });
        s.push(if b & 2 != 0 { 'w' } else { '-' });
        s.push(if b & 1 != 0 { 'x' } else { '-' });
    }
    s
}

fn human_bytes(b: u64) -> String {
    format!("{:.0} GiB", b as f64 / (1u64 << 30) as f64)
}

fn table(f: &mut fmt::Formatter<'_>, rows: &[Vec<String>]) -> fmt::Result {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> =
        (0..cols).map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0)).collect();
    for r in rows {
        let mut line = String::from("  ");
        for (c, cell) in r.iter().enumerate() {
            if c + 1 == r.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  ", w = widths[c]));
            }
        }
        writeln!(f, "{}", line.trim_end())?;
    }
    Ok(())
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dash = "-".to_string();
        writeln!(f, "driver root     {}", self.driver_root.display())?;
        match &self.driver_version {
            Some(v) => writeln!(f, "NVIDIA driver   {v} (from {})", self.version_source.as_deref().unwrap_or("?"))?,
            None => writeln!(f, "NVIDIA driver   not found")?,
        }
        writeln!(f, "CUDA driver     {}", self.cuda_driver_version.as_deref().unwrap_or("unknown (needs NVML)"))?;
        match (&self.nvml.loaded, &self.nvml.library_dir, &self.nvml.error) {
            (true, Some(d), _) => writeln!(f, "NVML            loaded from {}", d.display())?,
            (true, None, _) => writeln!(f, "NVML            loaded")?,
            (false, _, Some(e)) => writeln!(f, "NVML            not available: {e}")?,
            (false, _, None) => writeln!(f, "NVML            not used")?,
        }
        writeln!(f, "capabilities    {}", self.capabilities)?;
        if !self.warnings.is_empty() {
            writeln!(f)?;
            writeln!(f, "Warnings:")?;
            for w in &self.warnings {
                writeln!(f, "  {w}")?;
            }
        }
        writeln!(f)?;
        match self.gpu_source {
            None => writeln!(f, "GPUs: none")?,
            Some(src) => {
                writeln!(f, "GPUs (from {src}):")?;
                let mut rows =
                    vec![["INDEX", "NODE", "UUID", "NAME", "MEMORY", "CC", "MIG", "PCI"].map(String::from).to_vec()];
                let mut listed: Vec<&GpuInfo> = Vec::new();
                for g in &self.gpus {
                    listed.push(g);
                    listed.extend(self.mig_devices.iter().filter(|m| m.index == g.index));
                }
                for g in listed {
                    rows.push(vec![
                        match g.mig {
                            Some(m) => format!("{}:gi{}/ci{}", g.index, m.gi, m.ci),
                            None => g.index.to_string(),
                        },
                        format!("/dev/nvidia{}", g.minor),
                        g.uuid.clone().unwrap_or_else(|| dash.clone()),
                        g.name.clone(),
                        g.memory_total_bytes.map(human_bytes).unwrap_or_else(|| dash.clone()),
                        g.compute_capability.map(|(a, b)| format!("{a}.{b}")).unwrap_or_else(|| dash.clone()),
                        g.mig_enabled.map(|m| if m { "on" } else { "off" }.to_string()).unwrap_or_else(|| dash.clone()),
                        g.pci_bus_id.clone().unwrap_or_else(|| dash.clone()),
                    ]);
                }
                table(f, &rows)?;
            }
        }
        writeln!(f)?;
        match &self.error {
            Some(e) => writeln!(f, "A GPU job would fail now: {e}")?,
            None => writeln!(f, "A GPU job (--gpus all) would get:")?,
        }
        if !self.items.is_empty() {
            let mut rows = vec![["KIND", "CONTAINER PATH", "SOURCE", "DETAIL"].map(String::from).to_vec()];
            for i in &self.items {
                let src = if i.kind == ItemKind::Symlink {
                    format!("-> {}", i.source.display())
                } else {
                    i.source.display().to_string()
                };
                let detail = if i.optional {
                    format!("{} (optional)", i.detail).trim_start().to_string()
                } else {
                    i.detail.clone()
                };
                rows.push(vec![i.kind.to_string(), i.container_path.display().to_string(), src, detail]);
            }
            table(f, &rows)?;
        }
        if !self.env.is_empty() {
            writeln!(
                f,
                "  environment: {}",
                self.env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
            )?;
        }
        if !self.missing.is_empty() {
            writeln!(f)?;
            writeln!(f, "Not available:")?;
            let rows: Vec<Vec<String>> = self.missing.iter().map(|m| vec![m.item.clone(), m.why.clone()]).collect();
            table(f, &rows)?;
        }
        if !self.notes.is_empty() {
            writeln!(f)?;
            writeln!(f, "Notes:")?;
            for n in &self.notes {
                writeln!(f, "  {n}")?;
            }
        }
        if let Some(c) = &self.cdi {
            writeln!(f)?;
            if c.specs.is_empty() {
                writeln!(f, "CDI: no specs")?;
            } else {
                writeln!(
                    f,
                    "CDI specs: {}",
                    c.specs.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
                )?;
                writeln!(f, "CDI devices: {}", c.devices.join(", "))?;
            }
            for e in &c.errors {
                writeln!(f, "  CDI error: {e}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        assert_eq!(mode_string(0o666), "rw-rw-rw-");
        assert_eq!(mode_string(0o400), "r--------");
        assert_eq!(human_bytes(80 << 30), "80 GiB");
    }
}
