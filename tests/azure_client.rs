//! The REST client and the agent package cache against the fake Azure DevOps
//! (tests/common/fake_azure.rs), and the fake agent's scripts run on the host with
//! busybox alone. No root, no network beyond loopback.

mod common;

use azp_sandbox::agent::PackageCache;
use azp_sandbox::azure::{AzureClient, AzureError, RetryPolicy};
use base64::Engine as _;
use common::fake_azure::{package_filename, AuthSeen, FakeAzure, HashMode, FAKE_AGENT_VERSION};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const PAT_ADVICE: &str =
    "it is wrong or expired; create a new one with Agent Pools (read, manage) scope and update the token file";

fn client(f: &FakeAzure) -> AzureClient {
    AzureClient::new(&f.url(), &f.pat()).unwrap().with_retry_policy(RetryPolicy::fast(3))
}

fn tmpdir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(common::unique(&format!("azure-{name}")));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

// ---------------------------------------------------------------- the client

#[test]
fn connection_pool_and_headers() {
    let f = FakeAzure::start();
    let c = client(&f);
    let info = c.check_connection().unwrap();
    assert_eq!(info.user(), "Fake Admin");
    assert_eq!(info.deployment_type.as_deref(), Some("hosted"));
    let pool = c.find_pool("gpu").unwrap();
    assert_eq!((pool.id, pool.name.as_str(), pool.is_hosted), (10, "gpu", false));
    assert_eq!(c.find_pool("DEFAULT").unwrap().id, 1, "pool names are case-insensitive");

    let log = f.requests_log();
    assert_eq!(log.len(), 3, "{log:?}");
    for r in &log {
        assert_eq!(r.auth, AuthSeen::Ok, "{r:?}");
        assert!(r.suppress_redirect, "X-TFS-FedAuthRedirect: Suppress missing: {r:?}");
    }
    assert_eq!(log[0].path, "/fakeorg/_apis/connectionData");
    assert_eq!(log[0].accept, "application/json;api-version=7.1-preview");
    assert_eq!(log[1].path, "/fakeorg/_apis/distributedtask/pools?poolName=gpu");
    assert_eq!(log[1].accept, "application/json;api-version=7.1");
}

#[test]
fn bad_pat_is_401_and_not_retried() {
    let f = FakeAzure::start();
    let c = AzureClient::new(&f.url(), "not-the-pat").unwrap().with_retry_policy(RetryPolicy::fast(3));
    let e = c.check_connection().unwrap_err();
    assert!(matches!(e, AzureError::BadToken { .. }), "{e:?}");
    assert_eq!(e.to_string(), format!("the PAT was rejected (HTTP 401): {PAT_ADVICE}"));
    assert!(!e.is_transient());
    let log = f.requests_log();
    assert_eq!(log.len(), 1, "a rejected PAT must not be retried: {log:?}");
    assert_eq!(log[0].auth, AuthSeen::Bad);
}

#[test]
fn sign_in_page_is_a_bad_pat() {
    let f = FakeAzure::start();
    f.set_sign_in_page(true);
    let c = AzureClient::new(&f.url(), "expired").unwrap();
    let e = c.find_pool("gpu").unwrap_err();
    assert_eq!(e.to_string(), format!("the PAT was rejected (HTTP 203 with a sign-in page): {PAT_ADVICE}"));

    // A 200 with an HTML page, or with something that is not JSON at all.
    let f = FakeAzure::start();
    let c = client(&f);
    f.override_response("connectionData", 200, "text/html; charset=utf-8", b"<!DOCTYPE html><html>Sign in</html>");
    let e = c.check_connection().unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("the PAT was rejected (HTTP 200 with an HTML sign-in page instead of JSON): {PAT_ADVICE}")
    );
    f.clear_overrides();
    f.override_response("connectionData", 200, "text/plain", b"hello");
    let e = c.check_connection().unwrap_err();
    assert_eq!(e.to_string(), format!("the PAT was rejected (HTTP 200 with a non-JSON answer): {PAT_ADVICE}"));
    // JSON of the wrong shape is a protocol error, not a PAT problem.
    f.clear_overrides();
    f.override_response("distributedtask/pools", 200, "application/json", br#"{"count":1,"value":[{"name":"gpu"}]}"#);
    let e = c.find_pool("gpu").unwrap_err();
    assert!(matches!(e, AzureError::Protocol { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.starts_with("unexpected answer from Azure DevOps to the lookup of agent pool 'gpu': unexpected JSON (missing field `id`"), "{msg}");
    assert!(msg.ends_with("; is --url the organization URL (https://dev.azure.com/ORG)?"), "{msg}");
}

#[test]
fn pool_not_found() {
    let f = FakeAzure::start();
    let e = client(&f).find_pool("nope").unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "agent pool 'nope' not found in {}: create it in Organization settings > Agent pools, or fix --pool",
            f.url()
        )
    );
}

