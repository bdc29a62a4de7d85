//! Azure DevOps REST client: the few calls azp-sandbox needs (start-up checks, agent
//! records, the agent package, job requests), blocking (reqwest's blocking client; no
//! async runtime in our code).
//!
//! Every request carries `Authorization: Basic base64(":" + PAT)`,
//! `X-TFS-FedAuthRedirect: Suppress` (so a bad PAT gets 401 instead of a 203 sign-in
//! page) and `Accept: application/json;api-version=7.1`. The PAT lives only in a header
//! value marked sensitive; `Debug` shows `<redacted>`, no URL or error carries it, and it
//! is sent only to the organization's own origin (never to a package download host).
//!
//! Failures map to [`AzureError`], one line each that says what to fix. Idempotent calls
//! are retried on transient failures with [`with_retry`] and the client's [`RetryPolicy`].
//! Client construction (proxy, time limits), the classification of network failures and
//! the retry loop are the shared [`crate::http`] layer's; the meaning of each status to
//! Azure DevOps (PAT, permission, pool) is this module's.

mod error;
mod retry;
mod types;

pub use crate::http::RetryPolicy;
pub use error::AzureError;
pub use retry::with_retry;
pub use types::{Agent, AgentRef, ConnectionInfo, Identity, JobRequest, NamedRef, PackageInfo, PackageVersion, Pool};

use crate::http::{self, error_chain, one_line, redact_url, ClientSettings, HttpError};
use base64::Engine as _;
use reqwest::blocking::{Client, Response};
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use reqwest::{Method, StatusCode, Url};
use serde::de::DeserializeOwned;
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

/// The REST API version of the documented calls.
const API_VERSION: &str = "7.1";
/// `connectionData` is a preview resource.
const API_VERSION_CONNECTION_DATA: &str = "7.1-preview";
/// Default time limit for connecting, for an answer's headers, and for each read.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The `platform` of the agent package for this machine: "linux-x64" or "linux-arm64"
/// ("linux-arm" on 32-bit ARM).
pub fn host_platform() -> &'static str {
    if cfg!(target_arch = "aarch64") {
        "linux-arm64"
    } else if cfg!(target_arch = "arm") {
        "linux-arm"
    } else {
        "linux-x64"
    }
}

/// A client for one organization (or Azure DevOps Server collection). Cheap to clone.
#[derive(Clone)]
pub struct AzureClient {
    inner: Arc<Inner>,
}

struct Inner {
    /// Normalized: no trailing slash, no query, no credentials.
    org: Url,
    org_str: String,
    /// `Basic base64(":" + PAT)`, marked sensitive.
    auth: HeaderValue,
    http: Client,
    retry: RetryPolicy,
    timeout: Duration,
}

impl std::fmt::Debug for AzureClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AzureClient")
            .field("org_url", &self.inner.org_str)
            .field("pat", &"<redacted>")
            .field("retry", &self.inner.retry)
            .field("timeout", &self.inner.timeout)
            .finish()
    }
}

