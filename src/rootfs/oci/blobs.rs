//! The blob cache, `<home>/cache/blobs/sha256/<hex>`: blobs are downloaded into a temp
//! file beside their final name, hashed while streaming, and renamed into place only if
//! their SHA-256 and size match the descriptor (so a cached blob is always a verified
//! one, and a failed download leaves nothing). A broken download is resumed with a
//! `Range` request where the registry allows it, else restarted.

use super::registry::{retry, RegistryClient, RegistryError};
use crate::digest::{hex, sha256_hex};
use sha2::{Digest as _, Sha256};
use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

pub struct BlobCache {
    dir: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("digest mismatch for {what}: expected {expected}, the registry sent sha256:{actual} ({size} bytes); nothing was kept: the registry's copy (or a proxy) is corrupt")]
    DigestMismatch { what: String, expected: String, actual: String, size: u64 },
    #[error(
        "size mismatch for {what}: the registry sent more than the {size} bytes its manifest gives; nothing was kept"
    )]
    TooLong { what: String, size: u64 },
    #[error("cannot write {path}: {err}")]
    Write { path: String, err: io::Error },
    #[error("download stopped")]
    Stopped,
}

impl FetchError {
    fn transient(&self) -> Option<Option<Duration>> {
        match self {
            FetchError::Registry(e) => super::registry::transient(e),
            _ => None,
        }
    }
}

/// Removes a temp file unless disarmed.
struct TempFile {
    path: PathBuf,
    armed: bool,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if self.armed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl BlobCache {
    /// The cache under `cache_dir` (`Home::cache_dir()`).
    pub fn new(cache_dir: &Path) -> BlobCache {
        BlobCache { dir: cache_dir.join("blobs").join("sha256") }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn path(&self, hex: &str) -> PathBuf {
        self.dir.join(hex)
    }

    /// A cached blob of the right size.
    pub fn has(&self, hex: &str, size: u64) -> bool {
        std::fs::symlink_metadata(self.path(hex)).is_ok_and(|m| m.is_file() && m.len() == size)
    }

    /// Removes a cached blob found corrupt.
    pub fn evict(&self, hex: &str) {
        let _ = std::fs::remove_file(self.path(hex));
    }

    /// Makes sure the blob `digest` (`sha256:<hex>`, `size` bytes) is cached, downloading
    /// it if needed; `Ok(true)` if it was downloaded. `progress` gets every byte
    /// received (and loses those thrown away on a restart); `stop` ends the download.
    pub fn fetch(
        &self,
        client: &RegistryClient,
        digest: &str,
        size: u64,
        what: &str,
        progress: &AtomicU64,
        stop: &AtomicBool,
    ) -> Result<bool, FetchError> {
        let hex_want = &digest["sha256:".len()..];
        if self.has(hex_want, size) {
            return Ok(false);
        }
        let werr = |path: &Path, err: io::Error| FetchError::Write { path: path.display().to_string(), err };
        std::fs::create_dir_all(&self.dir).map_err(|e| werr(&self.dir, e))?;
        let tmp_path =
            self.dir.join(format!(".tmp-{hex_want}-{}-{}", std::process::id(), crate::sys::fs_at::random_suffix()));
        let mut file =
            std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp_path).map_err(|e| werr(&tmp_path, e))?;
        let mut tmp = TempFile { path: tmp_path, armed: true };
        let mut hasher = Sha256::new();
        let mut written = 0u64;
        let mut buf = vec![0u8; 256 << 10];
        let policy = client.retry.clone();
        retry(&policy, FetchError::transient, || {
            if stop.load(Ordering::Relaxed) {
                return Err(FetchError::Stopped);
            }
            let (mut resp, resumed) = client.blob(digest, written, what)?;
            if written > 0 && !resumed {
                // The registry sent the whole blob again: start over.
                file.set_len(0).and_then(|_| file.rewind()).map_err(|e| werr(&tmp.path, e))?;
                hasher = Sha256::new();
                progress.fetch_sub(written, Ordering::Relaxed);
                written = 0;
            } else if resumed {
                tracing::debug!("resuming {what} at byte {written}");
            }
            loop {
                if stop.load(Ordering::Relaxed) {
                    return Err(FetchError::Stopped);
                }
                let n = match resp.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        return Err(RegistryError::Broken {
                            what: what.to_string(),
                            got: written,
                            cause: super::registry::chain(&e),
                        }
                        .into())
                    }
                };
                if written + n as u64 > size {
                    return Err(FetchError::TooLong { what: what.to_string(), size });
                }
                hasher.update(&buf[..n]);
                file.write_all(&buf[..n]).map_err(|e| werr(&tmp.path, e))?;
                written += n as u64;
                progress.fetch_add(n as u64, Ordering::Relaxed);
            }
            if written < size {
                return Err(RegistryError::Broken {
                    what: what.to_string(),
                    got: written,
                    cause: format!("the connection closed {} bytes early", size - written),
                }
                .into());
            }
            Ok(())
        })?;
        let actual = hex(&hasher.finalize());
        if actual != hex_want {
            return Err(FetchError::DigestMismatch {
                what: what.to_string(),
                expected: digest.to_string(),
                actual,
                size: written,
            });
        }
        file.sync_all().map_err(|e| werr(&tmp.path, e))?;
        drop(file);
        let dest = self.path(hex_want);
        std::fs::rename(&tmp.path, &dest).map_err(|e| werr(&dest, e))?;
        tmp.armed = false;
        Ok(true)
    }

    /// A small blob (a config), from the cache or the registry, verified.
    pub fn fetch_small(
        &self,
        client: &RegistryClient,
        digest: &str,
        size: u64,
        max: u64,
        what: &str,
    ) -> anyhow::Result<Vec<u8>> {
        if size > max {
            anyhow::bail!("{what} is {size} bytes, more than the {max} allowed");
        }
        let hex_want = &digest["sha256:".len()..];
        self.fetch(client, digest, size, what, &AtomicU64::new(0), &AtomicBool::new(false))?;
        let mut bytes = Vec::new();
        std::fs::File::open(self.path(hex_want))
            .and_then(|f| f.take(max + 1).read_to_end(&mut bytes))
            .map_err(|e| anyhow::anyhow!("cannot read the cached {what}: {e}"))?;
        if sha256_hex(&bytes) != hex_want {
            self.evict(hex_want);
            anyhow::bail!("the cached {what} was corrupt (removed it): pull again");
        }
        Ok(bytes)
    }

    /// Temp files of downloads whose process died more than a day ago.
    pub fn clean_stale(&self) {
        let Ok(rd) = std::fs::read_dir(&self.dir) else { return };
        for ent in rd.flatten() {
            let name = ent.file_name();
            if !name.to_string_lossy().starts_with(".tmp-") {
                continue;
            }
            let old = ent
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().unwrap_or_default() > Duration::from_secs(86_400));
            if old {
                let _ = std::fs::remove_file(ent.path());
            }
        }
    }
}