#[test]
fn unreachable_url() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    }; // closed again: connections are refused
    let url = format!("http://127.0.0.1:{port}/org");
    let c = AzureClient::new(&url, "pat").unwrap().with_retry_policy(RetryPolicy::fast(2));
    let e = c.check_connection().unwrap_err();
    assert!(matches!(e, AzureError::Unreachable { .. }), "{e:?}");
    assert!(e.is_transient());
    let msg = e.to_string();
    assert!(msg.starts_with(&format!("cannot reach {url}: ")), "{msg}");
    assert!(msg.ends_with("; check --url / AZP_URL and the proxy"), "{msg}");
    assert!(msg.to_lowercase().contains("refused"), "the cause should be said: {msg}");
    assert_eq!(msg.lines().count(), 1);
}

/// The manager's HTTP client takes the site's proxy from the environment (`HTTPS_PROXY`,
/// `NO_PROXY`, as curl does). Each case runs in a child of this test binary (the
/// environment is the process's) inside a new network namespace where only loopback is
/// up, with a one-shot "proxy" on 127.0.0.1:3128 that refuses the tunnel: no packet can
/// leave, even when the client wrongly tries to reach the `.invalid` host directly.
#[test]
fn https_proxy_and_no_proxy_from_the_environment() {
    const NAME: &str = "https_proxy_and_no_proxy_from_the_environment";
    const CASE: &str = "AZP_TEST_PROXY_CASE";
    const PROXY: &str = "127.0.0.1:3128";
    if let Ok(case) = std::env::var(CASE) {
        let proxy = std::net::TcpListener::bind(PROXY).unwrap();
        proxy.set_nonblocking(true).unwrap();
        let c =
            AzureClient::new("https://dev.azure.invalid/org", "pat").unwrap().with_retry_policy(RetryPolicy::none());
        let client = std::thread::spawn(move || c.check_connection());
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut request = None;
        while !client.is_finished() && Instant::now() < deadline {
            if let Ok((s, _)) = proxy.accept() {
                s.set_nonblocking(false).unwrap();
                let mut line = String::new();
                std::io::BufRead::read_line(&mut std::io::BufReader::new(&s), &mut line).unwrap();
                std::io::Write::write_all(&mut &s, b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n").unwrap();
                request = Some(line.trim_end().to_owned());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let e = client.join().unwrap().unwrap_err();
        assert!(matches!(e, AzureError::Unreachable { .. }), "{e:?}");
        match case.as_str() {
            "proxied" => assert_eq!(request.as_deref(), Some("CONNECT dev.azure.invalid:443 HTTP/1.1"), "{e}"),
            _ => assert_eq!(request, None, "NO_PROXY names the host, yet the proxy was asked: {e}"),
        }
        return;
    }
    let exe = std::env::current_exe().unwrap();
    for (case, no_proxy) in [("proxied", "localhost"), ("direct", "localhost,.azure.invalid")] {
        let out = Command::new("unshare")
            .args(["--user", "--map-root-user", "--net", "--", "sh", "-c", "ip link set lo up && exec \"$0\" \"$@\""])
            .arg(&exe)
            .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
            .env(CASE, case)
            .env("HTTPS_PROXY", format!("http://{PROXY}"))
            .env("NO_PROXY", no_proxy)
            .env_remove("https_proxy")
            .env_remove("no_proxy")
            .env_remove("ALL_PROXY")
            .env_remove("all_proxy")
            .output()
            .unwrap();
        let text = text(&out);
        if !out.status.success() && text.contains("unshare") && !text.contains("running 1 test") {
            return common::skip(format!("no network namespace for the proxy test: {}", text.trim()));
        }
        assert!(out.status.success(), "{case}: {text}");
        assert!(text.contains("1 passed"), "{case}: the child did not run the test: {text}");
    }
}

#[test]
fn no_permission_to_manage_agents() {
    let f = FakeAzure::start();
    let c = client(&f);
    c.check_manage_permission(10).unwrap();
    f.set_permissions(false, false);
    let e = c.check_manage_permission(10).unwrap_err();
    assert_eq!(
        e.to_string(),
        "no permission to manage the agents of pool 10 (HTTP 403): grant the PAT's user Administrator on the pool \
         (Organization settings > Agent pools > Security) and give the PAT the Agent Pools (read, manage) scope"
    );
    let id = f.add_agent(10, "x");
    let e = c.delete_agent(10, id).unwrap_err();
    assert!(e.to_string().starts_with("no permission to delete agents of pool 10 (HTTP 403)"), "{e}");
    assert_eq!(f.agents().len(), 1);
}

#[test]
fn server_errors_are_retried_then_succeed_or_give_up() {
    let f = FakeAzure::start();
    let c = client(&f); // 3 attempts
    f.fail_next(2, 503);
    assert_eq!(c.find_pool("gpu").unwrap().id, 10);
    assert_eq!(f.requests_to("pools?poolName=gpu").len(), 3, "two 503s, then the answer");

    f.clear_log();
    f.fail_next(5, 500);
    let e = c.find_pool("gpu").unwrap_err();
    assert!(e.is_transient());
    assert_eq!(
        e.to_string(),
        "Azure DevOps answered HTTP 500 to the lookup of agent pool 'gpu': The service is temporarily unavailable (fake). \
         (a service problem or rate limit: retried with backoff; see https://status.dev.azure.com if it lasts)"
    );
    assert_eq!(f.requests_log().len(), 3, "bounded attempts");
}

#[test]
fn retry_after_is_honoured() {
    let f = FakeAzure::start();
    let c = client(&f);
    f.fail_next_with_retry_after(1, 429, 1);
    let t = Instant::now();
    c.find_pool("gpu").unwrap();
    assert!(t.elapsed() >= Duration::from_millis(950), "waited only {:?}", t.elapsed());
    assert_eq!(f.requests_to("pools?").len(), 2);
}

#[test]
fn slow_server_times_out() {
    let f = FakeAzure::start();
    // Far apart (a 0.3 s timeout, a 5 s answer): a busy machine's delays stay between.
    f.set_delay(Duration::from_millis(5000));
    let c = client(&f).with_retry_policy(RetryPolicy::none()).with_timeout(Duration::from_millis(300)).unwrap();
    let t = Instant::now();
    let e = c.check_connection().unwrap_err();
    assert!(t.elapsed() < Duration::from_millis(4000), "{:?}", t.elapsed());
    assert!(matches!(e, AzureError::Timeout { .. }), "{e:?}");
    assert!(e.is_transient());
    assert_eq!(
        e.to_string(),
        format!("no answer from {} within 0.3s (the connection check (connectionData)): the server or the network is slow; check the proxy, or try later", f.url())
    );
}

#[test]
fn agents_list_and_delete() {
    let f = FakeAzure::start();
    let c = client(&f);
    let a0 = f.add_agent(10, "host-0");
    let a1 = f.add_agent(10, "host-1");
    f.add_agent(1, "elsewhere");
    let all = c.list_agents(10, None).unwrap();
    assert_eq!(all.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), ["host-0", "host-1"]);
    assert!(all.iter().all(|a| !a.is_online()));
    let one = c.list_agents(10, Some("host-1")).unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].id, a1);
    assert!(f.requests_to("agentName=host-1").iter().all(|r| r.path.contains("includeCapabilities=true")));

    c.delete_agent(10, a0).unwrap();
    assert_eq!(f.agents().iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), ["host-1", "elsewhere"]);
    c.delete_agent(10, a0).unwrap(); // already gone: fine
    assert!(f.requests_log().iter().any(|r| r.method == "DELETE"));

    let e = c.list_agents(99, None).unwrap_err();
    assert_eq!(
        e.to_string(),
        "agent pool 99 does not exist (HTTP 404: No agent pool found with identifier 99.): check --url / AZP_URL (https://dev.azure.com/ORG) and --pool"
    );
}

