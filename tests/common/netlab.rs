//! A small network for the tests of jobs' network (issue 23), made of network namespaces
//! the test creates: traffic goes only to loopback and to these namespaces, never to the
//! machine's real interfaces or addresses.
//!
//! ```text
//!  fake host (azp-sandbox runs here)                     fake internet
//!  lo 127.0.0.1:8080  HTTP "host-loopback-secret"        lo 198.19.0.1:80   HTTP "internet-ok"
//!  *:8081              the same, on every address
//!  lo 127.0.0.53:53   dnsmasq -> 198.19.0.53             lo 198.19.0.53:53  dnsmasq: fake.example
//!  @azp-netlab-NAME   an abstract unix socket                                = 198.19.0.1, dual.example
//!                                                                            = 198.19.0.1 and 2001:2::1
//!  resolv.conf: nameserver 127.0.0.53                    lo 169.254.169.254:80 HTTP "metadata-secret"
//!                                                        lo 168.63.129.16:80 HTTP "wireserver-secret"
//!  NAMEh 198.18.0.1/30 ----------------- veth ---------- NAMEi 198.18.0.2/30
//!  default via 198.18.0.2; 169.254.169.254/32 and 168.63.129.16/32 via 198.18.0.2 (only here)
//! ```
//!
//! [`NetLab::resolve_through`] moves the fake host's resolver to one of the fake
//! internet's addresses (a cloud's: GCP's on the metadata address, Azure's on its host
//! endpoint).
//!
//! [`NetLab::new_v6`] adds IPv6 (RFC 5180's benchmarking range 2001:2::/48), the rest
//! unchanged:
//!
//! ```text
//!  fake host                                             fake internet
//!  lo [::1]:8080      HTTP "host-loopback-secret"        lo [2001:2::1]:80  HTTP "internet-ok"
//!  (*:8081 answers on its IPv6 addresses too)            dnsmasq: v6only.example = 2001:2::1
//!  NAMEh 2001:2:0:1::1/64 -------------- veth ---------- NAMEi 2001:2:0:1::2/64
//!  default via fe80::2 dev NAMEh (link-local, as a       NAMEi fe80::2 (the router)
//!    router's from its advertisements)                  NAMEi fe80::a9fe:a9fe: [..]:80 "metadata-secret"
//!  fd00:ec2::254/128 via 2001:2:0:1::2 (only here)       lo [fd00:ec2::254]:80 "metadata-secret"
//!  lo 2001:2:0:2::1/128 (a second address of its own)
//!  net.ipv6.conf.all.forwarding = 0 (a host, not a router)
//! ```
//!
//! Commands run in the fake host through `unshare -m` (its resolv.conf bound over
//! `/etc/resolv.conf` in a mount namespace of their own) and `nsenter --net`, not `ip
//! netns exec`, which remounts `/sys` without the cgroup hierarchies azp-sandbox needs.
//! Servers are busybox httpd (Python's http.server waits for reverse DNS here) and
//! Debian's dnsmasq. A thread of the test process can join either namespace
//! ([`NetLab::enter_internet`]): the namespace is per thread.
//!
//! Self-contained (std and nix only): the benchmarks include it too.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

pub const INTERNET_IP: &str = "198.19.0.1";
pub const INTERNET_DNS: &str = "198.19.0.53";
pub const INTERNET_NAME: &str = "fake.example";
/// A name with an A (INTERNET_IP) and an AAAA record (DUAL_IPV6, no server has it).
pub const DUAL_NAME: &str = "dual.example";
pub const DUAL_IPV6: &str = "2001:2::1";
pub const METADATA_IP: &str = "169.254.169.254";
/// Azure's host endpoint (WireServer, Azure DNS), routed to the fake internet in the fake
/// host only, as the metadata address is.
pub const AZURE_HOST_IP: &str = "168.63.129.16";
pub const WIRESERVER_BODY: &str = "wireserver-secret";
pub const HOST_IP: &str = "198.18.0.1";
/// The broadcast address of the fake host's uplink subnet (198.18.0.0/30): the fake host
/// delivers a datagram to it to its own services, as to [`HOST_IP`].
pub const HOST_SUBNET_BROADCAST: &str = "198.18.0.3";
pub const HOST_LOOPBACK_PORT: u16 = 8080;
/// A fake host service on all its addresses (its own, not loopback's).
pub const HOST_ANY_PORT: u16 = 8081;
pub const INTERNET_BODY: &str = "internet-ok";
/// IPv6 labs ([`NetLab::new_v6`]): the fake host's address on its uplink, the internet's
/// server (at [`DUAL_IPV6`]) by a name with an AAAA record only, a link-local metadata
/// service on the internet's side of the uplink (reachable from the fake host only).
pub const HOST_IP6: &str = "2001:2:0:1::1";
/// A second global address of the fake host (on its loopback link).
pub const HOST_IP6_LO: &str = "2001:2:0:2::1";
pub const V6ONLY_NAME: &str = "v6only.example";
pub const METADATA_IP6: &str = "fe80::a9fe:a9fe";
/// AWS's IPv6 metadata address, routed in the fake host only.
pub const AWS_METADATA_IP6: &str = "fd00:ec2::254";
pub const METADATA_BODY: &str = "metadata-secret";
pub const HOST_BODY: &str = "host-loopback-secret";

