//! A job's own network namespace, made by the sandbox helper before libcontainer
//! creates the container (which inherits it: the spec has no network namespace entry).
//! What goes in it and why is `crate::sandbox::network`'s; here are the privileged steps,
//! each with its own [`Error`] variant:
//!
//! - loopback only ([`Setup::Loopback`], `--network none`): unshare, `lo` up;
//! - a veth pair to the host (root mode, [`Veth`]): a host netlink socket opened first
//!   (it keeps talking to the host's namespace), unshare, the pair created with its host
//!   end in the host's namespace, an address claimed for the job (its host route, added
//!   with `NLM_F_EXCL`, is the lock: the kernel refuses a second), the job's end
//!   configured, the job's routes; with IPv6 ([`Veth6`]) also the host end's IPv6
//!   settings (written through a `/proc/sys/net/ipv6/conf` opened before the unshare,
//!   which keeps naming the host's links), the job's IPv6 address (from its IPv4 one),
//!   its host route and neighbour entry, and the job's IPv6 gateway, routes and blocks;
//! - pasta (rootless, [`Pasta`]): a child forked first, still in the host's namespace,
//!   waits; unshare; (IPv6) no link-local addresses for the namespace's new links; the
//!   child opens the new namespace and becomes pasta; pasta's pid file (a pipe) says
//!   when it is ready; the job's routes.
//!
//! The namespace belongs to the helper's user namespace (the initial one in root mode),
//! in which the job has no CAP_NET_ADMIN: its routes and addresses are out of its reach.

use super::error::{errno_of, Error, Result};
pub use super::job_filter::JobFilter;
use super::netlink::{self as nl, Message, Proto, Socket};
use nix::errno::Errno;
use nix::sched::{unshare, CloneFlags};
use std::io::Read;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

/// An IPv4 network: `addr/prefix` (the address is the network's first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Ipv4Net {
    pub addr: Ipv4Addr,
    pub prefix: u8,
}

impl Ipv4Net {
    pub fn new(addr: Ipv4Addr, prefix: u8) -> Ipv4Net {
        let prefix = prefix.min(32);
        Ipv4Net { addr: Ipv4Addr::from(u32::from(addr) & Self::mask(prefix)), prefix }
    }
    pub fn host(addr: Ipv4Addr) -> Ipv4Net {
        Ipv4Net { addr, prefix: 32 }
    }
    fn mask(prefix: u8) -> u32 {
        if prefix == 0 {
            0
        } else {
            u32::MAX << (32 - prefix as u32)
        }
    }
    pub fn contains(&self, a: Ipv4Addr) -> bool {
        u32::from(a) & Self::mask(self.prefix) == u32::from(self.addr)
    }
    /// True when the two networks share an address.
    pub fn overlaps(&self, other: &Ipv4Net) -> bool {
        let p = self.prefix.min(other.prefix);
        u32::from(self.addr) & Self::mask(p) == u32::from(other.addr) & Self::mask(p)
    }
    /// Whether all of `other` is inside this network.
    pub fn covers(&self, other: &Ipv4Net) -> bool {
        self.prefix <= other.prefix && self.contains(other.addr)
    }
    /// Address number `n` of the network (0 = the network's own).
    pub fn nth(&self, n: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.addr).wrapping_add(n))
    }
    pub fn size(&self) -> u64 {
        1u64 << (32 - self.prefix as u32)
    }
}

impl std::fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// An IPv6 network: `addr/prefix` (the address is the network's first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Ipv6Net {
    pub addr: Ipv6Addr,
    pub prefix: u8,
}

impl Ipv6Net {
    pub fn new(addr: Ipv6Addr, prefix: u8) -> Ipv6Net {
        let prefix = prefix.min(128);
        Ipv6Net { addr: Ipv6Addr::from(u128::from(addr) & Self::mask(prefix)), prefix }
    }
    pub fn host(addr: Ipv6Addr) -> Ipv6Net {
        Ipv6Net { addr, prefix: 128 }
    }
    fn mask(prefix: u8) -> u128 {
        if prefix == 0 {
            0
        } else {
            u128::MAX << (128 - prefix as u32)
        }
    }
    /// Whether all of `other` is inside this network.
    pub fn covers(&self, other: &Ipv6Net) -> bool {
        self.prefix <= other.prefix && self.contains(other.addr)
    }
    pub fn contains(&self, a: Ipv6Addr) -> bool {
        u128::from(a) & Self::mask(self.prefix) == u128::from(self.addr)
    }
}

impl std::fmt::Display for Ipv6Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// A route in the job's namespace besides its default route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum JobRoute {
    /// Refused at once (EACCES): a destination the job must not reach.
    Prohibit(Ipv4Net),
    /// Through the gateway: an allowed destination inside a prohibited one.
    Allow(Ipv4Net),
}

impl std::fmt::Display for JobRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobRoute::Prohibit(n) => write!(f, "prohibit {n}"),
            JobRoute::Allow(n) => write!(f, "{n} via the gateway"),
        }
    }
}

/// Root mode: a veth pair, the host end (`host_name`) unnumbered in the host's
/// namespace, the job's end `eth0` with one address from `pool`, and the `gateway` a
/// fixed address that the host end answers for (a permanent neighbour entry in the job).
/// Neither end asks for the other's MAC: the host end knows the job's end at `job_mac`
/// by a permanent neighbour entry too (see [`job_end_neighbour`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Veth {
    pub host_name: String,
    pub host_mac: [u8; 6],
    pub job_mac: [u8; 6],
    /// The link's group on the host: the key of the job's allowed destinations in the
    /// host's nftables table (0: none).
    pub group: u32,
    pub gateway: Ipv4Addr,
    /// Job addresses are taken from here, trying `pool.nth(first_try)` first.
    pub pool: Ipv4Net,
    pub first_try: u32,
    /// Taken last: a killed job's connections may still be tracked for these (see
    /// `sandbox::network::forget`).
    pub avoid: Vec<Ipv4Addr>,
    pub routes: Vec<JobRoute>,
    /// Held shared from the table check to the veth's creation (gc takes it exclusively
    /// before it removes the table when no job link is left).
    pub lock: PathBuf,
    /// The host's nftables table that filters the job links (must exist).
    pub table: String,
    /// IPv6 for the job too (None: IPv4 only).
    pub v6: Option<Veth6>,
    /// The job's own table, in its namespace (see [`super::job_filter`]): it holds
    /// when the host's table is flushed away.
    pub filter: JobFilter,
}

/// A veth job's IPv6: an address of `prefix` whose last 32 bits are its IPv4 address's
/// (unique: claimed by its IPv4 host route), a host route `/128` to it through the host
/// end with a permanent neighbour entry (at [`Veth`]'s `job_mac`: no NDP through the
/// host's table, which drops all a job sends to the host), and a default route via the
/// link-local `gateway` at the host end's MAC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Veth6 {
    pub prefix: Ipv6Net,
    pub gateway: Ipv6Addr,
    /// The host end forwards what comes in on it (`force_forwarding`, kernel >= 6.17):
    /// net.ipv6.conf.all.forwarding is 0.
    pub force_forwarding: bool,
    /// Prohibited in the job's namespace (link-local, the jobs' prefix, the host's
    /// addresses, metadata services).
    pub blocked: Vec<Ipv6Net>,
}

impl Veth6 {
    /// The job's IPv6 address for its IPv4 address `v4`.
    pub fn address(&self, v4: Ipv4Addr) -> Ipv6Addr {
        Ipv6Addr::from(u128::from(self.prefix.addr) | u32::from(v4) as u128)
    }
}

/// Rootless: pasta (passt) on the host's side, attached to the job's namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pasta {
    pub program: PathBuf,
    /// Its options, without `--netns` and `-P` (added here).
    pub args: Vec<String>,
    pub routes: Vec<JobRoute>,
    /// Its messages (`--log-file`, and its stdout and stderr): not the job's output.
    pub log: PathBuf,
    /// IPv6 too (pasta not `--ipv4-only`): the networks the job's routes prohibit. Its
    /// tap gets no link-local address, hence no `fe80::/64` route through pasta, which
    /// would connect to link-local addresses from the host.
    pub ipv6_blocked: Option<Vec<Ipv6Net>>,
    /// The job's own table, in its namespace (see [`super::job_filter`]).
    pub filter: JobFilter,
}

/// What a job's namespace gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Setup {
    Loopback,
    Veth(Veth),
    Pasta(Pasta),
}

/// What [`isolate`] made, or is still making.
#[derive(Debug, Default)]
pub struct Made {
    /// The job's address (veth), once [`Made::finish`] has it.
    pub address: Option<Ipv4Addr>,
    /// Its IPv6 address (veth with IPv6).
    pub address6: Option<Ipv6Addr>,
    /// pasta's pid: it dies with the helper (PDEATHSIG).
    pub pasta_pid: Option<i32>,
    /// The namespace, made by a child of the helper or of its runner, for the helper to join.
    entering: Option<Entering>,
    /// The veth's steps after the unshare, under way in that child.
    configuring: Option<Configuring>,
    /// The namespace the caller was in before [`Made::enter`], for [`Made::leave`].
    left: Option<OwnedFd>,
}

/// The child making the job's namespace (see `namespace_in_child`): the socket on which
/// it says `ok`, with the namespace's fd, once the namespace and its sysfs exist.
#[derive(Debug)]
struct Entering {
    ready: std::os::unix::net::UnixStream,
    /// Where the namespace's sysfs, which comes with it, goes (see [`detached_sysfs`]).
    sysfs: PathBuf,
}

/// The forked child that made the job's namespace and does a veth's steps 3-5 (see
/// `namespace_in_child`): its pid, the read end of the pipe it reports on, and the
/// firewall's lock, released once the child is reaped.
#[derive(Debug)]
struct Configuring {
    pid: i32,
    report: std::fs::File,
    _lock: Option<nix::fcntl::Flock<std::fs::File>>,
}

impl Made {
    /// Moves the caller into the job's namespace once the child or thread making it (see
    /// [`isolate`] and [`loopback_maker`]) has it with its sysfs, which is attached first (in the
    /// caller's mount namespace); the caller is in it already otherwise.
    pub fn enter(&mut self) -> Result<()> {
        let Some(e) = self.entering.take() else { return Ok(()) };
        let (said, mut fds) = receive_namespace(&e.ready);
        if let Some(errno) = said.trim().strip_prefix("unshare ").and_then(|n| n.parse().ok()) {
            return Err(Error::UnshareNetNs(nix::errno::Errno::from_raw(errno)));
        }
        if said.trim() != "ok" {
            let why = said.trim().strip_prefix("err ").unwrap_or("its maker ended without a word").to_string();
            return Err(Error::MakeJobNetns(why));
        }
        let (Some(sysfs), Some(ns)) = (fds.pop(), fds.pop()) else {
            return Err(Error::MakeJobNetns("its namespace and sysfs did not come with its word".into()));
        };
        attach_sysfs(sysfs, &e.sysfs)?;
        let own = std::fs::File::open("/proc/thread-self/ns/net").map_err(|e| Error::OwnNetns(errno_of(&e)))?;
        nix::sched::setns(ns, CloneFlags::CLONE_NEWNET).map_err(Error::EnterNetns)?;
        self.left = Some(own.into());
        Ok(())
    }

    /// Moves the caller back into the namespace it left for the job's (see
    /// [`Made::enter`]); nothing when it never entered one. Once the job's processes are
    /// in theirs, they alone hold it: it goes with the last of them, not with the caller.
    pub fn leave(&mut self) -> Result<()> {
        let Some(own) = self.left.take() else { return Ok(()) };
        nix::sched::setns(own, CloneFlags::CLONE_NEWNET).map_err(Error::LeaveNetns)
    }

