//! A client of the OCI distribution API (blocking reqwest, rustls): manifests, blobs,
//! tag lists, with the token flow (401 + `WWW-Authenticate: Bearer ...` -> token
//! request, with Basic credentials if there are any), Basic auth, and bounded retries of
//! transient failures (connection errors, timeouts, 5xx, 429) with the backoff of
//! [`RetryPolicy`]. The client, the network-failure classification and the retry loop are
//! the shared [`crate::http`] layer's; what a status means to a registry is this module's.

use super::auth::{AuthFile, Challenge, Credentials};
use super::reference::Reference;
use crate::http::{self, read_limited, read_small, ClientSettings, ErrorAnswer, HttpError, RetryPolicy};
use reqwest::blocking::{Client, Response};
use reqwest::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE, RANGE, WWW_AUTHENTICATE};
use reqwest::{StatusCode, Url};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Connect, header and per-read time limit.
const TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error(
        "cannot reach registry {registry}: {cause}; check the registry name, the network and the proxy (HTTPS_PROXY)"
    )]
    Unreachable { registry: String, cause: String },
    /// A certificate problem: not retried.
    #[error("cannot reach registry {registry}: {cause} (for a registry with a private CA, put its certificate in /etc/docker/certs.d/{registry}/ca.crt or point SSL_CERT_FILE at it)")]
    Tls { registry: String, cause: String },
    #[error("no answer from registry {registry} within {}s ({what}); the network or the registry is slow, try again", TIMEOUT.as_secs())]
    Timeout { registry: String, what: String },
    #[error("repository '{repo}' not found on {registry} (404 NAME_UNKNOWN): check the name{hint}")]
    UnknownRepo { registry: String, repo: String, hint: &'static str },
    #[error("{what} not found in {image} (404 MANIFEST_UNKNOWN){tags}")]
    UnknownManifest { what: String, image: String, tags: String },
    #[error("authentication to {registry} failed ({detail}): {fix}")]
    Auth { registry: String, detail: String, fix: String },
    #[error("registry {registry} answered HTTP {status} to {what}{detail}{hint}")]
    Server {
        registry: String,
        status: u16,
        what: String,
        detail: String,
        hint: &'static str,
        retry_after: Option<Duration>,
    },
    #[error("{what}: the download broke off after {got} bytes: {cause}")]
    Broken { what: String, got: u64, cause: String },
    #[error("unexpected answer from registry {registry} to {what}: {detail}")]
    Protocol { registry: String, what: String, detail: String },
}

