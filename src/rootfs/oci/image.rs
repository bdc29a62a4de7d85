//! Image documents (types from `oci-spec`): manifests and indexes in their OCI and
//! Docker v2 forms, platform selection, layer media types, and the facts the store
//! records from an image config (architecture, `CUDA_VERSION`).

use anyhow::{anyhow, bail, Result};
use oci_spec::image::{Descriptor, ImageIndex, ImageManifest};
use std::collections::HashMap;
use std::fmt;

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_SCHEMA1: &str = "application/vnd.docker.distribution.manifest.v1";

/// The `Accept` header of manifest requests: every form we can read.
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.docker.distribution.manifest.v2+json";

/// Manifests larger than this are refused (containerd uses the same limit).
pub const MAX_MANIFEST: u64 = 4 << 20;
/// Image configs larger than this are refused.
pub const MAX_CONFIG: u64 = 64 << 20;

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", crate::digest::sha256_hex(bytes))
}

/// The hex part of a `sha256:` digest, or an error naming what it belongs to.
pub fn sha256_hex<'a>(digest: &'a str, what: &str) -> Result<&'a str> {
    super::reference::parse_digest(digest).map_err(|why| anyhow!("{what} has an unusable digest: {why}"))?;
    Ok(&digest["sha256:".len()..])
}

#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // short-lived
pub enum Manifest {
    Index(ImageIndex),
    Image(ImageManifest),
}

/// Parses a manifest or index, telling them apart by their `mediaType` field, else
/// the `Content-Type` the registry sent, else their shape.
pub fn parse_manifest(bytes: &[u8], content_type: Option<&str>, what: &str) -> Result<Manifest> {
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| anyhow!("{what} is not valid JSON ({e})"))?;
    let field = v.get("mediaType").and_then(|m| m.as_str()).map(str::to_owned);
    let ct = content_type.map(|c| c.split(';').next().unwrap_or(c).trim().to_owned());
    let mt = field.or(ct).unwrap_or_default();
    if v.get("schemaVersion").and_then(|s| s.as_u64()) == Some(1) || mt.starts_with(DOCKER_SCHEMA1) {
        bail!("{what} is a Docker schema 1 manifest (deprecated, not supported): push the image again with a current client");
    }
    let is_index = match mt.as_str() {
        OCI_INDEX | DOCKER_LIST => true,
        OCI_MANIFEST | DOCKER_MANIFEST => false,
        _ => v.get("manifests").is_some() && v.get("layers").is_none(),
    };
    if is_index {
        let idx: ImageIndex =
            serde_json::from_value(v).map_err(|e| anyhow!("{what} is not a valid image index ({e})"))?;
        Ok(Manifest::Index(idx))
    } else {
        if v.get("layers").is_none() {
            bail!("{what} has media type '{mt}', which is not an image manifest or index");
        }
        let m: ImageManifest =
            serde_json::from_value(v).map_err(|e| anyhow!("{what} is not a valid image manifest ({e})"))?;
        Ok(Manifest::Image(m))
    }
}

/// `os/arch[/variant]`, Go names (`linux/amd64`, `linux/arm64/v8`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    pub os: String,
    pub arch: String,
    pub variant: Option<String>,
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.arch)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

impl Platform {
    /// This machine: `linux/amd64` or `linux/arm64/v8` (or the nearest Go name).
    pub fn host() -> Platform {
        let (arch, variant) = match std::env::consts::ARCH {
            "x86_64" => ("amd64", None),
            "aarch64" => ("arm64", Some("v8")),
            "x86" => ("386", None),
            "arm" => ("arm", Some("v7")),
            "powerpc64" => ("ppc64le", None),
            "s390x" => ("s390x", None),
            "riscv64" => ("riscv64", None),
            "loongarch64" => ("loong64", None),
            other => (other, None),
        };
        Platform { os: "linux".into(), arch: arch.into(), variant: variant.map(Into::into) }
    }

