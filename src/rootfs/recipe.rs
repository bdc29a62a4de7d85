//! `azp-sandbox rootfs build RECIPE`: root filesystems from small declarative recipes
//! (`rootfs-recipes/*.toml`, format in `rootfs-recipes/README.md`), built with
//! debootstrap + apt, without Docker.
//!
//! A build, as root:
//! 1. `debootstrap --variant=minbase SUITE` into the store's temp import dir (same
//!    filesystem as the store: the finished tree is renamed into place by
//!    [`Store::import_with`], so a name is either complete or absent);
//! 2. in a chroot, `apt-get update`, `apt-get install --no-install-recommends PACKAGES`,
//!    removal of the distro's own NVIDIA driver libraries (the host's must win), the
//!    unprivileged user, `post_install`, clean-up;
//! 3. checks (arch, CUDA version of the installed packages against the recipe's), then
//!    the store records `cuda_version`, `arch` and `source = "recipe NAME (sha256:…)"`.
//!
//! Every step is a child process in its own process group and its own PRIVATE mount
//! namespace (`unshare(CLONE_NEWNS)` + `MS_REC|MS_PRIVATE` in the forked child, before
//! `exec`): `/proc`, `/sys`, `/dev` and the .deb cache are mounted there only, so they
//! vanish with the step's processes, even after SIGKILL, and are never visible on the
//! host. `.deb` files are kept in a cache dir between builds (bind-mounted over
//! `/var/cache/apt/archives`, and debootstrap's `--cache-dir`). Tool output goes to a
//! log file; a failing step prints its last 20 lines.

use super::store::ImportFacts;
use super::{probe, validate_name, RootfsInfo, Store, CANCEL};
use crate::config::Home;
use anyhow::{anyhow, bail, Context, Result};
use std::ffi::CString;
use std::fs::File;
use std::io::{IsTerminal, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Recipes compiled into the binary: the last place a name is looked up, so an installed
/// binary builds the shipped recipes without the repository.
const BUILTIN: &[(&str, &str)] = &[
    ("debian-trixie-cuda12.4", include_str!("../../rootfs-recipes/debian-trixie-cuda12.4.toml")),
    ("debian-bookworm-cuda11.8", include_str!("../../rootfs-recipes/debian-bookworm-cuda11.8.toml")),
    ("debian-bookworm-cuda11.8-runtime", include_str!("../../rootfs-recipes/debian-bookworm-cuda11.8-runtime.toml")),
    ("debian-bookworm-minbase", include_str!("../../rootfs-recipes/debian-bookworm-minbase.toml")),
    ("ubuntu-22.04-cuda12.4", include_str!("../../rootfs-recipes/ubuntu-22.04-cuda12.4.toml")),
];

/// Where it came from, for messages and `source`.
const BUILTIN_PREFIX: &str = "(built-in)/";

/// The unprivileged user a recipe creates (`[user]`; default `azp`, uid 1000).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct User {
    pub name: String,
    pub uid: u32,
    /// Default: the uid.
    pub gid: Option<u32>,
    /// Default: `/home/NAME`.
    pub home: Option<String>,
    /// Default: `/bin/bash`.
    pub shell: Option<String>,
}

impl Default for User {
    fn default() -> User {
        User { name: "azp".into(), uid: 1000, gid: None, home: None, shell: None }
    }
}

impl User {
    pub fn gid(&self) -> u32 {
        self.gid.unwrap_or(self.uid)
    }
    pub fn home(&self) -> String {
        self.home.clone().unwrap_or_else(|| format!("/home/{}", self.name))
    }
    pub fn shell(&self) -> String {
        self.shell.clone().unwrap_or_else(|| "/bin/bash".into())
    }
}

/// A parsed, validated recipe. See `rootfs-recipes/README.md` for the keys.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// What the store records (`--rootfs auto` picks by it), e.g. `12.4`. None: no CUDA.
    pub cuda_version: Option<String>,
    /// `uname -m` style: x86_64, aarch64, ...
    pub arch: String,
    /// debian | ubuntu
    pub distro: String,
    pub suite: String,
    pub mirror: String,
    #[serde(default = "default_components")]
    pub components: Vec<String>,
    /// debootstrap `--variant`: minbase (default), buildd, or standard (no --variant).
    #[serde(default = "default_variant")]
    pub variant: String,
    /// debootstrap `--keyring`.
    pub keyring: Option<PathBuf>,
    /// debootstrap `--include` (packages needed before `pre_install`, e.g. curl).
    #[serde(default)]
    pub include: Vec<String>,
    /// `/etc/apt/sources.list` lines; `{mirror}`, `{suite}`, `{components}` are replaced.
    #[serde(default = "default_sources")]
    pub sources: Vec<String>,
    /// Shell lines run in the chroot before `apt-get update` (e.g. add a repository).
    #[serde(default)]
    pub pre_install: Vec<String>,
    /// Installed with `apt-get install --no-install-recommends`.
    #[serde(default)]
    pub packages: Vec<String>,
    /// Purged when that removes nothing else; otherwise their files are deleted (dpkg
    /// keeps listing them) and recorded in `/usr/share/azp-sandbox/removed-files`.
    #[serde(default)]
    pub remove_packages: Vec<String>,
    /// Globs relative to the rootfs, deleted after `remove_packages` (and recorded).
    #[serde(default)]
    pub remove_paths: Vec<String>,
    /// Shell lines run in the chroot after the user is created.
    #[serde(default)]
    pub post_install: Vec<String>,
    #[serde(default)]
    pub user: User,

    /// The file it was read from (`(built-in)/NAME.toml` for compiled-in recipes).
    #[serde(skip)]
    pub path: PathBuf,
    /// SHA-256 of the file, hex.
    #[serde(skip)]
    pub sha256: String,
    /// The file's text (copied into the rootfs as `/usr/share/azp-sandbox/recipe.toml`).
    #[serde(skip)]
    pub text: String,
}