#[test]
fn job_requests_have_the_real_fields() {
    let f = FakeAzure::start();
    let c = client(&f);
    let j1 = f.enqueue_job("echo 1");
    let j2 = f.enqueue_job_with_demands("echo 2", &["cuda_version -equals 12.4"]);
    let reqs = c.job_requests(10, 50).unwrap();
    assert_eq!(reqs.iter().map(|r| r.request_id).collect::<Vec<_>>(), [j2, j1], "newest first");
    assert!(reqs.iter().all(|r| r.is_queued() && r.queue_time.is_some() && r.plan_id.is_some()));
    assert_eq!(reqs[0].demands, ["cuda_version -equals 12.4"]);
    assert_eq!(c.job_requests(10, 1).unwrap().len(), 1, "$top is sent");
}

/// Captures every log line of this test binary (the `log` records of reqwest too).
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);
impl std::io::Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn the_pat_never_shows() {
    let cap = Capture::default();
    let w = cap.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || w.clone())
        .try_init()
        .expect("only this test installs a global subscriber");

    let f = FakeAzure::start();
    let pat = f.pat();
    let b64 = base64::engine::general_purpose::STANDARD.encode(format!(":{pat}"));
    let c = client(&f);
    let mut seen = vec![format!("{c:?}")];
    f.fail_next(1, 503); // a retry: logged at warn
    c.check_connection().unwrap();
    let wrong = AzureClient::new(&f.url(), &format!("{pat}x")).unwrap();
    let e = wrong.find_pool("gpu").unwrap_err();
    seen.push(format!("{e} {e:?}"));
    f.set_permissions(false, false);
    let e = c.check_manage_permission(10).unwrap_err();
    seen.push(format!("{e} {e:?}"));
    let dir = tmpdir("redact");
    PackageCache::at(&dir).ensure_latest(&c, "linux-x64").unwrap();

    let logs = String::from_utf8_lossy(&cap.0.lock().unwrap()).into_owned();
    assert!(logs.contains("retrying in"), "the capture must see the retry warning: {logs}");
    assert!(logs.contains("agent package 4.252.0 ready"), "{logs}");
    seen.push(logs);
    for s in &seen {
        assert!(!s.contains(&pat) && !s.contains(&b64), "the PAT leaked into: {s}");
    }
    assert!(seen[0].contains("<redacted>"), "{}", seen[0]);
    assert!(f.requests_log().iter().all(|r| !format!("{r:?}").contains(&pat)));
}

