//! Registry credentials and authentication challenges.
//!
//! Credentials come from a file in Docker's `config.json` format (also what podman and
//! skopeo write as `auth.json`): `{"auths": {"HOST": {"auth": base64("user:pass")}}}`
//! (or `username` / `password` fields). The file is `--auth-file`, else
//! `$REGISTRY_AUTH_FILE`, else `$DOCKER_CONFIG/config.json`, else
//! `~/.docker/config.json`. Credential helpers (`credsStore`, `credHelpers`) are not run.
//!
//! Challenges are the `WWW-Authenticate` header of a 401: `Bearer realm=..,service=..,
//! scope=..` (the token flow) or `Basic realm=..`.

use super::reference::{host_of, DOCKER_HUB};
use anyhow::{bail, Context, Result};
use base64::Engine as _;
use std::path::{Path, PathBuf};

/// A user name and password (or token). `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("username", &self.username).field("password", &"<redacted>").finish()
    }
}

impl Credentials {
    /// `Basic base64(user:pass)`.
    pub fn basic_header(&self) -> String {
        let raw = format!("{}:{}", self.username, self.password);
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(raw))
    }
}

/// A parsed credentials file.
#[derive(Debug, Default, Clone)]
pub struct AuthFile {
    /// Where it was read from (for messages).
    pub path: Option<PathBuf>,
    entries: Vec<(String, Credentials)>,
}

#[derive(serde::Deserialize)]
struct ConfigJson {
    #[serde(default)]
    auths: std::collections::BTreeMap<String, AuthEntry>,
}

#[derive(serde::Deserialize, Default)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    identitytoken: Option<String>,
}

/// A credentials-file key (`https://index.docker.io/v1/`, `nvcr.io`, `http://host:5000`)
/// as a registry name: scheme and path dropped, lowercase, Docker Hub's aliases folded.
fn normalize_key(key: &str) -> String {
    let k = key.trim();
    let k = k.strip_prefix("https://").or_else(|| k.strip_prefix("http://")).unwrap_or(k);
    let k = k.split('/').next().unwrap_or(k).to_ascii_lowercase();
    match k.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => DOCKER_HUB.into(),
        _ => k,
    }
}

impl AuthFile {
    /// The file to read: `explicit`, else `$REGISTRY_AUTH_FILE`, else
    /// `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`. `Ok(empty)` when none
    /// exists (anonymous pulls); an error when `explicit` cannot be read or any file is
    /// malformed.
    pub fn load(explicit: Option<&Path>) -> Result<AuthFile> {
        if let Some(p) = explicit {
            return Self::read(p);
        }
        let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        let candidates = [
            env("REGISTRY_AUTH_FILE"),
            env("DOCKER_CONFIG").map(|d| d.join("config.json")),
            env("HOME").map(|h| h.join(".docker/config.json")),
        ];
        for p in candidates.into_iter().flatten() {
            if p.is_file() {
                return Self::read(&p);
            }
        }
        Ok(AuthFile::default())
    }

    /// Reads one file.
    pub fn read(path: &Path) -> Result<AuthFile> {
        let bytes = std::fs::read(path)
            .with_context(|| format!("cannot read the registry credentials file {}", path.display()))?;
        let mut f = Self::parse(&bytes).with_context(|| {
            format!("malformed registry credentials file {} (expected Docker's config.json format)", path.display())
        })?;
        f.path = Some(path.to_path_buf());
        Ok(f)
    }

    pub fn parse(bytes: &[u8]) -> Result<AuthFile> {
        let cfg: ConfigJson = serde_json::from_slice(bytes)?;
        let mut entries = Vec::new();
        for (key, e) in cfg.auths {
            let creds = if let Some(a) = e.auth.as_deref().filter(|a| !a.is_empty()) {
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(a.trim())
                    .with_context(|| format!("auths.{key}.auth is not base64"))?;
                let raw = String::from_utf8(raw).with_context(|| format!("auths.{key}.auth is not text"))?;
                let Some((u, p)) = raw.split_once(':') else {
                    bail!("auths.{key}.auth is not base64 of USER:PASSWORD");
                };
                Credentials { username: u.to_string(), password: p.to_string() }
            } else if let (Some(u), Some(p)) = (e.username, e.password) {
                Credentials { username: u, password: p }
            } else {
                if e.identitytoken.is_some() {
                    tracing::debug!("ignoring the identity token for {key} in the credentials file (not supported)");
                }
                continue;
            };
            entries.push((normalize_key(&key), creds));
        }
        Ok(AuthFile { path: None, entries })
    }

    /// Credentials for `registry` (`host[:port]`, `docker.io` for Docker Hub): an exact
    /// `host:port` entry first, then one for the host alone.
    pub fn lookup(&self, registry: &str) -> Option<&Credentials> {
        let want = normalize_key(registry);
        let host = host_of(&want).to_string();
        self.entries
            .iter()
            .find(|(k, _)| *k == want)
            .or_else(|| self.entries.iter().find(|(k, _)| *k == host))
            .map(|(_, c)| c)
    }

    /// For messages: the file, or where one would be read from.
    pub fn describe(&self) -> String {
        match &self.path {
            Some(p) => p.display().to_string(),
            None => "no credentials file (give one with --auth-file, or write ~/.docker/config.json)".into(),
        }
    }
}