fn default_components() -> Vec<String> {
    vec!["main".into()]
}
fn default_variant() -> String {
    "minbase".into()
}
fn default_sources() -> Vec<String> {
    vec!["deb {mirror} {suite} {components}".into()]
}

/// Debian's name for a `uname -m` architecture.
pub fn deb_arch(arch: &str) -> Option<&'static str> {
    Some(match arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "ppc64le" => "ppc64el",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        "i386" | "i686" => "i386",
        "arm" => "armhf",
        _ => return None,
    })
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    super::archive::hex(&sha2::Sha256::digest(bytes))
}

/// The key a toml error at byte `at` belongs to: the nearest `key =` at or above it,
/// prefixed by its `[table]`.
fn key_at(text: &str, at: usize) -> Option<String> {
    let upto = &text[..at.min(text.len())];
    let mut key = None;
    for line in upto.lines().rev() {
        let t = line.trim_start();
        if key.is_none() {
            if let Some((k, _)) = t.split_once('=') {
                let k = k.trim();
                if !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || "_-.\"".contains(c)) {
                    key = Some(k.trim_matches('"').to_string());
                    continue;
                }
            }
        }
        if let Some(table) = t.strip_prefix('[').and_then(|r| r.split_once(']')).map(|(n, _)| n.trim()) {
            return Some(match key {
                Some(k) => format!("{table}.{k}"),
                None => table.to_string(),
            });
        }
    }
    key
}

fn is_package_name(s: &str) -> bool {
    // name[:arch][=version]
    let (name, ver) = s.split_once('=').map_or((s, None), |(n, v)| (n, Some(v)));
    let name =
        name.split_once(':').map_or(name, |(n, a)| if a.chars().all(|c| c.is_ascii_alphanumeric()) { n } else { "" });
    let b = name.as_bytes();
    b.len() >= 2
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter().all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"+-.".contains(&c))
        && ver.is_none_or(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_alphanumeric() || ".+~:-".contains(c)))
}

