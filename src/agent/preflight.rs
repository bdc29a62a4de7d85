//! Can a rootfs run the Azure Pipelines agent? Checked from the host, on the rootfs tree,
//! before any job (and by `rootfs list`): no sandbox, no process in the rootfs.
//!
//! Without this, a rootfs that lacks the agent's dependencies shows up as "config.sh
//! failed with exit 1" in every slot, retried forever: the real `config.sh` runs `ldd` on
//! the bundled .NET libraries and looks for libicu in `ldconfig -NXv`, and fails when one
//! is missing. Here the same facts are read from the tree: its linker cache
//! (`etc/ld.so.cache`, parsed by [`crate::gpu::ldcache`]) and the standard library dirs,
//! its libc's version string, `/etc/passwd`, `/etc/ssl/certs`. Every path is resolved
//! inside the tree (`openat2(RESOLVE_IN_ROOT)`), so an image's symlinks never lead to the
//! host's files.
//!
//! What is checked depends on the package ([`Needs::of_package`]): the interpreters of
//! its entry scripts; with a bundled .NET (`bin/libcoreclr.so`) what `config.sh` checks
//! and the runtime loads (ldd, ldconfig, glibc, libstdc++, ICU, OpenSSL, Kerberos' GSSAPI,
//! zlib); with `externals/node20*` glibc >= 2.28 (Node 20); CA certificates for an https
//! server; and a non-root user for the agents, unless root was asked for explicitly
//! (`AGENT_ALLOW_RUNASROOT`, the agent's own opt-in).

use crate::gpu::ldcache;
use crate::rootfs::probe::{list_in_root, read_in_root, stat_in_root};
use serde::Serialize;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;

/// The glibc the agent's Node 20 task handler (`externals/node20*`) needs.
pub const NODE20_GLIBC: (u32, u32) = (2, 28);

/// The unprivileged user the agents run as when the rootfs has it.
pub const AGENT_USER: &str = "azp";

/// What an agent package needs from a rootfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Needs {
    /// Interpreters of the entry scripts (`#!` of `config.sh` and `run.sh`), absolute.
    pub interpreters: Vec<String>,
    /// The package bundles .NET (`bin/libcoreclr.so`).
    pub dotnet: bool,
    /// The oldest glibc it runs on (Node 20: 2.28).
    pub min_glibc: Option<(u32, u32)>,
    /// It talks TLS to the server (an https URL): the rootfs needs CA certificates.
    pub ca_certificates: bool,
}

impl Needs {
    /// What Microsoft's package needs, talking to Azure DevOps (`rootfs list`, where no
    /// package and no server are known).
    pub fn real_agent() -> Needs {
        Needs {
            interpreters: vec!["/bin/bash".into()],
            dotnet: true,
            min_glibc: Some(NODE20_GLIBC),
            ca_certificates: true,
        }
    }

    /// What the package unpacked in `dir` needs against the server at `url`.
    pub fn of_package(dir: &Path, url: &str) -> Needs {
        let Ok(pkg) = crate::sys::fs_at::open_dir(dir) else {
            return Needs::real_agent();
        };
        let root = pkg.as_raw_fd();
        let mut interpreters: Vec<String> = Vec::new();
        for script in ["config.sh", "run.sh"] {
            for i in read_in_root(root, script, 256).map(|head| shebang(&head)).unwrap_or_default() {
                if !interpreters.contains(&i) {
                    interpreters.push(i);
                }
            }
        }
        let node20 = list_in_root(root, "externals").iter().any(|n| n.starts_with("node20"));
        Needs {
            interpreters,
            dotnet: stat_in_root(root, "bin/libcoreclr.so").is_some(),
            min_glibc: node20.then_some(NODE20_GLIBC),
            ca_certificates: url.starts_with("https://"),
        }
    }
}

/// The programs a `#!` line names: `#!/bin/bash` -> `/bin/bash`; `#!/usr/bin/env bash` ->
/// `/usr/bin/env` and `bash` (looked up on the default PATH).
fn shebang(head: &[u8]) -> Vec<String> {
    let Some(rest) = head.strip_prefix(b"#!") else { return vec![] };
    let line = String::from_utf8_lossy(rest.split(|&b| b == b'\n').next().unwrap_or_default()).into_owned();
    let mut words = line.split_whitespace();
    let Some(first) = words.next().filter(|w| w.starts_with('/')) else { return vec![] };
    let mut out = vec![first.to_string()];
    if first.ends_with("/env") {
        if let Some(prog) = words.find(|w| !w.starts_with('-')) {
            out.push(prog.to_string());
        }
    }
    out
}

