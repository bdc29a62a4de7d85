//! One sandbox cycle (`exec -- /bin/true`: gc, overlay, spec, create/start/wait/delete,
//! teardown) against `runc run` (and `podman run --rm` when installed) on the same
//! busybox rootfs, in the same run. Prints medians and ratios.
//!
//! `cargo bench --bench sandbox_cycle` (root). AZP_BENCH_RUNS=N changes the sample size
//! (default 30).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn p95(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[(v.len() * 95 / 100).min(v.len() - 1)]
}

fn time_runs(n: usize, mut f: impl FnMut(usize)) -> Vec<Duration> {
    f(usize::MAX); // warm-up
    (0..n)
        .map(|i| {
            let t = Instant::now();
            f(i);
            t.elapsed()
        })
        .collect()
}

fn ok(cmd: &mut Command) {
    let st = cmd.stdout(Stdio::null()).status().expect("cannot run");
    assert!(st.success(), "{cmd:?} failed: {st}");
}

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: the sandbox benchmark needs root");
        return;
    }
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let runs: usize = std::env::var("AZP_BENCH_RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(30);
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_azp-sandbox"));
    let work = repo.join("target/bench-sandbox");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let tar = work.join("busybox.tar");
    ok(Command::new(repo.join("scripts/make-busybox-rootfs.sh")).arg(&tar));
    let home = work.join("home");
    ok(Command::new(&bin).arg("--home").arg(&home).args(["-q", "rootfs", "import"]).arg(&tar).args(["--name", "bb"]));
    let dataset = work.join("dataset");
    std::fs::create_dir_all(&dataset).unwrap();

    let exec = |extra: &[&str]| {
        let mut c = Command::new(&bin);
        c.arg("--home").arg(&home).args(["-q", "exec", "--rootfs", "bb"]).args(extra).args(["--", "/bin/true"]);
        ok(&mut c);
    };
    let plain = time_runs(runs, |_| exec(&[]));
    let vol = format!("{}:/data:DATA", dataset.display());
    let limited = time_runs(runs, |_| exec(&["--memory", "256M", "--pids", "100", "--cpus", "1", "--volume", &vol]));

    // runc on the same tree (a bundle whose rootfs is the imported dir, read-only so it
    // is not modified: runc has no overlay of its own).
    let bundle = work.join("runc-bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    ok(Command::new("runc").args(["spec", "--bundle"]).arg(&bundle));
    let cfg_path = bundle.join("config.json");
    let mut cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    cfg["root"]["path"] = home.join("rootfs/bb/tree").display().to_string().into();
    cfg["process"]["args"] = serde_json::json!(["/bin/true"]);
    cfg["process"]["terminal"] = false.into();
    std::fs::write(&cfg_path, serde_json::to_vec_pretty(&cfg).unwrap()).unwrap();
    let runc_root = work.join("runc-state");
    let runc = time_runs(runs, |i| {
        ok(Command::new("runc")
            .arg("--root")
            .arg(&runc_root)
            .args(["run", "--bundle"])
            .arg(&bundle)
            .arg(format!("bench-{i}")));
    });

    let mut rows = vec![
        ("azp-sandbox exec -- /bin/true", plain.clone()),
        ("azp-sandbox exec (limits + volume)", limited),
        ("runc run (same rootfs)", runc.clone()),
    ];
    let podman = Path::new("/usr/bin/podman").exists();
    if podman {
        let p = time_runs(runs.min(10), |_| {
            ok(Command::new("podman")
                .args([
                    "--runtime",
                    "runc",
                    "run",
                    "--rm",
                    "--ulimit",
                    "nofile=1024:1024",
                    "--ulimit",
                    "nproc=4096:4096",
                    "--rootfs",
                ])
                .arg(home.join("rootfs/bb/tree"))
                .arg("/bin/true"));
        });
        rows.push(("podman --runtime runc run --rm --rootfs", p));
    }
    let runc_version =
        String::from_utf8_lossy(&Command::new("runc").arg("--version").output().map(|o| o.stdout).unwrap_or_default())
            .lines()
            .next()
            .unwrap_or("runc")
            .to_string();
    let mut md = format!(
        "### Sandbox cycle (`/bin/true` on the busybox rootfs, {runs} runs each)\n\nPeer: {runc_version}\n\n| what | median | p95 |\n|---|---|---|\n"
    );
    for (name, v) in &rows {
        md.push_str(&format!(
            "| {name} | {:.2} ms | {:.2} ms |\n",
            median(v.clone()).as_secs_f64() * 1e3,
            p95(v.clone()).as_secs_f64() * 1e3
        ));
    }
    let ratio = median(plain.clone()).as_secs_f64() / median(runc).as_secs_f64();
    md.push_str(&format!("\nazp-sandbox / runc (medians): **{ratio:.2}x** (target <= 0.5x)\n"));
    if podman {
        let p = median(rows.last().unwrap().1.clone()).as_secs_f64();
        md.push_str(&format!(
            "podman / azp-sandbox (medians): **{:.1}x** (target >= 20x)\n",
            p / median(plain).as_secs_f64()
        ));
    } else {
        md.push_str("podman: not installed, not measured\n");
    }
    md.push('\n');
    println!("\n{md}");
    std::fs::create_dir_all(repo.join("target/bench-results")).unwrap();
    std::fs::write(repo.join("target/bench-results/sandbox_cycle.md"), md).unwrap();
    let _ = std::fs::remove_dir_all(&work);
}
