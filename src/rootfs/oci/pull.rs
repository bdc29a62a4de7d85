//! `rootfs pull`: reference -> manifest (the host's platform from an index) -> config
//! -> layers downloaded into the blob cache (a few at a time, each verified) while the
//! ones already there are applied in order.

use super::apply::{apply_layers, LayerSource, LayerSpec, PullUi, Verify};
use super::auth::AuthFile;
use super::blobs::BlobCache;
use super::image::{self, ImageFacts, Manifest, Platform};
use super::reference::Reference;
use super::registry::RegistryClient;
use crate::http::RetryPolicy;
use crate::rootfs::store::ImportFacts;
use crate::rootfs::{validate_name, RootfsInfo, Store, CANCEL};
use anyhow::{anyhow, bail, Result};
use oci_spec::image::ImageManifest;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    /// `[REGISTRY/]REPO[:TAG][@sha256:DIGEST]`.
    pub reference: String,
    /// Rootfs name [default: `Reference::default_name`].
    pub name: Option<String>,
    /// `os/arch[/variant]` [default: this host's].
    pub platform: Option<String>,
    /// Credentials file (Docker `config.json` format) [default: see [`AuthFile::load`]].
    pub auth_file: Option<PathBuf>,
    /// Plain http, for localhost / 127.x registries only.
    pub insecure: bool,
    /// Retries of transient failures [default: `RetryPolicy::default()`].
    pub retry: Option<RetryPolicy>,
    /// Concurrent blob downloads [default: 3].
    pub parallel: Option<usize>,
}

/// What a pull (or a local image import) did.
#[derive(Debug, Clone)]
pub struct PullReport {
    pub info: RootfsInfo,
    /// The fully qualified reference, or the local path.
    pub reference: String,
    /// `sha256:...` of the image manifest applied (the platform's, for an index).
    pub manifest_digest: String,
    pub platform: Option<String>,
    pub layers: usize,
    pub whiteouts: u64,
    /// Blobs (layers and config) downloaded / found in the cache.
    pub downloaded_blobs: usize,
    pub cached_blobs: usize,
    pub downloaded_bytes: u64,
    /// HTTP requests in all, and blob GETs among them.
    pub requests: u64,
    pub blob_requests: u64,
    pub elapsed: Duration,
}

impl PullReport {
    /// The summary line: `pulled rootfs 'x' from REF@sha256:...: 5 layers (3 downloaded,
    /// 2 cached, 812.4 MB), 20311 entries, 1650.2 MB, x86_64, CUDA 12.4.1, in 31.2s`.
    pub fn summary(&self, verb: &str) -> String {
        let i = &self.info;
        let net = if verb == "pulled" {
            format!(
                " ({} downloaded, {} cached, {:.1} MB)",
                self.downloaded_blobs,
                self.cached_blobs,
                self.downloaded_bytes as f64 / 1e6
            )
        } else {
            String::new()
        };
        format!(
            "{verb} rootfs '{}' from {}@{}: {} layer{}{net}, {} entries, {:.1} MB{}{}, in {:.1}s",
            i.name,
            self.reference,
            self.manifest_digest,
            self.layers,
            if self.layers == 1 { "" } else { "s" },
            i.entries,
            i.size_bytes as f64 / 1e6,
            i.arch.as_deref().map(|a| format!(", {a}")).unwrap_or_default(),
            i.cuda_version.as_deref().map(|c| format!(", CUDA {c}")).unwrap_or_default(),
            self.elapsed.as_secs_f64()
        )
    }
}

/// Refuses a name that is taken before anything is downloaded.
pub(crate) fn check_free(store: &Store, name: &str) -> Result<()> {
    validate_name(name)?;
    if store.dir().join(name).symlink_metadata().is_ok() {
        bail!("rootfs '{name}' already exists: remove it with `azp-sandbox rootfs rm {name}` first");
    }
    Ok(())
}