    /// `linux/amd64`, `linux/arm64`, `linux/arm/v7`, `amd64` (os linux); uname names
    /// (`x86_64`, `aarch64`) are accepted too.
    pub fn parse(s: &str) -> Result<Platform> {
        let parts: Vec<&str> = s.trim().split('/').collect();
        let (os, arch, variant) = match parts.as_slice() {
            [a] => ("linux", *a, None),
            [o, a] => (*o, *a, None),
            [o, a, v] => (*o, *a, Some(*v)),
            _ => ("", "", None),
        };
        let ok = |x: &str| !x.is_empty() && x.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !ok(os) || !ok(arch) || variant.is_some_and(|v| !ok(v)) {
            bail!("invalid platform '{s}': use OS/ARCH[/VARIANT], e.g. linux/amd64 or linux/arm64");
        }
        let arch = match arch {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            a => a,
        };
        Ok(Platform {
            os: os.to_ascii_lowercase(),
            arch: arch.to_ascii_lowercase(),
            variant: variant.map(str::to_ascii_lowercase),
        })
    }

    /// The variant, with the defaults the OCI spec implies (`arm64` is `v8`).
    fn norm_variant(&self) -> Option<&str> {
        match (self.arch.as_str(), self.variant.as_deref()) {
            ("arm64", None) => Some("v8"),
            (_, v) => v,
        }
    }

    /// Whether an index entry for `other` can run here: same OS and architecture, and
    /// the same variant when both name one.
    pub fn matches(&self, other: &Platform) -> bool {
        self.os == other.os
            && self.arch == other.arch
            && match (self.norm_variant(), other.norm_variant()) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }

    fn of(d: &Descriptor) -> Option<Platform> {
        let p = d.platform().as_ref()?;
        Some(Platform { os: p.os().to_string(), arch: p.architecture().to_string(), variant: p.variant().clone() })
    }
}

/// The index entry for `want`: an exact variant match first, then a compatible one.
/// Entries without a platform or for `unknown/unknown` (build attestations) never match.
pub fn select_platform<'a>(index: &'a ImageIndex, want: &Platform, what: &str) -> Result<&'a Descriptor> {
    let cands: Vec<(&Descriptor, Platform)> =
        index.manifests().iter().filter_map(|d| Platform::of(d).map(|p| (d, p))).collect();
    let exact =
        cands.iter().find(|(_, p)| p.os == want.os && p.arch == want.arch && p.norm_variant() == want.norm_variant());
    if let Some((d, _)) = exact.or_else(|| cands.iter().find(|(_, p)| want.matches(p))) {
        return Ok(d);
    }
    // An index without platforms and with one entry (some tools write those).
    if cands.is_empty() && index.manifests().len() == 1 {
        return Ok(&index.manifests()[0]);
    }
    let mut avail: Vec<String> = cands.iter().filter(|(_, p)| p.os != "unknown").map(|(_, p)| p.to_string()).collect();
    avail.dedup();
    let avail = if avail.is_empty() { "none".to_string() } else { avail.join(", ") };
    bail!("{what} has no image for platform {want} (available: {avail}); choose one with --platform")
}

/// A layer we can apply: tar, tar+gzip, tar+zstd in their OCI and Docker names.
pub fn check_layer_media_type(mt: &str, what: &str) -> Result<()> {
    const OK: &[&str] = &[
        "application/vnd.oci.image.layer.v1.tar",
        "application/vnd.oci.image.layer.v1.tar+gzip",
        "application/vnd.oci.image.layer.v1.tar+zstd",
        "application/vnd.docker.image.rootfs.diff.tar",
        "application/vnd.docker.image.rootfs.diff.tar.gzip",
        "application/vnd.docker.image.rootfs.diff.tar.zstd",
    ];
    if OK.contains(&mt) {
        return Ok(());
    }
    let why = if mt.contains("nondistributable") || mt.contains("foreign") {
        "a non-distributable (foreign) layer, whose content is not in the registry"
    } else if mt.contains("encrypted") {
        "an encrypted layer"
    } else {
        "a layer format this tool cannot read"
    };
    bail!(
        "unsupported media type '{mt}' for {what} ({why}): only tar layers (uncompressed, gzip or zstd) can be applied"
    )
}

/// Facts of an image config the store records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageFacts {
    /// Go name (`amd64`).
    pub arch: Option<String>,
    pub os: Option<String>,
    pub variant: Option<String>,
    pub env: Vec<String>,
    pub labels: HashMap<String, String>,
}

/// The fields we need, read leniently (configs written by old or odd tools).
#[derive(serde::Deserialize, Default)]
struct LenientConfig {
    #[serde(default)]
    architecture: Option<String>,
    #[serde(default)]
    os: Option<String>,
    #[serde(default)]
    variant: Option<String>,
    #[serde(default)]
    config: Option<LenientExec>,
}