fn is_version(s: &str) -> bool {
    let parts: Vec<&str> = s.split('.').collect();
    (2..=3).contains(&parts.len()) && parts.iter().all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

fn is_plain_word(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

impl Recipe {
    /// Reads and validates a recipe file.
    pub fn load(path: &Path) -> Result<Recipe> {
        let bytes = std::fs::read(path).with_context(|| format!("cannot read recipe {}", path.display()))?;
        let text = String::from_utf8(bytes).map_err(|_| anyhow!("recipe {}: not UTF-8 text", path.display()))?;
        Recipe::parse(&text, path)
    }

    /// Parses and validates recipe `text`; errors are one line naming `origin` and the key.
    pub fn parse(text: &str, origin: &Path) -> Result<Recipe> {
        let mut r: Recipe = toml::from_str(text).map_err(|e| {
            let msg = e.message().replace('\n', " ");
            let key = ["missing field `", "unknown field `"]
                .iter()
                .find_map(|p| msg.split_once(p).and_then(|(_, r)| r.split_once('`')).map(|(k, _)| k.to_string()))
                .or_else(|| e.span().and_then(|s| key_at(text, s.start)));
            let line = e.span().map(|s| text[..s.start.min(text.len())].lines().count().max(1));
            let mut out = format!("recipe {}:", origin.display());
            if let Some(k) = key {
                out.push_str(&format!(" key `{k}`:"));
            }
            out.push_str(&format!(" {msg}"));
            if let Some(l) = line {
                out.push_str(&format!(" (line {l})"));
            }
            anyhow!(out)
        })?;
        r.path = origin.to_path_buf();
        r.sha256 = sha256_hex(text.as_bytes());
        r.text = text.to_string();
        r.validate()?;
        Ok(r)
    }

    fn bad(&self, key: &str, what: impl std::fmt::Display) -> anyhow::Error {
        anyhow!("recipe {}: key `{key}`: {what}", self.path.display())
    }

    fn validate(&self) -> Result<()> {
        validate_name(&self.name).map_err(|e| self.bad("name", e))?;
        if let Some(v) = &self.cuda_version {
            if !is_version(v) {
                return Err(self.bad("cuda_version", format!("'{v}' is not a version like 12.4")));
            }
        }
        if deb_arch(&self.arch).is_none() {
            return Err(
                self.bad("arch", format!("unknown architecture '{}' (use x86_64, aarch64, ppc64le, ...)", self.arch))
            );
        }
        if !matches!(self.distro.as_str(), "debian" | "ubuntu") {
            return Err(self.bad("distro", format!("'{}' is not supported (debian or ubuntu)", self.distro)));
        }
        if !is_plain_word(&self.suite) {
            return Err(self.bad("suite", format!("'{}' is not a suite name such as trixie", self.suite)));
        }
        check_url(&self.mirror).map_err(|e| self.bad("mirror", e))?;
        if self.components.is_empty() || !self.components.iter().all(|c| is_plain_word(c)) {
            return Err(self.bad("components", "must list components such as main, contrib, non-free"));
        }
        if !matches!(self.variant.as_str(), "minbase" | "buildd" | "standard") {
            return Err(self.bad("variant", format!("'{}' is not minbase, buildd or standard", self.variant)));
        }
        if let Some(k) = &self.keyring {
            if !k.is_absolute() {
                return Err(self.bad("keyring", "must be an absolute path"));
            }
        }
        if self.packages.is_empty() {
            return Err(self.bad("packages", "must list at least one package"));
        }
        for (key, list) in
            [("packages", &self.packages), ("include", &self.include), ("remove_packages", &self.remove_packages)]
        {
            if let Some(p) = list.iter().find(|p| !is_package_name(p)) {
                return Err(self.bad(key, format!("'{}' is not a package name", p.escape_debug())));
            }
        }
        if self.sources.is_empty() {
            return Err(self.bad("sources", "must have at least one line"));
        }
        for s in &self.sources {
            if !(s.starts_with("deb ") || s.starts_with("deb [")) || s.contains('\n') {
                return Err(self.bad(
                    "sources",
                    format!("'{}' is not a one-line `deb URL SUITE COMPONENTS` entry", s.escape_debug()),
                ));
            }
        }
        for p in &self.remove_paths {
            let ok = !p.is_empty()
                && !p.split('/').any(|c| c == "..")
                && p.trim_start_matches('/').len() > 1
                && p.chars().all(|c| c.is_ascii_alphanumeric() || "._-+@*?[]/".contains(c));
            if !ok {
                return Err(
                    self.bad("remove_paths", format!("'{}' is not a path or glob inside the rootfs", p.escape_debug()))
                );
            }
        }
        for (key, list) in [("pre_install", &self.pre_install), ("post_install", &self.post_install)] {
            if list.iter().any(|l| l.contains('\0')) {
                return Err(self.bad(key, "NUL byte in a shell line"));
            }
        }
        let u = &self.user;
        let name_ok = !u.name.is_empty()
            && u.name.len() <= 32
            && u.name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            && u.name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_-".contains(c));
        if !name_ok {
            return Err(self.bad("user.name", format!("'{}' is not a user name", u.name.escape_debug())));
        }
        if u.uid == 0 || u.uid >= 65534 || u.gid() == 0 || u.gid() >= 65534 {
            return Err(self.bad("user.uid", "the user must be unprivileged: uid and gid between 1 and 65533"));
        }
        for (key, p) in [("user.home", u.home()), ("user.shell", u.shell())] {
            if !p.starts_with('/') || !p.chars().all(|c| c.is_ascii_alphanumeric() || "._-/".contains(c)) {
                return Err(self.bad(key, format!("'{}' is not an absolute path", p.escape_debug())));
            }
        }
        Ok(())
    }

    /// `/etc/apt/sources.list` for `mirror`.
    pub fn sources_list(&self, mirror: &str) -> String {
        let mut out = String::from("# written by azp-sandbox rootfs build\n");
        for s in &self.sources {
            out.push_str(
                &s.replace("{mirror}", mirror)
                    .replace("{suite}", &self.suite)
                    .replace("{components}", &self.components.join(" ")),
            );
            out.push('\n');
        }
        out
    }
}

fn check_url(u: &str) -> Result<(), String> {
    let ok = ["http://", "https://", "file:/"].iter().any(|p| u.starts_with(p))
        && u.len() > 8
        && !u.chars().any(|c| c.is_whitespace() || c.is_control() || "'\"\\`$".contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!("'{}' is not an http(s):// or file:/ URL", u.escape_debug()))
    }
}

/// Directories searched for `NAME.toml`, in order: the site's (`/etc`), the repository
/// next to the binary (`<repo>/target/*/azp-sandbox` -> `<repo>/rootfs-recipes`), the
/// packaged ones (`/usr/share`); the recipes compiled into the binary come last.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![PathBuf::from("/etc/azp-sandbox/rootfs-recipes")];
    if let Ok(exe) = std::env::current_exe() {
        if let Some(d) = exe.ancestors().skip(1).take(4).map(|a| a.join("rootfs-recipes")).find(|d| d.is_dir()) {
            dirs.push(d);
        }
    }
    dirs.push(PathBuf::from("/usr/share/azp-sandbox/rootfs-recipes"));
    dirs
}

