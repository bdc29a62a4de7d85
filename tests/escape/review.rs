// ---------------------------------------------------------------------------------------
// r. The review of issues 19, 20, 23 and 25 after they were merged together: attacks on
// the seams between a job's user namespace, its network namespace and its sysfs, run as
// classes (every raw way onto the wire; every way to the host over IPv6). Root mode and,
// in the rootless pass, rootless.
//
// These attacks need calls the suite's probe has no token for (a socket's protocol, an
// IPv6 connect with a scope), so they use a second static probe of their own, bound
// read-only into the job at `/review`, with `,` between arguments (IPv6 addresses hold
// `:`).
// ---------------------------------------------------------------------------------------

use super::*;
use common::netlab::{self, NetLab};

const RPROBE_C: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <sys/socket.h>
#include <unistd.h>

static const char *ename(int e) {
  static char b[16];
  switch (e) {
    case EPERM: return "EPERM";
    case EACCES: return "EACCES";
    case EINVAL: return "EINVAL";
    case EAFNOSUPPORT: return "EAFNOSUPPORT";
    case EPROTONOSUPPORT: return "EPROTONOSUPPORT";
    case ESOCKTNOSUPPORT: return "ESOCKTNOSUPPORT";
    case ENETUNREACH: return "ENETUNREACH";
    case EHOSTUNREACH: return "EHOSTUNREACH";
    case ETIMEDOUT: return "ETIMEDOUT";
    case ECONNREFUSED: return "ECONNREFUSED";
    case EADDRNOTAVAIL: return "EADDRNOTAVAIL";
    case ENODEV: return "ENODEV";
    case ENOTTY: return "ENOTTY";
    case EIO: return "EIO";
  }
  snprintf(b, sizeof b, "E%d", e);
  return b;
}

/* A TCP connect to [addr%ifname]:port, 3 s at most. */
static int conn6(const char *addr, const char *port, const char *ifname) {
  struct sockaddr_in6 sa = {0};
  sa.sin6_family = AF_INET6;
  sa.sin6_port = htons(atoi(port));
  if (inet_pton(AF_INET6, addr, &sa.sin6_addr) != 1) { errno = EINVAL; return -1; }
  if (ifname) sa.sin6_scope_id = if_nametoindex(ifname);
  int s = socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (s < 0) return -1;
  if (connect(s, (struct sockaddr *)&sa, sizeof sa) == 0) return 0;
  if (errno != EINPROGRESS) return -1;
  struct pollfd p = { .fd = s, .events = POLLOUT };
  if (poll(&p, 1, 3000) == 0) { errno = ETIMEDOUT; return -1; }
  int err = 0; socklen_t l = sizeof err;
  getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &l);
  if (err) { errno = err; return -1; }
  return 0;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    char tok[512];
    snprintf(tok, sizeof tok, "%s", argv[i]);
    char *a[5] = {0};
    int n = 0;
    char *save = NULL;
    for (char *p = strtok_r(argv[i], ",", &save); p && n < 5; p = strtok_r(NULL, ",", &save)) a[n++] = p;
    const char *op = a[0] ? a[0] : "";
    long r;
    errno = 0;
    if (!strcmp(op, "sock") && n == 4) r = socket(atoi(a[1]), atoi(a[2]), atoi(a[3]));
    else if (!strcmp(op, "conn6") && n >= 3) r = conn6(a[1], a[2], a[3]);
    else if (!strcmp(op, "tiocsti") && n == 2) { char c = '#'; r = ioctl(atoi(a[1]), TIOCSTI, &c); }
    else if (!strcmp(op, "isatty") && n == 2) r = isatty(atoi(a[1])) ? 0 : -1;
    else if (!strcmp(op, "stopinit")) {
      /* Seize the job's init and hold it stopped for ever (the last token). */
      r = ptrace(PTRACE_SEIZE, 1, 0, 0);
      if (r == 0) r = ptrace(PTRACE_INTERRUPT, 1, 0, 0);
      if (r == 0) { int st; waitpid(1, &st, __WALL); }
      if (r == 0) { printf("%s: OK\n", tok); fflush(stdout); for (;;) pause(); }
    }
    else { printf("%s: BADTOKEN\n", tok); continue; }
    if (r < 0) printf("%s: %s\n", tok, ename(errno));
    else printf("%s: OK\n", tok);
    fflush(stdout);
  }
  return 0;
}
"#;

