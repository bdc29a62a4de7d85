//! Applying image layers in order into a new rootfs of the store: each layer is streamed
//! (read + decompress on one thread, unpack on another: [`archive::pipeline`]) into the
//! import's temp tree with OCI whiteouts applied ([`UnpackOptions::oci_whiteouts`]),
//! its digest checked against the bytes read; the store renames the tree into place
//! only when every layer applied.

use crate::rootfs::archive::{self, StreamError};
use crate::rootfs::store::ImportFacts;
use crate::rootfs::unpack::{self, UnpackError, UnpackOptions};
use crate::rootfs::{tree_size, RootfsInfo, Store, CANCEL};
use anyhow::{anyhow, bail, Result};
use std::io::Read;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How a layer's bytes are checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verify {
    /// The SHA-256 of the bytes read (the blob) is this hex digest.
    Blob(String),
    /// A `docker save` layer: when it is an uncompressed tar, its SHA-256 is this hex
    /// diff ID (the image config's `rootfs.diff_ids`).
    DiffId(String),
}

#[derive(Debug, Clone)]
pub struct LayerSpec {
    /// For messages: `layer 2/5 (sha256:abcd...)`.
    pub what: String,
    pub size: u64,
    pub verify: Verify,
}

/// Where layer bytes come from.
pub trait LayerSource {
    /// The reader of layer `i`; may block (a download in progress), calling `ui.tick()`.
    fn open(&mut self, i: usize, ui: &mut PullUi) -> Result<Box<dyn Read + '_>>;
    /// Layer `i` failed its digest check: drop any cached copy.
    fn corrupt(&mut self, _i: usize) {}
}

/// Progress on a terminal: `pull NAME: fetched 3/5 layers (812.4 MB), applied 2/5: 120.3 MB, 95.1 MB/s, 3s`.
pub struct PullUi {
    progress: crate::progress::Progress,
    name: String,
    layers: usize,
    pub applied: usize,
    /// Bytes received from the network (shared with download threads).
    pub downloaded: Arc<AtomicU64>,
    /// Blobs completely fetched (shared with download threads).
    pub fetched: Arc<AtomicU64>,
    /// Bytes of layers read by the unpacker, before the current layer.
    read_before: u64,
    read_now: u64,
    /// A pull (shows downloads) or a local import.
    network: bool,
}

impl PullUi {
    pub fn new(verb: &str, name: &str, layers: usize, network: bool) -> PullUi {
        PullUi {
            progress: crate::progress::Progress::new(&format!("{verb} {name}")),
            name: name.to_string(),
            layers,
            applied: 0,
            downloaded: Arc::new(AtomicU64::new(0)),
            fetched: Arc::new(AtomicU64::new(0)),
            read_before: 0,
            read_now: 0,
            network,
        }
    }

    /// Redraws (at most 10 times a second; nothing when stderr is not a terminal). The
    /// byte count and rate are of layer data applied; a pull's label adds what was
    /// downloaded.
    pub fn tick(&mut self) {
        let label = if self.network {
            format!(
                "pull {}: fetched {}/{} layers ({:.1} MB), applied {}/{}",
                self.name,
                self.fetched.load(Ordering::Relaxed),
                self.layers,
                self.downloaded.load(Ordering::Relaxed) as f64 / 1e6,
                self.applied,
                self.layers
            )
        } else {
            format!("import {}: applied {}/{} layers", self.name, self.applied, self.layers)
        };
        self.progress.set_label(&label);
        self.progress.update(self.read_before + self.read_now);
    }

    pub fn finish(&mut self) {
        self.tick();
        self.progress.finish();
    }
}

/// What the apply wrote.
#[derive(Debug, Clone, Default)]
pub struct Applied {
    pub entries: u64,
    pub bytes: u64,
    pub whiteouts: u64,
}