// ---------------------------------------------------------------- the package cache

fn assert_agent_dir(dir: &Path, version: &str) {
    use std::os::unix::fs::PermissionsExt;
    for f in ["config.sh", "run.sh", "env.sh", "bin/Agent.Listener"] {
        let m = std::fs::metadata(dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(m.permissions().mode() & 0o111 != 0, "{f} is not executable");
    }
    let listener = std::fs::read_to_string(dir.join("bin/Agent.Listener")).unwrap();
    assert!(listener.contains(&format!("AGENT_VERSION={version}\n")), "wrong package content");
}

#[test]
fn package_is_downloaded_verified_and_unpacked_once() {
    let f = FakeAzure::start();
    let c = client(&f);
    let dir = tmpdir("pkg-once");
    let cache = PackageCache::at(&dir);
    let p = cache.ensure_latest(&c, "linux-x64").unwrap();
    assert_eq!(p.version, FAKE_AGENT_VERSION);
    assert_eq!(p.dir, dir.join(FAKE_AGENT_VERSION).join("azp/agent"));
    assert_eq!(p.layer, dir.join(FAKE_AGENT_VERSION));
    assert_agent_dir(&p.dir, FAKE_AGENT_VERSION);
    assert_eq!(f.package_downloads(), 1);
    let dl = f.requests_to("/_fake/package/");
    assert_eq!(dl[0].auth, AuthSeen::Ok, "same origin as the org: the PAT is sent");

    // Exit code 4 path: ask again; nothing changed: one GET, no download.
    f.clear_log();
    let again = cache.ensure_latest(&c, "linux-x64").unwrap();
    assert_eq!(again, p);
    assert_eq!(f.package_downloads(), 1);
    let log = f.requests_log();
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0].path, "/fakeorg/_apis/distributedtask/packages/agent?platform=linux-x64&top=1");
    assert_eq!(entries(&dir), [".lock", FAKE_AGENT_VERSION], "no temp files left");

    // A new version is published: fetched, the old one stays for running slots.
    f.set_package_version("4.253.1");
    let new = cache.ensure_latest(&c, "linux-x64").unwrap();
    assert_eq!(new.version, "4.253.1");
    assert_agent_dir(&new.dir, "4.253.1");
    assert_eq!(f.package_downloads(), 2);
    assert_eq!(cache.cached_versions(), [FAKE_AGENT_VERSION, "4.253.1"]);
}