/// The dir holding the compiled probe (`rprobe`), for `--volume DIR:/review`.
fn rprobe_dir() -> PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let tag = &sha256_hex(RPROBE_C.as_bytes())[..12];
        let dir = fixtures().join(format!("review-probe-{tag}"));
        if !dir.join("rprobe").exists() {
            let tmp = fixtures().join(format!("review-probe-{tag}.partial-{}", std::process::id()));
            fs::create_dir_all(&tmp).unwrap();
            fs::write(tmp.join("rprobe.c"), RPROBE_C).unwrap();
            let o = Command::new("cc")
                .args(["-static", "-O1", "-Wall", "-o"])
                .arg(tmp.join("rprobe"))
                .arg(tmp.join("rprobe.c"))
                .output()
                .expect("cannot run cc: install build-essential (scripts/setup.sh)");
            assert!(o.status.success(), "cannot compile the review probe: {}", String::from_utf8_lossy(&o.stderr));
            fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755)).unwrap();
            match fs::rename(&tmp, &dir) {
                Ok(()) => {}
                // Another test binary made it first.
                Err(_) if dir.join("rprobe").exists() => drop(fs::remove_dir_all(&tmp)),
                Err(e) => panic!("cannot move the review probe into place: {e}"),
            }
        }
        dir
    })
    .clone()
}

fn rprobe(tokens: &[String]) -> String {
    format!("/review/rprobe {}", tokens.join(" "))
}

fn volume() -> String {
    format!("{}:/review", rprobe_dir().display())
}

/// `exec --rootfs esc --volume <probe>:/review OPTS -- sh -c SCRIPT` in the lab's fake host.
fn exec_in(lab: &NetLab, h: &TestHome, opts: &[&str], script: &str) -> String {
    let volume = volume();
    lab_exec_ok(lab, h, &[&["--volume", &volume], opts].concat(), script)
}

/// Every raw way onto the wire (ARP/NDP spoofing of the gateway, forged source
/// addresses, frames to the other side of the link): AF_PACKET, raw IPv4 and IPv6
/// sockets, AF_XDP. A job has no CAP_NET_RAW over any network namespace, as root of its
/// own user namespace included, in every network mode; AF_XDP, which the host kernel
/// has, is not even a family the filter lets through.
#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn r01_job_gets_no_raw_socket_in_any_network_mode() {
    require_root!();
    let lab = or_skip!(NetLab::new());
    let h = home("rv-raw");
    let want = [
        ("sock,17,3,768", "EPERM"),      // AF_PACKET, SOCK_RAW, ETH_P_ALL
        ("sock,17,2,2054", "EPERM"),     // AF_PACKET, SOCK_DGRAM, ETH_P_ARP
        ("sock,2,3,1", "EPERM"),         // AF_INET, SOCK_RAW, ICMP
        ("sock,2,3,255", "EPERM"),       // AF_INET, SOCK_RAW, IPPROTO_RAW (forged headers)
        ("sock,10,3,58", "EPERM"),       // AF_INET6, SOCK_RAW, ICMPv6 (NDP)
        ("sock,44,3,0", "EAFNOSUPPORT"), // AF_XDP
        ("sock,2,1,0", "OK"),            // the control: TCP
    ];
    // The host kernel has each family (root on the host gets the socket): the job's
    // refusal is the sandbox's, not a missing module.
    let host = Command::new(rprobe_dir().join("rprobe")).args(want.iter().map(|(t, _)| *t)).output().unwrap();
    let host = probe_results(&String::from_utf8_lossy(&host.stdout));
    for (t, _) in &want {
        if host[*t] != "OK" {
            skip_part(format!("the host kernel refuses {t} to root ({}): the job's refusal proves less", host[*t]));
        }
    }
    let tokens: Vec<String> = want.iter().map(|(t, _)| t.to_string()).collect();
    for (who, user) in USERS {
        for net in ["isolated", "none", "host"] {
            let out = exec_in(&lab, &h, &[user, &["--network", net]].concat(), &rprobe(&tokens));
            let got = probe_results(&out);
            for (t, e) in &want {
                assert_eq!(got.get(*t).map(String::as_str), Some(*e), "{who}, --network {net}, {t}: {out}");
            }
        }
    }
    h.assert_no_residue(&[]);
}

