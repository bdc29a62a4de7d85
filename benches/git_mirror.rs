//! The git mirror cache (issue 24): a job that clones the big fixture repository
//! (scripts/fixtures/git-big-repo.py: 300 commits, 300 MB of incompressible history in
//! one pack, a 10 MB tree checked out) served over HTTP by busybox httpd in the network lab's fake internet, cold (no
//! mirror: the whole pack crosses the network) against warm (the manager's mirror bound
//! read-only with git alternates, as `run` gives every job), interleaved rounds.
//!
//! `sudo cargo bench --bench git_mirror` (AZP_BENCH_ROUNDS=N, default 5). Needs the
//! fixtures `target/fixtures/git-big-repo.git` (made here if absent, ~30 s) and
//! `target/fixtures/debian-bookworm-agent.tar.zst` (git in the rootfs; made by the
//! real-agent tests, or see tests/common/real_agent.rs). Writes
//! target/bench-results/git_mirror.md.

#[path = "../tests/common/netlab.rs"]
mod netlab;

use azp_sandbox::config::Home;
use azp_sandbox::mirror::{self, MirrorEntry, MirrorSpec};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

const PORT: u16 = 8095;

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: the git mirror benchmark needs root (network lab, sandboxes)");
        return;
    }
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rounds: usize = std::env::var("AZP_BENCH_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(5);
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_azp-sandbox"));
    let fixtures = repo.join("target/fixtures");
    let rootfs = fixtures.join("debian-bookworm-agent.tar.zst");
    if !rootfs.exists() {
        eprintln!("SKIPPED: {} is absent (run `cargo test --test real_agent` once as root)", rootfs.display());
        return;
    }
    let big = fixtures.join("git-big-repo.git");
    if !big.exists() {
        let st = Command::new(repo.join("scripts/fixtures/git-big-repo.py")).arg(&big).status().unwrap();
        assert!(st.success(), "git-big-repo.py failed");
    }
    let pack_mb = dir_bytes(&big.join("objects/pack")) as f64 / 1e6;

    let work = repo.join("target/bench-git-mirror");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(work.join("www")).unwrap();
    std::os::unix::fs::symlink(&big, work.join("www/big.git")).unwrap();
    let home_dir = work.join("home");
    let azp = |args: &[&str]| {
        let st = Command::new(&bin).arg("--home").arg(&home_dir).args(args).status().unwrap();
        assert!(st.success(), "azp-sandbox {args:?}");
    };
    azp(&["-q", "rootfs", "import", rootfs.to_str().unwrap(), "--name", "agent"]);

    let lab = netlab::NetLab::new().expect("the bench's network lab");
    let mut httpd = Command::new("ip")
        .args(["netns", "exec", &lab.internet, "busybox", "httpd", "-f", "-p"])
        .arg(format!("{}:{PORT}", netlab::INTERNET_IP))
        .arg("-h")
        .arg(work.join("www"))
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    // This process and every command it starts: in the fake host.
    lab.enter_host();
    let url = format!("http://{}:{PORT}/big.git", netlab::INTERNET_IP);

    // The manager's part, as `run` does it: the mirror made and fetched outside any job.
    let home = Home::new(&home_dir);
    let spec = MirrorSpec::from_entry(&MirrorEntry { url: url.clone(), ..Default::default() }).unwrap();
    let t = Instant::now();
    let mut ready = false;
    while !ready && t.elapsed().as_secs() < 10 {
        ready = mirror::fetch::check_remote(&spec).is_ok();
    }
    mirror::keeper::prepare(&home, std::slice::from_ref(&spec)).unwrap();
    let t = Instant::now();
    mirror::fetch::fetch(&home, &spec).unwrap();
    let first_fetch = t.elapsed().as_secs_f64();
    let (volumes, env) = mirror::job_volumes(&home, std::slice::from_ref(&spec));

    let job = |warm: bool| -> (f64, f64) {
        let mut c = Command::new(&bin);
        c.arg("--home").arg(&home_dir).args(["-q", "exec", "--rootfs", "agent", "--memory", "4G"]);
        // git's identity for the clone's reflog, given: else git asks DNS for the job's
        // host name, which nothing answers in the lab (a 10 s timeout in both arms).
        for (k, v) in [("GIT_COMMITTER_NAME", "bench"), ("GIT_COMMITTER_EMAIL", "bench@example.invalid")] {
            c.arg("--env").arg(format!("{k}={v}"));
        }
        if warm {
            for v in &volumes {
                c.arg("--volume").arg(format!("{}:{}", v.host.display(), v.container.display()));
            }
            for (k, v) in &env {
                c.arg("--env").arg(format!("{k}={v}"));
            }
        }
        c.args(["--", "sh", "-c"]).arg(format!(
            "s=$(date +%s.%N); git clone -q {url} /tmp/c || exit 1; e=$(date +%s.%N); \
             echo clone=$(echo \"$e - $s\" | bc 2>/dev/null || awk \"BEGIN{{print $e - $s}}\"); \
             git -C /tmp/c count-objects -v | sed 's/: /=/' | grep -E '^(count|in-pack)='"
        ));
        let t = Instant::now();
        let out = c.output().unwrap();
        let wall = t.elapsed().as_secs_f64();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "job failed: {text}{}", String::from_utf8_lossy(&out.stderr));
        let get = |k: &str| text.lines().find_map(|l| l.strip_prefix(&format!("{k}="))).unwrap().trim().to_string();
        let fetched: u64 = get("count").parse::<u64>().unwrap() + get("in-pack").parse::<u64>().unwrap();
        if warm {
            assert_eq!(fetched, 0, "the warm clone fetched objects itself: {text}");
        } else {
            assert!(fetched > 0, "{text}");
        }
        (wall, get("clone").parse().unwrap())
    };
    job(true); // one warm-up of each: page cache, the rootfs's first use
    job(false);
    let (mut cold, mut warm) = (vec![], vec![]);
    for i in 0..rounds {
        // Interleaved, the order alternating round by round.
        if i % 2 == 0 {
            cold.push(job(false));
            warm.push(job(true));
        } else {
            warm.push(job(true));
            cold.push(job(false));
        }
        eprintln!("round {i}: cold {:.2} s, warm {:.2} s (job wall)", cold[i].0, warm[i].0);
    }
    let _ = httpd.kill();
    let _ = httpd.wait();
    let med = |v: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| {
        let mut x: Vec<f64> = v.iter().map(f).collect();
        x.sort_by(|a, b| a.partial_cmp(b).unwrap());
        x[x.len() / 2]
    };
    let (cw, ww) = (med(&cold, |x| x.0), med(&warm, |x| x.0));
    let (cc, wc) = (med(&cold, |x| x.1), med(&warm, |x| x.1));
    let md = format!(
        "### Git mirror (`git clone` of a {pack_mb:.0} MB pack, 300 commits, a 10 MB tree checked out, over dumb HTTP in the network lab; \
         median of {rounds} interleaved rounds)\n\n\
         | job | `git clone` in the job | whole job (sandbox + clone) |\n|---|---|---|\n\
         | cold (no mirror) | {cc:.2} s | {cw:.2} s |\n\
         | warm (mirror, read-only alternates) | {wc:.2} s | {ww:.2} s |\n\
         | **cold / warm** | **{:.1}x** | **{:.1}x** |\n\n\
         The mirror's first fetch (outside any job): {first_fetch:.1} s. A warm clone stores 0 objects of its \
         own (checked every round); a cold one the whole pack.\n",
        cc / wc,
        cw / ww
    );
    print!("{md}");
    let out = repo.join("target/bench-results");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("git_mirror.md"), md).unwrap();
    let _ = std::fs::remove_dir_all(&work);
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map(|r| r.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum()).unwrap_or(0)
}