#[test]
fn two_threads_download_once() {
    let f = FakeAzure::start();
    let c = client(&f);
    let dir = tmpdir("pkg-threads");
    let got: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let c = c.clone();
                let cache = PackageCache::at(&dir);
                s.spawn(move || cache.ensure_latest(&c, "linux-x64").unwrap())
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(got[0], got[1]);
    assert_eq!(f.package_downloads(), 1);
    assert_eq!(f.requests_to("packages/agent").len(), 2);
    assert_agent_dir(&got[0].dir, FAKE_AGENT_VERSION);
}

#[test]
fn hash_mismatch_keeps_nothing() {
    let f = FakeAzure::start();
    let c = client(&f);
    let dir = tmpdir("pkg-badhash");
    let wrong = "0".repeat(64);
    f.set_hash_mode(HashMode::Wrong(wrong.clone()));
    let e = PackageCache::at(&dir).ensure_latest(&c, "linux-x64").unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "agent package hash mismatch (expected {wrong}, got sha256 {}): download corrupted; nothing was kept",
            f.package_sha256()
        )
    );
    assert_eq!(entries(&dir), [".lock"]);
    assert!(PackageCache::at(&dir).cached_versions().is_empty());

    // MD5 base64 (the spec's form) is accepted too, and so is no hash at all.
    f.set_hash_mode(HashMode::Md5Base64);
    PackageCache::at(&dir).ensure_latest(&c, "linux-x64").unwrap();
    let dir2 = tmpdir("pkg-nohash");
    f.set_hash_mode(HashMode::Absent);
    PackageCache::at(&dir2).ensure_latest(&c, "linux-x64").unwrap();
}

#[test]
fn the_pat_is_not_sent_to_another_download_host() {
    let org = FakeAzure::start();
    let cdn = FakeAzure::start(); // serves the same bytes (the package is built deterministically)
    org.set_download_url(Some(cdn.package_url()));
    let dir = tmpdir("pkg-cdn");
    let p = PackageCache::at(&dir).ensure_latest(&client(&org), "linux-x64").unwrap();
    assert_agent_dir(&p.dir, FAKE_AGENT_VERSION);
    assert_eq!((org.package_downloads(), cdn.package_downloads()), (0, 1));
    let dl = cdn.requests_log();
    assert_eq!(dl.len(), 1);
    assert_eq!(dl[0].auth, AuthSeen::None, "the PAT went to another host: {dl:?}");
}