/// Who the agents run as: how the user check goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UserRule {
    /// An explicit uid:gid (setuid mode: the caller): nothing to check in the rootfs.
    Given,
    /// The rootfs's [`AGENT_USER`]; when it has none, root only if `allow_root`.
    Rootfs { allow_root: bool },
}

/// The verdict on one rootfs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Readiness {
    pub ready: bool,
    /// What is missing, short (`libicu`, `ca-certificates`, `non-root user`, ...).
    pub missing: Vec<String>,
    /// The rootfs's glibc (`2.36`), when it has one.
    pub glibc: Option<String>,
    /// How to fix it, one line (None when ready).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Readiness {
    /// The start-up error: one line naming the rootfs, what is missing and how to add it.
    pub fn error_line(&self, rootfs: &str) -> String {
        format!(
            "rootfs '{rootfs}' cannot run the Azure Pipelines agent: missing {}; {}",
            self.missing.join(", "),
            self.fix.as_deref().unwrap_or("")
        )
    }

    /// `rootfs list`'s column: `ok`, or `no: libicu,libssl,...`.
    pub fn column(&self) -> String {
        if self.ready {
            "ok".into()
        } else {
            format!("no: {}", self.missing.join(","))
        }
    }
}

/// Checks the rootfs tree at `tree` against `needs`.
pub fn check(tree: &Path, needs: &Needs, user: UserRule) -> Readiness {
    let Ok(fd) = crate::sys::fs_at::open_dir(tree) else {
        return Readiness {
            ready: false,
            missing: vec!["the rootfs tree".into()],
            glibc: None,
            fix: Some(format!("{} cannot be opened: import the rootfs again", tree.display())),
        };
    };
    let root = fd.as_raw_fd();
    let mut missing: Vec<Item> = Vec::new();
    for i in &needs.interpreters {
        let found = if i.starts_with('/') { is_file(root, i) } else { on_path(root, i) };
        if !found {
            missing.push(Item::Program(i.rsplit('/').next().unwrap_or(i).to_string()));
        }
    }
    let libs = Libs::read(root);
    let libc = libs.find(root, |n| n == "libc.so.6");
    let glibc = libc.as_deref().and_then(|p| read_in_root(root, p, 32 << 20)).and_then(|b| glibc_version(&b));
    if needs.dotnet || needs.min_glibc.is_some() {
        match (&libc, glibc) {
            (None, _) => missing.push(Item::Glibc),
            (Some(_), Some(v)) if needs.min_glibc.is_some_and(|min| v < min) => missing.push(Item::GlibcOlder(v)),
            _ => {}
        }
    }
    if needs.dotnet {
        // What config.sh runs, then what ldd must resolve for the three .NET libraries.
        if !["usr/bin/ldd", "bin/ldd"].iter().any(|p| is_file(root, p)) {
            missing.push(Item::Program("ldd".into()));
        }
        if !["sbin/ldconfig", "usr/sbin/ldconfig", "usr/bin/ldconfig", "bin/ldconfig"].iter().any(|p| is_file(root, p))
        {
            missing.push(Item::Program("ldconfig".into()));
        }
        for lib in [Lib::Stdcxx, Lib::Icu, Lib::Ssl, Lib::Krb5, Lib::Zlib] {
            if libs.find(root, |n| lib.matches(n)).is_none() {
                missing.push(Item::Lib(lib));
            }
        }
    }
    if needs.ca_certificates && !has_ca_certificates(root) {
        missing.push(Item::CaCertificates);
    }
    if user == (UserRule::Rootfs { allow_root: false }) && rootfs_user(tree).is_none() {
        missing.push(Item::User);
    }
    let glibc = glibc.map(|(a, b)| format!("{a}.{b}"));
    if missing.is_empty() {
        return Readiness { ready: true, missing: vec![], glibc, fix: None };
    }
    let distro = Distro::read(root);
    Readiness {
        ready: false,
        missing: missing.iter().map(Item::name).collect(),
        glibc,
        fix: Some(fix_line(&missing, &distro)),
    }
}

