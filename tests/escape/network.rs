// ---------------------------------------------------------------------------------------
// 20. The network (issue 23): every job has a network namespace of its own, outbound
// only. Run in the network lab (tests/common/netlab.rs): a fake host (where azp-sandbox
// runs) joined to a fake internet; the jobs' traffic never reaches a real interface.
// Root mode (veth + the host's nftables table) and, in the rootless pass, pasta.
// ---------------------------------------------------------------------------------------

use super::*;
use common::netlab::{
    self, markers_in, NetLab, HOST_BODY, HOST_IP, INTERNET_BODY, INTERNET_IP, INTERNET_NAME, METADATA_BODY,
};

/// What the job's `connect-tcp` to a blocked destination may say: refused by its own
/// routes (EACCES), by the host (EHOSTUNREACH: rejected), or unanswered (ETIMEDOUT,
/// rootless: pasta's connection to an address nobody has). Never OK.
fn blocked(result: &str) -> bool {
    ["EACCES", "EHOSTUNREACH", "ETIMEDOUT", "ECONNREFUSED", "ENETUNREACH"].contains(&result)
}

/// Refused in the job's own namespace, not sent: a timeout or a refusal from afar would
/// be a packet that left it.
fn refused_here(result: &str) -> bool {
    ["EACCES", "EHOSTUNREACH", "EPERM"].contains(&result)
}

