//! The recipe format (`rootfs-recipes/*.toml`, keys in `rootfs-recipes/README.md`): the
//! types, parsing with errors that name the file and the key, and validation of every
//! value before anything runs.

use crate::rootfs::validate_name;
use anyhow::{anyhow, Context, Result};
use std::path::{Path, PathBuf};

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

pub(super) fn is_plain_word(s: &str) -> bool {
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
        r.sha256 = crate::digest::sha256_hex(text.as_bytes());
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

pub(super) fn check_url(u: &str) -> Result<(), String> {
    let ok = ["http://", "https://", "file:/"].iter().any(|p| u.starts_with(p))
        && u.len() > 8
        && !u.chars().any(|c| c.is_whitespace() || c.is_control() || "'\"\\`$".contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!("'{}' is not an http(s):// or file:/ URL", u.escape_debug()))
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
}
