//! `--gpus` parsing, resolution against the discovered GPUs, and per-slot splits.

use super::{Driver, GpuInfo};
use anyhow::{bail, Result};
use std::fmt;

/// What a job asked for (`--gpus`), with `NVIDIA_VISIBLE_DEVICES` vocabulary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuRequest {
    /// `none`, `void` or empty: no GPU, no driver files, no driver needed. (Unlike
    /// nvidia-container-runtime's `none`, which still mounts the driver libraries.)
    None,
    All,
    /// Indexes, GPU UUIDs and/or MIG device UUIDs.
    List(Vec<GpuId>),
    /// Fully-qualified CDI names (`nvidia.com/gpu=0`); bare names allowed with --cdi-spec.
    Cdi(Vec<String>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuId {
    Index(u32),
    Uuid(String),
    /// A MIG device: `MIG-<uuid>` as `nvidia-smi -L` lists it.
    Mig(String),
}

impl fmt::Display for GpuId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuId::Index(i) => write!(f, "{i}"),
            GpuId::Uuid(u) | GpuId::Mig(u) => f.write_str(u),
        }
    }
}

impl GpuRequest {
    /// Parses `all | none | void | LIST`; LIST items are indexes, `GPU-...` UUIDs,
    /// `MIG-...` UUIDs, or CDI names containing `=` (then all items must be CDI names).
    pub fn parse(s: &str) -> Result<GpuRequest> {
        let t = s.trim();
        match t.to_ascii_lowercase().as_str() {
            "" | "none" | "void" => return Ok(GpuRequest::None),
            "all" => return Ok(GpuRequest::All),
            _ => {}
        }
        let items: Vec<&str> = t.split(',').map(str::trim).filter(|i| !i.is_empty()).collect();
        if items.iter().any(|i| i.contains('=')) {
            if let Some(bad) = items.iter().find(|i| !i.contains('=')) {
                bail!("malformed --gpus '{s}': '{bad}' mixes a plain GPU id with CDI names; write every item as vendor.com/class=name");
            }
            return Ok(GpuRequest::Cdi(items.iter().map(|i| i.to_string()).collect()));
        }
        let mut ids = Vec::new();
        for i in items {
            if let Ok(n) = i.parse::<u32>() {
                ids.push(GpuId::Index(n));
            } else if i.len() > 4 && i[..4].eq_ignore_ascii_case("GPU-") {
                ids.push(GpuId::Uuid(i.to_string()));
            } else if i.len() > 4 && i[..4].eq_ignore_ascii_case("MIG-") {
                ids.push(GpuId::Mig(i.to_string()));
            } else if i.contains(':') {
                bail!("--gpus '{i}': give a MIG device by its MIG-<uuid> (see nvidia-smi -L), not GPU:INDEX");
            } else {
                bail!("malformed --gpus '{s}': '{i}' is not an index or a GPU UUID; expected all, none, or a comma list like 0,1 or GPU-<uuid>");
            }
        }
        Ok(GpuRequest::List(ids))
    }

    pub fn is_none(&self) -> bool {
        matches!(self, GpuRequest::None)
    }

    /// Device names for the CDI path: CDI names as given; `all` / ids as bare names.
    pub fn cdi_names(&self) -> Vec<String> {
        match self {
            GpuRequest::None => Vec::new(),
            GpuRequest::All => vec!["all".into()],
            GpuRequest::List(ids) => ids.iter().map(|i| i.to_string()).collect(),
            GpuRequest::Cdi(n) => n.clone(),
        }
    }
}

impl std::str::FromStr for GpuRequest {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        GpuRequest::parse(s)
    }
}

/// The GPUs `request` means on this host, ordered by index. Fails with the driver's
/// "no NVIDIA driver found" reason when there are none.
pub fn select(driver: &Driver, request: &GpuRequest) -> Result<Vec<GpuInfo>> {
    if request.is_none() {
        return Ok(Vec::new());
    }
    if let Some(reason) = driver.unavailable_reason() {
        bail!("{reason}");
    }
    select_among(&driver.gpus, &driver.mig_devices, request)
}

/// Same as [`select`] on a plain list of whole GPUs.
pub fn select_from(gpus: &[GpuInfo], request: &GpuRequest) -> Result<Vec<GpuInfo>> {
    select_among(gpus, &[], request)
}

