// ---------------------------------------------------------------------------------------
// 29. A proxy on the host's loopback (issue 23): many sites reach the internet only
// through a proxy on the node (`http://127.0.0.1:3128`). A job's proxy variables that
// name the host's loopback make that one port reachable (root: at the job's gateway,
// DNAT'd by the host's table; rootless: at the job's own loopback, forwarded by pasta),
// and nothing else of the host's loopback. In the network lab: a small HTTP proxy (CONNECT
// and absolute-form GET) of the test's on the fake host's 127.0.0.1, which alone knows
// the name `via-proxy.test` (the fake internet's server): a job that reads that name has
// gone through the proxy.
// ---------------------------------------------------------------------------------------

use super::*;
use common::netlab::{self, NetLab, HOST_BODY, INTERNET_BODY, INTERNET_IP};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

const PROXY_PORT: u16 = 3128;
/// Known to the proxy only (the lab's DNS does not have it).
const PROXIED_NAME: &str = "via-proxy.test";

/// The test's proxy in the fake host: what it was asked (`METHOD TARGET`), its stop flag.
struct Proxy {
    asked: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Proxy {
    fn start(lab: &NetLab) -> Proxy {
        let (asked, stop) = (Arc::new(Mutex::new(vec![])), Arc::new(AtomicBool::new(false)));
        let (tx, rx) = std::sync::mpsc::channel();
        let ns = lab.host_path();
        let (a, s) = (asked.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            netlab::enter(&ns);
            let l = TcpListener::bind(("127.0.0.1", PROXY_PORT)).unwrap();
            l.set_nonblocking(true).unwrap();
            tx.send(()).unwrap();
            while !s.load(Ordering::SeqCst) {
                match l.accept() {
                    // Threads made here are in the fake host's namespace too.
                    Ok((c, _)) => {
                        let a = a.clone();
                        std::thread::spawn(move || serve(c, &a));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        rx.recv_timeout(Duration::from_secs(5)).expect("the proxy listens");
        Proxy { asked, stop, thread: Some(thread) }
    }

    fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }
}

/// Where the proxy sends `host:port`: its own name for the fake internet's server, or an
/// address of the fake internet (198.18.0.0/15). Nothing else (a real proxy must refuse
/// the host's loopback too: that is its configuration, not the sandbox's).
fn upstream(host: &str, port: u16) -> Option<(String, u16)> {
    if host == PROXIED_NAME {
        return Some((INTERNET_IP.to_string(), port));
    }
    let a: std::net::Ipv4Addr = host.parse().ok()?;
    (a.octets()[0] == 198 && (a.octets()[1] & 0xfe) == 18).then(|| (host.to_string(), port))
}

fn serve(mut c: TcpStream, asked: &Mutex<Vec<String>>) {
    c.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let mut head = Vec::new();
    let mut b = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16384 {
        match c.read(&mut b) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&b[..n]),
        }
    }
    let end = head.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4).unwrap_or(head.len());
    let (text, rest) = (String::from_utf8_lossy(&head[..end]).into_owned(), head[end..].to_vec());
    let mut lines = text.split("\r\n");
    let first: Vec<&str> = lines.next().unwrap_or("").split(' ').collect();
    let (method, target) = (first.first().copied().unwrap_or(""), first.get(1).copied().unwrap_or(""));
    asked.lock().unwrap().push(format!("{method} {target}"));
    let (authority, path) = match method {
        "CONNECT" => (target, String::new()),
        _ => match target.strip_prefix("http://") {
            Some(t) => {
                let (a, p) = t.split_once('/').unwrap_or((t, ""));
                (a, format!("/{p}"))
            }
            None => return reply(c, "400 Bad Request"),
        },
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (h, p.parse().unwrap_or(0)),
        None => (authority, 80),
    };
    let Some(to) = upstream(host, port) else { return reply(c, "403 Forbidden") };
    let Ok(mut up) = TcpStream::connect_timeout(&format!("{}:{}", to.0, to.1).parse().unwrap(), Duration::from_secs(5))
    else {
        return reply(c, "502 Bad Gateway");
    };
    if method == "CONNECT" {
        let _ = c.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
    } else {
        // Origin-form, the client's headers but the proxy's own, one request per connection.
        let mut req = format!("{method} {path} HTTP/1.0\r\n");
        for l in lines.filter(|l| !l.is_empty()) {
            let name = l.split(':').next().unwrap_or("").to_ascii_lowercase();
            if !name.starts_with("proxy-") && name != "connection" {
                req.push_str(l);
                req.push_str("\r\n");
            }
        }
        req.push_str("Connection: close\r\n\r\n");
        let _ = up.write_all(req.as_bytes());
    }
    let _ = up.write_all(&rest);
    let (mut c2, mut up2) = (c.try_clone().unwrap(), up.try_clone().unwrap());
    let t = std::thread::spawn(move || {
        let _ = std::io::copy(&mut c2, &mut up2);
        let _ = up2.shutdown(Shutdown::Write);
    });
    let _ = std::io::copy(&mut up, &mut c);
    let _ = c.shutdown(Shutdown::Both);
    let _ = t.join();
}

fn reply(mut c: TcpStream, status: &str) {
    let _ = c.write_all(format!("HTTP/1.0 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes());
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t29_job_reaches_the_internet_through_a_proxy_on_the_hosts_loopback_and_nothing_else_there() {
    require_root!();
    let lab = or_skip!(NetLab::new());
    let proxy = Proxy::start(&lab);
    let h = home("net-proxy");
    let by_name = format!("http://{PROXIED_NAME}/");
    // Where the job finds the proxy: its gateway (root), its own loopback (rootless).
    let at = if rootless() { "127.0.0.1" } else { GATEWAY };
    let host_loopback = format!("http://{at}:{}/", netlab::HOST_LOOPBACK_PORT);
    // The control, first: without proxy variables the proxy's port is out of reach (root:
    // refused by the host's table; rootless: nothing listens on the job's own loopback),
    // and the name only the proxy knows does not resolve. (Root mode: once a job asked
    // for it, the port stays open at the gateway for the table's life: docs/network.md.)
    let tok = toks(&[&format!("connect-tcp:{at}:{PROXY_PORT}")]);
    let script = format!("{}; {}", probe(&tok), get(&by_name));
    let out = lab_exec_ok(&lab, &h, &[], &script);
    let want = if rootless() { "ECONNREFUSED" } else { "EHOSTUNREACH" };
    assert_eq!(probe_results(&out)[&tok[0]], want, "the proxy's port without proxy variables: {out}");
    assert!(out.contains("GET-FAILED") && !out.contains(INTERNET_BODY), "{out}");
    assert_eq!(proxy.asked(), Vec::<String>::new(), "nothing reached the proxy");
    for (who, opts) in USERS {
        // With them: a GET through it, a CONNECT tunnel through it (nc), and the rest of
        // the host's loopback still out of reach (its HTTP server on 8080: at the job's
        // gateway or loopback, and through the proxy variables' address).
        let before = proxy.asked().len();
        let env = [
            "--env".to_string(),
            "http_proxy=http://127.0.0.1:3128".to_string(),
            "--env".to_string(),
            "HTTPS_PROXY=http://localhost:3128/".to_string(),
        ];
        let opts: Vec<&str> = env.iter().map(String::as_str).chain(opts.iter().copied()).collect();
        let tok = toks(&[
            &format!("connect-tcp:{at}:{}", netlab::HOST_LOOPBACK_PORT),
            &format!("connect-tcp:{at}:{}", netlab::HOST_ANY_PORT),
            &format!("connect-tcp:{at}:{PROXY_PORT}"),
        ]);
        let script = format!(
            "echo http_proxy=$http_proxy; echo HTTPS_PROXY=$HTTPS_PROXY; \
             echo get=$({}); \
             p=${{http_proxy#http://}}; \
             echo tunnel=$( (printf 'CONNECT {PROXIED_NAME}:80 HTTP/1.1\\r\\nHost: {PROXIED_NAME}:80\\r\\n\\r\\n'; \
               sleep 0.5; printf 'GET / HTTP/1.0\\r\\n\\r\\n'; sleep 2) | timeout 5 nc ${{p%:*}} ${{p##*:}} | tr -d '\\r' | \
               grep -e ' 200 Connection established' -e '{INTERNET_BODY}' | tr '\\n' ' '); \
             echo loopback=$({}); {}",
            get(&by_name),
            get(&host_loopback),
            probe(&tok)
        );
        let out = lab_exec_ok(&lab, &h, &opts, &script);
        let want_env = if rootless() {
            ("http://127.0.0.1:3128".to_string(), "http://localhost:3128/".to_string())
        } else {
            (format!("http://{GATEWAY}:3128"), format!("http://{GATEWAY}:3128/"))
        };
        assert!(out.contains(&format!("http_proxy={}\n", want_env.0)), "{who}: {out}");
        assert!(out.contains(&format!("HTTPS_PROXY={}\n", want_env.1)), "{who}: {out}");
        assert!(out.contains(&format!("get={INTERNET_BODY}\n")), "{who}: GET through the proxy: {out}");
        assert!(
            out.contains(&format!("tunnel=HTTP/1.1 200 Connection established {INTERNET_BODY}\n")),
            "{who}: CONNECT through the proxy: {out}"
        );
        assert!(out.contains("loopback=GET-FAILED\n") && !out.contains(HOST_BODY), "{who}: {out}");
        let r = probe_results(&out);
        assert_eq!(r[&tok[2]], "OK", "{who}: the proxy's port: {out}");
        for t in &tok[..2] {
            let blocked = ["EHOSTUNREACH", "ECONNREFUSED", "EACCES", "ETIMEDOUT"];
            assert!(blocked.contains(&r[t].as_str()), "{who}: {t}: {out}");
        }
        let asked = proxy.asked()[before..].to_vec();
        assert!(asked.contains(&format!("GET {by_name}")), "{who}: {asked:?}");
        assert!(asked.contains(&format!("CONNECT {PROXIED_NAME}:80")), "{who}: {asked:?}");
    }
    drop(proxy);
    h.assert_no_residue(&[]);
}

// ---------------------------------------------------------------------------------------
// 30. IPv6 on a v4-only job (issue 23): jobs get IPv4 only. A name with an AAAA record as
// well (the lab's `dual.example`: 198.19.0.1 and 2001:2::1, RFC 5180's benchmarking
// range) must still work by name, and IPv6 must fail at once, not hang.
// ---------------------------------------------------------------------------------------

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t30_a_v4_only_job_reaches_a_dual_stack_name_and_has_no_ipv6() {
    require_root!();
    let lab = or_skip!(NetLab::new());
    let h = home("net-v6");
    let (name, v6) = (netlab::DUAL_NAME, netlab::DUAL_IPV6);
    // The fake host's own link-local address (its link to the fake internet), where its
    // server on every address (8081) answers: the control reads it from the fake host.
    let dev = format!("{}h", lab.name);
    let o =
        Command::new("ip").args(["-n", &lab.host, "-6", "-o", "addr", "show", "dev", &dev, "scope", "link"]).output();
    let text = String::from_utf8_lossy(&o.unwrap().stdout).into_owned();
    let ll = text.split_whitespace().skip_while(|w| *w != "inet6").nth(1).and_then(|a| a.split('/').next());
    let ll = ll.unwrap_or_else(|| panic!("no link-local address on the fake host's {dev}: {text}")).to_string();
    let get_raw = |nc: &str, at: &str| {
        format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | timeout 3 {nc} {at} {} 2>&1", netlab::HOST_ANY_PORT)
    };
    // The address is usable once its duplicate address detection is over (about 1 s after
    // the link came up).
    let control = || {
        let o = lab.host_command("sh", None).arg("-c").arg(get_raw("busybox nc", &format!("{ll}%{dev}"))).output();
        String::from_utf8_lossy(&o.unwrap().stdout).into_owned()
    };
    wait_until("the fake host's link-local address to answer there", Duration::from_secs(10), || {
        control().contains(HOST_BODY)
    });
    let script = format!(
        "echo aaaa=$(timeout 5 nslookup -type=AAAA {name} 2>&1 | grep -c '{v6}'); \
         echo get=$({}); \
         echo v6=$(timeout 5 nc {v6} 80 </dev/null 2>&1; echo rc=$?); \
         echo v6-loopback=$(timeout 5 nc ::1 {} </dev/null 2>&1; echo rc=$?); \
         {}echo link-local=$({} | tr '\\r\\n' '  '); \
         echo addrs=$(ip -6 -o addr show | awk '{{print $2 \"/\" $4}}' | tr '\\n' ' ')",
        get(&format!("http://{name}/")),
        netlab::HOST_LOOPBACK_PORT,
        // Rootless: once the tap's own link-local address is usable (its DAD, ~1 s), IPv6
        // goes to pasta, which must not forward it.
        if rootless() { "sleep 2; " } else { "" },
        get_raw("nc", &format!("{ll}%eth0"))
    );
    for (who, opts) in USERS {
        let out = lab_exec_ok(&lab, &h, opts, &script);
        eprintln!("{who}:\n{out}");
        assert!(out.contains("aaaa=1\n"), "{who}: the job's resolver answers AAAA: {out}");
        assert!(out.contains(&format!("get={INTERNET_BODY}\n")), "{who}: by name, over IPv4: {out}");
        assert!(out.contains("Network is unreachable") && out.contains("v6=nc: "), "{who}: no IPv6 route: {out}");
        assert!(!out.contains("v6=nc: can't connect to remote host: Network is unreachable rc=124"), "{out}");
        assert!(!out.contains(HOST_BODY), "{who}: the fake host's link-local address answered: {out}");
        // Root: no IPv6 address but loopback's on the veth (addr_gen_mode none). Rootless:
        // the kernel gives pasta's tap a link-local address, but pasta (--ipv4-only)
        // forwards no IPv6: the fake host's link-local address stays out of reach (above).
        let addrs = out.lines().find(|l| l.starts_with("addrs=")).unwrap_or("");
        let want_only = |a: &str| {
            a.split_whitespace()
                .all(|x| x == "addrs=lo/::1/128" || x == "lo/::1/128" || (rootless() && x.starts_with("eth0/fe80:")))
        };
        assert!(addrs.contains("lo/::1/128") && want_only(addrs), "{who}: IPv6 on loopback only: {out}");
    }
    h.assert_no_residue(&[]);
}

/// Allow entries that are not one IPv4 address (with an optional port): one line each.
#[test]
fn t31_allow_entries_that_are_not_an_ipv4_address_get_one_line() {
    let h = TestHome::new("net-bad-allow");
    for (entry, want) in [
        ("10.0.0.0/8", "not a network (list each address)"),
        ("[2001:2::1]:80", "network_allow takes IPv4 addresses only"),
        ("2001:2::1", "network_allow takes IPv4 addresses only"),
        ("fe80::/10", "not a network"),
        ("host.example:80", "use an IPv4 address"),
    ] {
        let out =
            h.command().args(["exec", "--rootfs", "esc", "--network-allow", entry, "--", "true"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{entry}: {err}");
        assert!(err.contains(&format!("bad --network-allow entry '{entry}'")) && err.contains(want), "{entry}: {err}");
    }
    let cfg = h.dir.join("config.toml");
    std::fs::write(&cfg, "url = \"https://dev.azure.com/o\"\npool = \"p\"\nnetwork_allow = [\"10.0.0.0/8\"]\n")
        .unwrap();
    let out = h.command().args(["run", "--config"]).arg(&cfg).arg("--token-file=/nonexistent").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad network_allow entry '10.0.0.0/8'") && err.contains("not a network"), "{err}");
    assert_eq!(err.lines().filter(|l| l.contains("error")).count(), 1, "{err}");
}
