//! A fake Azure DevOps organization for tests: a real HTTP server on 127.0.0.1, or in
//! the network lab's fake internet ([`FakeAzure::start_in`]) (one handler thread) that speaks the REST calls azp-sandbox and the agent use, with the
//! service's JSON shapes (camelCase, `{"count":n,"value":[...]}`), status codes and
//! auth (HTTP Basic, the PAT as password), plus failure modes for tests.
//!
//! It also serves a fake agent package ([`FakeAzure::agent_package_targz`]): POSIX sh
//! scripts (`config.sh`, `run.sh`, `env.sh`, `bin/Agent.Listener`) that run under
//! busybox alone (`sh`, `wget`, `base64`, `sed`, `awk`) and follow the real agent's
//! argv/env contract and exit codes. Their `run.sh --once` takes one job from a small
//! test-only protocol under `{org}/_fake/`:
//!
//! * `POST /_fake/sessions?agent=NAME` (body: the listener's capabilities, like the real
//!   session create) -> 200; the agent is online.
//! * `GET /_fake/jobs/next?agent=NAME` -> 200 `{"jobId":..,"script":"..","scriptBase64":".."}`
//!   or 204 when none is queued for it.
//! * `POST /_fake/jobs/{id}/result?agent=NAME&exitCode=N[&hook=N][&result=canceled]`,
//!   body = the job's output (stdout+stderr) -> 200; the agent is offline again. The
//!   listener reports `result=canceled` when a SIGINT or SIGTERM reached it during the
//!   job (as the real listener cancels its job on either).
//!
//! [`FakeAzure::use_bash_run_sh`] swaps in a `run.sh` that behaves as the real one does
//! (`../shared/azure-agent-entrypoints.md`): bash, no `trap`, no `exec`, the listener as
//! its child.
//!
//! These three authenticate with `Authorization: Bearer <clientId>`: the clientId the
//! agent got at registration stands in for its RSA key, so it is never returned by the
//! agent list, and a re-registration (`--replace`) issues a new one and kills the old.
//! Registration uses `X-HTTP-Method-Override: PUT|DELETE` on a POST (busybox wget can
//! only GET and POST); the service honours that header too.
//!
//! Nothing secret is kept in [`FakeAzure::requests_log`]: method, path with query, and
//! whether the credentials were right.
#![allow(dead_code)]

use super::digest::sha256_hex;
use base64::Engine as _;
use sha2::Digest as _;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};
use tiny_http::{Header, Request, Response, Server};

/// Version of the package the fake serves first.
pub const FAKE_AGENT_VERSION: &str = "4.252.0";
/// The organization's path segment: URLs are `http://127.0.0.1:PORT/fakeorg`.
pub const ORG: &str = "fakeorg";

/// How the credentials of a request looked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthSeen {
    /// No Authorization header.
    None,
    /// The right PAT (API) or the agent's current clientId (`/_fake/`).
    Ok,
    /// Something else.
    Bad,
}

#[derive(Debug, Clone)]
pub struct LoggedRequest {
    /// The effective method (after `X-HTTP-Method-Override`).
    pub method: String,
    /// Path and query, e.g. `/fakeorg/_apis/distributedtask/pools?poolName=gpu`.
    pub path: String,
    pub auth: AuthSeen,
    /// `X-TFS-FedAuthRedirect: Suppress` was sent.
    pub suppress_redirect: bool,
    pub accept: String,
    /// When the request arrived (for latency measurements).
    pub at: std::time::Instant,
    /// Where it came from (a job's traffic: the host's address once masqueraded).
    pub from: Option<std::net::IpAddr>,
}

#[derive(Debug, Clone)]
pub struct FakeAgent {
    pub id: u64,
    pub pool_id: u64,
    pub name: String,
    /// "online" while a session is open, else "offline".
    pub status: String,
    pub version: String,
    /// POSTs plus PUTs of this record.
    pub registrations: u32,
    /// Session creations (`run.sh` starts).
    pub sessions: u32,
    /// Session deletions (a listener that stops cleanly deletes its session).
    pub sessions_deleted: u32,
    /// The system capabilities last posted (registration or session).
    pub capabilities: BTreeMap<String, String>,
    /// Its current credential (see the module doc).
    pub client_id: String,
    /// A disabled agent is handed no job (`PATCH .../agents/{id}` `{"enabled": false}`).
    pub enabled: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobResult {
    pub job_id: u64,
    pub agent: String,
    /// The job script's exit code; None when the agent did not run it (test hook).
    pub exit_code: Option<i32>,
    /// `Some(n)` when run.sh exited `n` through the `#exit-code n` hook.
    pub hook_exit: Option<i32>,
    pub output: String,
    /// The job's result as the server recorded it: what the agent reported (`result=`,
    /// e.g. `canceled`), else `succeeded`/`failed` from the exit code, `abandoned` for
    /// the hook.
    pub result: String,
    /// The signal the agent said it got (`signal=`, e.g. `INT`) when it cancelled the job.
    pub signal: Option<String>,
    /// When the server got it.
    pub at: Instant,
}

/// What the package list says about the package's hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashMode {
    Sha256Hex,
    Md5Base64,
    Absent,
    /// A wrong value.
    Wrong(String),
}

/// The project every fake job request runs in (`scopeId`).
const FAKE_PROJECT_ID: &str = "0c0a0f0e-0000-4000-8000-0000000000aa";

struct Job {
    id: u64,
    script: String,
    demands: Vec<String>,
    queue_time: String,
    /// (agent id, agent name, time)
    assigned: Option<(u64, String, String)>,
    finished: Option<(String, String)>,
    /// The build this job belongs to (its id is the job's): `sourceBranch`, `reason`.
    source_branch: String,
    reason: String,
}

struct Package {
    version: String,
    bytes: Vec<u8>,
}

struct Override {
    path_contains: String,
    status: u16,
    content_type: String,
    body: Vec<u8>,
}

struct State {
    base: String,
    pat: String,
    pools: Vec<(u64, String)>,
    agents: Vec<FakeAgent>,
    next_agent_id: u64,
    next_job_id: u64,
    next_client: u64,
    jobs: Vec<Job>,
    results: Vec<JobResult>,
    log: Vec<LoggedRequest>,
    package_downloads: u32,
    package: Package,
    hash_mode: HashMode,
    download_url: Option<String>,
    fail_next: VecDeque<(u16, Option<u64>)>,
    delay: Duration,
    sign_in_page: bool,
    agents_read: bool,
    agents_manage: bool,
    overrides: Vec<Override>,
}

