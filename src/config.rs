//! Validated inputs: the home dir layout and the small value types the CLI parses
//! (`--volume`, `--memory`, `--env`, `--network`). Every parse error is one line that
//! says what to fix.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// How many bucket dirs `layers/` has (see [`Home::job_layers_dir`]).
pub const LAYER_BUCKETS: u32 = 16;
/// Bucket names start with it; a job id never does (ids start with a letter or digit).
const BUCKET_PREFIX: &str = "_";

/// The bucket of job `id`: FNV-1a of its bytes, so a slot's consecutive jobs
/// (`<agent>-1`, `<agent>-2`, ...) go to different buckets.
fn layer_bucket(id: &str) -> String {
    let h = id.bytes().fold(0x811c_9dc5u32, |h, b| (h ^ b as u32).wrapping_mul(0x0100_0193));
    format!("{BUCKET_PREFIX}{:x}", h % LAYER_BUCKETS)
}

/// The state directory (`--home`, `AZP_SANDBOX_HOME`: see [`crate::settings::home`]). Everything azp-sandbox writes
/// lives below it, so `gc` knows where to look.
///
/// Two places: the home itself (disk: rootfs store, caches, the jobs' upper/work layers)
/// and its runtime dir (tmpfs where possible, see [`Home::run_root`]) for what lives only
/// as long as a job: its record, lock, spec and mount point, and libcontainer's state.
#[derive(Debug, Clone)]
pub struct Home {
    root: PathBuf,
    /// Computed once the home exists (both depend on its canonical path).
    tag: std::sync::OnceLock<String>,
    run_root: std::sync::OnceLock<PathBuf>,
    mount_point: std::sync::OnceLock<PathBuf>,
}

impl Home {
    pub fn new(root: impl Into<PathBuf>) -> Home {
        Home {
            root: root.into(),
            tag: std::sync::OnceLock::new(),
            run_root: std::sync::OnceLock::new(),
            mount_point: std::sync::OnceLock::new(),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
    /// Imported root filesystems (`rootfs/<name>/`).
    pub fn rootfs_dir(&self) -> PathBuf {
        self.root.join("rootfs")
    }
    /// One record dir per running job (in the runtime dir): lock, state record, plan,
    /// bundle, merged mount point, libcontainer's state.
    pub fn jobs_dir(&self) -> PathBuf {
        self.run_root().join("jobs")
    }
    /// The jobs' layer dirs on the home's disk, in [`LAYER_BUCKETS`] bucket dirs (see
    /// [`Home::job_layers_dir`]).
    pub fn layers_dir(&self) -> PathBuf {
        self.root.join("layers")
    }
    /// One dir per running job on the home's disk, its overlay's `upper` and `work` (a
    /// job may write gigabytes; tmpfs is for the small records only):
    /// `layers/_<b>/<id>`, where the bucket `_<b>` is a hash of the id.
    ///
    /// Why buckets: `layers/` is `chattr +T`, so ext4 spreads the dirs made directly in it
    /// over its block groups (Orlov). Consecutive jobs of a slot should land in different
    /// groups: the next job's first files must not wait on the inode bitmap and table of
    /// the group the last job's thousands of files are being freed in (the refill after
    /// big jobs). But Orlov's search on every job's mkdir cost each `exec` 0.3-2.4 ms here
    /// (interleaved A/B; 3 mkdirs alone: 0.25-0.69 ms in a `+T` dir, 0.07-0.17 ms in a
    /// plain one). The buckets are spread once, and a job's dir is made next to its
    /// bucket, cheaply.
    pub fn job_layers_dir(&self, id: &str) -> PathBuf {
        self.layers_dir().join(layer_bucket(id)).join(id)
    }
    /// Every job layer dir on disk: `layers/_<b>/<id>`, and `layers/<id>` of a job made
    /// before buckets (gc removes those too).
    pub fn job_layer_dirs(&self) -> Vec<PathBuf> {
        let mut out = vec![];
        for e in std::fs::read_dir(self.layers_dir()).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with(BUCKET_PREFIX) {
                out.extend(std::fs::read_dir(e.path()).into_iter().flatten().flatten().map(|j| j.path()));
            } else {
                out.push(e.path());
            }
        }
        out
    }
    /// Present once gc has looked for job layer dirs without a record since the runtime
    /// dir was made (see [`crate::sandbox::gc_before_job`]): next to the runtime dir, so it
    /// goes where the records go (a reboot, when that is a tmpfs).
    pub fn layers_checked_marker(&self) -> PathBuf {
        self.run_root().with_file_name(format!(".layers-checked-{}", self.tag()))
    }
    /// Layer dirs renamed here at teardown, deleted in the background.
    pub fn trash_dir(&self) -> PathBuf {
        self.root.join("trash")
    }

    /// The runtime dir of this home: `/run/azp-sandbox/<tag>` as root,
    /// `$XDG_RUNTIME_DIR/azp-sandbox/<tag>` otherwise, `<home>/run` when neither exists.
    /// `<tag>` names the home ([`Home::tag`]), so homes never share records.
    ///
    /// Why not the home: a job creates and deletes a dozen small files and dirs (record,
    /// plan, spec, pid file, libcontainer's state, mount point). On a disk mounted with
    /// `discard` and no journal each freed block is a synchronous discard: ~7 ms per job
    /// on the test VM. runc and youki keep their state in /run for the same reason.
    pub fn run_root(&self) -> PathBuf {
        if let Some(p) = self.run_root.get() {
            return p.clone();
        }
        let euid = nix::unistd::geteuid();
        let dir = self.run_root_as(euid.is_root(), std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from));
        // The tag depends on the canonical home path: only final once the home exists.
        if !self.root.exists() {
            return dir;
        }
        self.run_root.get_or_init(|| dir).clone()
    }

