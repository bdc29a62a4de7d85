//! One build: checks before anything runs, debootstrap, the chroot steps, the checks of
//! the built tree, and the store's atomic import of the result.

use super::schema::{check_url, deb_arch, Recipe};
use super::scripts;
use super::step::Steps;
use super::ui::Ui;
use crate::config::Home;
use crate::rootfs::store::ImportFacts;
use crate::rootfs::{probe, validate_name, RootfsInfo, Store};
use anyhow::{anyhow, bail, Context, Result};
use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Options of one build.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// Rootfs name; default: the recipe's name.
    pub name: Option<String>,
    /// Replaces the recipe's `mirror` (debootstrap and `{mirror}` in `sources`).
    pub mirror: Option<String>,
    /// .deb cache, kept between builds (one subdir per distro/suite/arch).
    pub cache_dir: PathBuf,
    /// Tool output of every step.
    pub log_path: PathBuf,
    /// Leave apt's package lists in the rootfs (jobs can `apt-get install` at once).
    pub keep_apt_lists: bool,
}

impl BuildOptions {
    /// Defaults under `home`: cache `HOME/cache/apt`, log `HOME/logs/rootfs-build-NAME.log`.
    pub fn for_home(home: &Home, name: &str) -> BuildOptions {
        BuildOptions {
            name: None,
            mirror: None,
            cache_dir: home.cache_dir().join("apt"),
            log_path: home.root().join("logs").join(format!("rootfs-build-{name}.log")),
            keep_apt_lists: false,
        }
    }
}

/// What a build did.
#[derive(Debug, Clone)]
pub struct BuildReport {
    pub info: RootfsInfo,
    pub duration: Duration,
    /// Files deleted by `remove_packages` / `remove_paths`.
    pub removed_files: usize,
    pub log: PathBuf,
}

impl BuildReport {
    pub fn summary(&self) -> String {
        let i = &self.info;
        format!(
            "built rootfs '{}' in {:.0} s: {:.1} MB, {} entries, {}, CUDA {}{}; log: {}",
            i.name,
            self.duration.as_secs_f64(),
            i.size_bytes as f64 / 1e6,
            i.entries,
            i.arch.as_deref().unwrap_or("unknown arch"),
            i.cuda_version.as_deref().unwrap_or("none"),
            if self.removed_files > 0 {
                format!(", {} distro driver file(s) removed", self.removed_files)
            } else {
                String::new()
            },
            self.log.display()
        )
    }
}

/// `rootfs build RECIPE`: find the recipe, then [`build`] with the home's defaults.
pub fn build_command(
    home: &Home,
    spec: &str,
    name: Option<String>,
    mirror: Option<String>,
    cache_dir: Option<PathBuf>,
    keep_apt_lists: bool,
) -> Result<BuildReport> {
    let recipe = super::find(spec)?;
    let rootfs_name = name.clone().unwrap_or_else(|| recipe.name.clone());
    validate_name(&rootfs_name)?;
    let mut opts = BuildOptions::for_home(home, &rootfs_name);
    opts.name = name;
    opts.mirror = mirror;
    opts.keep_apt_lists = keep_apt_lists;
    if let Some(c) = cache_dir {
        opts.cache_dir = c;
    }
    home.ensure()?;
    build(&Store::new(home), &recipe, &opts)
}

fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/bin", "/sbin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Builds `recipe` into `store`. Needs root. On error nothing is left: no name, no temp
/// dir (the store removes it), no mounts (they live in the steps' own namespaces).
pub fn build(store: &Store, recipe: &Recipe, opts: &BuildOptions) -> Result<BuildReport> {
    let name = opts.name.clone().unwrap_or_else(|| recipe.name.clone());
    validate_name(&name)?;
    if !nix::unistd::geteuid().is_root() || crate::rootless::mode().rootless {
        bail!(
            "rootfs build needs real root (debootstrap, chroot, mounts): run it with sudo, then `rootfs import` the \
             tarball as this user, or `rootfs pull` an image"
        );
    }
    let debootstrap = find_tool("debootstrap")
        .ok_or_else(|| anyhow!("debootstrap not found: apt-get install debootstrap (scripts/setup.sh installs it)"))?;
    let host_arch = std::env::consts::ARCH;
    if recipe.arch != host_arch {
        bail!(
            "recipe {} builds for {}, but this host is {host_arch}: cross-building is not supported; build it on a {} host",
            recipe.name,
            recipe.arch,
            recipe.arch
        );
    }
    if let Some(k) = &recipe.keyring {
        if !k.is_file() {
            bail!(
                "recipe {}: keyring {} (key `keyring`) does not exist on this host: install the {} archive keyring package",
                recipe.path.display(),
                k.display(),
                recipe.distro
            );
        }
    }
    let mirror = opts.mirror.clone().unwrap_or_else(|| recipe.mirror.clone());
    check_url(&mirror).map_err(|e| anyhow!("bad --mirror: {e}"))?;
    if store.dir().join(&name).symlink_metadata().is_ok() {
        bail!("rootfs '{name}' already exists: remove it with `azp-sandbox rootfs rm {name}` first, or choose another --name");
    }

    let deb_arch = deb_arch(&recipe.arch).expect("validated");
    let cache = opts.cache_dir.join(format!("{}-{}-{deb_arch}", recipe.distro, recipe.suite));
    std::fs::create_dir_all(cache.join("partial"))
        .with_context(|| format!("cannot create the package cache {}", cache.display()))?;
    let cache = cache.canonicalize().with_context(|| format!("cannot resolve {}", cache.display()))?;
    let _cache_lock = lock_cache(&cache)?;

    if let Some(d) = opts.log_path.parent() {
        std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    let mut log = File::create(&opts.log_path).with_context(|| format!("cannot create {}", opts.log_path.display()))?;
    let _ = writeln!(
        log,
        "azp-sandbox rootfs build: recipe {} (sha256:{}) as '{name}', mirror {mirror}, cache {}",
        recipe.path.display(),
        recipe.sha256,
        cache.display()
    );
    tracing::info!(
        "building rootfs '{name}' from recipe {} (tool output: {})",
        recipe.path.display(),
        opts.log_path.display()
    );

    let started = Instant::now();
    let mut removed_files = 0;
    let info = store.import_with(&name, |tree_fd| {
        let tree = crate::sys::fs_at::fd_path(tree_fd.as_raw_fd()).context("cannot find the path of the temp tree")?;
        let mut b = Builder {
            recipe,
            mirror: &mirror,
            cache: &cache,
            tree: &tree,
            keep_apt_lists: opts.keep_apt_lists,
            steps: Steps { name: &name, log, log_path: &opts.log_path, ui: Ui::new(recipe) },
        };
        let r = b.run(&debootstrap, deb_arch);
        // Whatever happened, nothing of the build may keep running in the tree.
        let strays = kill_strays(&tree);
        if strays > 0 {
            tracing::warn!("killed {strays} process(es) left running in the build chroot");
        }
        let (cuda, arch) = r?;
        // dpkg ran without an fsync per file (rootfs-recipes/apt-build.conf): flush the
        // whole tree once before the store renames it into place.
        nix::unistd::syncfs(tree_fd.as_raw_fd()).context("cannot sync the new rootfs to disk")?;
        removed_files = count_lines(&tree.join("usr/share/azp-sandbox/removed-files"));
        let (entries, bytes) = crate::rootfs::tree_size(&tree);
        Ok(ImportFacts {
            source: format!("recipe {} (sha256:{})", recipe.name, recipe.sha256),
            sha256: None,
            size_bytes: bytes,
            entries,
            arch: Some(arch),
            cuda_version: cuda,
        })
    });
    let info = info.map_err(|e| {
        let _ = std::fs::OpenOptions::new()
            .append(true)
            .open(&opts.log_path)
            .and_then(|mut f| writeln!(f, "\nbuild failed: {e:#}"));
        e.context(format!("rootfs build of '{name}' failed (nothing was kept)"))
    })?;
    Ok(BuildReport { info, duration: started.elapsed(), removed_files, log: opts.log_path.clone() })
}

/// Exclusive lock on the cache dir: two builds sharing it would fight over apt's locks.
fn lock_cache(cache: &Path) -> Result<Flock<File>> {
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(cache.join(".azp-build.lock"))
        .with_context(|| format!("cannot create a lock file in {}", cache.display()))?;
    match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
        Ok(locked) => Ok(locked),
        Err((f, _)) => {
            tracing::info!("waiting for another rootfs build that uses {}", cache.display());
            Flock::lock(f, FlockArg::LockExclusive).map_err(|(_, e)| anyhow!("cannot lock {}: {e}", cache.display()))
        }
    }
}