/// uid and gid of [`AGENT_USER`] in the rootfs's `/etc/passwd` (read inside the tree).
pub fn rootfs_user(tree: &Path) -> Option<(u32, u32)> {
    let fd = crate::sys::fs_at::open_dir(tree).ok()?;
    let text = read_in_root(fd.as_raw_fd(), "etc/passwd", 4 << 20)?;
    passwd_entry(&String::from_utf8_lossy(&text), AGENT_USER).filter(|(uid, _)| *uid != 0)
}

/// uid and gid of `user` in the text of a passwd file.
pub fn passwd_entry(passwd: &str, user: &str) -> Option<(u32, u32)> {
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 4 && f[0] == user).then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?))).flatten()
    })
}

/// Something the rootfs lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Item {
    Program(String),
    Glibc,
    GlibcOlder((u32, u32)),
    Lib(Lib),
    CaCertificates,
    User,
}

impl Item {
    fn name(&self) -> String {
        match self {
            Item::Program(p) => p.clone(),
            Item::Glibc => "glibc".into(),
            Item::GlibcOlder((a, b)) => format!("glibc >= {}.{} (has {a}.{b})", NODE20_GLIBC.0, NODE20_GLIBC.1),
            Item::Lib(l) => l.name().into(),
            Item::CaCertificates => "ca-certificates".into(),
            Item::User => format!("a non-root user ('{AGENT_USER}')"),
        }
    }
}

/// The libraries the .NET runtime of the agent needs besides glibc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lib {
    Stdcxx,
    Icu,
    Ssl,
    Krb5,
    Zlib,
}

impl Lib {
    fn name(self) -> &'static str {
        match self {
            Lib::Stdcxx => "libstdc++",
            Lib::Icu => "libicu",
            Lib::Ssl => "libssl",
            Lib::Krb5 => "libkrb5 (libgssapi_krb5)",
            Lib::Zlib => "zlib",
        }
    }

    /// Whether `soname` (a file name or a cache key) is this library.
    fn matches(self, soname: &str) -> bool {
        match self {
            Lib::Stdcxx => soname == "libstdc++.so.6",
            // ICU's major version is in its soname: any one will do (.NET probes them).
            Lib::Icu => {
                soname.strip_prefix("libicuuc.so.").is_some_and(|v| v.starts_with(|c: char| c.is_ascii_digit()))
            }
            Lib::Ssl => ["libssl.so.3", "libssl.so.1.1", "libssl.so.1.0.0", "libssl.so.10"].contains(&soname),
            Lib::Krb5 => soname == "libgssapi_krb5.so.2",
            Lib::Zlib => soname == "libz.so.1",
        }
    }
}

/// The shared libraries of a tree: its linker cache's entries for this architecture
/// (ld.so looks there first), and the files in the default library dirs (where ld.so and
/// `ldconfig -NXv` look without one).
struct Libs {
    /// (soname, path inside the tree)
    entries: Vec<(String, String)>,
}

impl Libs {
    fn read(root: RawFd) -> Libs {
        let mut entries = Vec::new();
        if let Some(bytes) = read_in_root(root, "etc/ld.so.cache", 64 << 20) {
            if let Ok((_, cache)) = ldcache::parse(&bytes) {
                entries.extend(
                    cache
                        .into_iter()
                        .filter(|e| e.is_host_native())
                        .map(|e| (e.name, e.path.to_string_lossy().into_owned())),
                );
            }
        }
        let triplet = format!("{}-linux-gnu", std::env::consts::ARCH);
        for dir in [format!("lib/{triplet}"), format!("usr/lib/{triplet}"), "lib64".into(), "usr/lib64".into()]
            .into_iter()
            .chain(["lib".to_string(), "usr/lib".to_string()])
        {
            for name in list_in_root(root, &dir) {
                if name.contains(".so") {
                    entries.push((name.clone(), format!("/{dir}/{name}")));
                }
            }
        }
        Libs { entries }
    }

    /// The path (inside the tree) of a library whose soname passes `want` and whose file
    /// exists (a stale cache entry does not count).
    fn find(&self, root: RawFd, want: impl Fn(&str) -> bool) -> Option<String> {
        self.entries
            .iter()
            .filter(|(name, _)| want(name))
            .map(|(_, path)| path.trim_start_matches('/').to_string())
            .find(|p| is_file(root, p))
    }
}

fn is_file(root: RawFd, path: &str) -> bool {
    stat_in_root(root, path.trim_start_matches('/')).is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG)
}

