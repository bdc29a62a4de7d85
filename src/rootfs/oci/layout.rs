//! Local images for `rootfs import`: an OCI image layout directory (`oci-layout` +
//! `index.json` + `blobs/`), the same as a tar (`oci-archive`, `skopeo copy ...
//! oci-archive:x.tar`), and `docker save` archives (`manifest.json` + layer tars, with or
//! without an OCI layout inside). `PATH:REF` picks one image where there are several
//! (an `org.opencontainers.image.ref.name` annotation, or a `docker save` RepoTag).
//!
//! Tars are read in place: one pass over their headers (seeking over the data) finds
//! the members, then each layer is streamed from its offset; nothing is copied.
//! Compressed image archives are not read (detected and refused with what to do).

use super::apply::{apply_layers, LayerSource, LayerSpec, PullUi, Verify};
use super::image::{self, ImageFacts, Manifest, Platform};
use super::pull::{check_config_media_type, check_free, short, PullReport};
use crate::rootfs::archive::{self, Compression};
use crate::rootfs::store::ImportFacts;
use crate::rootfs::Store;
use anyhow::{anyhow, bail, Context, Result};
use oci_spec::image::{Descriptor, ImageIndex};
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Instant;

const REF_NAME: &str = "org.opencontainers.image.ref.name";
const CONTAINERD_NAME: &str = "io.containerd.image.name";

/// Where the image's files are.
#[derive(Debug)]
enum Container {
    Dir(PathBuf),
    /// Member path -> (data offset, size).
    Tar {
        path: PathBuf,
        members: HashMap<String, (u64, u64)>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An OCI image layout (directory or tar).
    Layout,
    /// `docker save` (`manifest.json`).
    DockerSave,
}

/// An image found at a path given to `rootfs import`.
#[derive(Debug)]
pub struct LocalImage {
    container: Container,
    pub kind: Kind,
    /// The path as given, without `:REF`.
    pub path: PathBuf,
    /// `REF` of `PATH:REF`.
    pub selector: Option<String>,
}

impl LocalImage {
    /// What it is, for messages: `OCI image layout`, `OCI image archive`, `docker save archive`.
    pub fn describe(&self) -> &'static str {
        match (&self.container, self.kind) {
            (Container::Dir(_), _) => "OCI image layout",
            (Container::Tar { .. }, Kind::Layout) => "OCI image archive",
            (Container::Tar { .. }, Kind::DockerSave) => "docker save archive",
        }
    }
}

/// A relative member path without `.`/`..`/empty components (`./x` -> `x`).
fn clean(p: &str) -> Option<String> {
    let mut out: Vec<&str> = Vec::new();
    for c in p.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop()?;
            }
            c => out.push(c),
        }
    }
    Some(out.join("/"))
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A member an image archive may have (anything else: a rootfs tarball).
fn image_member(p: &str) -> bool {
    let first = p.split('/').next().unwrap_or("");
    matches!(p, "" | "oci-layout" | "index.json" | "manifest.json" | "repositories" | "index.json.lock")
        || first == "blobs"
        || is_hex64(first)
        || first.strip_suffix(".json").is_some_and(is_hex64)
}

impl Container {
    fn open(&self, rel: &str) -> Result<(Box<dyn Read + '_>, u64)> {
        let rel = clean(rel).filter(|r| !r.is_empty()).ok_or_else(|| anyhow!("bad member path '{rel}'"))?;
        match self {
            Container::Dir(d) => {
                let p = d.join(&rel);
                let f = File::open(&p).with_context(|| format!("cannot open {}", p.display()))?;
                let len = f.metadata().map(|m| m.len()).unwrap_or(0);
                Ok((Box::new(f), len))
            }
            Container::Tar { path, members } => {
                let &(off, size) =
                    members.get(&rel).ok_or_else(|| anyhow!("{} has no member {rel}", path.display()))?;
                let mut f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
                f.seek(SeekFrom::Start(off)).with_context(|| format!("cannot read {}", path.display()))?;
                Ok((Box::new(f.take(size)), size))
            }
        }
    }

    fn exists(&self, rel: &str) -> bool {
        match self {
            Container::Dir(d) => d.join(rel).is_file(),
            Container::Tar { members, .. } => members.contains_key(rel),
        }
    }