impl AzureClient {
    /// `org_url`: `https://dev.azure.com/ORG`, `https://ORG.visualstudio.com` or an Azure
    /// DevOps Server collection URL; plain `http` only for a loopback host (tests).
    /// `pat`: surrounding whitespace (a token file's newline) is ignored.
    pub fn new(org_url: &str, pat: &str) -> Result<AzureClient, AzureError> {
        let org = parse_org_url(org_url)?;
        let pat = pat.trim();
        if pat.is_empty() {
            return Err(AzureError::BadTokenFormat { why: "empty" });
        }
        if pat.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(AzureError::BadTokenFormat {
                why: "not a single word (it contains spaces or control characters)",
            });
        }
        let token = base64::engine::general_purpose::STANDARD.encode(format!(":{pat}"));
        let mut auth = HeaderValue::from_str(&format!("Basic {token}"))
            .map_err(|_| AzureError::BadTokenFormat { why: "not plain text" })?;
        auth.set_sensitive(true);
        let org_str = org.as_str().trim_end_matches('/').to_owned();
        let http = build_http(&org, DEFAULT_TIMEOUT)?;
        Ok(AzureClient {
            inner: Arc::new(Inner {
                org,
                org_str,
                auth,
                http,
                retry: RetryPolicy::default(),
                timeout: DEFAULT_TIMEOUT,
            }),
        })
    }

    /// Replaces the retry policy of the idempotent calls.
    pub fn with_retry_policy(self, retry: RetryPolicy) -> AzureClient {
        let i = &self.inner;
        AzureClient {
            inner: Arc::new(Inner {
                org: i.org.clone(),
                org_str: i.org_str.clone(),
                auth: i.auth.clone(),
                http: i.http.clone(),
                retry,
                timeout: i.timeout,
            }),
        }
    }

    /// Replaces the time limit for connecting, for an answer's headers and for each read
    /// of a body (so a long download is fine as long as data keeps coming).
    pub fn with_timeout(self, timeout: Duration) -> Result<AzureClient, AzureError> {
        let i = &self.inner;
        let http = build_http(&i.org, timeout)?;
        Ok(AzureClient {
            inner: Arc::new(Inner {
                org: i.org.clone(),
                org_str: i.org_str.clone(),
                auth: i.auth.clone(),
                http,
                retry: i.retry.clone(),
                timeout,
            }),
        })
    }

    /// The organization URL, normalized (no trailing slash).
    pub fn org_url(&self) -> &str {
        &self.inner.org_str
    }

    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.inner.retry
    }

    /// `GET {org}/_apis/connectionData`: the URL answers and the PAT is accepted.
    pub fn check_connection(&self) -> Result<ConnectionInfo, AzureError> {
        let url = self.url("_apis/connectionData", &[]);
        self.get_json(url, Some(API_VERSION_CONNECTION_DATA), "the connection check (connectionData)").map_err(|e| {
            match e {
                AzureError::NotFound { detail, .. } => {
                    AzureError::NotFound { what: format!("{}/_apis/connectionData", self.inner.org_str), detail }
                }
                e => e,
            }
        })
    }

    /// `GET _apis/distributedtask/pools?poolName=NAME`. An unknown pool is a 200 with
    /// count 0: [`AzureError::PoolNotFound`].
    pub fn find_pool(&self, name: &str) -> Result<Pool, AzureError> {
        let url = self.url("_apis/distributedtask/pools", &[("poolName", name)]);
        let list: types::List<Pool> =
            self.get_json(url, Some(API_VERSION), &format!("the lookup of agent pool '{name}'"))?;
        let mut pools = list.value;
        match pools.iter().position(|p| p.name.eq_ignore_ascii_case(name)) {
            Some(i) => Ok(pools.swap_remove(i)),
            None => Err(AzureError::PoolNotFound { name: name.to_owned(), org: self.inner.org_str.clone() }),
        }
    }

    /// `GET .../pools/{id}/agents` with capabilities and assigned requests; `name`
    /// filters on the exact agent name.
    pub fn list_agents(&self, pool_id: u64, name: Option<&str>) -> Result<Vec<Agent>, AzureError> {
        let mut q = vec![("includeCapabilities", "true"), ("includeAssignedRequest", "true")];
        if let Some(n) = name {
            q.push(("agentName", n));
        }
        let url = self.url(&format!("_apis/distributedtask/pools/{pool_id}/agents"), &q);
        let what = format!("the agent list of pool {pool_id}");
        let list: types::List<Agent> = self.get_json(url, Some(API_VERSION), &what).map_err(|e| match e {
            AzureError::Forbidden { .. } => {
                AzureError::Forbidden { what: format!("read the agents of pool {pool_id}") }
            }
            AzureError::NotFound { detail, .. } => {
                AzureError::NotFound { what: format!("agent pool {pool_id}"), detail }
            }
            e => e,
        })?;
        Ok(list.value)
    }

    /// `DELETE .../pools/{id}/agents/{agentId}`. An agent that is already gone is not an
    /// error (the call is idempotent, so it is retried like a GET).
    pub fn delete_agent(&self, pool_id: u64, agent_id: u64) -> Result<(), AzureError> {
        let url = self.url(&format!("_apis/distributedtask/pools/{pool_id}/agents/{agent_id}"), &[]);
        let what = format!("the deletion of agent {agent_id} of pool {pool_id}");
        let r = with_retry(&self.inner.retry, || {
            self.call(Method::DELETE, url.clone(), Some(API_VERSION), &what).map(drop)
        });
        match r {
            Err(AzureError::NotFound { .. }) => {
                tracing::debug!("agent {agent_id} of pool {pool_id} was already deleted");
                Ok(())
            }
            Err(AzureError::Forbidden { .. }) => {
                Err(AzureError::Forbidden { what: format!("delete agents of pool {pool_id}") })
            }
            r => r,
        }
    }

    /// Whether the PAT may manage the pool's agents, as far as can be told cheaply.
    ///
    /// There is no permission endpoint for this: we list the pool's agents (needs read
    /// on the pool) and report a 403 as [`AzureError::Forbidden`]. A PAT with read but
    /// not manage passes here; registration itself (`config.sh`, a POST/PUT of the agent
    /// record) is the final check, and its failure is reported from the agent's output.
    pub fn check_manage_permission(&self, pool_id: u64) -> Result<(), AzureError> {
        match self.list_agents(pool_id, None) {
            Ok(_) => Ok(()),
            Err(AzureError::Forbidden { .. }) => {
                Err(AzureError::Forbidden { what: format!("manage the agents of pool {pool_id}") })
            }
            Err(e) => Err(e),
        }
    }

    /// The newest agent package for `platform` (see [`host_platform`]):
    /// `GET _apis/distributedtask/packages/agent?platform=&top=1`. Sent without an
    /// api-version, as Microsoft's own container start script does.
    pub fn agent_package(&self, platform: &str) -> Result<PackageInfo, AzureError> {
        let url = self.url("_apis/distributedtask/packages/agent", &[("platform", platform), ("top", "1")]);
        let what = format!("the agent package list for {platform}");
        let list: types::List<PackageInfo> = self.get_json(url, None, &what)?;
        list.value
            .into_iter()
            .max_by_key(|p| p.version)
            .ok_or_else(|| AzureError::Protocol { what, detail: format!("no agent package for platform '{platform}'") })
    }

    /// The pool's job requests, newest first, at most `top` (`GET .../jobrequests?$top=`;
    /// undocumented, the call KEDA's scaler uses). Queued ones: [`JobRequest::is_queued`].
    pub fn job_requests(&self, pool_id: u64, top: u32) -> Result<Vec<JobRequest>, AzureError> {
        let top = top.to_string();
        let url = self.url(&format!("_apis/distributedtask/pools/{pool_id}/jobrequests"), &[("$top", &top)]);
        let list: types::List<JobRequest> = self.get_json(url, None, &format!("the job requests of pool {pool_id}"))?;
        Ok(list.value)
    }

    /// Like [`AzureClient::job_requests`], only the open ones (`completedRequestCount=0`:
    /// queued or running), which is what a queue reader needs on a pool with a long history.
    pub fn open_job_requests(&self, pool_id: u64, top: u32) -> Result<Vec<JobRequest>, AzureError> {
        let top = top.to_string();
        let url = self.url(
            &format!("_apis/distributedtask/pools/{pool_id}/jobrequests"),
            &[("$top", &top), ("completedRequestCount", "0")],
        );
        let list: types::List<JobRequest> = self.get_json(url, None, &format!("the job requests of pool {pool_id}"))?;
        Ok(list.value)
    }

    /// The job requests of one agent, newest first (`GET .../jobrequests?agentId=`).
    pub fn agent_job_requests(&self, pool_id: u64, agent_id: u64, top: u32) -> Result<Vec<JobRequest>, AzureError> {
        let (top, agent) = (top.to_string(), agent_id.to_string());
        let url = self
            .url(&format!("_apis/distributedtask/pools/{pool_id}/jobrequests"), &[("agentId", &agent), ("$top", &top)]);
        let list: types::List<JobRequest> =
            self.get_json(url, None, &format!("the job requests of agent {agent_id} in pool {pool_id}"))?;
        Ok(list.value)
    }

    /// `GET {org}/{project}/_apis/build/builds/{id}`: a build's branch and reason.
    pub fn build(&self, project: &str, build_id: u64) -> Result<types::Build, AzureError> {
        let url = self.url(&format!("{project}/_apis/build/builds/{build_id}"), &[]);
        self.get_json(url, Some(API_VERSION), &format!("the lookup of build {build_id}"))
    }

    /// `POST .../pools/{id}/agents` with `agent` (a TaskAgent: name, version,
    /// systemCapabilities, authorization.publicKey...): a new agent record. Not retried
    /// (not idempotent: a retry after a lost answer would meet "already contains").
    pub fn add_agent(&self, pool_id: u64, agent: &serde_json::Value) -> Result<Agent, AzureError> {
        let url = self.url(&format!("_apis/distributedtask/pools/{pool_id}/agents"), &[]);
        let what = format!("the registration of an agent in pool {pool_id}");
        let (_, body) =
            self.call_with_body(Method::POST, url, Some(API_VERSION), &what, Some(agent)).map_err(|e| match e {
                AzureError::Forbidden { .. } => {
                    AzureError::Forbidden { what: format!("register agents in pool {pool_id}") }
                }
                e => e,
            })?;
        parse_json(&body, &what)
    }

    /// `PATCH .../pools/{id}/agents/{agentId}` `{"id", "enabled"}`: a disabled agent gets
    /// no new job (the server's own switch; used before stopping an idle agent).
    pub fn set_agent_enabled(&self, pool_id: u64, agent_id: u64, enabled: bool) -> Result<(), AzureError> {
        let url = self.url(&format!("_apis/distributedtask/pools/{pool_id}/agents/{agent_id}"), &[]);
        let what = format!("the update of agent {agent_id} of pool {pool_id}");
        let body = serde_json::json!({"id": agent_id, "enabled": enabled});
        with_retry(&self.inner.retry, || {
            self.call_with_body(Method::PATCH, url.clone(), Some(API_VERSION), &what, Some(&body)).map(drop)
        })
    }

    /// Streams `url` into `dest`, calling `progress` with the bytes so far; returns the
    /// byte count. The PAT is sent only when `url` has the organization's own origin.
    /// Not retried here (the caller owns `dest`: retry by starting over).
    pub fn download(&self, url: &str, dest: &mut dyn Write, progress: &mut dyn FnMut(u64)) -> Result<u64, AzureError> {
        let u = parse_download_url(url)?;
        let same_origin = u.scheme() == self.inner.org.scheme()
            && u.host_str() == self.inner.org.host_str()
            && u.port_or_known_default() == self.inner.org.port_or_known_default();
        let auth = if same_origin { Some(&self.inner.auth) } else { None };
        fetch(&self.inner.http, auth, u, self.inner.timeout, dest, progress)
    }

    // --- plumbing ---

    fn url(&self, path: &str, query: &[(&str, &str)]) -> Url {
        let mut u = self.inner.org.clone();
        {
            let mut segs = u.path_segments_mut().expect("http URL");
            segs.pop_if_empty();
            segs.extend(path.split('/'));
        }
        if !query.is_empty() {
            u.query_pairs_mut().extend_pairs(query);
        }
        u
    }

    fn get_json<T: DeserializeOwned>(&self, url: Url, api: Option<&str>, what: &str) -> Result<T, AzureError> {
        with_retry(&self.inner.retry, || {
            let (_, body) = self.call(Method::GET, url.clone(), api, what)?;
            parse_json(&body, what)
        })
    }

    /// One request; the status mapped to an error, the body read whole.
    fn call(
        &self,
        method: Method,
        url: Url,
        api: Option<&str>,
        what: &str,
    ) -> Result<(StatusCode, Vec<u8>), AzureError> {
        self.call_with_body(method, url, api, what, None)
    }

    /// [`AzureClient::call`] with an optional JSON body.
    fn call_with_body(
        &self,
        method: Method,
        url: Url,
        api: Option<&str>,
        what: &str,
        json: Option<&serde_json::Value>,
    ) -> Result<(StatusCode, Vec<u8>), AzureError> {
        let accept = match api {
            Some(v) => format!("application/json;api-version={v}"),
            None => "application/json".to_owned(),
        };
        let mut req = self
            .inner
            .http
            .request(method, url)
            .header(AUTHORIZATION, self.inner.auth.clone())
            .header("X-TFS-FedAuthRedirect", "Suppress")
            .header(ACCEPT, accept);
        if let Some(v) = json {
            req = req.header(CONTENT_TYPE, "application/json").body(v.to_string());
        }
        let resp = req.send().map_err(|e| net_error(e, &self.inner.org_str, what, self.inner.timeout))?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = read_body(resp).map_err(|e| net_error(e, &self.inner.org_str, what, self.inner.timeout))?;
        check_status(status, &headers, &body, &self.inner.org_str, what)?;
        if status != StatusCode::NO_CONTENT && !body.is_empty() && looks_like_html(&headers, &body) {
            return Err(AzureError::BadToken {
                how: format!("HTTP {} with an HTML sign-in page instead of JSON", status.as_u16()),
            });
        }
        Ok((status, body))
    }
}