/// Creates rootfs `name` from `layers` applied in order. `facts` carries source,
/// digest, arch and CUDA version; sizes are filled in from the tree.
pub fn apply_layers(
    store: &Store,
    name: &str,
    layers: &[LayerSpec],
    src: &mut dyn LayerSource,
    ui: &mut PullUi,
    facts: ImportFacts,
) -> Result<(RootfsInfo, Applied)> {
    let mut applied = Applied::default();
    let info = store.import_with(name, |tree| {
        for (i, layer) in layers.iter().enumerate() {
            let stats = apply_one(tree, i, layer, src, ui, name)?;
            applied.whiteouts += stats.whiteouts;
            ui.applied = i + 1;
            ui.tick();
        }
        let (entries, bytes) = tree_size(&crate::sys::fs_at::proc_fd(tree.as_raw_fd()));
        applied.entries = entries;
        applied.bytes = bytes;
        if entries == 0 {
            bail!("the image has no files: nothing to import as '{name}'");
        }
        Ok(ImportFacts { size_bytes: bytes, entries, ..facts })
    })?;
    Ok((info, applied))
}

fn apply_one(
    tree: BorrowedFd<'_>,
    i: usize,
    layer: &LayerSpec,
    src: &mut dyn LayerSource,
    ui: &mut PullUi,
    name: &str,
) -> Result<unpack::UnpackStats> {
    if layer.size == 0 {
        return Ok(Default::default()); // some tools write empty blobs for empty layers
    }
    let opts = UnpackOptions {
        oci_whiteouts: true,
        follow_symlinks_in_root: true,
        cancel: Some(&CANCEL),
        ..UnpackOptions::default()
    };
    let piped = {
        let mut reader = src.open(i, ui)?;
        ui.read_now = 0;
        let mut progress = |n: u64| {
            ui.read_now = n;
            ui.tick();
        };
        archive::pipeline(&mut reader, &mut progress, &CANCEL, |_, r| unpack::unpack_at(r, tree, &opts))
    };
    ui.read_before += ui.read_now;
    ui.read_now = 0;
    let what = &layer.what;
    let (stream, stats) = match piped {
        Err(StreamError::Source(e)) => bail!("cannot read {what}: {e}"),
        Err(StreamError::Format(e)) => bail!("{what} is not a usable layer: {e}"),
        Err(e) => bail!("{what}: {e}"),
        Ok((_, Err(UnpackError::Interrupted))) => bail!("import of '{name}' interrupted"),
        Ok((s, Err(e))) => {
            // A corrupt stream is more likely a bad blob than a hostile one: say which.
            if !digest_ok(&layer.verify, &s) {
                src.corrupt(i);
                return Err(anyhow!("digest mismatch for {what}: the data read does not match its digest ({e})"));
            }
            return Err(anyhow!("cannot apply {what}: {e}"));
        }
        Ok((s, Ok(st))) => (s, st),
    };
    if !digest_ok(&layer.verify, &stream) {
        src.corrupt(i);
        let want = match &layer.verify {
            Verify::Blob(h) | Verify::DiffId(h) => h,
        };
        bail!(
            "digest mismatch for {what}: expected sha256:{want}, read sha256:{} ({} bytes); nothing was kept",
            stream.sha256,
            stream.bytes_read
        );
    }
    if stream.bytes_read != layer.size && matches!(layer.verify, Verify::Blob(_)) {
        bail!("size mismatch for {what}: expected {} bytes, read {}", layer.size, stream.bytes_read);
    }
    tracing::debug!("applied {what}: {} entries, {} whiteouts, {} bytes", stats.entries, stats.whiteouts, stats.bytes);
    Ok(stats)
}

fn digest_ok(v: &Verify, s: &archive::StreamInfo) -> bool {
    match v {
        Verify::Blob(h) => s.sha256 == *h,
        // The diff ID is the digest of the uncompressed tar; a compressed layer in an
        // archive cannot be checked against it without hashing the tar stream.
        Verify::DiffId(h) => s.compression != archive::Compression::None || s.sha256 == *h,
    }
}
