//! The agent package cache: `<home>/cache/agent/<version>/` holds one unpacked Azure
//! Pipelines agent (`config.sh`, `run.sh`, `bin/`, `externals/`), shared read-only by
//! all slots (it becomes a lower overlay layer of every job).
//!
//! * A version is downloaded and unpacked at most once: the work runs under an
//!   exclusive `flock` of `<cache>/agent/.lock` (threads and processes alike), and the
//!   version dir appears by an atomic rename of `<version>.tmp-<pid>`, so a version dir
//!   that exists is complete.
//! * The server's `hashValue` is checked when given (SHA-256 hex, MD5 base64 and the
//!   other two spellings are accepted: which one the service sends is unconfirmed); a
//!   mismatch keeps nothing.
//! * A repeated [`PackageCache::ensure_latest`] (after `run.sh` exit code 4) costs one
//!   GET of the package list when nothing changed.
//! * Unpacking uses the rootfs module's safe extractor ([`crate::rootfs::unpack`]): no
//!   entry can land outside the temp dir, whatever the archive holds. Files get the
//!   extracting user as owner (not the archive's uids) and no device nodes.

use crate::azure::{self, AzureClient, AzureError};
use crate::digest::hex;
use crate::progress::Progress;
use anyhow::{bail, Context, Result};
use base64::Engine as _;
use md5::Md5;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{BufReader, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// An unpacked agent, ready to be a lower layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentPackage {
    /// "4.252.0", or `sha256-<12 hex>` for a local package whose name has no version.
    pub version: String,
    /// Contains `config.sh`, `run.sh`, `bin/...`: `<layer>/azp/agent`.
    pub dir: PathBuf,
    /// The overlay lower layer holding the package at [`AGENT_SUBDIR`] (overlayfs merges
    /// layers at their roots, so the package is stored one level down).
    pub layer: PathBuf,
}

/// Where the package sits inside its layer (and so inside the sandbox: `/azp/agent`).
pub const AGENT_SUBDIR: &str = "azp/agent";

#[derive(Debug, Clone)]
pub struct PackageCache {
    dir: PathBuf,
}

impl PackageCache {
    /// The cache of `home`: `home.cache_dir()/agent`.
    pub fn new(home: &crate::config::Home) -> PackageCache {
        PackageCache { dir: home.cache_dir().join("agent") }
    }