/// The client for the organization (or a download host): proxies from the environment,
/// except for a loopback host (see [`ClientSettings`]).
fn build_http(org: &Url, timeout: Duration) -> Result<Client, AzureError> {
    ClientSettings::new(timeout).build(org).map_err(|e| AzureError::Unreachable {
        url: org.as_str().trim_end_matches('/').to_owned(),
        cause: match e {
            HttpError::Setup { cause } => one_line(&cause, 300),
            e => one_line(&e.to_string(), 300),
        },
    })
}

/// A host in 198.18.0.0/15, the range RFC 2544 sets aside for test networks (never
/// routed on the internet): where the tests' fake Azure DevOps lives when jobs, which
/// cannot reach the host's loopback, must reach it. Plain http is allowed there as on
/// loopback.
fn in_test_network(u: &Url) -> bool {
    let a = u.host_str().and_then(|h| h.parse::<std::net::Ipv4Addr>().ok());
    a.is_some_and(|a| a.octets()[0] == 198 && (a.octets()[1] & 0xfe) == 18)
}

fn parse_org_url(s: &str) -> Result<Url, AzureError> {
    let s = s.trim();
    let bad = |why: &str| AzureError::BadUrl { url: s.to_owned(), why: why.to_owned() };
    let mut u = Url::parse(s).map_err(|e| bad(&format!("not a URL ({e})")))?;
    if !u.username().is_empty() || u.password().is_some() {
        // Do not echo it: it may contain the PAT.
        return Err(AzureError::BadUrl {
            url: "<URL with credentials>".into(),
            why: "it contains credentials; put the PAT in the token file, not in the URL".into(),
        });
    }
    match u.scheme() {
        "https" => {}
        "http" if http::is_loopback(&u) || in_test_network(&u) => {}
        "http" => return Err(bad("plain http would send the PAT unencrypted; use https")),
        _ => return Err(bad("use an https:// URL")),
    }
    if u.host_str().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    if u.query().is_some() || u.fragment().is_some() {
        return Err(bad("remove the '?...' or '#...' part"));
    }
    let path = u.path().trim_end_matches('/').to_owned();
    u.set_path(if path.is_empty() { "/" } else { &path });
    Ok(u)
}