pub struct FakeAzure {
    state: Arc<Mutex<State>>,
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeAzure {
    /// Starts a fake org with pools "Default" (id 1) and "gpu" (id 10), on 127.0.0.1.
    pub fn start() -> FakeAzure {
        Self::start_at("127.0.0.1", None)
    }

    /// The same in the network lab's fake internet (as Azure DevOps is outside the host
    /// in production): jobs with a network of their own reach it there.
    pub fn start_in(lab: &super::netlab::NetLab) -> FakeAzure {
        Self::start_at(super::netlab::INTERNET_IP, Some(lab.internet_path()))
    }

    /// On `ip`, by a server thread in the network namespace at `netns` (ours if None).
    fn start_at(ip: &str, netns: Option<std::path::PathBuf>) -> FakeAzure {
        let (tx, rx) = std::sync::mpsc::channel();
        let bind = format!("{ip}:0");
        let stop = Arc::new(AtomicBool::new(false));
        let server_thread = |state: Arc<Mutex<State>>, stop: Arc<AtomicBool>| {
            move || {
                if let Some(ns) = netns {
                    super::netlab::enter(&ns);
                }
                let server = Server::http(bind.as_str()).expect("cannot start the fake Azure DevOps");
                tx.send(server.server_addr().to_ip().expect("ip listener").port()).unwrap();
                while !stop.load(Ordering::SeqCst) {
                    match server.recv_timeout(Duration::from_millis(50)) {
                        Ok(Some(req)) => handle(&state, req),
                        Ok(None) => {}
                        Err(_) => break,
                    }
                }
            }
        };
        let state = Arc::new(Mutex::new(State {
            base: String::new(),
            pat: format!("fakepat{:016x}", random_u64()),
            pools: vec![(1, "Default".into()), (10, "gpu".into())],
            agents: vec![],
            next_agent_id: 1,
            next_job_id: 1000,
            next_client: 1,
            jobs: vec![],
            results: vec![],
            log: vec![],
            package_downloads: 0,
            package: Package { version: FAKE_AGENT_VERSION.into(), bytes: Self::agent_package_targz() },
            hash_mode: HashMode::Sha256Hex,
            download_url: None,
            fail_next: VecDeque::new(),
            delay: Duration::ZERO,
            sign_in_page: false,
            agents_read: true,
            agents_manage: true,
            overrides: vec![],
        }));
        let thread = std::thread::Builder::new()
            .name("fake-azure".into())
            .spawn(server_thread(state.clone(), stop.clone()))
            .unwrap();
        let port = rx.recv().expect("the fake Azure DevOps did not start");
        state.lock().unwrap().base = format!("http://{ip}:{port}/{ORG}");
        FakeAzure { state, port, stop, thread: Some(thread) }
    }

    fn st(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The organization URL (`--url`): `http://127.0.0.1:PORT/fakeorg`.
    pub fn url(&self) -> String {
        self.st().base.clone()
    }
    pub fn port(&self) -> u16 {
        self.port
    }
    /// The PAT it accepts.
    pub fn pat(&self) -> String {
        self.st().pat.clone()
    }
    pub fn pool_id(&self, name: &str) -> Option<u64> {
        self.st().pools.iter().find(|(_, n)| n.eq_ignore_ascii_case(name)).map(|(id, _)| *id)
    }
    pub fn add_pool(&self, name: &str) -> u64 {
        let mut s = self.st();
        let id = s.pools.iter().map(|p| p.0).max().unwrap_or(0) + 1;
        s.pools.push((id, name.into()));
        id
    }
    /// Registers an agent record directly (as if an earlier host had), offline.
    pub fn add_agent(&self, pool_id: u64, name: &str) -> u64 {
        let mut s = self.st();
        let id = s.next_agent_id;
        s.next_agent_id += 1;
        let client_id = s.new_client_id();
        s.agents.push(FakeAgent {
            id,
            pool_id,
            name: name.into(),
            status: "offline".into(),
            version: FAKE_AGENT_VERSION.into(),
            registrations: 1,
            sessions: 0,
            sessions_deleted: 0,
            capabilities: BTreeMap::new(),
            client_id,
            enabled: true,
        });
        id
    }

    // --- what happened ---

    pub fn agents(&self) -> Vec<FakeAgent> {
        self.st().agents.clone()
    }
    pub fn agent(&self, name: &str) -> Option<FakeAgent> {
        self.st().agents.iter().find(|a| a.name == name).cloned()
    }
    pub fn results(&self) -> Vec<JobResult> {
        self.st().results.clone()
    }
    /// Waits until `n` results are in (or `timeout`), returns them all.
    pub fn wait_results(&self, n: usize, timeout: Duration) -> Vec<JobResult> {
        let t = Instant::now();
        loop {
            let r = self.results();
            if r.len() >= n || t.elapsed() > timeout {
                return r;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    pub fn requests_log(&self) -> Vec<LoggedRequest> {
        self.st().log.clone()
    }
    pub fn clear_log(&self) {
        self.st().log.clear();
    }
    /// Requests whose path contains `needle`.
    pub fn requests_to(&self, needle: &str) -> Vec<LoggedRequest> {
        self.st().log.iter().filter(|r| r.path.contains(needle)).cloned().collect()
    }
    /// Times the package file was served.
    pub fn package_downloads(&self) -> u32 {
        self.st().package_downloads
    }
    /// Jobs not yet handed to an agent.
    pub fn queued_jobs(&self) -> usize {
        self.st().jobs.iter().filter(|j| j.assigned.is_none()).count()
    }

    // --- test controls ---

    /// Queues a job: `script` runs with `sh -c` in the agent's work dir. A first line
    /// `#exit-code N` makes run.sh exit N without running it.
    pub fn enqueue_job(&self, script: &str) -> u64 {
        self.enqueue_job_with_demands(script, &[])
    }
    /// Queues a job only agents whose capabilities meet `demands` take
    /// (`"NAME"` exists, `"NAME -equals VALUE"`).
    pub fn enqueue_job_with_demands(&self, script: &str, demands: &[&str]) -> u64 {
        self.enqueue_build_job(script, demands, "refs/heads/main", "individualCI")
    }
    /// Queues a job of a build of `branch` (`refs/heads/main`, `refs/pull/7/merge`) queued
    /// for `reason` (`individualCI`, `manual`, `pullRequest`...), as the build REST
    /// resource (`GET {project}/_apis/build/builds/{id}`) reports them.
    pub fn enqueue_build_job(&self, script: &str, demands: &[&str], branch: &str, reason: &str) -> u64 {
        let mut s = self.st();
        let id = s.next_job_id;
        s.next_job_id += 1;
        s.jobs.push(Job {
            id,
            script: script.into(),
            demands: demands.iter().map(|d| d.to_string()).collect(),
            queue_time: iso(SystemTime::now()),
            assigned: None,
            finished: None,
            source_branch: branch.into(),
            reason: reason.into(),
        });
        id
    }
    /// Marks a queued job as served elsewhere (assigned and finished with `result`), as
    /// if an agent outside the test had run it.
    pub fn finish_job_elsewhere(&self, id: u64, result: &str) {
        self.finish_jobs_elsewhere(&[id], result);
    }
    /// [`FakeAzure::finish_job_elsewhere`] of each of `ids` at once: no reader of the queue
    /// sees some finished and the others not.
    pub fn finish_jobs_elsewhere(&self, ids: &[u64], result: &str) {
        let mut s = self.st();
        let t = iso(SystemTime::now());
        for j in s.jobs.iter_mut().filter(|j| ids.contains(&j.id)) {
            j.assigned = Some((0, "elsewhere".into(), t.clone()));
            j.finished = Some((t.clone(), result.into()));
        }
    }
    /// Ids of the jobs not yet handed to an agent.
    pub fn queued_job_ids(&self) -> Vec<u64> {
        self.st().jobs.iter().filter(|j| j.assigned.is_none()).map(|j| j.id).collect()
    }
    /// The next `n` API requests (`/_apis/`) answer `status` (e.g. 503) instead.
    pub fn fail_next(&self, n: usize, status: u16) {
        let mut s = self.st();
        s.fail_next.extend(std::iter::repeat_n((status, None), n));
    }
    /// Like [`fail_next`](Self::fail_next) with a `Retry-After: secs` header.
    pub fn fail_next_with_retry_after(&self, n: usize, status: u16, secs: u64) {
        let mut s = self.st();
        s.fail_next.extend(std::iter::repeat_n((status, Some(secs)), n));
    }
    /// API requests are answered after `d` (slow mode).
    pub fn set_delay(&self, d: Duration) {
        self.st().delay = d;
    }
    /// A bad PAT gets a 203 HTML sign-in page even with `X-TFS-FedAuthRedirect: Suppress`.
    pub fn set_sign_in_page(&self, on: bool) {
        self.st().sign_in_page = on;
    }
    /// Whether the PAT may read / manage the agents of every pool (403 otherwise).
    pub fn set_permissions(&self, read: bool, manage: bool) {
        let mut s = self.st();
        s.agents_read = read;
        s.agents_manage = manage;
    }
    pub fn set_hash_mode(&self, m: HashMode) {
        self.st().hash_mode = m;
    }
    /// Publishes a new agent package version (what an update looks like).
    pub fn set_package_version(&self, version: &str) {
        let bytes = Self::agent_package_targz_version(version);
        self.st().package = Package { version: version.into(), bytes };
    }
    /// Serves the package with a `run.sh` that behaves as the real one (see the module
    /// doc): needs bash in the rootfs.
    pub fn use_bash_run_sh(&self) {
        let version = self.package_version();
        let bytes = Self::package_targz(&version, BASH_RUN_SH);
        self.st().package = Package { version, bytes };
    }
    /// The package list's `downloadUrl` points here instead of at this server.
    pub fn set_download_url(&self, url: Option<String>) {
        self.st().download_url = url;
    }
    /// Requests whose path contains `path_contains` get this answer (until cleared).
    pub fn override_response(&self, path_contains: &str, status: u16, content_type: &str, body: &[u8]) {
        self.st().overrides.push(Override {
            path_contains: path_contains.into(),
            status,
            content_type: content_type.into(),
            body: body.into(),
        });
    }
    pub fn clear_overrides(&self) {
        self.st().overrides.clear();
    }
    /// The URL this server serves its package at.
    pub fn package_url(&self) -> String {
        let s = self.st();
        format!("{}/_fake/package/{}", s.base, package_filename(&s.package.version))
    }
    pub fn package_version(&self) -> String {
        self.st().package.version.clone()
    }
    pub fn package_sha256(&self) -> String {
        sha256_hex(&self.st().package.bytes)
    }

    // --- the fake agent package ---

    /// The fake agent package, version [`FAKE_AGENT_VERSION`].
    pub fn agent_package_targz() -> Vec<u8> {
        Self::agent_package_targz_version(FAKE_AGENT_VERSION)
    }

    /// The fake agent package of `version` (its `bin/Agent.Listener --version` says it).
    pub fn agent_package_targz_version(version: &str) -> Vec<u8> {
        Self::package_targz(version, RUN_SH)
    }

    fn package_targz(version: &str, run_sh: &str) -> Vec<u8> {
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        let mut tar = tar::Builder::new(gz);
        let dir = |tar: &mut tar::Builder<_>, path: &str| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o755);
            h.set_size(0);
            h.set_mtime(1_700_000_000);
            tar.append_data(&mut h, path, std::io::empty()).unwrap();
        };
        dir(&mut tar, "bin/");
        dir(&mut tar, "externals/");
        let listener = AGENT_LISTENER.replace("@VERSION@", version);
        for (path, body) in [
            ("config.sh", CONFIG_SH),
            ("run.sh", run_sh),
            ("env.sh", ENV_SH),
            ("bin/Agent.Listener", listener.as_str()),
        ] {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o755);
            h.set_size(body.len() as u64);
            h.set_mtime(1_700_000_000);
            tar.append_data(&mut h, path, body.as_bytes()).unwrap();
        }
        tar.into_inner().unwrap().finish().unwrap()
    }
}

impl Drop for FakeAzure {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub fn package_filename(version: &str) -> String {
    format!("vsts-agent-linux-x64-{version}.tar.gz")
}

// --- the server ---

struct Reply {
    status: u16,
    content_type: &'static str,
    body: Vec<u8>,
    headers: Vec<(&'static str, String)>,
}

impl Reply {
    fn json(status: u16, v: serde_json::Value) -> Reply {
        Reply {
            status,
            content_type: "application/json; charset=utf-8; api-version=7.1",
            body: v.to_string().into_bytes(),
            headers: vec![],
        }
    }
    fn list(items: Vec<serde_json::Value>) -> Reply {
        Reply::json(200, serde_json::json!({"count": items.len(), "value": items}))
    }
    fn error(status: u16, type_key: &str, message: &str) -> Reply {
        Reply::json(
            status,
            serde_json::json!({"$id": "1", "innerException": null, "message": message,
                "typeName": format!("Microsoft.TeamFoundation.DistributedTask.WebApi.{type_key}, Microsoft.TeamFoundation.DistributedTask.WebApi"),
                "typeKey": type_key, "errorCode": 0, "eventId": 3000}),
        )
    }
    fn empty(status: u16) -> Reply {
        Reply { status, content_type: "text/plain", body: vec![], headers: vec![] }
    }
}

struct Req {
    method: String,
    /// Below the org, without query: e.g. `_apis/distributedtask/pools`.
    path: String,
    query: BTreeMap<String, String>,
    body: Vec<u8>,
    auth: Option<String>,
}

impl Req {
    fn q(&self, k: &str) -> Option<&str> {
        self.query.iter().find(|(key, _)| key.eq_ignore_ascii_case(k)).map(|(_, v)| v.as_str())
    }
}

fn header<'a>(req: &'a Request, name: &'static str) -> Option<&'a str> {
    req.headers().iter().find(|h| h.field.equiv(name)).map(|h| h.value.as_str())
}

fn handle(state: &Mutex<State>, mut req: Request) {
    let mut body = vec![];
    let _ = req.as_reader().read_to_end(&mut body);
    let url = req.url().to_owned();
    let method = header(&req, "X-HTTP-Method-Override")
        .map(|m| m.to_ascii_uppercase())
        .unwrap_or_else(|| req.method().as_str().to_owned());
    let (path, query) = url.split_once('?').unwrap_or((&url, ""));
    let query: BTreeMap<String, String> = query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (pct_decode(k), pct_decode(v))
        })
        .collect();
    let r = Req {
        method: method.clone(),
        path: path.strip_prefix(&format!("/{ORG}/")).unwrap_or("").to_owned(),
        query,
        body,
        auth: header(&req, "Authorization").map(str::to_owned),
    };
    let suppress = header(&req, "X-TFS-FedAuthRedirect").is_some_and(|v| v.eq_ignore_ascii_case("Suppress"));
    let accept = header(&req, "Accept").unwrap_or("").to_owned();
    let from = req.remote_addr().map(|a| a.ip());

    let (reply, auth_seen, delay) = {
        let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
        let auth_seen = s.auth_seen(&r);
        let delay = if r.path.starts_with("_apis/") { s.delay } else { Duration::ZERO };
        s.log.push(LoggedRequest {
            method,
            path: url.clone(),
            auth: auth_seen,
            suppress_redirect: suppress,
            accept,
            at: std::time::Instant::now(),
            from,
        });
        let reply = s.route(&r, auth_seen, suppress);
        (reply, auth_seen, delay)
    };
    let _ = auth_seen;
    if !delay.is_zero() {
        std::thread::sleep(delay);
    }
    let mut resp = Response::from_data(reply.body).with_status_code(reply.status);
    if reply.status != 204 {
        resp.add_header(Header::from_bytes("Content-Type", reply.content_type).unwrap());
    }
    for (k, v) in reply.headers {
        resp.add_header(Header::from_bytes(k, v.as_bytes()).unwrap());
    }
    let _ = req.respond(resp);
}

impl State {
    /// Index of agent `aid` in pool `pool_id`, or the real service's 404.
    fn agent_index(&self, pool_id: u64, pool_name: &str, aid: u64) -> Result<usize, Reply> {
        self.agents.iter().position(|a| a.pool_id == pool_id && a.id == aid).ok_or_else(|| {
            Reply::error(
                404,
                "TaskAgentNotFoundException",
                &format!("No agent found in pool {pool_name} having identifier {aid}."),
            )
        })
    }

    fn new_client_id(&mut self) -> String {
        self.next_client += 1;
        format!("client-{:04}-{:016x}", self.next_client, random_u64())
    }

    fn auth_seen(&self, r: &Req) -> AuthSeen {
        let Some(a) = r.auth.as_deref() else {
            return AuthSeen::None;
        };
        if r.path.starts_with("_fake/jobs/") || r.path.starts_with("_fake/sessions") {
            let Some(token) = a.strip_prefix("Bearer ") else {
                return AuthSeen::Bad;
            };
            let name = r.q("agent").unwrap_or("");
            return if self.agents.iter().any(|ag| ag.name == name && ag.client_id == token.trim()) {
                AuthSeen::Ok
            } else {
                AuthSeen::Bad
            };
        }
        let Some(b64) = a.strip_prefix("Basic ") else {
            return AuthSeen::Bad;
        };
        let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(b64.trim()) else {
            return AuthSeen::Bad;
        };
        let raw = String::from_utf8_lossy(&raw);
        match raw.split_once(':') {
            Some((_, pw)) if pw == self.pat => AuthSeen::Ok,
            _ => AuthSeen::Bad,
        }
    }

    fn route(&mut self, r: &Req, auth: AuthSeen, suppress: bool) -> Reply {
        if let Some(o) = self.overrides.iter().find(|o| r.path.contains(&o.path_contains)) {
            return Reply {
                status: o.status,
                content_type: leak(&o.content_type),
                body: o.body.clone(),
                headers: vec![],
            };
        }
        let segs: Vec<&str> = r.path.trim_end_matches('/').split('/').collect();
        // Public: the package download (a CDN in reality) and the fake job protocol.
        if let ["_fake", "package", file] = segs.as_slice() {
            if *file == package_filename(&self.package.version) && r.method == "GET" {
                self.package_downloads += 1;
                return Reply {
                    status: 200,
                    content_type: "application/octet-stream",
                    body: self.package.bytes.clone(),
                    headers: vec![],
                };
            }
            return Reply::empty(404);
        }
        if segs.first() == Some(&"_fake") {
            if auth != AuthSeen::Ok {
                return Reply::json(401, serde_json::json!({"message": "bad or stale agent credentials"}));
            }
            return self.fake_protocol(r, &segs);
        }
        // `{project}/_apis/...`: project-scoped resources (the builds), by project id.
        let project = (segs.len() > 2 && segs[0] != "_apis" && segs[1] == "_apis").then(|| segs[0]);
        if segs.first() != Some(&"_apis") && project.is_none() {
            return Reply {
                status: 404,
                content_type: "text/html",
                body: b"<html><body>404 - Not Found</body></html>".to_vec(),
                headers: vec![],
            };
        }
        if let Some((status, retry_after)) = self.fail_next.pop_front() {
            let mut rep =
                Reply::error(status, "ServiceUnavailableException", "The service is temporarily unavailable (fake).");
            if let Some(s) = retry_after {
                rep.headers.push(("Retry-After", s.to_string()));
            }
            return rep;
        }
        if auth != AuthSeen::Ok {
            if self.sign_in_page || !suppress {
                return Reply {
                    status: 203,
                    content_type: "text/html; charset=utf-8",
                    body: SIGN_IN_PAGE.as_bytes().to_vec(),
                    headers: vec![],
                };
            }
            return Reply {
                status: 401,
                content_type: "text/html; charset=utf-8",
                body: b"<html><head><title>Access Denied</title></head><body>401 - Unauthorized: Access is denied due to invalid credentials.</body></html>".to_vec(),
                headers: vec![
                    ("WWW-Authenticate", "Bearer authorization_uri=https://login.microsoftonline.com/common".into()),
                    ("WWW-Authenticate", "Basic realm=\"https://dev.azure.com/\"".into()),
                    ("WWW-Authenticate", "TFS-Federated".into()),
                ],
            };
        }
        if let Some(project) = project {
            return self.project_route(r, project, &segs[2..]);
        }
        match (r.method.as_str(), &segs[1..]) {
            ("GET", ["connectionData"]) => Reply::json(
                200,
                serde_json::json!({
                    "authenticatedUser": {"id": "6f3a0b1c-0000-4000-8000-000000000001", "descriptor": "Microsoft.IdentityModel.Claims.ClaimsIdentity;fake\\admin@example.com",
                        "subjectDescriptor": "aad.ZmFrZQ", "providerDisplayName": "Fake Admin", "isActive": true, "properties": {}, "resourceVersion": 2, "metaTypeId": 0},
                    "authorizedUser": {"id": "6f3a0b1c-0000-4000-8000-000000000001", "providerDisplayName": "Fake Admin"},
                    "instanceId": "0c0a0f0e-0000-4000-8000-00000000fa4e",
                    "deploymentId": "0c0a0f0e-0000-4000-8000-00000000de91",
                    "deploymentType": "hosted",
                    "locationServiceData": {"serviceOwner": "00025394-6065-48ca-87d9-7f5672854ef7", "defaultAccessMappingMoniker": "PublicAccessMapping",
                        "lastChangeId": 1, "lastChangeId64": 1, "serviceDefinitions": []}
                }),
            ),
            ("GET", ["distributedtask", "pools"]) => {
                let want = r.q("poolName");
                let items = self
                    .pools
                    .iter()
                    .filter(|(_, n)| want.is_none_or(|w| n.eq_ignore_ascii_case(w)))
                    .map(|(id, name)| self.pool_json(*id, name))
                    .collect();
                Reply::list(items)
            }
            ("GET", ["distributedtask", "packages", "agent"]) => {
                let platform = r.q("platform").unwrap_or("linux-x64");
                if !["linux-x64", "linux-arm64"].contains(&platform) {
                    return Reply::list(vec![]);
                }
                Reply::list(vec![self.package_json(platform)])
            }
            (m, ["distributedtask", "pools", pool, rest @ ..]) => {
                let Some(pool_id) = pool.parse::<u64>().ok().filter(|id| self.pools.iter().any(|p| p.0 == *id)) else {
                    return Reply::error(
                        404,
                        "TaskAgentPoolNotFoundException",
                        &format!("No agent pool found with identifier {pool}."),
                    );
                };
                self.pool_route(m, pool_id, rest, r)
            }
            _ => Reply::error(
                404,
                "ApiResourceNotFoundException",
                &format!("API resource location not found for {} {}.", r.method, r.path),
            ),
        }
    }

    fn pool_json(&self, id: u64, name: &str) -> serde_json::Value {
        let size = self.agents.iter().filter(|a| a.pool_id == id).count();
        serde_json::json!({"createdOn": "2024-01-01T00:00:00.000Z", "autoProvision": false, "autoUpdate": true, "autoSize": true,
            "targetSize": null, "agentCloudId": null, "createdBy": {"displayName": "Fake Admin"}, "owner": {"displayName": "Fake Admin"},
            "id": id, "scope": "0c0a0f0e-0000-4000-8000-00000000fa4e", "name": name, "isHosted": false, "poolType": "automation",
            "size": size, "isLegacy": false, "options": "none"})
    }

    fn package_json(&self, platform: &str) -> serde_json::Value {
        let v = &self.package.version;
        let parts: Vec<u32> = v.split('.').map(|p| p.parse().unwrap_or(0)).collect();
        let hash = match &self.hash_mode {
            HashMode::Sha256Hex => Some(sha256_hex(&self.package.bytes)),
            HashMode::Md5Base64 => {
                Some(base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(&self.package.bytes)))
            }
            HashMode::Absent => None,
            HashMode::Wrong(h) => Some(h.clone()),
        };
        let file = package_filename(v);
        let url = self.download_url.clone().unwrap_or_else(|| format!("{}/_fake/package/{file}", self.base));
        serde_json::json!({"type": "agent", "platform": platform, "createdOn": "2025-01-01T00:00:00Z",
            "version": {"major": parts.first().copied().unwrap_or(0), "minor": parts.get(1).copied().unwrap_or(0), "patch": parts.get(2).copied().unwrap_or(0)},
            "downloadUrl": url, "hashValue": hash, "infoUrl": "https://go.microsoft.com/fwlink/?LinkId=798199", "filename": file})
    }

    fn agent_json(&self, a: &FakeAgent, caps: bool, assigned: bool, with_client_id: bool) -> serde_json::Value {
        let mut auth = serde_json::json!({"authorizationUrl": format!("{}/_fake/oauth2/token", self.base),
            "publicKey": {"exponent": "AQAB", "modulus": "ZmFrZQ=="}});
        if with_client_id {
            auth["clientId"] = serde_json::Value::String(a.client_id.clone());
        }
        let mut v = serde_json::json!({"id": a.id, "name": a.name, "version": a.version, "osDescription": "Linux (fake)",
            "enabled": a.enabled, "status": a.status, "provisioningState": "Provisioned", "accessPoint": "CodexAccessMapping",
            "createdOn": "2025-01-01T00:00:00.000Z", "statusChangedOn": iso(SystemTime::now()), "maxParallelism": 1,
            "authorization": auth});
        if caps {
            v["systemCapabilities"] = serde_json::to_value(&a.capabilities).unwrap();
            v["userCapabilities"] = serde_json::json!({});
        }
        if assigned {
            if let Some(j) =
                self.jobs.iter().find(|j| j.finished.is_none() && j.assigned.as_ref().is_some_and(|x| x.0 == a.id))
            {
                v["assignedRequest"] = self.job_json(j);
            }
        }
        v
    }

    fn job_json(&self, j: &Job) -> serde_json::Value {
        let pool_id = j
            .assigned
            .as_ref()
            .and_then(|(aid, ..)| self.agents.iter().find(|a| a.id == *aid))
            .map(|a| a.pool_id)
            .unwrap_or(10);
        let matched: Vec<serde_json::Value> = self
            .agents
            .iter()
            .filter(|a| demands_met(&j.demands, &a.capabilities))
            .map(|a| serde_json::json!({"id": a.id, "name": a.name, "version": a.version, "status": a.status, "enabled": true}))
            .collect();
        let mut v = serde_json::json!({"requestId": j.id, "queueTime": j.queue_time, "assignTime": null, "receiveTime": null,
            "finishTime": null, "result": null, "serviceOwner": "00025394-6065-48ca-87d9-7f5672854ef7",
            "hostId": "0c0a0f0e-0000-4000-8000-00000000fa4e", "scopeId": FAKE_PROJECT_ID,
            "planType": "Build", "planId": format!("00000000-0000-4000-8000-{:012x}", j.id), "jobId": format!("00000000-0000-4000-9000-{:012x}", j.id),
            "demands": j.demands, "matchedAgents": matched, "poolId": pool_id,
            "definition": {"id": 1, "name": "fake-pipeline"}, "owner": {"id": j.id, "name": format!("fake-pipeline #{}", j.id)},
            "orchestrationId": format!("{:x}.job.__default", j.id)});
        if let Some((aid, name, t)) = &j.assigned {
            v["assignTime"] = t.clone().into();
            v["receiveTime"] = t.clone().into();
            let status = self.agents.iter().find(|a| a.id == *aid).map(|a| a.status.clone()).unwrap_or_default();
            v["reservedAgent"] = serde_json::json!({"id": aid, "name": name, "version": FAKE_AGENT_VERSION, "status": status, "enabled": true});
        }
        if let Some((t, result)) = &j.finished {
            v["finishTime"] = t.clone().into();
            v["result"] = result.clone().into();
        }
        v
    }

    /// `GET {project}/_apis/build/builds/{id}`: the fields of a Build that say what ran
    /// (the job requests' `scopeId` is the project, their `owner.id` the build).
    fn project_route(&mut self, r: &Req, project: &str, rest: &[&str]) -> Reply {
        let not_found = |what: &str| Reply::error(404, "ProjectDoesNotExistWithNameException", what);
        if project != FAKE_PROJECT_ID && project != "fake-project" {
            return not_found(&format!("TF200016: The following project does not exist: {project}."));
        }
        match (r.method.as_str(), rest) {
            ("GET", ["build", "builds", id]) => {
                let Some(j) = id.parse::<u64>().ok().and_then(|id| self.jobs.iter().find(|j| j.id == id)) else {
                    return Reply::error(404, "BuildNotFoundException", &format!("Build {id} does not exist."));
                };
                let status = if j.finished.is_some() {
                    "completed"
                } else if j.assigned.is_some() {
                    "inProgress"
                } else {
                    "notStarted"
                };
                Reply::json(
                    200,
                    serde_json::json!({"id": j.id, "buildNumber": format!("2026.{}", j.id), "status": status,
                        "result": j.finished.as_ref().map(|f| f.1.clone()), "queueTime": j.queue_time,
                        "sourceBranch": j.source_branch, "sourceVersion": "0123456789abcdef0123456789abcdef01234567",
                        "reason": j.reason, "priority": "normal",
                        "definition": {"id": 1, "name": "fake-pipeline", "type": "build"},
                        "project": {"id": FAKE_PROJECT_ID, "name": "fake-project"},
                        "requestedFor": {"displayName": "Fake Admin"}, "repository": {"type": "TfsGit"}}),
                )
            }
            _ => Reply::error(
                404,
                "ApiResourceNotFoundException",
                &format!("API resource location not found for {} {}.", r.method, r.path),
            ),
        }
    }

    fn pool_route(&mut self, method: &str, pool_id: u64, rest: &[&str], r: &Req) -> Reply {
        let pool_name = self.pools.iter().find(|p| p.0 == pool_id).map(|p| p.1.clone()).unwrap_or_default();
        let denied = |what: &str| {
            Reply::error(
                403,
                "AccessDeniedException",
                &format!("Access denied. Fake Admin needs {what} permissions for pool {pool_name} to perform the action. For more information, contact the Azure DevOps Server administrator."),
            )
        };
        match (method, rest) {
            ("GET", ["agents"]) => {
                if !self.agents_read {
                    return denied("View");
                }
                let caps = r.q("includeCapabilities") == Some("true");
                let assigned = r.q("includeAssignedRequest") == Some("true");
                let name = r.q("agentName");
                let items = self
                    .agents
                    .iter()
                    .filter(|a| a.pool_id == pool_id && name.is_none_or(|n| a.name.eq_ignore_ascii_case(n)))
                    .map(|a| self.agent_json(a, caps, assigned, false))
                    .collect();
                Reply::list(items)
            }
            ("POST", ["agents"]) | ("PUT", ["agents", _]) => {
                if !self.agents_manage {
                    return denied("Manage");
                }
                let Ok(body) = serde_json::from_slice::<serde_json::Value>(&r.body) else {
                    return Reply::error(400, "VssPropertyValidationException", "The request body is not valid JSON.");
                };
                let Some(name) = body.get("name").and_then(|n| n.as_str()).filter(|n| !n.is_empty()).map(str::to_owned)
                else {
                    return Reply::error(
                        400,
                        "ArgumentNullException",
                        "Value cannot be null. Parameter name: agent.Name",
                    );
                };
                let caps: BTreeMap<String, String> = body
                    .get("systemCapabilities")
                    .and_then(|c| c.as_object())
                    .map(|o| {
                        o.iter()
                            .map(|(k, v)| (k.clone(), v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string())))
                            .collect()
                    })
                    .unwrap_or_default();
                let version = body.get("version").and_then(|v| v.as_str()).unwrap_or(FAKE_AGENT_VERSION).to_owned();
                let client_id = self.new_client_id();
                let idx = if method == "POST" {
                    if self.agents.iter().any(|a| a.pool_id == pool_id && a.name.eq_ignore_ascii_case(&name)) {
                        return Reply::error(
                            409,
                            "TaskAgentExistsException",
                            &format!("Pool {pool_name} already contains an agent with name {name}."),
                        );
                    }
                    let id = self.next_agent_id;
                    self.next_agent_id += 1;
                    self.agents.push(FakeAgent {
                        id,
                        pool_id,
                        name,
                        status: "offline".into(),
                        version,
                        registrations: 1,
                        sessions: 0,
                        sessions_deleted: 0,
                        capabilities: caps,
                        client_id,
                        enabled: body.get("enabled").and_then(|e| e.as_bool()).unwrap_or(true),
                    });
                    self.agents.len() - 1
                } else {
                    let aid: u64 = rest[1].parse().unwrap_or(0);
                    let i = match self.agent_index(pool_id, &pool_name, aid) {
                        Ok(i) => i,
                        Err(reply) => return reply,
                    };
                    let a = &mut self.agents[i];
                    a.name = name;
                    a.version = version;
                    a.registrations += 1;
                    a.capabilities = caps;
                    a.client_id = client_id;
                    a.status = "offline".into();
                    if let Some(e) = body.get("enabled").and_then(|e| e.as_bool()) {
                        a.enabled = e;
                    }
                    i
                };
                let a = self.agents[idx].clone();
                Reply::json(200, self.agent_json(&a, true, false, true))
            }
            ("PATCH", ["agents", aid]) => {
                if !self.agents_manage {
                    return denied("Manage");
                }
                let aid: u64 = aid.parse().unwrap_or(0);
                let Ok(body) = serde_json::from_slice::<serde_json::Value>(&r.body) else {
                    return Reply::error(400, "VssPropertyValidationException", "The request body is not valid JSON.");
                };
                let i = match self.agent_index(pool_id, &pool_name, aid) {
                    Ok(i) => i,
                    Err(reply) => return reply,
                };
                if let Some(e) = body.get("enabled").and_then(|e| e.as_bool()) {
                    self.agents[i].enabled = e;
                }
                let a = self.agents[i].clone();
                Reply::json(200, self.agent_json(&a, true, false, false))
            }
            ("DELETE", ["agents", aid]) => {
                if !self.agents_manage {
                    return denied("Manage");
                }
                let aid: u64 = aid.parse().unwrap_or(0);
                match self.agent_index(pool_id, &pool_name, aid) {
                    Ok(i) => {
                        self.agents.remove(i);
                        Reply::empty(204)
                    }
                    Err(reply) => reply,
                }
            }
            ("GET", ["jobrequests"]) => {
                let top: usize = r.q("$top").and_then(|t| t.parse().ok()).unwrap_or(usize::MAX);
                let only_open = r.q("completedRequestCount") == Some("0");
                let agent: Option<u64> = r.q("agentId").and_then(|a| a.parse().ok());
                let items = self
                    .jobs
                    .iter()
                    .rev()
                    .filter(|j| !only_open || j.finished.is_none())
                    .filter(|j| agent.is_none_or(|a| j.assigned.as_ref().is_some_and(|x| x.0 == a)))
                    .filter(|j| match &j.assigned {
                        Some((aid, ..)) => self.agents.iter().any(|a| a.id == *aid && a.pool_id == pool_id),
                        None => true,
                    })
                    .take(top)
                    .map(|j| self.job_json(j))
                    .collect();
                Reply::list(items)
            }
            _ => Reply::error(
                404,
                "ApiResourceNotFoundException",
                &format!("API resource location not found for {method} {}.", r.path),
            ),
        }
    }