    /// The home as a process that is root or not, with `XDG_RUNTIME_DIR` = `xdg`, sees it
    /// (tests that run azp-sandbox as another user look at its runtime dir).
    pub fn for_caller(root: impl Into<PathBuf>, is_root: bool, xdg: Option<PathBuf>) -> Home {
        let home = Home::new(root);
        let run = home.run_root_as(is_root, xdg);
        let _ = home.run_root.set(run);
        home
    }

    /// [`Home::run_root`] for a process that is root or not, with `XDG_RUNTIME_DIR` =
    /// `xdg`. An `xdg` that is not an absolute dir owned by the caller (as `su` may pass
    /// on another user's) is not used.
    fn run_root_as(&self, root: bool, xdg: Option<PathBuf>) -> PathBuf {
        use std::os::unix::fs::MetadataExt;
        let owned = |d: &PathBuf| {
            d.is_absolute()
                && std::fs::metadata(d).is_ok_and(|m| m.is_dir() && m.uid() == nix::unistd::geteuid().as_raw())
        };
        let base = if root { Some(PathBuf::from("/run")).filter(|d| d.is_dir()) } else { xdg.filter(owned) };
        match base {
            Some(b) => b.join("azp-sandbox").join(self.tag()),
            None => self.root.join("run"),
        }
    }