fn parse_download_url(s: &str) -> Result<Url, AzureError> {
    let u = Url::parse(s).map_err(|e| AzureError::Protocol {
        what: "the agent package download".into(),
        detail: format!("bad download URL '{}': {e}", redact_url_str(s)),
    })?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err(AzureError::Protocol {
            what: "the agent package download".into(),
            detail: format!("unsupported download URL scheme '{}'", u.scheme()),
        });
    }
    Ok(u)
}

fn redact_url_str(s: &str) -> String {
    match Url::parse(s) {
        Ok(u) => redact_url(&u),
        Err(_) => "<unparsable URL>".into(),
    }
}

/// Streams a GET of `url` into `dest`.
fn fetch(
    http: &Client,
    auth: Option<&HeaderValue>,
    url: Url,
    timeout: Duration,
    dest: &mut dyn Write,
    progress: &mut dyn FnMut(u64),
) -> Result<u64, AzureError> {
    let shown = redact_url(&url);
    let what = format!("the download of {shown}");
    let mut req = http.get(url);
    if let Some(a) = auth {
        req = req.header(AUTHORIZATION, a.clone()).header("X-TFS-FedAuthRedirect", "Suppress");
    }
    let mut resp = req.send().map_err(|e| net_error(e, &shown, &what, timeout))?;
    let status = resp.status();
    if !status.is_success() || status == StatusCode::NON_AUTHORITATIVE_INFORMATION {
        let headers = resp.headers().clone();
        let body = read_body(resp).unwrap_or_default();
        check_status(status, &headers, &body, &shown, &what)?;
        return Err(AzureError::Protocol { what, detail: format!("HTTP {}", status.as_u16()) });
    }
    let expected = resp.content_length();
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        let n = match resp.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                return Err(AzureError::Timeout { url: shown, what, after: timeout });
            }
            Err(e) => {
                return Err(AzureError::Unreachable {
                    url: shown,
                    cause: format!("the download broke off after {total} bytes: {}", error_chain(&e)),
                })
            }
        };
        dest.write_all(&buf[..n]).map_err(|e| AzureError::Write { url: shown.clone(), cause: e.to_string() })?;
        total += n as u64;
        progress(total);
    }
    dest.flush().map_err(|e| AzureError::Write { url: shown.clone(), cause: e.to_string() })?;
    if let Some(len) = expected {
        if len != total {
            return Err(AzureError::Unreachable {
                url: shown,
                cause: format!("the download ended after {total} of {len} bytes"),
            });
        }
    }
    Ok(total)
}