fn on_path(root: RawFd, prog: &str) -> bool {
    ["usr/local/bin", "usr/bin", "bin"].iter().any(|d| is_file(root, &format!("{d}/{prog}")))
}

/// The bundle ca-certificates writes (Debian/Ubuntu/Alpine), or Red Hat's, non-empty.
fn has_ca_certificates(root: RawFd) -> bool {
    ["etc/ssl/certs/ca-certificates.crt", "etc/pki/tls/certs/ca-bundle.crt", "etc/ssl/cert.pem"]
        .iter()
        .any(|p| stat_in_root(root, p).is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_size > 0))
}

/// glibc's version from its `libc.so.6`: the banner says "... release version 2.36." (the
/// library prints it when run). Failing that, the newest `GLIBC_2.N` symbol version it
/// defines, which is at most the release.
pub fn glibc_version(libc: &[u8]) -> Option<(u32, u32)> {
    let from = |at: usize| -> Option<(u32, u32)> {
        let rest = &libc[at..libc.len().min(at + 16)];
        let s: String = rest.iter().take_while(|b| b.is_ascii_digit() || **b == b'.').map(|&b| b as char).collect();
        let mut it = s.split('.');
        Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
    };
    const BANNER: &[u8] = b"release version ";
    if let Some(at) = find(libc, BANNER) {
        if let Some(v) = from(at + BANNER.len()) {
            return Some(v);
        }
    }
    let mut best = None;
    let mut at = 0;
    while let Some(i) = find(&libc[at..], b"GLIBC_2.") {
        let v = from(at + i + "GLIBC_".len());
        best = best.max(v);
        at += i + 1;
    }
    best
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The distribution of the tree, from its `/etc/os-release` (package names differ).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Distro {
    /// `ID` and `ID_LIKE` words (`debian`, `ubuntu`, ...).
    ids: Vec<String>,
    codename: String,
}

impl Distro {
    fn read(root: RawFd) -> Distro {
        let text = ["etc/os-release", "usr/lib/os-release"]
            .iter()
            .find_map(|p| read_in_root(root, p, 64 << 10))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        Distro::parse(&text)
    }

    fn parse(text: &str) -> Distro {
        let mut d = Distro::default();
        for line in text.lines() {
            let Some((k, v)) = line.split_once('=') else { continue };
            let v = v.trim().trim_matches('"').trim_matches('\'');
            match k.trim() {
                "ID" | "ID_LIKE" => d.ids.extend(v.split_whitespace().map(str::to_string)),
                "VERSION_CODENAME" => d.codename = v.to_string(),
                _ => {}
            }
        }
        d
    }

    fn debian_like(&self) -> bool {
        self.ids.iter().any(|i| i == "debian" || i == "ubuntu")
    }

    /// The Debian/Ubuntu packages that provide `item` in this release.
    fn packages(&self, item: &Item) -> Vec<&'static str> {
        let c = self.codename.as_str();
        match item {
            Item::Program(p) if p == "bash" => vec!["bash"],
            Item::Program(p) if p == "ldd" || p == "ldconfig" => vec!["libc-bin"],
            Item::Program(_) => vec![],
            Item::Glibc => vec!["libc6"],
            Item::GlibcOlder(_) => vec![],
            Item::Lib(Lib::Stdcxx) => vec!["libstdc++6"],
            Item::Lib(Lib::Icu) => vec![match c {
                "buster" => "libicu63",
                "bullseye" => "libicu67",
                "bookworm" => "libicu72",
                "trixie" => "libicu76",
                "focal" => "libicu66",
                "jammy" => "libicu70",
                "noble" => "libicu74",
                _ => "libicuNN (the release's ICU)",
            }],
            Item::Lib(Lib::Ssl) => vec![match c {
                "buster" | "bullseye" | "focal" => "libssl1.1",
                "noble" => "libssl3t64",
                _ => "libssl3",
            }],
            Item::Lib(Lib::Krb5) => vec!["libkrb5-3", "libgssapi-krb5-2"],
            Item::Lib(Lib::Zlib) => vec!["zlib1g"],
            Item::CaCertificates => vec!["ca-certificates"],
            Item::User => vec![],
        }
    }
}