    /// `h-` and 8 hex digits of the sha256 of the home's canonical path: the home's own
    /// level under shared parents (runtime dir, cgroups). Read once per process (a
    /// canonicalize is a readlink per path component, and every job needs the tag).
    pub fn tag(&self) -> String {
        if let Some(t) = self.tag.get() {
            return t.clone();
        }
        // A home that does not exist yet has no canonical path: its path as given, not kept.
        let canonical = std::fs::canonicalize(&self.root);
        let path = canonical.as_deref().unwrap_or(&self.root);
        let tag =
            format!("h-{}", crate::digest::hex(&crate::digest::sha256_short(path.as_os_str().as_encoded_bytes())[..4]));
        match canonical {
            Ok(_) => self.tag.get_or_init(|| tag).clone(),
            Err(_) => tag,
        }
    }
    /// Where each job's helper mounts the job's overlay, in its own private mount
    /// namespace, so every job of the host uses the same dir (empty outside): the
    /// runtime tmpfs's `rootfs` as root, `<home>/mnt` otherwise. Not the job's record dir:
    /// libcontainer sets the job's mounts up as the job's root (of its own user
    /// namespace), by path, so every dir on the way must be searchable by any id
    /// ([`check_reachable`]); records are private (0700). A home below a
    /// private dir (`~/.local` is often 0700) uses `/tmp/azp-sandbox-<host uid>` instead
    /// (made and checked by [`crate::sandbox::jobdir`]).
    pub fn mount_point(&self) -> PathBuf {
        self.mount_point
            .get_or_init(|| {
                // Root of the host, not of a rootless user namespace (a rootless helper
                // is uid 0 in its namespace and must not pick root's dir in /run).
                let root = nix::unistd::geteuid().is_root() && !in_user_namespace();
                if let Some(base) = tmpfs_base(&self.run_root(), root) {
                    return base.join("rootfs");
                }
                let in_home = self.root.join("mnt");
                if check_reachable(&in_home).is_ok() {
                    return in_home;
                }
                let uid = if crate::rootless::mode().rootless {
                    crate::rootless::host_uid_of_root()
                } else {
                    nix::unistd::geteuid().as_raw()
                };
                PathBuf::from(format!("/tmp/azp-sandbox-{uid}"))
            })
            .clone()
    }

    /// Logs for a sysadmin: each agent's output (`<agent>.log`) and its jobs' `_diag`
    /// logs (`<agent>/<job>/`), rootfs builds.
    pub fn logs_dir(&self) -> PathBuf {
        self.root.join("logs")
    }
    /// Failed jobs kept for inspection (`run --keep-failed`): `<agent>/<job>/`, root-only.
    pub fn failed_dir(&self) -> PathBuf {
        self.root.join("failed")
    }
    /// Caches shared by jobs (agent packages, linker caches, OCI blobs).
    pub fn cache_dir(&self) -> PathBuf {
        self.root.join("cache")
    }

    /// Creates the top-level dirs (mode 0711: other users may traverse to bind sources
    /// but not list jobs).
    pub fn ensure(&self) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        for dir in [self.root.clone(), self.rootfs_dir(), self.layers_dir(), self.trash_dir(), self.cache_dir()] {
            std::fs::create_dir_all(&dir).with_context(|| {
                format!("cannot create {}: check --home / AZP_SANDBOX_HOME and free space", dir.display())
            })?;
            // Only when it differs: a chmod is an inode write (and a journal entry) on
            // every `exec`, for a mode that is almost always right already.
            let mode = std::fs::metadata(&dir).map(|m| m.permissions().mode() & 0o7777).unwrap_or(0);
            if mode != 0o711 {
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))
                    .with_context(|| format!("cannot set permissions on {}", dir.display()))?;
            }
        }
        crate::sys::spread_subdirs(&self.layers_dir());
        Ok(())
    }

    /// The dir that must be a tmpfs for this home's job records, when azp-sandbox has to
    /// see to it: `/run/azp-sandbox` as root (see [`crate::sys::runtime_tmpfs`]), None
    /// otherwise. Only the verbs that run sandboxes mount it
    /// ([`crate::sandbox::prepare_home`]): a home is also made by `rootfs import`.
    pub fn runtime_tmpfs_dir(&self) -> Option<PathBuf> {
        let root = nix::unistd::geteuid().is_root();
        tmpfs_base(&self.run_root(), root).map(Path::to_path_buf)
    }
}