    /// Waits for the veth's configuration when a child does it (see [`isolate`]) and takes
    /// its addresses: the job may start only after Ok. Nothing to wait for otherwise.
    pub fn finish(&mut self) -> Result<()> {
        let Some(mut c) = self.configuring.take() else { return Ok(()) };
        let mut text = String::new();
        let read = std::io::Read::read_to_string(&mut c.report, &mut text);
        let status = super::process::wait_exit_status(c.pid);
        let (address, address6) = match (read, status) {
            (Ok(_), Ok(st)) if st.success() && text == "ok" => Some((None, None)),
            (Ok(_), Ok(st)) if st.success() => parse_configured(&text).map(|(a, a6)| (Some(a), a6)),
            _ => None,
        }
        .ok_or_else(|| {
            Error::ConfigureVeth(match text.strip_prefix("err ") {
                Some(why) => why.trim().to_string(),
                None => "the job's veth was not set up: its child ended without a report".to_string(),
            })
        })?;
        (self.address, self.address6) = (address, address6);
        Ok(())
    }
}

/// The child's report on success: `ok ADDRESS ADDRESS6|-`.
fn parse_configured(text: &str) -> Option<(Ipv4Addr, Option<Ipv6Addr>)> {
    let mut words = text.strip_prefix("ok ")?.split_whitespace();
    let a = words.next()?.parse().ok()?;
    let a6 = match words.next()? {
        "-" => None,
        w => Some(w.parse().ok()?),
    };
    Some((a, a6))
}

/// The job's interface inside its namespace.
pub const JOB_IFNAME: &str = "eth0";
/// Its index there: a new namespace has only `lo` (1), and the veth's peer is given 2.
const JOB_IFINDEX: i32 = 2;
const LO_IFINDEX: i32 = 1;

/// Gives the calling (single-threaded) helper a new network namespace set up as `setup`
/// says, with a sysfs of it mounted at `sysfs` (in the helper's mount namespace).
///
/// Loopback and veth: a forked child makes the namespace, its loopback and its sysfs,
/// then does a veth's steps 3-5 there. The unshare alone costs ~0.6 ms here (the
/// kernel's setup of a namespace), now beside the helper's next steps (its user
/// namespace, overlay and tree mounts); the helper joins the namespace
/// ([`Made::enter`]) before the job's tree needs its sysfs, and waits for the veth
/// ([`Made::finish`]) before the job starts. pasta: in the helper (pasta joins it).
pub fn isolate(setup: &Setup, sysfs: &Path) -> Result<Made> {
    match setup {
        Setup::Loopback => namespace_in_child(None, sysfs),
        Setup::Veth(v) => namespace_in_child(Some(v), sysfs),
        Setup::Pasta(p) => {
            let made = isolate_pasta(p)?;
            mount_sysfs(sysfs)?;
            Ok(made)
        }
    }
}

/// A veth's step 1, the host's side, before the fork (the child is in the job's
/// namespace from its step 2 on): its netlink socket and the host's IPv6 settings of
/// links. The lock stays with the helper (see `namespace_in_child`).
struct HostSide {
    socket: Socket,
    conf6: Option<std::fs::File>,
}

fn host_side(v: &Veth) -> Result<HostSide> {
    let socket = socket()?;
    nft_table_exists(&v.table)?;
    // The host's IPv6 settings of links, opened while this is the host's namespace.
    let conf6 = v.v6.as_ref().map(|_| open_ipv6_conf()).transpose()?;
    Ok(HostSide { socket, conf6 })
}

/// Step 2: the namespace (the caller's from now on), its loopback, its sysfs. Returns
/// a netlink socket in it, the namespace itself (for the helper, and for the veth's
/// peer to be moved into) and its sysfs, detached (for the helper to attach: see
/// [`detached_sysfs`]).
fn make_namespace() -> Result<(Socket, std::fs::File, OwnedFd)> {
    unshare_network()?;
    let job = socket()?;
    loopback_up(&job)?;
    let sysfs = detached_sysfs()?;
    // The calling thread's (a runner's thread makes a `none` job's: /proc/self is the
    // process's, its main thread's namespace).
    let ns = std::fs::File::open("/proc/thread-self/ns/net").map_err(Error::OpenNetns)?;
    Ok((job, ns, sysfs))
}

/// What the child making the job's namespace tells the helper: `text` (`ok`, or why
/// not), with the namespace's fd and its sysfs's when there are.
fn send_namespace(to: &std::os::unix::net::UnixStream, text: &str, fds: &[std::os::fd::BorrowedFd]) {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let fds: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let cmsg: Vec<ControlMessage> = if fds.is_empty() { vec![] } else { vec![ControlMessage::ScmRights(&fds)] };
    let iov = [std::io::IoSlice::new(text.as_bytes())];
    // A failure shows in the helper as a word missing. MSG_NOSIGNAL: a helper gone
    // already (its job failed early) must not take a runner's thread's process with it
    // (SIGPIPE is the default again in this binary, see main.rs).
    let _ = sendmsg::<()>(to.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None);
}

/// What [`send_namespace`] sent: its text, and the fds that came with it, in order
/// (close-on-exec).
fn receive_namespace(from: &std::os::unix::net::UnixStream) -> (String, Vec<OwnedFd>) {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut buf = [0u8; 512];
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let mut cmsg = nix::cmsg_space!([RawFd; 2]);
    let Ok(msg) = recvmsg::<()>(from.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC) else {
        return (String::new(), vec![]);
    };
    let mut owned = vec![];
    for c in msg.cmsgs().into_iter().flatten() {
        if let ControlMessageOwned::ScmRights(fds) = c {
            // SAFETY: SCM_RIGHTS just installed these fds in this process: new fds that
            // nothing else owns.
            owned.extend(fds.iter().map(|&f| unsafe { OwnedFd::from_raw_fd(f) }));
        }
    }
    let n = msg.bytes;
    (String::from_utf8_lossy(&buf[..n]).into_owned(), owned)
}

/// Steps 3-5 for a veth (none for loopback only): what [`Made::finish`] then holds.
fn configure(veth: Option<&Veth>, host: Option<&HostSide>, (job, ns): &(Socket, std::fs::File)) -> Result<Made> {
    match (veth, host) {
        (Some(v), Some(h)) => configure_veth(&h.socket, job, ns, v, h.conf6.as_ref()),
        _ => Ok(Made::default()),
    }
}

fn namespace_in_child(veth: Option<&Veth>, sysfs: &Path) -> Result<Made> {
    // Held shared from the table's check to the link's creation (see firewall::LOCK):
    // by the helper until the child that makes the link is reaped (`Made::finish`). The
    // child shares its open file; its exit does not unlock it.
    let lock = veth.map(|v| lock_shared(&v.lock)).transpose()?;
    let host = veth.map(host_side).transpose()?;
    // The namespace comes to the helper as an fd (SCM_RIGHTS): it must outlive the child,
    // which may be done before the helper enters it.
    let (ns_rx, ns_tx) = std::os::unix::net::UnixStream::pair().map_err(|e| Error::Pipe(errno_of(&e)))?;
    let (report_rx, report_tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(Error::Pipe)?;
    let forked = super::process::run_forked("the job's network namespace", host, |host| {
        // Dies with the helper (and its job), not after it.
        if nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).is_err()
            || nix::unistd::getppid().as_raw() == 1
        {
            return 125;
        }
        let Some((job, ns)) = made_and_sent(&ns_tx) else { return 1 };
        drop(ns_tx);
        let job = (job, ns);
        let (code, report) = match configure(veth, host.as_ref(), &job) {
            Ok(m) => match m.address {
                Some(a) => (0, format!("ok {a} {}", dash_or(m.address6))),
                None => (0, "ok".into()),
            },
            Err(e) => (1, format!("err {}", e.with_causes())),
        };
        let _ = std::io::Write::write_all(&mut std::fs::File::from(report_tx), report.as_bytes());
        code
    })?;
    match forked {
        Ok(pid) => {
            let pid = pid.as_raw();
            Ok(Made {
                entering: Some(Entering { ready: ns_rx, sysfs: sysfs.to_path_buf() }),
                configuring: Some(Configuring { pid, report: std::fs::File::from(report_rx), _lock: lock }),
                ..Default::default()
            })
        }
        // A threaded caller: every step here, in order.
        Err(host) => {
            let (job, ns, detached) = make_namespace()?;
            attach_sysfs(detached, sysfs)?;
            configure(veth, host.as_ref(), &(job, ns))
        }
    }
}

/// In the child (or a runner's thread) making the job's namespace: [`make_namespace`],
/// then the word (with the namespace and its sysfs, or why not) to `to`. The netlink
/// socket in the namespace and the namespace, for a veth's next steps; None when it
/// failed (the word says why).
fn made_and_sent(to: &std::os::unix::net::UnixStream) -> Option<(Socket, std::fs::File)> {
    match make_namespace() {
        Ok((job, ns, sysfs)) => {
            send_namespace(to, "ok\n", &[ns.as_fd(), sysfs.as_fd()]);
            Some((job, ns))
        }
        // The unshare's errno as such: EPERM is a failure of its own kind for the job.
        Err(Error::UnshareNetNs(errno)) => {
            send_namespace(to, &format!("unshare {}\n", errno as i32), &[]);
            None
        }
        Err(e) => {
            send_namespace(to, &format!("err {}\n", e.with_causes()), &[]);
            None
        }
    }
}

/// A `none` job's namespace, made by its runner (`exec`) while it plans: the returned fd
/// is the helper's end of a socket ([`adopt_loopback`]), given to the early helper as it
/// is forked, and [`LoopbackMaker::start`], once that fork is made, makes the namespace
/// in a thread of the runner and sends it there (see [`made_and_sent`]).
pub fn loopback_maker() -> Result<(LoopbackMaker, OwnedFd)> {
    let (ns_rx, ns_tx) = std::os::unix::net::UnixStream::pair().map_err(|e| Error::Pipe(errno_of(&e)))?;
    Ok((LoopbackMaker { to: ns_tx }, ns_rx.into()))
}

/// The runner's end of the socket of [`loopback_maker`].
#[derive(Debug)]
pub struct LoopbackMaker {
    to: std::os::unix::net::UnixStream,
}

impl LoopbackMaker {
    /// Makes the namespace in a thread: unshare(CLONE_NEWNET) moves the calling thread
    /// alone, and the namespace outlives the thread in the fds it sends. A thread, not a
    /// child: no fork of the runner (its page tables copied, copy-on-write faults on both
    /// sides after it, a process to kill and reap at the end), on the part of `exec`
    /// where both CPUs here are busy. Only after the runner's last fork made while it has
    /// one thread (its helper's). If no thread can be started, the socket closes and the
    /// helper says that no namespace came. Joined when the returned value drops.
    pub fn start(self) -> LoopbackThread {
        let to = self.to;
        let made = std::thread::Builder::new().name("azp-job-netns".into()).spawn(move || {
            made_and_sent(&to);
        });
        LoopbackThread(made.ok())
    }
}

/// The thread of [`LoopbackMaker::start`], joined on drop (it is done long before).
#[derive(Debug)]
pub struct LoopbackThread(Option<std::thread::JoinHandle<()>>);

impl Drop for LoopbackThread {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            let _ = t.join();
        }
    }
}

/// The namespace a runner's thread is making (see [`loopback_maker`]), for the helper to
/// enter ([`Made::enter`]), its sysfs attached at `sysfs` then.
pub fn adopt_loopback(ready: OwnedFd, sysfs: &Path) -> Made {
    Made { entering: Some(Entering { ready: ready.into(), sysfs: sysfs.to_path_buf() }), ..Default::default() }
}

