//! `rootfs pull` against Debian's real `docker-registry` (CNCF distribution) on
//! 127.0.0.1, with images built here as OCI layouts (multi-layer, gzip / zstd / plain
//! layers, whiteouts, an opaque directory, a two-platform index) and pushed with
//! `skopeo copy`; plus Basic (htpasswd) and Bearer (an in-test token server) auth, a
//! flaky proxy for retries and resumption, and `rootfs import` of OCI layouts and
//! `docker save` archives.
//!
//! Tests that need `docker-registry` and `skopeo` are skipped, visibly, when they are
//! missing (scripts/setup.sh installs them; CI has them). The registry harness is
//! tests/common/registry.rs, shared with benches/pull.rs.

mod common;

use azp_sandbox::config::Home;
use azp_sandbox::http::RetryPolicy;
use azp_sandbox::rootfs::oci::{self, PullOptions, PullReport};
use azp_sandbox::rootfs::Store;
use base64::Engine as _;
use common::digest::sha256_hex;
use common::registry::{have, one_layer_layout, registry_tools, Registry, OCI_CONFIG, OCI_INDEX, OCI_MANIFEST};
use common::{skip, TestHome};
use serde_json::json;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MTIME: u64 = 1_600_000_000;
macro_rules! require_registry {
    () => {
        or_skip!(registry_tools())
    };
}

/// A scratch dir for one test, removed at the end unless the test failed.
struct Work(PathBuf);

impl std::ops::Deref for Work {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn work_dir(name: &str) -> Work {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("oci-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Work(d)
}

// ------------------------------------------------------------------ layers and images

#[derive(Clone)]
enum E {
    Dir(String, u32),
    File(String, u32, Vec<u8>),
    Sym(String, String),
    Hard(String, String),
}

fn dir(p: &str, mode: u32) -> E {
    E::Dir(p.into(), mode)
}
fn file(p: &str, mode: u32, data: &[u8]) -> E {
    E::File(p.into(), mode, data.to_vec())
}
fn sym(p: &str, t: &str) -> E {
    E::Sym(p.into(), t.into())
}
fn hard(p: &str, t: &str) -> E {
    E::Hard(p.into(), t.into())
}
/// `.wh.NAME` beside `p`.
fn wh(p: &str) -> E {
    let (d, n) = p.rsplit_once('/').map(|(d, n)| (format!("{d}/"), n)).unwrap_or((String::new(), p));
    file(&format!("{d}.wh.{n}"), 0o644, b"")
}
fn opq(d: &str) -> E {
    file(&format!("{d}/.wh..wh..opq"), 0o644, b"")
}

fn tar_of(entries: &[E]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(MTIME);
        h.set_uid(0);
        h.set_gid(0);
        match e {
            E::Dir(p, m) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(*m);
                h.set_size(0);
                b.append_data(&mut h, format!("{p}/"), std::io::empty()).unwrap();
            }
            E::File(p, m, data) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*m);
                h.set_size(data.len() as u64);
                b.append_data(&mut h, p, &data[..]).unwrap();
            }
            E::Sym(p, t) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                b.append_link(&mut h, p, t).unwrap();
            }
            E::Hard(p, t) => {
                h.set_entry_type(tar::EntryType::Link);
                h.set_mode(0o644);
                h.set_size(0);
                b.append_link(&mut h, p, t).unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Comp {
    Plain,
    Gzip,
    Zstd,
}

fn compress(raw: &[u8], c: Comp) -> Vec<u8> {
    match c {
        Comp::Plain => raw.to_vec(),
        Comp::Gzip => {
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            enc.write_all(raw).unwrap();
            enc.finish().unwrap()
        }
        Comp::Zstd => zstd::encode_all(raw, 3).unwrap(),
    }
}

fn media_type(c: Comp) -> &'static str {
    match c {
        Comp::Plain => "application/vnd.oci.image.layer.v1.tar",
        Comp::Gzip => "application/vnd.oci.image.layer.v1.tar+gzip",
        Comp::Zstd => "application/vnd.oci.image.layer.v1.tar+zstd",
    }
}

/// Pseudo-random bytes (a "binary" big enough to make a blob worth resuming).
fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn layer1() -> Vec<E> {
    vec![
        dir("etc", 0o755),
        file("etc/hostname", 0o644, b"base\n"),
        file("etc/removed", 0o644, b"gone"),
        dir("opt", 0o755),
        dir("opt/keep", 0o700),
        file("opt/keep/a", 0o600, b"a"),
        dir("data", 0o755),
        file("data/old1", 0o644, b"1"),
        dir("data/sub", 0o755),
        file("data/sub/old2", 0o644, b"2"),
        dir("bin", 0o755),
        file("bin/busybox", 0o755, &noise(300_000, 1)),
        sym("bin/sh", "busybox"),
        dir("usr", 0o755),
        dir("usr/bin", 0o755),
        file("usr/bin/tool", 0o4755, b"#!/bin/sh\necho tool\n"),
        hard("usr/bin/tool2", "usr/bin/tool"),
        dir("usr/lib", 0o755),
        sym("lib", "usr/lib"),
        dir("tmp", 0o1777),
    ]
}

fn layer2() -> Vec<E> {
    vec![
        wh("etc/removed"),
        file("etc/hostname", 0o644, b"layer2\n"),
        // Written before the opaque marker: this layer's, kept (with its implicit parent).
        file("data/new", 0o640, b"new"),
        file("data/pre/x", 0o644, b"pre"),
        // This layer's directory: kept, but the lower layer's data/sub/old2 goes.
        dir("data/sub", 0o750),
        opq("data"),
        file("data/sub/fresh", 0o644, b"fresh"),
        wh("opt/keep"),
        sym("etc/link", "hostname"),
        // Through lib -> usr/lib, inside the tree.
        file("lib/libfoo.so", 0o644, b"so"),
    ]
}

fn layer3(marker: &str) -> Vec<E> {
    vec![
        dir("opt/keep", 0o755),
        file("opt/keep/b", 0o644, b"b"),
        file("usr/share/doc/readme", 0o644, b"doc"),
        file("etc/cuda-marker", 0o644, marker.as_bytes()),
    ]
}

fn layer4() -> Vec<E> {
    vec![file("etc/v2", 0o644, b"v2"), file("usr/share/v2-data", 0o644, &noise(50_000, 4))]
}

fn layer5() -> Vec<E> {
    vec![file("corrupt-me", 0o644, &noise(100_000, 5))]
}

#[derive(Debug, PartialEq, Eq, Clone)]
enum Node {
    Dir(u32),
    File(u32, Vec<u8>),
    Sym(String),
}