/// Downloads a URL without any credentials (an air-gapped mirror given with
/// `--agent-package URL`).
pub fn download_public(url: &str, dest: &mut dyn Write, progress: &mut dyn FnMut(u64)) -> Result<u64, AzureError> {
    let u = parse_download_url(url)?;
    let http = build_http(&u, DEFAULT_TIMEOUT)?;
    fetch(&http, None, u, DEFAULT_TIMEOUT, dest, progress)
}

fn read_body(resp: Response) -> Result<Vec<u8>, reqwest::Error> {
    resp.bytes().map(|b| b.to_vec())
}

/// A failed send or body read: no answer in time, or none at all (a TLS failure is
/// reported as unreachable too: the org URL or the proxy is what to check).
fn net_error(e: reqwest::Error, url: &str, what: &str, timeout: Duration) -> AzureError {
    match HttpError::from_reqwest(e, url, timeout) {
        HttpError::Timeout { url, after } => AzureError::Timeout { url, what: what.to_owned(), after },
        HttpError::Unreachable { url, cause } | HttpError::Tls { url, cause } => {
            AzureError::Unreachable { url, cause: one_line(&cause, 300) }
        }
        e => AzureError::Unreachable { url: url.to_owned(), cause: one_line(&e.to_string(), 300) },
    }
}