    /// `_fake/...` (already authenticated as the agent named in `?agent=`).
    fn fake_protocol(&mut self, r: &Req, segs: &[&str]) -> Reply {
        let name = r.q("agent").unwrap_or("").to_owned();
        let Some(ai) = self.agents.iter().position(|a| a.name == name) else {
            return Reply::empty(401);
        };
        match (r.method.as_str(), &segs[1..]) {
            ("DELETE", ["sessions"]) => {
                self.agents[ai].sessions_deleted += 1;
                self.agents[ai].status = "offline".into();
                Reply::empty(204)
            }
            ("POST", ["sessions"]) => {
                if let Ok(serde_json::Value::Object(o)) = serde_json::from_slice::<serde_json::Value>(&r.body) {
                    self.agents[ai].capabilities = o
                        .iter()
                        .map(|(k, v)| (k.clone(), v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string())))
                        .collect();
                }
                self.agents[ai].sessions += 1;
                self.agents[ai].status = "online".into();
                Reply::json(
                    200,
                    serde_json::json!({"sessionId": format!("fake-session-{}", self.agents[ai].sessions), "agent": {"id": self.agents[ai].id, "name": name}}),
                )
            }
            ("GET", ["jobs", "next"]) => {
                self.agents[ai].status = "online".into();
                let agent = self.agents[ai].clone();
                if !agent.enabled {
                    return Reply::empty(204);
                }
                let Some(j) =
                    self.jobs.iter_mut().find(|j| j.assigned.is_none() && demands_met(&j.demands, &agent.capabilities))
                else {
                    return Reply::empty(204);
                };
                j.assigned = Some((agent.id, agent.name.clone(), iso(SystemTime::now())));
                let b64 = base64::engine::general_purpose::STANDARD.encode(j.script.as_bytes());
                Reply::json(
                    200,
                    serde_json::json!({"jobId": j.id, "requestId": j.id, "script": j.script, "scriptBase64": b64}),
                )
            }
            ("POST", ["jobs", id, "result"]) => {
                let id: u64 = id.parse().unwrap_or(0);
                let agent_id = self.agents[ai].id;
                let Some(j) =
                    self.jobs.iter_mut().find(|j| j.id == id && j.assigned.as_ref().is_some_and(|x| x.0 == agent_id))
                else {
                    return Reply::json(
                        404,
                        serde_json::json!({"message": format!("job {id} is not assigned to {name}")}),
                    );
                };
                let exit_code: Option<i32> = r.q("exitCode").and_then(|c| c.parse().ok());
                let hook_exit: Option<i32> = r.q("hook").and_then(|c| c.parse().ok());
                let reported = r.q("result").map(str::to_ascii_lowercase);
                let result = match (hook_exit, reported.as_deref(), exit_code) {
                    (Some(_), _, _) => "abandoned".to_string(),
                    (None, Some(r), _) => r.to_string(),
                    (None, None, Some(0)) => "succeeded".to_string(),
                    _ => "failed".to_string(),
                };
                j.finished = Some((iso(SystemTime::now()), result.clone()));
                self.results.push(JobResult {
                    job_id: id,
                    agent: name.clone(),
                    exit_code: if hook_exit.is_some() { None } else { exit_code },
                    hook_exit,
                    output: String::from_utf8_lossy(&r.body).into_owned(),
                    result,
                    signal: r.q("signal").map(str::to_owned),
                    at: Instant::now(),
                });
                self.agents[ai].status = "offline".into();
                Reply::json(200, serde_json::json!({}))
            }
            _ => Reply::empty(404),
        }
    }
}