fn expected_v1(marker: &str) -> BTreeMap<String, Node> {
    let d = |m| Node::Dir(m);
    let f = |m, c: &[u8]| Node::File(m, c.to_vec());
    let s = |t: &str| Node::Sym(t.into());
    [
        ("bin", d(0o755)),
        ("bin/busybox", f(0o755, &noise(300_000, 1))),
        ("bin/sh", s("busybox")),
        ("data", d(0o755)),
        ("data/new", f(0o640, b"new")),
        ("data/pre", d(0o755)),
        ("data/pre/x", f(0o644, b"pre")),
        ("data/sub", d(0o750)),
        ("data/sub/fresh", f(0o644, b"fresh")),
        ("etc", d(0o755)),
        ("etc/cuda-marker", f(0o644, marker.as_bytes())),
        ("etc/hostname", f(0o644, b"layer2\n")),
        // Empty mount targets the store adds when an image lacks them (rootfs::store).
        ("etc/hosts", f(0o644, b"")),
        ("etc/resolv.conf", f(0o644, b"")),
        ("etc/link", s("hostname")),
        ("lib", s("usr/lib")),
        ("opt", d(0o755)),
        ("opt/keep", d(0o755)),
        ("opt/keep/b", f(0o644, b"b")),
        ("tmp", d(0o1777)),
        ("usr", d(0o755)),
        ("usr/bin", d(0o755)),
        ("usr/bin/tool", f(0o4755, b"#!/bin/sh\necho tool\n")),
        ("usr/bin/tool2", f(0o4755, b"#!/bin/sh\necho tool\n")),
        ("usr/lib", d(0o755)),
        ("usr/lib/libfoo.so", f(0o644, b"so")),
        ("usr/share", d(0o755)),
        ("usr/share/doc", d(0o755)),
        ("usr/share/doc/readme", f(0o644, b"doc")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

fn snapshot(root: &Path) -> BTreeMap<String, Node> {
    fn walk(root: &Path, rel: &str, out: &mut BTreeMap<String, Node>) {
        let dir = if rel.is_empty() { root.to_path_buf() } else { root.join(rel) };
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            let r = if rel.is_empty() { name } else { format!("{rel}/{name}") };
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            let mode = m.mode() & 0o7777;
            if m.file_type().is_symlink() {
                out.insert(r, Node::Sym(std::fs::read_link(e.path()).unwrap().to_string_lossy().into_owned()));
            } else if m.is_dir() {
                out.insert(r.clone(), Node::Dir(mode));
                walk(root, &r, out);
            } else {
                // The store's own mount targets (rootfs::store) are not from the image.
                if !matches!(r.as_str(), "etc/hosts" | "etc/resolv.conf") {
                    assert_eq!(m.mtime() as u64, MTIME, "mtime of {r}");
                }
                out.insert(r, Node::File(mode, std::fs::read(e.path()).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, "", &mut out);
    out
}

fn assert_tree(root: &Path, want: &BTreeMap<String, Node>) {
    let got = snapshot(root);
    let short = |n: &Node| match n {
        Node::File(m, c) if c.len() > 40 => format!("File({m:o}, {} bytes, sha256 {})", c.len(), &sha256_hex(c)[..12]),
        Node::File(m, c) => format!("File({m:o}, {:?})", String::from_utf8_lossy(c)),
        Node::Dir(m) => format!("Dir({m:o})"),
        Node::Sym(t) => format!("Sym({t})"),
    };
    let mut diffs = Vec::new();
    for (k, v) in want {
        match got.get(k) {
            None => diffs.push(format!("missing {k}: want {}", short(v))),
            Some(g) if g != v => diffs.push(format!("differs {k}: got {}, want {}", short(g), short(v))),
            _ => {}
        }
    }
    for (k, v) in &got {
        if !want.contains_key(k) {
            diffs.push(format!("extra {k}: {}", short(v)));
        }
    }
    assert!(diffs.is_empty(), "tree {} differs:\n  {}", root.display(), diffs.join("\n  "));
    let (a, b) =
        (std::fs::metadata(root.join("usr/bin/tool")).unwrap(), std::fs::metadata(root.join("usr/bin/tool2")).unwrap());
    assert_eq!(a.ino(), b.ino(), "tool2 is a hard link of tool");
}

struct Blob {
    digest: String,
    size: u64,
}

impl Blob {
    fn hex(&self) -> &str {
        &self.digest[7..]
    }
    fn desc(&self, media_type: &str) -> serde_json::Value {
        json!({"mediaType": media_type, "digest": self.digest, "size": self.size})
    }
}

/// An OCI image layout being written.
struct Layout {
    dir: PathBuf,
    index: Vec<serde_json::Value>,
}

struct Layer {
    blob: Blob,
    comp: Comp,
    raw: Vec<u8>,
    diff_id: String,
}

impl Layer {
    fn desc(&self) -> serde_json::Value {
        self.blob.desc(media_type(self.comp))
    }
}

impl Layout {
    fn new(dir: &Path) -> Layout {
        std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
        std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
        Layout { dir: dir.into(), index: Vec::new() }
    }

    fn blob(&self, bytes: &[u8]) -> Blob {
        let hex = sha256_hex(bytes);
        std::fs::write(self.dir.join("blobs/sha256").join(&hex), bytes).unwrap();
        Blob { digest: format!("sha256:{hex}"), size: bytes.len() as u64 }
    }

    fn layer(&self, entries: &[E], comp: Comp) -> Layer {
        let raw = tar_of(entries);
        let blob = self.blob(&compress(&raw, comp));
        Layer { blob, comp, diff_id: format!("sha256:{}", sha256_hex(&raw)), raw }
    }

    fn config(&self, arch: &str, variant: Option<&str>, env: &[&str], layers: &[&Layer]) -> Blob {
        let mut c = json!({
            "architecture": arch,
            "os": "linux",
            "config": {"Env": env, "Labels": {"org.example.test": "yes"}},
            "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>()},
        });
        if let Some(v) = variant {
            c["variant"] = json!(v);
        }
        self.blob(&serde_json::to_vec(&c).unwrap())
    }

    fn manifest(&self, config: &Blob, layers: &[&Layer]) -> Blob {
        let m = json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": config.desc(OCI_CONFIG),
            "layers": layers.iter().map(|l| l.desc()).collect::<Vec<_>>(),
        });
        self.blob(&serde_json::to_vec(&m).unwrap())
    }

    fn tag(&mut self, tag: &str, b: &Blob, media_type: &str) {
        let mut d = b.desc(media_type);
        d["annotations"] = json!({"org.opencontainers.image.ref.name": tag});
        self.index.push(d);
        let idx = json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": self.index});
        std::fs::write(self.dir.join("index.json"), serde_json::to_vec(&idx).unwrap()).unwrap();
    }
}

/// The host's Go architecture (the marker the default platform's image carries).
fn host_arch() -> &'static str {
    if cfg!(target_arch = "aarch64") {
        "arm64"
    } else {
        "amd64"
    }
}

struct Images {
    layout: PathBuf,
    l: Vec<Layer>,
    /// Manifest digests by tag (the platform manifests of `multi`: `multi-amd64`,
    /// `multi-arm64`).
    manifests: BTreeMap<String, String>,
}

/// v1: [L1 gzip, L2 zstd, L3 plain] amd64, CUDA_VERSION=12.4.1; v2: [L1, L2, L4];
/// multi: an index of v1 (amd64) and [L1, L2, L3(arm64 marker)] (arm64/v8, CUDA 12.2.0);
/// docker: [L1, L4] (gzip only, for Docker's v2s2 format); corrupt: [L1, L5].
fn build_images(dir: &Path) -> Images {
    let mut lay = Layout::new(dir);
    let l = vec![
        lay.layer(&layer1(), Comp::Gzip),
        lay.layer(&layer2(), Comp::Zstd),
        lay.layer(&layer3("amd64"), Comp::Plain),
        lay.layer(&layer4(), Comp::Gzip),
        lay.layer(&layer5(), Comp::Gzip),
        lay.layer(&layer3("arm64"), Comp::Plain),
    ];
    let mut manifests = BTreeMap::new();
    let env = ["PATH=/usr/local/cuda/bin:/usr/bin:/bin", "CUDA_VERSION=12.4.1"];
    let v1_layers = [&l[0], &l[1], &l[2]];
    let c1 = lay.config("amd64", None, &env, &v1_layers);
    let m1 = lay.manifest(&c1, &v1_layers);
    lay.tag("v1", &m1, OCI_MANIFEST);
    manifests.insert("v1".into(), m1.digest.clone());

    let v2_layers = [&l[0], &l[1], &l[3]];
    let c2 = lay.config("amd64", None, &["PATH=/usr/bin:/bin", "V=2"], &v2_layers);
    let m2 = lay.manifest(&c2, &v2_layers);
    lay.tag("v2", &m2, OCI_MANIFEST);
    manifests.insert("v2".into(), m2.digest.clone());

    let arm_layers = [&l[0], &l[1], &l[5]];
    let carm = lay.config("arm64", Some("v8"), &["CUDA_VERSION=12.2.0"], &arm_layers);
    let marm = lay.manifest(&carm, &arm_layers);
    let index = json!({
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [
            {"mediaType": OCI_MANIFEST, "digest": m1.digest, "size": m1.size, "platform": {"os": "linux", "architecture": "amd64"}},
            {"mediaType": OCI_MANIFEST, "digest": marm.digest, "size": marm.size, "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
        ]
    });
    let ib = lay.blob(&serde_json::to_vec(&index).unwrap());
    lay.tag("multi", &ib, OCI_INDEX);
    manifests.insert("multi".into(), ib.digest.clone());
    manifests.insert("multi-amd64".into(), m1.digest.clone());
    manifests.insert("multi-arm64".into(), marm.digest.clone());

    let d_layers = [&l[0], &l[3]];
    let cd = lay.config("amd64", None, &["CUDA_VERSION=11.8.0"], &d_layers);
    let md = lay.manifest(&cd, &d_layers);
    lay.tag("docker", &md, OCI_MANIFEST);

    let x_layers = [&l[0], &l[4]];
    let cx = lay.config("amd64", None, &[], &x_layers);
    let mx = lay.manifest(&cx, &x_layers);
    lay.tag("corrupt", &mx, OCI_MANIFEST);
    Images { layout: dir.into(), l, manifests }
}

// ------------------------------------------------------------------ the registry

fn opts(reference: String, name: &str) -> PullOptions {
    PullOptions {
        reference,
        name: Some(name.into()),
        insecure: true,
        retry: Some(RetryPolicy::fast(3)),
        auth_file: Some(empty_auth_file()),
        ..Default::default()
    }
}

/// An auth file without credentials (tests must not pick up the machine's).
fn empty_auth_file() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("oci-empty-auth.json");
    if !p.exists() {
        let tmp = p.with_extension(format!("{}-{:?}", std::process::id(), std::thread::current().id()));
        std::fs::write(&tmp, b"{\"auths\": {}}").unwrap();
        std::fs::rename(&tmp, &p).unwrap();
    }
    p
}

fn auth_file(dir: &Path, host: &str, user: &str, pass: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let p = dir.join(format!("auth-{}.json", N.fetch_add(1, Ordering::SeqCst)));
    let enc = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
    std::fs::write(&p, json!({"auths": {host: {"auth": enc}}}).to_string()).unwrap();
    p
}

fn store_of(h: &TestHome) -> Store {
    Store::new(&Home::new(&h.dir))
}

fn cache_of(h: &TestHome) -> PathBuf {
    Home::new(&h.dir).cache_dir()
}

fn pull(h: &TestHome, o: &PullOptions) -> anyhow::Result<PullReport> {
    oci::pull(&store_of(h), &cache_of(h), o)
}

/// Nothing of a failed import: no temp dirs in the store, no temp files in the cache.
fn assert_no_leftovers(h: &TestHome) {
    let store = Home::new(&h.dir).rootfs_dir();
    let left: Vec<_> = std::fs::read_dir(&store)
        .map(|r| r.flatten().map(|e| e.file_name()).filter(|n| n.to_string_lossy().starts_with('.')).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "temp dirs left in the store: {left:?}");
    let blobs = cache_of(h).join("blobs/sha256");
    let tmp: Vec<_> = std::fs::read_dir(&blobs)
        .map(|r| r.flatten().map(|e| e.file_name()).filter(|n| n.to_string_lossy().starts_with(".tmp")).collect())
        .unwrap_or_default();
    assert!(tmp.is_empty(), "temp files left in the blob cache: {tmp:?}");
}

// ------------------------------------------------------------------ tests: pulls

#[test]
fn pull_multi_layer_image_with_whiteouts_via_cli() {
    require_registry!();
    let work = work_dir("cli");
    let img = build_images(&work.join("layout"));
    let reg = Registry::start(&work, "open", &work.join("storage"), "");
    reg.push(&img.layout, "v1", &[]);
    let h = TestHome::new("oci-cli");
    let reference = format!("{}/test/img:v1", reg.host());
    let auth = empty_auth_file();
    let out = h.run(&["rootfs", "pull", &reference, "--insecure", "--auth-file", auth.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "pull failed: {stderr}");
    // Default name: REPO-TAG; one summary line.
    let list = store_of(&h).list().unwrap();
    assert_eq!(list.len(), 1);
    let info = &list[0];
    assert_eq!(info.name, "test-img-v1");
    assert_tree(&info.path, &expected_v1("amd64"));
    let digest = reg.digest_of("v1");
    assert_eq!(info.sha256.as_deref(), Some(&digest[7..]), "sha256 is the manifest digest");
    assert_eq!(info.source, format!("{reference}@{digest}"));
    assert_eq!(info.cuda_version.as_deref(), Some("12.4.1"), "from CUDA_VERSION in the config");
    assert_eq!(info.arch.as_deref(), Some("x86_64"), "from the config");
    let total: u64 =
        expected_v1("amd64").values().map(|n| if let Node::File(_, c) = n { c.len() as u64 } else { 0 }).sum();
    let tool = b"#!/bin/sh\necho tool\n".len() as u64;
    assert_eq!(info.size_bytes, total - tool, "bytes of files, hard links once");
    // The image's entries: the store's two mount targets are not among them.
    assert_eq!(info.entries, expected_v1("amd64").len() as u64 - 2);
    assert!(stderr.contains("pulled rootfs 'test-img-v1' from"), "{stderr}");
    assert!(stderr.contains("3 layers (4 downloaded, 0 cached"), "{stderr}");
    // `rootfs list` shows the CUDA version; pulling the same name again is refused
    // before anything is downloaded.
    let listed = h.ok(&["rootfs", "list"]);
    assert!(listed.contains("test-img-v1") && listed.contains("12.4.1"), "{listed}");
    let out = h.run(&["rootfs", "pull", &reference, "--insecure"]);
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "azp-sandbox: error: rootfs 'test-img-v1' already exists: remove it with `azp-sandbox rootfs rm test-img-v1` first"
    );
}

#[test]
fn second_tag_downloads_only_new_blobs() {
    require_registry!();
    let work = work_dir("share");
    let img = build_images(&work.join("layout"));
    let reg = Registry::start(&work, "open", &work.join("storage"), "");
    reg.push(&img.layout, "v1", &[]);
    reg.push(&img.layout, "v2", &[]);
    let h = TestHome::new("oci-share");
    let r1 = pull(&h, &opts(format!("{}/test/img:v1", reg.host()), "one")).unwrap();
    assert_eq!((r1.layers, r1.downloaded_blobs, r1.cached_blobs), (3, 4, 0));
    let r2 = pull(&h, &opts(format!("{}/test/img:v2", reg.host()), "two")).unwrap();
    assert_eq!((r2.layers, r2.downloaded_blobs, r2.cached_blobs), (3, 2, 2), "only L4 and the v2 config are new");
    assert_eq!(r2.blob_requests, 2, "two blob GETs: L4 and the v2 config");
    for (i, l) in img.l.iter().enumerate().take(4) {
        assert_eq!(reg.blob_gets(l.blob.hex()), 1, "layer L{} downloaded exactly once:\n{}", i + 1, reg.log_text());
    }
    // v2's tree: L1 + L2 + L4.
    let two = store_of(&h).lease("two").unwrap();
    let t = two.path();
    assert_eq!(std::fs::read(t.join("etc/v2")).unwrap(), b"v2");
    assert!(!t.join("usr/share/doc").exists() && !t.join("etc/cuda-marker").exists(), "no L3 in v2");
    assert_eq!(std::fs::read(t.join("etc/hostname")).unwrap(), b"layer2\n");
    assert_eq!(two.info().cuda_version, None);
    // A third pull of v1 under another name: nothing downloaded at all.
    let before = reg.log_text().matches("GET /v2/test/img/blobs/").count();
    let r3 = pull(&h, &opts(format!("{}/test/img:v1", reg.host()), "three")).unwrap();
    assert_eq!((r3.downloaded_blobs, r3.cached_blobs, r3.downloaded_bytes), (0, 4, 0));
    assert_eq!(reg.log_text().matches("GET /v2/test/img/blobs/").count(), before);
    assert_tree(store_of(&h).lease("three").unwrap().path(), &expected_v1("amd64"));
    // By digest, too.
    let d = reg.digest_of("v1");
    let r4 = pull(&h, &opts(format!("{}/test/img@{d}", reg.host()), "four")).unwrap();
    assert_eq!(r4.manifest_digest, d);
    assert_eq!(r4.info.source, format!("{}/test/img@{d}", reg.host()));
    assert!(
        r4.summary("pulled")
            .contains(&format!(" from {}/test/img@{d}: 3 layers (0 downloaded, 4 cached, 0.0 MB)", reg.host())),
        "{}",
        r4.summary("pulled")
    );
}

#[test]
fn index_platform_selection() {
    require_registry!();
    let work = work_dir("platform");
    let img = build_images(&work.join("layout"));
    let reg = Registry::start(&work, "open", &work.join("storage"), "");
    reg.push(&img.layout, "multi", &[]);
    let h = TestHome::new("oci-platform");
    let reference = format!("{}/test/img:multi", reg.host());
    let host = pull(&h, &opts(reference.clone(), "host")).unwrap();
    let want = img.manifests[&format!("multi-{}", host_arch())].clone();
    assert_eq!(host.manifest_digest, want, "the host's platform ({})", host_arch());
    assert_eq!(host.platform.as_deref(), Some(if host_arch() == "arm64" { "linux/arm64/v8" } else { "linux/amd64" }));
    assert_tree(&host.info.path, &expected_v1(host_arch()));

    let mut o = opts(reference.clone(), "arm");
    o.platform = Some("linux/arm64".into());
    let arm = pull(&h, &o).unwrap();
    assert_eq!(arm.manifest_digest, img.manifests["multi-arm64"]);
    assert_tree(&arm.info.path, &expected_v1("arm64"));
    assert_eq!(arm.info.arch.as_deref(), Some("aarch64"));
    assert_eq!(arm.info.cuda_version.as_deref(), Some("12.2.0"));
    assert_eq!(arm.info.source, format!("127.0.0.1:{}/test/img:multi@{}", reg.port, img.manifests["multi-arm64"]));

    let mut o = opts(reference.clone(), "ppc");
    o.platform = Some("linux/ppc64le".into());
    let e = format!("{:#}", pull(&h, &o).unwrap_err());
    assert_eq!(
        e,
        format!("{reference} has no image for platform linux/ppc64le (available: linux/amd64, linux/arm64/v8); choose one with --platform")
            .replace(&reference, &format!("127.0.0.1:{}/test/img:multi", reg.port))
    );
    assert!(store_of(&h).lease("ppc").is_err());
}

#[test]
fn docker_v2s2_manifests() {
    require_registry!();
    let work = work_dir("v2s2");
    let img = build_images(&work.join("layout"));
    let reg = Registry::start(&work, "open", &work.join("storage"), "");
    reg.push(&img.layout, "docker", &["--format", "v2s2"]);
    // The registry now serves Docker's media types.
    let c = reqwest::blocking::Client::new();
    let m: serde_json::Value = c
        .get(format!("http://{}/v2/test/img/manifests/docker", reg.host()))
        .header("Accept", "application/vnd.docker.distribution.manifest.v2+json")
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(m["mediaType"], "application/vnd.docker.distribution.manifest.v2+json");
    assert_eq!(m["layers"][0]["mediaType"], "application/vnd.docker.image.rootfs.diff.tar.gzip");
    let h = TestHome::new("oci-v2s2");
    let r = pull(&h, &opts(format!("{}/test/img:docker", reg.host()), "d")).unwrap();
    let t = &r.info.path;
    assert_eq!(std::fs::read(t.join("etc/hostname")).unwrap(), b"base\n");
    assert_eq!(std::fs::read(t.join("etc/v2")).unwrap(), b"v2");
    assert_eq!(std::fs::read(t.join("bin/busybox")).unwrap(), noise(300_000, 1));
    assert_eq!(r.info.cuda_version.as_deref(), Some("11.8.0"));
}

#[test]
fn corrupt_blob_is_a_digest_mismatch_and_nothing_is_kept() {
    require_registry!();
    let work = work_dir("corrupt");
    let img = build_images(&work.join("layout"));
    let reg = Registry::start(&work, "open", &work.join("storage"), "");
    reg.push(&img.layout, "corrupt", &[]);
    let l5 = &img.l[4];
    let data = reg.blob_data(l5.blob.hex());
    let mut bytes = std::fs::read(&data).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&data, &bytes).unwrap();

    let h = TestHome::new("oci-corrupt");
    let e = format!("{:#}", pull(&h, &opts(format!("{}/test/img:corrupt", reg.host()), "bad")).unwrap_err());
    assert!(
        e.starts_with(&format!(
            "digest mismatch for layer 2/2 (sha256:{}) of 127.0.0.1:{}/test/img:corrupt@sha256:",
            &l5.blob.hex()[..12],
            reg.port
        )),
        "{e}"
    );
    assert!(
        e.contains(&format!("expected {}, the registry sent sha256:{}", l5.blob.digest, sha256_hex(&bytes))),
        "{e}"
    );
    assert!(e.contains("nothing was kept"), "{e}");
    assert!(store_of(&h).list().unwrap().is_empty());
    assert!(!cache_of(&h).join("blobs/sha256").join(l5.blob.hex()).exists(), "the bad blob is not cached");
    assert_no_leftovers(&h);
    // Same through the CLI: one line.
    let out = h.run(&["rootfs", "pull", &format!("{}/test/img:corrupt", reg.host()), "--insecure"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125));
    let errs: Vec<&str> = stderr.lines().filter(|l| l.starts_with("azp-sandbox: error:")).collect();
    assert_eq!(errs.len(), 1, "{stderr}");
    assert!(errs[0].contains("digest mismatch for layer 2/2"), "{stderr}");
    assert_no_leftovers(&h);
}

/// Uploads a blob in one piece; returns its digest.
fn put_blob(reg: &Registry, data: &[u8]) -> String {
    let c = reqwest::blocking::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let r = c.post(format!("http://{}/v2/test/img/blobs/uploads/", reg.host())).send().unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let loc = r.headers()["location"].to_str().unwrap().to_string();
    let loc = if loc.starts_with("http") { loc } else { format!("http://{}{loc}", reg.host()) };
    let digest = format!("sha256:{}", sha256_hex(data));
    let sep = if loc.contains('?') { '&' } else { '?' };
    let r = c.put(format!("{loc}{sep}digest={digest}")).body(data.to_vec()).send().unwrap();
    assert_eq!(r.status().as_u16(), 201, "blob upload");
    digest
}

/// PUTs a manifest straight to the registry (what skopeo would not push).
fn put_manifest(reg: &Registry, tag: &str, manifest: &serde_json::Value) {
    let c = reqwest::blocking::Client::new();
    let r = c
        .put(format!("http://{}/v2/test/img/manifests/{tag}", reg.host()))
        .header("Content-Type", OCI_MANIFEST)
        .body(serde_json::to_vec(manifest).unwrap())
        .send()
        .unwrap();
    let st = r.status();
    assert!(st.is_success(), "PUT manifest {tag}: {st} {}", r.text().unwrap_or_default());
}

#[test]
fn unknown_repo_tag_and_unsupported_media_type() {
    require_registry!();
    let work = work_dir("errors");
    let img = build_images(&work.join("layout"));
    let reg = Registry::start(&work, "open", &work.join("storage"), "");
    reg.push(&img.layout, "v1", &[]);
    reg.push(&img.layout, "v2", &[]);
    let h = TestHome::new("oci-errors");
    let err = |reference: String| -> String {
        let out =
            h.run(&["rootfs", "pull", &reference, "--insecure", "--auth-file", empty_auth_file().to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(125), "{reference}");
        let s = String::from_utf8_lossy(&out.stderr).into_owned();
        let errs: Vec<&str> = s.lines().filter(|l| l.starts_with("azp-sandbox: error: ")).collect();
        assert_eq!(errs.len(), 1, "one error line: {s}");
        errs[0]["azp-sandbox: error: ".len()..].to_string()
    };
    let host = reg.host();
    assert_eq!(
        err(format!("{host}/test/img:nope")),
        format!("tag 'nope' not found in {host}/test/img (404 MANIFEST_UNKNOWN); available tags: v1, v2")
    );
    assert_eq!(
        err(format!("{host}/test/nope:v1")),
        format!("repository 'test/nope' not found on {host} (404 NAME_UNKNOWN): check the name")
    );
    let missing = format!("sha256:{}", "0".repeat(64));
    assert!(err(format!("{host}/test/img@{missing}"))
        .starts_with(&format!("manifest {missing} not found in {host}/test/img (404 MANIFEST_UNKNOWN)")));
    assert!(err("Bad/Name".into())
        .starts_with("invalid image reference 'Bad/Name': repository 'Bad/Name' must be lowercase"));
    assert!(err(format!("{host}/test/img:v1 --platform")).starts_with("invalid image reference"));

    // A foreign (non-distributable) layer, as Windows base images have: refused before
    // any layer is downloaded.
    let c1 = &img.l[0];
    let v1: serde_json::Value = reqwest::blocking::Client::new()
        .get(format!("http://{host}/v2/test/img/manifests/v1"))
        .header("Accept", OCI_MANIFEST)
        .send()
        .unwrap()
        .json()
        .unwrap();
    let foreign_blob = put_blob(&reg, b"not in here");
    let foreign = json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": v1["config"],
        "layers": [
            c1.desc(),
            {"mediaType": "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip", "digest": foreign_blob, "size": 11, "urls": ["https://example.com/layer.tar.gz"]},
        ]
    });
    put_manifest(&reg, "foreign", &foreign);
    let before = reg.blob_gets(c1.blob.hex());
    let e = err(format!("{host}/test/img:foreign"));
    assert!(
        e.starts_with(&format!("unsupported media type 'application/vnd.oci.image.layer.nondistributable.v1.tar+gzip' for layer 2/2 ({}) of {host}/test/img:foreign@sha256:", &foreign_blob[..19])),
        "{e}"
    );
    assert!(e.ends_with("(a non-distributable (foreign) layer, whose content is not in the registry): only tar layers (uncompressed, gzip or zstd) can be applied"), "{e}");
    assert_eq!(reg.blob_gets(c1.blob.hex()), before, "no layer downloaded");
    // A layer format we cannot read.
    let mut xz = foreign.clone();
    xz["layers"][1] = json!({"mediaType": "application/vnd.oci.image.layer.v1.tar+xz", "digest": c1.blob.digest, "size": c1.blob.size});
    put_manifest(&reg, "xz", &xz);
    assert!(err(format!("{host}/test/img:xz"))
        .starts_with("unsupported media type 'application/vnd.oci.image.layer.v1.tar+xz' for layer 2/2"));
    assert!(store_of(&h).list().unwrap().is_empty());
    assert_no_leftovers(&h);
}

// ------------------------------------------------------------------ tests: auth

#[test]
fn basic_auth_with_htpasswd() {
    require_registry!();
    if !have("htpasswd") {
        return skip("needs htpasswd (apt-get install apache2-utils)");
    }
    let work = work_dir("basic");
    let img = build_images(&work.join("layout"));
    let storage = work.join("storage");
    let open = Registry::start(&work, "open", &storage, "");
    open.push(&img.layout, "v1", &[]);
    let pw = work.join("htpasswd");
    let st = Command::new("htpasswd").args(["-Bbc"]).arg(&pw).args(["alice", "s3cret"]).output().unwrap();
    assert!(st.status.success());
    let reg = Registry::start(
        &work,
        "basic",
        &storage,
        &format!("  htpasswd:\n    realm: basic-realm\n    path: {}\n", pw.display()),
    );
    let h = TestHome::new("oci-basic");
    let reference = format!("{}/test/img:v1", reg.host());

    let e = format!("{:#}", pull(&h, &opts(reference.clone(), "anon")).unwrap_err());
    assert!(
        e.starts_with(&format!("authentication to {} failed (HTTP 401, Basic authentication required): the repository test/img does not exist, or it needs credentials: add them for {} to a Docker config.json", reg.host(), reg.host())),
        "{e}"
    );
    let mut o = opts(reference.clone(), "wrong");
    o.auth_file = Some(auth_file(&work, &reg.host(), "alice", "wrong"));
    let e = format!("{:#}", pull(&h, &o).unwrap_err());
    assert!(e.starts_with(&format!("authentication to {} failed (HTTP 401", reg.host())), "{e}");
    assert!(e.contains("the credentials of 'alice' for") && e.contains("were refused"), "{e}");
    assert!(!e.contains("wrong"), "never the password: {e}");

    let mut o = opts(reference.clone(), "ok");
    o.auth_file = Some(auth_file(&work, &reg.host(), "alice", "s3cret"));
    let r = pull(&h, &o).unwrap();
    assert_tree(&r.info.path, &expected_v1("amd64"));
    // $REGISTRY_AUTH_FILE through the CLI.
    let out = h
        .command()
        .args(["rootfs", "pull", &reference, "--insecure", "--name", "env"])
        .env("REGISTRY_AUTH_FILE", auth_file(&work, &reg.host(), "alice", "s3cret"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_no_leftovers(&h);
}

/// A token server for the registry's `auth.token`: RS256 JWTs signed with `openssl`,
/// the certificate in `x5c`; grants the requested scope to alice:s3cret only.
struct TokenServer {
    server: Arc<tiny_http::Server>,
    port: u16,
    requests: Arc<Mutex<Vec<(bool, String)>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TokenServer {
    fn start(dir: &Path) -> TokenServer {
        let key = dir.join("token.key");
        let cert = dir.join("token.pem");
        let out = Command::new("openssl")
            .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-token"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .unwrap();
        assert!(out.status.success(), "openssl req: {}", String::from_utf8_lossy(&out.stderr));
        let pem = std::fs::read_to_string(&cert).unwrap();
        let der_b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").unwrap());
        let port = server.server_addr().to_ip().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (s, reqs) = (server.clone(), requests.clone());
        let thread = std::thread::spawn(move || {
            for req in s.incoming_requests() {
                let url = reqwest::Url::parse(&format!("http://x{}", req.url())).unwrap();
                let q: BTreeMap<String, String> = url.query_pairs().into_owned().collect();
                let auth =
                    req.headers().iter().find(|h| h.field.equiv("Authorization")).map(|h| h.value.as_str().to_string());
                let good = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("alice:s3cret"));
                let ok = auth.as_deref() == Some(good.as_str());
                reqs.lock().unwrap().push((auth.is_some(), q.get("scope").cloned().unwrap_or_default()));
                if !ok || q.get("service").map(String::as_str) != Some("test-registry") {
                    let _ = req.respond(
                        tiny_http::Response::from_string(
                            r#"{"errors":[{"code":"UNAUTHORIZED","message":"bad credentials"}]}"#,
                        )
                        .with_status_code(401),
                    );
                    continue;
                }
                let scope = q.get("scope").cloned().unwrap_or_default();
                let mut parts = scope.splitn(3, ':');
                let (ty, name, actions) =
                    (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
                let claims = json!({
                    "iss": "test-issuer", "sub": "alice", "aud": "test-registry",
                    "exp": now + 600, "nbf": now - 10, "iat": now - 10, "jti": format!("{now}-{}", reqs.lock().unwrap().len()),
                    "access": [{"type": ty, "name": name, "actions": actions.split(',').collect::<Vec<_>>()}],
                });
                let header = json!({"typ": "JWT", "alg": "RS256", "x5c": [der_b64]});
                let b64 = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
                let input = format!("{}.{}", b64(header.to_string().as_bytes()), b64(claims.to_string().as_bytes()));
                let mut child = Command::new("openssl")
                    .args(["dgst", "-sha256", "-sign"])
                    .arg(&key)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .spawn()
                    .unwrap();
                child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
                let sig = child.wait_with_output().unwrap().stdout;
                let token = format!("{input}.{}", b64(&sig));
                let _ = req
                    .respond(tiny_http::Response::from_string(json!({"token": token, "expires_in": 600}).to_string()));
            }
        });
        TokenServer { server, port, requests, thread: Some(thread) }
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn bearer_token_flow() {
    require_registry!();
    if !have("openssl") {
        return skip("needs openssl to sign tokens");
    }
    let work = work_dir("token");
    let img = build_images(&work.join("layout"));
    let storage = work.join("storage");
    let open = Registry::start(&work, "open", &storage, "");
    open.push(&img.layout, "v1", &[]);
    let tokens = TokenServer::start(&work);
    let reg = Registry::start(
        &work,
        "token",
        &storage,
        &format!(
            "  token:\n    realm: http://127.0.0.1:{}/token\n    service: test-registry\n    issuer: test-issuer\n    rootcertbundle: {}\n",
            tokens.port,
            work.join("token.pem").display()
        ),
    );
    let h = TestHome::new("oci-token");
    let reference = format!("{}/test/img:v1", reg.host());
    let e = format!("{:#}", pull(&h, &opts(reference.clone(), "anon")).unwrap_err());
    assert!(
        e.starts_with(&format!("authentication to {} failed (the token server http://127.0.0.1:{} answered HTTP 401 (UNAUTHORIZED: bad credentials))", reg.host(), tokens.port)),
        "{e}"
    );
    let mut o = opts(reference.clone(), "ok");
    o.auth_file = Some(auth_file(&work, &reg.host(), "alice", "s3cret"));
    let r = pull(&h, &o).unwrap();
    assert_tree(&r.info.path, &expected_v1("amd64"));
    let reqs = tokens.requests.lock().unwrap().clone();
    assert!(reqs.iter().any(|(with_creds, scope)| *with_creds && scope == "repository:test/img:pull"), "{reqs:?}");
    // One token serves the manifest and every blob.
    assert_eq!(reqs.iter().filter(|(c, _)| *c).count(), 1, "{reqs:?}");
    assert!(reg.log_text().contains("\"GET /v2/test/img/manifests/v1 HTTP/1.1\" 200"));
    assert_no_leftovers(&h);
}

fn openssl(args: &[&str], dir: &Path) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().unwrap();
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn https_registry_with_a_private_ca() {
    require_registry!();
    if !have("openssl") {
        return skip("needs openssl to make certificates");
    }
    let work = work_dir("tls");
    let img = build_images(&work.join("layout"));
    let subj_ca = "/CN=azp-sandbox test CA";
    openssl(
        &[
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", subj_ca,
        ],
        &work,
    );
    openssl(
        &["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "leaf.key", "-out", "leaf.csr", "-subj", "/CN=127.0.0.1"],
        &work,
    );
    std::fs::write(
        work.join("leaf.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        &[
            "x509",
            "-req",
            "-in",
            "leaf.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "leaf.pem",
            "-days",
            "2",
            "-extfile",
            "leaf.ext",
        ],
        &work,
    );
    let tls = format!(
        "  tls:\n    certificate: {}\n    key: {}\n",
        work.join("leaf.pem").display(),
        work.join("leaf.key").display()
    );
    let reg = Registry::start_with(&work, "tls", &work.join("storage"), "", &tls);
    reg.push(&img.layout, "v1", &[]);
    let h = TestHome::new("oci-tls");
    let reference = format!("{}/test/img:v1", reg.host());
    let auth = empty_auth_file();
    let pull_cli = |name: &str, ca: Option<&Path>| {
        let mut c = h.command();
        c.args(["rootfs", "pull", &reference, "--name", name, "--auth-file", auth.to_str().unwrap()]);
        match ca {
            Some(p) => c.env("SSL_CERT_FILE", p),
            None => c.env_remove("SSL_CERT_FILE"),
        };
        c.output().unwrap()
    };
    let t = Instant::now();
    let out = pull_cli("untrusted", None);
    // Retried, it would take 15 s at least (backoff 1+2+4+8 s); a busy machine's start-up
    // and handshake stay well under 12.
    assert!(t.elapsed() < Duration::from_secs(12), "a certificate error is not retried: {:?}", t.elapsed());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(e.contains(&format!("azp-sandbox: error: cannot reach registry {}: ", reg.host())), "{e}");
    assert!(
        e.contains("certificate")
            && e.contains(&format!("/etc/docker/certs.d/{}/ca.crt or point SSL_CERT_FILE at it", reg.host())),
        "{e}"
    );
    let out = pull_cli("trusted", Some(&work.join("ca.pem")));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_tree(store_of(&h).lease("trusted").unwrap().path(), &expected_v1("amd64"));
    assert_no_leftovers(&h);
}

// ------------------------------------------------------------------ tests: retries

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Act {
    Pass,
    Fail503,
    Truncate,
}

/// (path, Range header, action) of every request a [`Proxy`] saw.
type ProxyLog = Arc<Mutex<Vec<(String, Option<String>, Act)>>>;

/// A one-connection-per-request HTTP proxy in front of the registry that can fail or cut
/// short the answers to chosen requests.
struct Proxy {
    port: u16,
    /// (path, Range header, action) of every request.
    log: ProxyLog,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    fn start(upstream: String, plan: impl Fn(&str, usize) -> Act + Send + 'static) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (log2, stop2) = (log.clone(), stop.clone());
        std::thread::spawn(move || {
            let http =
                reqwest::blocking::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
            let seen: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());
            for conn in l.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(mut conn) = conn else { continue };
                let mut rd = BufReader::new(conn.try_clone().unwrap());
                let mut first = String::new();
                if rd.read_line(&mut first).is_err() {
                    continue;
                }
                let path = first.split_whitespace().nth(1).unwrap_or("/").to_string();
                let mut headers = Vec::new();
                loop {
                    let mut line = String::new();
                    if rd.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some((k, v)) = line.trim_end().split_once(':') {
                        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
                    }
                }
                let n = {
                    let mut s = seen.lock().unwrap();
                    let c = s.entry(path.clone()).or_insert(0);
                    *c += 1;
                    *c
                };
                let act = plan(&path, n);
                let range = headers.iter().find(|(k, _)| k == "range").map(|(_, v)| v.clone());
                log2.lock().unwrap().push((path.clone(), range, act));
                if act == Act::Fail503 {
                    let _ = conn.write_all(
                        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                    continue;
                }
                let mut req = http.get(format!("http://{upstream}{path}"));
                for (k, v) in &headers {
                    if matches!(k.as_str(), "accept" | "authorization" | "range") {
                        req = req.header(k.as_str(), v.as_str());
                    }
                }
                let Ok(resp) = req.send() else { continue };
                let status = resp.status();
                let mut head = format!("HTTP/1.1 {} {}\r\n", status.as_u16(), status.canonical_reason().unwrap_or(""));
                for (k, v) in resp.headers() {
                    if matches!(
                        k.as_str(),
                        "content-type" | "docker-content-digest" | "content-range" | "www-authenticate" | "location"
                    ) {
                        head.push_str(&format!("{k}: {}\r\n", v.to_str().unwrap_or("")));
                    }
                }
                let body = resp.bytes().unwrap_or_default();
                head.push_str(&format!("Content-Length: {}\r\nConnection: close\r\n\r\n", body.len()));
                let _ = conn.write_all(head.as_bytes());
                let send = if act == Act::Truncate { &body[..body.len() / 2] } else { &body[..] };
                let _ = conn.write_all(send);
                let _ = conn.flush();
                let _ = conn.shutdown(std::net::Shutdown::Both);
            }
        });
        Proxy { port, log, stop }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

#[test]
fn retries_transient_failures_and_resumes_with_range() {
    require_registry!();
    let work = work_dir("retry");
    let img = build_images(&work.join("layout"));
    let reg = Registry::start(&work, "open", &work.join("storage"), "");
    reg.push(&img.layout, "v1", &[]);
    let l1 = format!("/v2/test/img/blobs/{}", img.l[0].blob.digest);
    let manifest = "/v2/test/img/manifests/v1".to_string();
    let (l1c, mc) = (l1.clone(), manifest.clone());
    let proxy = Proxy::start(reg.host(), move |path, n| {
        if (path == mc || path == l1c) && n == 1 {
            Act::Fail503
        } else if path == l1c && n == 2 {
            Act::Truncate
        } else {
            Act::Pass
        }
    });
    let h = TestHome::new("oci-retry");
    let mut o = opts(format!("127.0.0.1:{}/test/img:v1", proxy.port), "r");
    o.retry = Some(RetryPolicy::fast(4));
    let r = pull(&h, &o).unwrap();
    assert_tree(&r.info.path, &expected_v1("amd64"));
    let log = proxy.log.lock().unwrap().clone();
    let l1_reqs: Vec<_> = log.iter().filter(|(p, _, _)| *p == l1).collect();
    assert_eq!(l1_reqs.len(), 3, "{log:?}");
    assert_eq!(l1_reqs[0].1, None);
    assert_eq!(l1_reqs[1].1, None);
    let half = img.l[0].blob.size / 2;
    assert_eq!(
        l1_reqs[2].1.as_deref(),
        Some(format!("bytes={half}-").as_str()),
        "resumed where the cut-off answer ended"
    );
    assert_eq!(log.iter().filter(|(p, _, _)| *p == manifest).count(), 2, "the manifest GET was retried");
    assert_eq!(r.downloaded_blobs, 4);
    // A registry that keeps failing: a clear error once the retries are spent.
    let proxy2 = Proxy::start(reg.host(), |_, _| Act::Fail503);
    let mut o = opts(format!("127.0.0.1:{}/test/img:v1", proxy2.port), "r2");
    o.retry = Some(RetryPolicy::fast(2));
    let e = format!("{:#}", pull(&h, &o).unwrap_err());
    assert_eq!(
        e,
        format!(
            "registry 127.0.0.1:{} answered HTTP 503 to the manifest 127.0.0.1:{}/test/img:v1",
            proxy2.port, proxy2.port
        )
    );
    assert_eq!(proxy2.log.lock().unwrap().len(), 2);
}

// ------------------------------------------------------------------ tests: local images

/// A tar of `dir`'s contents (what `skopeo copy ... oci-archive:` writes).
fn tar_dir(dir: &Path, out: &Path) {
    let f = std::fs::File::create(out).unwrap();
    let mut b = tar::Builder::new(f);
    b.append_dir_all(".", dir).unwrap();
    b.finish().unwrap();
}

/// A tree with hard links reports one size however it reaches the store: as `rootfs
/// build` records it (`rootfs::tree_size` of the built tree), imported from a tar,
/// imported as an OCI layout, pulled from a registry. A hard-linked file takes its space
/// once, so it counts once.
#[test]
fn a_tree_with_hard_links_reports_one_size_built_imported_or_pulled() {
    let work = work_dir("sizes");
    let tree = work.join("tree");
    std::fs::create_dir_all(tree.join("usr/bin")).unwrap();
    std::fs::write(tree.join("usr/bin/perl"), noise(300_000, 7)).unwrap();
    std::fs::hard_link(tree.join("usr/bin/perl"), tree.join("usr/bin/perl5.36.0")).unwrap();
    std::fs::write(tree.join("usr/bin/other"), b"#!/bin/sh\n").unwrap();
    std::os::unix::fs::symlink("usr/bin", tree.join("bin")).unwrap();
    let (_, built) = azp_sandbox::rootfs::tree_size(&tree);
    assert_eq!(built, 300_000 + 10, "the hard-linked file counts once");

    let h = TestHome::new("oci-sizes");
    let size_of = |name: &str| store_of(&h).lease(name).unwrap().info().size_bytes;
    // GNU tar keeps the hard link as a link entry.
    let tarred = work.join("tree.tar");
    let st = Command::new("tar").arg("-C").arg(&tree).arg("-cf").arg(&tarred).arg(".").status().unwrap();
    assert!(st.success());
    h.ok(&["rootfs", "import", tarred.to_str().unwrap(), "--name", "from-tar"]);
    assert_eq!(size_of("from-tar"), built, "imported from a tar");
    let layout = work.join("layout");
    one_layer_layout(&tarred, &layout, "v1");
    h.ok(&["rootfs", "import", &format!("{}:v1", layout.display()), "--name", "from-layout"]);
    assert_eq!(size_of("from-layout"), built, "imported as an OCI layout");
    let t = store_of(&h).lease("from-layout").unwrap().info().path.clone();
    let perl = std::fs::metadata(t.join("usr/bin/perl")).unwrap();
    assert_eq!(perl.nlink(), 2, "the link survived the trip");

    if let Err(why) = registry_tools() {
        return common::skip_part(format!("the pull from a registry: {why}"));
    }
    let reg = Registry::start(&work, "sizes", &work.join("storage"), "");
    reg.push(&layout, "v1", &[]);
    pull(&h, &opts(format!("{}/test/img:v1", reg.host()), "pulled")).unwrap();
    assert_eq!(size_of("pulled"), built, "pulled from a registry");
}

#[test]
fn import_oci_layout_dir_and_archive() {
    let work = work_dir("layout");
    let img = build_images(&work.join("layout"));
    let h = TestHome::new("oci-layout");
    let layout = img.layout.to_str().unwrap().to_string();
    // Several images and no REF: a clear error naming them.
    let out = h.run(&["rootfs", "import", &layout, "--name", "x"]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        e.trim(),
        format!("azp-sandbox: error: {layout} holds 5 images (refs: v1, v2, multi, docker, corrupt): pick one with PATH:REF")
    );
    h.ok(&["rootfs", "import", &format!("{layout}:v1"), "--name", "dir-v1"]);
    let store = store_of(&h);
    let info = store.lease("dir-v1").unwrap().info().clone();
    assert_tree(&info.path, &expected_v1("amd64"));
    assert_eq!(info.sha256.as_deref(), Some(&img.manifests["v1"][7..]));
    assert_eq!(info.source, format!("{layout}:v1 (OCI image layout, ref v1) @{}", img.manifests["v1"]));
    assert_eq!(info.cuda_version.as_deref(), Some("12.4.1"));
    // An index: the platform is chosen as for a pull.
    h.ok(&["rootfs", "import", &format!("{layout}:multi"), "--name", "dir-multi"]);
    assert_eq!(
        store.lease("dir-multi").unwrap().info().sha256.as_deref(),
        Some(&img.manifests[&format!("multi-{}", host_arch())][7..])
    );
    let e = h.run(&["rootfs", "import", &format!("{layout}:nope"), "--name", "y"]);
    assert!(String::from_utf8_lossy(&e.stderr)
        .contains("no image named 'nope' in the layout (refs: v1, v2, multi, docker, corrupt)"));

    // The same layout as a tar (oci-archive), read in place.
    let ar = work.join("image.oci.tar");
    tar_dir(&img.layout, &ar);
    let ar_s = ar.to_str().unwrap();
    h.ok(&["rootfs", "import", &format!("{ar_s}:v1"), "--name", "ar-v1"]);
    let info = store.lease("ar-v1").unwrap().info().clone();
    assert_tree(&info.path, &expected_v1("amd64"));
    assert!(info.source.contains("(OCI image archive, ref v1)"), "{}", info.source);

    // A corrupt blob in the layout: digest mismatch, nothing kept.
    let bad = work.join("bad-layout");
    tar_dir(&img.layout, &work.join("copy.tar"));
    std::fs::create_dir_all(&bad).unwrap();
    tar::Archive::new(std::fs::File::open(work.join("copy.tar")).unwrap()).unpack(&bad).unwrap();
    let l3 = bad.join("blobs/sha256").join(img.l[2].blob.hex());
    let mut b = std::fs::read(&l3).unwrap();
    let n = b.len();
    b[n - 2000] ^= 0x55;
    std::fs::write(&l3, &b).unwrap();
    let out = h.run(&["rootfs", "import", &format!("{}:v1", bad.display()), "--name", "bad"]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("digest mismatch for layer 3/3"), "{e}");
    assert!(store.lease("bad").is_err());
    assert_no_leftovers(&h);

    // A foreign layer in a layout.
    let fl = Layout::new(&work.join("foreign"));
    let l = fl.layer(&layer1(), Comp::Gzip);
    let c = fl.config("amd64", None, &[], &[&l]);
    let m = json!({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": c.desc(OCI_CONFIG),
        "layers": [l.blob.desc("application/vnd.docker.image.rootfs.foreign.diff.tar.gzip")],
    });
    let mb = fl.blob(&serde_json::to_vec(&m).unwrap());
    let mut fl = fl;
    fl.tag("f", &mb, OCI_MANIFEST);
    let out = h.run(&["rootfs", "import", work.join("foreign").to_str().unwrap(), "--name", "f"]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("unsupported media type 'application/vnd.docker.image.rootfs.foreign.diff.tar.gzip' for layer 1/1"),
        "{e}"
    );
    // A directory that is not a layout.
    let out = h.run(&["rootfs", "import", work.to_str().unwrap(), "--name", "d"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("is a directory, not an OCI image layout"));
    assert_no_leftovers(&h);
}

#[test]
fn import_docker_save_archive() {
    let work = work_dir("save");
    let lay = Layout::new(&work.join("scratch"));
    let layers = [
        lay.layer(&layer1(), Comp::Plain),
        lay.layer(&layer2(), Comp::Plain),
        lay.layer(&layer3("amd64"), Comp::Plain),
    ];
    let diff_ids: Vec<String> = layers.iter().chain([&layers[2]]).map(|l| l.diff_id.clone()).collect();
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["CUDA_VERSION=12.1.1"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .unwrap();
    let cfg_hex = sha256_hex(&config);
    // Classic `docker save`: <id>/layer.tar, a symlink for a repeated layer.
    let ids: Vec<String> = (0..4).map(|i| sha256_hex(format!("layer-id-{i}").as_bytes())).collect();
    let ar = work.join("saved.tar");
    let mut b = tar::Builder::new(std::fs::File::create(&ar).unwrap());
    let add = |b: &mut tar::Builder<std::fs::File>, path: &str, data: &[u8]| {
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(MTIME);
        b.append_data(&mut h, path, data).unwrap();
    };
    for (i, l) in layers.iter().enumerate() {
        add(&mut b, &format!("{}/VERSION", ids[i]), b"1.0");
        add(&mut b, &format!("{}/json", ids[i]), b"{}");
        add(&mut b, &format!("{}/layer.tar", ids[i]), &l.raw);
    }
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    h.set_mode(0o777);
    b.append_link(&mut h, format!("{}/layer.tar", ids[3]), format!("../{}/layer.tar", ids[2])).unwrap();
    add(&mut b, &format!("{cfg_hex}.json"), &config);
    let manifest = json!([{
        "Config": format!("{cfg_hex}.json"),
        "RepoTags": ["example/cuda:12.1"],
        "Layers": ids.iter().map(|i| format!("{i}/layer.tar")).collect::<Vec<_>>(),
    }]);
    add(&mut b, "manifest.json", manifest.to_string().as_bytes());
    add(&mut b, "repositories", br#"{"example/cuda":{"12.1":"x"}}"#);
    b.finish().unwrap();
    drop(b);

    let h = TestHome::new("oci-save");
    h.ok(&["rootfs", "import", ar.to_str().unwrap(), "--name", "saved"]);
    let info = store_of(&h).lease("saved").unwrap().info().clone();
    assert_tree(&info.path, &expected_v1("amd64"));
    assert_eq!(info.cuda_version.as_deref(), Some("12.1.1"));
    assert_eq!(info.sha256.as_deref(), Some(cfg_hex.as_str()), "the image ID");
    assert_eq!(info.source, format!("{} (docker save archive, example/cuda:12.1) @sha256:{cfg_hex}", ar.display()));
    assert_eq!(info.arch.as_deref(), Some("x86_64"));
    // By tag.
    h.ok(&["rootfs", "import", &format!("{}:12.1", ar.display()), "--name", "saved2"]);
    let out = h.run(&["rootfs", "import", &format!("{}:nope", ar.display()), "--name", "saved3"]);
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("no image tagged 'nope' in the archive (tags: example/cuda:12.1)"));
    // A compressed one is recognised and refused with what to do.
    let gz = work.join("saved.tar.gz");
    std::fs::write(&gz, compress(&std::fs::read(&ar).unwrap(), Comp::Gzip)).unwrap();
    let out = h.run(&["rootfs", "import", gz.to_str().unwrap(), "--name", "gz"]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("is a compressed image archive (tar+gzip): decompress it first"), "{e}");
    // A layer whose content does not match its diff ID.
    let mut bytes = std::fs::read(&ar).unwrap();
    let pos = bytes.windows(5).position(|w| w == b"fresh").unwrap();
    bytes[pos] = b'F';
    let bad = work.join("bad.tar");
    std::fs::write(&bad, &bytes).unwrap();
    let out = h.run(&["rootfs", "import", bad.to_str().unwrap(), "--name", "bad"]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains(&format!("digest mismatch for layer 2/4 ({}/layer.tar)", ids[1])), "{e}");
    assert!(store_of(&h).lease("bad").is_err());
    // A plain rootfs tarball is still imported as one.
    let plain = work.join("plain.tar");
    std::fs::write(&plain, tar_of(&layer1())).unwrap();
    h.ok(&["rootfs", "import", plain.to_str().unwrap(), "--name", "plain"]);
    assert!(store_of(&h).lease("plain").unwrap().path().join("etc/removed").exists());
    assert_no_leftovers(&h);
}