/// A sysfs of the caller's network namespace, read-only, nosuid, nodev and noexec, not
/// attached anywhere: whoever makes the namespace makes it (sysfs shows the namespace of
/// whoever creates it), wherever its own mounts are (a runner's child has the host's),
/// and the helper attaches it in its own mount namespace ([`attach_sysfs`]).
fn detached_sysfs() -> Result<OwnedFd> {
    const FSOPEN_CLOEXEC: libc::c_uint = 1;
    const FSCONFIG_SET_FLAG: libc::c_uint = 0;
    const FSCONFIG_SET_STRING: libc::c_uint = 1;
    const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
    const FSMOUNT_CLOEXEC: libc::c_uint = 1;
    // MOUNT_ATTR_RDONLY, NOSUID, NODEV, NOEXEC.
    const ATTRS: libc::c_uint = 0x1 | 0x2 | 0x4 | 0x8;
    // SAFETY: fsopen(2) reads the NUL-terminated literal during the call and returns a
    // new fd or -1; no memory of ours is kept.
    let fs = unsafe { libc::syscall(libc::SYS_fsopen, c"sysfs".as_ptr(), FSOPEN_CLOEXEC) };
    if fs < 0 {
        return Err(Error::SysfsOpen(Errno::last()));
    }
    // SAFETY: `fs` is a new fd that nothing else owns; the OwnedFd closes it once.
    let fs = unsafe { OwnedFd::from_raw_fd(fs as RawFd) };
    // The superblock read-only too, as mount(2)'s MS_RDONLY made it (a write is refused
    // with EROFS before any permission check), and named as that mount named it.
    // SAFETY: fsconfig(2) reads the NUL-terminated literals during the call only (a flag
    // takes no value: null).
    let r = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_SET_FLAG,
            c"ro".as_ptr(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    if r < 0 {
        return Err(Error::SysfsCreate(Errno::last()));
    }
    // SAFETY: as above, with a NUL-terminated literal for the value.
    let r = unsafe {
        libc::syscall(libc::SYS_fsconfig, fs.as_raw_fd(), FSCONFIG_SET_STRING, c"source".as_ptr(), c"sysfs".as_ptr(), 0)
    };
    if r < 0 {
        return Err(Error::SysfsCreate(Errno::last()));
    }
    // SAFETY: fsconfig(2)'s CMD_CREATE takes no key or value: both pointers are null and
    // nothing of ours is read or written.
    let r = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    if r < 0 {
        return Err(Error::SysfsCreate(Errno::last()));
    }
    // SAFETY: fsmount(2) takes integers only and returns a new fd or -1.
    let mnt = unsafe { libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), FSMOUNT_CLOEXEC, ATTRS) };
    if mnt < 0 {
        return Err(Error::SysfsMount(Errno::last()));
    }
    // SAFETY: `mnt` is a new fd that nothing else owns; the OwnedFd closes it once.
    Ok(unsafe { OwnedFd::from_raw_fd(mnt as RawFd) })
}

/// Attaches a [`detached_sysfs`] at `target`, in the caller's mount namespace.
fn attach_sysfs(sysfs: OwnedFd, target: &Path) -> Result<()> {
    super::mount::attach_detached(sysfs.as_fd(), target)
        .map_err(|source| Error::MountSysfs { target: target.into(), source })
}

fn dash_or(a: Option<Ipv6Addr>) -> String {
    a.map(|a| a.to_string()).unwrap_or_else(|| "-".into())
}

/// A veth's steps after the unshare, in the job's namespace `ns`: the pair, the
/// addresses, the routes.
fn configure_veth(
    host: &Socket,
    job: &Socket,
    ns: &std::fs::File,
    v: &Veth,
    host_conf6: Option<&std::fs::File>,
) -> Result<Made> {
    // Step 3: the pair, its host end configured and up.
    create_veth(host, v, ns)?;
    let index = link_index(host, &v.host_name)?;
    if let (Some(v6), Some(conf)) = (&v.v6, host_conf6) {
        host_end_ipv6_settings(conf, &v.host_name, v6)?;
    }
    configure_host_end(host, &v.host_name, index)?;
    // Step 4: the job's address, claimed by its host route, at the job's end's MAC
    // (IPv6: derived from it).
    let address = claim_address(host, v, index)?;
    job_end_neighbour(host, v, index, address)?;
    let address6 = match &v.v6 {
        Some(v6) => Some(route_ipv6_to_job(host, v, v6, index, address)?),
        None => None,
    };
    // Step 5: the job's end, its gateway and routes.
    configure_job_end(job, v, address)?;
    add_routes(job, &v.routes, v.gateway)?;
    if let (Some(v6), Some(a6)) = (&v.v6, address6) {
        configure_job_ipv6(job, v, v6, a6)?;
    }
    // Step 6: the job's own table, for sockets bound to its link.
    super::job_filter::install(&v.filter)?;
    Ok(Made { address: Some(address), address6, ..Default::default() })
}

/// `/proc/sys/net/ipv6/conf` of the caller's network namespace: a directory opened in the
/// host's namespace keeps naming the host's links after the unshare (the kernel looks the
/// names up in the namespace of the directory's own entries).
fn open_ipv6_conf() -> Result<std::fs::File> {
    let conf = super::forwarding::IPV6_CONF;
    std::fs::File::open(conf).map_err(|e| Error::OpenSysctl { path: conf.into(), source: errno_of(&e) })
}

/// The host end's IPv6 settings before it comes up (they are the link's, and go with
/// it): no router advertisements or address autoconfiguration taken from the job (a
/// job could otherwise give the host a default route through itself), and, when the
/// host does not forward IPv6 on all links, forwarding of what comes in on this one.
fn host_end_ipv6_settings(conf: &std::fs::File, link: &str, v6: &Veth6) -> Result<()> {
    let mut settings = vec![("accept_ra", "0"), ("autoconf", "0")];
    if v6.force_forwarding {
        settings.push(("force_forwarding", "1"));
    }
    for (key, value) in settings {
        write_at(conf, &format!("{link}/{key}"), value).map_err(|source| Error::HostEndSysctl {
            link: link.into(),
            key,
            source,
        })?;
    }
    Ok(())
}

/// Writes `value` to the file `name` under the directory `dir`.
fn write_at(dir: &std::fs::File, name: &str, value: &str) -> std::result::Result<(), Errno> {
    let name = std::ffi::CString::new(name).map_err(|_| Errno::EINVAL)?;
    let fd = super::fs_at::openat(dir.as_raw_fd(), &name, libc::O_WRONLY, 0).map_err(|e| errno_of(&e))?;
    let n = nix::unistd::write(&fd, value.as_bytes())?;
    if n != value.len() {
        return Err(Errno::EIO);
    }
    Ok(())
}

/// The job's IPv6 address for its IPv4 `address`: the host's route `/128` to it through
/// the host end, and its neighbour entry there (the job's end's fixed MAC).
fn route_ipv6_to_job(host: &Socket, v: &Veth, v6: &Veth6, index: i32, address: Ipv4Addr) -> Result<Ipv6Addr> {
    let a = v6.address(address);
    let mut m = Message::route6(nl::NLM_F_CREATE | nl::NLM_F_EXCL, 128, nl::RT_SCOPE_UNIVERSE, nl::RTN_UNICAST);
    m.attr_ipv6(nl::RTA_DST, a).attr_u32(nl::RTA_OIF, index as u32);
    host.request(m).map_err(|source| Error::AddHostRoute { route: format!("{a}/128 dev {index}"), source })?;
    permanent_neighbour(host, index, a.into(), &v.job_mac)?;
    Ok(a)
}

/// The job's IPv6: its address (no DAD: it is alone on the link with the host end), the
/// gateway (link-local, at the host end's MAC, without NDP), the default route via it,
/// and its blocked networks prohibited.
fn configure_job_ipv6(job: &Socket, v: &Veth, v6: &Veth6, address: Ipv6Addr) -> Result<()> {
    let mut m = Message::addr_flags(
        nl::RTM_NEWADDR,
        nl::NLM_F_CREATE | nl::NLM_F_EXCL,
        nl::AF_INET6,
        128,
        nl::IFA_F_NODAD,
        0,
        JOB_IFINDEX as u32,
    );
    m.attr_ipv6(nl::IFA_LOCAL, address).attr_ipv6(nl::IFA_ADDRESS, address);
    job.request(m).map_err(|source| Error::AddAddress { addr: address.into(), source })?;
    permanent_neighbour(job, JOB_IFINDEX, v6.gateway.into(), &v.host_mac)?;
    let mut m = Message::route6(nl::NLM_F_CREATE | nl::NLM_F_EXCL, 0, nl::RT_SCOPE_UNIVERSE, nl::RTN_UNICAST);
    m.attr_ipv6(nl::RTA_GATEWAY, v6.gateway).attr_u32(nl::RTA_OIF, JOB_IFINDEX as u32);
    job.request(m)
        .map_err(|source| Error::AddRoute { route: format!("default via {} dev eth0", v6.gateway), source })?;
    prohibit6(job, &v6.blocked)
}

/// Prohibit routes for `blocked` in the job's namespace.
pub(super) fn prohibit6(job: &Socket, blocked: &[Ipv6Net]) -> Result<()> {
    for n in blocked {
        let mut m =
            Message::route6(nl::NLM_F_CREATE | nl::NLM_F_EXCL, n.prefix, nl::RT_SCOPE_UNIVERSE, nl::RTN_PROHIBIT);
        m.attr_ipv6(nl::RTA_DST, n.addr);
        match job.request(m) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(source) => return Err(Error::AddRoute { route: format!("prohibit {n}"), source }),
        }
    }
    Ok(())
}

