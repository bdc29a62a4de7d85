//! Rootfs unpack throughput: `azp-sandbox rootfs import` vs GNU tar on the same archive,
//! gzip (`tar -xzf`) and zstd (`tar -I zstd -xf`), page cache dropped before each run,
//! medians of AZP_BENCH_UNPACK_RUNS (default 5), one of each per round (GNU tar's time moves
//! a lot between runs on a shared machine: with 3 rounds one slow round was the median). The archive is the Debian minbase fixture, or
//! AZP_BENCH_ROOTFS=FILE.tar[.zst] (e.g. a CUDA rootfs from rootfs-recipes/).
//! Writes target/bench-results/unpack.md.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

fn sh(cmd: &str) {
    let st = Command::new("sh").arg("-c").arg(cmd).status().unwrap();
    assert!(st.success(), "{cmd} failed");
}

fn drop_caches() {
    let _ = Command::new("sync").status();
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Seconds of `f` after `prepare` and a cold page cache.
fn timed(prepare: impl FnOnce(), f: impl FnOnce()) -> f64 {
    prepare();
    drop_caches();
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: the unpack benchmark needs root (numeric owners, dropping caches)");
        return;
    }
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let runs: usize = std::env::var("AZP_BENCH_UNPACK_RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(5);
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_azp-sandbox"));
    let work = repo.join("target/bench-unpack");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let src = match std::env::var("AZP_BENCH_ROOTFS") {
        Ok(p) => PathBuf::from(p),
        Err(_) => {
            let p = repo.join("target/fixtures/debian-bookworm-minbase.tar.zst");
            assert!(Command::new(repo.join("scripts/make-debian-rootfs.sh")).arg(&p).status().unwrap().success());
            p
        }
    };
    let tar = work.join("rootfs.tar");
    if src.to_string_lossy().ends_with(".zst") {
        sh(&format!("zstd -q -d -c {} > {}", src.display(), tar.display()));
    } else {
        sh(&format!("cp {} {}", src.display(), tar.display()));
    }
    let gz = work.join("rootfs.tar.gz");
    let zst = work.join("rootfs.tar.zst");
    sh(&format!("gzip -6 -c {} > {}", tar.display(), gz.display()));
    sh(&format!("zstd -q -3 -T0 -c {} > {}", tar.display(), zst.display()));
    let size = std::fs::metadata(&tar).unwrap().len() as f64 / 1e6;
    let entries =
        String::from_utf8(Command::new("tar").arg("-tf").arg(&tar).output().unwrap().stdout).unwrap().lines().count();

    let home = work.join("home");
    let out = work.join("out");
    let reset = |p: &Path| {
        let _ = std::fs::remove_dir_all(p);
        std::fs::create_dir_all(p).unwrap();
    };
    let mut rows = vec![];
    for (label, archive, tar_flag) in [("gzip", &gz, "-z"), ("zstd", &zst, "-I zstd")] {
        // Interleaved, one of each per round: this VM's disk and CPU drift between
        // minutes (GNU tar's zstd median moved between 2.6 and 5.9 s in one day).
        let (mut ours, mut gnu) = (vec![], vec![]);
        for _ in 0..runs {
            ours.push(timed(
                || reset(&home),
                || {
                    let st = Command::new(&bin)
                        .arg("--home")
                        .arg(&home)
                        .args(["-q", "rootfs", "import"])
                        .arg(archive)
                        .args(["--name", "bench"])
                        .stderr(Stdio::null())
                        .status()
                        .unwrap();
                    assert!(st.success());
                },
            ));
            gnu.push(timed(
                || reset(&out),
                || sh(&format!("tar --numeric-owner {tar_flag} -xf {} -C {}", archive.display(), out.display())),
            ));
        }
        let secs = |v: &[f64]| v.iter().map(|s| format!("{s:.2}")).collect::<Vec<_>>().join(" ");
        eprintln!("unpack bench: {label}: azp-sandbox {} s; GNU tar {} s", secs(&ours), secs(&gnu));
        rows.push((label, median(ours), median(gnu)));
    }
    let tar_version = String::from_utf8(Command::new("tar").arg("--version").output().unwrap().stdout).unwrap();
    let mut md = format!(
        "### Rootfs unpack ({}: {size:.0} MB, {entries} entries; page cache dropped; median of {runs}, interleaved)\n\n\
         Peer: {}\n\n| archive | azp-sandbox import | GNU tar | speed-up | target |\n|---|---|---|---|---|\n",
        src.file_name().unwrap().to_string_lossy(),
        tar_version.lines().next().unwrap_or("tar")
    );
    for (label, ours, gnu) in &rows {
        let target = if *label == "gzip" { ">= 1.5x faster" } else { "within 1.2x (>= 0.83x)" };
        md.push_str(&format!("| {label} | {ours:.2} s | {gnu:.2} s | {:.2}x | {target} |\n", gnu / ours));
    }
    md.push('\n');
    println!("\n{md}");
    std::fs::create_dir_all(repo.join("target/bench-results")).unwrap();
    std::fs::write(repo.join("target/bench-results/unpack.md"), md).unwrap();
    let _ = std::fs::remove_dir_all(&work);
}