    /// A cache in `dir` (tests).
    pub fn at(dir: impl Into<PathBuf>) -> PackageCache {
        PackageCache { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The unpacked `version`, if present and complete.
    pub fn cached(&self, version: &str) -> Option<AgentPackage> {
        let layer = self.dir.join(version);
        let dir = layer.join(AGENT_SUBDIR);
        is_agent_dir(&dir).then(|| AgentPackage { version: version.to_owned(), dir, layer })
    }

    /// Versions present, oldest first (numeric order; hash-named ones first).
    pub fn cached_versions(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.dir)
            .map(|r| r.flatten().filter_map(|e| e.file_name().into_string().ok()).collect())
            .unwrap_or_default();
        v.retain(|n| {
            !n.starts_with('.')
                && !n.contains(".tmp-")
                && !n.contains(".download-")
                && is_agent_dir(&self.dir.join(n).join(AGENT_SUBDIR))
        });
        v.sort_by_key(|n| version_key(n));
        v
    }

    /// Makes sure the newest package for `platform` is unpacked; downloads it only if
    /// this version is not in the cache yet. Always asks the server (one GET).
    pub fn ensure_latest(&self, client: &AzureClient, platform: &str) -> Result<AgentPackage> {
        let info = client.agent_package(platform)?;
        let version = info.version.to_string();
        if let Some(p) = self.cached(&version) {
            tracing::debug!("agent package {version} is up to date in {}", p.dir.display());
            return Ok(p);
        }
        let _lock = self.lock()?;
        if let Some(p) = self.cached(&version) {
            return Ok(p); // another slot or process got it while we waited
        }
        self.clean_stale();
        let dl = TempFile(self.dir.join(format!("{version}.download-{}", std::process::id())));
        let started = Instant::now();
        let mut progress = Progress::new(&format!("downloading agent package {version}"));
        let digests = azure::with_retry(client.retry_policy(), || {
            let f = File::create(&dl.0)
                .map_err(|e| AzureError::Write { url: dl.0.display().to_string(), cause: e.to_string() })?;
            let mut w = HashingWriter::new(f);
            client.download(&info.download_url, &mut w, &mut |n| progress.update(n))?;
            Ok(w.finish())
        })
        .map_err(|e| anyhow::anyhow!("cannot download agent package {version}: {e}"))?;
        progress.finish();
        let verified = match info.hash_value.as_deref().map(str::trim).filter(|h| !h.is_empty()) {
            Some(expected) => {
                verify_hash(expected, &digests)?;
                "hash verified"
            }
            None => {
                tracing::warn!("the server gave no hash for agent package {version}: not verified");
                "no hash given"
            }
        };
        let pkg = self.install(&version, &dl.0)?;
        log_ready(&pkg, &digests, started, Some(verified));
        Ok(pkg)
    }

    /// Makes sure the package in `source` is unpacked: a local `.tar.gz` file, or an
    /// http(s) URL (air-gapped sites: a mirror). The version comes from the file name
    /// (`vsts-agent-linux-x64-4.252.0.tar.gz` -> `4.252.0`), else it is
    /// `sha256-<first 12 hex digits of the file>`. No hash to verify against.
    pub fn ensure_from(&self, source: &str) -> Result<AgentPackage> {
        if source.starts_with("http://") || source.starts_with("https://") {
            return self.ensure_from_url(source);
        }
        let path = Path::new(source.strip_prefix("file://").unwrap_or(source));
        let meta = std::fs::metadata(path)
            .with_context(|| format!("cannot read agent package {}: check --agent-package", path.display()))?;
        if !meta.is_file() {
            bail!("agent package {} is not a file: give the .tar.gz of the agent to --agent-package", path.display());
        }
        let name_version = path.file_name().and_then(|n| n.to_str()).and_then(version_from_filename);
        let version = match name_version {
            Some(v) => v,
            None => {
                let mut f =
                    File::open(path).with_context(|| format!("cannot read agent package {}", path.display()))?;
                let mut w = HashingWriter::new(std::io::sink());
                std::io::copy(&mut f, &mut w)
                    .with_context(|| format!("cannot read agent package {}", path.display()))?;
                hash_version(&w.finish())
            }
        };
        if let Some(p) = self.cached(&version) {
            return Ok(p);
        }
        let _lock = self.lock()?;
        if let Some(p) = self.cached(&version) {
            return Ok(p);
        }
        self.clean_stale();
        let pkg = self.install(&version, path)?;
        tracing::info!("agent package {version} ready in {} (from {})", pkg.dir.display(), path.display());
        Ok(pkg)
    }

    fn ensure_from_url(&self, url: &str) -> Result<AgentPackage> {
        let name = url.split(['?', '#']).next().unwrap_or("").rsplit('/').next().unwrap_or("");
        let name_version = version_from_filename(name);
        if let Some(p) = name_version.as_deref().and_then(|v| self.cached(v)) {
            return Ok(p);
        }
        let _lock = self.lock()?;
        if let Some(p) = name_version.as_deref().and_then(|v| self.cached(v)) {
            return Ok(p);
        }
        self.clean_stale();
        let dl = TempFile(self.dir.join(format!(".url.download-{}", std::process::id())));
        let started = Instant::now();
        let mut progress = Progress::new("downloading agent package");
        let digests = azure::with_retry(&azure::RetryPolicy::default(), || {
            let f = File::create(&dl.0)
                .map_err(|e| AzureError::Write { url: dl.0.display().to_string(), cause: e.to_string() })?;
            let mut w = HashingWriter::new(f);
            azure::download_public(url, &mut w, &mut |n| progress.update(n))?;
            Ok(w.finish())
        })
        .map_err(|e| anyhow::anyhow!("cannot download the agent package given with --agent-package: {e}"))?;
        progress.finish();
        let version = name_version.unwrap_or_else(|| hash_version(&digests));
        if let Some(p) = self.cached(&version) {
            return Ok(p);
        }
        let pkg = self.install(&version, &dl.0)?;
        log_ready(&pkg, &digests, started, None);
        Ok(pkg)
    }

    /// Unpacks `archive` as `version` (the lock is held): into `<version>.tmp-<pid>`,
    /// checked, then renamed into place.
    fn install(&self, version: &str, archive: &Path) -> Result<AgentPackage> {
        let tmp = TempDir(self.dir.join(format!("{version}.tmp-{}", std::process::id())));
        let _ = std::fs::remove_dir_all(&tmp.0);
        std::fs::create_dir(&tmp.0).with_context(|| {
            format!("cannot create {}: check free space and permissions of the home", tmp.0.display())
        })?;
        set_mode(&tmp.0, 0o755)?;
        let target = tmp.0.join(AGENT_SUBDIR);
        std::fs::create_dir_all(&target).with_context(|| format!("cannot create {}", target.display()))?;
        set_mode(&tmp.0.join("azp"), 0o755)?;
        let f = File::open(archive).with_context(|| format!("cannot read {}", archive.display()))?;
        let gz = flate2::read::MultiGzDecoder::new(BufReader::with_capacity(1 << 20, f));
        let opts = crate::rootfs::UnpackOptions { same_owner: false, create_devices: false, ..Default::default() };
        crate::rootfs::unpack(BufReader::with_capacity(1 << 20, gz), &target, &opts).with_context(|| {
            format!("cannot unpack agent package {version}: is it a .tar.gz of the Azure Pipelines agent?")
        })?;
        // The archive may have given its top dir other modes; slots must traverse it.
        set_mode(&target, 0o755)?;
        if !is_agent_dir(&target) {
            bail!(
                "agent package {version} has no config.sh and run.sh at its top: not an Azure Pipelines agent package"
            );
        }
        let dest = self.dir.join(version);
        if dest.exists() {
            // Incomplete (a version dir without the scripts): replace it.
            std::fs::remove_dir_all(&dest).with_context(|| format!("cannot remove the broken {}", dest.display()))?;
        }
        std::fs::rename(&tmp.0, &dest)
            .with_context(|| format!("cannot rename {} to {}", tmp.0.display(), dest.display()))?;
        std::mem::forget(tmp);
        Ok(AgentPackage { version: version.to_owned(), dir: dest.join(AGENT_SUBDIR), layer: dest })
    }

    /// Creates the cache dir and takes its lock (blocking).
    fn lock(&self) -> Result<DirLock> {
        std::fs::create_dir_all(&self.dir).with_context(|| {
            format!("cannot create {}: check --home / AZP_SANDBOX_HOME and free space", self.dir.display())
        })?;
        set_mode(&self.dir, 0o755)?;
        let path = self.dir.join(".lock");
        let f = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        crate::sys::fs_at::flock(f.as_fd(), libc::LOCK_EX)
            .with_context(|| format!("cannot lock {}", path.display()))?;
        Ok(DirLock(f))
    }

    /// Leftovers of a crashed download or unpack (only called with the lock held, so
    /// none of them is in use).
    fn clean_stale(&self) {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.contains(".tmp-") || name.contains(".download-") {
                tracing::debug!("removing stale {}", e.path().display());
                let _ =
                    if e.path().is_dir() { std::fs::remove_dir_all(e.path()) } else { std::fs::remove_file(e.path()) };
            }
        }
    }
}