fn isolate_pasta(p: &Pasta) -> Result<Made> {
    // Step 1: pasta's process, forked while we are still in the host's namespace.
    let (ready_rx, ready_tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(Error::Pipe)?;
    let (go_rx, go_tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(Error::Pipe)?;
    let parent = nix::unistd::getpid().as_raw();
    let pid = match super::process::fork("pasta")? {
        super::process::Forked::Child => {
            drop((ready_rx, go_tx));
            super::process::exit_now(pasta_child(p, parent, go_rx, ready_tx))
        }
        super::process::Forked::Parent(pid) => pid.as_raw(),
    };
    drop((go_rx, ready_tx));
    // Step 2: the namespace, its loopback (IPv6: no link-local address on links to come).
    unshare_network()?;
    let job = socket()?;
    loopback_up(&job)?;
    if p.ipv6_blocked.is_some() {
        no_link_local_addresses()?;
    }
    // Step 3: pasta joins it; it writes its pid once the namespace is configured.
    let _ = nix::unistd::write(&go_tx, b"g");
    drop(go_tx);
    if !read_line(ready_rx).trim().parse::<i32>().is_ok_and(|n| n > 0) {
        let log = std::fs::read_to_string(&p.log).unwrap_or_default();
        let said = log.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no message").trim().to_string();
        return Err(Error::PastaFailed { program: p.program.clone(), said });
    }
    // Step 4: the job's routes (pasta made its address and default route).
    let gateway = p.args.iter().position(|a| a == "-g").and_then(|i| p.args.get(i + 1)?.parse().ok());
    add_routes(&job, &p.routes, gateway.unwrap_or(Ipv4Addr::UNSPECIFIED))?;
    if let Some(blocked) = &p.ipv6_blocked {
        prohibit6(&job, blocked)?;
        prohibit_link_local_rule(&job)?;
    }
    // Step 5: the job's own table, for sockets bound to its link.
    super::job_filter::install(&p.filter)?;
    Ok(Made { pasta_pid: Some(pid), ..Default::default() })
}

/// A routing rule, looked at before any route: link-local destinations are prohibited.
/// pasta's tap carries the job's default route via the host's (often link-local)
/// gateway, and a lookup for a scoped link-local address (`fe80::1%eth0`) passes over
/// the prohibit route (it has no device) to that default route: pasta would get the
/// connection. Neighbour discovery of the gateway looks up no route and still works.
fn prohibit_link_local_rule(job: &Socket) -> Result<()> {
    let mut m = Message::rule(nl::NLM_F_CREATE | nl::NLM_F_EXCL, nl::AF_INET6, 10, nl::FR_ACT_PROHIBIT);
    m.attr_ipv6(nl::FRA_DST, Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0)).attr_u32(nl::FRA_PRIORITY, 100);
    job.request(m).map_err(|source| Error::AddRule { rule: "to fe80::/10 prohibit", source })
}

/// The job's namespace's `net.ipv6.conf.default.addr_gen_mode` = none: links made from
/// now on (pasta's tap) get no link-local address.
fn no_link_local_addresses() -> Result<()> {
    const DEFAULT_ADDR_GEN_MODE: &str = "/proc/sys/net/ipv6/conf/default/addr_gen_mode";
    std::fs::write(DEFAULT_ADDR_GEN_MODE, "1")
        .map_err(|e| Error::JobSysctl { path: DEFAULT_ADDR_GEN_MODE.into(), source: errno_of(&e) })
}

/// The first line pasta writes to its pid file (a pipe it keeps open), or what came
/// before EOF (it exited).
fn read_line(pipe: OwnedFd) -> String {
    let mut f = std::fs::File::from(pipe);
    let mut out = Vec::new();
    let mut b = [0u8; 64];
    while let Ok(n @ 1..) = f.read(&mut b) {
        out.extend_from_slice(&b[..n]);
        if out.contains(&b'\n') {
            break;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The forked child that becomes pasta: dies with the helper, waits for the helper's
/// namespace, opens it (it may: same credentials), execs pasta on it with no fd of the
/// helper's but those two (the runner's result pipe must not outlive the helper's
/// copy, nor the job's output). Returns only on failure, with the exit code.
fn pasta_child(p: &Pasta, parent: i32, go: OwnedFd, ready: OwnedFd) -> i32 {
    use std::os::unix::process::CommandExt;
    if nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).is_err() {
        return 125;
    }
    let mut b = [0u8; 1];
    if !matches!(nix::unistd::read(go.as_raw_fd(), &mut b), Ok(1)) {
        return 0; // the helper gave up before its namespace existed
    }
    drop(go);
    let Ok(ns) = std::fs::File::open(format!("/proc/{parent}/ns/net")) else { return 125 };
    let ns: OwnedFd = ns.into();
    let Ok(log) = std::fs::OpenOptions::new().create(true).append(true).open(&p.log) else { return 125 };
    let keep = [ns.as_raw_fd(), ready.as_raw_fd()];
    // Listed first: the listing's own fd is among them, and closed after it.
    let open: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    for fd in open.into_iter().filter(|fd| *fd > 2 && !keep.contains(fd) && *fd != log.as_raw_fd()) {
        let _ = nix::unistd::close(fd);
    }
    // Both fds must reach pasta: clear close-on-exec.
    for fd in keep {
        if nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty())).is_err() {
            return 125;
        }
    }
    let Ok(err_log) = log.try_clone() else { return 125 };
    let uid = nix::unistd::geteuid().as_raw();
    let gid = nix::unistd::getegid().as_raw();
    let err = std::process::Command::new(&p.program)
        .args(&p.args)
        // Its own uid: a change of credentials would clear the death signal.
        .arg("--runas")
        .arg(format!("{uid}:{gid}"))
        .arg("--netns")
        .arg(format!("/proc/self/fd/{}", ns.as_raw_fd()))
        .arg("-P")
        .arg(format!("/proc/self/fd/{}", ready.as_raw_fd()))
        .arg("--log-file")
        .arg(&p.log)
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(err_log)
        .exec();
    eprintln!("azp-sandbox: cannot run {}: {err}", p.program.display());
    127
}

fn socket() -> Result<Socket> {
    Socket::open(Proto::Route).map_err(Error::NetlinkSocket)
}

fn unshare_network() -> Result<()> {
    unshare(CloneFlags::CLONE_NEWNET).map_err(Error::UnshareNetNs)
}

fn loopback_up(job: &Socket) -> Result<()> {
    job.request(Message::link(nl::RTM_NEWLINK, 0, LO_IFINDEX, nl::IFF_UP, nl::IFF_UP))
        .map_err(|source| Error::LinkUp { name: "lo".into(), source })
}

fn lock_shared(path: &Path) -> Result<nix::fcntl::Flock<std::fs::File>> {
    let f =
        std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(path).map_err(|e| {
            Error::NetLock { path: path.into(), source: Errno::from_raw(e.raw_os_error().unwrap_or(0)) }
        })?;
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockShared)
        .map_err(|(_, source)| Error::NetLock { path: path.into(), source })
}

/// An nftables table of the host, as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftTable {
    pub comment: Option<String>,
    /// Its handle: a table made again (after a firewall reload flushed it) has another.
    pub handle: Option<u64>,
}

/// nftables' changes in this process's network namespace (a firewall reload among
/// them), for whoever keeps the jobs' table there.
pub struct NftablesWatch {
    listener: nl::Listener,
}

impl NftablesWatch {
    /// Subscribed from now on: a change after this returns is seen.
    pub fn subscribe() -> Result<NftablesWatch> {
        Ok(NftablesWatch { listener: nl::Listener::nftables().map_err(Error::WatchNftables)? })
    }

    /// Blocks until something of the inet table `table` is deleted (true; a firewall
    /// reload's flush deletes it all; also when notifications were lost: the caller looks
    /// afresh) or `stop` is readable or closed (false). Other changes (a busy host's
    /// kube-proxy or fail2ban, the caller's own additions) are read and dropped.
    pub fn wait(&self, stop: std::os::fd::BorrowedFd, table: &str) -> Result<bool> {
        use nix::poll::{PollFd, PollFlags, PollTimeout};
        loop {
            let mut fds = [PollFd::new(self.listener.as_fd(), PollFlags::POLLIN), PollFd::new(stop, PollFlags::POLLIN)];
            match nix::poll::poll(&mut fds, PollTimeout::NONE) {
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(Error::ReadNftablesWatch(e)),
                Ok(_) => {}
            }
            if fds[1].revents().is_some_and(|r| !r.is_empty()) {
                return Ok(false);
            }
            if fds[0].revents().is_some_and(|r| !r.is_empty()) {
                let drained = self.listener.drain().map_err(Error::ReadNftablesWatch)?;
                let ours = |(typ, payload): &(u16, Vec<u8>)| nl::nft_deletes_from(*typ, payload, table);
                if drained.overrun || drained.notifications.iter().any(ours) {
                    return Ok(true);
                }
            }
        }
    }
}

/// A root-mode job's connections, as the host tracks them: its addresses (the original
/// source of each), and the set of the host's table that counts each job link's (its
/// link's element is there while any is tracked).
#[derive(Debug, Clone)]
pub struct JobConnections {
    pub table: &'static str,
    pub set: &'static str,
    pub link: String,
    pub sources: Vec<std::net::IpAddr>,
    /// A link that claimed the job's address since (the job's own link went with its
    /// killed helper), before its own job started: the entries of that address are still
    /// the job's, not the heir's.
    pub heir: Option<String>,
}

/// How long [`forget_connections`] waits for a killed job's link to go (see
/// [`Look::Always`]): the kernel removes it with the job's namespace, in a worker that
/// tears down every namespace of the host in turn.
const LINK_GONE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// When [`forget_connections`] reads the conntrack table (a walk of every bucket).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look {
    /// Only where the counting set has the job's link: a job's end, every job's, cheap
    /// when it made no connection. A set that is gone or younger than the entries (a
    /// table made again) forgets nothing.
    IfCounted,
    /// Whatever the set says, once the job's link is gone (2 s at most): a clean-up
    /// after a killed helper (which removed the link first: see [`remove_link`]), or an
    /// heir of a killed job's address (rare, and the table may have been removed or made
    /// again since).
    Always,
    /// As `Always`, but nothing while the job's link exists: a sweep of markers whose
    /// job may still run.
    IfGone,
}

/// What [`forget_connections`] did: the entries deleted, the job's addresses it left
/// alone because another link holds them now (their entries are that job's), and
/// whether the job's own link was still there (its namespace still going: its sockets
/// may make entries again).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Forgotten {
    pub entries: usize,
    pub kept: Vec<std::net::IpAddr>,
    pub link_present: bool,
}

/// Deletes the conntrack entries of this namespace whose original source is one of the
/// job's addresses. The host's table masqueraded those connections, and nothing else
/// ends them with the job: a server of the job's that keeps answering keeps them tracked
/// (UDP 120 s at a time, TCP established 5 days), and jobs one after another would fill
/// the host's table. Reading the table walks every bucket of the kernel's one conntrack
/// hash (its namespaces' entries all in it), 14 ms here with 262144: `look` says when
/// (at a job's end only where the job's link has an element in the counting set, so a
/// job that made no connection costs one lookup of its element instead). `Look::Always`
/// first waits up to [`LINK_GONE_WAIT`] for the job's link to go: until its namespace is
/// gone, the namespace's sockets may make entries again. Each entry is deleted by its
/// original tuple and its id (see [`nl::conntrack_entry`]). What went, what was left to another
/// link, and whether the job's link was there before or after the read.
pub fn forget_connections(job: &JobConnections, look: Look) -> Result<Forgotten> {
    // One netfilter socket for both: nftables and ctnetlink are subsystems of it.
    let s = Socket::open(Proto::Netfilter).map_err(Error::NetlinkSocket)?;
    let link_there = || links().map(|l| l.iter().any(|(_, name)| *name == job.link));
    let mut link_present = false;
    match look {
        Look::IfCounted => {
            let key = nl::ifname_key(&job.link);
            let counted = match s.call(Message::nft_get_set_element(job.table, job.set, &key)) {
                Ok(_) => true,
                // No such element, set or table.
                Err(Errno::ENOENT) => false,
                Err(source) => return Err(Error::NftSetElement { set: job.set, source }),
            };
            if !counted {
                return Ok(Forgotten::default());
            }
        }
        Look::Always => {
            let deadline = std::time::Instant::now() + LINK_GONE_WAIT;
            while link_there()? && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            link_present = link_there()?;
        }
        Look::IfGone => {
            if link_there()? {
                return Ok(Forgotten { link_present: true, ..Default::default() });
            }
        }
    }
    let entries = s.call(Message::conntrack_dump()).map_err(Error::ConntrackDump)?;
    // Read after the entries: an address of the job's that another link holds by now is
    // another job's (free again once the job's link went, which a clean-up after a killed
    // helper may come long after), and so are its entries. One claimed after this read
    // has none in the dump.
    let links = links()?;
    let sources = still_the_jobs(&job.sources, &job.link, job.heir.as_deref(), &routes()?, &links);
    let kept = job.sources.iter().filter(|a| !sources.contains(a)).copied().collect();
    let link_present = link_present || links.iter().any(|(_, name)| *name == job.link);
    let forget = |src: &std::net::IpAddr| sources.contains(src);
    let mut forgotten = 0;
    for (_, delete) in entries.iter().filter_map(|e| nl::conntrack_entry(e)).filter(|(src, _)| forget(src)) {
        match s.request(delete) {
            Ok(()) => forgotten += 1,
            // Gone meanwhile (it expired, or its other end closed).
            Err(Errno::ENOENT) => {}
            Err(e) => return Err(Error::ConntrackDelete(e)),
        }
    }
    Ok(Forgotten { entries: forgotten, kept, link_present })
}