#[test]
fn package_from_a_file_or_url() {
    let src = tmpdir("pkg-src");
    let named = src.join(package_filename("4.260.3"));
    std::fs::write(&named, FakeAzure::agent_package_targz_version("4.260.3")).unwrap();
    let plain = src.join("agent.tar.gz");
    std::fs::write(&plain, FakeAzure::agent_package_targz()).unwrap();

    let dir = tmpdir("pkg-from");
    let cache = PackageCache::at(&dir);
    let p = cache.ensure_from(named.to_str().unwrap()).unwrap();
    assert_eq!(p.version, "4.260.3");
    assert_agent_dir(&p.dir, "4.260.3");
    let p2 = cache.ensure_from(plain.to_str().unwrap()).unwrap();
    assert!(p2.version.starts_with("sha256-") && p2.version.len() == 19, "{}", p2.version);
    assert_eq!(cache.ensure_from(plain.to_str().unwrap()).unwrap(), p2, "same content, same version");

    let e = cache.ensure_from("/nonexistent/agent.tar.gz").unwrap_err();
    assert!(
        format!("{e:#}").starts_with("cannot read agent package /nonexistent/agent.tar.gz: check --agent-package"),
        "{e:#}"
    );

    // A tar.gz that is not an agent: refused, nothing kept.
    let junk = src.join("junk-1.2.3.tar.gz");
    {
        let gz = flate2::write::GzEncoder::new(std::fs::File::create(&junk).unwrap(), flate2::Compression::fast());
        let mut t = tar::Builder::new(gz);
        let mut h = tar::Header::new_gnu();
        h.set_size(3);
        h.set_mode(0o644);
        t.append_data(&mut h, "README", &b"hi\n"[..]).unwrap();
        t.into_inner().unwrap().finish().unwrap();
    }
    let e = cache.ensure_from(junk.to_str().unwrap()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "agent package 1.2.3 has no config.sh and run.sh at its top: not an Azure Pipelines agent package"
    );
    assert!(!dir.join("1.2.3").exists());
    assert!(entries(&dir).iter().all(|n| !n.contains(".tmp-") && !n.contains(".download-")), "{:?}", entries(&dir));

    // From a URL (an internal mirror): no credentials sent, version from the name.
    let f = FakeAzure::start();
    let p3 = cache.ensure_from(&f.package_url()).unwrap();
    assert_eq!(p3.version, FAKE_AGENT_VERSION);
    assert_eq!(f.package_downloads(), 1);
    assert_eq!(f.requests_log()[0].auth, AuthSeen::None);
    cache.ensure_from(&f.package_url()).unwrap();
    assert_eq!(f.package_downloads(), 1, "cached by the version in its name");
    assert_eq!(cache.cached_versions().len(), 3);
}

// ---------------------------------------------------------------- the fake agent, on the host

struct FakeAgentHost {
    root: PathBuf,
    path: PathBuf,
    url: String,
}

impl FakeAgentHost {
    /// A dir of busybox applet links (the only PATH) and a fresh unpacked fake agent.
    fn new(f: &FakeAzure, name: &str) -> FakeAgentHost {
        let busybox = Path::new("/bin/busybox");
        assert!(busybox.exists(), "/bin/busybox is missing: install busybox-static (scripts/setup.sh)");
        let root = tmpdir(name);
        let path = root.join("bb");
        std::fs::create_dir(&path).unwrap();
        let list = Command::new(busybox).arg("--list").output().unwrap();
        for applet in String::from_utf8_lossy(&list.stdout).split_whitespace() {
            std::os::unix::fs::symlink(busybox, path.join(applet)).unwrap();
        }
        let h = FakeAgentHost { root, path, url: f.url() };
        h.fresh_agent_dir("agent");
        h
    }

    fn fresh_agent_dir(&self, sub: &str) -> PathBuf {
        let d = self.root.join(sub);
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        tar::Archive::new(flate2::read::GzDecoder::new(&FakeAzure::agent_package_targz()[..])).unpack(&d).unwrap();
        d
    }

    /// `busybox sh SCRIPT ARGS` in `dir` with only `env` (plus PATH, HOME and the
    /// run-as-root permission), killed after 30 s.
    fn sh(&self, dir: &str, script: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut c = Command::new("/bin/busybox");
        c.arg("sh").arg(script).args(args).current_dir(self.root.join(dir)).env_clear();
        c.env("PATH", &self.path).env("HOME", &self.root).env("AGENT_ALLOW_RUNASROOT", "1");
        for (k, v) in env {
            c.env(k, v);
        }
        c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        let t = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if t.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                panic!("{script} {args:?} did not finish in 30 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.wait_with_output().unwrap()
    }

    fn configure(&self, dir: &str, agent: &str, extra: &[&str], env: &[(&str, &str)]) -> Output {
        let mut args = vec![
            "--unattended",
            "--url",
            self.url.as_str(),
            "--auth",
            "pat",
            "--pool",
            "gpu",
            "--agent",
            agent,
            "--acceptTeeEula",
            "--work",
            "_work",
        ];
        args.extend_from_slice(extra);
        self.sh(dir, "config.sh", &args, env)
    }
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Every file under `dir`, with its content.
fn all_files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(all_files(&p));
        } else if let Ok(b) = std::fs::read(&p) {
            out.push((p, b));
        }
    }
    out
}