/// The job's end of its link has an IPv6 link-local address (the kernel gives one to
/// every link that comes up): the host's end has one too, from the fixed MAC every
/// job's gateway has (02:61:7a:70:00:01, EUI-64 fe80::61:7aff:fe70:1). A host service
/// on `[::]` must stay out of reach over it, as over IPv4 (root mode: the host's table
/// drops everything from a job link; rootless: pasta runs IPv4 only).
#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn r02_job_cannot_reach_the_host_over_ipv6_link_local() {
    require_root!();
    let lab = or_skip!(NetLab::new());
    let h = home("rv-ll6");
    let port = netlab::HOST_ANY_PORT.to_string();
    // The control: the fake host's server listens on IPv6 too.
    let ctl = lab.host_command(rprobe_dir().join("rprobe"), None).arg(format!("conn6,::1,{port}")).output().unwrap();
    let ctl = String::from_utf8_lossy(&ctl.stdout).into_owned();
    if !ctl.contains(": OK") {
        skip_part(format!("the fake host's server does not answer on [::1]:{port} ({ctl}): r02 proves nothing"));
        return;
    }
    let gen_mode = lab.host_command("cat", None).arg("/proc/sys/net/ipv6/conf/default/addr_gen_mode").output().unwrap();
    if String::from_utf8_lossy(&gen_mode.stdout).trim() != "0" {
        skip_part("the fake host derives link-local addresses other than from the MAC: the gateway's is guessed");
    }
    let gateway_ll = format!("conn6,fe80::61:7aff:fe70:1,{port},eth0");
    let tokens = vec![gateway_ll.clone(), format!("conn6,ff02::1,{port},eth0"), format!("conn6,fe80::1,{port},eth0")];
    for (who, user) in USERS {
        let out = exec_in(&lab, &h, user, &format!("echo ll=$(grep -c eth0 /proc/net/if_inet6); {}", rprobe(&tokens)));
        let got = probe_results(&out);
        for t in &tokens {
            let r = got.get(t).map(String::as_str).unwrap_or("missing");
            assert!(
                ["EHOSTUNREACH", "ETIMEDOUT", "ENETUNREACH", "EACCES", "EADDRNOTAVAIL", "EINVAL", "ECONNREFUSED"]
                    .contains(&r),
                "{who}: {t} -> {r}: {out}"
            );
        }
        // ECONNREFUSED would mean something on the other end answered: only the job's own
        // stack may (it has nothing on the port), never the host.
        assert_ne!(got[&gateway_ll], "ECONNREFUSED", "{who}: the host's end answered: {out}");
    }
    h.assert_no_residue(&[]);
}

/// The job's `/sys` is a sysfs of its own network namespace (mounted by the helper,
/// which owns that namespace): it lists only the job's links, is read-only, and keeps
/// runc's masks (`/sys/firmware`), so swapping the host's `/sys` bind for a fresh sysfs
/// did not open what the bind had closed.
#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn r03_the_jobs_own_sysfs_is_read_only_masked_and_shows_only_its_links() {
    require_root!();
    let lab = or_skip!(NetLab::new());
    let h = home("rv-sysfs");
    for (who, user) in USERS {
        let out = exec_in(
            &lab,
            &h,
            user,
            "echo links=$(ls /sys/class/net | tr '\\n' ' '); echo firmware=$(ls -A /sys/firmware | wc -l); \
             (echo x > /sys/kernel/uevent_helper) 2>/dev/null && echo UEVENT-WRITTEN; \
             (echo 1 > /sys/class/net/eth0/flags) 2>/dev/null && echo FLAGS-WRITTEN; \
             awk '$5 == \"/sys\" {print \"sysopts=\" $6}' /proc/self/mountinfo",
        );
        assert!(out.contains("links=eth0 lo\n"), "{who}: the host's links are not the job's to see: {out}");
        assert!(out.contains("firmware=0\n"), "{who}: /sys/firmware stays masked: {out}");
        assert!(!out.contains("WRITTEN"), "{who}: {out}");
        let opts = out.lines().find_map(|l| l.strip_prefix("sysopts=")).unwrap_or_else(|| panic!("{who}: {out}"));
        assert!(opts.split(',').any(|o| o == "ro"), "{who}: /sys is mounted {opts}: {out}");
    }
    h.assert_no_residue(&[]);
}