/// Those of a job's `sources` that no link but the job's own (`link`) or its `heir`'s
/// holds: a job's link holds its address by a host route `/32` (see `claim_address`), and
/// the job's IPv6 address holds the IPv4 one in its low bits (see [`Veth6::address`]).
/// `links` names the routes' links.
fn still_the_jobs(
    sources: &[std::net::IpAddr],
    link: &str,
    heir: Option<&str>,
    routes: &[HostRoute],
    links: &[(i32, String)],
) -> Vec<std::net::IpAddr> {
    let other = |i: i32| links.iter().any(|(x, name)| *x == i && name != link && Some(name.as_str()) != heir);
    let taken = |a: Ipv4Addr| routes.iter().any(|r| r.dst == Ipv4Net::host(a) && r.oif.is_some_and(other));
    let v4_of = |a: &std::net::IpAddr| match a {
        std::net::IpAddr::V4(v4) => *v4,
        std::net::IpAddr::V6(v6) => Ipv4Addr::from(u128::from(*v6) as u32),
    };
    sources.iter().filter(|a| !taken(v4_of(a))).copied().collect()
}

/// Removes the link `name` of this namespace (a veth's peer goes with it); false: there
/// was none. For the host end of a job whose processes are gone: the kernel removes it
/// with the job's namespace, but in one worker that tears down every namespace of the
/// host in turn (on a busy host a killed job's link outlived its clean-up's wait and
/// gc's wait, which left the host's table: `t16`, once in a CI rehearsal), and never
/// while something still holds the namespace (an fd, a bind mount).
pub fn remove_link(name: &str) -> Result<bool> {
    let mut m = Message::link(nl::RTM_DELLINK, 0, 0, 0, 0);
    m.attr_str(nl::IFLA_IFNAME, name);
    match socket()?.request(m) {
        Ok(()) => Ok(true),
        Err(Errno::ENODEV) => Ok(false),
        Err(source) => Err(Error::RemoveLink { name: name.into(), source }),
    }
}

/// The host's nftables table `name` (inet family), if it exists.
pub fn nft_table(name: &str) -> Result<Option<NftTable>> {
    let s = Socket::open(Proto::Netfilter).map_err(Error::NetlinkSocket)?;
    match s.call(Message::nft_get_table(name)) {
        Ok(replies) => {
            let reply = replies.first();
            Ok(Some(NftTable {
                comment: reply.and_then(|r| nl::nft_table_comment(r)),
                handle: reply.and_then(|r| nl::nft_table_handle(r)),
            }))
        }
        Err(Errno::ENOENT) => Ok(None),
        Err(source) => Err(Error::NftQuery { table: name.into(), source }),
    }
}

fn nft_table_exists(name: &str) -> Result<()> {
    match nft_table(name)? {
        Some(_) => Ok(()),
        None => Err(Error::NftTableMissing { table: name.into() }),
    }
}

fn create_veth(host: &Socket, v: &Veth, job_ns: &std::fs::File) -> Result<()> {
    host.request(veth_message(v, job_ns.as_raw_fd()))
        .map_err(|source| Error::CreateVeth { name: v.host_name.clone(), source })
}

/// The request that creates the job's veth pair: the host end named and grouped, the
/// job's end `eth0` in the namespace `job_ns`. One queue each way on both ends: the
/// kernel's default is one per possible CPU, and every queue is a sysfs object made and
/// removed with the link (hundreds per job on a large GPU node); without XDP a veth
/// hands packets to the per-CPU backlog whatever its queues.
fn veth_message(v: &Veth, job_ns: i32) -> Message {
    let mut m = Message::link(nl::RTM_NEWLINK, nl::NLM_F_CREATE | nl::NLM_F_EXCL, 0, 0, 0);
    m.attr_str(nl::IFLA_IFNAME, &v.host_name).attr(nl::IFLA_ADDRESS, &v.host_mac).attr_u32(nl::IFLA_GROUP, v.group);
    m.attr_u32(nl::IFLA_NUM_TX_QUEUES, 1).attr_u32(nl::IFLA_NUM_RX_QUEUES, 1);
    m.nest(nl::IFLA_LINKINFO).attr_str(nl::IFLA_INFO_KIND, "veth").nest(nl::IFLA_INFO_DATA);
    m.nest(nl::VETH_INFO_PEER).raw(&nl::ifinfomsg(JOB_IFINDEX, 0, 0));
    m.attr_str(nl::IFLA_IFNAME, JOB_IFNAME).attr_u32(nl::IFLA_NET_NS_FD, job_ns as u32);
    m.attr_u32(nl::IFLA_NUM_TX_QUEUES, 1).attr_u32(nl::IFLA_NUM_RX_QUEUES, 1);
    // Known to the host's neighbour entries for the job's addresses.
    m.attr(nl::IFLA_ADDRESS, &v.job_mac);
    m
}

fn link_index(s: &Socket, name: &str) -> Result<i32> {
    let mut m = Message::link(nl::RTM_GETLINK, 0, 0, 0, 0);
    m.attr_str(nl::IFLA_IFNAME, name);
    let replies = s.call(m).map_err(|source| Error::LinkIndex { name: name.into(), source })?;
    replies
        .first()
        .and_then(|r| r.get(4..8))
        .map(|b| i32::from_ne_bytes(b.try_into().unwrap()))
        .ok_or(Error::LinkIndex { name: name.into(), source: Errno::ENODEV })
}

/// No IPv6 link-local address (nothing of the host to reach over it, and no DAD or
/// router solicitation work), strict reverse-path filtering (a job cannot send from an
/// address that is not its own), `route_localnet` (the gateway's DNAT to a resolver on
/// the host's loopback, e.g. systemd-resolved's 127.0.0.53); then up. All of it is the
/// link's own and goes with it.
fn configure_host_end(host: &Socket, name: &str, index: i32) -> Result<()> {
    let conf =
        |s: &Socket, m: Message| s.request(m).map_err(|source| Error::ConfigureLink { name: name.into(), source });
    conf(host, af_spec(index, true))?;
    conf(host, Message::link(nl::RTM_NEWLINK, 0, index, nl::IFF_UP, nl::IFF_UP))
}

/// The per-link settings of [`configure_host_end`] (`host`) or the job's end.
fn af_spec(index: i32, host: bool) -> Message {
    let mut m = Message::link(nl::RTM_NEWLINK, 0, index, 0, 0);
    m.nest(nl::IFLA_AF_SPEC);
    if host {
        m.nest(nl::AF_INET as u16).nest(nl::IFLA_INET_CONF);
        m.attr_u32(nl::IPV4_DEVCONF_RP_FILTER, 1).attr_u32(nl::IPV4_DEVCONF_ROUTE_LOCALNET, 1);
        m.end().end();
    }
    m.nest(nl::AF_INET6 as u16).attr(nl::IFLA_INET6_ADDR_GEN_MODE, &[nl::IN6_ADDR_GEN_MODE_NONE]).end();
    m.end();
    m
}

/// The job's address: the first of `pool` in [`claim_order`] (from `first_try` on,
/// skipping the network, the gateway and the broadcast address, those to avoid last)
/// whose host route `address/32 dev <host end>` the kernel accepts. A route the kernel has is an address taken, by a live job or one
/// whose namespace is still being torn down; it goes with its link.
fn claim_address(host: &Socket, v: &Veth, index: i32) -> Result<Ipv4Addr> {
    for a in claim_order(v) {
        let mut m = Message::route(nl::NLM_F_CREATE | nl::NLM_F_EXCL, 32, nl::RT_SCOPE_LINK, nl::RTN_UNICAST);
        m.attr_ipv4(nl::RTA_DST, a).attr_u32(nl::RTA_OIF, index as u32);
        match host.request(m) {
            Ok(()) => return Ok(a),
            Err(Errno::EEXIST) => continue,
            Err(source) => return Err(Error::ClaimAddress { addr: a, source }),
        }
    }
    Err(Error::NoFreeAddress { pool: v.pool.to_string() })
}

/// The addresses a job's claim tries, in order: round the pool from `first_try`, those
/// to avoid last, never the subnet's own, the gateway or broadcast. Lazily: the first try
/// is free unless the pool fills up.
fn claim_order(v: &Veth) -> impl Iterator<Item = Ipv4Addr> + '_ {
    let count = v.pool.size().min(u32::MAX as u64) as u32;
    let reserved = [v.pool.addr, v.gateway, v.pool.nth(count.wrapping_sub(1))];
    let round = (0..count).map(move |k| v.pool.nth((v.first_try.wrapping_add(k)) % count));
    let avoided = v.avoid.iter().copied().filter(|a| v.pool.contains(*a));
    round.filter(|a| !v.avoid.contains(a)).chain(avoided).filter(move |a| !reserved.contains(a))
}

/// The host end's permanent neighbour entry for the job's `address`, at the job's end's
/// MAC: the host never asks for it (ARP). What the host forwards to an address it must
/// still ask for waits in that neighbour's queue until an answer, up to a second after
/// the first unanswered ask (the job's end is not up yet when the claim is made): the
/// datagrams of a killed job's connections on this address, forwarded before its heir's
/// helper forgot them (`sandbox::network::forget::before_its_job`), reached the heir's
/// job after its start. Known at once, they reach a namespace where nothing listens yet.
/// Made right after the claim: an entry a packet made meanwhile is replaced.
fn job_end_neighbour(host: &Socket, v: &Veth, index: i32, address: Ipv4Addr) -> Result<()> {
    permanent_neighbour(host, index, address.into(), &v.job_mac)
}

/// A permanent neighbour entry on link `index` of `s`'s namespace: `addr` at `mac`,
/// never asked for (ARP, NDP); one already there is replaced.
fn permanent_neighbour(s: &Socket, index: i32, addr: std::net::IpAddr, mac: &[u8; 6]) -> Result<()> {
    let family = if addr.is_ipv4() { nl::AF_INET } else { nl::AF_INET6 };
    let mut m = Message::neigh(nl::NLM_F_CREATE | nl::NLM_F_REPLACE, family, index, nl::NUD_PERMANENT);
    match addr {
        std::net::IpAddr::V4(a) => m.attr_ipv4(nl::NDA_DST, a),
        std::net::IpAddr::V6(a) => m.attr_ipv6(nl::NDA_DST, a),
    };
    m.attr(nl::NDA_LLADDR, mac);
    s.request(m).map_err(|source| Error::AddNeighbour { addr, source })
}