/// A parsed `WWW-Authenticate` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    Bearer { realm: String, service: Option<String>, scope: Option<String> },
    Basic,
    Other(String),
}

impl Challenge {
    /// Parses the first challenge of a `WWW-Authenticate` value.
    pub fn parse(header: &str) -> Option<Challenge> {
        let h = header.trim();
        let (scheme, rest) = match h.find(|c: char| c.is_whitespace()) {
            Some(i) => (&h[..i], h[i..].trim_start()),
            None => (h, ""),
        };
        if scheme.is_empty() {
            return None;
        }
        let params = parse_params(rest);
        let get = |k: &str| params.iter().find(|(n, _)| n.eq_ignore_ascii_case(k)).map(|(_, v)| v.clone());
        match scheme.to_ascii_lowercase().as_str() {
            "bearer" => Some(Challenge::Bearer { realm: get("realm")?, service: get("service"), scope: get("scope") }),
            "basic" => Some(Challenge::Basic),
            _ => Some(Challenge::Other(scheme.to_string())),
        }
    }
}

/// `k=v, k="quoted \"v\"", ...` (RFC 7235 auth-params).
fn parse_params(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        while i < b.len() && (b[i] == b',' || b[i].is_ascii_whitespace()) {
            i += 1;
        }
        let start = i;
        while i < b.len() && b[i] != b'=' && b[i] != b',' {
            i += 1;
        }
        let key = s[start..i].trim().to_string();
        if i >= b.len() || b[i] != b'=' {
            continue;
        }
        i += 1;
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        let mut val = String::new();
        if i < b.len() && b[i] == b'"' {
            i += 1;
            let mut bytes = Vec::new();
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' && i + 1 < b.len() {
                    i += 1;
                }
                bytes.push(b[i]);
                i += 1;
            }
            i += 1; // closing quote
            val = String::from_utf8_lossy(&bytes).into_owned();
        } else {
            let vs = i;
            while i < b.len() && b[i] != b',' {
                i += 1;
            }
            val.push_str(s[vs..i].trim());
        }
        if !key.is_empty() {
            out.push((key, val));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges() {
        let c = Challenge::parse(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/ubuntu:pull""#,
        );
        assert_eq!(
            c,
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
                scope: Some("repository:library/ubuntu:pull".into()),
            })
        );
        let c = Challenge::parse(r#"bearer  realm = "https://nvcr.io/proxy_auth" , scope="a:b\"c,d""#);
        assert_eq!(
            c,
            Some(Challenge::Bearer {
                realm: "https://nvcr.io/proxy_auth".into(),
                service: None,
                scope: Some("a:b\"c,d".into())
            })
        );
        assert_eq!(
            Challenge::parse(r#"Bearer realm=http://127.0.0.1:1/t,service=x"#),
            Some(Challenge::Bearer { realm: "http://127.0.0.1:1/t".into(), service: Some("x".into()), scope: None })
        );
        assert_eq!(Challenge::parse(r#"Basic realm="basic-realm""#), Some(Challenge::Basic));
        assert_eq!(Challenge::parse("Basic"), Some(Challenge::Basic));
        assert_eq!(Challenge::parse("Negotiate"), Some(Challenge::Other("Negotiate".into())));
        assert_eq!(Challenge::parse("Bearer service=x"), None, "a bearer challenge needs a realm");
        assert_eq!(Challenge::parse(""), None);
    }

    #[test]
    fn auth_files() {
        let enc = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let json = format!(
            r#"{{"auths": {{
                "https://index.docker.io/v1/": {{"auth": "{}"}},
                "nvcr.io": {{"auth": "{}"}},
                "http://localhost:5000": {{"username": "u", "password": "p:w"}},
                "ghcr.io": {{"identitytoken": "x"}}
            }}, "credsStore": "desktop"}}"#,
            enc("hubuser:hubpass"),
            enc("$oauthtoken:nvapi-xyz")
        );
        let f = AuthFile::parse(json.as_bytes()).unwrap();
        let hub = f.lookup("docker.io").unwrap();
        assert_eq!((hub.username.as_str(), hub.password.as_str()), ("hubuser", "hubpass"));
        assert_eq!(f.lookup("nvcr.io").unwrap().username, "$oauthtoken");
        assert_eq!(f.lookup("nvcr.io:443").unwrap().password, "nvapi-xyz", "host-only entry serves any port");
        assert_eq!(f.lookup("localhost:5000").unwrap().password, "p:w");
        assert!(f.lookup("localhost:5001").is_none());
        assert!(f.lookup("ghcr.io").is_none());
        assert!(!format!("{hub:?}").contains("hubpass"));
        assert_eq!(hub.basic_header(), format!("Basic {}", enc("hubuser:hubpass")));
        assert!(AuthFile::parse(br#"{"auths": {"x": {"auth": "bm9jb2xvbg=="}}}"#).is_err(), "no colon");
        assert!(AuthFile::parse(b"not json").is_err());
        assert!(AuthFile::parse(b"{}").unwrap().lookup("docker.io").is_none());
    }

    #[test]
    fn explicit_file_must_exist() {
        let e = AuthFile::load(Some(Path::new("/nonexistent/auth.json"))).unwrap_err();
        assert!(format!("{e:#}").contains("cannot read the registry credentials file /nonexistent/auth.json"));
    }
}