/// Names of the recipes found in [`search_dirs`] and built in, sorted, without duplicates.
pub fn available() -> Vec<String> {
    let mut names: Vec<String> = BUILTIN.iter().map(|(n, _)| n.to_string()).collect();
    for d in search_dirs() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            if let Some(n) = e.file_name().to_str().and_then(|n| n.strip_suffix(".toml")) {
                names.push(n.to_string());
            }
        }
    }
    names.sort();
    names.dedup();
    names
}

/// The recipes compiled into the binary, parsed.
pub fn builtin() -> Vec<Recipe> {
    BUILTIN
        .iter()
        .map(|(n, text)| Recipe::parse(text, &Path::new(BUILTIN_PREFIX).join(format!("{n}.toml"))))
        .collect::<Result<_>>()
        .expect("built-in recipes are valid (checked by the tests)")
}

/// RECIPE as given on the command line: a path (contains `/` or ends in `.toml`), or a
/// name looked up in [`search_dirs`], then among the built-in recipes.
pub fn find(spec: &str) -> Result<Recipe> {
    if spec.contains('/') || spec.ends_with(".toml") {
        let p = Path::new(spec);
        if !p.exists() {
            bail!("recipe file {spec} not found");
        }
        return Recipe::load(p);
    }
    if !is_plain_word(spec) {
        bail!("'{}' is neither a recipe name nor a .toml file", spec.escape_debug());
    }
    for d in search_dirs() {
        let p = d.join(format!("{spec}.toml"));
        if p.is_file() {
            return Recipe::load(&p);
        }
    }
    if let Some((n, text)) = BUILTIN.iter().find(|(n, _)| *n == spec) {
        return Recipe::parse(text, &Path::new(BUILTIN_PREFIX).join(format!("{n}.toml")));
    }
    bail!(
        "unknown recipe '{spec}': known recipes are {} (looked in {}); or give the path of a .toml file",
        available().join(", "),
        search_dirs().iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
    )
}

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
    let recipe = find(spec)?;
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
            name: &name,
            mirror: &mirror,
            cache: &cache,
            tree: &tree,
            log,
            log_path: &opts.log_path,
            ui: Ui::new(recipe),
            keep_apt_lists: opts.keep_apt_lists,
        };
        let r = b.run(&debootstrap, deb_arch);
        // Whatever happened, nothing of the build may keep running in the tree.
        let strays = kill_strays(&tree);
        if strays > 0 {
            tracing::warn!("killed {strays} process(es) left running in the build chroot");
        }
        let (cuda, arch) = r?;
        // dpkg ran with --force-unsafe-io (no fsync per file): flush the whole tree once
        // before the store renames it into place.
        // SAFETY: syncfs on a descriptor we hold.
        if unsafe { libc::syncfs(tree_fd.as_raw_fd()) } != 0 {
            return Err(std::io::Error::last_os_error()).context("cannot sync the new rootfs to disk");
        }
        removed_files = count_lines(&tree.join("usr/share/azp-sandbox/removed-files"));
        let (entries, bytes) = tree_size(&tree);
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
fn lock_cache(cache: &Path) -> Result<File> {
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(cache.join(".azp-build.lock"))
        .with_context(|| format!("cannot create a lock file in {}", cache.display()))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        tracing::info!("waiting for another rootfs build that uses {}", cache.display());
        // SAFETY: as above.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error()).with_context(|| format!("cannot lock {}", cache.display()));
        }
    }
    Ok(f)
}

fn count_lines(p: &Path) -> usize {
    std::fs::read_to_string(p).map(|s| s.lines().filter(|l| !l.is_empty()).count()).unwrap_or(0)
}

/// (entries, bytes of regular files) under `dir`, not following symlinks.
fn tree_size(dir: &Path) -> (u64, u64) {
    let (mut entries, mut bytes) = (0u64, 0u64);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            entries += 1;
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                bytes += e.metadata().map(|m| m.len()).unwrap_or(0);
            }
        }
    }
    (entries, bytes)
}

