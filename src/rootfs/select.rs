//! `--rootfs auto`: the imported rootfs with the newest CUDA version that the host's
//! driver supports, preferring the host's architecture.

use super::{RootfsInfo, Store};
use anyhow::{bail, Context, Result};

/// `wanted` as given (`NAME`), or the auto choice for a driver supporting CUDA `driver_cuda`.
pub fn resolve(store: &Store, wanted: &str, driver_cuda: Option<(u32, u32)>) -> Result<String> {
    if wanted != "auto" {
        return Ok(wanted.to_string());
    }
    pick_auto(&store.list()?, driver_cuda, std::env::consts::ARCH)
}

pub fn pick_auto(list: &[RootfsInfo], driver_cuda: Option<(u32, u32)>, host_arch: &str) -> Result<String> {
    let Some((dmaj, dmin)) = driver_cuda else {
        bail!("--rootfs auto needs the host's CUDA driver version from NVML, and no NVIDIA driver was found; name a rootfs with --rootfs NAME");
    };
    let mut best: Option<((bool, Vec<u32>), &str)> = None;
    for r in list {
        let Some(v) = r.cuda_version.as_deref() else { continue };
        let key: Vec<u32> = v.split('.').map(|p| p.parse().unwrap_or(0)).collect();
        // The same rule as the check before each job (gpu::compat).
        let Some(cuda) = crate::gpu::compat::parse_cuda(v) else { continue };
        if !crate::gpu::compat::cuda_supported(cuda, (dmaj, dmin)) {
            continue; // needs a newer driver
        }
        let rank = (r.arch.as_deref() == Some(host_arch), key);
        if best.as_ref().is_none_or(|(b, _)| rank > *b) {
            best = Some((rank, &r.name));
        }
    }
    best.map(|(_, n)| n.to_string()).with_context(|| {
        format!("--rootfs auto: no imported rootfs has a CUDA version <= {dmaj}.{dmin} (the driver's); import or build one (rootfs-recipes/), or name it with --rootfs NAME")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, cuda: Option<&str>, arch: &str) -> RootfsInfo {
        RootfsInfo {
            name: name.into(),
            path: "/x".into(),
            size_bytes: 0,
            entries: 0,
            source: "t".into(),
            sha256: None,
            imported_at: String::new(),
            arch: Some(arch.into()),
            cuda_version: cuda.map(str::to_string),
            id_shift: 0,
        }
    }

    #[test]
    fn newest_supported_cuda_on_the_host_arch_wins() {
        let list = vec![
            info("cpu", None, "x86_64"),
            info("c118", Some("11.8"), "x86_64"),
            info("c124", Some("12.4"), "x86_64"),
            info("c124-arm", Some("12.4"), "aarch64"),
            info("c126", Some("12.6"), "x86_64"),
            info("c1210", Some("12.10"), "x86_64"),
        ];
        assert_eq!(pick_auto(&list, Some((12, 4)), "x86_64").unwrap(), "c124");
        assert_eq!(pick_auto(&list, Some((12, 10)), "x86_64").unwrap(), "c1210", "12.10 > 12.6 numerically");
        assert_eq!(pick_auto(&list, Some((12, 4)), "aarch64").unwrap(), "c124-arm");
        assert_eq!(pick_auto(&list, Some((12, 0)), "x86_64").unwrap(), "c118");
        let e = pick_auto(&list, Some((11, 4)), "x86_64").unwrap_err().to_string();
        assert!(e.contains("<= 11.4"), "{e}");
        let e = pick_auto(&list, None, "x86_64").unwrap_err().to_string();
        assert!(e.contains("no NVIDIA driver"), "{e}");
    }
}