/// `"NAME"`: the capability exists; `"NAME -equals VALUE"`: it has that value; other
/// operators are taken as met.
fn demands_met(demands: &[String], caps: &BTreeMap<String, String>) -> bool {
    demands.iter().all(|d| {
        let mut it = d.splitn(3, ' ');
        let name = it.next().unwrap_or("");
        match (it.next(), it.next()) {
            (None, _) => caps.contains_key(name),
            (Some("-equals"), Some(v)) => caps.get(name).is_some_and(|c| c == v),
            _ => true,
        }
    })
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_owned().into_boxed_str())
}

fn pct_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hexval = |j: usize| {
            b.get(j..j + 2).and_then(|h| std::str::from_utf8(h).ok()).and_then(|h| u8::from_str_radix(h, 16).ok())
        };
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if hexval(i + 1).is_some() => {
                out.push(hexval(i + 1).unwrap());
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_nanos());
    h.finish()
}

/// `2025-01-02T03:04:05.678Z`
pub fn iso(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil from days (Howard Hinnant).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

const SIGN_IN_PAGE: &str = "<!DOCTYPE html>\n<html><head><title>Azure DevOps Services | Sign In</title></head>\n<body><form method=\"post\" action=\"https://login.microsoftonline.com/\">Sign in to your account</form></body></html>\n";

// --- the fake agent's scripts (POSIX sh, busybox applets only) ---

const CONFIG_SH: &str = r#"#!/bin/sh
# Fake Azure Pipelines agent (test double): ./config.sh [remove] --unattended ...
user_id=$(id -u)
if [ "$user_id" -eq 0 ] && [ -z "$AGENT_ALLOW_RUNASROOT" ]; then
    echo "Must not run with sudo" >&2
    exit 1
fi
cd "$(dirname "$0")" || exit 1
if [ "$1" = "remove" ]; then
    exec sh ./bin/Agent.Listener "$@"
fi
sh ./env.sh
exec sh ./bin/Agent.Listener configure "$@"
"#;

const RUN_SH: &str = r#"#!/bin/sh
# Fake Azure Pipelines agent (test double): ./run.sh [--once]
user_id=$(id -u)
if [ "$user_id" -eq 0 ] && [ -z "$AGENT_ALLOW_RUNASROOT" ]; then
    echo "Must not run with sudo" >&2
    exit 1
fi
cd "$(dirname "$0")" || exit 1
exec sh ./bin/Agent.Listener run "$@"
"#;

/// run.sh as the real agent's behaves (its text is ours): bash, the listener as a child,
/// no trap, no exec; its exit code is the listener's.
const BASH_RUN_SH: &str = r#"#!/bin/bash
user_id=`id -u`
if [ $user_id -eq 0 -a -z "$AGENT_ALLOW_RUNASROOT" ]; then
    echo "Must not run interactively with sudo"
    exit 1
fi
DIR="$( cd -P "$( dirname "${BASH_SOURCE[0]}" )" && pwd )"
cd "$DIR"
"$DIR"/bin/Agent.Listener run "$@"
returnCode=$?
echo "run.sh: the listener exited with $returnCode"
exit $returnCode
"#;

const ENV_SH: &str = r#"#!/bin/sh
# Like the real env.sh: records a few well-known variables in .env and PATH in .path.
cd "$(dirname "$0")" || exit 1
[ -f .env ] || touch .env
for v in LANG JAVA_HOME ANT_HOME M2_HOME ANDROID_HOME GRADLE_HOME NVM_BIN NVM_PATH LD_LIBRARY_PATH PERL5LIB AGENT_TOOLSDIRECTORY; do
    eval "val=\${$v-}"
    if [ -n "$val" ] && ! grep -q "^$v=" .env; then
        echo "$v=$val" >> .env
    fi
done
echo "$PATH" > .path
"#;

const AGENT_LISTENER: &str = r##"#!/bin/sh
# Fake Agent.Listener: configure | remove | run [--once] | --version.
# Talks to the fake Azure DevOps of the azp-sandbox tests with busybox wget.
AGENT_VERSION=@VERSION@
cmd=$1
[ $# -gt 0 ] && shift
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 2

say() { echo "$(date -u '+%Y-%m-%d %H:%M:%SZ'): $*"; }
err() { echo "$*" >&2; }
# First value of a numeric / string JSON field on stdin (one-line JSON).
json_num() { sed -n "s/^[^{]*{.*\"$1\": *\([0-9][0-9]*\).*/\1/p" | head -n 1; }
json_str() { sed -n "s/.*\"$1\": *\"\([^\"]*\)\".*/\1/p" | head -n 1; }
urlenc() { printf '%s' "$1" | sed 's/%/%25/g; s/ /%20/g; s/&/%26/g; s/+/%2B/g; s/#/%23/g; s/?/%3F/g; s/=/%3D/g'; }

# api METHOD URL [BODYFILE]: the answer on stdout; non-zero on any HTTP error.
# (busybox wget can only GET and POST: PUT/DELETE go as POST + X-HTTP-Method-Override.)
api() {
    m=$1 u=$2 f=$3
    set -- -q -Y off -O - --header "$authh" --header "Accept: application/json;api-version=7.1" --header "X-TFS-FedAuthRedirect: Suppress"
    if [ "$m" != GET ]; then
        set -- "$@" --header "Content-Type: application/json" --post-file "$f"
        [ "$m" != POST ] && set -- "$@" --header "X-HTTP-Method-Override: $m"
    fi
    wget "$@" "$u"
}

# The environment as system capabilities (a JSON object), like the real agent:
# minus TERM, SHLVL, LS_COLORS, values of 1024+ chars, names in VSO_AGENT_IGNORE.
capabilities() {
    awk -v name="$1" -v version="$AGENT_VERSION" 'BEGIN {
        n = split(ENVIRON["VSO_AGENT_IGNORE"], ign, ",")
        for (i = 1; i <= n; i++) skip[ign[i]] = 1
        skip["TERM"] = 1; skip["SHLVL"] = 1; skip["LS_COLORS"] = 1; skip["_"] = 1; skip["PWD"] = 1; skip["OLDPWD"] = 1
        printf "{"
        for (k in ENVIRON) {
            if ((k in skip) || k ~ /^VSTS_AGENT_INPUT_/ || k !~ /^[A-Za-z_][A-Za-z0-9_.]*$/) continue
            v = ENVIRON[k]
            if (length(v) >= 1024) continue
            gsub(/\\/, "\\\\", v); gsub(/"/, "\\\"", v); gsub(/\n/, "\\n", v); gsub(/\r/, "\\r", v); gsub(/\t/, "\\t", v)
            printf "\"%s\":\"%s\",", k, v
        }
        printf "\"Agent.Name\":\"%s\",\"Agent.Version\":\"%s\",\"Agent.OS\":\"Linux\"}", name, version
    }'
}

read_settings() {
    base=$(sed -n 's/.*"serverUrl": *"\([^"]*\)".*/\1/p' .agent)
    name=$(sed -n 's/.*"agentName": *"\([^"]*\)".*/\1/p' .agent)
    agentid=$(sed -n 's/.*"agentId": *\([0-9][0-9]*\).*/\1/p' .agent)
    poolid=$(sed -n 's/.*"poolId": *\([0-9][0-9]*\).*/\1/p' .agent)
    work=$(sed -n 's/.*"workFolder": *"\([^"]*\)".*/\1/p' .agent)
    clientid=$(json_str clientId < .credentials)
}

parse_args() {
    unattended=$VSTS_AGENT_INPUT_UNATTENDED replace=$VSTS_AGENT_INPUT_REPLACE eula=$VSTS_AGENT_INPUT_ACCEPTTEEEULA
    url=$VSTS_AGENT_INPUT_URL auth=$VSTS_AGENT_INPUT_AUTH token=$VSTS_AGENT_INPUT_TOKEN
    pool=$VSTS_AGENT_INPUT_POOL agent=$VSTS_AGENT_INPUT_AGENT work=$VSTS_AGENT_INPUT_WORK
    while [ $# -gt 0 ]; do
        case "$1" in
            --unattended) unattended=true ;;
            --replace) replace=true ;;
            --acceptTeeEula|--acceptteeeula) eula=true ;;
            --url|--auth|--token|--pool|--agent|--work)
                if [ $# -lt 2 ]; then err "error: missing value for $1"; exit 1; fi
                case "$1" in
                    --url) url=$2 ;; --auth) auth=$2 ;; --token) token=$2 ;;
                    --pool) pool=$2 ;; --agent) agent=$2 ;; --work) work=$2 ;;
                esac
                shift ;;
            *) err "Unrecognized command-line input arguments: '$1'. For usage refer to: ./config.sh --help"; exit 1 ;;
        esac
        shift
    done
    # The agent drops its inputs from its own environment.
    for v in $(env | sed -n 's/^\(VSTS_AGENT_INPUT_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done
    auth=$(printf '%s' "${auth:-pat}" | tr 'A-Z' 'a-z')
    if [ "$auth" != pat ]; then err "error: the fake agent supports --auth pat only"; exit 1; fi
    if [ -z "$token" ]; then err "error: no PAT: give --token or VSTS_AGENT_INPUT_TOKEN"; exit 1; fi
    if [ "$unattended" != true ]; then err "error: the fake agent runs --unattended only"; exit 1; fi
    # The PAT is in wget's argv (base64) for the few calls of this phase only.
    authh="Authorization: Basic $(printf ':%s' "$token" | base64 | tr -d '\n')"
    token=
}