/// The other direction: a job's listener must be out of reach of the host's other users
/// too (on a shared node they are strangers to the job, and a job serving a debugger or
/// a build cache on a port must not serve them). Root mode: the host's table refuses
/// what the host itself starts towards a job link; rootless: pasta forwards no port in.
#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes and network namespaces")]
fn r04_host_users_cannot_reach_a_jobs_listener() {
    require_root!();
    let lab = or_skip!(NetLab::new());
    let h = home("rv-inbound");
    let a = ListeningJob::v4(&lab, &h, "job-secret");
    let addr = a.addr.clone();
    // A host user (nobody) and host root, in the fake host.
    for user in [Some((65534, 65534)), None] {
        let o = lab
            .host_command("timeout", user)
            .args(["5", "busybox", "wget", "-q", "-O-", &format!("http://{addr}:9000/")])
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(!out.contains("job-secret"), "host user {user:?} read the job's listener at {addr}:9000");
    }
    a.stop();
    h.assert_no_residue(&[]);
}

/// Issue 20 puts the agent's `--work-dir` "under the same disk quota" as the job's
/// writable layer, and issue 25 says no job may fill the node's disk with no flags. On
/// a home with project quotas (ext4 `prjquota`) or, where the kernel has none, on btrfs
/// with quotas enabled, with the work dir on the same filesystem, a job writes 128 MiB
/// into its work dir with `--disk 32M`: it must stop at its quota.
#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn r05_a_job_cannot_fill_the_work_dirs_filesystem_past_its_disk_quota() {
    require_root!();
    if rootless() {
        skip_part("rootless: jobs have no disk quota at all (e07 checks the warning)");
        return;
    }
    let lab = or_skip!(NetLab::new());
    // Project quotas (ext4 prjquota) where the kernel has them, else btrfs qgroups.
    let (_prj, _btrfs, mnt) = match super::exhaust::QuotaFs::mount(512) {
        Ok(q) => {
            let mnt = q.mnt.clone();
            (Some(q), None, mnt)
        }
        Err(prj) => match super::disk::BtrfsFs::mount(1024, true) {
            Ok(b) => {
                let mnt = b.mnt.clone();
                (None, Some(b), mnt)
            }
            Err(btrfs) => return common::skip::skip(format!("no quota-capable filesystem: {prj}; {btrfs}")),
        },
    };
    let fake = common::fake_azure::FakeAzure::start_in(&lab);
    let h = TestHome { dir: mnt.join("home") };
    fs::create_dir_all(&h.dir).unwrap();
    h.import(&busybox_tar(), "bb");
    let scratch = mnt.join("scratch");
    fs::create_dir_all(&scratch).unwrap();
    let tf = token_file(&h, &fake.pat());
    fake.enqueue_job(
        "dd if=/dev/zero of=/azp/agent/_work/fill bs=1M count=128 2>&1 \
         | grep -oE 'Disk quota exceeded|No space left on device' | head -1\n\
         echo wrote=$(( $(wc -c < /azp/agent/_work/fill) >> 20 ))M\n",
    );
    let mut run = h.lab_command(&lab);
    run.args(["run", "--pool", "gpu", "--url", &fake.url(), "--token-file", tf.to_str().unwrap()])
        .args(["--agents", "1", "--gpus-per-agent", "none", "--rootfs", "bb", "--name-prefix", "rvwork"])
        .args(["--disk", "32M", "--work-dir", scratch.to_str().unwrap()]);
    let mgr = ManagerProc::spawn(run, h.dir.join("manager.log"));
    let results = fake.wait_results(1, Duration::from_secs(180));
    mgr.stop();
    let log = fs::read_to_string(h.dir.join("manager.log")).unwrap_or_default();
    assert!(!results.is_empty(), "no job result in 180 s; the manager's log:\n{log}");
    let out = &results[0].output;
    assert!(
        out.contains("Disk quota exceeded") || out.contains("No space left on device"),
        "the job's writes into its work dir must stop at its 32M quota: {out}"
    );
    if let Some(b) = &_btrfs {
        // The work dir was a subvolume of its own: gone with the job.
        assert_eq!(b.subvolumes(), Vec::<String>::new(), "the job's layer and work dir subvolumes are deleted");
    }
    std::mem::forget(h); // its dir is on the image: the guard unmounts it
}