    fn read_small(&self, rel: &str, max: u64, what: &str) -> Result<Vec<u8>> {
        let (r, len) = self.open(rel).with_context(|| format!("cannot read {what}"))?;
        if len > max {
            bail!("{what} is larger than {max} bytes");
        }
        let mut v = Vec::new();
        r.take(max + 1).read_to_end(&mut v).with_context(|| format!("cannot read {what}"))?;
        Ok(v)
    }

    /// A blob by digest, checked.
    fn blob(&self, d: &Descriptor, max: u64, what: &str) -> Result<Vec<u8>> {
        let digest = d.digest().to_string();
        let hex = image::sha256_hex(&digest, what)?;
        let b = self.read_small(&format!("blobs/sha256/{hex}"), max, what)?;
        let got = image::sha256_digest(&b);
        if got != digest {
            bail!("digest mismatch for {what}: expected {digest}, the file has {got}");
        }
        Ok(b)
    }
}

/// Indexes a plain tar's members, giving up (`None`) at the first member an image
/// archive would not have. Symlinked members (`docker save` links duplicate layers)
/// point at their targets.
fn index_tar(path: &Path) -> Result<Option<HashMap<String, (u64, u64)>>> {
    let f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut ar = tar::Archive::new(f);
    let mut members = HashMap::new();
    let mut links: Vec<(String, String)> = Vec::new();
    let entries = ar.entries_with_seek().with_context(|| format!("cannot read {}", path.display()))?;
    for e in entries {
        let e = e.with_context(|| format!("cannot read the tar headers of {}", path.display()))?;
        let raw = String::from_utf8_lossy(&e.path_bytes()).into_owned();
        let Some(p) = clean(&raw) else { return Ok(None) };
        if !image_member(&p) {
            return Ok(None);
        }
        match e.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                members.insert(p, (e.raw_file_position(), e.size()));
            }
            tar::EntryType::Symlink | tar::EntryType::Link => {
                let target = e.link_name_bytes().map(|t| String::from_utf8_lossy(&t).into_owned()).unwrap_or_default();
                let base = if e.header().entry_type() == tar::EntryType::Symlink {
                    p.rsplit_once('/').map(|(d, _)| format!("{d}/")).unwrap_or_default()
                } else {
                    String::new()
                };
                if let Some(t) = clean(&format!("{base}{target}")) {
                    links.push((p, t));
                }
            }
            _ => {}
        }
    }
    for _ in 0..8 {
        let mut changed = false;
        for (p, t) in &links {
            if !members.contains_key(p) {
                if let Some(&v) = members.get(t) {
                    members.insert(p.clone(), v);
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    Ok(Some(members))
}

/// Whether the first member of a decompressed stream looks like an image archive's.
fn compressed_image_archive(path: &Path, c: Compression) -> bool {
    let Ok(f) = File::open(path) else { return false };
    let head: Box<dyn Read> = match c {
        Compression::Gzip => Box::new(flate2::read::GzDecoder::new(f)),
        Compression::Zstd => match zstd::stream::read::Decoder::new(f) {
            Ok(d) => Box::new(d),
            Err(_) => return false,
        },
        Compression::None => return false,
    };
    let mut ar = tar::Archive::new(head.take(1 << 20));
    let Ok(mut entries) = ar.entries() else { return false };
    let Some(Ok(first)) = entries.next() else { return false };
    let p = String::from_utf8_lossy(&first.path_bytes()).into_owned();
    clean(&p).is_some_and(|p| !p.is_empty() && image_member(&p))
}

/// Recognises an image at `input` (`PATH` or `PATH:REF`): `Ok(None)` for anything else
/// (a rootfs tarball, stdin), which `rootfs import` unpacks as before.
pub fn detect(input: &Path) -> Result<Option<LocalImage>> {
    if input.as_os_str() == "-" {
        return Ok(None);
    }
    if input.symlink_metadata().is_ok() {
        return detect_at(input, None);
    }
    // PATH:REF
    let s = input.to_string_lossy();
    if let Some((p, sel)) = s.rsplit_once(':') {
        let p = Path::new(p);
        if !sel.is_empty() && !sel.contains('/') && p.symlink_metadata().is_ok() {
            return detect_at(p, Some(sel.to_string()));
        }
    }
    Ok(None)
}

fn detect_at(path: &Path, selector: Option<String>) -> Result<Option<LocalImage>> {
    let meta = std::fs::metadata(path).with_context(|| format!("cannot open {}", path.display()))?;
    if meta.is_dir() {
        if path.join("oci-layout").is_file() && path.join("index.json").is_file() {
            return Ok(Some(LocalImage {
                container: Container::Dir(path.into()),
                kind: Kind::Layout,
                path: path.into(),
                selector,
            }));
        }
        bail!(
            "{} is a directory, not an OCI image layout (it has no oci-layout and index.json): give a rootfs tarball or an image layout",
            path.display()
        );
    }
    if !meta.is_file() {
        return Ok(None);
    }
    let mut head = vec![0u8; 512];
    let n = {
        let mut f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let mut n = 0;
        while n < head.len() {
            match f.read(&mut head[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
            }
        }
        n
    };
    head.truncate(n);
    match archive::detect(&head) {
        Ok(Compression::None) => {}
        Ok(c) => {
            if compressed_image_archive(path, c) {
                bail!(
                    "{} is a compressed image archive ({}): decompress it first (e.g. `zcat` / `zstd -d`) and import the .tar",
                    path.display(),
                    c.describe()
                );
            }
            return Ok(None);
        }
        Err(_) => return Ok(None),
    }
    let Some(members) = index_tar(path)? else { return Ok(None) };
    let kind = if members.contains_key("manifest.json") {
        Kind::DockerSave
    } else if members.contains_key("oci-layout") && members.contains_key("index.json") {
        Kind::Layout
    } else {
        return Ok(None);
    };
    Ok(Some(LocalImage { container: Container::Tar { path: path.into(), members }, kind, path: path.into(), selector }))
}

/// Options of a local image import.
#[derive(Debug, Clone, Default)]
pub struct LocalOptions {
    /// `os/arch[/variant]` for multi-platform layouts [default: this host's].
    pub platform: Option<String>,
}

/// Imports `img` as rootfs `name`.
pub fn import(store: &Store, img: &LocalImage, name: &str, opts: &LocalOptions) -> Result<PullReport> {
    let started = Instant::now();
    check_free(store, name)?;
    let want = match &opts.platform {
        Some(p) => Platform::parse(p)?,
        None => Platform::host(),
    };
    let shown = match &img.selector {
        Some(s) => format!("{}:{s}", img.path.display()),
        None => img.path.display().to_string(),
    };
    let plan = match img.kind {
        Kind::Layout => plan_layout(img, &want, &shown)?,
        Kind::DockerSave => plan_docker_save(img, &shown)?,
    };
    let mut ui = PullUi::new("import", name, plan.layers.len(), false);
    let mut src = LocalSource { c: &img.container, members: &plan.members };
    let facts = ImportFacts {
        source: format!("{shown} ({}{}) @{}", img.describe(), plan.label, plan.digest),
        sha256: Some(plan.digest["sha256:".len()..].to_string()),
        arch: plan.facts.uname_arch(),
        cuda_version: plan.facts.cuda_version(),
        ..Default::default()
    };
    let r = apply_layers(store, name, &plan.layers, &mut src, &mut ui, facts);
    ui.finish();
    let (info, applied) = r?;
    Ok(PullReport {
        info,
        reference: shown,
        manifest_digest: plan.digest,
        platform: plan.platform,
        layers: plan.layers.len(),
        whiteouts: applied.whiteouts,
        downloaded_blobs: 0,
        cached_blobs: 0,
        downloaded_bytes: 0,
        requests: 0,
        blob_requests: 0,
        elapsed: started.elapsed(),
    })
}

struct Plan {
    layers: Vec<LayerSpec>,
    /// Member path of each layer.
    members: Vec<String>,
    facts: ImageFacts,
    /// `sha256:` of the manifest (layouts) or the config (`docker save`: the image ID).
    digest: String,
    /// `, ref x` / `, repo:tag`.
    label: String,
    platform: Option<String>,
}

fn ref_name(d: &Descriptor) -> Option<&str> {
    let a = d.annotations().as_ref()?;
    a.get(REF_NAME).or_else(|| a.get(CONTAINERD_NAME)).map(String::as_str)
}

fn matches_ref(d: &Descriptor, sel: &str) -> bool {
    let Some(a) = d.annotations().as_ref() else { return false };
    a.get(REF_NAME).is_some_and(|r| r == sel)
        || a.get(CONTAINERD_NAME).is_some_and(|n| n == sel || n.rsplit_once(':').is_some_and(|(_, t)| t == sel))
}

fn plan_layout(img: &LocalImage, want: &Platform, shown: &str) -> Result<Plan> {
    let c = &img.container;
    let index_bytes = c.read_small("index.json", image::MAX_MANIFEST, &format!("{shown}: index.json"))?;
    let top: ImageIndex =
        serde_json::from_slice(&index_bytes).map_err(|e| anyhow!("{shown}: index.json is not an image index ({e})"))?;
    let entries: Vec<&Descriptor> = match &img.selector {
        Some(sel) => {
            let m: Vec<&Descriptor> = top.manifests().iter().filter(|d| matches_ref(d, sel)).collect();
            if m.is_empty() {
                bail!("{shown}: no image named '{sel}' in the layout (refs: {})", refs(&top));
            }
            m
        }
        None => top.manifests().iter().collect(),
    };
    let mut label = img.selector.as_ref().map(|s| format!(", ref {s}")).unwrap_or_default();
    if img.selector.is_none() && entries.len() == 1 {
        if let Some(r) = ref_name(entries[0]) {
            label = format!(", ref {r}");
        }
    }
    let mut platform = None;
    let mut desc: Descriptor = match entries.as_slice() {
        [] => bail!("{shown}: index.json lists no images"),
        [one] => (*one).clone(),
        many => {
            // Several entries: fine if they are platforms of one image.
            if many.iter().all(|d| d.platform().is_some()) {
                let mut idx = top.clone();
                idx.set_manifests(many.iter().map(|d| (*d).clone()).collect());
                platform = Some(want.to_string());
                image::select_platform(&idx, want, shown)?.clone()
            } else {
                bail!("{shown} holds {} images (refs: {}): pick one with PATH:REF", many.len(), refs(&top));
            }
        }
    };
    for _ in 0..3 {
        let what = format!("the manifest {} of {shown}", short(desc.digest().as_ref()));
        let b = c.blob(&desc, image::MAX_MANIFEST, &what)?;
        match image::parse_manifest(&b, Some(desc.media_type().as_ref()), &what)? {
            Manifest::Index(idx) => {
                platform = Some(want.to_string());
                desc = image::select_platform(&idx, want, shown)?.clone();
            }
            Manifest::Image(m) => {
                let digest = desc.digest().to_string();
                let target = format!("{shown}@{digest}");
                check_config_media_type(m.config().media_type().as_ref(), &target)?;
                let config = c.blob(m.config(), image::MAX_CONFIG, &format!("the config of {target}"))?;
                let facts = ImageFacts::from_config(&config, &format!("the config of {target}"))?;
                let n = m.layers().len();
                let mut layers = Vec::new();
                let mut members = Vec::new();
                for (i, l) in m.layers().iter().enumerate() {
                    let what = format!("layer {}/{n} ({}) of {target}", i + 1, short(l.digest().as_ref()));
                    image::check_layer_media_type(l.media_type().as_ref(), &what)?;
                    let hex = image::sha256_hex(l.digest().as_ref(), &what)?.to_string();
                    let member = format!("blobs/sha256/{hex}");
                    if !c.exists(&member) {
                        bail!("{what} is missing from the layout ({member})");
                    }
                    layers.push(LayerSpec { what, size: l.size(), verify: Verify::Blob(hex) });
                    members.push(member);
                }
                if n == 0 {
                    bail!("{target} has no layers: nothing to import");
                }
                return Ok(Plan { layers, members, facts, digest, label, platform });
            }
        }
    }
    bail!("{shown}: indexes nest too deeply")
}

fn refs(idx: &ImageIndex) -> String {
    let r: Vec<&str> = idx.manifests().iter().filter_map(ref_name).collect();
    if r.is_empty() {
        "none named".into()
    } else {
        r.join(", ")
    }
}

#[derive(serde::Deserialize)]
struct SaveEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers")]
    layers: Vec<String>,
}

#[derive(serde::Deserialize)]
struct DiffIds {
    rootfs: Option<RootfsIds>,
}

#[derive(serde::Deserialize)]
struct RootfsIds {
    #[serde(default)]
    diff_ids: Vec<String>,
}

fn plan_docker_save(img: &LocalImage, shown: &str) -> Result<Plan> {
    let c = &img.container;
    let b = c.read_small("manifest.json", image::MAX_MANIFEST, &format!("{shown}: manifest.json"))?;
    let entries: Vec<SaveEntry> = serde_json::from_slice(&b)
        .map_err(|e| anyhow!("{shown}: manifest.json is not a docker save manifest ({e})"))?;
    let tags = |e: &SaveEntry| e.repo_tags.clone().unwrap_or_default();
    let all_tags = || {
        let t: Vec<String> = entries.iter().flat_map(tags).collect();
        if t.is_empty() {
            "none tagged".to_string()
        } else {
            t.join(", ")
        }
    };
    let entry = match &img.selector {
        Some(sel) => entries
            .iter()
            .find(|e| tags(e).iter().any(|t| t == sel || t.rsplit_once(':').is_some_and(|(_, tag)| tag == sel)))
            .ok_or_else(|| anyhow!("{shown}: no image tagged '{sel}' in the archive (tags: {})", all_tags()))?,
        None => match entries.as_slice() {
            [] => bail!("{shown}: manifest.json lists no images"),
            [one] => one,
            many => bail!("{shown} holds {} images (tags: {}): pick one with PATH:TAG", many.len(), all_tags()),
        },
    };
    let config_member = clean(&entry.config).unwrap_or_default();
    let config = c.read_small(&config_member, image::MAX_CONFIG, &format!("{shown}: the image config"))?;
    let digest = image::sha256_digest(&config);
    let named_hex = config_member
        .strip_prefix("blobs/sha256/")
        .or_else(|| config_member.strip_suffix(".json"))
        .filter(|h| is_hex64(h));
    if let Some(h) = named_hex {
        if digest["sha256:".len()..] != *h {
            bail!("digest mismatch for the config of {shown}: it is named {h}, its content is {digest}");
        }
    }
    let facts = ImageFacts::from_config(&config, &format!("the config of {shown}"))?;
    let diff_ids =
        serde_json::from_slice::<DiffIds>(&config).ok().and_then(|d| d.rootfs).map(|r| r.diff_ids).unwrap_or_default();
    let n = entry.layers.len();
    if n == 0 {
        bail!("{shown} has no layers: nothing to import");
    }
    if diff_ids.len() != n {
        bail!("{shown}: the image config lists {} layers, manifest.json {n}", diff_ids.len());
    }
    let mut layers = Vec::new();
    let mut members = Vec::new();
    for (i, l) in entry.layers.iter().enumerate() {
        let member = clean(l).unwrap_or_default();
        let what = format!("layer {}/{n} ({member}) of {shown}", i + 1);
        let &(_, size) = match &c {
            Container::Tar { members, .. } => {
                members.get(&member).ok_or_else(|| anyhow!("{what} is missing from the archive"))?
            }
            Container::Dir(_) => bail!("{shown}: docker save directories are not supported"),
        };
        let verify = match member.strip_prefix("blobs/sha256/").filter(|h| is_hex64(h)) {
            Some(h) => Verify::Blob(h.to_string()),
            None => {
                let id = &diff_ids[i];
                let hex = image::sha256_hex(id, &what)?;
                Verify::DiffId(hex.to_string())
            }
        };
        layers.push(LayerSpec { what, size, verify });
        members.push(member);
    }
    let label = entry.repo_tags.as_ref().and_then(|t| t.first()).map(|t| format!(", {t}")).unwrap_or_default();
    Ok(Plan { layers, members, facts, digest, label, platform: None })
}

struct LocalSource<'a> {
    c: &'a Container,
    members: &'a [String],
}

impl LayerSource for LocalSource<'_> {
    fn open(&mut self, i: usize, _ui: &mut PullUi) -> Result<Box<dyn Read + '_>> {
        Ok(self.c.open(&self.members[i])?.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members() {
        assert_eq!(clean("./blobs/sha256/x").as_deref(), Some("blobs/sha256/x"));
        assert_eq!(clean("a/../b").as_deref(), Some("b"));
        assert_eq!(clean("../x"), None);
        let h = "a".repeat(64);
        for ok in [
            "oci-layout",
            "index.json",
            "manifest.json",
            "repositories",
            "blobs",
            "blobs/sha256/x",
            &h,
            &format!("{h}/layer.tar"),
            &format!("{h}.json"),
            "",
        ] {
            assert!(image_member(ok), "{ok}");
        }
        for no in ["bin", "etc/passwd", "usr/lib/x.json", "index.html", "aaaa.json"] {
            assert!(!image_member(no), "{no}");
        }
    }
}