/// As root the records go below `/run/azp-sandbox`, which must be a tmpfs; a process that
/// is not root keeps them where its runtime dir is.
/// Every dir above `path` is searchable by any id (mode o+x): what a job's own ids need to
/// reach `path`. The error names the first that is not, and the fix.
pub fn check_reachable(path: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    for dir in path.ancestors().skip(1) {
        let Ok(m) = std::fs::metadata(dir) else { continue };
        if m.mode() & 0o001 == 0 {
            anyhow::bail!(
                "{} (mode {:o}) is not searchable by others: `chmod o+x {}` (search only, not listing), or choose \
                 a path whose parent dirs are",
                dir.display(),
                m.mode() & 0o7777,
                dir.display()
            );
        }
    }
    Ok(())
}

/// This process is in a user namespace other than the initial one (its uid map is not
/// the identity of all ids).
fn in_user_namespace() -> bool {
    crate::sys::procfile::read("/proc/self/uid_map")
        .map(|m| m.split_whitespace().collect::<Vec<_>>() != ["0", "0", "4294967295"])
        .unwrap_or(false)
}

fn tmpfs_base(run_root: &Path, is_root: bool) -> Option<&Path> {
    run_root.parent().filter(|p| is_root && *p == Path::new("/run/azp-sandbox"))
}

/// `--volume HOST:CTR[:ENV]`: a read-only dataset bind, optionally announced in `ENV`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Volume {
    pub host: PathBuf,
    pub container: PathBuf,
    pub env: Option<String>,
}

impl std::str::FromStr for Volume {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Volume> {
        let parts: Vec<&str> = s.split(':').collect();
        let usage = "expected --volume HOST:CONTAINER[:ENVVAR] with absolute paths";
        let (host, ctr, env) = match parts.as_slice() {
            [h, c] => (*h, *c, None),
            [h, c, e] => (*h, *c, Some(*e)),
            _ => bail!("malformed --volume '{s}': {usage}"),
        };
        if !host.starts_with('/') || !ctr.starts_with('/') {
            bail!("malformed --volume '{s}': {usage}");
        }
        let container = PathBuf::from(ctr);
        if container.components().any(|c| c == std::path::Component::ParentDir) {
            bail!("malformed --volume '{s}': the container path may not contain '..'");
        }
        if container == Path::new("/") {
            bail!("malformed --volume '{s}': cannot mount a volume over the sandbox root");
        }
        if in_kernel_filesystem(&container) {
            bail!("malformed --volume '{s}': {ctr} is in a kernel filesystem (/proc, /sys, /dev): choose another container path");
        }
        if let Some(e) = env {
            if !is_env_name(e) {
                bail!("malformed --volume '{s}': '{e}' is not a valid environment variable name");
            }
        }
        Ok(Volume { host: PathBuf::from(host), container, env: env.map(str::to_owned) })
    }
}

/// Whether the job's path `p` is in its `/proc`, `/sys` or `/dev` (components compared,
/// `//dev/` included): the kernel's filesystems and the sandbox's own `/dev` (the job's
/// init is there, see `sandbox::treemount`), which no volume or cache may cover.
pub fn in_kernel_filesystem(p: &Path) -> bool {
    let norm: PathBuf = p.components().collect();
    ["/proc", "/sys", "/dev"].iter().any(|k| norm.starts_with(k))
}

/// `--env K=V`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvVar {
    pub key: String,
    pub value: String,
}

impl std::str::FromStr for EnvVar {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<EnvVar> {
        match s.split_once('=') {
            Some((k, v)) if is_env_name(k) => Ok(EnvVar { key: k.into(), value: v.into() }),
            _ => bail!("malformed --env '{s}': expected NAME=VALUE with NAME made of letters, digits and '_'"),
        }
    }
}

pub fn is_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// 1.5G, 512.0M, 4096 (bytes): one decimal, binary units, as `status` shows sizes.
pub fn human_size(b: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)];
    for (unit, size) in UNITS {
        if b >= size {
            return format!("{:.1}{unit}", b as f64 / size as f64);
        }
    }
    b.to_string()
}