fn is_agent_dir(dir: &Path) -> bool {
    dir.join("config.sh").is_file() && dir.join("run.sh").is_file()
}

fn set_mode(p: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set permissions on {}", p.display()))
}

/// `vsts-agent-linux-x64-4.252.0.tar.gz` -> `4.252.0`: the last `-`-separated part of
/// the name, when it is dotted digits.
pub fn version_from_filename(name: &str) -> Option<String> {
    let stem = name.strip_suffix(".tar.gz").or_else(|| name.strip_suffix(".tgz"))?;
    let v = stem.rsplit('-').next()?;
    let ok = !v.is_empty()
        && v.split('.').count() >= 2
        && v.split('.').all(|p| !p.is_empty() && p.len() <= 9 && p.bytes().all(|b| b.is_ascii_digit()));
    ok.then(|| v.to_owned())
}

fn hash_version(d: &Digests) -> String {
    format!("sha256-{}", &hex(&d.sha256)[..12])
}

/// Sort key: numeric versions by their numbers, after hash-named ones.
fn version_key(v: &str) -> (bool, Vec<u64>, String) {
    let nums: Option<Vec<u64>> = v.split('.').map(|p| p.parse().ok()).collect();
    match nums {
        Some(n) => (true, n, String::new()),
        None => (false, vec![], v.to_owned()),
    }
}

/// SHA-256 and MD5 of what was written.
#[derive(Debug, Clone)]
pub(crate) struct Digests {
    pub sha256: [u8; 32],
    pub md5: [u8; 16],
    pub bytes: u64,
}