/// [`select`] among whole GPUs and MIG devices (`all` and indexes mean whole GPUs).
pub fn select_among(gpus: &[GpuInfo], mig: &[GpuInfo], request: &GpuRequest) -> Result<Vec<GpuInfo>> {
    let mut out: Vec<GpuInfo> = match request {
        GpuRequest::None => return Ok(Vec::new()),
        GpuRequest::Cdi(_) => {
            bail!("CDI device names are resolved from CDI specs, not from the native GPU list")
        }
        GpuRequest::All => {
            if gpus.is_empty() {
                bail!("--gpus all: this host has no NVIDIA GPU; use --gpus none");
            }
            gpus.to_vec()
        }
        GpuRequest::List(ids) => {
            let mut v = Vec::new();
            for id in ids {
                let same_uuid = |g: &&GpuInfo, u: &str| g.uuid.as_deref().is_some_and(|x| x.eq_ignore_ascii_case(u));
                let found = match id {
                    GpuId::Index(i) => gpus.iter().find(|g| g.index == *i),
                    GpuId::Uuid(u) => gpus.iter().find(|g| same_uuid(g, u)),
                    GpuId::Mig(u) => mig.iter().find(|g| same_uuid(g, u)),
                };
                match found {
                    Some(g) if !v.contains(g) => v.push(g.clone()),
                    Some(_) => {}
                    None => bail!("--gpus: no GPU '{id}' on this host; available: {}", available(gpus, mig)),
                }
            }
            v
        }
    };
    out.sort_by_key(|g| g.index);
    Ok(out)
}

fn available(gpus: &[GpuInfo], mig: &[GpuInfo]) -> String {
    if gpus.is_empty() {
        return "none".into();
    }
    gpus.iter()
        .map(|g| match &g.uuid {
            Some(u) => format!("{} ({u})", g.index),
            None => format!("{} (/dev/nvidia{}, UUID unknown without NVML)", g.index, g.minor),
        })
        .chain(mig.iter().filter_map(|m| Some(format!("{} (of GPU {})", m.uuid.as_deref()?, m.index))))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `--gpus-per-agent N|all|none`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PerAgent {
    /// N GPUs of its own per agent.
    Count(usize),
    /// Every agent sees every GPU (shared).
    All,
    None,
}

impl Default for PerAgent {
    /// One GPU per agent.
    fn default() -> Self {
        PerAgent::Count(1)
    }
}

impl std::str::FromStr for PerAgent {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "all" => Ok(PerAgent::All),
            "none" | "0" => Ok(PerAgent::None),
            n => match n.parse::<usize>() {
                Ok(n) => Ok(PerAgent::Count(n)),
                Err(_) => bail!("malformed --gpus-per-agent '{s}': expected a number, all or none"),
            },
        }
    }
}

/// The default number of agents: one per GPU (one agent when the host has none).
pub fn default_agents(gpus: &[GpuInfo]) -> usize {
    gpus.len().max(1)
}

