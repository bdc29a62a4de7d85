//! Image references: `[REGISTRY/]REPOSITORY[:TAG][@sha256:DIGEST]`, with Docker's rules
//! for the defaults (`docker.io`, `library/` for one-component Docker Hub names, tag
//! `latest`).

use std::fmt;

/// Docker Hub's name in references and in credential files.
pub const DOCKER_HUB: &str = "docker.io";
/// The host that serves Docker Hub's distribution API.
const DOCKER_HUB_API: &str = "registry-1.docker.io";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// `host[:port]` as written (`docker.io` for Docker Hub).
    pub registry: String,
    /// `library/ubuntu`, `nvidia/cuda`, ...
    pub repository: String,
    /// `None` only when a digest is given without a tag.
    pub tag: Option<String>,
    /// `sha256:<64 hex>`.
    pub digest: Option<String>,
}

#[derive(Debug, thiserror::Error)]
#[error("invalid image reference '{input}': {why}; use [REGISTRY/]REPOSITORY[:TAG][@sha256:DIGEST], e.g. nvidia/cuda:12.4.1-runtime-ubuntu22.04")]
pub struct ReferenceError {
    pub input: String,
    pub why: String,
}

impl Reference {
    pub fn parse(input: &str) -> Result<Reference, ReferenceError> {
        let bad = |why: &str| ReferenceError { input: input.escape_debug().to_string(), why: why.to_string() };
        let s = input.trim();
        if s.is_empty() {
            return Err(bad("it is empty"));
        }
        if s.len() > 1024 {
            return Err(bad("it is longer than 1024 characters"));
        }
        if s.contains("://") {
            return Err(bad("leave out the scheme (https://)"));
        }
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => (r, Some(parse_digest(d).map_err(|w| bad(&w))?)),
            None => (s, None),
        };
        // The registry is the first component if it looks like a host: a '.' or ':' in
        // it, or `localhost`.
        let (registry, path) = match rest.split_once('/') {
            Some((first, p)) if first.contains(['.', ':']) || first == "localhost" || first.starts_with('[') => {
                (first.to_string(), p)
            }
            _ => (DOCKER_HUB.to_string(), rest),
        };
        let registry = match registry.to_ascii_lowercase().as_str() {
            "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => DOCKER_HUB.to_string(),
            _ => registry,
        };
        validate_registry(&registry).map_err(|w| bad(&w))?;
        // A tag is a ':' after the last '/'.
        let (repo, tag) = match path.rfind(':') {
            Some(i) if !path[i..].contains('/') => (&path[..i], Some(&path[i + 1..])),
            _ => (path, None),
        };
        if let Some(t) = tag {
            validate_tag(t).map_err(|w| bad(&w))?;
        }
        validate_repository(repo).map_err(|w| bad(&w))?;
        let repository =
            if registry == DOCKER_HUB && !repo.contains('/') { format!("library/{repo}") } else { repo.to_string() };
        let tag = match (tag, &digest) {
            (Some(t), _) => Some(t.to_string()),
            (None, Some(_)) => None,
            (None, None) => Some("latest".to_string()),
        };
        Ok(Reference { registry, repository, tag, digest })
    }

    /// `host[:port]` to connect to (`registry-1.docker.io` for Docker Hub).
    pub fn api_host(&self) -> &str {
        if self.registry == DOCKER_HUB {
            DOCKER_HUB_API
        } else {
            &self.registry
        }
    }

    /// The host part without the port or IPv6 brackets.
    pub fn host(&self) -> &str {
        host_of(&self.registry)
    }

    /// `localhost`, `127.x.y.z` or `::1`: the only registries that may be plain http.
    pub fn is_loopback(&self) -> bool {
        let h = self.host();
        h.eq_ignore_ascii_case("localhost") || h.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
    }

    /// What to ask the registry for: the digest if given, else the tag.
    pub fn manifest_ref(&self) -> &str {
        self.digest.as_deref().or(self.tag.as_deref()).unwrap_or("latest")
    }

    /// A rootfs name: `REPO-TAG` (`library/` left out, `/` and other characters outside
    /// `[A-Za-z0-9._-]` as `-`, at most 64 characters), `REPO-sha256-<12 hex>` for a
    /// digest-only reference.
    pub fn default_name(&self) -> String {
        let repo = self.repository.strip_prefix("library/").unwrap_or(&self.repository);
        let suffix = match (&self.tag, &self.digest) {
            (Some(t), _) => t.clone(),
            (None, Some(d)) => format!("sha256-{}", &d["sha256:".len()..][..12]),
            (None, None) => "latest".into(),
        };
        let raw = format!("{repo}-{suffix}");
        let mut name: String = raw
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '-' })
            .collect();
        while name.starts_with(['.', '_', '-']) {
            name.remove(0);
        }
        if name.len() > 64 {
            name.truncate(64);
        }
        while name.ends_with(['.', '_', '-']) {
            name.pop();
        }
        if name.is_empty() {
            name = "image".into();
        }
        name
    }
}

impl fmt::Display for Reference {
    /// The fully qualified form: `docker.io/library/ubuntu:22.04[@sha256:...]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

pub(crate) fn host_of(registry: &str) -> &str {
    if let Some(rest) = registry.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    registry.split(':').next().unwrap_or(registry)
}

/// `sha256:<64 lowercase hex>`; other algorithms are refused.
pub(crate) fn parse_digest(d: &str) -> Result<String, String> {
    let Some((alg, hex)) = d.split_once(':') else {
        return Err(format!("digest '{d}' has no algorithm (expected sha256:<64 hex digits>)"));
    };
    if alg != "sha256" {
        return Err(format!("digest algorithm '{alg}' is not supported (only sha256)"));
    }
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(format!("digest '{d}' is not sha256:<64 lowercase hex digits>"));
    }
    Ok(d.to_string())
}