/// The server's own error message (`{"message": "..."}`), as ": message", or "".
fn server_message(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(|m| format!(": {}", one_line(m, 200))))
        .unwrap_or_default()
}

fn looks_like_html(headers: &HeaderMap, body: &[u8]) -> bool {
    let ct = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_ascii_lowercase();
    if ct.contains("text/html") {
        return true;
    }
    let start = body.iter().position(|b| !b.is_ascii_whitespace()).map(|i| &body[i..]).unwrap_or(&[]);
    start.first() == Some(&b'<')
}

/// Maps a status to its error; `url` names the server (for a proxy refusal).
fn check_status(status: StatusCode, headers: &HeaderMap, body: &[u8], url: &str, what: &str) -> Result<(), AzureError> {
    let code = status.as_u16();
    match code {
        203 => Err(AzureError::BadToken { how: "HTTP 203 with a sign-in page".into() }),
        200..=299 => Ok(()),
        401 => Err(AzureError::BadToken { how: "HTTP 401".into() }),
        403 => Err(AzureError::Forbidden { what: format!("access {what}") }),
        404 => Err(AzureError::NotFound { what: what.to_owned(), detail: server_message(body) }),
        407 => Err(AzureError::Unreachable {
            url: url.to_owned(),
            cause: "the proxy requires authentication (HTTP 407)".into(),
        }),
        429 | 500..=599 => {
            let retry_after = http::retry_after(headers).map(|d| d.min(Duration::from_secs(600)));
            Err(AzureError::Server { status: code, what: what.to_owned(), detail: server_message(body), retry_after })
        }
        _ => {
            Err(AzureError::Protocol { what: what.to_owned(), detail: format!("HTTP {code}{}", server_message(body)) })
        }
    }
}