/// Runs `script` in a job (with `args` for `exec`) that starts it once the fake host's
/// whole ruleset is flushed while the job runs (a firewall reload; a flush before the
/// job's start refuses the start); the job's stdout. `gc` after it turns off what the
/// host's table had turned on (the next job makes the table again).
fn after_a_flush(lab: &NetLab, h: &TestHome, args: &[&str], who: &str, script: &str) -> String {
    // Its own flag dir: tests that run beside it flush too.
    let m = unique(&format!("flush-{who}"));
    let flag = flag_dir(&m);
    let script = format!(": {m}; while [ ! -e /flag/flushed ]; do sleep 0.05; done; {script}");
    let vol = format!("{}:/flag", flag.display());
    let mut c = h.lab_command(lab);
    c.args(["exec", "--rootfs", "esc", "--volume", &vol]).args(args).args(["--", "sh", "-c", &script]);
    let mut job = HostProc(c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap());
    wait_until("the job to run", Duration::from_secs(30), || job_shell_runs(&m));
    lab.flush_host_ruleset();
    std::fs::write(flag.join("flushed"), "").unwrap();
    let o = job.output();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{who}: {out} {}", String::from_utf8_lossy(&o.stderr));
    let gc = h.lab_command(lab).arg("gc").output().unwrap();
    assert!(gc.status.success(), "{}", String::from_utf8_lossy(&gc.stderr));
    std::fs::remove_dir_all(&flag).unwrap();
    out
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t20_job_reaches_the_internet_by_name_and_address_with_a_network_of_its_own() {
    require_root!();
    let lab = or_skip!(NetLab::new());
    let h = home("net-out");
    for (who, opts) in USERS {
        let script = format!(
            "{}; {}; echo links=$(ls /sys/class/net | tr '\\n' ' '); grep nameserver /etc/resolv.conf; \
             echo mtu=$(cat /sys/class/net/eth0/mtu)",
            get(&format!("http://{INTERNET_NAME}/")),
            get(&format!("http://{INTERNET_IP}/"))
        );
        let out = lab_exec_ok(&lab, &h, opts, &script);
        assert_eq!(out.matches(INTERNET_BODY).count(), 2, "{who}: by name and by address: {out}");
        // Its own sysfs (the helper's, of the job's namespace) and the host's resolver
        // (127.0.0.53 in the fake host) reached at the gateway.
        assert!(out.contains("links=eth0 lo\n"), "{who}: {out}");
        assert!(out.contains(&format!("nameserver {GATEWAY}")) && !out.contains("nameserver 127."), "{who}: {out}");
        // The link says which mode made it: a veth (root) or pasta's tap (rootless).
        let mtu = if rootless() { "mtu=65520" } else { "mtu=1500" };
        assert!(out.contains(mtu), "{who}: {out}");
    }
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t21_job_cannot_reach_the_hosts_loopback_or_addresses() {
    require_root!();
    let lab = or_skip!(NetLab::new());
    let h = home("net-host");
    let loopback = format!("http://127.0.0.1:{}/", netlab::HOST_LOOPBACK_PORT);
    // The control: with the host's network, the job reads the host's loopback service.
    let out = lab_exec_ok(&lab, &h, &["--network", "host"], &get(&loopback));
    assert!(out.contains(HOST_BODY), "the fake host's server must be up: {out}");
    for (who, opts) in USERS {
        let targets = toks(&[
            &format!("connect-tcp:127.0.0.1:{}", netlab::HOST_LOOPBACK_PORT),
            &format!("connect-tcp:{HOST_IP}:{}", netlab::HOST_ANY_PORT),
            &format!("connect-tcp:{GATEWAY}:{}", netlab::HOST_LOOPBACK_PORT),
            &format!("connect-tcp:{GATEWAY}:{}", netlab::HOST_ANY_PORT),
        ]);
        let script = format!(
            "{}; {}; {}; {}",
            probe(&targets),
            get(&loopback),
            get(&format!("http://{HOST_IP}:{}/", netlab::HOST_ANY_PORT)),
            get(&format!("http://{GATEWAY}:{}/", netlab::HOST_LOOPBACK_PORT))
        );
        let out = lab_exec_ok(&lab, &h, opts, &script);
        assert!(!out.contains(HOST_BODY), "{who} read a host service: {out}");
        let r = probe_results(&out);
        assert_eq!(r[&targets[0]], "ECONNREFUSED", "{who}: 127.0.0.1 is the job's own loopback: {out}");
        assert_eq!(r[&targets[1]], "EACCES", "{who}: the host's address is prohibited in the job: {out}");
        for t in &targets[2..] {
            assert!(blocked(&r[t]), "{who}: {t}: {out}");
        }
    }
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t22_job_cannot_connect_to_the_hosts_abstract_unix_sockets() {
    require_root!();
    let lab = or_skip!(NetLab::new());
    let h = home("net-abstract");
    let tok = toks(&[&format!("connect-abstract:{}", lab.abstract_name())]);
    // The control: in the host's network namespace the socket is there.
    let out = lab_exec_ok(&lab, &h, &["--network", "host"], &probe(&tok));
    assert_eq!(out, expect(&tok, |_| "OK".into()));
    wait_until("the host socket's accept", Duration::from_secs(5), || lab.abstract_accepts() == 1);
    for (who, opts) in USERS {
        for mode in ["isolated", "none"] {
            let out = lab_exec_ok(&lab, &h, &[opts, &["--network", mode]].concat(), &probe(&tok));
            assert_eq!(out, expect(&tok, |_| "ECONNREFUSED".into()), "{who} --network {mode}");
        }
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(lab.abstract_accepts(), 1, "no job got through");
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t23_job_cannot_reach_another_slots_listener() {
    require_root!();
    let lab = or_skip!(NetLab::new());
    let h = home("net-slots");
    // Slot A: a listener on all its addresses, its address and a self-check printed.
    let a = ListeningJob::v4(&lab, &h, "slot-a-secret");
    let addr = a.addr.clone();
    // Slot B, at the same time: A's address, the gateway, the host's address.
    for (who, opts) in USERS {
        let targets = toks(&[
            &format!("connect-tcp:{addr}:9000"),
            &format!("connect-tcp:{GATEWAY}:9000"),
            &format!("connect-tcp:{HOST_IP}:9000"),
        ]);
        let script = format!("{}; {}", probe(&targets), get(&format!("http://{addr}:9000/")));
        let out = lab_exec_ok(&lab, &h, opts, &script);
        assert!(!out.contains("slot-a-secret"), "{who} reached slot A: {out}");
        let r = probe_results(&out);
        for t in &targets {
            assert!(blocked(&r[t]), "{who}: {t}: {out}");
        }
    }
    a.stop();
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t24_metadata_service_is_blocked_unless_allowed() {
    require_root!();
    let lab = or_skip!(NetLab::new());
    let h = home("net-metadata");
    let url = format!("http://{}/", netlab::METADATA_IP);
    let tok = toks(&[&format!("connect-tcp:{}:80", netlab::METADATA_IP)]);
    for (who, opts) in USERS {
        let out = lab_exec_ok(&lab, &h, opts, &format!("{}; {}", probe(&tok), get(&url)));
        assert!(!out.contains(METADATA_BODY), "{who}: {out}");
        assert_eq!(probe_results(&out)[&tok[0]], "EACCES", "{who}: {out}");
    }
    // An operator's allow entry opens it (rootless: the address alone; pasta cannot
    // limit it to a port).
    let allow = if rootless() { netlab::METADATA_IP.to_string() } else { format!("{}:80", netlab::METADATA_IP) };
    let out = lab_exec_ok(&lab, &h, &["--network-allow", &allow], &get(&url));
    assert!(out.contains(METADATA_BODY), "--network-allow {allow}: {out}");
    if !rootless() {
        // Only that port: another one is refused by the host's table (nothing listens
        // there, which would say ECONNREFUSED).
        let other = toks(&[&format!("connect-tcp:{}:81", netlab::METADATA_IP)]);
        let out = lab_exec_ok(&lab, &h, &["--network-allow", &allow], &probe(&other));
        assert_eq!(probe_results(&out)[&other[0]], "EHOSTUNREACH", "{out}");
    } else {
        let o = lab_exec(&lab, &h, &["--network-allow", "169.254.169.254:80"], "true");
        assert_eq!(o.code, 125, "{}", o.err);
        assert!(o.err.contains("cannot be limited to a port") && o.err.lines().count() == 1, "{}", o.err);
    }
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t25_job_cannot_change_its_network_even_as_root() {
    require_root!();
    let lab = or_skip!(NetLab::new());
    let h = home("net-admin");
    let script = format!(
        "ip route del default 2>&1; ip addr add 10.87.9.9/32 dev eth0 2>&1; ip route del prohibit 169.254.0.0/16 2>&1; \
         ip link set eth0 down 2>&1; {}",
        get(&format!("http://{INTERNET_IP}/"))
    );
    let out = lab_exec_ok(&lab, &h, &[], &script);
    assert_eq!(out.matches("Operation not permitted").count(), 4, "{out}");
    assert!(out.contains(INTERNET_BODY), "its network is unchanged: {out}");
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t26_network_none_is_loopback_only() {
    require_root!();
    let lab = or_skip!(NetLab::new());
    let h = home("net-none");
    let tok = toks(&[&format!("connect-tcp:{INTERNET_IP}:80")]);
    let out = lab_exec_ok(&lab, &h, &["--network", "none"], &format!("ls /sys/class/net; {}", probe(&tok)));
    assert_eq!(out, format!("lo\n{}", expect(&tok, |_| "ENETUNREACH".into())));
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t27_no_network_state_is_left_after_jobs_a_kill_9_and_gc() {
    require_root!();
    let lab = or_skip!(NetLab::new());
    let h = home("net-residue");
    lab_exec_ok(&lab, &h, &[], "true");
    let forward_before_gc = lab.host_ip_forward();
    // A job killed with its `exec` (SIGKILL: nothing of ours runs), then gc.
    let m = unique("net-kill9");
    let mut job = HostProc(
        h.lab_command(&lab)
            .args(["exec", "--rootfs", "esc", "--", "sh", "-c"])
            .arg(format!("sleep 60; echo {m}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // The job's own shell, not the `exec` command line or the lab's wrapper (an `sh -c`)
    // that name the marker too (a kill before the job's record is made leaves a staging
    // record gc keeps for a minute).
    let job_runs = || processes_matching(&m).iter().any(|(_, cmd)| cmd.starts_with("sh -c sleep 60; "));
    wait_until("the job to run", Duration::from_secs(30), job_runs);
    job.0.kill().unwrap();
    job.0.wait().unwrap();
    let out = h.lab_command(&lab).arg("gc").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    wait_until("the job's processes to be gone", Duration::from_secs(10), || processes_matching(&m).is_empty());
    // And its helper (it dies with its exec, by PDEATHSIG, a moment later): gc is for what
    // dead runs left, not for a teardown still under way.
    let home_dir = h.dir.to_str().unwrap().to_string();
    wait_until("the job's helper to be gone", Duration::from_secs(10), || processes_matching(&home_dir).is_empty());
    let out = h.lab_command(&lab).arg("gc").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(lab.host_network_residue(), Vec::<String>::new(), "links or the table left in the fake host");
    if rootless() {
        assert_eq!(forward_before_gc, "0", "rootless jobs change nothing on the host");
    } else {
        assert_eq!(forward_before_gc, "1", "root mode: forwarding on while the table exists");
    }
    assert_eq!(lab.host_ip_forward(), "0", "IPv4 forwarding back off with the table");
    assert!(processes_matching(h.dir.to_str().unwrap()).is_empty(), "processes of this home left (pasta?)");
    h.assert_no_residue(&[]);
}

#[test]
fn t28_bad_network_input_gets_one_line() {
    let h = TestHome::new("net-bad");
    for (args, want) in [
        (vec!["--network", "bridge"], "invalid value 'bridge' for '--network <MODE>'"),
        (vec!["--network-allow", "metadata"], "bad --network-allow entry 'metadata': use an IPv4 address"),
        (vec!["--network-allow", "[fe80::1]:80"], "network_allow takes IPv4 addresses only"),
    ] {
        let out = h.command().args(["exec", "--rootfs", "esc"]).args(&args).args(["--", "true"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let cfg = h.dir.join("config.toml");
    std::fs::write(&cfg, "url = \"https://dev.azure.com/o\"\npool = \"p\"\nnetwork = \"bridge\"\n").unwrap();
    let out = h.command().args(["run", "--config"]).arg(&cfg).arg("--token-file=/nonexistent").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown network mode 'bridge': use isolated (the default), none or host"), "{err}");
    assert_eq!(err.lines().filter(|l| l.contains("error")).count(), 1, "{err}");
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t40_another_dnat_rule_of_the_host_opens_nothing_to_jobs() {
    require_root!();
    let lab = or_skip!(NetLab::new());
    let h = home("net-foreign-dnat");
    // The host's own port forwards (a Kubernetes node's ClusterIPs, an operator's rule):
    // to one of its addresses and to its loopback. They count what they translate.
    let rules = format!(
        "table ip foreign {{ chain pre {{ type nat hook prerouting priority dstnat; policy accept;\n\
         ip daddr 198.18.200.1 tcp dport 443 counter dnat to {HOST_IP}:{any}\n\
         ip daddr 198.18.200.2 tcp dport 80 counter dnat to 127.0.0.1:{lo}\n}}\n}}\n",
        any = netlab::HOST_ANY_PORT,
        lo = netlab::HOST_LOOPBACK_PORT
    );
    let nft = |args: &[&str], input: Option<&str>| {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", lab.host_path().display())).arg("nft").args(args);
        c.stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() }).stdout(Stdio::piped());
        let mut child = c.spawn().expect("nft");
        if let Some(text) = input {
            std::io::Write::write_all(&mut child.stdin.take().unwrap(), text.as_bytes()).unwrap();
        }
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "nft {args:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    nft(&["-f", "-"], Some(&rules));
    for (who, opts) in USERS {
        let targets = toks(&["connect-tcp:198.18.200.1:443", "connect-tcp:198.18.200.2:80"]);
        let out = lab_exec_ok(&lab, &h, opts, &probe(&targets));
        let r = probe_results(&out);
        for t in &targets {
            assert!(blocked(&r[t]), "{who}: {t}: {out}");
        }
    }
    // The rules did translate the jobs' connections (root mode: the host's table then
    // dropped them); pasta's connections leave from the host itself, past no prerouting
    // (but not past the host's `nat` output rules: SECURITY.md, left).
    let counted = nft(&["list", "table", "ip", "foreign"], None);
    if !rootless() {
        assert!(!counted.contains("counter packets 0 "), "both rules met the jobs' packets: {counted}");
    }
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t41_dns_works_through_a_hosts_resolver_on_a_cloud_address() {
    require_root!();
    // GCP's resolver is on the metadata address, Azure's on its host endpoint: both are
    // refused to jobs, but their port 53 is what the gateway forwards to.
    for resolver in [netlab::METADATA_IP, netlab::AZURE_HOST_IP] {
        let mut lab = or_skip!(NetLab::new());
        lab.resolve_through(resolver).expect("the fake host's resolver");
        let h = home("net-cloud-dns");
        for (who, opts) in USERS {
            let script = format!(
                "{}; grep nameserver /etc/resolv.conf; {}",
                get(&format!("http://{INTERNET_NAME}/")),
                get(&format!("http://{resolver}/"))
            );
            let out = lab_exec_ok(&lab, &h, opts, &script);
            assert_eq!(out.matches(INTERNET_BODY).count(), 1, "{who}, resolver {resolver}: {out}");
            assert!(out.contains(&format!("nameserver {GATEWAY}")), "{who}, resolver {resolver}: {out}");
            assert!(!out.contains(METADATA_BODY) && !out.contains(netlab::WIRESERVER_BODY), "{who}: {out}");
        }
        h.assert_no_residue(&[]);
    }
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t42_azures_host_endpoint_is_blocked_unless_allowed() {
    require_root!();
    let lab = or_skip!(NetLab::new());
    let h = home("net-wireserver");
    let url = format!("http://{}/", netlab::AZURE_HOST_IP);
    let tok = toks(&[&format!("connect-tcp:{}:80", netlab::AZURE_HOST_IP)]);
    // The control: the fake host itself reaches it.
    let out = lab_exec_ok(&lab, &h, &["--network", "host"], &get(&url));
    assert!(out.contains(netlab::WIRESERVER_BODY), "{out}");
    for (who, opts) in USERS {
        let out = lab_exec_ok(&lab, &h, opts, &format!("{}; {}", probe(&tok), get(&url)));
        assert!(!out.contains(netlab::WIRESERVER_BODY), "{who}: {out}");
        assert_eq!(probe_results(&out)[&tok[0]], "EACCES", "{who}: {out}");
    }
    let allow = if rootless() { netlab::AZURE_HOST_IP.to_string() } else { format!("{}:80", netlab::AZURE_HOST_IP) };
    let out = lab_exec_ok(&lab, &h, &["--network-allow", &allow], &get(&url));
    assert!(out.contains(netlab::WIRESERVER_BODY), "--network-allow {allow}: {out}");
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t43_a_table_that_lets_any_dnat_in_is_said_once_and_gc_makes_it_anew() {
    require_root!();
    root_mode_only!();
    let lab = or_skip!(NetLab::new());
    let h = home("net-old-dnat");
    // The table as the version before t40's fix made it, as far as a job uses it: its
    // comment (IPv6 rules, no "own-dnat"), its map and sets, and the input rule that let
    // any DNAT'd connection in. The helper only checks that the table exists.
    let old = "table inet azp-sandbox { comment \"azp-sandbox jobs: subnet 10.87.0.0/16, ipv6\"\n\
               map host_services { type inet_proto . inet_service : ipv4_addr; }\n\
               set allow_port { type devgroup . ipv4_addr . inet_service; }\n\
               set allow_addr { type devgroup . ipv4_addr; }\n\
               chain input { type filter hook input priority filter; policy accept;\n\
               iifname \"azp*\" ct status dnat accept\n}\n}\n";
    let mut nft =
        Command::new("ip").args(["netns", "exec", &lab.host, "nft", "-f", "-"]).stdin(Stdio::piped()).spawn().unwrap();
    std::io::Write::write_all(&mut nft.stdin.take().unwrap(), old.as_bytes()).unwrap();
    assert!(nft.wait().unwrap().success(), "{old}");
    let o = lab_exec(&lab, &h, &["--network", "none"], "true");
    assert_eq!(o.code, 0, "{}", o.err);
    assert!(!o.err.contains("older azp-sandbox"), "a job without the table says nothing: {}", o.err);
    let o = lab_exec(&lab, &h, &[], "true");
    assert_eq!(o.code, 0, "{}", o.err);
    let said: Vec<&str> = o.err.lines().filter(|l| l.contains("made by an older azp-sandbox")).collect();
    assert_eq!(said.len(), 1, "{}", o.err);
    assert!(said[0].contains("other DNAT rules") && said[0].contains("run `azp-sandbox gc`"), "{}", o.err);
    // A forwarded proxy port adds its elements to that table too (it has no set of its
    // own forwards' targets: that line is left out, not the job).
    let o = lab_exec(&lab, &h, &["--env", "http_proxy=http://127.0.0.1:3128"], "echo $http_proxy");
    assert_eq!(o.code, 0, "{}", o.err);
    assert_eq!(o.out.trim(), format!("http://{GATEWAY}:3128"), "{}", o.err);
    // gc removes it (no job left); the next job makes the current table, and says nothing.
    let out = h.lab_command(&lab).arg("gc").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let o = lab_exec(&lab, &h, &[], "true");
    assert_eq!(o.code, 0, "{}", o.err);
    assert!(!o.err.contains("older azp-sandbox"), "{}", o.err);
    let listed = lab.host_jobs_table();
    assert!(listed.contains("own-dnat") && listed.contains("@service_targets accept"), "{listed}");
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t60_a_table_made_without_the_flow_limits_says_so_to_every_later_job() {
    require_root!();
    root_mode_only!();
    // As on a kernel without nft_connlimit: the transaction that counts each job's
    // connections (and rates its new flows and DNS) fails.
    a_refused_limit(RefusedLimit {
        name: "net-no-connlimit",
        refused: "ct count",
        first: "jobs' connections and DNS are not limited",
        kept: ("ipv6, own-dnat, nexthops", "job_nexthops4"),
        gone: ("flow", "job_flows"),
        later: "does not limit each job's tracked connections, how fast it opens them, or its DNS queries",
    });
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t61_a_table_made_without_the_next_hop_limit_says_so_to_every_later_job() {
    require_root!();
    root_mode_only!();
    // As on a kernel (or nftables) without the routing expression's next hop: the
    // transaction that bounds each job's new next hops fails (t58).
    a_refused_limit(RefusedLimit {
        name: "net-no-nexthop",
        refused: "rt ip nexthop",
        first: "how many of the host's neighbours a job makes it resolve is not limited",
        kept: ("ipv6, own-dnat, flows, flow-rate, dns-rate", "job_flows"),
        gone: ("nexthops", "job_nexthops4"),
        later: "does not limit how many of the host's neighbours each job makes it resolve",
    });
}

/// A limit the kernel refuses, for [`a_refused_limit`].
struct RefusedLimit {
    name: &'static str,
    /// What the refused transaction holds (and no other).
    refused: &'static str,
    /// The warning of the run that makes the table.
    first: &'static str,
    /// What the table's comment and listing still have, and what they no longer have.
    kept: (&'static str, &'static str),
    gone: (&'static str, &'static str),
    /// The warning of each later run.
    later: &'static str,
}

/// Runs a job through an nft test double (in the runner's own mount namespace) that
/// fails the transaction with `limit.refused` as such a kernel does, and passes the rest
/// to the real nft. The table's comment used to name every limit anyway: only the run
/// that made the table said one was missing. Now the table is made again without it in
/// its comment, and every later run says so; after `gc`, the next job (real nft) makes
/// the whole table.
fn a_refused_limit(limit: RefusedLimit) {
    let lab = or_skip!(NetLab::new());
    let h = home(limit.name);
    let nft = azp_sandbox::sandbox::network::firewall::nft().unwrap();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{}-{}", limit.name, std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let real = dir.join("nft.real");
    std::fs::copy(&nft, &real).unwrap();
    let fake = dir.join("nft");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\nin=$(cat)\ncase \"$in\" in *'{}'*)\n  \
             echo 'Error: Could not process rule: No such file or directory' >&2; exit 1 ;;\nesac\n\
             printf '%s\\n' \"$in\" | exec '{}' \"$@\"\n",
            limit.refused,
            real.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, fs::Permissions::from_mode(0o755)).unwrap();
    let mut refusing = lab.host_command("sh", None);
    refusing.args(["-c", r#"mount --bind "$0" "$1" && shift && exec "$@""#]).arg(&fake).arg(&nft).arg(bin());
    refusing.arg("--home").arg(&h.dir).env_remove("AZP_SANDBOX_HOME").env_remove("AZP_SANDBOX_IPV6");
    let o = exec_as(refusing, &[], &get(&format!("http://{INTERNET_IP}/")));
    assert_eq!(o.code, 0, "{}", o.err);
    assert!(o.out.contains(INTERNET_BODY), "the table works without the limit: {}", o.out);
    assert!(o.err.contains(limit.first), "{}", o.err);
    let listed = lab.host_jobs_table();
    let comment = listed.lines().find(|l| l.contains("comment")).unwrap_or_default();
    assert!(comment.contains(limit.kept.0) && !comment.contains(limit.gone.0), "{listed}");
    assert!(listed.contains(limit.kept.1) && !listed.contains(limit.gone.1), "{listed}");
    // Every later run says so (once each), with the fix.
    for _ in 0..2 {
        let o = lab_exec(&lab, &h, &[], "true");
        assert_eq!(o.code, 0, "{}", o.err);
        let said: Vec<&str> = o.err.lines().filter(|l| l.contains(limit.later)).collect();
        assert_eq!(said.len(), 1, "{}", o.err);
        assert!(said[0].contains("refused a limit") && said[0].contains("run `azp-sandbox gc`"), "{}", o.err);
    }
    // Once the kernel has it: gc, and the next job makes the whole table.
    let out = h.lab_command(&lab).arg("gc").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let o = lab_exec(&lab, &h, &[], "true");
    assert_eq!(o.code, 0, "{}", o.err);
    assert!(!o.err.contains("does not limit") && !o.err.contains("not limited"), "{}", o.err);
    let listed = lab.host_jobs_table();
    assert!(listed.contains("own-dnat, flows, flow-rate, dns-rate, nexthops"), "{listed}");
    let _ = std::fs::remove_dir_all(&dir);
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t62_a_jobs_udp_port_takes_nothing_it_did_not_ask_for() {
    require_root!();
    let lab = or_skip!(NetLab::new());
    let h = home("net-udp-inbound");
    // A job that sent one datagram from its port must get the answers of the address it
    // sent to, and nothing else: not what host processes send to that port on the
    // host's loopback (a metrics or syslog client's datagrams), nor what the LAN or the
    // internet sends to the host's address there. Rootless, pasta sends a job's
    // datagrams from a host socket bound to the same port on all the host's addresses,
    // which receives from anyone (a red-team pass, by reading pasta's source).
    const PORT: u16 = 40123;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sender = |ns: PathBuf, to: &'static str| {
        let stop = stop.clone();
        std::thread::spawn(move || {
            netlab::enter(&ns);
            let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let _ = s.send_to(b"unasked", (to, PORT));
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let senders =
        [sender(lab.host_path(), "127.0.0.1"), sender(lab.host_path(), HOST_IP), sender(lab.internet_path(), HOST_IP)];
    // One datagram to the fake internet's discard port (nobody answers), then 2.5 s of
    // listening; and what an answering far end sends back still comes in.
    const ANSWERING: u16 = 7792;
    let _far_end = lab.internet_udp_answerer(INTERNET_IP, ANSWERING);
    let listen = toks(&[&format!("udp-recv:{PORT}:2500:{INTERNET_IP}:9")]);
    let asked = toks(&[&format!("udp-recv:{PORT}:500:{INTERNET_IP}:{ANSWERING}")]);
    for (who, opts) in USERS {
        let out = lab_exec_ok(&lab, &h, opts, &probe(&listen));
        assert_eq!(probe_results(&out)[&listen[0]], "0", "{who}: datagrams nobody was asked for came in: {out}");
        let out = lab_exec_ok(&lab, &h, opts, &probe(&asked));
        let answers: u32 = probe_results(&out)[&asked[0]].parse().unwrap();
        assert!(answers > 0, "{who}: the far end's answer did not come in: {out}");
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for s in senders {
        s.join().unwrap();
    }
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t64_a_rootless_job_tracks_no_more_than_its_share_of_the_hosts_connections() {
    require_root!();
    if !rootless() {
        return common::skip::skip(
            "root mode: nothing is tracked in the job's namespace; the host's table counts (t50)",
        );
    }
    let lab = or_skip!(NetLab::new());
    let h = home("net-rootless-flows");
    // t62's rule tracks connections in the job's own namespace, in the host's one
    // conntrack table: a job sending to new ports, on its loopback or through pasta,
    // filled it (a review, by reading). Its loopback is not tracked now, and it keeps
    // at most its share of the table (1/64 of nf_conntrack_max, as a root-mode job).
    let max = sysctl_number("net/netfilter/nf_conntrack_max");
    let limit = (max / 64).max(256);
    let flows = toks(&["udp-flows:127.0.0.1:3000", &format!("udp-flows:{INTERNET_IP}:{}", limit + 200)]);
    let script = format!("{}; echo tracked=$(cat /proc/sys/net/netfilter/nf_conntrack_count)", probe(&flows));
    let out = lab_exec_ok(&lab, &h, &[], &script);
    let r = probe_results(&out);
    assert_eq!(r[&flows[0]], "OK", "its loopback: {out}");
    assert_eq!(r[&flows[1]], "EPERM", "refused past its share: {out}");
    let tracked: u64 = out.lines().find_map(|l| l.strip_prefix("tracked=")).unwrap().trim().parse().unwrap();
    assert!(limit - 16 <= tracked && tracked <= limit + 16, "{tracked} tracked, its share {limit}: {out}");
    // A one-way stream is one flow (its packets after the first are no new flows to
    // rate or count: a review), and a new flow after it is let through.
    let stream =
        toks(&[&format!("udp-stream:{INTERNET_IP}:9:{}", limit + 1000), &format!("udp-flows:{INTERNET_IP}:1")]);
    let out = lab_exec_ok(&lab, &h, &[], &probe(&stream));
    let r = probe_results(&out);
    assert_eq!((r[&stream[0]].as_str(), r[&stream[1]].as_str()), ("OK", "OK"), "{out}");
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t65_a_connection_that_outlives_its_job_keeps_no_link_on_the_host() {
    require_root!();
    root_mode_only!("rootless: a job's network is its pasta, it has no link on the host");
    let lab = or_skip!(NetLab::new());
    let h = home("net-orphan");
    // A socket closed with data still to send lives on, orphaned, while its far end keeps
    // its window shut (or stops answering: a firewall reload), minutes here; it holds the
    // job's network namespace and so its link (a CI rehearsal: a `run`'s last job kept
    // its link past gc's 30 s wait for dying links, and with it the host's table). The job writes more
    // than its socket and the far end take, then its writer is killed.
    const PORT: u16 = 5001;
    let _sink = lab.internet_tcp_sink(INTERNET_IP, PORT);
    let script = format!("head -c 16000000 /dev/zero | timeout 2 nc {INTERNET_IP} {PORT}; echo writer-gone");
    let out = lab_exec_ok(&lab, &h, &[], &script);
    assert!(out.contains("writer-gone"), "{out}");
    let links: Vec<String> = lab.host_network_residue().into_iter().filter(|r| r.starts_with("link ")).collect();
    assert_eq!(links, Vec::<String>::new(), "the job's link outlived it");
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t67_a_jobs_orphaned_connections_end_with_it() {
    require_root!();
    let lab = or_skip!(NetLab::new());
    let h = home("net-orphans");
    // Sockets a job closed with data still to send live on past it, orphaned, while their
    // far ends keep their windows shut: minutes. Each counts in the node's one budget of
    // orphans (net.ipv4.tcp_max_orphans, no namespace has one of its own; past it every
    // TCP close of the node with data unsent is a reset) and keeps its buffers after the
    // job's memory limit is gone (a red-team class: a job left 200, still there 20 s
    // later, and a slot's jobs one after another add them up). The far end sees them as
    // connections still open. Rootless, they are its pasta's host sockets as well.
    const PORT: u16 = 5002;
    const N: usize = 40;
    let sink = lab.internet_tcp_sink(INTERNET_IP, PORT);
    let orphans_before = node_tcp_orphans();
    let writer = format!("(head -c 4000000 /dev/zero | timeout 2 nc {INTERNET_IP} {PORT}) &");
    let script = format!("for i in $(seq {N}); do {writer} done; wait; echo writers-gone");
    let out = lab_exec_ok(&lab, &h, &[], &script);
    assert!(out.contains("writers-gone"), "{out}");
    assert_eq!(sink.accepted(), N, "the job's connections reached the far end");
    // Aborted with the job: the far end gets a reset for each (in flight for a moment).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while sink.established() > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(sink.established(), 0, "connections of the job that outlived it, still open");
    // Nor orphaned on the way (root: in the job's namespace; rootless: there and in its
    // pasta's host sockets). The count is the node's: other tests' sockets come and go
    // meanwhile, so only what would be most of the job's 40 is taken for a leak.
    let added = node_tcp_orphans().saturating_sub(orphans_before);
    assert!(added < N as u64 / 2, "the node has {added} more orphaned TCP sockets after the job");
    let links: Vec<String> = lab.host_network_residue().into_iter().filter(|r| r.starts_with("link ")).collect();
    assert_eq!(links, Vec::<String>::new(), "the job's link outlived it");
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t44_a_socket_bound_to_the_jobs_link_is_blocked_as_any_other() {
    require_root!();
    let lab = or_skip!(NetLab::new());
    let h = home("net-bound");
    // SO_BINDTODEVICE (anyone's since Linux 5.7) makes the kernel take a prohibit route's
    // failed lookup for "on the link": the packet left, and pasta connected from the host
    // (a red-team pass read the metadata service and the host's pages, rootless).
    let bound = |target: &str| format!("connect-tcp-dev:{target}:eth0");
    let (meta, azure) = (format!("{}:80", netlab::METADATA_IP), format!("{}:80", netlab::AZURE_HOST_IP));
    let host_any = format!("{HOST_IP}:{}", netlab::HOST_ANY_PORT);
    let targets = toks(&[&bound(&meta), &bound(&azure), &bound(&host_any)]);
    // The host's loopback: refused in the job's namespace, not sent off its own loopback
    // (rootless, pasta would take it; see t45 for root mode).
    let loopback = toks(&[&bound(&format!("127.0.0.1:{}", netlab::HOST_LOOPBACK_PORT))]);
    // The control: bound, the fake internet answers (the bind itself works).
    let control = toks(&[&bound(&format!("{INTERNET_IP}:80"))]);
    for (who, opts) in USERS {
        let script = format!("{}; {}; {}", probe(&control), probe(&targets), probe(&loopback));
        let out = lab_exec_ok(&lab, &h, opts, &script);
        let r = probe_results(&out);
        assert_eq!(r[&control[0]], "OK", "{who}: the bound socket reaches the internet: {out}");
        for t in &targets {
            assert!(blocked(&r[t]), "{who}: {t}: {out}");
        }
        assert!(refused_here(&r[&loopback[0]]), "{who}: {out}");
    }
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t45_a_flushed_host_table_leaves_the_jobs_own_table() {
    require_root!();
    root_mode_only!();
    let lab = or_skip!(NetLab::new());
    let h = home("net-flushed");
    // A UDP service of the fake host on its loopback, counting what it gets: the host end's
    // `route_localnet` (for the gateway's DNS forward) takes in what is sent to 127/8.
    const UDP_PORT: u16 = 7779;
    let bound = toks(&[
        &format!("connect-tcp-dev:{HOST_IP}:{}:eth0", netlab::HOST_ANY_PORT),
        &format!("connect-tcp-dev:127.0.0.1:{}:eth0", netlab::HOST_LOOPBACK_PORT),
        &format!("send-udp-dev:127.0.0.1:{UDP_PORT}:eth0"),
    ]);
    let plain = toks(&[&format!("connect-tcp:{HOST_IP}:{}", netlab::HOST_ANY_PORT)]);
    let udp = lab.udp_counter("127.0.0.1", UDP_PORT);
    for (who, opts) in USERS {
        // After the flush: the host's address, plainly and from a socket bound to the
        // job's link, and the host's loopback from such a socket.
        let out = after_a_flush(&lab, &h, opts, who, &format!("{}; {}", probe(&plain), probe(&bound)));
        let r = probe_results(&out);
        assert_eq!(r[&plain[0]], "EACCES", "{who}: its routes: {out}");
        assert!(blocked(&r[&bound[0]]), "{who}: its own table: {out}");
        // Found by a red-team pass: the SYN left (ETIMEDOUT), the datagram arrived.
        for t in &bound[1..] {
            assert!(refused_here(&r[t]), "{who}: {t}: {out}");
        }
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(udp.count(), 0, "{who}: the host's loopback got it: {out}");
    }
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t46_broadcast_and_multicast_reach_no_host_service_after_a_flush() {
    require_root!();
    root_mode_only!();
    let lab = or_skip!(NetLab::new());
    let h = home("net-bcast");
    // A UDP service of the fake host on all its addresses, counting what it gets.
    const PORT: u16 = 7778;
    // The limited broadcast, the host's subnet's directed broadcast, a multicast group.
    let targets = toks(&[
        &format!("send-udp:255.255.255.255:{PORT}"),
        &format!("send-udp:{}:{PORT}", netlab::HOST_SUBNET_BROADCAST),
        &format!("send-udp:224.0.0.1:{PORT}"),
    ]);
    let udp = lab.udp_counter("0.0.0.0", PORT);
    // The control: the host's own broadcasts reach it, both (a job in the host's network).
    lab_exec_ok(&lab, &h, &["--network", "host"], &probe(&targets[..2]));
    wait_until("the control's datagrams", Duration::from_secs(5), || udp.count() >= 2);
    udp.reset();
    for (who, opts) in USERS {
        // After the flush, the job's own table must refuse what the host's no longer does.
        let out = after_a_flush(&lab, &h, opts, who, &probe(&targets));
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(udp.count(), 0, "{who}: the host's service got them: {out}");
    }
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t47_what_the_host_delivers_to_itself_is_out_of_reach_also_when_it_comes_mid_job() {
    require_root!();
    let lab = or_skip!(NetLab::new());
    let h = home("net-new-addr");
    // The fake host's service on all addresses answers on each of these:
    // - BEFORE: an address on loopback with a prefix, there before the job (the kernel
    //   makes the whole /24 local: any of its addresses is the host's);
    // - NEW: an address the fake host gets while the job runs (a VPN, a bridge coming
    //   up, DHCP), on a link of its own (a veth pair: this kernel has no dummy links);
    // - NEW_LO: another loopback prefix, while the job runs;
    // - MAIN, MAIN_NEW: local routes an operator put in the main table (AnyIP there),
    //   before and while the job runs: every lookup reaches them too (found by a red-team
    //   pass: the watch read the local table alone).
    // Rootless jobs reached all three through pasta: their routes and table listed the
    // host's addresses of the job's start only. So did root-mode jobs once a firewall
    // reload flushed the fake host's whole ruleset (the jobs' table with it) while they
    // ran, where the job's own routes, table and watch are what is left (found by a
    // read-through): root mode has a round with that flush too.
    const BEFORE: (&str, &str) = ("198.18.210.1/24", "198.18.210.9");
    const NEW: (&str, &str) = ("198.18.200.1/24", "198.18.200.1");
    const NEW_LO: (&str, &str) = ("198.18.220.1/24", "198.18.220.9");
    const MAIN: (&str, &str) = ("198.18.230.0/24", "198.18.230.9");
    const MAIN_NEW: (&str, &str) = ("198.18.240.0/24", "198.18.240.9");
    const LINK: &str = "t47late";
    const PEER: &str = "t47peer";
    let port = netlab::HOST_ANY_PORT;
    // Root mode, where the host's table drops these (3 s per probe till its timeout): the
    // plain connects only, and not the main table's, but after a flush (the job refuses
    // them at once).
    let targets = |bound: bool| -> Vec<String> {
        let main = if bound { [MAIN.1, MAIN_NEW.1].as_slice() } else { &[] };
        [BEFORE.1, NEW.1, NEW_LO.1]
            .iter()
            .chain(main)
            .flat_map(|a| [format!("connect-tcp:{a}:{port}"), format!("connect-tcp-dev:{a}:{port}:eth0")])
            .filter(|t| bound || !t.starts_with("connect-tcp-dev"))
            .collect()
    };
    let ip = |args: &[&str]| lab.host_ip(args);
    let serves = |addr: &str| host_serves(&lab, addr, port);
    let main_route = |verb: &str, net: &str| ip(&["route", verb, "local", net, "dev", "lo", "table", "main"]);
    ip(&["addr", "add", BEFORE.0, "dev", "lo"]);
    main_route("add", MAIN.0);
    for a in [BEFORE.1, MAIN.1] {
        assert!(serves(a), "the control: the fake host's service on {a}");
    }
    for (who, opts, flushed) in rounds_with_a_flush() {
        let flag = flag_dir(&format!("new-addr-{who}-{flushed}"));
        let m = unique("t47");
        let targets = targets(rootless() || flushed);
        // After the probes, the control: the job's network still works (after a flush
        // unmasqueraded: the fake internet routes the jobs' subnet back).
        let page = if rootless() || flushed { get(&format!("http://{}:{port}/", NEW.1)) } else { ":".into() };
        let script = format!(
            ": {m}; while [ ! -e /flag/added ]; do sleep 0.05; done; {}; {page}; {}",
            probe(&targets),
            get(&format!("http://{INTERNET_IP}/"))
        );
        let vol = format!("{}:/flag", flag.display());
        let mut c = h.lab_command(&lab);
        c.args(["exec", "--rootfs", "esc", "--volume", &vol]).args(opts.iter()).args(["--", "sh", "-c", &script]);
        let mut job = HostProc(c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap());
        let log = JobLog::of(&mut job);
        wait_until("the job to run", Duration::from_secs(30), || job_shell_runs(&m));
        if flushed {
            lab.flush_host_ruleset();
        }
        ip(&["link", "add", LINK, "type", "veth", "peer", "name", PEER]);
        ip(&["addr", "add", NEW.0, "dev", LINK]);
        ip(&["link", "set", PEER, "up"]);
        ip(&["link", "set", LINK, "up"]);
        ip(&["addr", "add", NEW_LO.0, "dev", "lo"]);
        main_route("add", MAIN_NEW.0);
        for a in [NEW.1, NEW_LO.1, MAIN_NEW.1] {
            assert!(serves(a), "the control: the fake host's service on {a}");
        }
        // The helper says what it refused (root mode too, where the host's table drops
        // them first).
        log.wait_for_refusals(&[NEW.1, "198.18.220.0/24", MAIN_NEW.0], who);
        std::fs::write(flag.join("added"), "").unwrap();
        let (status, out, log) = log.finish(&mut job);
        ip(&["link", "del", LINK]);
        ip(&["addr", "del", NEW_LO.0, "dev", "lo"]);
        main_route("del", MAIN_NEW.0);
        let round = format!("{who} (flushed: {flushed})");
        assert!(status.success(), "{round}: {out} {log}");
        assert!(out.contains(INTERNET_BODY), "{round}: the job's network still works: {out}");
        assert!(!out.contains(HOST_BODY), "{round} read the host's service: {out}");
        let r = probe_results(&out);
        for t in &targets {
            assert!(blocked(&r[t]), "{round}: {t}: {out}");
        }
        if flushed {
            // gc turns off what the table had turned on (the next job makes it again).
            let gc = h.lab_command(&lab).arg("gc").output().unwrap();
            assert!(gc.status.success(), "{}", String::from_utf8_lossy(&gc.stderr));
        }
        std::fs::remove_dir_all(&flag).unwrap();
    }
    ip(&["addr", "del", BEFORE.0, "dev", "lo"]);
    main_route("del", MAIN.0);
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t49_after_a_flush_an_address_allowed_on_one_port_stays_closed_on_the_others() {
    require_root!();
    root_mode_only!();
    let lab = or_skip!(NetLab::new());
    let h = home("net-allow-port");
    // `network_allow` names the metadata service's port 80 only. Its route cannot say
    // ports, and once a firewall reload took the host's table away the job's own table
    // is what holds them: it accepted the whole address (found by a red-team pass: the
    // job then reached every port of it, here a refusal from the fake internet's host).
    let meta = netlab::METADATA_IP;
    let other = toks(&[&format!("connect-tcp:{meta}:81"), &format!("connect-tcp-dev:{meta}:81:eth0")]);
    let allow = format!("{meta}:80");
    for (who, opts) in USERS {
        let args: Vec<&str> = ["--network-allow", allow.as_str()].into_iter().chain(opts.iter().copied()).collect();
        let script = format!("{}; {}", get(&format!("http://{meta}/")), probe(&other));
        let out = after_a_flush(&lab, &h, &args, who, &script);
        // The control: the allowed port answers (unmasqueraded after the flush: the fake
        // internet routes the jobs' subnet back).
        assert!(out.contains(METADATA_BODY), "{who}: the allowed port: {out}");
        let r = probe_results(&out);
        for t in &other {
            assert!(refused_here(&r[t]), "{who}: {t}: {out}");
        }
    }
    h.assert_no_residue(&[]);
}

/// How many tracked connections a job may keep: 1/64 of the host's conntrack table, at
/// least 256 (`firewall::flows_per_job`, read when the table is made).
fn flows_per_job() -> u64 {
    let max = sysctl_number("net/netfilter/nf_conntrack_max");
    (max / 64).max(256)
}

/// How many new flows the fake host's jobs table refused in `chain` (`over_flows`: over
/// a job's limit of tracked connections, `over_rate`: over its rate of new ones;
/// `over_dns`: packets over its rate to the gateway's DNS), from
/// the counter of the chain's reject rule; 0 where the chain is absent.
fn refused_by(lab: &NetLab, chain: &str) -> u64 {
    let o = Command::new("ip")
        .args(["netns", "exec", &lab.host, "nft", "list", "chain", "inet", "azp-sandbox", chain])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    text.split("counter packets ").nth(1).and_then(|t| t.split_whitespace().next()).map_or(0, |n| n.parse().unwrap())
}

/// The fake host's count of tracked connections (its conntrack table, shared by its
/// own connections and every job's).
fn host_conntrack_count(lab: &NetLab) -> u64 {
    let o = Command::new("ip")
        .args(["netns", "exec", &lab.host, "cat", "/proc/sys/net/netfilter/nf_conntrack_count"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim().parse().unwrap()
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t50_a_job_cannot_fill_the_hosts_connection_tracking() {
    require_root!();
    // Rootless jobs have no host table: pasta opens their flows as its own sockets.
    root_mode_only!();
    let lab = or_skip!(NetLab::new());
    let h = home("net-flows");
    // The host's table masquerades the jobs' flows: each is an entry of the host's one
    // conntrack table, and a full table drops every new connection of the host and of
    // the other slots (a red-team pass, by reading). A job may keep 1/64 of it.
    lab_exec_ok(&lab, &h, &[], "true");
    let limit = flows_per_job();
    let flood = toks(&[&format!("udp-flows:{INTERNET_IP}:{}", limit + 1000)]);
    let after = toks(&[&format!("connect-tcp:{INTERNET_IP}:80")]);
    let before = host_conntrack_count(&lab);
    let script = format!("{}; {}", probe(&flood), probe(&after));
    let job = WaitingJob::start_as(&h, h.lab_command(&lab), &[], &[], &script);
    let grew = host_conntrack_count(&lab) - before;
    let out = job.before.clone();
    let r = probe_results(&out);
    assert_eq!(r[&flood[0]], "OK", "{out}");
    assert!(grew <= limit, "the job holds {grew} of the host's tracked connections, over its {limit}: {out}");
    assert!(grew + 64 >= limit, "the flood went out: {grew} tracked of {limit}: {out}");
    // Over its limit, a new connection is refused at once, not left to time out.
    assert_eq!(r[&after[0]], "EHOSTUNREACH", "{out}");
    // Every flow over the limit was refused by the table, as its counters say (the rate
    // refuses what comes after the job's burst, before it is counted: see t54). A few
    // more new flows of the job's own may be among them (its link's IPv6 start).
    let refused = refused_by(&lab, "over_flows") + refused_by(&lab, "over_rate");
    assert!((1001..=1001 + 8).contains(&refused), "the 1000 flows over the limit and the connect: {refused}: {out}");
    assert!(job.finish().success());
    // Its entries go with it (a review: a server of the job's that kept answering kept
    // them tracked for days after it, and jobs one after another filled the table).
    let left = host_conntrack_count(&lab).saturating_sub(before);
    assert!(left < 64, "{left} of the job's tracked connections outlived it");
    // The next job connects.
    let out = lab_exec_ok(&lab, &h, &[], &probe(&after));
    assert_eq!(probe_results(&out)[&after[0]], "OK", "{out}");
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t54_a_job_at_its_limit_cannot_keep_the_host_counting() {
    require_root!();
    // Rootless jobs have no host table: pasta opens their flows as its own sockets.
    root_mode_only!();
    let lab = or_skip!(NetLab::new());
    let h = home("net-flow-rate");
    // The kernel counts a job's connections (connlimit) by walking its whole list, a
    // conntrack lookup each, at a new flow once per tick, in softirq, charged to no
    // cgroup: a job holding its limit (16384 then) that sent 1000 new datagrams a second
    // kept 0.8-1.5 of this VM's 2 CPUs busy (bench/flow_count_cost.sh, bench/NOTES.md). Past
    // a burst of its limit, a job's new flows are now rated before they are counted.
    lab_exec_ok(&lab, &h, &[], "true");
    let limit = flows_per_job();
    let fill = toks(&[&format!("udp-flows:{INTERNET_IP}:{limit}")]);
    let more = toks(&[&format!("udp-flows:{INTERNET_IP}:1000")]);
    let started = std::time::Instant::now();
    let out = lab_exec_ok(&lab, &h, &[], &format!("{}; {}", probe(&fill), probe(&more)));
    let secs = started.elapsed().as_secs_f64();
    let r = probe_results(&out);
    assert_eq!((r[&fill[0]].as_str(), r[&more[0]].as_str()), ("OK", "OK"), "{out}");
    let (counted, rated) = (refused_by(&lab, "over_flows"), refused_by(&lab, "over_rate"));
    // All 1000 were refused; of them the count saw only what the rate let through in the
    // job's time (100 a second, and the bucket's own second), not all 1000.
    assert!(
        (1000..=1000 + 8).contains(&(counted + rated)),
        "refused over the limit {counted}, over the rate {rated} (1000 and a few of the link's own): {out}"
    );
    let let_through = (100.0 * (secs + 1.0)) as u64 + 16;
    assert!(counted <= let_through, "{counted} new flows were counted in {secs:.1} s, over {let_through}: {out}");
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t55_a_jobs_one_way_stream_is_one_flow_to_its_limits() {
    require_root!();
    // Rootless jobs have no host table: pasta opens their flows as its own sockets.
    root_mode_only!();
    let lab = or_skip!(NetLab::new());
    let h = home("net-stream");
    // A flow is "new" to conntrack until its first reply: a job's one-way UDP stream
    // (statsd, syslog, RTP) met t54's rate with every datagram, and past the burst (the
    // job's limit) all but 100 a second were refused (a review). Now only a flow's first
    // packet meets the rate and the count.
    const PORT: u16 = 7795;
    let udp = lab.internet_udp_counter(INTERNET_IP, PORT);
    let n = flows_per_job() + 1000;
    let stream = toks(&[&format!("udp-stream:{INTERNET_IP}:{PORT}:{n}")]);
    let out = lab_exec_ok(&lab, &h, &[], &probe(&stream));
    assert_eq!(probe_results(&out)[&stream[0]], "OK", "{out}");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while (udp.count() as u64) < n && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let (refused, dropped) = (refused_by(&lab, "over_rate"), lab.internet_udp_drops(PORT));
    assert_eq!(
        udp.count() as u64,
        n,
        "refused over the rate {refused}, dropped by the counter's socket {dropped}: {out}"
    );
    assert_eq!(refused_by(&lab, "over_rate") + refused_by(&lab, "over_flows"), 0, "{out}");
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t56_a_job_cannot_keep_the_hosts_resolver_to_itself() {
    require_root!();
    // Rootless jobs have no host table: pasta opens their flows as its own sockets.
    root_mode_only!();
    let lab = or_skip!(NetLab::new());
    let h = home("net-dns-rate");
    // Every query after a flow's first rides that flow: neither the rate of new flows nor
    // the count sees it, and a job that sent queries as fast as it could from one socket
    // had the host's one resolver (the host's, the agents', every slot's) to itself (a
    // red-team pass, by reading). Each job's packets (and bytes) to port 53 are now rated.
    lab_exec_ok(&lab, &h, &[], "true");
    let flood = toks(&[&format!("udp-stream:{GATEWAY}:53:3000")]);
    let started = std::time::Instant::now();
    let out = lab_exec_ok(
        &lab,
        &h,
        &[],
        &format!("{}; sleep 1; {}", probe(&flood), get(&format!("http://{INTERNET_NAME}/"))),
    );
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(probe_results(&out)[&flood[0]], "OK", "{out}");
    // The burst (1000) and 200 a second of the job's time reached the resolver, the rest
    // was dropped; a lookup a second later works (the bucket filled again).
    let dropped = refused_by(&lab, "over_dns");
    let passed_at_most = 1000 + (200.0 * (secs + 1.0)) as u64 + 16;
    assert!(dropped + passed_at_most >= 3000, "only {dropped} of 3000 dropped in {secs:.1} s: {out}");
    // However slow the job: the flood itself takes ~1 s, so ~1800 are dropped.
    assert!(dropped >= 500, "only {dropped} of 3000 dropped: {out}");
    assert!(out.contains(INTERNET_BODY), "a lookup by name after the flood: {out}");
    h.assert_no_residue(&[]);
}

/// How many entries the fake host's neighbour table has on `link` for addresses that
/// begin with `prefix` (any state: an unresolved one holds its place as a resolved one).
fn neighbours(lab: &NetLab, link: &str, prefix: &str) -> usize {
    let o = Command::new("ip").args(["-n", &lab.host, "neigh", "show", "dev", link]).output().unwrap();
    String::from_utf8_lossy(&o.stdout).lines().filter(|l| l.starts_with(prefix)).count()
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t58_a_job_cannot_fill_the_hosts_neighbour_table() {
    require_root!();
    // Rootless jobs have no host table: pasta opens their flows as its own sockets.
    root_mode_only!();
    let lab = or_skip!(NetLab::new());
    // Jobs reach what the host routes to, its LAN included. A datagram to each unused
    // address of a prefix on the host's uplink made the host resolve each one (ARP, a
    // broadcast each), and resending on the same flows (neither rated nor counted after
    // their first packet) kept them unresolved: the kernel's neighbour table (1024
    // entries by default, shared by every namespace of the host) filled, and the host
    // could no longer reach new neighbours, its router's included once its entry went
    // stale (a red-team pass, by reading). The prefix: one routed on the fake host's
    // uplink, clear of the lab's own addresses: nobody answers for them there.
    lab.host_ip(&["route", "add", "198.18.4.0/22", "dev", &lab.host_uplink()]);
    spray_neighbours(
        &lab,
        "net-neigh",
        "198.18.4.1",
        "198.18.4.",
        &get(&format!("http://{INTERNET_IP}/")),
        INTERNET_BODY,
    );
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t59_a_job_cannot_fill_the_hosts_ipv6_neighbour_table() {
    require_root!();
    root_mode_only!();
    let lab = or_skip!(NetLab::new_v6());
    // t58 over IPv6: the uplink's /64 (2001:2:0:1::/64 in the lab; a router
    // advertisement's prefix on a real host), neighbour discovery instead of ARP.
    let fetch = format!(
        "echo v6=$(printf 'GET / HTTP/1.0\\r\\n\\r\\n' | timeout 4 nc {} 80 2>&1 | grep -c {INTERNET_BODY})",
        netlab::DUAL_IPV6
    );
    spray_neighbours(&lab, "net6-neigh", "2001-2-0-1--a-0", "2001:2:0:1::a:", &fetch, "v6=1");
}

/// A job of a new home of `name` that runs `fetch` (whose output has `fetched` once it
/// worked), sends a datagram to each of 300 addresses from `first` up six times a
/// second apart, then runs `fetch` again; meanwhile the test samples the fake host's
/// neighbour entries on its uplink for addresses that begin with `prefix`. At most the
/// job's burst (32) and one a second of its time may be there, the rest dropped and
/// counted; `fetch` works both times (the router is one next hop).
fn spray_neighbours(lab: &NetLab, name: &str, first: &str, prefix: &str, fetch: &str, fetched: &str) {
    let h = home(name);
    let uplink = lab.host_uplink();
    const SPRAY: usize = 300;
    let spray = toks(&[&format!("udp-hosts:{first}:{SPRAY}:6:1000")]);
    let script = format!("{fetch}; {}; {fetch}", probe(&spray));
    let mut c = h.lab_command(lab);
    c.args(["exec", "--rootfs", "esc", "--", "sh", "-c", &script]);
    let started = std::time::Instant::now();
    let mut job = HostProc(c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap());
    let mut most = 0;
    while job.0.try_wait().unwrap().is_none() {
        most = most.max(neighbours(lab, &uplink, prefix));
        std::thread::sleep(Duration::from_millis(50));
    }
    let secs = started.elapsed().as_secs_f64();
    let o = job.output();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{out} {}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(probe_results(&out)[&spray[0]], "OK", "{out}");
    most = most.max(neighbours(lab, &uplink, prefix));
    // The job's first 32 new next hops at once, then one a second of its time; each is
    // remembered 30 s (longer than the job).
    let bound = 32 + secs.ceil() as usize + 2;
    let refused = refused_by(lab, "over_nexthops");
    eprintln!(
        "{name}: the host resolved {most} of the job's {SPRAY} neighbours in {secs:.1} s; {refused} packets dropped"
    );
    assert!(most <= bound, "the host resolved {most} of the job's {SPRAY} neighbours in {secs:.1} s, over {bound}");
    assert!(refused > 0, "{out}");
    assert_eq!(out.matches(fetched).count(), 2, "{out}");
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t51_an_exec_makes_the_hosts_table_again_after_a_firewall_reload() {
    require_root!();
    // Rootless jobs have no host table: pasta's sockets are the host's own.
    root_mode_only!();
    let lab = or_skip!(NetLab::new());
    let h = home("net-kept");
    // A firewall reload (Debian's nftables.conf begins with `flush ruleset`) takes the
    // jobs' table, and with it their masquerade: an `exec` (a slurm batch run, a long
    // build, an interactive shell) sent the rest of its job's connections from the job's
    // own address, which no real network routes back. Seen at the fake internet as each
    // datagram's source.
    const PORT: u16 = 7780;
    let udp = lab.internet_udp_counter(INTERNET_IP, PORT);
    for terminal in [false, true] {
        udp.reset();
        let (sources, log) = reload_under(&lab, &h, &udp, terminal, PORT);
        // Masqueraded again, to the end (a datagram of the reload's window leaves
        // unmasqueraded, and so may a later one whose random source port is one of
        // those: conntrack keeps their entries 30 s; so the last three are what counts).
        let host: std::net::IpAddr = HOST_IP.parse().unwrap();
        let n = sources.len();
        assert!(
            n >= 3 && sources[n - 3..].iter().all(|s| *s == host),
            "terminal {terminal}: no datagram left from the host's address after the reload: {sources:?} {log}"
        );
        assert!(log.contains("was removed while jobs run"), "terminal {terminal}: the exec says what happened: {log}");
        if terminal {
            // The caller's terminal is raw while the job runs: the exec's own lines end
            // with a carriage return too, or the next one begins where this one ended.
            assert!(log.contains("were dropped\r\n"), "the exec's line on a raw terminal: {log:?}");
        }
    }
    let gc = h.lab_command(&lab).arg("gc").output().unwrap();
    assert!(gc.status.success(), "{}", String::from_utf8_lossy(&gc.stderr));
    h.assert_no_residue(&[]);
}

/// [`t51_an_exec_makes_the_hosts_table_again_after_a_firewall_reload`]'s job (on a
/// terminal of its own with `terminal`): the fake host's ruleset flushed as it starts,
/// then a datagram to the fake internet's `port` every 50 ms (a new socket each) until
/// the last three came from the fake host's address (15 s at most). What came from
/// where, and the exec's log.
fn reload_under(
    lab: &NetLab,
    h: &TestHome,
    udp: &netlab::UdpCounter,
    terminal: bool,
    port: u16,
) -> (Vec<std::net::IpAddr>, String) {
    let m = unique("kept");
    let flag = flag_dir(&m);
    let send = probe(&toks(&[&format!("send-udp:{INTERNET_IP}:{port}")]));
    let script = format!(
        ": {m}; while [ ! -e /flag/flushed ]; do sleep 0.05; done; i=0; \
         while [ ! -e /flag/done ] && [ $i -lt 400 ]; do {send} >/dev/null; sleep 0.05; i=$((i+1)); done"
    );
    let vol = format!("{}:/flag", flag.display());
    let mut c = h.lab_command(lab);
    c.args(["exec", "--rootfs", "esc", "--volume", &vol]);
    if terminal {
        c.arg("-t");
    }
    c.args(["--", "sh", "-c", &script]);
    enum Running {
        Piped(HostProc),
        Terminal(common::pty::PtySession),
    }
    let mut job = match terminal {
        false => Running::Piped(HostProc(c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap())),
        true => Running::Terminal(common::pty::PtySession::spawn(c, 24, 80)),
    };
    wait_until("the job to run", Duration::from_secs(30), || job_shell_runs(&m));
    lab.flush_host_ruleset();
    std::fs::write(flag.join("flushed"), "").unwrap();
    let host: std::net::IpAddr = HOST_IP.parse().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let masqueraded = || {
        let s = udp.sources();
        s.len() >= 3 && s[s.len() - 3..].iter().all(|a| *a == host)
    };
    while !masqueraded() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::write(flag.join("done"), "").unwrap();
    let (ok, log) = match &mut job {
        Running::Piped(p) => {
            let o = p.output();
            (o.status.success(), String::from_utf8_lossy(&o.stderr).into_owned())
        }
        Running::Terminal(t) => {
            let (st, out) = t.wait(Duration::from_secs(30));
            (st.success(), out)
        }
    };
    assert!(ok, "terminal {terminal}: {log}");
    std::fs::remove_dir_all(&flag).unwrap();
    (udp.sources(), log)
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t52_a_killed_jobs_tracked_connections_go_with_its_clean_up() {
    require_root!();
    // Rootless jobs have no host table: pasta opens their flows as its own sockets.
    root_mode_only!();
    let lab = or_skip!(NetLab::new());
    let h = home("net-flows-killed");
    // Each helper forgets its job's tracked connections at the job's end (t50). One
    // killed first (`kill -9` of the exec, which its helper follows; of a `run`) did not,
    // and they stayed in the host's conntrack table for as long as the far ends kept
    // them alive, past `gc` (a read-through of t50's fix).
    // Within the job's limit (1024 on a host whose conntrack table holds 65536).
    let flows = 2000.min(flows_per_job() - 64);
    let flood = toks(&[&format!("udp-flows:{INTERNET_IP}:{flows}")]);
    lab_exec_ok(&lab, &h, &[], "true");
    let before = host_conntrack_count(&lab);
    let mut job = WaitingJob::start_as(&h, h.lab_command(&lab), &[], &[], &probe(&flood));
    assert_eq!(probe_results(&job.before)[&flood[0]], "OK", "{}", job.before);
    assert!(host_conntrack_count(&lab) >= before + flows, "the flood went out");
    job.child.kill().unwrap(); // SIGKILL
    job.child.wait().unwrap();
    // The kill alone leaves them (unanswered UDP is tracked for 30 s, answered longer).
    std::thread::sleep(Duration::from_millis(300));
    let left = host_conntrack_count(&lab).saturating_sub(before);
    assert!(left + 64 >= flows, "only {left} of the job's {flows} tracked connections outlived the kill");
    let gc = h.lab_command(&lab).arg("gc").output().unwrap();
    let said = String::from_utf8_lossy(&gc.stderr).into_owned();
    assert!(gc.status.success(), "{said}");
    let after = host_conntrack_count(&lab).saturating_sub(before);
    assert!(after < 64, "{after} of the killed job's tracked connections outlived gc: {said}");
    assert!(said.contains("tracked connections of the job"), "gc says what it removed: {said}");
    assert_eq!(lab.connection_markers(), Vec::<String>::new(), "{said}");
    h.assert_no_residue(&[]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t53_a_job_on_a_killed_jobs_address_gets_none_of_its_connections() {
    require_root!();
    // Rootless jobs have no host table: pasta opens their flows as its own sockets.
    root_mode_only!();
    let lab = or_skip!(NetLab::new());
    let (killed, heir) = (home("net-heir-killed"), home("net-heir"));
    // A killed job's tracked connections outlive it until a clean-up finds its record
    // (t52), and its address is free again once its link is gone: a job of another
    // home (or a `run`'s) that got the address first got the replies its far ends still
    // sent, and could send on those connections (a read-through of t52's fix).
    const PORT: u16 = 7790;
    const SOURCE: u16 = 7791;
    let _far_end = lab.internet_udp_answerer(INTERNET_IP, PORT);
    let hello = toks(&[&format!("udp-recv:{SOURCE}:500:{INTERNET_IP}:{PORT}")]);
    let mut job = WaitingJob::start_as(&killed, killed.lab_command(&lab), &[], &[], &probe(&hello));
    let answers: u32 = probe_results(&job.before)[&hello[0]].parse().unwrap();
    assert!(answers > 0, "the far end answers the job: {}", job.before);
    let address = job_addresses(&lab);
    assert_eq!(address.len(), 1, "{address:?}");
    let address = address[0];
    job.child.kill().unwrap(); // SIGKILL
    job.child.wait().unwrap();
    wait_until("the killed job's link to go", Duration::from_secs(30), || job_addresses(&lab).is_empty());
    // Every other address of the jobs' subnet taken (by a link named as a job's: the
    // subnet's check passes it), so that the next job gets the killed job's.
    let taken = "azp0000000000ff";
    lab.host_ip(&["link", "add", taken, "type", "veth", "peer", "name", "heir-peer"]);
    lab.host_ip(&["link", "set", taken, "up"]);
    let subnet = azp_sandbox::sandbox::network::DEFAULT_SUBNET;
    let batch = heir.dir.join("routes");
    let mut routes = String::new();
    for n in 2..subnet.size() as u32 - 1 {
        if subnet.nth(n) != address {
            routes.push_str(&format!("route add {}/32 dev {taken}\n", subnet.nth(n)));
        }
    }
    std::fs::write(&batch, routes).unwrap();
    lab.host_ip(&["-batch", batch.to_str().unwrap()]);
    // The fake host's ARP to job links held until the heir's helper forgot the killed
    // job's connections (its marker gone), as a busy host's can be by chance between the
    // claim of the address and the job's end coming up: what the host forwarded to the
    // address meanwhile waited for an answer, and reached the job at ARP's next try (up
    // to a second later), after its start (a failure of CI).
    let markers = lab.connection_markers();
    assert_eq!(markers.len(), 1, "the killed job's marker: {markers:?}");
    let hold = lab.hold_arp_to_job_links();
    let release = std::thread::spawn({
        let (dir, marker) = (lab.connection_markers_dir(), markers[0].clone());
        move || {
            wait_until("the heir's helper to forget", Duration::from_secs(60), || !markers_in(&dir).contains(&marker));
            drop(hold);
        }
    });
    let listen = toks(&[&format!("udp-recv:{SOURCE}:2500")]);
    let got = lab_exec(&lab, &heir, &[], &probe(&listen));
    assert_eq!(got.code, 0, "{}{}", got.out, got.err);
    release.join().unwrap();
    lab.host_ip(&["link", "del", taken]);
    assert_eq!(probe_results(&got.out)[&listen[0]], "0", "the killed job's far end reached the next job: {}", got.err);
    assert!(got.err.contains("a killed job left on this job's address"), "the exec says what it forgot: {}", got.err);
    for h in [&killed, &heir] {
        let gc = h.lab_command(&lab).arg("gc").output().unwrap();
        assert!(gc.status.success(), "{}", String::from_utf8_lossy(&gc.stderr));
        h.assert_no_residue(&[]);
    }
    assert_eq!(lab.connection_markers(), Vec::<String>::new());
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn t57_a_killed_jobs_link_goes_with_its_clean_up_while_its_namespace_is_held() {
    require_root!();
    // Rootless jobs have no link on the host.
    root_mode_only!();
    let lab = or_skip!(NetLab::new());
    let h = home("net-held-ns");
    // The kernel removes a job's link with its namespace, in one worker that tears down
    // every namespace of the host in turn: on a busy host a killed job's link outlived
    // gc's wait for it, and the host's table stayed (t16, once in a CI rehearsal). A
    // namespace that something still holds (here the test's fd; an operator's nsenter, a
    // monitoring agent) kept it for as long, with the table.
    let token = unique("held-ns");
    let mut job = WaitingJob::start_as(&h, h.lab_command(&lab), &[], &[], &format!(": {token}"));
    let shell = processes_matching(&token).into_iter().find(|(_, cmd)| cmd.starts_with("sh -c"));
    let pid = shell.expect("the job's shell").0;
    let held = fs::File::open(format!("/proc/{pid}/ns/net")).unwrap();
    assert_eq!(job_addresses(&lab).len(), 1, "the job's link");
    job.child.kill().unwrap(); // SIGKILL
    job.child.wait().unwrap();
    wait_until("the killed job's processes to go", Duration::from_secs(30), || processes_matching(&token).is_empty());
    let gc = h.lab_command(&lab).arg("gc").output().unwrap();
    let said = String::from_utf8_lossy(&gc.stderr).into_owned();
    assert!(gc.status.success(), "{said}");
    assert_eq!(lab.host_network_residue(), Vec::<String>::new(), "gc: {said}");
    assert!(said.contains("the kernel had not removed it with the job's namespace yet"), "gc says so: {said}");
    assert_eq!(lab.connection_markers(), Vec::<String>::new(), "{said}");
    h.assert_no_residue(&[]);
    drop(held);
}

/// The addresses of the jobs now in the lab: each job link's host route.
fn job_addresses(lab: &NetLab) -> Vec<std::net::Ipv4Addr> {
    let o = Command::new("ip").args(["-n", &lab.host, "-4", "-o", "route", "show", "scope", "link"]).output().unwrap();
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.contains(" dev azp") && !l.contains('/'))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

/// The node's orphaned TCP sockets (`/proc/net/sockstat`'s `orphan`, one count for every
/// namespace).
fn node_tcp_orphans() -> u64 {
    let text = fs::read_to_string("/proc/net/sockstat").unwrap();
    let line = text.lines().find(|l| l.starts_with("TCP:")).unwrap();
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "orphan").unwrap();
    words[at + 1].parse().unwrap()
}