fn validate_registry(r: &str) -> Result<(), String> {
    let host = host_of(r);
    let port = if r.starts_with('[') { r.split_once("]:").map(|x| x.1) } else { r.split_once(':').map(|x| x.1) };
    if host.is_empty() || !host.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':')) {
        return Err(format!("registry '{r}' is not a host name"));
    }
    if let Some(p) = port {
        if p.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(format!("registry port '{p}' is not a port number"));
        }
    }
    Ok(())
}

/// Path components of lowercase alphanumerics separated by `.`, `_`, `__` or `-`s.
fn validate_repository(repo: &str) -> Result<(), String> {
    if repo.is_empty() {
        return Err("the repository name is empty".into());
    }
    if repo.len() > 255 {
        return Err("the repository name is longer than 255 characters".into());
    }
    for comp in repo.split('/') {
        let b = comp.as_bytes();
        let ok = !b.is_empty()
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter().all(|&c| c.is_ascii_digit() || c.is_ascii_lowercase() || matches!(c, b'.' | b'_' | b'-'))
            && !comp.contains("..")
            && !comp.contains("___")
            && !comp.contains("._")
            && !comp.contains("_.");
        if !ok {
            let why = if comp.bytes().any(|c| c.is_ascii_uppercase()) {
                format!("repository '{repo}' must be lowercase")
            } else {
                format!(
                    "repository component '{comp}' must be lowercase letters and digits separated by '.', '_' or '-'"
                )
            };
            return Err(why);
        }
    }
    Ok(())
}

fn validate_tag(t: &str) -> Result<(), String> {
    let b = t.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter().all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!("tag '{t}' must be 1 to 128 letters, digits, '_', '.' or '-', not starting with '.' or '-'"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn p(s: &str) -> Reference {
        Reference::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn docker_hub_defaults() {
        let r = p("ubuntu");
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("docker.io", "library/ubuntu", Some("latest"))
        );
        assert_eq!(r.to_string(), "docker.io/library/ubuntu:latest");
        assert_eq!(r.api_host(), "registry-1.docker.io");
        let r = p("nvidia/cuda:12.4.1-runtime-ubuntu22.04");
        assert_eq!(r.to_string(), "docker.io/nvidia/cuda:12.4.1-runtime-ubuntu22.04");
        assert_eq!(r.default_name(), "nvidia-cuda-12.4.1-runtime-ubuntu22.04");
        let r = p("docker.io/nvidia/cuda:12.4.1-runtime-ubuntu22.04");
        assert_eq!(r.repository, "nvidia/cuda");
        assert_eq!(p("index.docker.io/library/debian:12").registry, "docker.io");
        assert_eq!(p("docker.io/debian").repository, "library/debian");
        assert_eq!(p("ubuntu:22.04").default_name(), "ubuntu-22.04");
    }

    #[test]
    fn other_registries() {
        let r = p("nvcr.io/nvidia/pytorch:24.01-py3");
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("nvcr.io", "nvidia/pytorch", Some("24.01-py3"))
        );
        assert_eq!(r.api_host(), "nvcr.io");
        assert!(!r.is_loopback());
        let r = p(&format!("localhost:5000/x/y@{D}"));
        assert_eq!((r.registry.as_str(), r.repository.as_str()), ("localhost:5000", "x/y"));
        assert_eq!((r.tag.as_deref(), r.digest.as_deref()), (None, Some(D)));
        assert_eq!(r.manifest_ref(), D);
        assert!(r.is_loopback());
        assert_eq!(r.default_name(), "x-y-sha256-0123456789ab");
        let r = p(&format!("127.0.0.1:5000/test/img:v1@{D}"));
        assert_eq!((r.tag.as_deref(), r.manifest_ref()), (Some("v1"), D));
        assert!(r.is_loopback());
        assert_eq!(r.host(), "127.0.0.1");
        let r = p("localhost/foo");
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str()),
            ("localhost", "foo"),
            "no library/ outside Docker Hub"
        );
        assert!(p("[::1]:5000/a/b:c").is_loopback());
        assert_eq!(p("ghcr.io/a/b/c:d").repository, "a/b/c");
        assert_eq!(p("registry.example.com:8443/team/img").tag.as_deref(), Some("latest"));
    }

    #[test]
    fn invalid() {
        for bad in [
            "",
            "Ubuntu",
            "https://nvcr.io/x",
            "ubuntu:",
            "ubuntu:-x",
            "a//b",
            "a/b/",
            "localhost:99999/x",
            "ubuntu@sha256:abc",
            "ubuntu@md5:0123",
            "a b",
            "ubuntu:tag with space",
            "x/-y",
        ] {
            let e = Reference::parse(bad).err().unwrap_or_else(|| panic!("{bad} accepted"));
            let msg = e.to_string();
            assert!(msg.starts_with("invalid image reference"), "{msg}");
            assert!(!msg.contains('\n'));
        }
        assert!(Reference::parse("Ubuntu").unwrap_err().to_string().contains("lowercase"));
    }

    #[test]
    fn names_are_valid_rootfs_names() {
        for r in ["a", "x/y:1", "nvcr.io/nvidia/pytorch:24.01-py3", "a/b__c:_t", &format!("{}:{}", "a".repeat(80), "t")]
        {
            let n = p(r).default_name();
            assert!(crate::rootfs::validate_name(&n).is_ok(), "{r} -> {n}");
        }
        assert_eq!(p("nvcr.io/nvidia/pytorch:24.01-py3").default_name(), "nvidia-pytorch-24.01-py3");
    }
}