configure() {
    if [ -f .agent ]; then
        err "Cannot configure the agent because it is already configured. To reconfigure the agent, run 'config.cmd remove' or './config.sh remove' first."
        exit 1
    fi
    parse_args "$@"
    if [ -z "$url" ]; then err "error: no server URL: give --url"; exit 1; fi
    pool=${pool:-default} agent=${agent:-$(hostname)} work=${work:-_work}
    base=${url%/}
    echo "Connecting to server ..."
    pools=$(api GET "$base/_apis/distributedtask/pools?poolName=$(urlenc "$pool")") || { err "error: cannot connect to $base (or the PAT was rejected)"; exit 1; }
    poolid=$(printf '%s' "$pools" | json_num id)
    if [ -z "$poolid" ]; then err "error: agent pool not found: '$pool'"; exit 1; fi
    existing=$(api GET "$base/_apis/distributedtask/pools/$poolid/agents?agentName=$(urlenc "$agent")") || { err "error: cannot list the agents of pool $pool"; exit 1; }
    agentid=$(printf '%s' "$existing" | json_num id)
    body=$(mktemp) || exit 1
    modulus=$(head -c 48 /dev/urandom | base64 | tr -d '\n')
    printf '{"name":"%s","version":"%s","osDescription":"Linux (fake)","enabled":true,"maxParallelism":1,"provisioningState":"Provisioned","authorization":{"publicKey":{"exponent":"AQAB","modulus":"%s"}},"systemCapabilities":%s}' \
        "$agent" "$AGENT_VERSION" "$modulus" "$(capabilities "$agent")" > "$body"
    if [ -n "$agentid" ]; then
        if [ "$replace" != true ]; then rm -f "$body"; err "Pool $pool already contains an agent with name $agent."; exit 1; fi
        echo "Found an existing agent with the same name: replacing it"
        resp=$(api PUT "$base/_apis/distributedtask/pools/$poolid/agents/$agentid" "$body")
    else
        resp=$(api POST "$base/_apis/distributedtask/pools/$poolid/agents" "$body")
    fi
    rc=$?
    rm -f "$body"
    if [ $rc -ne 0 ]; then err "error: the server refused to register agent $agent in pool $pool"; exit 1; fi
    agentid=$(printf '%s' "$resp" | json_num id)
    clientid=$(printf '%s' "$resp" | json_str clientId)
    authurl=$(printf '%s' "$resp" | json_str authorizationUrl)
    if [ -z "$agentid" ] || [ -z "$clientid" ]; then err "error: the server's answer has no agent id or authorization"; exit 1; fi
    umask 077
    printf '{\n  "agentId": %s,\n  "agentName": "%s",\n  "poolId": %s,\n  "poolName": "%s",\n  "serverUrl": "%s",\n  "workFolder": "%s"\n}\n' \
        "$agentid" "$agent" "$poolid" "$pool" "$base" "$work" > .agent
    printf '{\n  "scheme": "OAuth",\n  "data": {\n    "clientId": "%s",\n    "authorizationUrl": "%s",\n    "oauthEndpointUrl": "%s"\n  }\n}\n' \
        "$clientid" "$authurl" "$authurl" > .credentials
    head -c 64 /dev/urandom | base64 | tr -d '\n' > .credentials_rsaparams
    umask 022
    chmod 644 .agent
    echo "Successfully added the agent"
    echo "Settings Saved."
}

