//! `rootfs build RECIPE`: the shipped recipes (parsed and checked), recipe errors, and real
//! builds with debootstrap + apt against a Debian mirror (root; `DEBIAN_MIRROR` overrides
//! the mirror). The .deb cache lives in `target/fixtures/apt-cache*`, so reruns download
//! little. The CUDA recipes (runtime ~1 GB, toolkits ~5-6 GB) run only with
//! `AZP_SANDBOX_HEAVY_TESTS=1`.

mod common;

use azp_sandbox::rootfs::recipe::{self, Recipe};
use common::digest::sha256_file;
use common::{fixtures, repo, TestHome};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn recipe_files() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(repo().join("rootfs-recipes"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    v.sort();
    v
}

const SHIPPED: [&str; 6] = [
    "debian-bookworm-agent",
    "debian-bookworm-cuda11.8",
    "debian-bookworm-cuda11.8-runtime",
    "debian-bookworm-minbase",
    "debian-trixie-cuda12.4",
    "ubuntu-22.04-cuda12.4",
];

#[test]
fn shipped_recipes_parse_and_say_what_they_build() {
    let files = recipe_files();
    let stems: Vec<String> = files.iter().map(|p| p.file_stem().unwrap().to_string_lossy().into_owned()).collect();
    for want in SHIPPED {
        assert!(stems.iter().any(|s| s == want), "rootfs-recipes/{want}.toml missing: {stems:?}");
    }
    for path in &files {
        let r = Recipe::load(path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
        let stem = path.file_stem().unwrap().to_str().unwrap();
        assert_eq!(r.name, stem, "{}: name must match the file name", path.display());
        assert_eq!(r.arch, "x86_64", "{stem}");
        assert!(!r.packages.is_empty(), "{stem}: no packages");
        assert!(!r.description.is_empty(), "{stem}: no description");
        assert_eq!((r.user.name.as_str(), r.user.uid, r.user.home().as_str()), ("azp", 1000, "/home/azp"), "{stem}");
        assert_eq!(r.sha256, sha256_file(path));
        // The CUDA version is in the name (`...cuda12.4...`) and the store gets it from the recipe.
        match stem.split_once("cuda") {
            Some((_, rest)) => {
                let v: String = rest.chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
                assert_eq!(r.cuda_version.as_deref(), Some(v.as_str()), "{stem}");
                // The Azure Pipelines agent's runtime dependencies.
                for dep in ["libicu", "libkrb5-3", "libssl3", "zlib1g", "ca-certificates", "git", "curl"] {
                    assert!(r.packages.iter().any(|p| p.starts_with(dep)), "{stem}: no {dep}");
                }
                // The distro's driver libraries must not shadow the host's.
                assert!(r.remove_paths.iter().any(|p| p.contains("libcuda.so")), "{stem}: libcuda.so not removed");
            }
            None => assert_eq!(r.cuda_version, None, "{stem}"),
        }
        if stem.starts_with("debian-") {
            assert_eq!(r.distro, "debian");
            assert_eq!(r.variant, "minbase");
        }
        if stem.contains("cuda") && stem.starts_with("debian-") {
            assert_eq!(r.components, ["main", "contrib", "non-free", "non-free-firmware"], "{stem}");
            assert!(r.remove_packages.iter().any(|p| p == "libcuda1"), "{stem}");
        }
    }
    // Exact package names checked against the archives (apt-cache, trixie and bookworm).
    let get = |n: &str| Recipe::load(&repo().join(format!("rootfs-recipes/{n}.toml"))).unwrap();
    assert!(get("debian-trixie-cuda12.4").packages.iter().any(|p| p == "libssl3t64"));
    assert!(get("debian-trixie-cuda12.4").packages.iter().any(|p| p == "libicu76"));
    assert!(get("debian-bookworm-cuda11.8").packages.iter().any(|p| p == "g++-11"));
    let rt = get("debian-bookworm-cuda11.8-runtime");
    for p in ["libcudart11.0", "libcublas11", "libcublaslt11"] {
        assert!(rt.packages.iter().any(|q| q == p), "runtime: {p}");
    }
    assert!(!rt.packages.iter().any(|p| p.contains("toolkit")), "runtime-only recipe installs a toolkit");
    // What agent::preflight checks, in bookworm's names (tests/real_agent.rs builds it).
    let agent = get("debian-bookworm-agent");
    for p in ["libicu72", "libkrb5-3", "libgssapi-krb5-2", "libssl3", "zlib1g", "ca-certificates", "git", "curl"] {
        assert!(agent.packages.iter().any(|q| q == p), "agent: {p}");
    }
    let ubuntu = get("ubuntu-22.04-cuda12.4");
    assert!(ubuntu.text.contains("NOT TESTED"), "the Ubuntu recipe must say it is untested");
    assert!(ubuntu.packages.iter().any(|p| p == "cuda-toolkit-12-4"));

    // The copies compiled into the binary are the files.
    let built_in = recipe::builtin();
    let mut names: Vec<&str> = built_in.iter().map(|r| r.name.as_str()).collect();
    names.sort();
    assert_eq!(names, SHIPPED);
    for r in &built_in {
        assert_eq!(r.sha256, sha256_file(&repo().join(format!("rootfs-recipes/{}.toml", r.name))), "{}", r.name);
    }
}

fn build_cli(home: &TestHome, args: &[&str]) -> std::process::Output {
    let mut all = vec!["rootfs", "build"];
    all.extend_from_slice(args);
    let mirror = std::env::var("DEBIAN_MIRROR").ok().filter(|m| !m.is_empty());
    if let Some(m) = &mirror {
        all.extend_from_slice(&["--mirror", m]);
    }
    home.run(&all)
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn malformed_recipes_give_one_line_errors_naming_file_and_key() {
    let home = TestHome::new("recipe-errors");
    let good = std::fs::read_to_string(repo().join("rootfs-recipes/debian-bookworm-minbase.toml")).unwrap();
    let cases = [
        (
            "wrong-type",
            good.replace("packages = [\"busybox\", \"ca-certificates\"]", "packages = \"busybox\""),
            "packages",
        ),
        ("empty", good.replace("packages = [\"busybox\", \"ca-certificates\"]", "packages = []"), "packages"),
        ("missing", good.replace("suite = \"bookworm\"\n", ""), "suite"),
        ("unknown", good.replace("variant = \"minbase\"", "varient = \"minbase\""), "varient"),
        ("bad-version", good.replace("arch = \"x86_64\"", "arch = \"x86_64\"\ncuda_version = \"12\""), "cuda_version"),
        ("root-user", good.replace("uid = 1000", "uid = 0"), "user.uid"),
        ("syntax", good.replace("mirror = \"http://deb.debian.org/debian\"", "mirror = http://x"), "mirror"),
    ];
    for (tag, text, key) in cases {
        assert_ne!(text, good, "{tag}: the replacement did not apply");
        let path = home.dir.join(format!("{tag}.toml"));
        std::fs::write(&path, text).unwrap();
        let out = build_cli(&home, &[path.to_str().unwrap()]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(125), "{tag}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{tag}: not one line: {err}");
        assert!(err.starts_with("azp-sandbox: error: recipe "), "{tag}: {err}");
        assert!(err.contains(path.to_str().unwrap()), "{tag}: file not named: {err}");
        assert!(err.contains(&format!("`{key}`")), "{tag}: key `{key}` not named: {err}");
    }
    // Unknown names list the known ones; a missing file says so.
    let out = build_cli(&home, &["no-such-recipe"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(125));
    assert!(err.contains("unknown recipe 'no-such-recipe'") && err.contains("debian-trixie-cuda12.4"), "{err}");
    let out = build_cli(&home, &["/nonexistent/x.toml"]);
    assert!(stderr(&out).contains("recipe file /nonexistent/x.toml not found"), "{}", stderr(&out));
    assert!(!home.dir.join("rootfs").exists() || std::fs::read_dir(home.dir.join("rootfs")).unwrap().count() == 0);
}

/// A regular file with more than one link under `dir`, if there is one.
fn hard_linked_file(dir: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let m = e.path().symlink_metadata().unwrap();
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file() && m.nlink() > 1 {
                return Some(e.path());
            }
        }
    }
    None
}

/// Entries of the store dir (names, temp dirs, trash).
fn store_entries(home: &TestHome) -> Vec<String> {
    std::fs::read_dir(home.dir.join("rootfs"))
        .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

fn assert_no_mounts_or_processes(home: &TestHome) {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let h = home.dir.to_str().unwrap();
    assert!(!mounts.contains(h), "mounts left under {h}");
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(root) = std::fs::read_link(e.path().join("root")) {
            assert!(!root.starts_with(&home.dir), "process {:?} still chrooted in {}", e.file_name(), root.display());
        }
    }
}

fn rootfs_json(home: &TestHome) -> Vec<serde_json::Value> {
    serde_json::from_str(&home.ok(&["rootfs", "list", "--json"])).unwrap()
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: debootstrap and apt-get in a chroot (CI runs the suite as root)")]
fn build_minbase_recipe_then_run_a_job_in_it() {
    require_root!();
    let t0 = Instant::now();
    let home = TestHome::new("recipe-build");
    let cache = fixtures().join("apt-cache");
    let out = build_cli(&home, &["debian-bookworm-minbase", "--cache-dir", cache.to_str().unwrap()]);
    assert!(out.status.success(), "build failed: {}", stderr(&out));
    let built = t0.elapsed();
    let err = stderr(&out);
    for step in ["debootstrap", "apt-get update", "apt-get install", "create user azp", "post_install", "clean up"] {
        assert!(err.contains(step), "no progress line for {step}: {err}");
    }
    assert!(err.contains("built rootfs 'debian-bookworm-minbase'"), "{err}");

    // A job in it: the user, the distro, the post_install marker.
    let job = home.ok(&[
        "exec",
        "--rootfs",
        "debian-bookworm-minbase",
        "--",
        "sh",
        "-c",
        "id azp; cat /etc/debian_version; cat /etc/azp-sandbox-test-marker; busybox true && echo busybox-ok",
    ]);
    assert!(job.contains("uid=1000(azp) gid=1000(azp)"), "{job}");
    let debian_version = job.lines().nth(1).unwrap_or("");
    assert!(debian_version.starts_with("12."), "not bookworm: {job}");
    assert!(job.contains("built by azp-sandbox rootfs build"), "{job}");
    assert!(job.contains("busybox-ok"), "{job}");

    // What the store recorded, from the recipe.
    let list = rootfs_json(&home);
    let r = list.iter().find(|r| r["name"] == "debian-bookworm-minbase").expect("not listed");
    let file = repo().join("rootfs-recipes/debian-bookworm-minbase.toml");
    assert_eq!(r["source"], format!("recipe debian-bookworm-minbase (sha256:{})", sha256_file(&file)));
    assert_eq!(r["arch"], "x86_64");
    assert!(r["cuda_version"].is_null(), "{r}");
    let size = r["size_bytes"].as_u64().unwrap();
    assert!((60_000_000..400_000_000).contains(&size), "size {size}");
    assert!(r["entries"].as_u64().unwrap() > 3000, "{r}");
    let text = home.ok(&["rootfs", "list"]);
    assert!(text.lines().any(|l| l.starts_with("debian-bookworm-minbase") && l.contains("x86_64")), "{text}");

    // One size whichever way the tree reaches the store: a copy imported from a tar and
    // one imported as an OCI image (the pull's path) report what the build recorded. The
    // tree has hard links (perl-base ships perl and perl5.36.0 as one file): counted once.
    let tree = home.dir.join("rootfs/debian-bookworm-minbase/tree");
    let linked = hard_linked_file(&tree);
    assert!(linked.is_some(), "no hard-linked file in the minbase tree: the sizes below would prove nothing");
    let tarred = home.dir.join("minbase.tar");
    let st = std::process::Command::new("tar")
        .args(["--numeric-owner", "-C"])
        .arg(&tree)
        .arg("-cf")
        .arg(&tarred)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success());
    home.import(&tarred, "minbase-tar");
    common::registry::one_layer_layout(&tarred, &home.dir.join("minbase-oci"), "v1");
    home.ok(&["rootfs", "import", &format!("{}:v1", home.dir.join("minbase-oci").display()), "--name", "minbase-oci"]);
    let list = rootfs_json(&home);
    for copy in ["minbase-tar", "minbase-oci"] {
        let c = list.iter().find(|r| r["name"] == copy).expect("not listed");
        assert_eq!(c["size_bytes"].as_u64(), Some(size), "{copy} vs the build ({linked:?} is hard-linked)");
    }
    for copy in ["minbase-tar", "minbase-oci"] {
        home.ok(&["rootfs", "rm", copy]);
    }
    let _ = std::fs::remove_dir_all(home.dir.join("minbase-oci"));

    // The tree: build scaffolding gone, package lists and .debs not kept, recipe recorded.
    let tree = home.dir.join("rootfs/debian-bookworm-minbase/tree");
    assert!(!tree.join("usr/sbin/policy-rc.d").exists(), "policy-rc.d left in the rootfs");
    assert!(!tree.join("etc/apt/apt.conf.d/99azp-sandbox-build").exists());
    let lists: Vec<_> = std::fs::read_dir(tree.join("var/lib/apt/lists")).unwrap().flatten().collect();
    assert!(lists.is_empty(), "apt lists kept: {lists:?}");
    let debs: Vec<_> = std::fs::read_dir(tree.join("var/cache/apt/archives"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".deb"))
        .collect();
    assert!(debs.is_empty(), ".debs in the rootfs: {debs:?}");
    assert_eq!(std::fs::read(tree.join("usr/share/azp-sandbox/recipe.toml")).unwrap(), std::fs::read(&file).unwrap());
    assert!(std::fs::read_to_string(tree.join("etc/apt/sources.list")).unwrap().contains(" bookworm main"));
    // The .deb cache is filled for the next build.
    let cached = std::fs::read_dir(cache.join("debian-bookworm-amd64"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("busybox_"))
        .count();
    assert_eq!(cached, 1, "busybox .deb not cached");

    // The name is taken now: refused at once, the rootfs untouched.
    let t = Instant::now();
    let again = build_cli(&home, &["debian-bookworm-minbase", "--cache-dir", cache.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(125));
    assert!(stderr(&again).contains("already exists"), "{}", stderr(&again));
    // Seconds, not a build's minutes (generous: a busy machine).
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    assert_eq!(store_entries(&home), ["debian-bookworm-minbase"]);
    assert_no_mounts_or_processes(&home);
    eprintln!("minbase recipe: built in {:.0} s, whole test {:.0} s", built.as_secs_f64(), t0.elapsed().as_secs_f64());
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: debootstrap and apt-get in a chroot (CI runs the suite as root)")]
fn failed_and_interrupted_builds_leave_nothing() {
    require_root!();
    let home = TestHome::new("recipe-fail");
    // Its own cache: a shared one would serialize this test behind the one above.
    let cache = fixtures().join("apt-cache-fail");
    let cache_s = cache.to_str().unwrap();
    let good = std::fs::read_to_string(repo().join("rootfs-recipes/debian-bookworm-minbase.toml")).unwrap();

    // 1. debootstrap fails at once (no such suite).
    let bad_suite = home.dir.join("bad-suite.toml");
    std::fs::write(&bad_suite, good.replace("suite = \"bookworm\"", "suite = \"no-such-suite\"")).unwrap();
    let out = build_cli(&home, &[bad_suite.to_str().unwrap(), "--name", "x1", "--cache-dir", cache_s]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("debootstrap") && err.contains("failed"), "{err}");
    assert!(err.contains("  | "), "no log tail shown: {err}");
    assert!(
        err.trim_end().lines().last().unwrap().starts_with("azp-sandbox: error: rootfs build of 'x1' failed"),
        "{err}"
    );
    assert_eq!(store_entries(&home), Vec::<String>::new());

    // 2. SIGINT while debootstrap runs: stopped, its processes killed, temp dir removed.
    let mut child = home
        .command()
        .args(["rootfs", "build", "debian-bookworm-minbase", "--name", "x2", "--cache-dir", cache_s])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !store_entries(&home).iter().any(|e| e.starts_with(".tmp-x2")) {
        assert!(Instant::now() < deadline, "the build never created its temp dir");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(3));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    let t = Instant::now();
    let status = child.wait().unwrap();
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert_eq!(status.code(), Some(125), "{err}");
    assert!(err.contains("interrupted"), "{err}");
    // Seconds, not the minutes debootstrap would take (generous: a busy machine's disk).
    assert!(t.elapsed() < Duration::from_secs(60), "took {:?} to stop", t.elapsed());
    assert_eq!(store_entries(&home), Vec::<String>::new());
    assert_no_mounts_or_processes(&home);

    // 3. A chroot step fails (post_install exits 7) after debootstrap and apt-get ran with
    //    /proc, /sys, /dev and the cache mounted.
    let fail_post = home.dir.join("fail-post.toml");
    let text = good.replace(
        "post_install = [",
        "post_install = [\n    \"echo post-install-ran; test -e /proc/self/status; test -c /dev/null; exit 7\",",
    );
    std::fs::write(&fail_post, text).unwrap();
    let out = build_cli(&home, &[fail_post.to_str().unwrap(), "--name", "x3", "--cache-dir", cache_s]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("post_install failed (exit status 7)"), "{err}");
    assert!(err.contains("  | post-install-ran"), "log tail missing: {err}");
    let log = home.dir.join("logs/rootfs-build-x3.log");
    assert!(err.contains(log.to_str().unwrap()), "{err}");
    assert!(std::fs::read_to_string(&log).unwrap().contains("Setting up busybox"), "apt-get install did not run");
    assert_eq!(store_entries(&home), Vec::<String>::new());
    assert_no_mounts_or_processes(&home);
    assert!(rootfs_json(&home).is_empty());
}

/// Whether the heavy builds are asked for; if not, why they are skipped.
fn heavy() -> Result<(), String> {
    if std::env::var("AZP_SANDBOX_HEAVY_TESTS").is_ok_and(|v| v == "1") {
        return Ok(());
    }
    Err("set AZP_SANDBOX_HEAVY_TESTS=1 to build the CUDA recipes (downloads 0.3-2 GB, 1-4 min each)".into())
}

/// Files and links named `libcuda.so*` / `libnvidia-ml.so*` outside `stubs/` dirs.
fn driver_libs(tree: &Path) -> Vec<PathBuf> {
    let mut found = vec![];
    let mut stack = vec![tree.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let ft = e.file_type().unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            if ft.is_dir() {
                if name != "stubs" {
                    stack.push(e.path());
                }
            } else if name.starts_with("libcuda.so") || name.starts_with("libnvidia-ml.so") {
                found.push(e.path());
            }
        }
    }
    found
}

fn build_heavy(home: &TestHome, recipe: &str) -> (Duration, serde_json::Value) {
    let cache = fixtures().join("apt-cache");
    let t = Instant::now();
    let out = build_cli(home, &[recipe, "--cache-dir", cache.to_str().unwrap()]);
    assert!(out.status.success(), "build of {recipe} failed: {}", stderr(&out));
    let took = t.elapsed();
    let info = rootfs_json(home).into_iter().find(|r| r["name"] == recipe).expect("not listed");
    eprintln!("{recipe}: built in {:.0} s, {:.2} GB", took.as_secs_f64(), info["size_bytes"].as_f64().unwrap() / 1e9);
    (took, info)
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: debootstrap and apt-get in a chroot (CI runs the suite as root)")]
fn heavy_bookworm_cuda_runtime_recipe() {
    require_root!();
    or_skip!(heavy());
    let home = TestHome::new("recipe-runtime");
    let (_, info) = build_heavy(&home, "debian-bookworm-cuda11.8-runtime");
    assert_eq!(info["cuda_version"], "11.8");
    assert_eq!(info["arch"], "x86_64");
    let size = info["size_bytes"].as_u64().unwrap();
    assert!(size < 1_500_000_000, "runtime rootfs is {size} bytes");
    let tree = home.dir.join("rootfs/debian-bookworm-cuda11.8-runtime/tree");
    let lib = tree.join("usr/lib/x86_64-linux-gnu");
    for f in ["libcudart.so.11.0", "libcublas.so.11", "libcublasLt.so.11", "libicuuc.so.72", "libssl.so.3", "libz.so.1"]
    {
        assert!(lib.join(f).exists(), "{f} missing");
    }
    let drivers = driver_libs(&tree);
    assert!(drivers.is_empty(), "distro driver libraries in the rootfs: {drivers:?}");
    let job = home.ok(&[
        "exec",
        "--rootfs",
        "debian-bookworm-cuda11.8-runtime",
        "--",
        "sh",
        "-c",
        "id azp; ldconfig -p | grep -c libcudart.so.11; git --version; curl --version | head -1",
    ]);
    assert!(job.contains("uid=1000(azp)") && job.contains("git version"), "{job}");
    assert!(job.lines().nth(1).is_some_and(|l| l.trim() != "0"), "libcudart not in the linker cache: {job}");
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: debootstrap and apt-get in a chroot (CI runs the suite as root)")]
fn heavy_trixie_cuda_toolkit_recipe() {
    require_root!();
    or_skip!(heavy());
    let home = TestHome::new("recipe-toolkit");
    let (_, info) = build_heavy(&home, "debian-trixie-cuda12.4");
    assert_eq!(info["cuda_version"], "12.4");
    let tree = home.dir.join("rootfs/debian-trixie-cuda12.4/tree");
    let drivers = driver_libs(&tree);
    assert!(drivers.is_empty(), "distro driver libraries in the rootfs: {drivers:?}");
    let removed = std::fs::read_to_string(tree.join("usr/share/azp-sandbox/removed-files")).unwrap();
    assert!(removed.contains("libcuda.so"), "{removed}");
    let job = home.ok(&[
        "exec",
        "--rootfs",
        "debian-trixie-cuda12.4",
        "--",
        "sh",
        "-c",
        "nvcc --version && printf '__global__ void k(float *x) { x[threadIdx.x] *= 2; }\\n' > /tmp/k.cu \
         && nvcc -c /tmp/k.cu -o /tmp/k.o && echo compiled-ok && id azp",
    ]);
    assert!(job.contains("release 12.4"), "{job}");
    assert!(job.contains("compiled-ok"), "{job}");
    assert!(job.contains("uid=1000(azp)"), "{job}");
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: debootstrap and apt-get in a chroot (CI runs the suite as root)")]
fn heavy_bookworm_cuda_toolkit_recipe() {
    require_root!();
    or_skip!(heavy());
    let home = TestHome::new("recipe-toolkit-11");
    let (_, info) = build_heavy(&home, "debian-bookworm-cuda11.8");
    assert_eq!(info["cuda_version"], "11.8");
    let tree = home.dir.join("rootfs/debian-bookworm-cuda11.8/tree");
    let drivers = driver_libs(&tree);
    assert!(drivers.is_empty(), "distro driver libraries in the rootfs: {drivers:?}");
    // Plain nvcc works: gcc/g++ are GCC 11 (nvcc 11.8 rejects bookworm's GCC 12).
    let job = home.ok(&[
        "exec",
        "--rootfs",
        "debian-bookworm-cuda11.8",
        "--",
        "sh",
        "-c",
        "nvcc --version && printf '__global__ void k(float *x) { x[threadIdx.x] *= 2; }\\n' > /tmp/k.cu \
         && nvcc -c /tmp/k.cu -o /tmp/k.o && echo compiled-ok && id azp",
    ]);
    assert!(job.contains("release 11.8"), "{job}");
    assert!(job.contains("compiled-ok"), "{job}");
    assert!(job.contains("uid=1000(azp)"), "{job}");
}