fn configure_job_end(job: &Socket, v: &Veth, address: Ipv4Addr) -> Result<()> {
    let link = |source| Error::ConfigureLink { name: JOB_IFNAME.into(), source };
    job.request(af_spec(JOB_IFINDEX, false)).map_err(link)?;
    let mut m =
        Message::addr(nl::RTM_NEWADDR, nl::NLM_F_CREATE | nl::NLM_F_EXCL, nl::AF_INET, 32, 0, JOB_IFINDEX as u32);
    m.attr_ipv4(nl::IFA_LOCAL, address).attr_ipv4(nl::IFA_ADDRESS, address);
    job.request(m).map_err(|source| Error::AddAddress { addr: address.into(), source })?;
    job.request(Message::link(nl::RTM_NEWLINK, 0, JOB_IFINDEX, nl::IFF_UP, nl::IFF_UP)).map_err(link)?;
    // The gateway is the host end: on the link, at the host end's MAC, without ARP.
    permanent_neighbour(job, JOB_IFINDEX, v.gateway.into(), &v.host_mac)?;
    let mut m = Message::route(nl::NLM_F_CREATE | nl::NLM_F_EXCL, 32, nl::RT_SCOPE_LINK, nl::RTN_UNICAST);
    m.attr_ipv4(nl::RTA_DST, v.gateway).attr_u32(nl::RTA_OIF, JOB_IFINDEX as u32);
    job.request(m).map_err(|source| Error::AddRoute { route: format!("{}/32 dev eth0", v.gateway), source })?;
    let mut m = Message::route(nl::NLM_F_CREATE | nl::NLM_F_EXCL, 0, nl::RT_SCOPE_UNIVERSE, nl::RTN_UNICAST);
    m.attr_ipv4(nl::RTA_GATEWAY, v.gateway).attr_u32(nl::RTA_OIF, JOB_IFINDEX as u32);
    job.request(m).map_err(|source| Error::AddRoute { route: format!("default via {}", v.gateway), source })
}

pub(super) fn add_routes(job: &Socket, routes: &[JobRoute], gateway: Ipv4Addr) -> Result<()> {
    for r in routes {
        let m = match r {
            JobRoute::Prohibit(n) => {
                let mut m = Message::route(
                    nl::NLM_F_CREATE | nl::NLM_F_EXCL,
                    n.prefix,
                    nl::RT_SCOPE_UNIVERSE,
                    nl::RTN_PROHIBIT,
                );
                m.attr_ipv4(nl::RTA_DST, n.addr);
                m
            }
            JobRoute::Allow(n) => {
                let mut m =
                    Message::route(nl::NLM_F_CREATE | nl::NLM_F_EXCL, n.prefix, nl::RT_SCOPE_UNIVERSE, nl::RTN_UNICAST);
                m.attr_ipv4(nl::RTA_DST, n.addr).attr_ipv4(nl::RTA_GATEWAY, gateway);
                m
            }
        };
        match job.request(m) {
            // Two host addresses in one network, or a block inside another: one is enough.
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(source) => return Err(Error::AddRoute { route: r.to_string(), source }),
        }
    }
    Ok(())
}

/// Mounts a fresh sysfs (read-only, nosuid, nodev, noexec) on `target`: it shows the
/// namespace of its mounter, so mounted after the unshare it lists the job's links only.
/// In a user namespace only the owner of the network namespace may mount one, which the
/// helper is and the job's own user namespace (if any) is not: the helper binds this one
/// into the job's tree (`sandbox::treemount`).
pub fn mount_sysfs(target: &Path) -> Result<()> {
    use nix::mount::{mount, MsFlags};
    let flags = MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("sysfs"), target, Some("sysfs"), flags, None::<&str>)
        .map_err(|source| Error::MountSysfs { target: target.into(), source })
}

/// The dir of the job's network files (its sysfs at `dir/sys`, mounted by [`isolate`];
/// its resolv.conf written there afterwards): a small tmpfs, mode 0755, mounted on `dir`
/// in the helper's private mount namespace, from which the helper binds them into the
/// job's tree (`sandbox::treemount`). `dir` is one path for all jobs (each helper sees
/// only its own tmpfs there), beside the overlay's mount point. The tmpfs goes with the
/// namespace.
pub fn mount_job_net_dir(dir: &Path) -> Result<()> {
    use nix::mount::{mount, MsFlags};
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("azp-sandbox-net"), dir, Some("tmpfs"), flags, Some("mode=0755,size=64k"))
        .map_err(|source| Error::MountTmpfs { dir: dir.to_path_buf(), source })?;
    let sys = dir.join("sys");
    std::fs::create_dir(&sys).map_err(|e| Error::MountSysfs { target: sys.clone(), source: errno_of(&e) })
}

/// An IPv4 route of a dump: destination and the name-resolved output link's index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoute {
    pub dst: Ipv4Net,
    pub oif: Option<i32>,
    pub table: u32,
}

/// The IPv4 addresses of this namespace's links (all of them, loopback included).
pub fn addresses() -> Result<Vec<Ipv4Addr>> {
    Ok(address_entries(&socket()?)?.into_iter().map(|e| e.local).collect())
}

/// One IPv4 address of a link, as `RTM_GETADDR` gives it.
struct AddressEntry {
    local: Ipv4Addr,
}

impl AddressEntry {
    /// From the payload of an `RTM_NEWADDR` of family AF_INET (an `ifaddrmsg`, then
    /// attributes).
    fn parse(payload: &[u8]) -> Option<AddressEntry> {
        let attrs = nl::attributes(payload, 8);
        let v4 = |d: &[u8]| <[u8; 4]>::try_from(d).ok().map(Ipv4Addr::from);
        let a =
            attrs.iter().find(|(t, _)| *t == nl::IFA_LOCAL).or(attrs.iter().find(|(t, _)| *t == nl::IFA_ADDRESS))?;
        Some(AddressEntry { local: v4(a.1)? })
    }
}

fn address_entries(s: &Socket) -> Result<Vec<AddressEntry>> {
    let replies = s
        .call(Message::dump(nl::RTM_GETADDR, nl::AF_INET))
        .map_err(|source| Error::NetlinkDump { what: "addresses", source })?;
    Ok(replies.iter().filter_map(|r| AddressEntry::parse(r)).collect())
}

/// The IPv4 routes of this namespace (every table).
pub fn routes() -> Result<Vec<HostRoute>> {
    let s = socket()?;
    let replies = s
        .call(Message::dump(nl::RTM_GETROUTE, nl::AF_INET))
        .map_err(|source| Error::NetlinkDump { what: "routes", source })?;
    Ok(replies
        .iter()
        .filter_map(|r| {
            let prefix = *r.get(1)?;
            let mut table = *r.get(4)? as u32;
            let attrs = nl::attributes(r, 12);
            let mut dst = Ipv4Addr::UNSPECIFIED;
            let mut oif = None;
            for (t, d) in attrs {
                match t {
                    nl::RTA_DST => dst = Ipv4Addr::from(<[u8; 4]>::try_from(d).ok()?),
                    nl::RTA_OIF => oif = Some(i32::from_ne_bytes(d.try_into().ok()?)),
                    nl::RTA_TABLE => table = u32::from_ne_bytes(d.try_into().ok()?),
                    _ => {}
                }
            }
            Some(HostRoute { dst: Ipv4Net::new(dst, prefix), oif, table })
        })
        .collect())
}

/// A destination a namespace delivers to itself (see [`local_routes_on`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalNet {
    V4(Ipv4Net),
    V6(Ipv6Net),
}

impl LocalNet {
    pub fn v4(&self) -> Option<Ipv4Net> {
        match self {
            LocalNet::V4(n) => Some(*n),
            LocalNet::V6(_) => None,
        }
    }
    pub fn v6(&self) -> Option<Ipv6Net> {
        match self {
            LocalNet::V6(n) => Some(*n),
            LocalNet::V4(_) => None,
        }
    }
    /// Whether all of `other` is inside this one (the same family).
    pub fn covers(&self, other: &LocalNet) -> bool {
        match (self, other) {
            (LocalNet::V4(a), LocalNet::V4(b)) => a.covers(b),
            (LocalNet::V6(a), LocalNet::V6(b)) => a.covers(b),
            _ => false,
        }
    }
}

impl std::fmt::Display for LocalNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LocalNet::V4(n) => n.fmt(f),
            LocalNet::V6(n) => n.fmt(f),
        }
    }
}