/// Kills every process whose root directory is inside `tree` (daemons a maintainer
/// script started despite policy-rc.d). Returns how many.
fn kill_strays(tree: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir("/proc") else { return 0 };
    let mut n = 0;
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        if std::fs::read_link(e.path().join("root")).is_ok_and(|r| r.starts_with(tree)) {
            // SAFETY: sending a signal.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            n += 1;
        }
    }
    n
}

/// Progress: on a terminal one live line per step (elapsed time and the tool's latest
/// output line), and always one log line per finished step.
struct Ui {
    total: usize,
    index: usize,
    label: String,
    step_started: Instant,
    last_draw: Option<Instant>,
    terminal: bool,
}

impl Ui {
    fn new(recipe: &Recipe) -> Ui {
        let optional = [
            !recipe.pre_install.is_empty(),
            !(recipe.remove_packages.is_empty() && recipe.remove_paths.is_empty()),
            !recipe.post_install.is_empty(),
        ];
        // debootstrap, apt-get update, apt-get install, user, clean-up, checks + optional ones
        let total = 6 + optional.iter().filter(|b| **b).count();
        Ui {
            total,
            index: 0,
            label: String::new(),
            step_started: Instant::now(),
            last_draw: None,
            terminal: std::io::stderr().is_terminal(),
        }
    }

    fn begin(&mut self, label: &str) {
        self.index += 1;
        self.label = label.to_string();
        self.step_started = Instant::now();
        self.last_draw = None;
        if self.terminal {
            let _ = write!(std::io::stderr(), "\r\x1b[K[{}/{}] {label} ...", self.index, self.total);
        } else {
            tracing::info!("[{}/{}] {label} ...", self.index, self.total);
        }
    }

    fn tick(&mut self, log: &Path) {
        if !self.terminal || self.last_draw.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return;
        }
        self.last_draw = Some(Instant::now());
        let last: String = last_line(log).chars().take(70).collect();
        let _ = write!(
            std::io::stderr(),
            "\r\x1b[K[{}/{}] {} ... {:.0}s  {last}",
            self.index,
            self.total,
            self.label,
            self.step_started.elapsed().as_secs_f64()
        );
    }

    fn end(&mut self, ok: bool) {
        if self.terminal {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
        }
        let secs = self.step_started.elapsed().as_secs_f64();
        if ok {
            tracing::info!("[{}/{}] {}: done in {secs:.0} s", self.index, self.total, self.label);
        } else {
            tracing::error!("[{}/{}] {}: failed after {secs:.0} s", self.index, self.total, self.label);
        }
    }
}

/// The last non-empty line of `path` (of its last 4 KiB).
fn last_line(path: &Path) -> String {
    tail_lines(path, 1, 4096).pop().unwrap_or_default()
}

/// The last `n` non-empty lines of `path`, reading at most `max` bytes from its end.
fn tail_lines(path: &Path, n: usize, max: u64) -> Vec<String> {
    let Ok(mut f) = File::open(path) else { return vec![] };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(max)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<String> = text
        .lines()
        .map(|l| l.rsplit('\r').next().unwrap_or("").trim_end().to_string())
        .filter(|l| !l.trim().is_empty())
        .collect();
    lines[lines.len().saturating_sub(n)..].to_vec()
}

struct Builder<'a> {
    recipe: &'a Recipe,
    name: &'a str,
    mirror: &'a str,
    cache: &'a Path,
    tree: &'a Path,
    log: File,
    log_path: &'a Path,
    ui: Ui,
    keep_apt_lists: bool,
}

/// Environment passed to every step: a fixed PATH and locale, plus the caller's proxies.
fn base_env(cmd: &mut Command) {
    cmd.env_clear()
        .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        .env("LC_ALL", "C")
        .env("LANG", "C")
        .env("HOME", "/root")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .env("DEBCONF_NONINTERACTIVE_SEEN", "true");
    for k in ["http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ftp_proxy"] {
        if let Some(v) = std::env::var_os(k) {
            cmd.env(k, v);
        }
    }
}

fn cpath(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| anyhow!("NUL byte in {}", p.display()))
}

/// A mount point inside the tree that must be a real directory (never a symlink, which
/// mount(2) would follow out of the tree).
fn mount_point(tree: &Path, rel: &str) -> Result<CString> {
    let p = tree.join(rel);
    match p.symlink_metadata() {
        Ok(m) if m.is_dir() => {}
        Ok(_) => bail!("/{rel} in the new rootfs is not a directory: refusing to mount on it"),
        Err(_) => std::fs::create_dir_all(&p).with_context(|| format!("cannot create {}", p.display()))?,
    }
    cpath(&p)
}