/// Pulls `opts.reference` into `store` as a new rootfs, caching blobs under
/// `cache_dir/blobs/sha256`.
pub fn pull(store: &Store, cache_dir: &Path, opts: &PullOptions) -> Result<PullReport> {
    let started = Instant::now();
    let r = Reference::parse(&opts.reference)?;
    let name = opts.name.clone().unwrap_or_else(|| r.default_name());
    check_free(store, &name)?;
    let explicit_platform = opts.platform.is_some();
    let want = match &opts.platform {
        Some(p) => Platform::parse(p)?,
        None => Platform::host(),
    };
    let auth = AuthFile::load(opts.auth_file.as_deref())?;
    let mut client = RegistryClient::new(&r, &auth, opts.insecure)?;
    if let Some(p) = &opts.retry {
        client.retry = p.clone();
    }
    let cache = BlobCache::new(cache_dir);
    cache.clean_stale();

    // The manifest, through an index if there is one.
    let (bytes, ct) = client.manifest(r.manifest_ref())?;
    let mut digest = image::sha256_digest(&bytes);
    if let Some(d) = &r.digest {
        if *d != digest {
            bail!("digest mismatch for the manifest of {r}: the registry sent {digest}; nothing was kept");
        }
    }
    let mut platform = None;
    let mut doc = image::parse_manifest(&bytes, ct.as_deref(), &format!("the manifest of {r}"))?;
    let mut depth = 0;
    let manifest: ImageManifest = loop {
        match doc {
            Manifest::Image(m) => break m,
            Manifest::Index(idx) => {
                depth += 1;
                if depth > 2 {
                    bail!("the index of {r} nests indexes too deeply");
                }
                let d = image::select_platform(&idx, &want, &format!("{r}"))?.clone();
                platform = Some(want.to_string());
                let d_digest = d.digest().to_string();
                image::sha256_hex(&d_digest, &format!("the {want} manifest of {r}"))?;
                if d.size() > image::MAX_MANIFEST {
                    bail!("the {want} manifest of {r} is larger than {} bytes", image::MAX_MANIFEST);
                }
                let (b, ct) = client.manifest(&d_digest)?;
                let got = image::sha256_digest(&b);
                if got != d_digest {
                    bail!("digest mismatch for the {want} manifest of {r}: expected {d_digest}, the registry sent {got}; nothing was kept");
                }
                digest = got;
                doc = image::parse_manifest(
                    &b,
                    ct.as_deref().or(Some(d.media_type().as_ref())),
                    &format!("the {want} manifest of {r}"),
                )?;
            }
        }
    };
    // `REGISTRY/REPO[:TAG]@DIGEST`, the digest of the manifest applied.
    let base =
        format!("{}/{}{}", r.registry, r.repository, r.tag.as_deref().map(|t| format!(":{t}")).unwrap_or_default());
    let target = format!("{base}@{digest}");
    let (config_desc, layer_descs) = (manifest.config(), manifest.layers());
    check_config_media_type(config_desc.media_type().as_ref(), &target)?;
    let n = layer_descs.len();
    let mut specs = Vec::with_capacity(n);
    for (i, l) in layer_descs.iter().enumerate() {
        let what = format!("layer {}/{n} ({}) of {target}", i + 1, short(l.digest().as_ref()));
        image::check_layer_media_type(l.media_type().as_ref(), &what)?;
        let hex = image::sha256_hex(l.digest().as_ref(), &what)?.to_string();
        specs.push(LayerSpec { what, size: l.size(), verify: Verify::Blob(hex) });
    }
    if n == 0 {
        bail!("{target} has no layers: nothing to import");
    }

    // The config: architecture, CUDA version.
    let config_digest = config_desc.digest().to_string();
    image::sha256_hex(&config_digest, &format!("the config of {target}"))?;
    let config_cached = cache.has(&config_digest["sha256:".len()..], config_desc.size());
    let config = cache.fetch_small(
        &client,
        &config_digest,
        config_desc.size(),
        image::MAX_CONFIG,
        &format!("the config of {target}"),
    )?;
    let facts = ImageFacts::from_config(&config, &format!("the config of {target}"))?;
    if let Some(os) = facts.os.as_deref().filter(|o| !o.is_empty() && *o != "linux") {
        bail!("{target} is an image for '{os}', not linux");
    }
    if let Some(a) = facts.arch.as_deref() {
        if a != want.arch {
            if explicit_platform {
                tracing::warn!("{target} is for {a}, not the requested {want}");
            } else {
                tracing::warn!("{target} is for {a}, not this host's {}: its programs may not run here", want.arch);
            }
        }
    }

    // Unique blobs, in layer order.
    let mut queue: Vec<(String, u64, String)> = Vec::new(); // (digest, size, what)
    let mut slot_of = Vec::with_capacity(n);
    for (i, l) in layer_descs.iter().enumerate() {
        let d = l.digest().to_string();
        let k = match queue.iter().position(|(q, _, _)| *q == d) {
            Some(k) => k,
            None => {
                queue.push((d, l.size(), specs[i].what.clone()));
                queue.len() - 1
            }
        };
        slot_of.push(k);
    }
    let slots = Slots { state: Mutex::new(vec![None; queue.len()]), cv: Condvar::new() };
    let stop = AtomicBool::new(false);
    let failed_any = AtomicBool::new(false);
    let next = AtomicUsize::new(0);
    let mut ui = PullUi::new("pull", &name, n, true);
    let workers = opts.parallel.unwrap_or(3).clamp(1, 8).min(queue.len());
    let downloaded_bytes = ui.downloaded.clone();
    let fetched = ui.fetched.clone();
    let per_slot: Vec<u64> = (0..queue.len()).map(|k| slot_of.iter().filter(|&&s| s == k).count() as u64).collect();

    let import_facts = ImportFacts {
        source: target.clone(),
        sha256: Some(digest["sha256:".len()..].to_string()),
        arch: facts.uname_arch(),
        cuda_version: facts.cuda_version(),
        ..Default::default()
    };
    let result = std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::SeqCst);
                // After a failure, no new downloads: the apply stops at the failed layer
                // (downloads of earlier layers go on).
                if k >= queue.len() || stop.load(Ordering::Relaxed) || failed_any.load(Ordering::Relaxed) {
                    break;
                }
                let (d, size, what) = &queue[k];
                let r = cache.fetch(&client, d, *size, what, &downloaded_bytes, &stop).map_err(|e| e.to_string());
                if r.is_ok() {
                    fetched.fetch_add(per_slot[k], Ordering::Relaxed);
                }
                let failed = r.is_err();
                slots.state.lock().expect("slots")[k] = Some(r);
                slots.cv.notify_all();
                if failed {
                    failed_any.store(true, Ordering::Relaxed);
                    break;
                }
            });
        }
        let mut src = RegistrySource { cache: &cache, slots: &slots, slot_of: &slot_of, queue: &queue, stop: &stop };
        let r = apply_layers(store, &name, &specs, &mut src, &mut ui, import_facts);
        stop.store(true, Ordering::Relaxed);
        slots.cv.notify_all();
        r
    });
    ui.finish();
    let (info, applied) = result?;
    let states = slots.state.into_inner().expect("slots");
    let downloaded = states.iter().filter(|s| matches!(s, Some(Ok(true)))).count() + usize::from(!config_cached);
    let cached = queue.len() + 1 - downloaded;
    Ok(PullReport {
        info,
        reference: base,
        manifest_digest: digest,
        platform,
        layers: n,
        whiteouts: applied.whiteouts,
        downloaded_blobs: downloaded,
        cached_blobs: cached,
        downloaded_bytes: downloaded_bytes.load(Ordering::Relaxed)
            + if config_cached { 0 } else { config.len() as u64 },
        requests: client.requests(),
        blob_requests: client.blob_requests(),
        elapsed: started.elapsed(),
    })
}