/// Everything the namespace `s` was opened in delivers to itself: its local table's
/// local, broadcast and anycast routes, IPv4 (and IPv6 when `ipv6`). More than its
/// addresses: an address on loopback makes its whole prefix local
/// (`ip addr add 10.50.0.1/16 dev lo`), and `ip route add local NET` makes a network local
/// with no address at all (AnyIP). So do local routes an operator put in the main or
/// default table (`ip route add local NET dev lo table main`), which every packet's
/// lookup reaches too (found by a red-team pass: rootless jobs reached them through
/// pasta). Those of other tables are left out: a policy rule chooses who meets them
/// (TPROXY's `local default dev lo table 100` would refuse jobs the world). The local
/// table and the local routes of every table alone where `s` filters dumps (see
/// [`Socket::filter_dumps`]), every route elsewhere, filtered here.
pub fn local_routes_on(s: &Socket, ipv6: bool) -> Result<Vec<LocalNet>> {
    let mut out = Vec::new();
    let families: &[(u8, &'static str)] = if ipv6 {
        &[(nl::AF_INET, "local routes"), (nl::AF_INET6, "IPv6 local routes")]
    } else {
        &[(nl::AF_INET, "local routes")]
    };
    for (family, what) in families {
        let replies = s
            .call(Message::dump_routes(*family, nl::RT_TABLE_LOCAL as u8))
            .map_err(|source| Error::NetlinkDump { what, source })?;
        out.extend(replies.iter().filter_map(|r| local_route(r)));
        let replies = s
            .call(Message::dump_routes_of_type(*family, 0, nl::RTN_LOCAL))
            .map_err(|source| Error::NetlinkDump { what, source })?;
        for n in replies.iter().filter(|r| route_table(r) != Some(nl::RT_TABLE_LOCAL)).filter_map(|r| local_route(r)) {
            if !out.contains(&n) {
                out.push(n);
            }
        }
    }
    Ok(out)
}

/// The table of an `RTM_NEWROUTE` payload (its attribute where the header's byte cannot
/// say it).
fn route_table(payload: &[u8]) -> Option<u32> {
    let table = *payload.get(4)? as u32;
    let attr = nl::attributes(payload, 12).into_iter().find(|(t, _)| *t == nl::RTA_TABLE);
    Some(attr.and_then(|(_, d)| d.try_into().ok().map(u32::from_ne_bytes)).unwrap_or(table))
}

/// The destination of an `RTM_NEWROUTE` payload (a dump's reply or a notification) when
/// it is a route of a type the host delivers to itself, in a table every lookup reaches:
/// local, broadcast and anycast routes of the local table, local routes of the main and
/// default tables (see [`local_routes_on`]).
pub fn local_route(payload: &[u8]) -> Option<LocalNet> {
    let (family, dst_len, kind) = (*payload.first()?, *payload.get(1)?, *payload.get(7)?);
    if ![nl::RTN_LOCAL, nl::RTN_BROADCAST, nl::RTN_ANYCAST].contains(&kind) {
        return None;
    }
    // The main and default tables' local routes alone: what a filtered dump of every
    // table's local routes returns, and an unfiltered one the same.
    let table = route_table(payload)?;
    let main_or_default = [nl::RT_TABLE_MAIN as u32, nl::RT_TABLE_DEFAULT].contains(&table);
    if !(table == nl::RT_TABLE_LOCAL || main_or_default && kind == nl::RTN_LOCAL) {
        return None;
    }
    let dst = nl::attributes(payload, 12).into_iter().find(|(t, _)| *t == nl::RTA_DST).map(|(_, d)| d);
    match family {
        nl::AF_INET => {
            let a = dst.map_or(Some(Ipv4Addr::UNSPECIFIED), |d| <[u8; 4]>::try_from(d).ok().map(Ipv4Addr::from))?;
            Some(LocalNet::V4(Ipv4Net::new(a, dst_len)))
        }
        nl::AF_INET6 => {
            let a = dst.map_or(Some(Ipv6Addr::UNSPECIFIED), |d| <[u8; 16]>::try_from(d).ok().map(Ipv6Addr::from))?;
            Some(LocalNet::V6(Ipv6Net::new(a, dst_len)))
        }
        _ => None,
    }
}

/// The host's own IPv4 addresses among its local destinations `local` (see
/// [`local_routes_on`]): the single ones, its links' addresses and the broadcast addresses
/// the kernel delivers to with them (those of their subnets, with or without `brd`, and an
/// explicit `brd`); the limited broadcast left out (a job's own table refuses it).
pub fn own_addresses(local: &[LocalNet]) -> Vec<Ipv4Addr> {
    let single = local.iter().filter_map(LocalNet::v4).filter(|n| n.prefix == 32).map(|n| n.addr);
    single.filter(|a| *a != Ipv4Addr::BROADCAST).collect()
}

/// The links of this namespace: `(index, name)`.
pub fn links() -> Result<Vec<(i32, String)>> {
    let s = socket()?;
    let replies =
        s.call(Message::dump(nl::RTM_GETLINK, 0)).map_err(|source| Error::NetlinkDump { what: "links", source })?;
    Ok(replies.iter().filter_map(|r| index_and_name(r)).collect())
}

/// `(index, name)` of an `RTM_NEWLINK` reply.
fn index_and_name(reply: &[u8]) -> Option<(i32, String)> {
    let index = i32::from_ne_bytes(reply.get(4..8)?.try_into().ok()?);
    let name = nl::attributes(reply, 16).into_iter().find(|(t, _)| *t == nl::IFLA_IFNAME)?.1;
    Some((index, nl::attr_text(name)))
}

/// The name of this namespace's link `index`, asked for that link alone (not a dump, which
/// a link removed meanwhile can cut short on older kernels); None: no such link (ENODEV).
pub fn link_name(index: i32) -> Result<Option<String>> {
    let s = socket()?;
    match s.call(Message::link(nl::RTM_GETLINK, 0, index, 0, 0)) {
        Err(Errno::ENODEV) => Ok(None),
        Err(source) => Err(Error::LinkName { index, source }),
        Ok(replies) => Ok(replies.first().and_then(|r| index_and_name(r)).map(|(_, name)| name)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_killed_jobs_address_another_job_holds_now_is_that_jobs() {
        use std::net::IpAddr;
        let (a, b): (IpAddr, IpAddr) = ("10.87.0.5".parse().unwrap(), "fd61:7a70:7362::a57:5".parse().unwrap());
        let links = vec![(7, "azp00000000000a".to_string()), (9, "azp00000000000b".to_string())];
        let route = |oif| HostRoute { dst: Ipv4Net::host("10.87.0.5".parse().unwrap()), oif: Some(oif), table: 254 };
        // On the job's own link (its helper forgets at its end), or on no link (gone with
        // the killed job's namespace): the job's, both addresses.
        assert_eq!(still_the_jobs(&[a, b], "azp00000000000a", None, &[route(7)], &links), vec![a, b]);
        assert_eq!(still_the_jobs(&[a, b], "azp00000000000a", None, &[], &links), vec![a, b]);
        // Claimed by another job's link since: neither (the IPv6 one is made of it).
        assert_eq!(still_the_jobs(&[a, b], "azp00000000000a", None, &[route(9)], &links), Vec::<IpAddr>::new());
        // Unless that link is the heir asking, before its own job started: still the
        // killed job's, both.
        let heir = Some("azp00000000000b");
        assert_eq!(still_the_jobs(&[a, b], "azp00000000000a", heir, &[route(9)], &links), vec![a, b]);
        // A wider route through another link (the host's own) holds nothing.
        let wide = HostRoute { dst: Ipv4Net::new("10.87.0.0".parse().unwrap(), 16), oif: Some(9), table: 254 };
        assert_eq!(still_the_jobs(&[a], "azp00000000000a", None, &[wide], &links), vec![a]);
    }

    /// As root, in a namespace of its own with 300 routes in its main table: the dump of
    /// its local table returns that table alone where the socket filters dumps, and the
    /// same local destinations as an unfiltered dump; those include a local route of the
    /// main table, not one of a table that only a policy rule would choose.
    #[test]
    #[cfg_attr(not(test_as_root), ignore = "needs root: a network namespace")]
    fn the_local_tables_dump_is_filtered_by_the_kernel() {
        if !nix::unistd::geteuid().is_root() {
            return crate::test_skip::skip("needs root: a network namespace of its own");
        }
        nl::in_fresh_namespace(|| {
            let plain = Socket::open(Proto::Route).unwrap();
            for k in 0..300u32 {
                let flags = nl::NLM_F_CREATE | nl::NLM_F_EXCL;
                let mut m = Message::route(flags, 24, nl::RT_SCOPE_UNIVERSE, nl::RTN_PROHIBIT);
                m.attr_ipv4(nl::RTA_DST, Ipv4Addr::new(10, 200 + (k / 256) as u8, (k % 256) as u8, 0));
                plain.request(m).unwrap();
            }
            for (dst, table) in [(Ipv4Addr::new(10, 250, 0, 0), nl::RT_TABLE_MAIN as u32), (Ipv4Addr::UNSPECIFIED, 100)]
            {
                let flags = nl::NLM_F_CREATE | nl::NLM_F_EXCL;
                let mut m = Message::route(flags, if table == 100 { 0 } else { 16 }, nl::RT_SCOPE_HOST, nl::RTN_LOCAL);
                m.attr_ipv4(nl::RTA_DST, dst).attr_u32(nl::RTA_TABLE, table).attr_u32(nl::RTA_OIF, 1);
                plain.request(m).unwrap();
            }
            let strict = Socket::open(Proto::Route).unwrap();
            assert!(strict.filter_dumps(), "Linux 4.20+ filters dumps");
            let locals = strict.call(Message::dump_routes_of_type(nl::AF_INET, 0, nl::RTN_LOCAL)).unwrap();
            assert!(locals.len() < 10, "every table's local routes alone: {}", locals.len());
            let dump = |s: &Socket| s.call(Message::dump_routes(nl::AF_INET, nl::RT_TABLE_LOCAL as u8)).unwrap();
            let (filtered, all) = (dump(&strict), dump(&plain));
            assert!(all.len() > 300, "unfiltered: every table ({})", all.len());
            assert!(!filtered.is_empty() && filtered.len() < 10, "the local table alone: {}", filtered.len());
            assert!(filtered.iter().all(|r| local_route(r).is_some()), "local routes only");
            let (a, b) = (local_routes_on(&strict, true).unwrap(), local_routes_on(&plain, true).unwrap());
            assert!(a.len() == b.len() && a.iter().all(|n| b.contains(n)), "the same, in any order: {a:?} {b:?}");
            assert!(a.contains(&LocalNet::V4(Ipv4Net::new(Ipv4Addr::new(127, 0, 0, 0), 8))), "{a:?}");
            assert!(a.contains(&LocalNet::V4(Ipv4Net::new(Ipv4Addr::new(10, 250, 0, 0), 16))), "main's: {a:?}");
            assert!(!a.iter().any(|n| n.v4().is_some_and(|n| n.prefix == 0)), "table 100's: {a:?}");
        });
    }

    /// As root, in a namespace of its own: the host's own addresses read from its local
    /// table are its links' addresses, their subnets' broadcasts (with or without `brd`)
    /// and an explicit `brd`; its IPv6 local destinations hold its addresses, and with an
    /// address that has a peer, the address, not the peer (the kernel's word against ours).
    #[test]
    #[cfg_attr(not(test_as_root), ignore = "needs root: a network namespace")]
    fn the_hosts_own_addresses_are_its_local_tables() {
        let (v4, v6) = nl::in_fresh_namespace(|| {
            let ip = |args: &[&str]| {
                let o = std::process::Command::new("ip").args(args).output().unwrap();
                assert!(o.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&o.stderr));
            };
            ip(&["link", "add", "t0", "type", "veth", "peer", "name", "t1"]);
            ip(&["link", "set", "t0", "up"]);
            ip(&["addr", "add", "198.18.0.1/30", "dev", "t0"]);
            ip(&["addr", "add", "10.9.0.1/24", "brd", "10.9.0.127", "dev", "t0"]);
            ip(&["addr", "add", "192.0.2.1/31", "dev", "t0"]);
            ip(&["-6", "addr", "add", "2001:db8::7/64", "dev", "t0", "nodad"]);
            ip(&["-6", "addr", "add", "2001:db8:1::11", "peer", "2001:db8:1::12", "dev", "t0", "nodad"]);
            let s = Socket::open(Proto::Route).unwrap();
            // The kernel adds an IPv6 address's local route from its address work queue,
            // after `ip addr add` returns: read until both are there (5 s at most; a loaded
            // machine showed them late in 4 of 12 runs of the unit tests).
            let want: [Ipv6Addr; 2] = ["2001:db8::7".parse().unwrap(), "2001:db8:1::11".parse().unwrap()];
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            loop {
                let local = local_routes_on(&s, true).unwrap();
                let v6: Vec<Ipv6Addr> =
                    local.iter().filter_map(LocalNet::v6).filter(|n| n.prefix == 128).map(|n| n.addr).collect();
                if want.iter().all(|a| v6.contains(a)) || std::time::Instant::now() > deadline {
                    break (own_addresses(&local), v6);
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        });
        for a in ["198.18.0.1", "198.18.0.3", "10.9.0.1", "10.9.0.127", "10.9.0.255", "192.0.2.1", "127.0.0.1"] {
            assert!(v4.contains(&a.parse().unwrap()), "{a}: {v4:?}");
        }
        assert!(!v4.contains(&Ipv4Addr::new(192, 0, 2, 0)), "a /31 has no broadcast: {v4:?}");
        for a in ["2001:db8::7", "2001:db8:1::11"] {
            assert!(v6.contains(&a.parse().unwrap()), "{a}: {v6:?}");
        }
        assert!(!v6.contains(&"2001:db8:1::12".parse().unwrap()), "the peer: {v6:?}");
    }

    /// The word of the child making a job's namespace, as `Made::enter` takes it, with
    /// `fds` stand-in fds (any fd stands in for the namespace's: no privilege needed).
    fn entered_with(text: &str, fds: usize) -> Result<()> {
        let (rx, tx) = std::os::unix::net::UnixStream::pair().unwrap();
        let stand_in = std::fs::File::open("/dev/null").unwrap();
        send_namespace(&tx, text, &vec![stand_in.as_fd(); fds]);
        drop(tx);
        let sysfs = PathBuf::from("/nonexistent/azp-test/sys");
        let mut made = Made { entering: Some(Entering { ready: rx, sysfs }), ..Default::default() };
        made.enter()
    }

    #[test]
    fn the_namespaces_word_and_fds_cross_and_failures_keep_their_kind() {
        let (rx, tx) = std::os::unix::net::UnixStream::pair().unwrap();
        let f = std::fs::File::open("/dev/null").unwrap();
        let dir = std::fs::File::open("/").unwrap();
        send_namespace(&tx, "ok\n", &[f.as_fd(), dir.as_fd()]);
        let (text, fds) = receive_namespace(&rx);
        assert_eq!(text, "ok\n");
        assert_eq!(fds.len(), 2, "both fds came along");
        assert!(fs_at_is_char_device(&fds[0]), "in order");
        // Its sysfs is attached before the namespace is entered: a stand-in is no mount.
        let e = entered_with("ok\n", 2).unwrap_err();
        assert!(matches!(e, Error::MountSysfs { .. }), "{e}");
        // The unshare's EPERM stays that error (the job's record says "not permitted").
        assert!(matches!(entered_with("unshare 1\n", 0), Err(Error::UnshareNetNs(nix::errno::Errno::EPERM))));
        let e = entered_with("err cannot mount sysfs\n", 0).unwrap_err();
        assert_eq!(e.to_string(), "cannot make the job's network namespace: cannot mount sysfs");
        // A child gone without a word, or a word without its namespace and its sysfs.
        assert!(matches!(entered_with("", 0), Err(Error::MakeJobNetns(_))));
        assert!(matches!(entered_with("ok\n", 0), Err(Error::MakeJobNetns(_))));
        assert!(matches!(entered_with("ok\n", 1), Err(Error::MakeJobNetns(_))));
    }

    fn fs_at_is_char_device(fd: &OwnedFd) -> bool {
        nix::sys::stat::fstat(fd.as_raw_fd()).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFCHR)
    }
    #[test]
    fn the_veth_childs_report_reads_back() {
        let a = Ipv4Addr::new(10, 87, 0, 9);
        let a6: Ipv6Addr = "fd00:a:b::a57:9".parse().unwrap();
        assert_eq!(parse_configured(&format!("ok {a} {}", dash_or(Some(a6)))), Some((a, Some(a6))));
        assert_eq!(parse_configured(&format!("ok {a} {}", dash_or(None))), Some((a, None)));
        for bad in ["", "ok", "ok 10.87.0.9", "ok x -", "err no free job address left in 10.87.0.0/16"] {
            assert_eq!(parse_configured(bad), None, "{bad:?}");
        }
    }

    #[test]
    #[cfg_attr(not(test_as_root), ignore = "needs root: a network namespace of its own")]
    fn the_nftables_watch_sees_a_flush_and_stops_when_told() {
        if !nix::unistd::geteuid().is_root() {
            return crate::test_skip::skip("needs root: a network namespace of its own");
        }
        let Some(nft) = ["/usr/sbin/nft", "/sbin/nft"].into_iter().find(|p| Path::new(p).exists()) else {
            return crate::test_skip::skip("needs nft (Debian nftables)");
        };
        // This thread alone, and the nft it starts, in a fresh network namespace. A watch
        // that misses a change blocks: the test waits 10 s for the thread's word.
        let (done_tx, done) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            unshare(CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
            let nft = |args: &[&str]| assert!(std::process::Command::new(nft).args(args).status().unwrap().success());
            let watch = NftablesWatch::subscribe().unwrap();
            let (stop_rx, stop_tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
            // Made, then another table made and deleted: none of it deletes from `t`.
            nft(&["add", "table", "inet", "t"]);
            nft(&["add", "table", "inet", "other"]);
            nft(&["delete", "table", "inet", "other"]);
            nft(&["add", "table", "ip", "t"]);
            nft(&["delete", "table", "ip", "t"]);
            nft(&["flush", "ruleset"]);
            assert!(watch.wait(stop_rx.as_fd(), "t").unwrap(), "a firewall reload's flush");
            // Only others' changes, then the stop: the watch wakes for them and waits on.
            nft(&["add", "table", "inet", "other"]);
            let stopper = std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(300));
                drop(stop_tx);
            });
            assert!(!watch.wait(stop_rx.as_fd(), "t").unwrap(), "its stop closed, nothing of t's changed");
            stopper.join().unwrap();
            done_tx.send(()).unwrap();
        });
        done.recv_timeout(std::time::Duration::from_secs(10)).expect("the watch saw each change, then stopped");
    }

    #[test]
    #[cfg_attr(not(test_as_root), ignore = "needs root: a network namespace of its own")]
    fn a_link_is_named_by_its_index_alone() {
        if !nix::unistd::geteuid().is_root() {
            return crate::test_skip::skip("needs root: a network namespace of its own");
        }
        // This thread alone gets a fresh network namespace: its only link is lo, index 1.
        std::thread::spawn(|| {
            unshare(CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
            assert_eq!(link_name(1).unwrap().as_deref(), Some("lo"));
            assert_eq!(link_name(4242).unwrap(), None, "no such link: None, not an error");
        })
        .join()
        .unwrap();
    }

    #[test]
    #[cfg_attr(not(test_as_root), ignore = "needs root: a network namespace of its own")]
    fn a_runners_thread_makes_a_none_namespace_and_leaves_the_process_in_its_own() {
        use std::os::unix::fs::MetadataExt;
        if !nix::unistd::geteuid().is_root() {
            return crate::test_skip::skip("needs root: a network namespace of its own");
        }
        let ours = std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino();
        let (maker, ready) = loopback_maker().unwrap();
        let thread = maker.start();
        let (said, fds) = receive_namespace(&std::os::unix::net::UnixStream::from(ready));
        drop(thread);
        assert_eq!(said.trim(), "ok");
        assert_eq!(fds.len(), 2, "the namespace and its sysfs");
        let ns = std::fs::File::from(fds.into_iter().next().unwrap());
        let made = ns.metadata().unwrap().ino();
        assert_ne!(made, ours, "the thread's own namespace was sent, not the process's");
        assert_eq!(std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino(), ours, "this thread stays");
        // Its loopback is up: a thread in it finds lo and nothing else.
        std::thread::spawn(move || {
            nix::sched::setns(ns, CloneFlags::CLONE_NEWNET).unwrap();
            assert_eq!(link_name(1).unwrap().as_deref(), Some("lo"));
            assert_eq!(link_name(2).unwrap(), None);
            let dev = std::fs::read_to_string("/proc/thread-self/net/dev").unwrap();
            assert!(dev.lines().count() == 3 && dev.contains("lo:"), "{dev}");
            // Up: a connection to 127.0.0.1 goes through (ENETUNREACH on a fresh one's).
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            std::net::TcpStream::connect(l.local_addr().unwrap()).expect("a connection over an up loopback");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_word_to_a_helper_gone_already_raises_no_sigpipe() {
        use nix::sys::signal::{SigSet, SigmaskHow, Signal};
        // Blocked, a SIGPIPE stays pending on this thread even where it is ignored (as
        // in this test binary): that is what would kill a runner whose thread sends.
        let mut pipe = SigSet::empty();
        pipe.add(Signal::SIGPIPE);
        let mut old = SigSet::empty();
        nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&pipe), Some(&mut old)).unwrap();
        let (to, helper) = std::os::unix::net::UnixStream::pair().unwrap();
        drop(helper);
        send_namespace(&to, "ok\n", &[]);
        // SAFETY: sigpending(2) fills the sigset_t we own for the call, nothing more.
        let pending = unsafe {
            let mut set = std::mem::zeroed::<libc::sigset_t>();
            assert_eq!(libc::sigpending(&mut set), 0);
            libc::sigismember(&set, libc::SIGPIPE) == 1
        };
        nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None).unwrap();
        assert!(!pending, "a SIGPIPE was raised");
    }

    #[test]
    fn networks() {
        let n = Ipv4Net::new(Ipv4Addr::new(10, 87, 3, 9), 16);
        assert_eq!(n.to_string(), "10.87.0.0/16");
        assert!(n.contains(Ipv4Addr::new(10, 87, 255, 1)) && !n.contains(Ipv4Addr::new(10, 88, 0, 1)));
        assert!(n.overlaps(&Ipv4Net::new(Ipv4Addr::new(10, 0, 0, 0), 8)));
        assert!(n.overlaps(&Ipv4Net::host(Ipv4Addr::new(10, 87, 1, 1))));
        assert!(!n.overlaps(&Ipv4Net::new(Ipv4Addr::new(10, 86, 0, 0), 16)));
        assert!(Ipv4Net::new(Ipv4Addr::UNSPECIFIED, 0).overlaps(&n), "a default route overlaps everything");
        assert_eq!((n.nth(1), n.size()), (Ipv4Addr::new(10, 87, 0, 1), 65536));
    }

    #[test]
    fn addresses_a_killed_job_may_have_connections_on_are_claimed_last() {
        let a = |d: u8| Ipv4Addr::new(10, 87, 0, d);
        let mut v = veth_of(Ipv4Net::new(a(0), 29));
        v.first_try = 5;
        // Round the pool from the first try, not the subnet's, the gateway or broadcast.
        assert_eq!(claim_order(&v).collect::<Vec<_>>(), [a(5), a(6), a(2), a(3), a(4)]);
        v.avoid = vec![a(6), a(3), Ipv4Addr::new(10, 88, 0, 6)];
        assert_eq!(claim_order(&v).collect::<Vec<_>>(), [a(5), a(2), a(4), a(6), a(3)]);
    }

    /// A job's veth over `pool` (its gateway the pool's first address).
    fn veth_of(pool: Ipv4Net) -> Veth {
        Veth {
            host_name: "azpj1".into(),
            host_mac: [2, 0, 0, 0, 0, 1],
            job_mac: [2, 0, 0, 0, 0, 2],
            group: 7,
            gateway: pool.nth(1),
            pool,
            first_try: 2,
            avoid: vec![],
            routes: vec![],
            lock: PathBuf::from("/run/l"),
            table: "t".into(),
            v6: None,
            filter: JobFilter::default(),
        }
    }

    #[test]
    fn the_veth_pair_gets_one_queue_each_way_on_both_ends() {
        let v = veth_of(Ipv4Net::new(Ipv4Addr::new(10, 87, 0, 0), 16));
        let b = veth_message(&v, 9).finish(1, 0);
        let top = nl::attributes(&b[16..], 16);
        let one = &1u32.to_ne_bytes()[..];
        let has = |attrs: &[(u16, &[u8])], t: u16| attrs.iter().any(|(k, val)| *k == t && *val == one);
        assert!(has(&top, nl::IFLA_NUM_TX_QUEUES) && has(&top, nl::IFLA_NUM_RX_QUEUES), "the host end: {top:?}");
        let info = nl::attributes(top.iter().find(|(k, _)| *k == nl::IFLA_LINKINFO).unwrap().1, 0);
        let peer = nl::attributes(info[1].1, 0)[0].1;
        let peer_attrs = nl::attributes(peer, 16);
        assert!(has(&peer_attrs, nl::IFLA_NUM_TX_QUEUES) && has(&peer_attrs, nl::IFLA_NUM_RX_QUEUES), "the job's end");
        assert!(peer_attrs.contains(&(nl::IFLA_NET_NS_FD, &9u32.to_ne_bytes()[..])));
        // The job's end has its fixed MAC with IPv4 alone too (the host's neighbour
        // entry for the job's address names it).
        assert_eq!(v.v6, None);
        assert!(peer_attrs.contains(&(nl::IFLA_ADDRESS, &v.job_mac[..])), "{peer_attrs:?}");
    }

    #[test]
    fn the_host_end_gets_its_settings_before_it_comes_up() {
        let m = af_spec(7, true);
        let b = m.finish(1, 0);
        let spec = nl::attributes(&b[16..], 16);
        assert_eq!(spec[0].0, nl::IFLA_AF_SPEC);
        let fams = nl::attributes(spec[0].1, 0);
        assert_eq!((fams[0].0, fams[1].0), (nl::AF_INET as u16, nl::AF_INET6 as u16));
        let conf = nl::attributes(nl::attributes(fams[0].1, 0)[0].1, 0);
        assert_eq!(
            conf,
            vec![
                (nl::IPV4_DEVCONF_RP_FILTER, &1u32.to_ne_bytes()[..]),
                (nl::IPV4_DEVCONF_ROUTE_LOCALNET, &1u32.to_ne_bytes()[..])
            ]
        );
        assert_eq!(nl::attributes(fams[1].1, 0), vec![(nl::IFLA_INET6_ADDR_GEN_MODE, &[1u8][..])]);
        let job = af_spec(2, false).finish(1, 0);
        let fams = nl::attributes(nl::attributes(&job[16..], 16)[0].1, 0);
        assert_eq!(fams.len(), 1, "the job's end gets no IPv4 settings");
    }
}