/// Makes the child's mounts private to it: a new mount namespace, nothing propagating
/// back to the host. Must run in the forked child (async-signal-safe: syscalls only).
fn private_mount_ns() -> std::io::Result<()> {
    // SAFETY: plain syscalls in the forked child, on pointers to static strings.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Mounts a fresh `fstype` at `target`, or bind-mounts `fallback` there when that is not
/// allowed (some container hosts forbid new proc/sysfs instances).
///
/// # Safety
/// Forked child only; pointers valid.
unsafe fn mount_or_bind(fstype: &std::ffi::CStr, target: &CString, fallback: &std::ffi::CStr) -> std::io::Result<()> {
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    if libc::mount(fstype.as_ptr(), target.as_ptr(), fstype.as_ptr(), flags, std::ptr::null()) == 0 {
        return Ok(());
    }
    if libc::mount(fallback.as_ptr(), target.as_ptr(), std::ptr::null(), libc::MS_BIND | libc::MS_REC, std::ptr::null())
        == 0
    {
        return Ok(());
    }
    Err(std::io::Error::last_os_error())
}

impl Builder<'_> {
    /// All steps; returns (CUDA version to record, arch).
    fn run(&mut self, debootstrap: &Path, deb_arch: &str) -> Result<(Option<String>, String)> {
        let r = self.recipe;
        // 1. debootstrap
        let mut cmd = Command::new(debootstrap);
        base_env(&mut cmd);
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
        // SAFETY: private_mount_ns only makes syscalls.
        unsafe { cmd.pre_exec(private_mount_ns) };
        let detail = format!("$ {cmd:?}");
        self.step(&format!("debootstrap --variant={} {} ({})", r.variant, r.suite, self.mirror), &detail, cmd)?;

        // Files the chroot steps need.
        self.configure()?;

        if !r.pre_install.is_empty() {
            let script = format!("set -e\ncd /\n{}\n", r.pre_install.join("\n"));
            self.chroot_step("pre_install", &script, false)?;
        }
        self.chroot_step("apt-get update", "set -e\napt-get -q update\n", false)?;
        let install = format!(
            "set -e\napt-get -q -y --no-install-recommends -o APT::Keep-Downloaded-Packages=true install {}\n",
            r.packages.join(" ")
        );
        self.chroot_step(&format!("apt-get install ({} packages)", r.packages.len()), &install, true)?;
        if !(r.remove_packages.is_empty() && r.remove_paths.is_empty()) {
            self.chroot_step("remove the distro's driver libraries", &self.removal_script(), false)?;
        }
        self.chroot_step(&format!("create user {} (uid {})", r.user.name, r.user.uid), &self.user_script(), false)?;
        if !r.post_install.is_empty() {
            let script = format!("set -e\ncd /\n{}\n", r.post_install.join("\n"));
            self.chroot_step("post_install", &script, false)?;
        }
        self.chroot_step("clean up", &self.cleanup_script(), false)?;
        self.unconfigure()?;

        self.ui.begin("check arch and CUDA version");
        let checked = self.check();
        self.ui.end(checked.is_ok());
        checked
    }

    fn log_line(&mut self, s: &str) {
        let _ = writeln!(self.log, "{s}");
    }

    /// Runs one step to completion, its output in the log; on failure prints the log's
    /// last 20 lines and fails with a one-line error.
    fn step(&mut self, label: &str, detail: &str, mut cmd: Command) -> Result<()> {
        self.ui.begin(label);
        self.log_line(&format!("\n==> [{}/{}] {label}\n{detail}", self.ui.index, self.ui.total));
        let out = self.log.try_clone().context("cannot duplicate the log file")?;
        let err = self.log.try_clone().context("cannot duplicate the log file")?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err).process_group(0);
        let mut child = cmd.spawn().with_context(|| format!("cannot start {label}"))?;
        let pgid = child.id() as i32;
        let status = loop {
            match child.try_wait() {
                Ok(Some(st)) => break st,
                Ok(None) => {}
                Err(e) => return Err(e).with_context(|| format!("cannot wait for {label}")),
            }
            if CANCEL.load(Ordering::SeqCst) {
                // SAFETY: signalling the step's own process group.
                unsafe { libc::kill(-pgid, libc::SIGTERM) };
                std::thread::sleep(Duration::from_millis(500));
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
                let _ = child.wait();
                self.ui.end(false);
                bail!("build of '{}' interrupted during {label}", self.name);
            }
            self.ui.tick(self.log_path);
            std::thread::sleep(Duration::from_millis(100));
        };
        // Anything the step left behind in its group (the leader is gone).
        // SAFETY: signalling the step's own process group; ESRCH when empty.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        self.ui.end(status.success());
        if !status.success() {
            let tail = tail_lines(self.log_path, 20, 64 << 10);
            let mut e = std::io::stderr().lock();
            let _ = writeln!(e, "--- last {} lines of {} ---", tail.len(), self.log_path.display());
            for l in tail {
                let _ = writeln!(e, "  | {l}");
            }
            let what = match status.code() {
                Some(c) => format!("exit status {c}"),
                None => format!("{status}"),
            };
            bail!("{label} failed ({what}); its last lines are above, full log: {}", self.log_path.display());
        }
        Ok(())
    }

    /// Runs `script` with /bin/sh in the tree, chrooted, in a private mount namespace with
    /// /proc, /sys and /dev (and, for `with_cache`, the .deb cache) mounted.
    fn chroot_step(&mut self, label: &str, script: &str, with_cache: bool) -> Result<()> {
        let root = cpath(self.tree)?;
        let proc_ = mount_point(self.tree, "proc")?;
        let sys = mount_point(self.tree, "sys")?;
        let dev = mount_point(self.tree, "dev")?;
        let archives = if with_cache {
            Some((cpath(self.cache)?, mount_point(self.tree, "var/cache/apt/archives")?))
        } else {
            None
        };
        let mut cmd = Command::new("/bin/sh");
        base_env(&mut cmd);
        cmd.arg("-c").arg(script);
        // SAFETY: the closure makes syscalls only, on CStrings allocated before the fork.
        unsafe {
            cmd.pre_exec(move || {
                private_mount_ns()?;
                mount_or_bind(c"proc", &proc_, c"/proc")?;
                mount_or_bind(c"sysfs", &sys, c"/sys")?;
                if libc::mount(
                    c"/dev".as_ptr(),
                    dev.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some((src, dst)) = &archives {
                    if libc::mount(src.as_ptr(), dst.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if libc::chroot(root.as_ptr()) != 0 || libc::chdir(c"/".as_ptr()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
        };
        self.step(label, &format!("$ chroot {} /bin/sh -c '{}'", self.tree.display(), script.trim_end()), cmd)
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
            b"// temporary, while azp-sandbox builds this rootfs\nAcquire::Retries \"3\";\n\
              Dpkg::Options { \"--force-confdef\"; \"--force-confold\"; \"--force-unsafe-io\"; };\nDpkg::Use-Pty \"false\";\nAcquire::Languages \"none\";\n",
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

    fn removal_script(&self) -> String {
        let r = self.recipe;
        // The patterns are validated ([A-Za-z0-9._-+@*?[]/] only): safe unquoted.
        let globs: Vec<String> = r.remove_paths.iter().map(|p| format!("/{}", p.trim_start_matches('/'))).collect();
        r#"set -e
rec=/usr/share/azp-sandbox/removed-files
mkdir -p /usr/share/azp-sandbox
: > "$rec.tmp"
installed=
for p in @PKGS@; do
    if [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" = installed ]; then installed="$installed $p"; fi
done
if [ -n "$installed" ]; then
    others=$(apt-get -s -q purge $installed | awk '/^(Purg|Remv) / {print $2}' | while read -r q; do
        case " $installed " in *" $q "*) ;; *) echo "$q" ;; esac
    done)
    if [ -z "$others" ]; then
        echo "azp-sandbox: purging$installed"
        apt-get -q -y purge $installed
        apt-get -q -y autoremove --purge
    else
        echo "azp-sandbox: purging$installed would also remove: $(echo $others)"
        echo "azp-sandbox: deleting their files instead (dpkg keeps listing the packages)"
        for p in $installed; do
            dpkg-query -L "$p" | while IFS= read -r f; do
                if [ -L "$f" ] || { [ -e "$f" ] && [ ! -d "$f" ]; }; then rm -f -- "$f"; echo "$f" >> "$rec.tmp"; fi
            done
        done
    fi
else
    echo "azp-sandbox: none of @PKGS@ is installed"
fi
for f in @GLOBS@; do
    if [ -L "$f" ] || [ -e "$f" ]; then rm -rf -- "$f"; echo "$f" >> "$rec.tmp"; fi
done
sort -u "$rec.tmp" > "$rec"
rm -f "$rec.tmp"
echo "azp-sandbox: removed $(wc -l < "$rec") file(s), listed in $rec"
[ -s "$rec" ] || rm -f "$rec"
ldconfig
"#
        .replace("@PKGS@", &r.remove_packages.join(" "))
        .replace("@GLOBS@", &globs.join(" "))
    }

    fn user_script(&self) -> String {
        let u = &self.recipe.user;
        r#"set -e
if getent passwd @NAME@ >/dev/null || getent passwd @UID@ >/dev/null; then
    echo "azp-sandbox: user @NAME@ or uid @UID@ already exists in the rootfs" >&2; exit 1
fi
getent group @GID@ >/dev/null || groupadd --gid @GID@ @NAME@
useradd --uid @UID@ --gid @GID@ --create-home --home-dir @HOME@ --shell @SHELL@ @NAME@
id @NAME@
"#
        .replace("@NAME@", &u.name)
        .replace("@UID@", &u.uid.to_string())
        .replace("@GID@", &u.gid().to_string())
        .replace("@HOME@", &u.home())
        .replace("@SHELL@", &u.shell())
    }

    fn cleanup_script(&self) -> String {
        let mut s = String::from("set -e\n");
        if !self.keep_apt_lists {
            s.push_str("apt-get clean\nrm -rf /var/lib/apt/lists/*\nrm -f /var/cache/apt/*.bin\n");
        } else {
            // .debs never stay in the rootfs (they went to the bind-mounted cache).
            s.push_str("rm -f /var/cache/apt/archives/*.deb\n");
        }
        s.push_str("rm -rf /tmp/* /var/tmp/*\nldconfig\n");
        s
    }

    /// The built tree against the recipe: arch of its binaries, CUDA version of its
    /// packages (when they name one). Returns what the store records.
    fn check(&mut self) -> Result<(Option<String>, String)> {
        let r = self.recipe;
        let fd =
            crate::sys::fs_at::open_dir(self.tree).with_context(|| format!("cannot open {}", self.tree.display()))?;
        let arch = probe::arch(fd.as_raw_fd());
        let cuda = probe::cuda_version(fd.as_raw_fd());
        self.log_line(&format!("\n==> checks: arch {arch:?}, CUDA from the packages {cuda:?}"));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn minimal() -> String {
        "name = \"t\"\narch = \"x86_64\"\ndistro = \"debian\"\nsuite = \"bookworm\"\n\
         mirror = \"http://deb.debian.org/debian\"\npackages = [\"busybox\"]\n"
            .to_string()
    }

    #[test]
    fn builtins_parse() {
        let all = builtin();
        assert_eq!(all.len(), BUILTIN.len());
        for r in all {
            assert!(!r.packages.is_empty(), "{}", r.name);
        }
    }

    #[test]
    fn defaults() {
        let r = Recipe::parse(&minimal(), Path::new("t.toml")).unwrap();
        assert_eq!(r.user.name, "azp");
        assert_eq!(r.user.uid, 1000);
        assert_eq!(r.user.home(), "/home/azp");
        assert_eq!(r.variant, "minbase");
        assert_eq!(
            r.sources_list("http://m/debian"),
            "# written by azp-sandbox rootfs build\ndeb http://m/debian bookworm main\n"
        );
        assert_eq!(r.sha256.len(), 64);
    }

    #[test]
    fn errors_name_file_and_key() {
        let cases: &[(&str, &str)] = &[
            ("packages = [\"busybox\"]", "packages = [\"busybox\", 5]"),
            ("packages = [\"busybox\"]", "packages = []"),
            ("packages = [\"busybox\"]", "pakages = [\"busybox\"]"),
            ("arch = \"x86_64\"\n", ""),
            ("suite = \"bookworm\"", "suite = \"book worm\""),
            ("packages = [\"busybox\"]", "packages = [\"busybox\"]\n[user]\nname = \"azp\"\nuid = \"x\""),
            ("packages = [\"busybox\"]", "packages = [\"busybox\"]\n[user]\nname = \"root\"\nuid = 0"),
            ("packages = [\"busybox\"]", "packages = [\"Bad Name\"]"),
        ];
        let keys = ["packages", "packages", "pakages", "arch", "suite", "user.uid", "user.uid", "packages"];
        for ((from, to), key) in cases.iter().zip(keys) {
            let text = minimal().replace(from, to);
            let e = Recipe::parse(&text, Path::new("/x/bad.toml")).unwrap_err().to_string();
            assert!(e.starts_with("recipe /x/bad.toml: "), "{e}");
            assert!(e.contains(&format!("`{key}`")), "{key}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn package_names() {
        for ok in ["g++-11", "libicu76", "libssl3t64", "nvidia-cuda-toolkit", "libc6:amd64", "git=1:2.39.5-0+deb12u3"] {
            assert!(is_package_name(ok), "{ok}");
        }
        for bad in ["", "a", "Foo", "a b", "a;b", "$(x)", "-y", "a=", "a:b c"] {
            assert!(!is_package_name(bad), "{bad}");
        }
    }

    #[test]
    fn removal_script_lists() {
        let text = minimal() + "remove_packages = [\"libcuda1\"]\nremove_paths = [\"usr/lib/*/libcuda.so*\"]\n";
        let r = Recipe::parse(&text, Path::new("t.toml")).unwrap();
        let b = Builder {
            recipe: &r,
            name: "t",
            mirror: "http://m",
            cache: Path::new("/c"),
            tree: Path::new("/t"),
            log: File::open("/dev/null").unwrap(),
            log_path: Path::new("/dev/null"),
            ui: Ui::new(&r),
            keep_apt_lists: false,
        };
        let s = b.removal_script();
        assert!(s.contains("for p in libcuda1; do"), "{s}");
        assert!(s.contains("for f in /usr/lib/*/libcuda.so*; do"), "{s}");
        assert!(!s.contains('@'), "{s}");
    }
}