remove() {
    if [ ! -f .agent ]; then err "error: the agent is not configured"; exit 1; fi
    parse_args "$@"
    read_settings
    api DELETE "$base/_apis/distributedtask/pools/$poolid/agents/$agentid" /dev/null > /dev/null || { err "error: cannot remove agent $name"; exit 1; }
    rm -f .agent .credentials .credentials_rsaparams
    echo "Removed .credentials"
    echo "Removed .agent"
}

# post_result ID QUERY FILE
post_result() {
    wget -q -Y off -O /dev/null --header "$bearer" --post-file "$3" "$base/_fake/jobs/$1/result?agent=$(urlenc "$name")&$2"
}

run_job() {
    job_id=$(printf '%s' "$1" | json_num jobId)
    script=$(printf '%s' "$1" | json_str scriptBase64 | base64 -d)
    first=$(printf '%s\n' "$script" | head -n 1)
    case "$first" in
        "#exit-code "*)
            code=${first#"#exit-code "}
            say "Agent exits with code $code before job $job_id (test hook)"
            post_result "$job_id" "hook=$code" /dev/null
            exit "$code" ;;
    esac
    say "Running job: Job $job_id"
    mkdir -p "$work" _diag
    out="$root/_diag/job-$job_id.out"
    # A SIGINT or SIGTERM during the job cancels it (the job's steps got it too: they are
    # in this process group); the trap runs once the job's shell has ended.
    canceled=
    trap 'canceled=SIGINT' INT
    trap 'canceled=SIGTERM' TERM
    (
        cd "$work" || exit 1
        export AGENT_NAME="$name" AGENT_ID="$agentid" AGENT_HOMEDIRECTORY="$root" AGENT_WORKFOLDER="$root/$work"
        export BUILD_BUILDID="$job_id" SYSTEM_JOBID="$job_id" TF_BUILD=True
        exec sh -c "$script"
    ) < /dev/null > "$out" 2>&1
    ec=$?
    trap 'say "Exiting..."; exit 0' TERM INT
    query="exitCode=$ec"
    if [ -n "$canceled" ]; then
        result=Canceled
        query="$query&result=canceled"
        echo "listener: received $canceled: job $job_id canceled" >> "$out"
    elif [ $ec -eq 0 ]; then result=Succeeded; else result=Failed; fi
    post_result "$job_id" "$query" "$out" || err "warning: could not report job $job_id"
    rm -f "$out"
    echo "$(date -u '+%Y-%m-%d %H:%M:%SZ') [INFO JobDispatcher] Job $job_id completed with result: $result (exit code $ec)" >> "$diag"
    say "Job Job $job_id completed with result: $result"
}