fn parse_json<T: DeserializeOwned>(body: &[u8], what: &str) -> Result<T, AzureError> {
    match serde_json::from_slice::<T>(body) {
        Ok(v) => Ok(v),
        Err(e) => {
            if serde_json::from_slice::<serde_json::Value>(body).is_err() {
                // Not JSON at all: a sign-in or proxy page answered instead of the API.
                Err(AzureError::BadToken { how: "HTTP 200 with a non-JSON answer".into() })
            } else {
                Err(AzureError::Protocol { what: what.to_owned(), detail: format!("unexpected JSON ({e})") })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::RETRY_AFTER;

    #[test]
    fn org_urls() {
        let ok = |s: &str| AzureClient::new(s, "pat").unwrap().org_url().to_owned();
        assert_eq!(ok("https://dev.azure.com/org"), "https://dev.azure.com/org");
        assert_eq!(ok("https://dev.azure.com/org/"), "https://dev.azure.com/org");
        assert_eq!(ok(" https://org.visualstudio.com "), "https://org.visualstudio.com");
        assert_eq!(
            ok("https://tfs.example.com/tfs/DefaultCollection"),
            "https://tfs.example.com/tfs/DefaultCollection"
        );
        assert_eq!(ok("http://127.0.0.1:8080/org"), "http://127.0.0.1:8080/org");
        assert_eq!(ok("http://localhost:8080/org"), "http://localhost:8080/org");
        assert_eq!(ok("http://198.19.0.1:8080/org"), "http://198.19.0.1:8080/org", "the tests' fake internet");
        for bad in [
            "http://198.20.0.1/org",
            "http://10.0.0.1/org",
            "dev.azure.com/org",
            "http://dev.azure.com/org",
            "ftp://x/y",
            "https://dev.azure.com/org?x=1",
            "https://",
            "https://dev.azure.com/org#frag",
        ] {
            let e = AzureClient::new(bad, "pat").unwrap_err().to_string();
            assert!(e.starts_with("invalid Azure DevOps URL"), "{bad}: {e}");
            assert!(e.ends_with("fix --url / AZP_URL (e.g. https://dev.azure.com/ORG)"), "{bad}: {e}");
        }
        let e = AzureClient::new("https://user:SECRETPAT@dev.azure.com/org", "pat").unwrap_err().to_string();
        assert!(!e.contains("SECRETPAT"), "{e}");
        assert!(e.contains("put the PAT in the token file"), "{e}");
    }

    #[test]
    fn tokens() {
        assert!(AzureClient::new("https://dev.azure.com/o", "abc\n").is_ok());
        for bad in ["", "  \n", "a b", "a\u{7}b"] {
            let e = AzureClient::new("https://dev.azure.com/o", bad).unwrap_err().to_string();
            assert!(e.starts_with("the PAT is "), "{e}");
        }
    }

    #[test]
    fn debug_redacts() {
        let c = AzureClient::new("https://dev.azure.com/o", "s3cretpat").unwrap();
        let d = format!("{c:?}");
        assert!(d.contains("<redacted>") && !d.contains("s3cretpat"), "{d}");
        let b64 = base64::engine::general_purpose::STANDARD.encode(":s3cretpat");
        assert!(!d.contains(&b64));
    }

    #[test]
    fn urls_are_built_under_the_org() {
        let c = AzureClient::new("https://dev.azure.com/my%20org/", "p").unwrap();
        let u = c.url("_apis/distributedtask/pools", &[("poolName", "gpu pool&x")]);
        assert_eq!(u.as_str(), "https://dev.azure.com/my%20org/_apis/distributedtask/pools?poolName=gpu+pool%26x");
        let c = AzureClient::new("https://org.visualstudio.com", "p").unwrap();
        assert_eq!(c.url("_apis/connectionData", &[]).as_str(), "https://org.visualstudio.com/_apis/connectionData");
    }

    #[test]
    fn statuses() {
        let h = HeaderMap::new();
        let st =
            |c: u16| check_status(StatusCode::from_u16(c).unwrap(), &h, b"{\"message\":\"boom\\nline\"}", "u", "the x");
        assert!(matches!(st(200), Ok(())));
        assert!(matches!(st(203), Err(AzureError::BadToken { .. })));
        assert!(matches!(st(401), Err(AzureError::BadToken { .. })));
        assert!(matches!(st(403), Err(AzureError::Forbidden { .. })));
        assert!(matches!(st(404), Err(AzureError::NotFound { .. })));
        let e = st(503).unwrap_err();
        assert!(e.is_transient());
        assert_eq!(e.to_string().lines().count(), 1, "{e}");
        assert!(e.to_string().contains(": boom line"), "{e}");
        assert!(st(429).unwrap_err().is_transient());
        assert!(!st(400).unwrap_err().is_transient());
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, HeaderValue::from_static("7"));
        let e = check_status(StatusCode::TOO_MANY_REQUESTS, &h, b"", "u", "x").unwrap_err();
        assert_eq!(e.retry_after(), Some(Duration::from_secs(7)));
    }

    #[test]
    fn json_or_sign_in_page() {
        assert!(matches!(parse_json::<Pool>(b"<html>sign in</html>", "x"), Err(AzureError::BadToken { .. })));
        assert!(matches!(parse_json::<Pool>(b"{\"nope\":1}", "x"), Err(AzureError::Protocol { .. })));
        let p: Pool =
            parse_json(br#"{"id":3,"name":"gpu","isHosted":false,"poolType":"automation","size":2}"#, "x").unwrap();
        assert_eq!((p.id, p.name.as_str(), p.size), (3, "gpu", Some(2)));
    }

    #[test]
    fn platform() {
        assert!(["linux-x64", "linux-arm64", "linux-arm"].contains(&host_platform()));
        #[cfg(target_arch = "x86_64")]
        assert_eq!(host_platform(), "linux-x64");
    }

    #[test]
    fn url_redaction() {
        assert_eq!(redact_url_str("https://u:p@host/a/b.tar.gz?sig=SECRET#x"), "https://host/a/b.tar.gz");
    }
}