/// A job started from a terminal without `-t` must not push input into that terminal
/// (TIOCSTI: the caller's shell would run it after the job: the CVE-2016-7545 class). The
/// caller here is `exec` under script(1), whose pty is the caller's controlling terminal.
#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn r06_job_cannot_push_input_into_the_callers_terminal() {
    require_root!();
    let h = home("rv-tiocsti");
    for (who, user) in USERS {
        let mut argv: Vec<String> = vec![bin().display().to_string(), "--home".into(), h.dir.display().to_string()];
        argv.extend(["exec", "--rootfs", "esc", "--volume", &volume()].map(String::from));
        argv.extend(user.iter().map(|s| s.to_string()));
        argv.extend(["--", "/review/rprobe", "isatty,0", "tiocsti,0", "tiocsti,1", "tiocsti,2"].map(String::from));
        let line = argv.iter().map(|a| format!("'{a}'")).collect::<Vec<_>>().join(" ");
        let mut c = Command::new("script");
        c.args(["-qec", &line, "/dev/null"]).stdin(Stdio::null());
        in_machine_namespace(&mut c);
        as_test_user(&mut c);
        let o = c.output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout).replace('\r', "");
        let got = probe_results(&out);
        if got.get("isatty,0").map(String::as_str) != Some("OK") {
            skip_part(format!("{who}: the job's stdin is no terminal under script(1): {out}"));
            continue;
        }
        for t in ["tiocsti,0", "tiocsti,1", "tiocsti,2"] {
            let r = got.get(t).map(String::as_str).unwrap_or("missing");
            assert!(r != "OK" && r != "missing", "{who}: {t} -> {r}: {out}");
        }
    }
    h.assert_no_residue(&[]);
}

/// The job's init is what kills the job when its supervisor dies (its lifeline). A job
/// that seizes its init with ptrace (same uid, no Yama here) and held it stopped used to
/// outlive `kill -9` of `exec` until `gc` ("root: the job (stopinit: OK) outlived kill -9
/// of exec by 1 s"): the init was dumpable and runs as the job's user. The seccomp filter
/// now refuses ptrace and process_vm_writev aimed at pid 1 (`seccomp::init_tamper_rules`),
/// and the init is no longer dumpable (r08). The job must die within a second of `kill -9`
/// of its `exec`.
#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn r07_a_job_that_stops_its_init_still_dies_with_its_supervisor() {
    require_root!();
    use std::io::BufRead;
    let h = home("rv-ptrace");
    for (who, user) in USERS {
        let marker = unique("rv-ptrace");
        let (m1, m2) = marker.split_at(4);
        let script = format!(
            "M1='{m1}'; M2='{m2}'; sh -c 'while :; do sleep 1; done' $M1$M2 & sleep 0.3; /review/rprobe stopinit; wait"
        );
        let mut child = h
            .command()
            .args(["exec", "--rootfs", "esc", "--volume", &volume()])
            .args(user.iter())
            .args(["--", "sh", "-c", &script])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        wait_until("the job's process", Duration::from_secs(10), || !processes_matching(&marker).is_empty());
        child.kill().unwrap(); // SIGKILL
        let killed = Instant::now();
        child.wait().unwrap();
        let mut left = processes_matching(&marker);
        while !left.is_empty() && killed.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(Duration::from_millis(10));
            left = processes_matching(&marker);
        }
        // Clean up before asserting: gc kills what is left.
        let gc = h.run(&["gc"]);
        assert!(gc.status.success(), "{}", String::from_utf8_lossy(&gc.stderr));
        wait_until("gc to end the job", Duration::from_secs(10), || processes_matching(&marker).is_empty());
        assert!(left.is_empty(), "{who}: the job ({}) outlived kill -9 of exec by 1 s: {left:?}", line.trim());
        assert_eq!(line.trim(), "stopinit: EPERM", "{who}: the job may not trace its init");
        eprintln!("{who}: {}", line.trim());
    }
    h.assert_no_residue(&[]);
}

/// The lifeline's other hole: a job of the init's uid could open `/proc/1/mem` and
/// rewrite the init (seccomp cannot tell that open by pid), then outlive its supervisor.
/// The init is not dumpable: without CAP_SYS_PTRACE the open is refused, while the
/// job's own processes (the control: /proc/self/mem) stay open to it.
#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn r08_a_job_cannot_open_its_inits_memory() {
    require_root!();
    let h = home("rv-mem");
    let script =
        "for p in 1 self; do if (exec 3<>/proc/$p/mem) 2>/dev/null; then echo $p:open; else echo $p:refused; fi; done";
    for (who, user) in USERS {
        let out = exec_ok(&h, user, script);
        assert_eq!(out, "1:refused\nself:open\n", "{who}");
    }
    h.assert_no_residue(&[]);
}