/// A byte size like `512M`, `2G`, `1.5g`, `1048576` (binary units).
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => bail!("bad size '{s}': use a number with an optional unit K, M, G or T (e.g. 512M)"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| anyhow::anyhow!("bad size '{s}': use a number with an optional unit K, M, G or T (e.g. 512M)"))?;
    let bytes = n * mult as f64;
    if bytes.is_nan() || bytes < 1.0 || bytes > u64::MAX as f64 {
        bail!("bad size '{s}': must be at least 1 byte");
    }
    Ok(bytes as u64)
}

/// [`parse_size`], where 0 (`0`, `0M`) is a size too: a limit of none.
pub fn parse_size_or_zero(s: &str) -> Result<u64> {
    let t = s.trim();
    let digits = t.trim_end_matches(|c: char| c.is_ascii_alphabetic()).trim();
    if !digits.is_empty() && digits.parse::<f64>() == Ok(0.0) {
        parse_size(&format!("1{}", &t[digits.len()..]))?; // the unit must be one of ours
        return Ok(0);
    }
    parse_size(s)
}

/// `--network isolated|none|host` (`network = ...` in config.toml and the setuid policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
pub enum Network {
    /// A network namespace of its own: outbound IPv4 and DNS, nothing of the host, of the
    /// other jobs or of link-local addresses (cloud metadata) (see sandbox::network).
    #[default]
    Isolated,
    /// A new, empty network namespace (loopback only).
    None,
    /// The host's network namespace: every host service on 127.0.0.1, the host's
    /// abstract unix sockets, the other jobs' ports, the cloud metadata service.
    Host,
}

impl Network {
    pub fn name(self) -> &'static str {
        match self {
            Network::Isolated => "isolated",
            Network::None => "none",
            Network::Host => "host",
        }
    }

    /// The one line printed when jobs share the host's network (`--network host`).
    pub const HOST_WARNING: &'static str = "WARNING: --network host: jobs share the host's network: they reach every \
         service on the host's 127.0.0.1, its abstract unix sockets, the other jobs' ports and the cloud \
         metadata service (169.254.169.254)";
}

impl std::fmt::Display for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Network {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Network> {
        match s {
            "isolated" => Ok(Network::Isolated),
            "none" => Ok(Network::None),
            "host" => Ok(Network::Host),
            _ => bail!("unknown network mode '{s}': use isolated (the default), none or host"),
        }
    }
}

/// `--ipv6 auto|on|off` (`network_ipv6 = ...` in config.toml): whether isolated jobs
/// get outbound IPv6 besides IPv4 (see `sandbox::network::ipv6`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
pub enum Ipv6 {
    /// Where the host has it (an IPv6 default route, and a kernel that can forward it
    /// for jobs alone); IPv4 only elsewhere, and the start line says why.
    #[default]
    Auto,
    /// Always: a host without it is an error that names what is missing.
    On,
    /// IPv4 only.
    Off,
}

impl Ipv6 {
    pub fn name(self) -> &'static str {
        match self {
            Ipv6::Auto => "auto",
            Ipv6::On => "on",
            Ipv6::Off => "off",
        }
    }
}

impl std::fmt::Display for Ipv6 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Ipv6 {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Ipv6> {
        match s {
            "auto" => Ok(Ipv6::Auto),
            "on" => Ok(Ipv6::On),
            "off" => Ok(Ipv6::Off),
            _ => bail!("unknown network_ipv6 '{s}': use auto (the default: where the host has IPv6), on or off"),
        }
    }
}

/// A destination jobs may reach although it is blocked (`network_allow`, `--network-allow`):
/// `IP` or `IP:PORT` (IPv4), e.g. the cloud metadata service `169.254.169.254:80`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct NetworkAllow {
    pub addr: std::net::Ipv4Addr,
    /// None: every TCP and UDP port.
    pub port: Option<u16>,
}

impl std::fmt::Display for NetworkAllow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.port {
            Some(p) => write!(f, "{}:{p}", self.addr),
            None => write!(f, "{}", self.addr),
        }
    }
}