/// Configs of container images; artifacts (Helm charts, signatures...) are refused.
pub(crate) fn check_config_media_type(mt: &str, what: &str) -> Result<()> {
    match mt {
        "application/vnd.oci.image.config.v1+json" | "application/vnd.docker.container.image.v1+json" => Ok(()),
        other => bail!("{what} is not a container image (its config has media type '{other}')"),
    }
}

/// `sha256:0123456789ab`.
pub(crate) fn short(digest: &str) -> String {
    digest.chars().take("sha256:".len() + 12).collect()
}

struct Slots {
    /// Per unique blob: `Some(Ok(downloaded))` once cached, `Some(Err(message))` on failure.
    state: Mutex<Vec<Option<Result<bool, String>>>>,
    cv: Condvar,
}

struct RegistrySource<'a> {
    cache: &'a BlobCache,
    slots: &'a Slots,
    slot_of: &'a [usize],
    queue: &'a [(String, u64, String)],
    stop: &'a AtomicBool,
}

impl LayerSource for RegistrySource<'_> {
    fn open(&mut self, i: usize, ui: &mut PullUi) -> Result<Box<dyn Read + '_>> {
        let k = self.slot_of[i];
        let mut state = self.slots.state.lock().expect("slots");
        loop {
            match &state[k] {
                Some(Ok(_)) => break,
                Some(Err(e)) => return Err(anyhow!("{e}")),
                None => {}
            }
            if CANCEL.load(Ordering::Relaxed) {
                self.stop.store(true, Ordering::Relaxed);
                bail!("pull interrupted");
            }
            ui.tick();
            state = self.slots.cv.wait_timeout(state, Duration::from_millis(100)).expect("slots").0;
        }
        drop(state);
        let hex = &self.queue[k].0["sha256:".len()..];
        let f = std::fs::File::open(self.cache.path(hex))
            .map_err(|e| anyhow!("cannot open the cached {}: {e}", self.queue[k].2))?;
        Ok(Box::new(f))
    }

    fn corrupt(&mut self, i: usize) {
        let k = self.slot_of[i];
        self.cache.evict(&self.queue[k].0["sha256:".len()..]);
    }
}