#[derive(serde::Deserialize, Default)]
struct LenientExec {
    #[serde(default, rename = "Env")]
    env: Option<Vec<String>>,
    #[serde(default, rename = "Labels")]
    labels: Option<HashMap<String, String>>,
}

impl ImageFacts {
    /// From the config blob: through `oci_spec::image::ImageConfiguration`, or leniently
    /// if that refuses it.
    pub fn from_config(bytes: &[u8], what: &str) -> Result<ImageFacts> {
        if let Ok(c) = serde_json::from_slice::<oci_spec::image::ImageConfiguration>(bytes) {
            let exec = c.config().as_ref();
            return Ok(ImageFacts {
                arch: Some(c.architecture().to_string()),
                os: Some(c.os().to_string()),
                variant: c.variant().clone(),
                env: exec.and_then(|e| e.env().clone()).unwrap_or_default(),
                labels: exec.and_then(|e| e.labels().clone()).unwrap_or_default(),
            });
        }
        let c: LenientConfig =
            serde_json::from_slice(bytes).map_err(|e| anyhow!("{what} is not a valid image config ({e})"))?;
        let exec = c.config.unwrap_or_default();
        Ok(ImageFacts {
            arch: c.architecture,
            os: c.os,
            variant: c.variant,
            env: exec.env.unwrap_or_default(),
            labels: exec.labels.unwrap_or_default(),
        })
    }

    /// `CUDA_VERSION` from the config's environment (NVIDIA's CUDA images), else the
    /// `com.nvidia.cuda.version` label.
    pub fn cuda_version(&self) -> Option<String> {
        let env = self.env.iter().find_map(|e| e.strip_prefix("CUDA_VERSION=")).map(str::trim);
        env.filter(|v| !v.is_empty())
            .or_else(|| self.labels.get("com.nvidia.cuda.version").map(|s| s.trim()).filter(|v| !v.is_empty()))
            .map(str::to_owned)
    }