impl std::str::FromStr for NetworkAllow {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<NetworkAllow> {
        let bad = || {
            anyhow::anyhow!(
                "bad network_allow entry '{s}': use an IPv4 address with an optional port, e.g. 169.254.169.254:80"
            )
        };
        if s.contains('/') {
            bail!(
                "bad network_allow entry '{s}': use an IPv4 address with an optional port, not a network \
                 (list each address), e.g. 169.254.169.254:80"
            );
        }
        if s.contains('[') || s.matches(':').count() > 1 {
            bail!(
                "bad network_allow entry '{s}': network_allow takes IPv4 addresses only (jobs' IPv6 to link-local \
                 and metadata addresses stays blocked); give an IPv4 address, e.g. 169.254.169.254:80"
            );
        }
        let (addr, port) = match s.split_once(':') {
            Some((a, p)) => (a, Some(p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(bad)?)),
            None => (s, None),
        };
        let addr: std::net::Ipv4Addr = addr.parse().map_err(|_| bad())?;
        if addr.is_unspecified() || addr.is_broadcast() || addr.is_multicast() {
            return Err(bad());
        }
        Ok(NetworkAllow { addr, port })
    }
}

/// `network_subnet = "10.87.0.0/16"`: where jobs' addresses come from (root mode).
pub fn parse_subnet(s: &str) -> Result<crate::sys::net::Ipv4Net> {
    let bad = || anyhow::anyhow!("bad network_subnet '{s}': use an IPv4 network of /8 to /24, e.g. 10.87.0.0/16");
    let (a, p) = s.split_once('/').ok_or_else(bad)?;
    let addr: std::net::Ipv4Addr = a.parse().map_err(|_| bad())?;
    let prefix: u8 = p.parse().map_err(|_| bad())?;
    if !(8..=24).contains(&prefix) || addr.is_loopback() || addr.is_multicast() || addr.is_link_local() {
        return Err(bad());
    }
    let net = crate::sys::net::Ipv4Net::new(addr, prefix);
    if net.addr != addr {
        bail!("bad network_subnet '{s}': {addr} is not the first address of a /{prefix}; did you mean {net}?");
    }
    Ok(net)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_homes_dirs_end_up_0711_and_a_right_one_is_left_as_it_is() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let home = Home::for_caller(t.path().join("home"), false, Some(t.path().join("xdg")));
        std::fs::create_dir_all(home.rootfs_dir()).unwrap();
        std::fs::set_permissions(home.rootfs_dir(), std::fs::Permissions::from_mode(0o700)).unwrap();
        home.ensure().unwrap();
        let mode = |d: &Path| std::fs::metadata(d).unwrap().permissions().mode() & 0o7777;
        for d in [home.root.clone(), home.rootfs_dir(), home.layers_dir(), home.trash_dir(), home.cache_dir()] {
            assert_eq!(mode(&d), 0o711, "{}", d.display());
        }
        // Right already: not written again (its ctime stays).
        use std::os::unix::fs::MetadataExt;
        let before = std::fs::metadata(home.cache_dir()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        home.ensure().unwrap();
        let after = std::fs::metadata(home.cache_dir()).unwrap();
        assert_eq!((before.ctime(), before.ctime_nsec()), (after.ctime(), after.ctime_nsec()));
    }

    #[test]
    fn runtime_dir_per_home_and_caller() {
        let tmp = tempfile::tempdir().unwrap();
        let home = Home::new(tmp.path().join("home"));
        std::fs::create_dir(home.root()).unwrap();
        let tag = home.tag();
        assert!(tag.starts_with("h-") && tag.len() == 10 && tag[2..].chars().all(|c| c.is_ascii_hexdigit()), "{tag}");
        std::os::unix::fs::symlink(home.root(), tmp.path().join("link")).unwrap();
        assert_eq!(home.tag(), Home::new(tmp.path().join("link")).tag(), "the canonical path counts");
        assert_ne!(home.tag(), Home::new(tmp.path()).tag());
        if Path::new("/run").is_dir() {
            assert_eq!(home.run_root_as(true, None), Path::new("/run/azp-sandbox").join(&tag));
        }
        // Not root: $XDG_RUNTIME_DIR when it is an absolute dir of the caller's, else the home.
        let xdg = tmp.path().join("xdg");
        std::fs::create_dir(&xdg).unwrap();
        assert_eq!(home.run_root_as(false, Some(xdg.clone())), xdg.join("azp-sandbox").join(&tag));
        assert_eq!(home.run_root_as(false, None), home.root().join("run"));
        assert_eq!(home.run_root_as(false, Some("relative".into())), home.root().join("run"));
        assert_eq!(home.run_root_as(false, Some(tmp.path().join("missing"))), home.root().join("run"));
        if nix::unistd::geteuid().is_root() {
            // Another user's (as `su` may pass on): not used.
            nix::unistd::chown(&xdg, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
            assert_eq!(home.run_root_as(false, Some(xdg)), home.root().join("run"));
        }
        // The layers stay on the home's disk.
        assert_eq!(home.layers_dir(), home.root().join("layers"));
    }

    #[test]
    fn only_root_records_under_run_need_the_tmpfs() {
        let base = Path::new("/run/azp-sandbox");
        assert_eq!(tmpfs_base(&base.join("h-0123abcd"), true), Some(base));
        assert_eq!(tmpfs_base(&base.join("h-0123abcd"), false), None, "not root: never mounted");
        assert_eq!(tmpfs_base(Path::new("/home/u/.local/share/azp-sandbox/run"), true), None, "no /run");
        assert_eq!(tmpfs_base(Path::new("/run/user/1000/azp-sandbox/h-0123abcd"), true), None);
    }

    #[test]
    fn job_layer_dirs_are_in_buckets_spread_by_id() {
        let tmp = tempfile::tempdir().unwrap();
        let home = Home::new(tmp.path().to_path_buf());
        let dir = home.job_layers_dir("host-1-7");
        assert_eq!(dir.file_name().unwrap(), "host-1-7");
        assert_eq!(dir.parent().unwrap().parent().unwrap(), home.layers_dir());
        assert_eq!(home.job_layers_dir("host-1-7"), dir, "the same id, the same place");
        // A slot's consecutive jobs use many buckets, not one.
        let buckets: std::collections::HashSet<_> =
            (1..=32).map(|n| home.job_layers_dir(&format!("host-1-{n}")).parent().unwrap().to_path_buf()).collect();
        assert!(buckets.len() >= 12, "{} buckets for 32 jobs", buckets.len());
        assert!(buckets.len() <= LAYER_BUCKETS as usize);
        for b in &buckets {
            let name = b.file_name().unwrap().to_string_lossy().into_owned();
            assert!(name.starts_with('_'), "{name}: a bucket name no job id can have");
        }
        // Listing: jobs in buckets, and a job dir from before buckets; empty buckets
        // list nothing.
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(home.layers_dir().join("old-job")).unwrap();
        std::fs::create_dir_all(home.layers_dir().join("_0")).unwrap();
        let mut listed = home.job_layer_dirs();
        listed.sort();
        let mut want = vec![dir, home.layers_dir().join("old-job")];
        want.sort();
        assert_eq!(listed, want);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("2g").unwrap(), 2 << 30);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        for bad in ["", "M", "12X", "-1G", "0", "1.2.3M"] {
            let e = parse_size(bad).unwrap_err().to_string();
            assert!(e.starts_with("bad size"), "{bad}: {e}");
        }
    }

    #[test]
    fn volumes() {
        let v: Volume = "/data/imagenet:/datasets/imagenet:IMAGENET".parse().unwrap();
        assert_eq!(v.host, PathBuf::from("/data/imagenet"));
        assert_eq!(v.container, PathBuf::from("/datasets/imagenet"));
        assert_eq!(v.env.as_deref(), Some("IMAGENET"));
        let v: Volume = "/a:/b".parse().unwrap();
        assert_eq!(v.env, None);
        for bad in ["/a", "a:/b", "/a:b", "/a:/b:1X", "/a:/b:C:D", "/a:/", "/a:/x/../etc"] {
            let e = bad.parse::<Volume>().unwrap_err().to_string();
            assert!(e.starts_with("malformed --volume"), "{bad}: {e}");
        }
        // Not over the job's /dev (its init is there), /proc or /sys.
        for bad in ["/a:/dev", "/a:/dev/.azp-init", "/a:/proc/x", "/a:/sys", "/a://dev/"] {
            let e = bad.parse::<Volume>().unwrap_err().to_string();
            assert!(e.contains("kernel filesystem"), "{bad}: {e}");
        }
        assert!("/a:/device".parse::<Volume>().is_ok(), "a name that only starts like /dev");
    }

    #[test]
    fn env_vars() {
        let e: EnvVar = "A_1=x=y".parse().unwrap();
        assert_eq!((e.key.as_str(), e.value.as_str()), ("A_1", "x=y"));
        assert!("1A=x".parse::<EnvVar>().is_err());
        assert!("novalue".parse::<EnvVar>().is_err());
    }

    #[test]
    fn network_modes_allow_entries_and_subnets() {
        assert_eq!(Network::default(), Network::Isolated, "jobs get their own network by default");
        assert_eq!(Ipv6::default(), Ipv6::Auto, "IPv6 where the host has it");
        for m in [Ipv6::Auto, Ipv6::On, Ipv6::Off] {
            assert_eq!(m.name().parse::<Ipv6>().unwrap(), m);
        }
        let e = "yes".parse::<Ipv6>().unwrap_err().to_string();
        assert_eq!(e, "unknown network_ipv6 'yes': use auto (the default: where the host has IPv6), on or off");
        for m in [Network::Isolated, Network::None, Network::Host] {
            assert_eq!(m.name().parse::<Network>().unwrap(), m);
        }
        let e = "bridge".parse::<Network>().unwrap_err().to_string();
        assert_eq!(e, "unknown network mode 'bridge': use isolated (the default), none or host");
        let a: NetworkAllow = "169.254.169.254:80".parse().unwrap();
        assert_eq!(
            (a.addr, a.port, a.to_string().as_str()),
            ([169, 254, 169, 254].into(), Some(80), "169.254.169.254:80")
        );
        assert_eq!("10.0.0.1".parse::<NetworkAllow>().unwrap().port, None);
        for bad in ["", "metadata", "169.254.169.254:", "169.254.169.254:0", "1.2.3.4:99999", "0.0.0.0", "1.2.3.4/8"] {
            let e = bad.parse::<NetworkAllow>().unwrap_err().to_string();
            assert!(e.starts_with(&format!("bad network_allow entry '{bad}': use an IPv4 address")), "{bad}: {e}");
            assert!(!e.contains('\n'));
        }
        let e = "[fe80::1]:80".parse::<NetworkAllow>().unwrap_err().to_string();
        assert!(e.contains("takes IPv4 addresses only"), "{e}");
        let e = "10.0.0.0/8".parse::<NetworkAllow>().unwrap_err().to_string();
        assert!(e.contains("not a network (list each address)"), "{e}");
        let e = "2001:db8::/32".parse::<NetworkAllow>().unwrap_err().to_string();
        assert!(e.contains("not a network") && !e.contains('\n'), "{e}");
        assert_eq!(parse_subnet("10.87.0.0/16").unwrap().to_string(), "10.87.0.0/16");
        let e = parse_subnet("10.87.1.0/16").unwrap_err().to_string();
        assert!(e.contains("did you mean 10.87.0.0/16?"), "{e}");
        for bad in ["10.87.0.0", "10.0.0.0/30", "127.0.0.0/8", "169.254.0.0/16", "x/16"] {
            assert!(parse_subnet(bad).unwrap_err().to_string().starts_with("bad network_subnet"), "{bad}");
        }
    }
}