struct HashingWriter<W: Write> {
    inner: W,
    sha: Sha256,
    md5: Md5,
    bytes: u64,
}

impl<W: Write> HashingWriter<W> {
    fn new(inner: W) -> Self {
        HashingWriter { inner, sha: Sha256::new(), md5: Md5::new(), bytes: 0 }
    }
    fn finish(self) -> Digests {
        Digests { sha256: self.sha.finalize().into(), md5: self.md5.finalize().into(), bytes: self.bytes }
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.sha.update(&buf[..n]);
        self.md5.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// "agent package V ready in DIR: N MB downloaded in T s[, how it was verified] (sha256 H)".
fn log_ready(pkg: &AgentPackage, digests: &Digests, started: Instant, verified: Option<&str>) {
    tracing::info!(
        "agent package {} ready in {}: {:.1} MB downloaded in {:.1}s{} (sha256 {})",
        pkg.version,
        pkg.dir.display(),
        digests.bytes as f64 / 1e6,
        started.elapsed().as_secs_f64(),
        verified.map(|v| format!(", {v}")).unwrap_or_default(),
        hex(&digests.sha256)
    );
}

/// Checks `expected` (the server's `hashValue`) against the digests: SHA-256 or MD5, hex
/// (any case) or base64.
pub(crate) fn verify_hash(expected: &str, d: &Digests) -> Result<()> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let (sha_hex, md5_hex) = (hex(&d.sha256), hex(&d.md5));
    let (sha_b64, md5_b64) = (b64.encode(d.sha256), b64.encode(d.md5));
    let e = expected.trim();
    if e.eq_ignore_ascii_case(&sha_hex) || e.eq_ignore_ascii_case(&md5_hex) || e == sha_b64 || e == md5_b64 {
        return Ok(());
    }
    // Show ours in the form theirs seems to be.
    let got = match e.len() {
        24 => format!("md5 {md5_b64}"),
        32 => format!("md5 {md5_hex}"),
        44 => format!("sha256 {sha_b64}"),
        _ => format!("sha256 {sha_hex}"),
    };
    bail!("agent package hash mismatch (expected {e}, got {got}): download corrupted; nothing was kept")
}

struct DirLock(#[allow(dead_code)] File);

/// Removed on drop (a download that is not needed any more, or failed).
struct TempFile(PathBuf);
impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Removed on drop unless forgotten (an unpack that failed).
struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digests(data: &[u8]) -> Digests {
        let mut w = HashingWriter::new(Vec::new());
        w.write_all(data).unwrap();
        let d = w.finish();
        assert_eq!(d.bytes, data.len() as u64);
        d
    }

    #[test]
    fn hashes_in_all_spellings() {
        let d = digests(b"hello");
        // Known digests of "hello".
        let sha = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";
        let md5_b64 = "XUFAKrxLKna5cZ2REBfFkg==";
        for ok in [
            sha,
            &sha.to_uppercase(),
            md5_b64,
            "5d41402abc4b2a76b9719d911017c592",
            "LPJNul+wow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ=",
        ] {
            verify_hash(ok, &d).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        let e = verify_hash(&"0".repeat(64), &d).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "agent package hash mismatch (expected {}, got sha256 {sha}): download corrupted; nothing was kept",
                "0".repeat(64)
            )
        );
        let e = verify_hash("AAAAAAAAAAAAAAAAAAAAAA==", &d).unwrap_err().to_string();
        assert!(e.contains(&format!("got md5 {md5_b64}")), "{e}");
    }

    #[test]
    fn versions_from_names() {
        assert_eq!(version_from_filename("vsts-agent-linux-x64-4.252.0.tar.gz").as_deref(), Some("4.252.0"));
        assert_eq!(version_from_filename("pipelines-agent-linux-arm64-3.248.0.tgz").as_deref(), Some("3.248.0"));
        for none in [
            "agent.tar.gz",
            "vsts-agent-linux-x64-4.252.0.zip",
            "x-4..2.tar.gz",
            "x-4.tar.gz",
            "x-4.2a.tar.gz",
            "-.tar.gz",
        ] {
            assert_eq!(version_from_filename(none), None, "{none}");
        }
    }

    #[test]
    fn version_order() {
        let mut v = vec!["4.10.0", "4.9.1", "sha256-abc", "3.248.0"];
        v.sort_by_key(|n| version_key(n));
        assert_eq!(v, ["sha256-abc", "3.248.0", "4.9.1", "4.10.0"]);
    }
}