pub struct NetLab {
    /// Names of the two namespaces (`ip netns`), and the lab's own prefix.
    pub name: String,
    pub host: String,
    pub internet: String,
    /// Made by [`NetLab::new_v6`].
    pub ipv6: bool,
    dir: PathBuf,
    servers: Vec<Child>,
    abstract_accepts: Arc<AtomicUsize>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    listener: Option<std::thread::JoinHandle<()>>,
}

/// The lab cannot be made here: why (for a visible skip).
pub type Unavailable = String;

/// Polls `ready` every `every_ms` until it holds; `what` (and "within 60 s") after 60 s:
/// generous, as a busy machine (a CI run, four tests at a time) may take a while, and a
/// lab that is not ready is a skip, which must not hide a test merely because of load.
fn within_60s(every_ms: u64, what: &str, mut ready: impl FnMut() -> Result<bool, String>) -> Result<(), String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !ready()? {
        if std::time::Instant::now() > deadline {
            return Err(format!("{what} within 60 s"));
        }
        std::thread::sleep(std::time::Duration::from_millis(every_ms));
    }
    Ok(())
}

fn run(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0]).args(&args[1..]).output().map_err(|e| format!("cannot run {}: {e}", args[0]))?;
    if !out.status.success() {
        return Err(format!("{} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(())
}

fn have(program: &str) -> bool {
    std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file())).unwrap_or(false)
}

impl NetLab {
    /// Makes the two namespaces and their servers. Err: why it cannot be made here.
    pub fn new() -> Result<NetLab, Unavailable> {
        NetLab::make(false)
    }

    /// [`NetLab::new`] with IPv6 (see the module's picture).
    pub fn new_v6() -> Result<NetLab, Unavailable> {
        NetLab::make(true)
    }