    /// `uname -m` style, as the store's probe writes it (`amd64` -> `x86_64`).
    pub fn uname_arch(&self) -> Option<String> {
        let a = self.arch.as_deref()?;
        Some(
            match a {
                "amd64" => "x86_64",
                "arm64" => "aarch64",
                "386" => "i386",
                "loong64" => "loongarch64",
                "mips64le" => "mips64el",
                "mipsle" => "mipsel",
                "" => return None,
                other => other,
            }
            .to_string(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(entries: &[(&str, &str, Option<&str>)]) -> ImageIndex {
        let manifests: Vec<serde_json::Value> = entries
            .iter()
            .enumerate()
            .map(|(i, (os, arch, var))| {
                let mut p = serde_json::json!({"os": os, "architecture": arch});
                if let Some(v) = var {
                    p["variant"] = serde_json::json!(v);
                }
                serde_json::json!({
                    "mediaType": OCI_MANIFEST,
                    "digest": format!("sha256:{:064x}", i + 1),
                    "size": 100,
                    "platform": p,
                })
            })
            .collect();
        let v = serde_json::json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests});
        match parse_manifest(v.to_string().as_bytes(), None, "the index").unwrap() {
            Manifest::Index(i) => i,
            _ => panic!("not an index"),
        }
    }

    #[test]
    fn platform_selection() {
        let idx = index(&[
            ("linux", "amd64", None),
            ("linux", "arm", Some("v7")),
            ("linux", "arm64", Some("v8")),
            ("unknown", "unknown", None),
        ]);
        let pick = |s: &str| select_platform(&idx, &Platform::parse(s).unwrap(), "img").map(|d| d.digest().to_string());
        assert!(pick("linux/amd64").unwrap().ends_with("1"));
        assert!(pick("linux/arm64").unwrap().ends_with("3"), "arm64 means arm64/v8");
        assert!(pick("linux/arm64/v8").unwrap().ends_with("3"));
        assert!(pick("aarch64").unwrap().ends_with("3"));
        assert!(pick("linux/arm/v7").unwrap().ends_with("2"));
        let e = pick("linux/ppc64le").unwrap_err().to_string();
        assert_eq!(e, "img has no image for platform linux/ppc64le (available: linux/amd64, linux/arm/v7, linux/arm64/v8); choose one with --platform");
        assert!(pick("linux/arm/v6").is_err());
        // Exact variant preferred over a variant-less entry.
        let idx = index(&[("linux", "arm64", None), ("linux", "arm64", Some("v9"))]);
        assert!(select_platform(&idx, &Platform::parse("linux/arm64/v9").unwrap(), "x")
            .unwrap()
            .digest()
            .to_string()
            .ends_with("2"));
        assert!(select_platform(&idx, &Platform::parse("linux/arm64").unwrap(), "x")
            .unwrap()
            .digest()
            .to_string()
            .ends_with("1"));
        let host = Platform::host();
        assert_eq!(host.os, "linux");
        assert!(Platform::parse("linux/amd64/v2/x").is_err());
        assert!(Platform::parse("").is_err());
    }

    #[test]
    fn manifests() {
        let docker = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": DOCKER_MANIFEST,
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": 10, "digest": format!("sha256:{:064x}", 1)},
            "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": 10, "digest": format!("sha256:{:064x}", 2)}]
        });
        match parse_manifest(docker.to_string().as_bytes(), None, "m").unwrap() {
            Manifest::Image(m) => assert_eq!(m.layers().len(), 1),
            _ => panic!(),
        }
        let list = serde_json::json!({"schemaVersion": 2, "manifests": []});
        assert!(matches!(
            parse_manifest(list.to_string().as_bytes(), Some(DOCKER_LIST), "m").unwrap(),
            Manifest::Index(_)
        ));
        let s1 = serde_json::json!({"schemaVersion": 1, "name": "x", "fsLayers": []});
        assert!(parse_manifest(s1.to_string().as_bytes(), None, "m").unwrap_err().to_string().contains("schema 1"));
        let other = serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.cncf.helm.config.v1+json"});
        assert!(parse_manifest(other.to_string().as_bytes(), None, "m").is_err());
        assert!(parse_manifest(b"<html>", None, "m").unwrap_err().to_string().contains("not valid JSON"));
    }

    #[test]
    fn media_types() {
        for ok in ["application/vnd.oci.image.layer.v1.tar+zstd", "application/vnd.docker.image.rootfs.diff.tar.gzip"] {
            assert!(check_layer_media_type(ok, "layer 1").is_ok());
        }
        let e = check_layer_media_type("application/vnd.docker.image.rootfs.foreign.diff.tar.gzip", "layer 1 of x")
            .unwrap_err();
        assert!(e.to_string().starts_with("unsupported media type 'application/vnd.docker.image.rootfs.foreign.diff.tar.gzip' for layer 1 of x (a non-distributable"), "{e}");
        assert!(check_layer_media_type("application/vnd.oci.image.layer.v1.tar+gzip+encrypted", "l").is_err());
        assert!(check_layer_media_type("application/vnd.oci.image.layer.v1.tar+xz", "l").is_err());
    }

    #[test]
    fn config_facts() {
        let cfg = serde_json::json!({
            "architecture": "arm64", "os": "linux", "variant": "v8",
            "config": {"Env": ["PATH=/usr/bin", "CUDA_VERSION=12.4.1"], "Labels": {"maintainer": "NVIDIA"}},
            "rootfs": {"type": "layers", "diff_ids": []}
        });
        let f = ImageFacts::from_config(cfg.to_string().as_bytes(), "c").unwrap();
        assert_eq!(f.cuda_version().as_deref(), Some("12.4.1"));
        assert_eq!(f.uname_arch().as_deref(), Some("aarch64"));
        // Lenient: no rootfs, Env null; the label is the fallback.
        let cfg = serde_json::json!({"architecture": "amd64", "config": {"Env": null, "Labels": {"com.nvidia.cuda.version": "11.8.0"}}});
        let f = ImageFacts::from_config(cfg.to_string().as_bytes(), "c").unwrap();
        assert_eq!(f.cuda_version().as_deref(), Some("11.8.0"));
        assert_eq!(f.uname_arch().as_deref(), Some("x86_64"));
        let f = ImageFacts::from_config(b"{}", "c").unwrap();
        assert_eq!((f.cuda_version(), f.uname_arch()), (None, None));
        assert!(ImageFacts::from_config(b"[1]", "c").is_err());
    }
}
