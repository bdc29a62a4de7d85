//! Exec and exit events of the host's processes, from the kernel's process events
//! connector (netlink, needs root), stamped by the kernel (CLOCK_MONOTONIC, the clock
//! behind `Instant`). The agent bench uses them to time a refill exactly as issue 7
//! words it: from one agent's `run.sh --once` exit to the next agent process of the same
//! slot running, without instrumenting the product or the fake agent.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
const PROC_CN_MCAST_LISTEN: u32 = 1;
const PROC_EVENT_EXEC: u32 = 0x2;
const PROC_EVENT_EXIT: u32 = 0x8000_0000;
/// nlmsghdr (16 bytes) + cn_msg (20 bytes): where `struct proc_event` starts.
const EVENT_AT: usize = 36;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The process exec'd a program whose argv[1] is the tracked script.
    Exec,
    /// A tracked process (pid == tgid) exited.
    Exit,
}

#[derive(Debug, Clone)]
pub struct Event {
    pub at: Instant,
    pub kind: Kind,
    /// What the classifier named the process at its exec (e.g. `./run.sh`).
    pub script: String,
    /// `AZP_AGENT_NAME` from the process's environment.
    pub agent: String,
}

pub struct ProcEvents {
    events: Arc<Mutex<Vec<Event>>>,
    lost: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ProcEvents {
    /// Listens for execs that `classify` names (from the argv read at the event), and for
    /// the exits of those processes. Errors when the connector is unavailable (not root,
    /// no CONFIG_PROC_EVENTS). The argv is read after the event arrives, so a busy listener
    /// may see what the process exec'd next: `classify` should name those too.
    pub fn start(classify: fn(&[String]) -> Option<&'static str>) -> std::io::Result<ProcEvents> {
        let sock = open_listener()?;
        let events = Arc::new(Mutex::new(Vec::new()));
        let lost = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (ev, lo, st) = (events.clone(), lost.clone(), stop.clone());
        let thread = std::thread::spawn(move || listen(sock, classify, ev, lo, st));
        Ok(ProcEvents { events, lost, stop, thread: Some(thread) })
    }

    pub fn clear(&self) {
        self.events.lock().unwrap().clear();
    }

    pub fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }

    /// Event messages the kernel dropped because this listener fell behind (ENOBUFS).
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }
}

impl Drop for ProcEvents {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// For each exit of `from` (e.g. `./run.sh`), the time to the same agent's next exec of
/// `to` (e.g. `./config.sh`), in ms.
pub fn gaps(events: &[Event], from: &str, to: &str) -> Vec<f64> {
    let mut out = vec![];
    for (i, e) in events.iter().enumerate() {
        if e.kind == Kind::Exit && e.script == from {
            if let Some(n) =
                events[i + 1..].iter().find(|n| n.kind == Kind::Exec && n.script == to && n.agent == e.agent)
            {
                out.push(n.at.saturating_duration_since(e.at).as_secs_f64() * 1e3);
            }
        }
    }
    out
}

fn open_listener() -> std::io::Result<OwnedFd> {
    // SAFETY: socket(2) with constant arguments; the fd is owned right away.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, libc::NETLINK_CONNECTOR) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket that nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_nl is plain data; all-zero is a valid value to fill in.
    let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    sa.nl_family = libc::AF_NETLINK as u16;
    sa.nl_groups = CN_IDX_PROC;
    let len = std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t;
    // SAFETY: sa is a valid sockaddr_nl of `len` bytes.
    if unsafe { libc::bind(fd, &sa as *const _ as *const libc::sockaddr, len) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // A big receive buffer (the churn phase forks thousands of processes) and a timeout
    // so the thread notices `stop`. Failures only mean more lost events or a late stop.
    let buf: libc::c_int = 32 << 20;
    let tv = libc::timeval { tv_sec: 0, tv_usec: 200_000 };
    // SAFETY: setsockopt with pointers to live values of the sizes given.
    unsafe {
        libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &buf as *const _ as *const libc::c_void, 4);
        let tvlen = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
        libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv as *const _ as *const libc::c_void, tvlen);
    }
    // nlmsghdr + cn_msg + the op: "send me process events".
    let mut msg = Vec::with_capacity(40);
    msg.extend_from_slice(&40u32.to_ne_bytes()); // nlmsg_len
    msg.extend_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes());
    msg.extend_from_slice(&0u16.to_ne_bytes()); // flags
    msg.extend_from_slice(&0u32.to_ne_bytes()); // seq
    msg.extend_from_slice(&std::process::id().to_ne_bytes());
    msg.extend_from_slice(&CN_IDX_PROC.to_ne_bytes());
    msg.extend_from_slice(&CN_VAL_PROC.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes()); // seq
    msg.extend_from_slice(&0u32.to_ne_bytes()); // ack
    msg.extend_from_slice(&4u16.to_ne_bytes()); // len of the data
    msg.extend_from_slice(&0u16.to_ne_bytes()); // flags
    msg.extend_from_slice(&PROC_CN_MCAST_LISTEN.to_ne_bytes());
    // SAFETY: sockaddr_nl is plain data; all-zero addresses the kernel.
    let mut to: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    to.nl_family = libc::AF_NETLINK as u16;
    // SAFETY: msg and `to` are live buffers of the lengths given.
    let sent = unsafe {
        libc::sendto(
            fd,
            msg.as_ptr() as *const libc::c_void,
            msg.len(),
            0,
            &to as *const _ as *const libc::sockaddr,
            len,
        )
    };
    if sent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(sock)
}