#[test]
fn fake_agent_configures_and_runs_one_job() {
    let f = FakeAzure::start();
    let h = FakeAgentHost::new(&f, "agent-smoke");
    let pat = f.pat();
    let env = [
        ("VSTS_AGENT_INPUT_TOKEN", pat.as_str()),
        ("AZP_TEST", "world"),
        ("GPU_MODEL", "Fake \"GPU\" \\ 80GB"),
        ("FAKE_AGENT_MAX_WAIT", "20"),
    ];

    let o = h.configure("agent", "smoke-0", &["--replace"], &env);
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("Settings Saved."), "{}", text(&o));
    let agent = f.agent("smoke-0").expect("agent record");
    assert_eq!((agent.pool_id, agent.registrations, agent.status.as_str()), (10, 1, "offline"));
    assert_eq!(agent.capabilities.get("AZP_TEST").map(String::as_str), Some("world"));
    assert_eq!(agent.capabilities.get("GPU_MODEL").map(String::as_str), Some("Fake \"GPU\" \\ 80GB"), "JSON escaping");
    assert_eq!(agent.capabilities.get("Agent.Name").map(String::as_str), Some("smoke-0"));
    assert!(!agent.capabilities.keys().any(|k| k.starts_with("VSTS_AGENT_INPUT_")), "{:?}", agent.capabilities);
    assert!(!agent.capabilities.values().any(|v| v.contains(&pat)));

    let dot_agent = std::fs::read_to_string(h.root.join("agent/.agent")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&dot_agent).expect(".agent is JSON");
    assert_eq!(v["agentId"], agent.id);
    assert_eq!(v["agentName"], "smoke-0");
    assert_eq!(v["poolId"], 10);
    assert_eq!(v["serverUrl"], f.url());
    assert_eq!(v["workFolder"], "_work");
    let creds: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(h.root.join("agent/.credentials")).unwrap()).unwrap();
    assert_eq!(creds["data"]["clientId"], agent.client_id.as_str());
    for (p, b) in all_files(&h.root.join("agent")) {
        assert!(!String::from_utf8_lossy(&b).contains(&pat), "the PAT is stored in {}", p.display());
    }

    // Configuring the same directory twice fails.
    let o = h.configure("agent", "smoke-0", &["--replace"], &env);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("already configured"), "{}", text(&o));

    // One job: its output comes back; run.sh exits 0.
    let job = f.enqueue_job("echo hello $AZP_TEST");
    let run_env = [("AZP_TEST", "world"), ("FAKE_AGENT_MAX_WAIT", "20"), ("CUDA_VERSION", "12.4")];
    let o = h.sh("agent", "run.sh", &["--once"], &run_env);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(&format!("Running job: Job {job}")) && out.contains("completed with result: Succeeded"),
        "{}",
        text(&o)
    );
    let r = f.results();
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].job_id, r[0].agent.as_str(), r[0].exit_code, r[0].hook_exit), (job, "smoke-0", Some(0), None));
    assert_eq!(r[0].output, "hello world\n");
    let agent = f.agent("smoke-0").unwrap();
    assert_eq!((agent.sessions, agent.status.as_str()), (1, "offline"));
    assert_eq!(
        agent.capabilities.get("CUDA_VERSION").map(String::as_str),
        Some("12.4"),
        "the session posts run.sh's environment"
    );

    // A failing job: still exit 0 (the result is not in run.sh's exit code).
    let job = f.enqueue_job("pwd; echo oops >&2; exit 3");
    let o = h.sh("agent", "run.sh", &["--once"], &run_env);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = f.results().pop().unwrap();
    assert_eq!((r.job_id, r.exit_code), (job, Some(3)));
    assert!(r.output.contains("/agent/_work\n") && r.output.contains("oops\n"), "{:?}", r.output);
    let diag: String = all_files(&h.root.join("agent/_diag"))
        .into_iter()
        .filter(|(p, _)| p.file_name().unwrap().to_string_lossy().starts_with("Agent_"))
        .map(|(_, b)| String::from_utf8_lossy(&b).into_owned())
        .collect();
    assert!(diag.contains(&format!("Job {job} completed with result: Failed (exit code 3)")), "{diag}");

    // The update hook: run.sh exits 4 without running the job.
    let job = f.enqueue_job("#exit-code 4\necho never");
    let o = h.sh("agent", "run.sh", &["--once"], &run_env);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    let r = f.results().pop().unwrap();
    assert_eq!((r.job_id, r.exit_code, r.hook_exit, r.output.as_str()), (job, None, Some(4), ""));
}