fn count_lines(p: &Path) -> usize {
    std::fs::read_to_string(p).map(|s| s.lines().filter(|l| !l.is_empty()).count()).unwrap_or(0)
}

/// Kills every process whose root directory is inside `tree` (daemons a maintainer
/// script started despite policy-rc.d). Returns how many.
fn kill_strays(tree: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir("/proc") else { return 0 };
    let mut n = 0;
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        if std::fs::read_link(e.path().join("root")).is_ok_and(|r| r.starts_with(tree)) {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
            n += 1;
        }
    }
    n
}

/// One build in progress: the recipe's steps into the tree.
struct Builder<'a> {
    recipe: &'a Recipe,
    mirror: &'a str,
    cache: &'a Path,
    tree: &'a Path,
    keep_apt_lists: bool,
    steps: Steps<'a>,
}

impl Builder<'_> {
    /// All steps; returns (CUDA version to record, arch).
    fn run(&mut self, debootstrap: &Path, deb_arch: &str) -> Result<(Option<String>, String)> {
        let r = self.recipe;
        // 1. debootstrap
        let mut cmd = Command::new(debootstrap);
        if r.variant != "standard" {
            cmd.arg(format!("--variant={}", r.variant));
        }
        cmd.arg(format!("--arch={deb_arch}")).arg(format!("--components={}", r.components.join(",")));
        if !r.include.is_empty() {
            cmd.arg(format!("--include={}", r.include.join(",")));
        }
        if let Some(k) = &r.keyring {
            cmd.arg(format!("--keyring={}", k.display()));
        }
        cmd.arg(format!("--cache-dir={}", self.cache.display())).arg(&r.suite).arg(self.tree).arg(self.mirror);
        self.steps.host(&format!("debootstrap --variant={} {} ({})", r.variant, r.suite, self.mirror), cmd)?;

        // Files the chroot steps need.
        self.configure()?;

        if !r.pre_install.is_empty() {
            let script = format!("set -e\ncd /\n{}\n", r.pre_install.join("\n"));
            self.chroot("pre_install", &script, false)?;
        }
        self.chroot("apt-get update", "set -e\napt-get -q update\n", false)?;
        let install = format!(
            "set -e\napt-get -q -y --no-install-recommends -o APT::Keep-Downloaded-Packages=true install {}\n",
            r.packages.join(" ")
        );
        self.chroot(&format!("apt-get install ({} packages)", r.packages.len()), &install, true)?;
        if !(r.remove_packages.is_empty() && r.remove_paths.is_empty()) {
            self.chroot("remove the distro's driver libraries", &scripts::removal(r), false)?;
        }
        self.chroot(&format!("create user {} (uid {})", r.user.name, r.user.uid), &scripts::user(&r.user), false)?;
        if !r.post_install.is_empty() {
            let script = format!("set -e\ncd /\n{}\n", r.post_install.join("\n"));
            self.chroot("post_install", &script, false)?;
        }
        self.chroot("clean up", &scripts::cleanup(self.keep_apt_lists), false)?;
        self.unconfigure()?;

        self.steps.ui.begin("check arch and CUDA version");
        let checked = self.check();
        self.steps.ui.end(checked.is_ok());
        checked
    }

    /// A chroot step: `script` in the tree, with the .deb cache for `with_cache`.
    fn chroot(&mut self, label: &str, script: &str, with_cache: bool) -> Result<()> {
        self.steps.chroot(label, self.tree, script, with_cache.then_some(self.cache))
    }

    /// Replaces `rel` in the tree with a regular file (never writing through a symlink).
    fn put(&self, rel: &str, content: &[u8], mode: u32) -> Result<()> {
        let p = self.tree.join(rel);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
        }
        match std::fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("cannot replace {}", p.display()))
            }
            _ => {}
        }
        let mut f = File::options()
            .write(true)
            .create_new(true)
            .open(&p)
            .with_context(|| format!("cannot create {}", p.display()))?;
        f.write_all(content).with_context(|| format!("cannot write {}", p.display()))?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        Ok(())
    }

    fn configure(&mut self) -> Result<()> {
        self.put("etc/apt/sources.list", self.recipe.sources_list(self.mirror).as_bytes(), 0o644)?;
        // debootstrap of newer suites may write deb822 sources too: one definition only.
        let _ = std::fs::remove_file(self.tree.join(format!("etc/apt/sources.list.d/{}.sources", self.recipe.distro)));
        self.put(
            "etc/apt/apt.conf.d/99azp-sandbox-build",
            // apt and dpkg options of every recipe build (no fsync per .deb file: the
            // whole tree is synced once at the end); removed again by the clean-up.
            include_bytes!("../../../rootfs-recipes/apt-build.conf"),
            0o644,
        )?;
        self.put(
            "usr/sbin/policy-rc.d",
            b"#!/bin/sh\n# azp-sandbox rootfs build: start no services\nexit 101\n",
            0o755,
        )?;
        let resolv = std::fs::read("/etc/resolv.conf").unwrap_or_default();
        self.put("etc/resolv.conf", &resolv, 0o644)?;
        Ok(())
    }

    fn unconfigure(&mut self) -> Result<()> {
        for rel in ["etc/apt/apt.conf.d/99azp-sandbox-build", "usr/sbin/policy-rc.d"] {
            let p = self.tree.join(rel);
            std::fs::remove_file(&p)
                .or_else(|e| if e.kind() == std::io::ErrorKind::NotFound { Ok(()) } else { Err(e) })
                .with_context(|| format!("cannot remove {}", p.display()))?;
        }
        // Jobs get the host's resolv.conf bound over it; the host name is set per job.
        self.put("etc/resolv.conf", b"# replaced by the host's resolv.conf in every azp-sandbox job\n", 0o644)?;
        self.put("etc/hostname", b"localhost\n", 0o644)?;
        self.put("usr/share/azp-sandbox/recipe.toml", self.recipe.text.as_bytes(), 0o644)?;
        Ok(())
    }

    /// The built tree against the recipe: arch of its binaries, CUDA version of its
    /// packages (when they name one). Returns what the store records.
    fn check(&mut self) -> Result<(Option<String>, String)> {
        let r = self.recipe;
        let fd =
            crate::sys::fs_at::open_dir(self.tree).with_context(|| format!("cannot open {}", self.tree.display()))?;
        let arch = probe::arch(fd.as_raw_fd());
        let cuda = probe::cuda_version(fd.as_raw_fd());
        self.steps.log_line(&format!("\n==> checks: arch {arch:?}, CUDA from the packages {cuda:?}"));
        match arch.as_deref() {
            Some(a) if a == r.arch => {}
            other => bail!(
                "recipe {} says arch {}, but the built tree's /bin/sh is {}",
                r.name,
                r.arch,
                other.unwrap_or("not an ELF binary")
            ),
        }
        match (&r.cuda_version, &cuda) {
            (Some(want), Some(got)) if got == want || got.starts_with(&format!("{want}.")) => {}
            (Some(want), Some(got)) => bail!(
                "recipe {} says cuda_version {want}, but the installed packages are CUDA {got}: fix the recipe's `cuda_version` or `packages`",
                r.name
            ),
            (Some(want), None) => tracing::warn!(
                "recipe {} says CUDA {want}; no CUDA package or version file found to confirm it",
                r.name
            ),
            (None, Some(got)) => tracing::warn!(
                "recipe {} has no cuda_version but installs CUDA {got}: recording none (`--rootfs auto` will not pick it)",
                r.name
            ),
            (None, None) => {}
        }
        Ok((r.cuda_version.clone(), r.arch.clone()))
    }
}