/// How to fix what is missing, in one line.
fn fix_line(missing: &[Item], distro: &Distro) -> String {
    let mut parts = Vec::new();
    let packaged: Vec<&Item> =
        missing.iter().filter(|i| !matches!(i, Item::User | Item::GlibcOlder(_) | Item::Program(_))).collect();
    let programs: Vec<&Item> = missing.iter().filter(|i| matches!(i, Item::Program(_))).collect();
    if !packaged.is_empty() || !programs.is_empty() {
        if distro.debian_like() {
            let mut pkgs: Vec<&str> = Vec::new();
            for i in programs.iter().chain(packaged.iter()) {
                for p in distro.packages(i) {
                    if !pkgs.contains(&p) {
                        pkgs.push(p);
                    }
                }
            }
            parts.push(format!(
                "install {} in it (apt-get install --no-install-recommends, a recipe's packages, or the agent's \
                 bin/installdependencies.sh in a recipe's post_install)",
                pkgs.join(" ")
            ));
        } else {
            parts.push(
                "install the distribution's packages for them (or run the agent's bin/installdependencies.sh in it)"
                    .to_string(),
            );
        }
    }
    if missing.iter().any(|i| matches!(i, Item::GlibcOlder(_))) {
        parts.push(
            "use a newer distribution (Node 20 needs glibc 2.28: Debian 10, Ubuntu 20.04, RHEL 8 or later)".into(),
        );
    }
    if missing.contains(&Item::User) {
        parts.push(format!(
            "add an unprivileged user '{AGENT_USER}' (`useradd -m -u 1000 {AGENT_USER}`, a recipe's [user]) or set \
             AGENT_ALLOW_RUNASROOT=1 for `run` to run the agents as root in the sandbox"
        ));
    }
    parts.push("or build a rootfs that has it all: `azp-sandbox rootfs build debian-bookworm-agent`".into());
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree with the given files (empty, or with the given bytes) and a linker cache of
    /// `cached` (soname, path) entries for this architecture.
    fn tree(files: &[(&str, &[u8])], cached: &[(&str, &str)]) -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        // Merged /usr, as Debian 12 has it.
        for dir in ["bin", "sbin", "lib"] {
            std::os::unix::fs::symlink(format!("usr/{dir}"), t.path().join(dir)).unwrap();
        }
        for (path, bytes) in files {
            let p = t.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, bytes).unwrap();
        }
        let entries: Vec<(&str, &str, i32)> =
            cached.iter().map(|(n, p)| (*n, *p, ldcache::CacheEntry::host_flags())).collect();
        std::fs::create_dir_all(t.path().join("etc")).unwrap();
        std::fs::write(t.path().join("etc/ld.so.cache"), ldcache::build_old_format(&entries)).unwrap();
        t
    }

    const LIBC: &[u8] = b"\x7fELF...GNU C Library (Debian GLIBC 2.36-9+deb12u4) stable release version 2.36.\n";
    const L: &str = "usr/lib/x86_64-linux-gnu";

    fn complete() -> Vec<(String, Vec<u8>)> {
        let mut v: Vec<(String, Vec<u8>)> =
            ["usr/bin/bash", "usr/bin/ldd", "usr/sbin/ldconfig", "etc/ssl/certs/ca-certificates.crt", "etc/passwd"]
                .iter()
                .map(|p| (p.to_string(), b"x".to_vec()))
                .collect();
        v.push(("etc/passwd".into(), b"root:x:0:0::/root:/bin/bash\nazp:x:1000:1000::/home/azp:/bin/bash\n".to_vec()));
        v.push(("etc/os-release".into(), b"ID=debian\nVERSION_CODENAME=bookworm\n".to_vec()));
        for lib in ["libc.so.6", "libstdc++.so.6", "libicuuc.so.72", "libssl.so.3", "libgssapi_krb5.so.2", "libz.so.1"]
        {
            v.push((format!("{L}/{lib}"), if lib == "libc.so.6" { LIBC.to_vec() } else { b"so".to_vec() }));
        }
        v
    }

    fn build(files: &[(String, Vec<u8>)], cached: &[(&str, &str)]) -> tempfile::TempDir {
        let f: Vec<(&str, &[u8])> = files.iter().map(|(p, b)| (p.as_str(), b.as_slice())).collect();
        tree(&f, cached)
    }

    /// Where the host's architecture keeps libraries in these trees.
    fn arch_ok() -> bool {
        std::env::consts::ARCH == "x86_64"
    }

    #[test]
    fn a_complete_debian_tree_is_ready() {
        if !arch_ok() {
            return;
        }
        let t = build(&complete(), &[]);
        let r = check(t.path(), &Needs::real_agent(), UserRule::Rootfs { allow_root: false });
        assert_eq!(r, Readiness { ready: true, missing: vec![], glibc: Some("2.36".into()), fix: None });
        assert_eq!(r.column(), "ok");
        assert_eq!(rootfs_user(t.path()), Some((1000, 1000)));
    }

    #[test]
    fn minbase_names_what_is_missing_and_the_packages() {
        if !arch_ok() {
            return;
        }
        // Debian minbase: bash, ldd, ldconfig, glibc, libstdc++ and zlib; no ICU, OpenSSL,
        // Kerberos, CA certificates or unprivileged user.
        let keep = |p: &str| !(p.contains("icu") || p.contains("ssl") || p.contains("gssapi") || p == "etc/passwd");
        let files: Vec<(String, Vec<u8>)> = complete().into_iter().filter(|(p, _)| keep(p)).collect();
        let t = build(&files, &[]);
        let r = check(t.path(), &Needs::real_agent(), UserRule::Rootfs { allow_root: false });
        assert!(!r.ready);
        assert_eq!(
            r.missing,
            ["libicu", "libssl", "libkrb5 (libgssapi_krb5)", "ca-certificates", "a non-root user ('azp')"]
        );
        let line = r.error_line("minbase");
        assert!(!line.contains('\n'), "{line}");
        assert!(
            line.starts_with("rootfs 'minbase' cannot run the Azure Pipelines agent: missing libicu, libssl,"),
            "{line}"
        );
        assert!(line.contains("install libicu72 libssl3 libkrb5-3 libgssapi-krb5-2 ca-certificates in it"), "{line}");
        assert!(
            line.contains("AGENT_ALLOW_RUNASROOT=1") && line.contains("rootfs build debian-bookworm-agent"),
            "{line}"
        );
        assert_eq!(r.column(), "no: libicu,libssl,libkrb5 (libgssapi_krb5),ca-certificates,a non-root user ('azp')");
        // Root asked for explicitly, or a user given (setuid): the user is no longer missing.
        for rule in [UserRule::Rootfs { allow_root: true }, UserRule::Given] {
            let r = check(t.path(), &Needs::real_agent(), rule);
            assert!(!r.missing.iter().any(|m| m.contains("user")), "{rule:?}: {r:?}");
        }
    }

    #[test]
    fn the_linker_cache_counts_when_its_files_exist() {
        if !arch_ok() {
            return;
        }
        // ICU outside the default dirs, known to ld.so only through the cache.
        let mut files = complete();
        files.retain(|(p, _)| !p.contains("icu"));
        files.push(("opt/icu/lib/libicuuc.so.74".into(), b"so".to_vec()));
        let needs = Needs::real_agent();
        let rule = UserRule::Rootfs { allow_root: false };
        let t = build(&files, &[("libicuuc.so.74", "/opt/icu/lib/libicuuc.so.74")]);
        assert!(check(t.path(), &needs, rule).ready);
        // A stale entry (the file is gone) does not count.
        files.pop();
        let t = build(&files, &[("libicuuc.so.74", "/opt/icu/lib/libicuuc.so.74")]);
        assert_eq!(check(t.path(), &needs, rule).missing, ["libicu"]);
    }

    #[test]
    fn symlinks_resolve_inside_the_tree() {
        if !arch_ok() {
            return;
        }
        // An image whose CA bundle and passwd point at absolute paths: read in the tree,
        // never the host's /etc/passwd.
        let mut files = complete();
        files.retain(|(p, _)| p != "etc/ssl/certs/ca-certificates.crt" && p != "etc/passwd");
        files.push(("usr/share/ca/bundle.crt".into(), b"-----BEGIN".to_vec()));
        files.push(("srv/passwd".into(), b"azp:x:1001:1002::/home/azp:/bin/bash\n".to_vec()));
        let t = build(&files, &[]);
        std::fs::create_dir_all(t.path().join("etc/ssl/certs")).unwrap();
        std::os::unix::fs::symlink("/usr/share/ca/bundle.crt", t.path().join("etc/ssl/certs/ca-certificates.crt"))
            .unwrap();
        std::os::unix::fs::symlink("/srv/passwd", t.path().join("etc/passwd")).unwrap();
        assert!(check(t.path(), &Needs::real_agent(), UserRule::Rootfs { allow_root: false }).ready);
        assert_eq!(rootfs_user(t.path()), Some((1001, 1002)));
        // A passwd that leads out of the tree resolves to the tree's own path: none here.
        std::fs::remove_file(t.path().join("etc/passwd")).unwrap();
        std::os::unix::fs::symlink("../../../../../../etc/passwd", t.path().join("etc/passwd")).unwrap();
        assert_eq!(rootfs_user(t.path()), None);
    }

    #[test]
    fn glibc_versions_and_old_ones() {
        assert_eq!(glibc_version(LIBC), Some((2, 36)));
        assert_eq!(glibc_version(b"..GLIBC_2.2.5\0GLIBC_2.27\0GLIBC_2.3\0"), Some((2, 27)));
        assert_eq!(glibc_version(b"musl libc"), None);
        if !arch_ok() {
            return;
        }
        let mut files = complete();
        for f in files.iter_mut().filter(|(p, _)| p.ends_with("libc.so.6")) {
            f.1 = b"GNU C Library (Ubuntu GLIBC 2.27-3ubuntu1) stable release version 2.27.".to_vec();
        }
        files.push(("etc/os-release".into(), b"ID=ubuntu\nID_LIKE=debian\nVERSION_CODENAME=bionic\n".to_vec()));
        let t = build(&files, &[]);
        let r = check(t.path(), &Needs::real_agent(), UserRule::Rootfs { allow_root: false });
        assert_eq!(r.missing, ["glibc >= 2.28 (has 2.27)"]);
        assert!(r.fix.unwrap().contains("use a newer distribution"));
        // A package without Node 20 does not need 2.28.
        let needs = Needs { min_glibc: None, ..Needs::real_agent() };
        assert!(check(t.path(), &needs, UserRule::Rootfs { allow_root: false }).ready);
    }

    #[test]
    fn what_a_package_needs() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path();
        std::fs::write(p.join("config.sh"), "#!/bin/bash\necho\n").unwrap();
        std::fs::write(p.join("run.sh"), "#!/usr/bin/env bash\n").unwrap();
        let n = Needs::of_package(p, "https://dev.azure.com/o");
        assert_eq!(
            n,
            Needs {
                interpreters: vec!["/bin/bash".into(), "/usr/bin/env".into(), "bash".into()],
                dotnet: false,
                min_glibc: None,
                ca_certificates: true
            }
        );
        std::fs::create_dir_all(p.join("bin")).unwrap();
        std::fs::create_dir_all(p.join("externals/node20_1/bin")).unwrap();
        std::fs::write(p.join("bin/libcoreclr.so"), "").unwrap();
        let n = Needs::of_package(p, "http://127.0.0.1:1/o");
        assert!(n.dotnet && !n.ca_certificates);
        assert_eq!(n.min_glibc, Some(NODE20_GLIBC));
        // A busybox-only tree passes for a sh-only package over http, as root allowed.
        let bb = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(bb.path().join("bin")).unwrap();
        std::fs::write(bb.path().join("bin/sh"), "").unwrap();
        let sh = Needs { interpreters: vec!["/bin/sh".into()], dotnet: false, min_glibc: None, ca_certificates: false };
        assert!(check(bb.path(), &sh, UserRule::Rootfs { allow_root: true }).ready);
        let r = check(bb.path(), &Needs::real_agent(), UserRule::Rootfs { allow_root: true });
        assert!(r.missing.starts_with(&["bash".to_string(), "glibc".to_string(), "ldd".to_string()]), "{r:?}");
        assert!(r.fix.unwrap().contains("install the distribution's packages"), "no os-release: not Debian");
    }

    #[test]
    fn os_release() {
        let d = Distro::parse("NAME=\"Ubuntu\"\nID=ubuntu\nID_LIKE=debian\nVERSION_CODENAME=noble\n");
        assert!(d.debian_like());
        assert_eq!(d.packages(&Item::Lib(Lib::Ssl)), ["libssl3t64"]);
        assert_eq!(d.packages(&Item::Lib(Lib::Icu)), ["libicu74"]);
        assert!(!Distro::parse("ID=alpine\n").debian_like());
        assert_eq!(shebang(b"#!/bin/sh -e\n"), ["/bin/sh"]);
        assert!(shebang(b"echo").is_empty());
    }
}