    fn make(ipv6: bool) -> Result<NetLab, Unavailable> {
        if !nix::unistd::geteuid().is_root() {
            return Err("the network lab needs root (network namespaces)".into());
        }
        for p in ["ip", "dnsmasq", "busybox", "unshare", "nsenter", "setpriv"] {
            if !have(p) {
                return Err(format!("the network lab needs {p} (scripts/setup.sh installs it)"));
            }
        }
        // The lab's commands run in private mount namespaces (for the fake host's
        // resolv.conf): a tmpfs the first of them mounted for job records where this
        // machine's /run is none would be that command's alone, and gone with it (with
        // the records of what the jobs' table turned on, which gc reads). A real host's
        // /run is a tmpfs; here the machine's own namespace gets the one azp-sandbox
        // would mount, before any lab command runs.
        let runtime = std::path::Path::new("/run/azp-sandbox");
        azp_sandbox::sys::runtime_tmpfs::ensure(runtime).map_err(|e| format!("{}: {e}", runtime.display()))?;
        static N: AtomicU32 = AtomicU32::new(0);
        // Never "azp...": job links on the host are azp*, and the host's table matches that.
        let name = format!("nl{:x}{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst));
        let dir = std::env::temp_dir().join(format!("azp-netlab-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        let mut lab = NetLab {
            host: format!("{name}-host"),
            internet: format!("{name}-inet"),
            ipv6,
            name,
            dir,
            servers: vec![],
            abstract_accepts: Arc::new(AtomicUsize::new(0)),
            stop: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            listener: None,
        };
        lab.build()?;
        Ok(lab)
    }

    fn build(&mut self) -> Result<(), String> {
        let (h, i) = (self.host.clone(), self.internet.clone());
        let (hl, il) = (format!("{}h", self.name), format!("{}i", self.name));
        run(&["ip", "netns", "add", &h])?;
        run(&["ip", "netns", "add", &i])?;
        // A new namespace copies IPv4 forwarding from the machine's own (with
        // net.core.devconf_inherit_init_net = 0): the fake host starts as a host that does
        // not forward, whatever the machine does.
        run(&["ip", "netns", "exec", &h, "sysctl", "-qw", "net.ipv4.ip_forward=0"])?;
        run(&["ip", "-n", &h, "link", "add", &hl, "type", "veth", "peer", "name", &il, "netns", &i])?;
        for (ns, cmds) in [
            (
                &h,
                vec![
                    vec!["link", "set", "lo", "up"],
                    vec!["addr", "add", "198.18.0.1/30", "dev", &hl],
                    vec!["link", "set", &hl, "up"],
                    vec!["route", "add", "default", "via", "198.18.0.2"],
                    // The metadata address and Azure's are routed in the fake host only.
                    vec!["route", "add", "169.254.169.254/32", "via", "198.18.0.2"],
                    vec!["route", "add", "168.63.129.16/32", "via", "198.18.0.2"],
                ],
            ),
            (
                &i,
                vec![
                    vec!["link", "set", "lo", "up"],
                    vec!["addr", "add", "198.18.0.2/30", "dev", &il],
                    vec!["link", "set", &il, "up"],
                    vec!["addr", "add", "198.19.0.1/32", "dev", "lo"],
                    vec!["addr", "add", "198.19.0.53/32", "dev", "lo"],
                    vec!["addr", "add", "169.254.169.254/32", "dev", "lo"],
                    vec!["addr", "add", "168.63.129.16/32", "dev", "lo"],
                    vec!["route", "add", "default", "via", "198.18.0.1"],
                ],
            ),
        ] {
            for c in cmds {
                let mut args = vec!["ip", "-n", ns.as_str()];
                args.extend(c);
                run(&args)?;
            }
        }
        if self.ipv6 {
            self.build_ipv6(&h, &i, &hl, &il)?;
        }
        for (sub, body) in
            [("www", INTERNET_BODY), ("meta", METADATA_BODY), ("host", HOST_BODY), ("wire", WIRESERVER_BODY)]
        {
            std::fs::create_dir_all(self.dir.join(sub)).map_err(|e| e.to_string())?;
            std::fs::write(self.dir.join(sub).join("index.html"), format!("{body}\n")).map_err(|e| e.to_string())?;
        }
        let www = self.dir.join("www").display().to_string();
        let meta = self.dir.join("meta").display().to_string();
        let host = self.dir.join("host").display().to_string();
        let httpd = |at: &str, root: &str| {
            vec!["busybox".to_string(), "httpd".into(), "-f".into(), "-p".into(), at.into(), "-h".into(), root.into()]
        };
        self.server(&i, httpd("198.19.0.1:80", &www))?;
        self.server(&i, httpd("169.254.169.254:80", &meta))?;
        let wire = self.dir.join("wire").display().to_string();
        self.server(&i, httpd("168.63.129.16:80", &wire))?;
        self.server(&h, httpd(&format!("127.0.0.1:{HOST_LOOPBACK_PORT}"), &host))?;
        self.server(&h, httpd(&format!("{HOST_ANY_PORT}"), &host))?;
        if self.ipv6 {
            self.server(&i, httpd(&format!("[{DUAL_IPV6}]:80"), &www))?;
            self.server(&i, httpd(&format!("[{METADATA_IP6}%{il}]:80"), &meta))?;
            self.server(&i, httpd(&format!("[{AWS_METADATA_IP6}]:80"), &meta))?;
            self.server(&h, httpd(&format!("[::1]:{HOST_LOOPBACK_PORT}"), &host))?;
        }
        let dnsmasq = |listen: &str, rest: &[&str]| {
            let mut a: Vec<String> =
                ["dnsmasq", "-k", "-C", "/dev/null", "--no-resolv", "--no-hosts", "--bind-interfaces"]
                    .map(String::from)
                    .to_vec();
            a.push(format!("--listen-address={listen}"));
            a.push("--pid-file=".into());
            a.extend(rest.iter().map(|s| s.to_string()));
            a
        };
        // DUAL_NAME has an AAAA record too (RFC 5180's benchmarking range), which no job can
        // use: a v4-only job must still reach it by name.
        let mut dual = vec![
            "--address=/fake.example/198.19.0.1".to_string(),
            format!("--address=/{DUAL_NAME}/198.19.0.1"),
            format!("--address=/{DUAL_NAME}/{DUAL_IPV6}"),
        ];
        if self.ipv6 {
            dual.push(format!("--address=/{V6ONLY_NAME}/{DUAL_IPV6}"));
        }
        self.server(&i, dnsmasq(INTERNET_DNS, &dual.iter().map(String::as_str).collect::<Vec<_>>()))?;
        // The fake host's resolver forwards to the fake internet's: started before that one
        // listens, it could forward a first query into the void (port unreachable), and
        // dnsmasq does not answer the client then: glibc waits its 5 s timeout before asking
        // again (8 of 250 labs of t32 took 5 s longer to get ready).
        self.wait_udp_listener(&i, &format!("{INTERNET_DNS}:53"))?;
        self.server(&h, dnsmasq("127.0.0.53", &["--server=198.19.0.53"]))?;
        let etc = PathBuf::from("/etc/netns").join(&h);
        std::fs::create_dir_all(&etc).map_err(|e| e.to_string())?;
        std::fs::write(etc.join("resolv.conf"), "nameserver 127.0.0.53\n").map_err(|e| e.to_string())?;
        self.abstract_listener()?;
        self.wait_ready()
    }

    /// The IPv6 part of the lab: addresses without duplicate address detection (usable at
    /// once), the fake host's default route, a host that does not forward IPv6.
    fn build_ipv6(&self, h: &str, i: &str, hl: &str, il: &str) -> Result<(), String> {
        run(&["ip", "netns", "exec", h, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=0"])?;
        let link6 = |x: u8| format!("2001:2:0:1::{x}/64");
        let meta = format!("{METADATA_IP6}/64");
        let dual = format!("{DUAL_IPV6}/128");
        for (ns, cmd) in [
            (h, vec!["addr", "add", &link6(1), "dev", hl, "nodad"]),
            (i, vec!["addr", "add", &link6(2), "dev", il, "nodad"]),
            (i, vec!["addr", "add", "fe80::2/64", "dev", il, "nodad"]),
            (h, vec!["-6", "route", "add", "default", "via", "fe80::2", "dev", hl]),
            (i, vec!["addr", "add", &meta, "dev", il, "nodad"]),
            (i, vec!["addr", "add", &dual, "dev", "lo"]),
            (i, vec!["addr", "add", AWS_METADATA_IP6, "dev", "lo"]),
            (h, vec!["addr", "add", HOST_IP6_LO, "dev", "lo"]),
            (h, vec!["-6", "route", "add", AWS_METADATA_IP6, "via", "2001:2:0:1::2", "dev", hl]),
        ] {
            let mut args = vec!["ip", "-n", ns];
            args.extend(cmd);
            run(&args)?;
        }
        Ok(())
    }

    fn server(&mut self, ns: &str, argv: Vec<String>) -> Result<(), String> {
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .args(&argv)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", argv[0]))?;
        self.servers.push(child);
        Ok(())
    }

    /// The fake host's resolver becomes a DNS server at `addr`, one of the fake internet's
    /// addresses (a cloud's resolver: GCP's on the metadata address, Azure's on its host
    /// endpoint), answering the fake internet's names. For this lab only: its resolv.conf
    /// is its own.
    pub fn resolve_through(&mut self, addr: &str) -> Result<(), String> {
        let i = self.internet.clone();
        let argv = ["dnsmasq", "-k", "-C", "/dev/null", "--no-resolv", "--no-hosts", "--bind-interfaces"]
            .into_iter()
            .map(String::from)
            .chain([
                format!("--listen-address={addr}"),
                "--pid-file=".into(),
                format!("--address=/{INTERNET_NAME}/{INTERNET_IP}"),
            ])
            .collect();
        self.server(&i, argv)?;
        self.wait_udp_listener(&i, &format!("{addr}:53"))?;
        std::fs::write(self.resolv_conf(), format!("nameserver {addr}\n")).map_err(|e| e.to_string())?;
        within_60s(50, &format!("the fake host resolved nothing through {addr}"), || {
            Ok(self.in_host(&["busybox", "wget", "-q", "-O", "/dev/null", &format!("http://{INTERNET_NAME}/")]))
        })
    }

    /// Until a UDP socket is bound to `addr` (`IP:PORT`) in namespace `ns`.
    fn wait_udp_listener(&self, ns: &str, addr: &str) -> Result<(), String> {
        within_60s(10, &format!("nothing listened on UDP {addr} in {ns}"), || {
            let o = Command::new("ip")
                .args(["netns", "exec", ns, "ss", "-H", "-n", "-l", "-u", "src", addr])
                .stderr(Stdio::null())
                .output()
                .map_err(|e| format!("cannot run ss: {e}"))?;
            Ok(!o.stdout.is_empty())
        })
    }

    /// The servers answer (dnsmasq and httpd take a moment to bind).
    fn wait_ready(&self) -> Result<(), String> {
        within_60s(50, "the network lab's servers did not answer", || {
            Ok(self.in_host(&["busybox", "wget", "-q", "-O", "/dev/null", &format!("http://{INTERNET_NAME}/")])
                && self.in_host(&[
                    "busybox",
                    "wget",
                    "-q",
                    "-O",
                    "/dev/null",
                    &format!("http://127.0.0.1:{HOST_LOOPBACK_PORT}/"),
                ])
                && self.in_host(&["busybox", "wget", "-q", "-O", "/dev/null", &format!("http://{METADATA_IP}/")])
                && self.in_host(&["busybox", "wget", "-q", "-O", "/dev/null", &format!("http://{AZURE_HOST_IP}/")])
                && (!self.ipv6 || self.ipv6_ready()))
        })
    }

    fn ipv6_ready(&self) -> bool {
        let meta = format!("http://[{METADATA_IP6}%{}h]/", self.name);
        let loopback = format!("http://[::1]:{HOST_LOOPBACK_PORT}/");
        let aws = format!("http://[{AWS_METADATA_IP6}]/");
        [format!("http://{V6ONLY_NAME}/"), format!("http://[{DUAL_IPV6}]/"), meta, loopback, aws]
            .iter()
            .all(|u| self.in_host(&["busybox", "wget", "-q", "-O", "/dev/null", u]))
    }

    fn in_host(&self, argv: &[&str]) -> bool {
        self.host_command(argv[0], None)
            .args(&argv[1..])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// `program` run in the fake host (its network namespace, its resolv.conf), as `user`
    /// (uid, gid) when given.
    pub fn host_command(&self, program: impl AsRef<std::ffi::OsStr>, user: Option<(u32, u32)>) -> Command {
        let mut c = Command::new("unshare");
        c.args(["-m", "--propagation", "private", "sh", "-c"]);
        c.arg(r#"r=$1; n=$2; shift 2; mount --bind "$r" /etc/resolv.conf && exec nsenter --net="$n" -- "$@""#);
        c.arg("sh").arg(self.resolv_conf()).arg(self.netns_path(&self.host));
        if let Some((uid, gid)) = user {
            c.args(["setpriv", &format!("--reuid={uid}"), &format!("--regid={gid}"), "--init-groups", "--"]);
        }
        c.arg(program);
        c
    }

    /// `nft list table inet azp-sandbox` in the fake host (empty when there is none).
    pub fn host_jobs_table(&self) -> String {
        let o = Command::new("ip")
            .args(["netns", "exec", &self.host, "nft", "list", "table", "inet", "azp-sandbox"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// `ip ARGS` in the fake host, asserting it worked.
    pub fn host_ip(&self, args: &[&str]) {
        let o = Command::new("ip").args(["netns", "exec", &self.host, "ip"]).args(args).output().unwrap();
        assert!(o.status.success(), "ip {args:?} in the fake host: {}", String::from_utf8_lossy(&o.stderr));
    }

    fn resolv_conf(&self) -> PathBuf {
        PathBuf::from("/etc/netns").join(&self.host).join("resolv.conf")
    }

    fn netns_path(&self, ns: &str) -> PathBuf {
        PathBuf::from("/run/netns").join(ns)
    }

    /// Moves the calling thread into the fake internet (for a server of the test's).
    pub fn enter_internet(&self) {
        enter(&self.netns_path(&self.internet));
    }

    /// Moves the calling thread into the fake host.
    pub fn enter_host(&self) {
        enter(&self.netns_path(&self.host));
    }

    /// A firewall reload in the fake host: its whole ruleset flushed (what `systemctl
    /// reload nftables` does on Debian, whose nftables.conf starts so).
    pub fn flush_host_ruleset(&self) {
        let o = Command::new("ip").args(["netns", "exec", &self.host, "nft", "flush", "ruleset"]).output().unwrap();
        assert!(o.status.success(), "nft flush ruleset in the fake host: {}", String::from_utf8_lossy(&o.stderr));
    }

    /// A UDP service of the fake host on `addr:port`, counting the datagrams it gets until
    /// it is dropped.
    pub fn udp_counter(&self, addr: &str, port: u16) -> UdpCounter {
        udp_counter_in(self.netns_path(&self.host), addr, port)
    }

    /// A UDP service of the fake internet on `addr:port`, counting the datagrams it gets
    /// and from where ([`UdpCounter::sources`]: the fake host's address when the host's
    /// table masqueraded them).
    pub fn internet_udp_counter(&self, addr: &str, port: u16) -> UdpCounter {
        udp_counter_in(self.internet_path(), addr, port)
    }

    /// The path of a namespace, for a thread that enters it later ([`enter`]).
    pub fn internet_path(&self) -> PathBuf {
        self.netns_path(&self.internet)
    }

    /// The fake host's namespace path, for a thread that enters it later ([`enter`]).
    pub fn host_path(&self) -> PathBuf {
        self.netns_path(&self.host)
    }

    /// The fake host's abstract unix socket (`@NAME`) and how many connections it took.
    pub fn abstract_name(&self) -> String {
        format!("azp-netlab-{}", self.name)
    }
    pub fn abstract_accepts(&self) -> usize {
        self.abstract_accepts.load(Ordering::SeqCst)
    }

    /// A thread in the fake host that accepts on the abstract socket until the lab goes
    /// (its socket would keep the namespace alive).
    fn abstract_listener(&mut self) -> Result<(), String> {
        use std::os::linux::net::SocketAddrExt;
        let ns = self.netns_path(&self.host);
        let name = self.abstract_name();
        let (count, stop) = (self.abstract_accepts.clone(), self.stop.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        self.listener = Some(std::thread::spawn(move || {
            enter(&ns);
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
            let l = match std::os::unix::net::UnixListener::bind_addr(&addr).and_then(|l| {
                l.set_nonblocking(true)?;
                Ok(l)
            }) {
                Ok(l) => l,
                Err(e) => return tx.send(Err(e.to_string())).unwrap(),
            };
            tx.send(Ok(())).unwrap();
            while !stop.load(Ordering::SeqCst) {
                match l.accept() {
                    Ok(_) => {
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
                }
            }
        }));
        rx.recv().map_err(|e| e.to_string())?.map_err(|e| format!("abstract socket: {e}"))
    }

    /// A job link (`azp*`) or the nftables table left in the fake host.
    pub fn host_network_residue(&self) -> Vec<String> {
        let mut out = vec![];
        let links = Command::new("ip").args(["-n", &self.host, "-o", "link"]).output().unwrap();
        for l in String::from_utf8_lossy(&links.stdout).lines() {
            if let Some(n) = l.split(": ").nth(1).map(|n| n.split('@').next().unwrap_or(n)) {
                if n.starts_with("azp") {
                    out.push(format!("link {n}"));
                }
            }
        }
        let nft = Command::new("ip").args(["netns", "exec", &self.host, "nft", "list", "tables"]).output();
        if let Ok(o) = nft {
            out.extend(
                String::from_utf8_lossy(&o.stdout).lines().map(|l| l.trim().to_string()).filter(|l| !l.is_empty()),
            );
        }
        out
    }

    /// The markers of killed jobs' connections left in the fake host (see azp-sandbox's
    /// `network::forget`).
    pub fn connection_markers(&self) -> Vec<String> {
        markers_in(&self.connection_markers_dir())
    }

    /// How many datagrams the fake internet's UDP sockets on `port` dropped (a full
    /// receive buffer: the `drops` column of its /proc/net/udp).
    pub fn internet_udp_drops(&self, port: u16) -> u64 {
        let o = Command::new("ip").args(["netns", "exec", &self.internet, "cat", "/proc/net/udp"]).output().unwrap();
        let on_port = |l: &&str| {
            let local = l.split_whitespace().nth(1).unwrap_or("");
            local.rsplit_once(':').and_then(|(_, p)| u16::from_str_radix(p, 16).ok()) == Some(port)
        };
        let text = String::from_utf8_lossy(&o.stdout);
        text.lines().skip(1).filter(on_port).filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok()).sum()
    }

    /// Where the fake host's markers are.
    pub fn connection_markers_dir(&self) -> PathBuf {
        use std::os::unix::fs::MetadataExt;
        let ino = std::fs::metadata(self.netns_path(&self.host)).unwrap().ino();
        PathBuf::from(format!("/run/azp-sandbox/unforgotten-{ino}"))
    }

    /// The fake host's ARP requests to job links dropped until the hold is dropped (a
    /// table of the `arp` family of its own).
    pub fn hold_arp_to_job_links(&self) -> ArpHold {
        let rules = "add table arp azp-test-hold\n\
            add chain arp azp-test-hold out { type filter hook output priority 0; }\n\
            add rule arp azp-test-hold out oifname \"azp*\" drop\n";
        let o = Command::new("ip")
            .args(["netns", "exec", &self.host, "nft", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                std::io::Write::write_all(c.stdin.as_mut().unwrap(), rules.as_bytes())?;
                drop(c.stdin.take());
                c.wait_with_output()
            })
            .unwrap();
        assert!(o.status.success(), "nft in the fake host: {}", String::from_utf8_lossy(&o.stderr));
        ArpHold { host: self.host.clone() }
    }

    /// A sysctl of the fake host (`net.ipv6.conf.all.forwarding`).
    pub fn host_sysctl(&self, key: &str) -> String {
        let o = Command::new("ip").args(["netns", "exec", &self.host, "sysctl", "-n", key]).output().unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    /// The fake host's uplink (its link to the fake internet).
    pub fn host_uplink(&self) -> String {
        format!("{}h", self.name)
    }

    /// net.ipv4.ip_forward of the fake host.
    pub fn host_ip_forward(&self) -> String {
        let o = Command::new("ip")
            .args(["netns", "exec", &self.host, "sysctl", "-n", "net.ipv4.ip_forward"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }
}

/// Moves the calling thread into the network namespace at `path`.
pub fn enter(path: &Path) {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET)
        .unwrap_or_else(|e| panic!("setns {}: {e}", path.display()));
}

impl Drop for NetLab {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.listener.take() {
            let _ = t.join();
        }
        for s in &mut self.servers {
            let _ = s.kill();
            let _ = s.wait();
        }
        // azp-sandbox's per-namespace files of the fake host (firewall::USERS_LOCK,
        // forward_record), named by its inode: without this /run/azp-sandbox gathered two
        // files per lab. Removed while the namespace still holds that inode number (once
        // it is gone, another lab's namespace may get it, and these files with it).
        if let Ok(m) = std::fs::metadata(PathBuf::from("/run/netns").join(&self.host)) {
            use std::os::unix::fs::MetadataExt;
            let _ = std::fs::remove_file(format!("/run/azp-sandbox/network-users-{}.lock", m.ino()));
            let _ = std::fs::remove_file(format!("/run/azp-sandbox/forwarding-{}", m.ino()));
            let _ = std::fs::remove_dir_all(format!("/run/azp-sandbox/unforgotten-{}", m.ino()));
        }
        // Whatever jobs left in the fake host (links, the table) goes with it.
        let _ = Command::new("ip").args(["netns", "del", &self.host]).status();
        let _ = Command::new("ip").args(["netns", "del", &self.internet]).status();
        let _ = std::fs::remove_dir_all(PathBuf::from("/etc/netns").join(&self.host));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// See [`NetLab::hold_arp_to_job_links`].
pub struct ArpHold {
    host: String,
}

impl Drop for ArpHold {
    fn drop(&mut self) {
        let delete = ["netns", "exec", &self.host, "nft", "delete", "table", "arp", "azp-test-hold"];
        let _ = Command::new("ip").args(delete).status();
    }
}

/// The names in a markers' dir (none when it is not there).
pub fn markers_in(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|r| r.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

/// A thread of the lab, in the namespace at `ns`, serving until dropped: `serve` gets
/// the stop flag, and `ready` to call once it listens (the constructor returns then).
struct Serving {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Serving {
    fn start(
        ns: PathBuf,
        what: &str,
        serve: impl FnOnce(&std::sync::atomic::AtomicBool, &dyn Fn()) + Send + 'static,
    ) -> Serving {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let st = stop.clone();
        let thread = std::thread::spawn(move || {
            enter(&ns);
            serve(&st, &|| ready_tx.send(()).unwrap());
        });
        ready_rx.recv().unwrap_or_else(|_| panic!("the lab's {what}"));
        Serving { stop, thread: Some(thread) }
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A thread in the fake internet, bound to `addr:port`, that answers every source it
/// heard from with a datagram every 5 ms, until dropped: a far end that keeps a
/// connection's tracking alive after its job is gone, and has datagrams on their way in
/// every few milliseconds of a next job's set-up.
pub struct UdpAnswerer {
    _serving: Serving,
}

/// A TCP service of the fake internet that accepts every connection and never reads it
/// (its window shuts once its receive buffer is full), until dropped: a far end to whom
/// a job's socket still has data to send after the job.
pub struct TcpSink {
    _serving: Serving,
    held: Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl TcpSink {
    /// The connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.held.lock().unwrap().len()
    }

    /// Those still established: neither closed nor reset by their far end (TCP_INFO's
    /// state).
    pub fn established(&self) -> usize {
        const TCP_ESTABLISHED: u8 = 1;
        let held = self.held.lock().unwrap();
        held.iter()
            .filter(|c| {
                // tcpi_state is the first byte of struct tcp_info.
                let mut info = [0u8; 256];
                let mut len = info.len() as libc::socklen_t;
                // SAFETY: getsockopt writes at most `len` bytes into `info`, which is that
                // long and alive for the call; the fd is the held stream's own.
                let r = unsafe {
                    libc::getsockopt(
                        std::os::fd::AsRawFd::as_raw_fd(*c),
                        libc::IPPROTO_TCP,
                        libc::TCP_INFO,
                        info.as_mut_ptr().cast(),
                        &mut len,
                    )
                };
                r == 0 && info[0] == TCP_ESTABLISHED
            })
            .count()
    }
}

impl NetLab {
    pub fn internet_udp_answerer(&self, addr: &str, port: u16) -> UdpAnswerer {
        let addr = addr.to_string();
        let serving = Serving::start(self.internet_path(), "UDP answerer", move |stop, ready| {
            let sock = std::net::UdpSocket::bind((addr.as_str(), port)).unwrap();
            sock.set_read_timeout(Some(std::time::Duration::from_millis(5))).unwrap();
            ready();
            let mut peers: Vec<std::net::SocketAddr> = vec![];
            let mut buf = [0u8; 16];
            while !stop.load(Ordering::SeqCst) {
                if let Ok((_, peer)) = sock.recv_from(&mut buf) {
                    if !peers.contains(&peer) {
                        peers.push(peer);
                    }
                }
                for p in &peers {
                    let _ = sock.send_to(b"answer", p);
                }
            }
        });
        UdpAnswerer { _serving: serving }
    }

    pub fn internet_tcp_sink(&self, addr: &str, port: u16) -> TcpSink {
        let addr = addr.to_string();
        let held = Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = held.clone();
        let serving = Serving::start(self.internet_path(), "TCP sink", move |stop, ready| {
            let listener = std::net::TcpListener::bind((addr.as_str(), port)).unwrap();
            listener.set_nonblocking(true).unwrap();
            ready();
            while !stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((c, _)) => kept.lock().unwrap().push(c),
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
                }
            }
        });
        TcpSink { _serving: serving, held }
    }
}

fn udp_counter_in(ns: PathBuf, addr: &str, port: u16) -> UdpCounter {
    let got = Arc::new(AtomicUsize::new(0));
    let sources = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (g, from, addr) = (got.clone(), sources.clone(), addr.to_string());
    let serving = Serving::start(ns, "UDP service", move |stop, ready| {
        let sock = std::net::UdpSocket::bind((addr.as_str(), port)).unwrap();
        // Room for every datagram of a flood (t55 counts them all) while this thread
        // waits for a CPU on a busy machine: the default holds ~250 small ones.
        nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::RcvBufForce, &(64 << 20)).unwrap();
        sock.set_read_timeout(Some(std::time::Duration::from_millis(100))).unwrap();
        ready();
        let mut buf = [0u8; 16];
        while !stop.load(Ordering::SeqCst) {
            if let Ok((_, peer)) = sock.recv_from(&mut buf) {
                from.lock().unwrap().push(peer.ip());
                g.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    UdpCounter { got, sources, _serving: serving }
}

/// See [`NetLab::udp_counter`]: stops (and is joined) when dropped, a failed assertion's
/// unwinding included.
pub struct UdpCounter {
    got: Arc<AtomicUsize>,
    sources: Arc<std::sync::Mutex<Vec<std::net::IpAddr>>>,
    _serving: Serving,
}

impl UdpCounter {
    pub fn count(&self) -> usize {
        self.got.load(Ordering::SeqCst)
    }
    pub fn reset(&self) {
        self.got.store(0, Ordering::SeqCst);
        self.sources.lock().unwrap().clear();
    }
    /// The source address of each datagram so far, in order.
    pub fn sources(&self) -> Vec<std::net::IpAddr> {
        self.sources.lock().unwrap().clone()
    }
}
