//! A real registry for pull tests and the pull benchmark: Debian's `docker-registry` (CNCF
//! distribution) on a free 127.0.0.1 port, filled with `skopeo copy` from OCI layouts.
//! Shared by tests/oci_pull.rs (as `common::registry`) and benches/pull.rs (by `#[path]`,
//! with tests/common/digest.rs beside it as `digest`).
#![allow(dead_code)]

use super::digest::sha256_hex;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";

/// Whether `bin` is on PATH.
pub fn have(bin: &str) -> bool {
    std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file())).unwrap_or(false)
}

/// `Ok` when the registry and skopeo are installed, else why not (for `or_skip!`).
pub fn registry_tools() -> Result<(), String> {
    match ["docker-registry", "skopeo"].into_iter().find(|b| !have(b)) {
        None => Ok(()),
        Some(b) => Err(format!("needs {b} (apt-get install docker-registry skopeo; scripts/setup.sh)")),
    }
}

/// An OCI image layout at `dir` tagged `tag`, for the host's architecture, whose one
/// uncompressed layer is the tar file `tar` (moved in as the blob). Digested by coreutils'
/// sha256sum: a rootfs tar is large, and sha2 in a debug build is slow.
pub fn one_layer_layout(tar: &Path, dir: &Path, tag: &str) {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let out = Command::new("sha256sum").arg(tar).output().expect("cannot run sha256sum");
    assert!(out.status.success(), "sha256sum {}: {}", tar.display(), String::from_utf8_lossy(&out.stderr));
    let layer_hex = String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap().to_owned();
    let layer_size = std::fs::metadata(tar).unwrap().len();
    std::fs::rename(tar, blobs.join(&layer_hex)).unwrap();
    let blob = |v: &serde_json::Value, media_type: &str| {
        let bytes = serde_json::to_vec(v).unwrap();
        let hex = sha256_hex(&bytes);
        std::fs::write(blobs.join(&hex), &bytes).unwrap();
        serde_json::json!({"mediaType": media_type, "digest": format!("sha256:{hex}"), "size": bytes.len()})
    };
    let arch = if cfg!(target_arch = "aarch64") { "arm64" } else { "amd64" };
    let layer_digest = format!("sha256:{layer_hex}");
    let config = serde_json::json!({
        "architecture": arch,
        "os": "linux",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    });
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": blob(&config, OCI_CONFIG),
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": layer_size}],
    });
    let mut m = blob(&manifest, OCI_MANIFEST);
    m["annotations"] = serde_json::json!({"org.opencontainers.image.ref.name": tag});
    let index = serde_json::json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [m]});
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `docker-registry serve`, killed when dropped.
pub struct Registry {
    child: Child,
    pub port: u16,
    log: PathBuf,
    storage: PathBuf,
}

impl Registry {
    /// `docker-registry serve` on a free port, storing under `storage`, with `auth`
    /// (YAML under `auth:`, or empty) and an access log (see [`Registry::blob_gets`]).
    pub fn start(work: &Path, tag: &str, storage: &Path, auth: &str) -> Registry {
        Self::start_with(work, tag, storage, auth, "")
    }

    /// [`Registry::start`] with more settings under `http:` (e.g. `tls:`).
    pub fn start_with(work: &Path, tag: &str, storage: &Path, auth: &str, http: &str) -> Registry {
        let auth = if auth.is_empty() { String::new() } else { format!("auth:\n{auth}") };
        let extra =
            format!("validation:\n  manifests:\n    urls:\n      allow:\n        - ^https://example\\.com/\n{auth}");
        Self::spawn(work, tag, storage, "  level: info\n", "  delete:\n    enabled: true\n", http, &extra)
    }

    /// A registry that logs warnings only (no access log), for timings.
    pub fn start_quiet(work: &Path, tag: &str, storage: &Path) -> Registry {
        Self::spawn(work, tag, storage, "  level: warn\n  accesslog:\n    disabled: true\n", "", "", "")
    }

    /// Writes `registry-<tag>.yml` with the given YAML under `log:`, `storage:`, `http:`
    /// and at the top level, starts the registry and waits until it accepts connections.
    fn spawn(work: &Path, tag: &str, storage: &Path, log: &str, store: &str, http: &str, extra: &str) -> Registry {
        let port = free_port();
        let cfg = work.join(format!("registry-{tag}.yml"));
        std::fs::write(
            &cfg,
            format!(
                "version: 0.1\nlog:\n{log}storage:\n  filesystem:\n    rootdirectory: {}\n{store}http:\n  addr: 127.0.0.1:{port}\n  secret: test-secret\n{http}{extra}",
                storage.display()
            ),
        )
        .unwrap();
        let log = work.join(format!("registry-{tag}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("cannot start docker-registry");
        let mut r = Registry { child, port, log, storage: storage.into() };
        let t = Instant::now();
        loop {
            if let Ok(Some(st)) = r.child.try_wait() {
                panic!("docker-registry exited ({st}): {}", r.log_text());
            }
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(15), "docker-registry did not start: {}", r.log_text());
            std::thread::sleep(Duration::from_millis(50));
        }
        r
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Successful GETs of blob `hex` (the access log).
    pub fn blob_gets(&self, hex: &str) -> usize {
        let needle = format!("\"GET /v2/test/img/blobs/sha256:{hex} HTTP/1.1\" 200");
        self.log_text().lines().filter(|l| l.contains(&needle)).count()
    }

    /// `skopeo copy` of layout tag `tag` to `test/img:tag`.
    pub fn push(&self, layout: &Path, tag: &str, extra: &[&str]) {
        let out = Command::new("skopeo")
            .args(["--insecure-policy", "copy", "--all", "--dest-tls-verify=false", "-q"])
            .args(if extra.is_empty() { &["--preserve-digests"][..] } else { extra })
            .arg(format!("oci:{}:{tag}", layout.display()))
            .arg(format!("docker://{}/test/img:{tag}", self.host()))
            .output()
            .unwrap();
        assert!(out.status.success(), "skopeo copy {tag} failed: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// The manifest digest the registry serves for `tag`.
    pub fn digest_of(&self, tag: &str) -> String {
        let c = reqwest::blocking::Client::new();
        let r = c
            .get(format!("http://{}/v2/test/img/manifests/{tag}", self.host()))
            .header(
                "Accept",
                format!("{OCI_MANIFEST}, {OCI_INDEX}, application/vnd.docker.distribution.manifest.v2+json"),
            )
            .send()
            .unwrap();
        assert!(r.status().is_success(), "{tag}: {}", r.status());
        format!("sha256:{}", sha256_hex(r.bytes().unwrap()))
    }

    /// Where the registry keeps blob `hex`.
    pub fn blob_data(&self, hex: &str) -> PathBuf {
        self.storage.join(format!("docker/registry/v2/blobs/sha256/{}/{hex}/data", &hex[..2]))
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