impl RegistryError {
    pub fn is_transient(&self) -> bool {
        match self {
            RegistryError::Unreachable { .. } | RegistryError::Timeout { .. } | RegistryError::Broken { .. } => true,
            RegistryError::Server { status, .. } => *status >= 500 || *status == 429 || *status == 408,
            _ => false,
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            RegistryError::Server { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

pub use crate::http::retry;

/// `Some(retry_after)` for transient registry errors.
pub fn transient(e: &RegistryError) -> Option<Option<Duration>> {
    e.is_transient().then(|| e.retry_after())
}

/// One repository on one registry. `Sync`: blobs may be fetched from several threads.
pub struct RegistryClient {
    http: Client,
    base: Url,
    registry: String,
    repo: String,
    creds: Option<Credentials>,
    auth_file: String,
    /// The `Authorization` value that worked last (a bearer token, or Basic).
    auth: Mutex<Option<HeaderValue>>,
    pub retry: RetryPolicy,
    requests: AtomicU64,
    blob_requests: AtomicU64,
}

/// A response with a success status.
pub struct Answer {
    pub resp: Response,
    pub status: StatusCode,
}

impl RegistryClient {
    /// `insecure`: plain http, allowed only for loopback registries.
    pub fn new(r: &Reference, auth: &AuthFile, insecure: bool) -> anyhow::Result<RegistryClient> {
        if insecure && !r.is_loopback() {
            anyhow::bail!(
                "--insecure (plain http) is only allowed for localhost / 127.x registries, not '{}': the registry must serve https",
                r.registry
            );
        }
        let scheme = if insecure { "http" } else { "https" };
        let base = Url::parse(&format!("{scheme}://{}/", r.api_host()))
            .map_err(|e| anyhow::anyhow!("invalid registry '{}': {e}", r.registry))?;
        let ssl_cert_file = std::env::var_os("SSL_CERT_FILE").filter(|v| !v.is_empty()).map(PathBuf::from);
        let roots = extra_roots(&r.registry, ssl_cert_file.as_deref(), CERTS_D)?.into_iter().map(|(cert, from)| {
            tracing::debug!("trusting a CA certificate from {}", from.display());
            cert
        });
        // Proxies from the environment, except for a loopback registry (see ClientSettings).
        let http = ClientSettings::new(TIMEOUT).trust(roots).build(&base)?;
        Ok(RegistryClient {
            http,
            base,
            registry: r.registry.clone(),
            repo: r.repository.clone(),
            creds: auth.lookup(&r.registry).cloned(),
            auth_file: auth.describe(),
            auth: Mutex::new(None),
            retry: RetryPolicy::default(),
            requests: AtomicU64::new(0),
            blob_requests: AtomicU64::new(0),
        })
    }

    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// HTTP requests sent to the registry and token servers.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Blob GETs (counts retries and resumptions).
    pub fn blob_requests(&self) -> u64 {
        self.blob_requests.load(Ordering::Relaxed)
    }

    fn url(&self, tail: &str) -> Url {
        self.base.join(&format!("v2/{}/{tail}", self.repo)).expect("valid path")
    }

    fn image(&self) -> String {
        format!("{}/{}", self.registry, self.repo)
    }

    fn net_error(&self, e: reqwest::Error, what: &str) -> RegistryError {
        let registry = self.registry.clone();
        match HttpError::from_reqwest(e, &self.registry, TIMEOUT) {
            HttpError::Timeout { .. } => RegistryError::Timeout { registry, what: what.into() },
            HttpError::Tls { cause, .. } => RegistryError::Tls { registry, cause },
            HttpError::Unreachable { cause, .. } => RegistryError::Unreachable { registry, cause },
            e => RegistryError::Unreachable { registry, cause: e.to_string() },
        }
    }

    /// GET `url`, answering one 401 with the challenge's flow. Returns any status but 401.
    fn get(&self, url: Url, accept: Option<&str>, range_from: u64, what: &str) -> Result<Response, RegistryError> {
        let mut authed = false;
        loop {
            let mut req = self.http.get(url.clone());
            if let Some(a) = accept {
                req = req.header(ACCEPT, a);
            }
            if range_from > 0 {
                req = req.header(RANGE, format!("bytes={range_from}-"));
            }
            if let Some(h) = self.auth.lock().expect("auth lock").clone() {
                req = req.header(AUTHORIZATION, h);
            }
            self.requests.fetch_add(1, Ordering::Relaxed);
            let resp = req.send().map_err(|e| self.net_error(e, what))?;
            if resp.status() != StatusCode::UNAUTHORIZED {
                return Ok(resp);
            }
            let header = resp.headers().get(WWW_AUTHENTICATE).and_then(|v| v.to_str().ok()).map(str::to_owned);
            let body = read_small(resp);
            if authed {
                return Err(self.auth_failed(&format!("HTTP 401{}", error_detail(&body))));
            }
            authed = true;
            let challenge = header.as_deref().and_then(Challenge::parse);
            self.authenticate(challenge, what)?;
        }
    }

    fn auth_failed(&self, detail: &str) -> RegistryError {
        let fix = match &self.creds {
            Some(c) => format!(
                "the credentials of '{}' for {} in {} were refused, or the repository {} does not exist; fix them or the image name",
                c.username,
                self.registry,
                self.auth_file,
                self.repo
            ),
            None => format!(
                "the repository {} does not exist, or it needs credentials: add them for {} to a Docker config.json (--auth-file, $REGISTRY_AUTH_FILE or ~/.docker/config.json); {}",
                self.repo,
                self.registry,
                if self.auth_file.starts_with("no credentials") { "none was found".to_string() } else { format!("{} has none for it", self.auth_file) }
            ),
        };
        RegistryError::Auth { registry: self.registry.clone(), detail: detail.into(), fix }
    }

    fn authenticate(&self, challenge: Option<Challenge>, what: &str) -> Result<(), RegistryError> {
        match challenge {
            Some(Challenge::Basic) => {
                let Some(c) = &self.creds else {
                    return Err(self.auth_failed("HTTP 401, Basic authentication required"));
                };
                if self.base.scheme() != "https" && !http::is_loopback(&self.base) {
                    return Err(self.auth_failed("refusing to send a password over plain http"));
                }
                let mut h = HeaderValue::from_str(&c.basic_header())
                    .map_err(|_| self.auth_failed("the credentials are not plain text"))?;
                h.set_sensitive(true);
                *self.auth.lock().expect("auth lock") = Some(h);
                Ok(())
            }
            Some(Challenge::Bearer { realm, service, scope }) => {
                let token = self.fetch_token(&realm, service.as_deref(), scope.as_deref(), what)?;
                let mut h = HeaderValue::from_str(&format!("Bearer {token}"))
                    .map_err(|_| self.protocol("a token request", "the token is not plain text"))?;
                h.set_sensitive(true);
                *self.auth.lock().expect("auth lock") = Some(h);
                Ok(())
            }
            Some(Challenge::Other(s)) => {
                Err(self.auth_failed(&format!("HTTP 401 asking for '{s}' authentication, which is not supported")))
            }
            None => Err(self.auth_failed("HTTP 401 without a usable WWW-Authenticate challenge")),
        }
    }

    fn protocol(&self, what: &str, detail: &str) -> RegistryError {
        RegistryError::Protocol { registry: self.registry.clone(), what: what.into(), detail: detail.into() }
    }

    /// The token flow: GET realm?service=..&scope=.. (with Basic credentials if any).
    fn fetch_token(
        &self,
        realm: &str,
        service: Option<&str>,
        scope: Option<&str>,
        what: &str,
    ) -> Result<String, RegistryError> {
        let mut url = Url::parse(realm).map_err(|e| self.protocol(what, &format!("bad token realm '{realm}': {e}")))?;
        if !matches!(url.scheme(), "https" | "http") {
            return Err(self.protocol(what, &format!("bad token realm '{realm}'")));
        }
        let default_scope = format!("repository:{}:pull", self.repo);
        {
            let mut q = url.query_pairs_mut();
            if let Some(s) = service {
                q.append_pair("service", s);
            }
            q.append_pair("scope", scope.unwrap_or(&default_scope));
        }
        let mut req = self.http.get(url.clone());
        if let Some(c) = &self.creds {
            if url.scheme() != "https" && !http::is_loopback(&url) {
                return Err(self.auth_failed(&format!(
                    "refusing to send credentials to the plain-http token server {}",
                    url.origin().ascii_serialization()
                )));
            }
            let mut h = HeaderValue::from_str(&c.basic_header())
                .map_err(|_| self.auth_failed("the credentials are not plain text"))?;
            h.set_sensitive(true);
            req = req.header(AUTHORIZATION, h);
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        let shown = url.origin().ascii_serialization();
        let resp = req.send().map_err(|e| match self.net_error(e, "a token request") {
            RegistryError::Unreachable { cause, .. } => {
                RegistryError::Unreachable { registry: format!("{} (token server {shown})", self.registry), cause }
            }
            other => other,
        })?;
        let status = resp.status();
        let body = read_small(resp);
        match status.as_u16() {
            200 => {}
            401 | 403 => {
                return Err(self.auth_failed(&format!(
                    "the token server {shown} answered HTTP {}{}",
                    status.as_u16(),
                    error_detail(&body)
                )))
            }
            s if s >= 500 || s == 429 => {
                return Err(RegistryError::Server {
                    registry: self.registry.clone(),
                    status: s,
                    what: format!("a token request to {shown}"),
                    detail: error_detail(&body),
                    hint: "",
                    retry_after: None,
                })
            }
            s => return Err(self.protocol("a token request", &format!("HTTP {s}{}", error_detail(&body)))),
        }
        #[derive(serde::Deserialize)]
        struct Tok {
            token: Option<String>,
            access_token: Option<String>,
        }
        let t: Tok = serde_json::from_slice(&body)
            .map_err(|e| self.protocol("a token request", &format!("not a token answer ({e})")))?;
        t.token
            .or(t.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| self.protocol("a token request", "the answer has no token"))
    }

    /// An error for a non-success answer to `what`.
    fn status_error(&self, resp: Response, what: &str) -> RegistryError {
        let ErrorAnswer { status, retry_after, body } = ErrorAnswer::read(resp);
        let code = error_code(&body);
        match (status, code.as_deref()) {
            (404, Some("NAME_UNKNOWN")) => RegistryError::UnknownRepo {
                registry: self.registry.clone(),
                repo: self.repo.clone(),
                hint: if self.registry == super::reference::DOCKER_HUB {
                    " (Docker Hub's official images are library/NAME)"
                } else {
                    ""
                },
            },
            (403, _) => self.auth_failed(&format!("HTTP 403{}", error_detail(&body))),
            (429, _) => RegistryError::Server {
                registry: self.registry.clone(),
                status,
                what: what.into(),
                detail: error_detail(&body),
                hint: " (rate limit: retried with backoff; log in with --auth-file for a higher limit, or try later)",
                retry_after,
            },
            _ => RegistryError::Server {
                registry: self.registry.clone(),
                status,
                what: what.into(),
                detail: error_detail(&body),
                hint: "",
                retry_after,
            },
        }
    }

    /// The manifest (or index) `reference` (a tag or digest): body and content type.
    pub fn manifest(&self, reference: &str) -> Result<(Vec<u8>, Option<String>), RegistryError> {
        let what = format!("the manifest {}:{reference}", self.image());
        retry(&self.retry, transient, || {
            let resp =
                self.get(self.url(&format!("manifests/{reference}")), Some(super::image::MANIFEST_ACCEPT), 0, &what)?;
            if !resp.status().is_success() {
                if resp.status() == StatusCode::NOT_FOUND {
                    let body = read_small(resp);
                    return Err(match error_code(&body).as_deref() {
                        Some("NAME_UNKNOWN") => self.status_error_404_name(),
                        _ => self.unknown_manifest(reference),
                    });
                }
                return Err(self.status_error(resp, &what));
            }
            let ct = resp.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_owned);
            let body = read_limited(resp, super::image::MAX_MANIFEST).map_err(|e| RegistryError::Broken {
                what: what.clone(),
                got: 0,
                cause: e,
            })?;
            Ok((body, ct))
        })
    }

    fn status_error_404_name(&self) -> RegistryError {
        RegistryError::UnknownRepo {
            registry: self.registry.clone(),
            repo: self.repo.clone(),
            hint: if self.registry == super::reference::DOCKER_HUB {
                " (Docker Hub's official images are library/NAME)"
            } else {
                ""
            },
        }
    }

    /// A 404 for a manifest: tells an unknown repository from an unknown tag (listing
    /// some tags) with the tag list.
    fn unknown_manifest(&self, reference: &str) -> RegistryError {
        let is_digest = reference.starts_with("sha256:");
        let what = if is_digest { format!("manifest {reference}") } else { format!("tag '{reference}'") };
        let mut tags = String::new();
        match self.tags(20) {
            Ok((list, more)) if !list.is_empty() => {
                tags = format!("; available tags: {}{}", list.join(", "), if more { ", ..." } else { "" });
            }
            Ok(_) => tags = "; the repository has no tags".into(),
            Err(e @ RegistryError::UnknownRepo { .. }) => return e,
            Err(_) => {}
        }
        RegistryError::UnknownManifest { what, image: self.image(), tags }
    }

    /// Up to `n` tags (and whether there are more).
    pub fn tags(&self, n: usize) -> Result<(Vec<String>, bool), RegistryError> {
        let what = format!("the tag list of {}", self.image());
        let mut url = self.url("tags/list");
        url.query_pairs_mut().append_pair("n", &(n + 1).to_string());
        let resp = self.get(url, None, 0, &what)?;
        if !resp.status().is_success() {
            return Err(self.status_error(resp, &what));
        }
        #[derive(serde::Deserialize)]
        struct Tags {
            tags: Option<Vec<String>>,
        }
        let body = read_small(resp);
        let t: Tags = serde_json::from_slice(&body).map_err(|e| self.protocol(&what, &e.to_string()))?;
        let mut tags = t.tags.unwrap_or_default();
        let more = tags.len() > n;
        tags.truncate(n);
        Ok((tags, more))
    }

    /// Starts a blob download at byte `from` (a `Range` request when `from > 0`).
    /// `Ok((resp, resumed))`: `resumed` is false when the registry sent the whole blob.
    pub fn blob(&self, digest: &str, from: u64, what: &str) -> Result<(Response, bool), RegistryError> {
        self.blob_requests.fetch_add(1, Ordering::Relaxed);
        let resp = self.get(self.url(&format!("blobs/{digest}")), None, from, what)?;
        match resp.status() {
            StatusCode::OK => Ok((resp, false)),
            StatusCode::PARTIAL_CONTENT if from > 0 => {
                let starts = resp
                    .headers()
                    .get(reqwest::header::CONTENT_RANGE)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|s| s.strip_prefix("bytes "))
                    .and_then(|s| s.split('-').next())
                    .and_then(|s| s.parse::<u64>().ok());
                if starts == Some(from) {
                    Ok((resp, true))
                } else {
                    Err(RegistryError::Broken {
                        what: what.into(),
                        got: from,
                        cause: "the registry resumed at the wrong offset".into(),
                    })
                }
            }
            StatusCode::NOT_FOUND => {
                let body = read_small(resp);
                match error_code(&body).as_deref() {
                    Some("NAME_UNKNOWN") => Err(self.status_error_404_name()),
                    _ => {
                        Err(self.protocol(what, "HTTP 404 (BLOB_UNKNOWN): the registry lost a blob its manifest names"))
                    }
                }
            }
            _ => Err(self.status_error(resp, what)),
        }
    }
}

/// Where Docker and podman look for a registry's CA certificates (`DIR/HOST[:PORT]/*.crt`).
const CERTS_D: &[&str] = &["/etc/docker/certs.d", "/etc/containers/certs.d"];

/// CA certificates to trust besides the built-in roots: the PEM bundle `ssl_cert_file`
/// (`$SSL_CERT_FILE`), and `*.crt` in `CERTS_D/<registry>/`.
fn extra_roots(
    registry: &str,
    ssl_cert_file: Option<&Path>,
    certs_d: &[&str],
) -> anyhow::Result<Vec<(reqwest::Certificate, PathBuf)>> {
    let mut files: Vec<PathBuf> = ssl_cert_file.map(Path::to_path_buf).into_iter().collect();
    for base in certs_d {
        let Ok(rd) = std::fs::read_dir(Path::new(base).join(registry)) else { continue };
        let mut found: Vec<PathBuf> =
            rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "crt")).collect();
        found.sort();
        files.extend(found);
    }
    let mut out = Vec::new();
    for f in files {
        out.extend(http::pem_bundle(&f)?.into_iter().map(|c| (c, f.clone())));
    }
    Ok(out)
}

#[derive(serde::Deserialize)]
struct Errors {
    errors: Vec<ErrorItem>,
}

#[derive(serde::Deserialize)]
struct ErrorItem {
    code: Option<String>,
    message: Option<String>,
}

fn error_code(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<Errors>(body).ok()?.errors.into_iter().find_map(|e| e.code)
}

/// ` (CODE: message)` from a distribution error body, or nothing.
fn error_detail(body: &[u8]) -> String {
    let Ok(e) = serde_json::from_slice::<Errors>(body) else { return String::new() };
    let Some(first) = e.errors.into_iter().next() else { return String::new() };
    let s = match (first.code, first.message) {
        (Some(c), Some(m)) => format!("{c}: {m}"),
        (Some(c), None) => c,
        (None, Some(m)) => m,
        (None, None) => return String::new(),
    };
    let s: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    format!(" ({})", s.chars().take(200).collect::<String>())
}

/// "a: b: c" from an error and its sources, repeated parts dropped.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    http::error_chain_full(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies() {
        let b = br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown","detail":{"Tag":"x"}}]}"#;
        assert_eq!(error_code(b).as_deref(), Some("MANIFEST_UNKNOWN"));
        assert_eq!(error_detail(b), " (MANIFEST_UNKNOWN: manifest unknown)");
        assert_eq!(error_detail(b"<html>"), "");
        assert_eq!(error_code(b"{}"), None);
    }

    #[test]
    fn insecure_only_for_loopback() {
        let r = Reference::parse("nvcr.io/nvidia/pytorch:24.01-py3").unwrap();
        let e = RegistryClient::new(&r, &AuthFile::default(), true).err().unwrap().to_string();
        assert!(
            e.starts_with("--insecure (plain http) is only allowed for localhost / 127.x registries, not 'nvcr.io'"),
            "{e}"
        );
        let r = Reference::parse("127.0.0.1:5000/a/b").unwrap();
        let c = RegistryClient::new(&r, &AuthFile::default(), true).unwrap();
        assert_eq!(c.url("manifests/latest").as_str(), "http://127.0.0.1:5000/v2/a/b/manifests/latest");
        let r = Reference::parse("ubuntu").unwrap();
        let c = RegistryClient::new(&r, &AuthFile::default(), false).unwrap();
        assert_eq!(c.url("blobs/x").as_str(), "https://registry-1.docker.io/v2/library/ubuntu/blobs/x");
    }

    #[test]
    fn certs_d() {
        let d = tempfile::tempdir().unwrap();
        let base = d.path().to_str().unwrap();
        assert!(extra_roots("reg.example:5000", None, &[base]).unwrap().is_empty());
        std::fs::create_dir_all(d.path().join("reg.example:5000")).unwrap();
        std::fs::write(d.path().join("reg.example:5000/ca.crt"), b"not a certificate").unwrap();
        std::fs::write(d.path().join("reg.example:5000/client.key"), b"ignored").unwrap();
        let e = extra_roots("reg.example:5000", None, &[base]).err().unwrap().to_string();
        assert!(e.contains("reg.example:5000/ca.crt is not a PEM certificate bundle"), "{e}");
        assert!(extra_roots("other.example", None, &[base]).unwrap().is_empty());
        let e = extra_roots("other.example", Some(Path::new("/nonexistent.pem")), &[base]).err().unwrap().to_string();
        assert!(e.starts_with("cannot read the CA certificates in /nonexistent.pem"), "{e}");
    }

    #[test]
    fn retries_only_transient() {
        let p = RetryPolicy::fast(4);
        let mut n = 0;
        let r: Result<(), RegistryError> = retry(&p, transient, || {
            n += 1;
            Err(RegistryError::Timeout { registry: "r".into(), what: "w".into() })
        });
        assert!(r.is_err());
        assert_eq!(n, 4);
        let mut n = 0;
        let r: Result<(), RegistryError> = retry(&p, transient, || {
            n += 1;
            Err(RegistryError::UnknownRepo { registry: "r".into(), repo: "x".into(), hint: "" })
        });
        assert!(r.is_err());
        assert_eq!(n, 1);
    }
}