#[test]
fn fake_agent_follows_the_real_contract() {
    let f = FakeAzure::start();
    let h = FakeAgentHost::new(&f, "agent-contract");
    let pat = f.pat();
    let tok = [("VSTS_AGENT_INPUT_TOKEN", pat.as_str())];

    // run.sh before configuring: exit 1.
    let o = h.sh("agent", "run.sh", &["--once"], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("Not configured"), "{}", text(&o));
    // No token, a bad token, a missing value, an unknown pool: exit 1, nothing written.
    for (args, env, why) in [
        (vec![], vec![], "no PAT"),
        (vec![], vec![("VSTS_AGENT_INPUT_TOKEN", "wrong")], "bad PAT"),
        (vec!["--pool"], tok.to_vec(), "missing value"),
    ] {
        let o = h.configure("agent", "c-0", &args, &env);
        assert_eq!(o.status.code(), Some(1), "{why}: {}", text(&o));
        assert!(!h.root.join("agent/.agent").exists(), "{why}");
    }
    let o = h.sh(
        "agent",
        "config.sh",
        &["--unattended", "--url", h.url.as_str(), "--pool", "nope", "--agent", "c-0"],
        &tok,
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(f.agents().is_empty());

    // Root without AGENT_ALLOW_RUNASROOT is refused (only checkable as root).
    if !common::is_root() {
        common::skip_part("needs root: config.sh's refusal to run as root without AGENT_ALLOW_RUNASROOT");
    } else {
        let o = Command::new("/bin/busybox")
            .args(["sh", "config.sh", "--unattended"])
            .current_dir(h.root.join("agent"))
            .env_clear()
            .env("PATH", &h.path)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(String::from_utf8_lossy(&o.stderr).contains("Must not run with sudo"), "{}", text(&o));
    }

    // --token works like the env var.
    let o = h.configure("agent", "c-0", &["--token", pat.as_str()], &[]);
    assert!(o.status.success(), "{}", text(&o));
    let first = f.agent("c-0").unwrap();
    let old_creds = std::fs::read(h.root.join("agent/.credentials")).unwrap();

    // Same name in a fresh dir without --replace: refused.
    h.fresh_agent_dir("agent2");
    let o = h.configure("agent2", "c-0", &[], &tok);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("Pool gpu already contains an agent with name c-0."),
        "{}",
        text(&o)
    );
    // With --replace: the same record, new credentials; the old ones are dead.
    let o = h.configure("agent2", "c-0", &["--replace"], &tok);
    assert!(o.status.success(), "{}", text(&o));
    let second = f.agent("c-0").unwrap();
    assert_eq!((second.id, second.registrations), (first.id, 2));
    assert_ne!(second.client_id, first.client_id);
    assert_eq!(f.agents().len(), 1);
    std::fs::write(h.root.join("agent2/.credentials"), &old_creds).unwrap();
    f.enqueue_job("echo stolen");
    let o = h.sh("agent2", "run.sh", &["--once"], &[("FAKE_AGENT_MAX_WAIT", "5")]);
    assert_eq!(o.status.code(), Some(1), "a replaced agent's old key must not work: {}", text(&o));
    assert_eq!(f.queued_jobs(), 1, "the job was not handed out");

    // `config.sh remove` deletes the record and the files.
    let o = h.sh("agent", "config.sh", &["remove", "--unattended", "--auth", "pat"], &tok);
    assert!(o.status.success(), "{}", text(&o));
    assert!(f.agents().is_empty());
    assert!(!h.root.join("agent/.agent").exists() && !h.root.join("agent/.credentials").exists());
}