/// Splits `gpus` (sorted by index) among `agents` slots: contiguous groups of N, the
/// same full list for `All`, nothing for `None`. Impossible splits are errors.
pub fn split(gpus: &[GpuInfo], agents: usize, per_agent: PerAgent) -> Result<Vec<Vec<GpuInfo>>> {
    if agents == 0 {
        bail!("cannot split GPUs among 0 agents: give at least one agent");
    }
    let mut sorted = gpus.to_vec();
    sorted.sort_by_key(|g| g.index);
    match per_agent {
        PerAgent::None | PerAgent::Count(0) => Ok(vec![Vec::new(); agents]),
        PerAgent::All => {
            if sorted.is_empty() {
                bail!("--gpus-per-agent all: this host has no NVIDIA GPU; use --gpus-per-agent none");
            }
            Ok(vec![sorted; agents])
        }
        PerAgent::Count(n) => {
            let need = agents.saturating_mul(n);
            if need > sorted.len() {
                bail!(
                    "cannot give {agents} agent{} {n} GPU{} each: this host has {} GPU{}; lower the agent count or --gpus-per-agent",
                    plural(agents),
                    plural(n),
                    sorted.len(),
                    plural(sorted.len())
                );
            }
            Ok(sorted.chunks(n).take(agents).map(<[GpuInfo]>::to_vec).collect())
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::nvml::FakeInventory;

    fn gpus(n: u32) -> Vec<GpuInfo> {
        FakeInventory::with_gpus("550.54.15", n).gpus
    }

    #[test]
    fn parse_requests() {
        assert_eq!(GpuRequest::parse("none").unwrap(), GpuRequest::None);
        assert_eq!(GpuRequest::parse("void").unwrap(), GpuRequest::None);
        assert_eq!(GpuRequest::parse("").unwrap(), GpuRequest::None);
        assert_eq!(GpuRequest::parse("ALL").unwrap(), GpuRequest::All);
        assert_eq!(
            GpuRequest::parse("1, GPU-abc").unwrap(),
            GpuRequest::List(vec![GpuId::Index(1), GpuId::Uuid("GPU-abc".into())])
        );
        assert_eq!(
            GpuRequest::parse("nvidia.com/gpu=0,nvidia.com/gpu=all").unwrap(),
            GpuRequest::Cdi(vec!["nvidia.com/gpu=0".into(), "nvidia.com/gpu=all".into()])
        );
        assert!(GpuRequest::parse("0,nvidia.com/gpu=1").unwrap_err().to_string().contains("mixes"));
        assert_eq!(GpuRequest::parse("MIG-1234").unwrap(), GpuRequest::List(vec![GpuId::Mig("MIG-1234".into())]));
        assert!(GpuRequest::parse("0:1").unwrap_err().to_string().contains("MIG-<uuid>"));
        assert!(GpuRequest::parse("first").unwrap_err().to_string().contains("not an index"));
    }

    #[test]
    fn select_by_index_and_uuid() {
        let g = gpus(4);
        let s = select_from(&g, &GpuRequest::parse("2,GPU-00000000-0000-0000-0000-000000000000,2").unwrap()).unwrap();
        assert_eq!(s.iter().map(|g| g.index).collect::<Vec<_>>(), vec![0, 2]);
        assert_eq!(select_from(&g, &GpuRequest::All).unwrap().len(), 4);
        let e = select_from(&g, &GpuRequest::parse("7").unwrap()).unwrap_err().to_string();
        assert!(e.contains("no GPU '7'") && e.contains("available: 0 (GPU-"), "{e}");
        let e = select_from(&g, &GpuRequest::parse("GPU-deadbeef").unwrap()).unwrap_err().to_string();
        assert!(e.contains("GPU-deadbeef"), "{e}");
        assert!(select_from(&[], &GpuRequest::All).is_err());
        assert!(select_from(&[], &GpuRequest::None).unwrap().is_empty());
    }

    #[test]
    fn mig_devices_by_uuid_whole_gpus_by_index() {
        let inv = FakeInventory::with_gpus("550.54.15", 2).with_mig(1, &[(1, 0), (2, 0)]);
        let mig = &inv.mig;
        let req = GpuRequest::parse(mig[1].uuid.as_deref().unwrap()).unwrap();
        let s = select_among(&inv.gpus, mig, &req).unwrap();
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].index, s[0].minor, s[0].mig), (1, 1, Some(crate::gpu::MigInstance { gi: 2, ci: 0 })));
        // `all` and indexes are whole GPUs, never their MIG devices.
        assert!(select_among(&inv.gpus, mig, &GpuRequest::All).unwrap().iter().all(|g| g.mig.is_none()));
        assert!(select_among(&inv.gpus, mig, &GpuRequest::parse("1").unwrap()).unwrap()[0].mig.is_none());
        // A GPU UUID does not match a MIG device, nor a MIG UUID a GPU.
        let e = select_among(&inv.gpus, mig, &GpuRequest::parse("MIG-nope").unwrap()).unwrap_err().to_string();
        assert!(
            e.contains("no GPU 'MIG-nope'") && e.contains("MIG-00000000-0000-0000-0000-000100020000 (of GPU 1)"),
            "{e}"
        );
        assert!(select_from(&inv.gpus, &req).is_err(), "no MIG list, no MIG device");
    }

    #[test]
    fn splits() {
        let g = gpus(4);
        let idx =
            |v: &Vec<Vec<GpuInfo>>| v.iter().map(|s| s.iter().map(|g| g.index).collect()).collect::<Vec<Vec<u32>>>();
        assert_eq!(idx(&split(&g, 4, PerAgent::default()).unwrap()), vec![vec![0], vec![1], vec![2], vec![3]]);
        assert_eq!(idx(&split(&g, 2, PerAgent::Count(2)).unwrap()), vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(idx(&split(&g, 1, PerAgent::Count(3)).unwrap()), vec![vec![0, 1, 2]]);
        assert_eq!(idx(&split(&g, 3, PerAgent::None).unwrap()), vec![Vec::<u32>::new(); 3]);
        assert_eq!(split(&g, 2, PerAgent::All).unwrap()[1].len(), 4);
        assert_eq!(
            split(&g, 3, PerAgent::Count(2)).unwrap_err().to_string(),
            "cannot give 3 agents 2 GPUs each: this host has 4 GPUs; lower the agent count or --gpus-per-agent"
        );
        assert!(split(&g, 0, PerAgent::Count(1)).is_err());
        assert!(split(&[], 1, PerAgent::All).is_err());
        assert_eq!(default_agents(&g), 4);
        assert_eq!(default_agents(&[]), 1);
        assert_eq!("2".parse::<PerAgent>().unwrap(), PerAgent::Count(2));
        assert_eq!("all".parse::<PerAgent>().unwrap(), PerAgent::All);
        assert_eq!("none".parse::<PerAgent>().unwrap(), PerAgent::None);
        assert!("two".parse::<PerAgent>().is_err());
    }
}
