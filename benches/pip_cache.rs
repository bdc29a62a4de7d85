//! The pip half of the caches benchmark (issue 24): a job that `pip install`s a few
//! hundred MB of wheels (scripts/fixtures/pip-index.sh: numpy, scipy, pandas, pyarrow,
//! opencv, polars, numba... and their dependencies) from a PEP 503 simple index served by
//! busybox httpd in the network lab's fake internet, into a fresh venv, as:
//! - cold: no cache (every wheel crosses the network);
//! - warm: the pip cache committed by an earlier trusted job, this job trusted too
//!   (`--cache pip:/cache/pip:commit`: its commit is in its time);
//! - warm read-only: the same snapshot, a pull request's job (`--cache pip:/cache/pip`:
//!   its writes are thrown away);
//!
//! and the same three with the venv itself as the cache (`/opt/venv`: what is installed
//! stays installed; pip only checks the requirements). Interleaved rounds, the order
//! rotating round by round; medians.
//!
//! `sudo cargo bench --bench pip_cache` (AZP_BENCH_ROUNDS=N, default 3; ~15 min on 2
//! cores). Needs `target/fixtures/pip-index` (scripts/fixtures/pip-index.sh, from PyPI
//! once) and `target/fixtures/debian-bookworm-agent-python.tar.zst`
//! (scripts/fixtures/python-rootfs.sh, debootstrap once); skips visibly without them.
//! Writes target/bench-results/pip_cache.md.

#[path = "../tests/common/netlab.rs"]
mod netlab;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