fn listen(
    sock: OwnedFd,
    classify: fn(&[String]) -> Option<&'static str>,
    events: Arc<Mutex<Vec<Event>>>,
    lost: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) {
    // Kernel timestamps -> Instant: both are CLOCK_MONOTONIC.
    let (anchor, anchor_ns) = (Instant::now(), monotonic_ns());
    let to_instant = |ns: u64| {
        if ns >= anchor_ns {
            anchor + Duration::from_nanos(ns - anchor_ns)
        } else {
            anchor - Duration::from_nanos(anchor_ns - ns)
        }
    };
    let mut tracked: HashMap<i32, (String, String)> = HashMap::new();
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: buf is a live buffer of the length given.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
        if n < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOBUFS) {
                lost.fetch_add(1, Ordering::Relaxed);
            }
            continue;
        }
        let b = &buf[..n as usize];
        if b.len() < EVENT_AT + 24 {
            continue;
        }
        let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap());
        let what = u32_at(EVENT_AT);
        let ts = u64::from_ne_bytes(b[EVENT_AT + 8..EVENT_AT + 16].try_into().unwrap());
        let (pid, tgid) = (u32_at(EVENT_AT + 16) as i32, u32_at(EVENT_AT + 20) as i32);
        if pid != tgid {
            continue; // a thread
        }
        let event = match what {
            PROC_EVENT_EXEC => {
                let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
                let argv: Vec<String> =
                    cmdline.split(|&x| x == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
                let Some(script) = classify(&argv).map(str::to_string) else { continue };
                let agent = agent_of(pid).unwrap_or_default();
                if tracked.get(&pid).is_some_and(|(s, _)| *s == script) {
                    continue; // the same program's next exec (e.g. run.sh -> Agent.Listener)
                }
                tracked.insert(pid, (script.clone(), agent.clone()));
                Event { at: to_instant(ts), kind: Kind::Exec, script, agent }
            }
            PROC_EVENT_EXIT => {
                let Some((script, agent)) = tracked.remove(&pid) else { continue };
                Event { at: to_instant(ts), kind: Kind::Exit, script, agent }
            }
            _ => continue,
        };
        events.lock().unwrap().push(event);
    }
}

fn agent_of(pid: i32) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|&x| x == 0)
        .find_map(|kv| kv.strip_prefix(b"AZP_AGENT_NAME=").map(|v| String::from_utf8_lossy(v).into_owned()))
}

fn monotonic_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the live timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}