run() {
    once=false
    for a in "$@"; do [ "$a" = --once ] && once=true; done
    if [ ! -f .agent ] || [ ! -f .credentials ]; then
        err "An error occurred: Not configured. Run config.(sh/cmd) to configure the agent."
        exit 1
    fi
    read_settings
    if [ -f .env ]; then
        while IFS= read -r line; do case "$line" in *=*) export "$line" ;; esac; done < .env
    fi
    bearer="Authorization: Bearer $clientid"
    trap 'say "Exiting..."; exit 0' TERM INT
    mkdir -p _diag
    diag="$root/_diag/Agent_$(date -u +%Y%m%d-%H%M%S)-utc.log"
    caps=$(mktemp) || exit 1
    capabilities "$name" > "$caps"
    if ! wget -q -Y off -O /dev/null --header "$bearer" --post-file "$caps" "$base/_fake/sessions?agent=$(urlenc "$name")"; then
        rm -f "$caps"
        err "Failed to create session. The agent's credentials were rejected: configure it again."
        exit 1
    fi
    rm -f "$caps"
    say "Listening for Jobs"
    max=${FAKE_AGENT_MAX_WAIT:-300}
    ticks=0 failures=0
    while :; do
        if job=$(wget -q -Y off -O - --header "$bearer" "$base/_fake/jobs/next?agent=$(urlenc "$name")"); then
            failures=0
            if [ -n "$job" ]; then
                run_job "$job"
                ticks=0
                if $once || [ -n "$canceled" ]; then exit 0; fi
            fi
        else
            failures=$((failures + 1))
            if [ $failures -ge 5 ]; then err "error: lost the connection to $base"; exit 1; fi
        fi
        sleep 0.2
        ticks=$((ticks + 1))
        if [ $ticks -ge $((max * 5)) ]; then say "No job within ${max}s: exiting"; exit 0; fi
    done
}

case "$cmd" in
    configure) configure "$@" ;;
    remove) remove "$@" ;;
    run) run "$@" ;;
    --version) echo "$AGENT_VERSION" ;;
    *) err "usage: Agent.Listener configure|remove|run [--once]|--version"; exit 2 ;;
esac
"##;