const PORT: u16 = 8096;
/// The top-level requirements (the index holds them and their dependencies).
const PKGS: &str = "numpy==1.26.4 scipy==1.11.4 pandas==2.1.4 scikit-learn==1.3.2 matplotlib==3.8.2 \
    pyarrow==14.0.2 sympy==1.12 opencv-python-headless==4.8.1.78 polars==0.20.3 numba==0.58.1 scikit-image==0.22.0";

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Cold,
    Warm,
    WarmReadOnly,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Cold => "cold (no cache)",
            Kind::Warm => "warm (trusted: commits)",
            Kind::WarmReadOnly => "warm read-only (pull request)",
        }
    }
}

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: the pip cache benchmark needs root (network lab, sandboxes)");
        return;
    }
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rounds: usize = std::env::var("AZP_BENCH_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(3);
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_azp-sandbox"));
    let fixtures = repo.join("target/fixtures");
    let rootfs = fixtures.join("debian-bookworm-agent-python.tar.zst");
    let index = fixtures.join("pip-index");
    for (need, how) in [(&rootfs, "scripts/fixtures/python-rootfs.sh"), (&index, "scripts/fixtures/pip-index.sh")] {
        if !need.exists() {
            eprintln!("SKIPPED: {} is absent (make it once with {how})", need.display());
            return;
        }
    }
    let wheels_mb = dir_bytes(&index.join("wheels")) as f64 / 1e6;
    let wheels = std::fs::read_dir(index.join("wheels")).map(|r| r.count()).unwrap_or(0);

    let work = PathBuf::from("/var/tmp/azp-bench-pip-cache");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let home_dir = work.join("home");
    let azp = |args: &[&str]| {
        let st = Command::new(&bin).arg("--home").arg(&home_dir).args(args).status().unwrap();
        assert!(st.success(), "azp-sandbox {args:?}");
    };
    azp(&["-q", "rootfs", "import", rootfs.to_str().unwrap(), "--name", "py"]);

    let lab = netlab::NetLab::new().expect("the bench's network lab");
    let mut httpd = Command::new("ip")
        .args(["netns", "exec", &lab.internet, "busybox", "httpd", "-f", "-p"])
        .arg(format!("{}:{PORT}", netlab::INTERNET_IP))
        .arg("-h")
        .arg(&index)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    lab.enter_host();
    let (ip, url) = (netlab::INTERNET_IP, format!("http://{}:{PORT}/simple/", netlab::INTERNET_IP));

    // venv: false: the pip cache (wheels) at /cache/pip, a fresh venv per job; true: the
    // venv itself is the cache, at /opt/venv.
    let job = |kind: Kind, venv: bool| -> (f64, f64) {
        let mut c = Command::new(&bin);
        c.arg("--home").arg(&home_dir).args(["-q", "exec", "--rootfs", "py", "--memory", "8G"]);
        let (name, path) = if venv { ("venv", "/opt/venv") } else { ("pip", "/cache/pip") };
        match kind {
            Kind::Cold => {}
            Kind::Warm => {
                c.arg("--cache").arg(format!("{name}:{path}:commit"));
            }
            Kind::WarmReadOnly => {
                c.arg("--cache").arg(format!("{name}:{path}"));
            }
        }
        let venv_dir = if venv { "/opt/venv" } else { "/tmp/venv" };
        c.args(["--env", "PIP_CACHE_DIR=/cache/pip", "--", "sh", "-c"]).arg(format!(
            "set -e; [ -x {venv_dir}/bin/pip ] || python3 -m venv {venv_dir}; \
             s=$(date +%s%N); {venv_dir}/bin/pip install -q --disable-pip-version-check --no-input \
             --index-url {url} --trusted-host {ip} {PKGS}; e=$(date +%s%N); echo pip_ms=$(( (e - s) / 1000000 )); \
             {venv_dir}/bin/python -c 'import numpy, scipy, pandas, pyarrow, cv2, polars; print(\"imports-ok\")'"
        ));
        let t = Instant::now();
        let out = c.output().unwrap();
        let wall = t.elapsed().as_secs_f64();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("imports-ok"),
            "job failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let pip_ms: f64 = text.lines().find_map(|l| l.strip_prefix("pip_ms=")).unwrap().trim().parse().unwrap();
        (wall, pip_ms / 1e3)
    };
    let kinds = [Kind::Cold, Kind::Warm, Kind::WarmReadOnly];
    let mut md = format!(
        "### pip cache (`pip install` of {wheels} wheels, {wheels_mb:.0} MB, from a simple index over HTTP in the network lab; \
         median of {rounds} interleaved rounds; `cargo bench --bench pip_cache`)\n\n\
         | job | cache | `pip install` in the job | whole job (sandbox + venv + install + commit) | cold / this (job) |\n\
         |---|---|---|---|---|\n"
    );
    for venv in [false, true] {
        // The cache's first commit: a trusted job's (not measured).
        let t = Instant::now();
        job(Kind::Warm, venv);
        eprintln!(
            "{}: first trusted job (fills the cache) {:.1} s",
            if venv { "venv" } else { "pip" },
            t.elapsed().as_secs_f64()
        );
        let mut got: Vec<Vec<(f64, f64)>> = vec![vec![]; 3];
        for r in 0..rounds {
            for k in 0..3 {
                let i = (k + r) % 3;
                got[i].push(job(kinds[i], venv));
            }
            eprintln!(
                "round {r}: {}",
                kinds
                    .iter()
                    .zip(&got)
                    .map(|(k, g)| format!("{} {:.1} s", k.name(), g[r].0))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        let med = |v: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| {
            let mut x: Vec<f64> = v.iter().map(f).collect();
            x.sort_by(|a, b| a.partial_cmp(b).unwrap());
            // An even count: the mean of the middle two.
            (x[(x.len() - 1) / 2] + x[x.len() / 2]) / 2.0
        };
        let cold = med(&got[0], |x| x.0);
        let what = if venv { "the venv (`/opt/venv`)" } else { "pip's cache (`PIP_CACHE_DIR`), a fresh venv" };
        for (k, g) in kinds.iter().zip(&got) {
            let (w, p) = (med(g, |x| x.0), med(g, |x| x.1));
            md.push_str(&format!("| {} | {what} | {p:.1} s | {w:.1} s | **{:.1}x** |\n", k.name(), cold / w));
        }
    }
    md.push_str(
        "\nWarm and warm read-only jobs see the same committed snapshot; the read-only one's writes are thrown \
         away with it. The lab's link is a veth pair (no bandwidth limit): a cold job's download is as fast as \
         this machine's loopback, so the pip-cache rows show what is left of `pip install` without downloads \
         (unpacking and byte-compiling), and the venv rows what a cache of the installed environment saves.\n",
    );
    print!("{md}");
    let _ = httpd.kill();
    let _ = httpd.wait();
    let out = repo.join("target/bench-results");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("pip_cache.md"), md).unwrap();
    let _ = Command::new(&bin).arg("--home").arg(&home_dir).args(["-q", "gc"]).status();
    let _ = std::fs::remove_dir_all(&work);
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir).map(|r| r.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum()).unwrap_or(0)
}
