//! The escape suite (issue 6), root mode: a CI job is untrusted code, so every test here
//! is an attack by the job on the host, on azp-sandbox or on the next job, with the exact
//! outcome asserted. Most run the attacker both as root inside the sandbox and as
//! `--user 1000:1000`.
//!
//! The attacks run in a rootfs built for the suite: the busybox fixture plus
//! `/bin/probe` (a static C program, compiled once from `PROBE_C`, that makes single
//! syscalls and prints `TOKEN: OK` or `TOKEN: <errno name>`, so a test asserts EPERM and
//! not just "some command failed"), and setuid-root (04755, owned by 0) copies of both:
//! `/bin/busybox-suid` and `/bin/probe-suid`.
//!
//! Already covered elsewhere (not repeated here): pid 1 and exit codes, the process
//! count, dataset read-only, /etc and /root writes not reaching the next job, the basic
//! memory limit and fork bomb, SIGTERM forwarding, SIGKILL of exec+helper then gc, and
//! `unshare -U` (tests/sandbox_exec.rs); a job's view of its GPUs and CAP_MKNOD on
//! /dev/nvidia0 (tests/gpu_sandbox.rs); the PAT in env/argv/files of a real agent job
//! (tests/agent_runner.rs); hostile tarballs (tests/rootfs_import.rs).
//!
//! SECURITY.md has the results table of this suite.

mod common;

/// The host's nftables table is root mode's: rootless, skipped (visibly). Before the
/// network modules, which use it.
macro_rules! root_mode_only {
    () => {
        root_mode_only!("rootless jobs have no host table (pasta, no forwarding)")
    };
    ($why:expr) => {
        if rootless() {
            return common::skip::skip($why);
        }
    };
}

#[path = "escape/identity.rs"]
mod identity;
#[path = "escape/network.rs"]
mod network;
#[path = "escape/network_proxy.rs"]
mod network_proxy;
#[path = "escape/network_v6.rs"]
mod network_v6;
#[path = "escape/review.rs"]
mod review;
use common::digest::{hex, sha256_file, sha256_hex};
use common::*;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------

/// The probe: each argument is `OP[:ARG...]`; prints `ARGUMENT: OK` or `ARGUMENT: ENAME`.
const PROBE_C: &str = r#"
#define _GNU_SOURCE
#include <dirent.h>
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <linux/sock_diag.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <mqueue.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/personality.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

static const char *ename(int e) {
  static char buf[16];
  switch (e) {
  case EPERM: return "EPERM"; case ENOENT: return "ENOENT"; case ESRCH: return "ESRCH";
  case EACCES: return "EACCES"; case EBUSY: return "EBUSY"; case EEXIST: return "EEXIST";
  case ENOTDIR: return "ENOTDIR"; case EISDIR: return "EISDIR"; case EINVAL: return "EINVAL";
  case ETXTBSY: return "ETXTBSY"; case ENOSPC: return "ENOSPC"; case EROFS: return "EROFS";
  case EAGAIN: return "EAGAIN"; case ENOSYS: return "ENOSYS"; case EBADF: return "EBADF";
  case EFAULT: return "EFAULT"; case ENXIO: return "ENXIO"; case ENODEV: return "ENODEV";
  case ENOEXEC: return "ENOEXEC"; case ELOOP: return "ELOOP"; case EXDEV: return "EXDEV";
  case EOPNOTSUPP: return "EOPNOTSUPP"; case EAFNOSUPPORT: return "EAFNOSUPPORT";
  case ECONNREFUSED: return "ECONNREFUSED"; case ENOMEM: return "ENOMEM";
  case ETIMEDOUT: return "ETIMEDOUT"; case EHOSTUNREACH: return "EHOSTUNREACH";
  case ENETUNREACH: return "ENETUNREACH"; case EMFILE: return "EMFILE";
  case EPROTONOSUPPORT: return "EPROTONOSUPPORT"; case ENOBUFS: return "ENOBUFS";
  }
  snprintf(buf, sizeof buf, "E%d", e);
  return buf;
}

static void report(const char *tok, long r) {
  if (r >= 0) printf("%s: OK\n", tok); else printf("%s: %s\n", tok, ename(errno));
  fflush(stdout);
}

static void *park(void *arg) { (void)arg; for (;;) pause(); return NULL; }

#if defined(__x86_64__)
/* A 32-bit x86 system call from this 64-bit program (int 0x80): seccomp sees it with
   the i386 audit arch and its numbers. Pointers must be below 4 GiB: static data of a
   non-PIE static binary is. */
static unsigned int i386_args[3];
/* A one-instruction seccomp filter (allow) as the 32-bit ABI's struct sock_fprog: a u16
   length and a 32-bit pointer, both in static data below 4 GiB. */
static struct sock_filter i386_allow[1];
static struct { unsigned short len, pad; unsigned int filter; } i386_prog;
static long int80(long nr, long a, long b, long c) {
  long r;
  __asm__ volatile("int $0x80" : "=a"(r) : "a"(nr), "b"(a), "c"(b), "d"(c) : "memory");
  r = (int)r;
  if (r < 0 && r > -4096) { errno = (int)-r; return -1; }
  return r;
}
#endif

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    char tok[4096];
    snprintf(tok, sizeof tok, "%s", argv[i]);
    char *a[6] = {0};
    int n = 0;
    char *save = NULL;
    for (char *p = strtok_r(argv[i], ":", &save); p && n < 6; p = strtok_r(NULL, ":", &save)) a[n++] = p;
    const char *op = a[0] ? a[0] : "";
    long r;
    errno = 0;
    if (!strcmp(op, "mount-tmpfs")) r = mount("none", a[1], "tmpfs", 0, NULL);
    else if (!strcmp(op, "mount-proc")) r = mount("proc", a[1], "proc", 0, NULL);
    else if (!strcmp(op, "mount-bind")) r = mount(a[1], a[2], NULL, MS_BIND | MS_REC, NULL);
    else if (!strcmp(op, "remount-rw")) r = mount(NULL, a[1], NULL, MS_REMOUNT | MS_BIND, NULL);
    else if (!strcmp(op, "umount")) r = umount2(a[1], MNT_DETACH);
    else if (!strcmp(op, "pivot-root")) r = syscall(SYS_pivot_root, a[1], a[2]);
    else if (!strcmp(op, "unshare-mnt")) r = unshare(CLONE_NEWNS);
    else if (!strcmp(op, "unshare-user")) r = unshare(CLONE_NEWUSER);
    else if (!strcmp(op, "unshare-net")) r = unshare(CLONE_NEWNET);
    else if (!strcmp(op, "clone-newuser") || !strcmp(op, "clone3-newuser")) {
      /* A user namespace without unshare(2): clone(2) / clone3(2) with CLONE_NEWUSER. */
      long pid;
      if (op[5] == '3') {
        unsigned long long args[11] = {0}; /* struct clone_args: flags, ..., exit_signal at [4] */
        args[0] = CLONE_NEWUSER;
        args[4] = SIGCHLD;
        pid = syscall(SYS_clone3, args, sizeof args);
      } else {
        pid = syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0);
      }
      if (pid == 0) _exit(0);
      if (pid > 0) waitpid(pid, NULL, 0);
      r = pid;
    }
    else if (!strcmp(op, "ids")) {
      uid_t ru, eu, su;
      getresuid(&ru, &eu, &su);
      printf("%s: ruid=%d euid=%d suid=%d\n", tok, (int)ru, (int)eu, (int)su);
      fflush(stdout);
      continue;
    }
    else if (!strcmp(op, "socket")) r = socket(atoi(a[1]), atoi(a[2]), 0);
    /* The family with a bit set above the 32 the kernel reads (it truncates the int). */
    else if (!strcmp(op, "socket-hi")) r = syscall(SYS_socket, (1UL << 32) | (unsigned long)atoi(a[1]), atoi(a[2]), 0);
#if defined(__x86_64__)
    /* i386 socketcall(SYS_SOCKET, {family, type, 0}) and i386 socket(2) (nr 359). */
    else if (!strcmp(op, "socketcall")) {
      i386_args[0] = atoi(a[1]); i386_args[1] = atoi(a[2]); i386_args[2] = 0;
      r = (unsigned long)i386_args >> 32 ? (errno = E2BIG, -1) : int80(102, 1, (long)i386_args, 0);
    }
    else if (!strcmp(op, "socket-i386")) r = int80(359, atoi(a[1]), atoi(a[2]), 0);
    /* The seccomp filter loads through the 32-bit ABI: i386 seccomp(2) (nr 354) and
       prctl(2) (nr 172). */
    else if (!strcmp(op, "seccomp-filter-i386") || !strcmp(op, "prctl-filter-i386")) {
      i386_allow[0] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
      i386_prog.len = 1; i386_prog.filter = (unsigned int)(unsigned long)i386_allow;
      if ((unsigned long)&i386_prog >> 32 || (unsigned long)i386_allow >> 32) { errno = E2BIG; r = -1; }
      else if (!strcmp(op, "seccomp-filter-i386")) r = int80(354, SECCOMP_SET_MODE_FILTER, 0, (long)&i386_prog);
      else r = int80(172, PR_SET_SECCOMP, SECCOMP_MODE_FILTER, (long)&i386_prog);
    }
#endif
    else if (!strcmp(op, "personality")) r = personality(strtoul(a[1], NULL, 16));
    else if (!strcmp(op, "memfd-secret")) r = syscall(447 /* memfd_secret */, 0);
    else if (!strcmp(op, "memfd-create")) r = syscall(SYS_memfd_create, "p", 0);
    else if (!strcmp(op, "groups")) {
      gid_t g[64];
      int n = getgroups(64, g);
      printf("%s:", tok);
      for (int k = 0; k < n; k++) printf(" %d", (int)g[k]);
      printf("\n");
      fflush(stdout);
      continue;
    }
    else if (!strcmp(op, "connect-tcp")) {
      /* TCP connect to IP:PORT, 3 s at most (ETIMEDOUT). */
      struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(atoi(a[2])) };
      inet_pton(AF_INET, a[1], &sa.sin_addr);
      int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
      r = connect(s, (struct sockaddr *)&sa, sizeof sa);
      if (r < 0 && errno == EINPROGRESS) {
        struct pollfd p = { .fd = s, .events = POLLOUT };
        int e = 0; socklen_t l = sizeof e;
        if (poll(&p, 1, 3000) == 0) { errno = ETIMEDOUT; r = -1; }
        else { getsockopt(s, SOL_SOCKET, SO_ERROR, &e, &l); errno = e; r = e ? -1 : 0; }
      }
    }
    else if (!strcmp(op, "connect-tcp-dev")) {
      /* connect-tcp from a socket bound to link DEV (SO_BINDTODEVICE, allowed to anyone
         since Linux 5.7): the kernel then takes a failed route lookup, a prohibit route's
         included, for "on the link". 3 s at most. */
      struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(atoi(a[2])) };
      inet_pton(AF_INET, a[1], &sa.sin_addr);
      int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
      r = setsockopt(s, SOL_SOCKET, SO_BINDTODEVICE, a[3], strlen(a[3]));
      if (r == 0) r = connect(s, (struct sockaddr *)&sa, sizeof sa);
      if (r < 0 && errno == EINPROGRESS) {
        struct pollfd p = { .fd = s, .events = POLLOUT };
        int e = 0; socklen_t l = sizeof e;
        if (poll(&p, 1, 3000) == 0) { errno = ETIMEDOUT; r = -1; }
        else { getsockopt(s, SOL_SOCKET, SO_ERROR, &e, &l); errno = e; r = e ? -1 : 0; }
      }
    }
    else if (!strcmp(op, "fill-inotify") || !strcmp(op, "fill-mq") || !strcmp(op, "fill-sigq")
             || !strcmp(op, "fill-pty")) {
      /* As many inotify instances, 80 KiB POSIX message queues, queued SIGRTMINs
         (blocked) or ptys as the kernel gives, kept: prints how many, then the errno
         that stopped it. Up to 1000000. */
      sigset_t rt; sigemptyset(&rt); sigaddset(&rt, SIGRTMIN);
      sigprocmask(SIG_BLOCK, &rt, NULL);
      struct mq_attr qa = { .mq_maxmsg = 10, .mq_msgsize = 8192 };
      long k = 0;
      for (; k < 1000000; k++) {
        char q[64]; snprintf(q, sizeof q, "/azp-fill-%ld", k);
        union sigval v = { .sival_int = 0 };
        long ok = !strcmp(op, "fill-inotify") ? inotify_init1(IN_CLOEXEC)
                : !strcmp(op, "fill-mq") ? (long)mq_open(q, O_CREAT | O_EXCL | O_RDWR, 0600, &qa)
                : !strcmp(op, "fill-pty") ? open("/dev/ptmx", O_RDWR | O_NOCTTY)
                : sigqueue(getpid(), SIGRTMIN, v);
        if (ok < 0) break;
      }
      printf("%s: %ld %s\n", tok, k, ename(errno));
      fflush(stdout);
      continue;
    }
    else if (!strcmp(op, "fill-tcp") || !strcmp(op, "fill-udp")) {
      /* fill-tcp:N: N loopback connections whose readers never read, each written to
         (non-blocking) until it takes no more; fill-udp:N: N loopback receivers, each
         sent 40 datagrams of 60000 bytes. Prints how many sockets and what the kernel
         holds for them (SO_MEMINFO: receive memory plus send queue, summed), kept open
         until it has counted. */
      int n = atoi(a[1]), tcp = !strcmp(op, "fill-tcp"), made = 0, nf = 0;
      static char buf[60000];
      int *fds = calloc(2 * (size_t)n + 1, sizeof(int));
      struct sockaddr_in lo = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
      socklen_t ll = sizeof lo;
      int one = socket(AF_INET, tcp ? SOCK_STREAM : SOCK_DGRAM, 0);
      fds[nf++] = one;
      if (tcp && (bind(one, (void *)&lo, sizeof lo) || listen(one, 4096) || getsockname(one, (void *)&lo, &ll))) n = 0;
      for (int k = 0; k < n; k++) {
        if (tcp) {
          int c = socket(AF_INET, SOCK_STREAM, 0);
          if (c < 0 || connect(c, (void *)&lo, sizeof lo)) break;
          int acc = accept(one, NULL, NULL);
          if (acc < 0) break;
          fds[nf++] = c; fds[nf++] = acc;
          fcntl(c, F_SETFL, O_NONBLOCK);
          while (write(c, buf, sizeof buf) > 0) {}
        } else {
          struct sockaddr_in to = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
          socklen_t tl = sizeof to;
          int big = 1 << 24, rcv = socket(AF_INET, SOCK_DGRAM, 0);
          if (rcv < 0 || bind(rcv, (void *)&to, sizeof to) || getsockname(rcv, (void *)&to, &tl)) break;
          fds[nf++] = rcv;
          setsockopt(rcv, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
          for (int d = 0; d < 40; d++) sendto(one, buf, sizeof buf, 0, (void *)&to, sizeof to);
        }
        made++;
      }
      long long held = 0;
      for (int k = 0; k < nf; k++) {
        unsigned int mem[SK_MEMINFO_VARS] = {0};
        socklen_t ml = sizeof mem;
        if (getsockopt(fds[k], SOL_SOCKET, SO_MEMINFO, mem, &ml) == 0)
          held += (long long)mem[SK_MEMINFO_RMEM_ALLOC] + mem[SK_MEMINFO_WMEM_QUEUED];
      }
      for (int k = 0; k < nf; k++) close(fds[k]);
      free(fds);
      printf("%s: %d sockets held=%lld\n", tok, made, held);
      fflush(stdout);
      continue;
    }
    else if (!strcmp(op, "one-inotify")) r = inotify_init1(IN_CLOEXEC);
    else if (!strcmp(op, "one-pty")) r = open("/dev/ptmx", O_RDWR | O_NOCTTY);
    else if (!strcmp(op, "seccomp-filter") || !strcmp(op, "prctl-filter") || !strcmp(op, "sock-filter")
             || !strcmp(op, "reuseport-filter")) {
      /* Load a one-instruction classic BPF program (allow / accept all): as a seccomp
         filter through seccomp(2) or prctl(2), or as a UDP socket's filter (its own, or
         the one that picks a socket of its SO_REUSEPORT group). */
      int sock = op[0] == 's' && op[1] == 'o';
      int seccomp_op = !strcmp(op, "seccomp-filter") || !strcmp(op, "prctl-filter");
      struct sock_filter allow[] = { BPF_STMT(BPF_RET | BPF_K, seccomp_op ? SECCOMP_RET_ALLOW : (sock ? 0xffff : 0)) };
      struct sock_fprog prog = { .len = 1, .filter = allow };
      if (!strcmp(op, "seccomp-filter")) r = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog);
      else if (!strcmp(op, "prctl-filter")) r = prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0);
      else {
        int one = 1, s = socket(AF_INET, SOCK_DGRAM, 0);
        if (!sock) setsockopt(s, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
        r = setsockopt(s, SOL_SOCKET, sock ? SO_ATTACH_FILTER : SO_ATTACH_REUSEPORT_CBPF, &prog, sizeof prog);
      }
    }
    else if (!strcmp(op, "hugetlb-map")) {
      /* One huge page of the default size (MAP_HUGETLB), mapped and touched in a child:
         past a hugetlb limit the mmap fails (ENOMEM: reservations limited) or the touch
         is a SIGBUS (faults limited only). */
      pid_t c = fork();
      if (c == 0) {
        char *p = mmap(NULL, 2 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
        if (p == MAP_FAILED) _exit(errno);
        p[0] = 1;
        _exit(0);
      }
      int st = 0;
      waitpid(c, &st, 0);
      if (WIFSIGNALED(st)) {
        printf("%s: %s\n", tok, WTERMSIG(st) == SIGBUS ? "SIGBUS" : "SIGNAL");
        fflush(stdout);
        continue;
      }
      r = WEXITSTATUS(st) ? (errno = WEXITSTATUS(st), -1) : 0;
    }
    else if (!strcmp(op, "netlink")) r = socket(AF_NETLINK, SOCK_RAW, atoi(a[1]));
    else if (!strcmp(op, "flowlabel")) {
      /* One IPv6 flow label from the node's one table (IPV6_FLOWLABEL_MGR: GET with
         CREATE, any share, label 0 for one the kernel picks and writes back), given back
         at once (PUT); it lingers the kernel's minimum after. */
      struct { struct in6_addr dst; uint32_t label; uint8_t action, share; uint16_t flags, expires, linger; uint32_t pad; }
        fl = { .dst = IN6ADDR_LOOPBACK_INIT, .share = 255, .flags = 1, .expires = 6, .linger = 6 };
      int s = socket(AF_INET6, SOCK_DGRAM, 0);
      r = s < 0 ? -1 : setsockopt(s, IPPROTO_IPV6, 32, &fl, sizeof fl);
      if (r == 0) { fl.action = 1; setsockopt(s, IPPROTO_IPV6, 32, &fl, sizeof fl); }
      if (s >= 0) { int e = errno; close(s); errno = e; }
    }
    else if (!strcmp(op, "v6only")) {
      int one = 1, s = socket(AF_INET6, SOCK_DGRAM, 0);
      r = setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    }
    else if (!strcmp(op, "one-mq")) {
      /* One queue (removed at once: run in an IPC namespace of its own). */
      struct mq_attr qa = { .mq_maxmsg = 10, .mq_msgsize = 8192 };
      r = (long)mq_open("/azp-one", O_CREAT | O_RDWR, 0600, &qa);
      if (r >= 0) mq_unlink("/azp-one");
    }
    else if (!strcmp(op, "one-sigq")) {
      sigset_t rt; sigemptyset(&rt); sigaddset(&rt, SIGRTMIN);
      sigprocmask(SIG_BLOCK, &rt, NULL);
      union sigval v = { .sival_int = 0 };
      r = sigqueue(getpid(), SIGRTMIN, v);
    }
    else if (!strcmp(op, "wait-for")) {
      /* Until the file PATH exists (the test's go), 60 s at most. */
      r = -1; errno = ETIMEDOUT;
      for (int k = 0; k < 1200 && r < 0; k++) { r = access(a[1], F_OK); if (r < 0) usleep(50000); }
    }
    else if (!strcmp(op, "nest-dirs")) {
      /* N dirs, each inside the last: mkdir d, chdir d (a tree deeper than any walk's
         stack or fd limit). */
      int n = atoi(a[1]);
      r = 0;
      for (int k = 0; k < n && r == 0; k++) r = mkdir("d", 0755) == 0 && chdir("d") == 0 ? 0 : -1;
    }
    else if (!strcmp(op, "send-udp-dev")) {
      /* One UDP datagram to IP:PORT from a socket bound to link DEV (SO_BINDTODEVICE). */
      struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(atoi(a[2])) };
      inet_pton(AF_INET, a[1], &sa.sin_addr);
      int s = socket(AF_INET, SOCK_DGRAM, 0);
      r = setsockopt(s, SOL_SOCKET, SO_BINDTODEVICE, a[3], strlen(a[3]));
      if (r == 0) r = sendto(s, "x", 1, 0, (struct sockaddr *)&sa, sizeof sa) == 1 ? 0 : -1;
    }
    else if (!strcmp(op, "udp-flows")) {
      /* N UDP flows to IP: one datagram to each port from 1024 up, a new socket (a new
         source port) each time the ports run out. Datagrams refused on the way are not
         errors to sendto(2) on an unconnected socket: what they cost the host is counted
         there. */
      struct sockaddr_in sa = { .sin_family = AF_INET };
      inet_pton(AF_INET, a[1], &sa.sin_addr);
      long n = atol(a[2]);
      int s = -1;
      r = 0;
      for (long k = 0; k < n && r == 0; k++) {
        if (k % 64512 == 0) { if (s >= 0) close(s); s = socket(AF_INET, SOCK_DGRAM, 0); }
        sa.sin_port = htons(1024 + k % 64512);
        r = sendto(s, "x", 1, 0, (struct sockaddr *)&sa, sizeof sa) == 1 ? 0 : -1;
      }
      if (s >= 0) close(s);
    }
    else if (!strcmp(op, "udp-hosts")) {
      /* udp-hosts:IP:N:ROUNDS:MS: one UDP datagram to each of the N addresses from IP up
         (port 9), one socket; ROUNDS rounds, MS ms apart. Nobody answers there: each
         address is a neighbour the host that forwards them must resolve, and each round
         asks again. IPv6 too, written with '-' for ':' (the token's separator): the
         address's last four bytes are counted up. */
      char ip[64];
      snprintf(ip, sizeof ip, "%s", a[1]);
      for (char *c = ip; *c; c++) if (*c == '-') *c = ':';
      int six = strchr(ip, ':') != NULL;
      struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(9) };
      struct sockaddr_in6 sa6 = { .sin6_family = AF_INET6, .sin6_port = htons(9) };
      inet_pton(six ? AF_INET6 : AF_INET, ip, six ? (void *)&sa6.sin6_addr : (void *)&sa.sin_addr);
      uint32_t first;
      memcpy(&first, six ? (void *)&sa6.sin6_addr.s6_addr[12] : (void *)&sa.sin_addr.s_addr, 4);
      first = ntohl(first);
      long n = atol(a[2]), rounds = atol(a[3]);
      int s = socket(six ? AF_INET6 : AF_INET, SOCK_DGRAM, 0);
      r = 0;
      for (long k = 0; k < rounds && r == 0; k++) {
        if (k) usleep(atol(a[4]) * 1000);
        for (long j = 0; j < n && r == 0; j++) {
          uint32_t at = htonl(first + j);
          memcpy(six ? (void *)&sa6.sin6_addr.s6_addr[12] : (void *)&sa.sin_addr.s_addr, &at, 4);
          r = sendto(s, "n", 1, 0, six ? (struct sockaddr *)&sa6 : (struct sockaddr *)&sa, six ? sizeof sa6 : sizeof sa) == 1 ? 0 : -1;
        }
      }
      close(s);
    }
    else if (!strcmp(op, "udp-stream")) {
      /* udp-stream:IP:PORT:N: N datagrams to IP:PORT from one socket (one flow), 200 us
         apart. */
      struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(atoi(a[2])) };
      inet_pton(AF_INET, a[1], &sa.sin_addr);
      int s = socket(AF_INET, SOCK_DGRAM, 0);
      long n = atol(a[3]);
      r = 0;
      for (long k = 0; k < n && r == 0; k++) {
        r = sendto(s, "s", 1, 0, (struct sockaddr *)&sa, sizeof sa) == 1 ? 0 : -1;
        usleep(200);
      }
      close(s);
    }
    else if (!strcmp(op, "udp-recv")) {
      /* udp-recv:PORT:MS[:IP:DPORT]: a UDP socket bound to PORT (all addresses), one
         datagram from it to IP:DPORT when given, then how many datagrams came to it in
         MS ms, printed. */
      struct sockaddr_in me = { .sin_family = AF_INET, .sin_port = htons(atoi(a[1])) };
      int s = socket(AF_INET, SOCK_DGRAM, 0), got = 0;
      r = bind(s, (struct sockaddr *)&me, sizeof me);
      if (r == 0 && a[3] && a[4]) {
        struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons(atoi(a[4])) };
        inet_pton(AF_INET, a[3], &to.sin_addr);
        r = sendto(s, "x", 1, 0, (struct sockaddr *)&to, sizeof to) == 1 ? 0 : -1;
      }
      if (r == 0) {
        struct timespec t0, t; clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
          clock_gettime(CLOCK_MONOTONIC, &t);
          long left = atol(a[2]) - ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000);
          struct pollfd p = { .fd = s, .events = POLLIN };
          char b[64];
          if (left <= 0 || poll(&p, 1, left) <= 0) break;
          if (recv(s, b, sizeof b, 0) >= 0) got++;
        }
        printf("%s: %d\n", tok, got);
        fflush(stdout);
        close(s);
        continue;
      }
    }
    else if (!strcmp(op, "send-udp")) {
      /* One UDP datagram to IP:PORT, broadcast allowed (SO_BROADCAST). */
      struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(atoi(a[2])) };
      inet_pton(AF_INET, a[1], &sa.sin_addr);
      int s = socket(AF_INET, SOCK_DGRAM, 0), one = 1;
      r = setsockopt(s, SOL_SOCKET, SO_BROADCAST, &one, sizeof one);
      if (r == 0) r = sendto(s, "x", 1, 0, (struct sockaddr *)&sa, sizeof sa) == 1 ? 0 : -1;
    }
    else if (!strcmp(op, "connect-abstract")) {
      /* connect(2) to the abstract unix socket @NAME. */
      struct sockaddr_un sa = { .sun_family = AF_UNIX };
      size_t n = strlen(a[1]);
      memcpy(sa.sun_path + 1, a[1], n);
      int s = socket(AF_UNIX, SOCK_STREAM, 0);
      r = connect(s, (struct sockaddr *)&sa, offsetof(struct sockaddr_un, sun_path) + 1 + n);
    }
    else if (!strcmp(op, "io-uring")) { char params[120] = {0}; r = syscall(SYS_io_uring_setup, 1, params); }
    else if (!strcmp(op, "open-tree")) r = syscall(SYS_open_tree, AT_FDCWD, a[1], 1 /* OPEN_TREE_CLONE */);
    /* System V shared memory and POSIX message queues: made (EEXIST if already there)
       or looked up (ENOENT if not). mq_open(2) takes the name without the leading slash
       (libc's mq_open strips it). */
    else if (!strcmp(op, "shm-create")) r = shmget(strtol(a[1], NULL, 0), 4096, IPC_CREAT | IPC_EXCL | 0666);
    else if (!strcmp(op, "shm-find")) r = shmget(strtol(a[1], NULL, 0), 0, 0);
    else if (!strcmp(op, "mq-create")) r = syscall(SYS_mq_open, a[1] + (a[1][0] == '/'), O_RDWR | O_CREAT | O_EXCL, 0666, NULL);
    else if (!strcmp(op, "mq-find")) r = syscall(SYS_mq_open, a[1] + (a[1][0] == '/'), O_RDWR, 0, NULL);
    else if (!strcmp(op, "fsopen")) r = syscall(SYS_fsopen, a[1], 0);
    else if (!strcmp(op, "init-module")) { static char img[64] = "\177ELF"; r = syscall(SYS_init_module, img, sizeof img, ""); }
    else if (!strcmp(op, "finit-module")) { int fd = open(a[1], O_RDONLY); r = fd < 0 ? -1 : syscall(SYS_finit_module, fd, "", 0); }
    else if (!strcmp(op, "delete-module")) r = syscall(SYS_delete_module, a[1], O_NONBLOCK);
    else if (!strcmp(op, "kexec")) r = syscall(SYS_kexec_load, 0UL, 0UL, NULL, 0xdead0000UL); /* bad flags: EINVAL if ever allowed */
    else if (!strcmp(op, "syslog")) { char b[64]; r = syscall(SYS_syslog, 3 /* READ_ALL */, b, (int)sizeof b); }
    else if (!strcmp(op, "bpf")) { char attr[128] = {0}; r = syscall(SYS_bpf, 5 /* BPF_PROG_LOAD */, attr, sizeof attr); }
    else if (!strcmp(op, "keyctl")) r = syscall(SYS_keyctl, 1 /* JOIN_SESSION_KEYRING */, NULL);
    else if (!strcmp(op, "userfaultfd")) r = syscall(SYS_userfaultfd, 0);
    else if (!strcmp(op, "perf")) { char attr[128] = {0}; r = syscall(SYS_perf_event_open, attr, 0, -1, -1, 0); }
    else if (!strcmp(op, "open-by-handle")) { char h[136] = {0}; *(unsigned *)h = 8; r = syscall(SYS_open_by_handle_at, AT_FDCWD, h, O_RDONLY); }
    else if (!strcmp(op, "mknod-c")) r = mknod(a[1], S_IFCHR | 0666, makedev(atoi(a[2]), atoi(a[3])));
    else if (!strcmp(op, "mknod-b")) r = mknod(a[1], S_IFBLK | 0666, makedev(atoi(a[2]), atoi(a[3])));
    else if (!strcmp(op, "open-r")) r = open(a[1], O_RDONLY);
    else if (!strcmp(op, "open-w")) r = open(a[1], O_WRONLY);
    else if (!strcmp(op, "open-rw")) r = open(a[1], O_RDWR);
    else if (!strcmp(op, "create")) r = open(a[1], O_WRONLY | O_CREAT | O_EXCL, 0644);
    else if (!strcmp(op, "chroot-escape")) {
      /* The classic chroot(2) break-out (CAP_SYS_CHROOT is kept): chroot into a subdir
         while holding a dir fd outside it, walk up far, chroot("."); then look for a
         host-only marker. Must be the last op (it changes the root). */
      mkdir("/tmp/.chroot-escape", 0700);
      int fd = open("/", O_RDONLY | O_DIRECTORY);
      r = chroot("/tmp/.chroot-escape");
      if (r == 0 && fd >= 0) { r = fchdir(fd); for (int k = 0; k < 64; k++) if (chdir("..")) break; r = chroot("."); }
      if (r < 0) { report(tok, r); continue; }
      printf("%s: %s\n", tok, access(a[1], F_OK) == 0 ? "MARKER-VISIBLE" : "marker-not-visible");
      fflush(stdout);
      continue;
    }
    else if (!strcmp(op, "fds")) {
      DIR *d = opendir("/proc/self/fd");
      printf("%s:", tok);
      struct dirent *e;
      while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.' || atoi(e->d_name) == dirfd(d)) continue;
        printf(" %s", e->d_name);
      }
      printf("\n");
      fflush(stdout);
      continue;
    }
    else if (!strcmp(op, "threads")) {
      /* Thread bomb: park threads until creation fails, report, hold them 1 s. */
      int want = atoi(a[1]), k = 0, err = 0;
      pthread_attr_t at;
      pthread_attr_init(&at);
      pthread_attr_setstacksize(&at, 65536);
      for (; k < want; k++) { pthread_t t; if ((err = pthread_create(&t, &at, park, NULL))) break; }
      printf("%s: created %d then %s\n", tok, k, err ? ename(err) : "none");
      fflush(stdout);
      sleep(1);
      continue;
    }
    else if (!strcmp(op, "hog")) {
      /* Memory hog: allocate and touch MB megabytes. */
      long mb = atol(a[1]);
      for (long k = 0; k < mb; k++) { char *p = malloc(1 << 20); if (!p) { report(tok, -1); break; } memset(p, 1, 1 << 20); }
      printf("%s: survived\n", tok);
      fflush(stdout);
      continue;
    }
    else { printf("%s: UNKNOWN-OP\n", tok); continue; }
    report(tok, r);
  }
  return 0;
}
"#;

/// sha256 by coreutils: the debug binary is ~200 MB, too slow for unoptimised sha2.
fn sha256sum(p: &Path) -> String {
    let o = Command::new("sha256sum").arg(p).output().unwrap();
    assert!(o.status.success());
    String::from_utf8_lossy(&o.stdout).split_whitespace().next().unwrap().to_string()
}

/// Writes `bytes` to `out` atomically (tests of other binaries may build the same fixture).
fn write_atomic(out: &Path, bytes: &[u8]) {
    let tmp = out.with_extension(format!("partial-{}", std::process::id()));
    fs::write(&tmp, bytes).unwrap();
    fs::rename(&tmp, out).unwrap();
}

/// The static probe binary, compiled once (cached under target/fixtures, keyed on source).
fn probe_bin() -> PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let tag = &sha256_hex(PROBE_C.as_bytes())[..12];
        let out = fixtures().join(format!("escape-probe-{tag}"));
        if !out.exists() {
            let src = fixtures().join(format!("escape-probe-{tag}.c"));
            fs::write(&src, PROBE_C).unwrap();
            let tmp = out.with_extension(format!("partial-{}", std::process::id()));
            let o = Command::new("cc")
                .args(["-static", "-O1", "-pthread", "-Wall", "-o"])
                .arg(&tmp)
                .arg(&src)
                .output()
                .expect("cannot run cc: install build-essential (scripts/setup.sh)");
            assert!(o.status.success(), "cannot compile the probe: {}", String::from_utf8_lossy(&o.stderr));
            fs::rename(&tmp, &out).unwrap();
        }
        out
    })
    .clone()
}

fn tar_file(b: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8], mode: u32) {
    let mut h = tar::Header::new_gnu();
    h.set_path(path).unwrap();
    h.set_size(data.len() as u64);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    b.append(&h, data).unwrap();
}

/// The suite's rootfs: the busybox fixture + /bin/probe + /bin/busybox-suid (04755, 0:0).
fn escape_tar() -> PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let probe = fs::read(probe_bin()).unwrap();
        let base = busybox_tar();
        // Keyed on the inputs and on this layout (bump the suffix when adding files).
        let layout = b"probe,busybox-suid,probe-suid";
        let tag = &sha256_hex([sha256_file(&base).as_bytes(), &probe[..], layout].concat())[..12];
        let out = fixtures().join(format!("escape-rootfs-{tag}.tar"));
        if out.exists() {
            return out;
        }
        let mut b = tar::Builder::new(Vec::new());
        let mut busybox = None;
        let mut src = tar::Archive::new(fs::File::open(&base).unwrap());
        for e in src.entries().unwrap() {
            let mut e = e.unwrap();
            let h = e.header().clone();
            let path = e.path().unwrap().into_owned();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut data).unwrap();
            if path == Path::new("./bin/busybox") {
                busybox = Some(data.clone());
            }
            b.append(&h, &data[..]).unwrap();
        }
        tar_file(&mut b, "./bin/probe", &probe, 0o755);
        tar_file(&mut b, "./bin/busybox-suid", &busybox.expect("busybox in the fixture"), 0o4755);
        // busybox drops setuid privileges by itself for most applets; the probe does not.
        tar_file(&mut b, "./bin/probe-suid", &probe, 0o4755);
        write_atomic(&out, &b.into_inner().unwrap());
        out
    })
    .clone()
}

/// The host uid that owns the image's root-owned files in the rootfs store: 0, or in
/// rootless runs the test user's first subordinate uid (the store is shifted by one: an
/// image's uid N is N + 1 in the user's namespace, which a job's N maps to).
fn store_uid_of_image_root() -> u32 {
    match test_user() {
        None => 0,
        Some(u) => {
            let text = fs::read_to_string("/etc/subuid").unwrap();
            let start = text.lines().find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.len() == 3 && (f[0] == u.name || f[0] == u.uid.to_string())).then(|| f[1].parse().unwrap())
            });
            start.expect("the test user has subordinate uids")
        }
    }
}

/// Rootless runs: what the test planted as root in a home must belong to the test user,
/// as it would had the user made it.
fn give_to_test_user(p: &Path) {
    if let Some(u) = test_user() {
        let st = Command::new("chown").arg("-R").arg(format!("{}:{}", u.uid, u.gid)).arg(p).status().unwrap();
        assert!(st.success());
    }
}

/// A test home with the suite's rootfs imported as `esc`.
fn home(name: &str) -> TestHome {
    let h = TestHome::new(&format!("esc-{name}"));
    h.import(&escape_tar(), "esc");
    h
}

fn lower(h: &TestHome) -> PathBuf {
    let t = h.dir.join("rootfs/esc/tree");
    assert!(t.join("bin/probe").is_file(), "store layout changed? {}", t.display());
    t
}

struct Out {
    code: i32,
    out: String,
    err: String,
}

/// `COMMAND exec --rootfs esc OPTS -- sh -c SCRIPT`, `command` being azp-sandbox with its
/// `--home` (`TestHome::command` or `TestHome::lab_command`).
fn exec_as(mut command: Command, opts: &[&str], script: &str) -> Out {
    let o = command.args(["exec", "--rootfs", "esc"]).args(opts).args(["--", "sh", "-c", script]).output().unwrap();
    Out {
        code: o.status.code().unwrap_or(-1),
        out: String::from_utf8_lossy(&o.stdout).into_owned(),
        err: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// The job's stdout, asserting it exited 0.
fn exited_ok(o: Out, opts: &[&str]) -> String {
    assert_eq!(o.code, 0, "job failed ({opts:?}): stdout:\n{}\nstderr:\n{}", o.out, o.err);
    o.out
}

/// `exec --rootfs esc OPTS -- sh -c SCRIPT`.
fn exec(h: &TestHome, opts: &[&str], script: &str) -> Out {
    exec_as(h.command(), opts, script)
}

/// Like `exec`, asserting exit 0.
fn exec_ok(h: &TestHome, opts: &[&str], script: &str) -> String {
    exited_ok(exec(h, opts, script), opts)
}

/// The attacker's identities: root inside the sandbox, and an unprivileged user.
const USERS: [(&str, &[&str]); 2] = [("root", &[]), ("uid1000", &["--user", "1000:1000"])];

/// Each of [`USERS`], and in root mode each again with the fake host's ruleset flushed
/// while the job runs (a firewall reload takes the host's table: the job's own routes,
/// table and watch are what is left): `(who, exec options, flushed)`.
fn rounds_with_a_flush() -> Vec<(&'static str, &'static [&'static str], bool)> {
    let flushes: &[bool] = if rootless() { &[false] } else { &[false, true] };
    USERS.iter().flat_map(|(who, opts)| flushes.iter().map(move |f| (*who, *opts, *f))).collect()
}

/// `probe TOKENS...` as a shell command, and the output it must print when every token
/// fails with `errno` (or any per-token result).
fn probe(tokens: &[String]) -> String {
    format!("probe {}", tokens.iter().map(|t| format!("'{t}'")).collect::<Vec<_>>().join(" "))
}
fn expect(tokens: &[String], result: impl Fn(&str) -> String) -> String {
    tokens.iter().map(|t| format!("{t}: {}\n", result(t))).collect()
}
fn toks(t: &[&str]) -> Vec<String> {
    t.iter().map(|s| s.to_string()).collect()
}

/// As each of [`USERS`]: every probe of `refused` fails with EPERM, and every one of
/// `control` (the same family of calls, allowed) works.
fn assert_refused_as_every_user(h: &TestHome, refused: &[String], control: &[String]) {
    for (who, opts) in USERS {
        let out = exec_ok(h, opts, &format!("{}; {}", probe(refused), probe(control)));
        let want = format!("{}{}", expect(refused, |_| "EPERM".into()), expect(control, |_| "OK".into()));
        assert_eq!(out, want, "{who}");
    }
}

/// Whether the job's own shell runs a script that begins with `: MARKER;` (the lab's
/// wrapper is an `sh -c` that names the marker too, and runs before the job does).
fn job_shell_runs(marker: &str) -> bool {
    let own = format!("sh -c : {marker};");
    processes_matching(marker).iter().any(|(_, cmd)| cmd.starts_with(&own))
}

/// The number in `/proc/sys/NAME` (e.g. `fs/file-max`).
fn sysctl_number(name: &str) -> u64 {
    let path = format!("/proc/sys/{name}");
    fs::read_to_string(&path).unwrap().trim().parse().unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A host setting (`/proc/sys/NAME`) changed for one test, and put back when this goes
/// (a panicking test included).
struct SysctlSet {
    path: String,
    before: String,
}

impl SysctlSet {
    fn to(name: &str, value: &str) -> SysctlSet {
        let path = format!("/proc/sys/{name}");
        let before = fs::read_to_string(&path).unwrap();
        fs::write(&path, value).unwrap_or_else(|e| panic!("{path}: {e}"));
        SysctlSet { path, before }
    }
}

impl Drop for SysctlSet {
    fn drop(&mut self) {
        let _ = fs::write(&self.path, &self.before);
    }
}

/// An empty dir of this test's (`name`, made anew, mode 0755) that a job gets as the
/// volume `/flag`: the test drops files in it to tell the job when to go on.
fn flag_dir(name: &str) -> PathBuf {
    let flag = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&flag);
    std::fs::create_dir_all(&flag).unwrap();
    std::fs::set_permissions(&flag, std::fs::Permissions::from_mode(0o755)).unwrap();
    flag
}

/// sha256 of a few files of a tree, to prove it unchanged.
fn hashes(root: &Path, files: &[&str]) -> Vec<(String, String, u32)> {
    files
        .iter()
        .map(|f| {
            let p = root.join(f);
            (f.to_string(), sha256_file(&p), fs::metadata(&p).unwrap().mode())
        })
        .collect()
}

/// Every path under `dir` (not following symlinks).
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out.sort();
    out
}

/// A host file that exists only for the duration of a test (removed even on panic).
struct HostFile(PathBuf);
impl HostFile {
    fn create(p: PathBuf, content: &str) -> HostFile {
        fs::write(&p, content).unwrap();
        HostFile(p)
    }
}
impl Drop for HostFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// A host process killed when the test ends.
struct HostProc(std::process::Child);
impl HostProc {
    /// Waits for it, with its piped stdout and stderr (as `Child::wait_with_output`);
    /// a test that fails before still kills it when it drops it.
    fn output(&mut self) -> std::process::Output {
        let err = self.0.stderr.take().map(|mut e| {
            std::thread::spawn(move || {
                let mut b = Vec::new();
                let _ = std::io::Read::read_to_end(&mut e, &mut b);
                b
            })
        });
        let mut stdout = Vec::new();
        if let Some(mut o) = self.0.stdout.take() {
            let _ = std::io::Read::read_to_end(&mut o, &mut stdout);
        }
        let status = self.0.wait().unwrap();
        let stderr = err.map(|t| t.join().unwrap()).unwrap_or_default();
        std::process::Output { status, stdout, stderr }
    }
}
impl Drop for HostProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A running job's log (the stderr of its `exec`), read as it comes by a thread.
struct JobLog {
    text: std::sync::Arc<std::sync::Mutex<String>>,
    reader: std::thread::JoinHandle<()>,
}
impl JobLog {
    fn of(job: &mut HostProc) -> JobLog {
        let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (t, mut err) = (text.clone(), job.0.stderr.take().expect("a piped stderr"));
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = std::io::Read::read(&mut err, &mut buf) {
                t.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        JobLog { text, reader }
    }

    /// Waits (10 s at most) until the helper has logged each of `what` as refused to the
    /// job (see `HostAddressGuard::tend`).
    fn wait_for_refusals(&self, what: &[&str], who: &str) {
        let said = |log: &str, w: &str| log.lines().any(|l| l.contains(w) && l.contains("refused to the job"));
        let t0 = std::time::Instant::now();
        while !what.iter().all(|w| said(&self.text.lock().unwrap(), w)) {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{who}: the helper's refusals: {}",
                self.text.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the job's end: its status, its stdout and the whole log.
    fn finish(self, job: &mut HostProc) -> (std::process::ExitStatus, String, String) {
        let status = job.0.wait().unwrap();
        self.reader.join().unwrap();
        let mut out = String::new();
        std::io::Read::read_to_string(&mut job.0.stdout.take().unwrap(), &mut out).unwrap();
        let log = self.text.lock().unwrap().clone();
        (status, out, log)
    }
}

/// Whether the fake host's service on `addr:port` answers the fake host itself (the
/// control of a test that keeps a job from it).
fn host_serves(lab: &common::netlab::NetLab, addr: &str, port: u16) -> bool {
    std::thread::scope(|s| {
        s.spawn(|| {
            lab.enter_host();
            let to = std::net::SocketAddr::new(addr.parse().unwrap(), port);
            std::net::TcpStream::connect_timeout(&to, Duration::from_secs(5)).is_ok()
        })
        .join()
        .unwrap()
    })
}

/// A running `exec` whose job printed `ready` and now waits until the host creates
/// `<ctl>/go` (the job sees `ctl` read-only at /ctl). Dropping it (a failed assertion
/// included) releases the job, and kills `exec` if it does not end.
struct WaitingJob {
    child: std::process::Child,
    ctl: PathBuf,
    /// What the job printed before `ready`.
    before: String,
}

impl WaitingJob {
    /// `exec --rootfs esc --volume CTL:/ctl OPTS -- sh -c "BEFORE; echo ready; wait"`,
    /// with `global` (e.g. `--driver-root`) before `exec`.
    fn start(h: &TestHome, global: &[&str], opts: &[&str], before: &str) -> WaitingJob {
        WaitingJob::start_as(h, h.command(), global, opts, before)
    }

    /// [`WaitingJob::start`] with `command` (azp-sandbox and its `--home`) as the caller.
    fn start_as(h: &TestHome, mut command: Command, global: &[&str], opts: &[&str], before: &str) -> WaitingJob {
        let ctl = h.dir.join(format!("ctl-{}", unique("c")));
        fs::create_dir_all(&ctl).unwrap();
        let vol = format!("{}:/ctl", ctl.display());
        let child = command
            .args(global)
            .args(["exec", "--rootfs", "esc", "--volume", &vol])
            .args(opts)
            .args(["--", "sh", "-c"])
            .arg(format!("{before}\necho ready\nwhile [ ! -e /ctl/go ]; do sleep 0.05; done"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut job = WaitingJob { child, ctl, before: String::new() };
        let mut r = std::io::BufReader::new(job.child.stdout.take().unwrap());
        loop {
            let mut line = String::new();
            if std::io::BufRead::read_line(&mut r, &mut line).unwrap() == 0 {
                let mut err = String::new();
                std::io::Read::read_to_string(job.child.stderr.as_mut().unwrap(), &mut err).unwrap();
                panic!("job ended before ready: {}\n{err}", job.before);
            }
            if line == "ready\n" {
                break;
            }
            job.before.push_str(&line);
        }
        // Keep draining stdout so the job never blocks on a full pipe.
        std::thread::spawn(move || std::io::copy(&mut r, &mut std::io::sink()));
        job
    }

    /// Lets the job end; its exit status.
    fn finish(mut self) -> std::process::ExitStatus {
        fs::write(self.ctl.join("go"), "").unwrap();
        self.child.wait().unwrap()
    }
}

impl Drop for WaitingJob {
    fn drop(&mut self) {
        let _ = fs::write(self.ctl.join("go"), "");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------
// Jobs in the network lab (tests/common/netlab.rs): escape/network*.rs, escape/review.rs
// ---------------------------------------------------------------------------------------

/// The job's gateway (the default subnet's first address).
const GATEWAY: &str = "10.87.0.1";

/// [`exec`] in the network lab's fake host.
fn lab_exec(lab: &netlab::NetLab, h: &TestHome, opts: &[&str], script: &str) -> Out {
    exec_as(h.lab_command(lab), opts, script)
}

/// Like `lab_exec`, asserting exit 0.
fn lab_exec_ok(lab: &netlab::NetLab, h: &TestHome, opts: &[&str], script: &str) -> String {
    exited_ok(lab_exec(lab, h, opts, script), opts)
}

/// An HTTP GET in the job: the body, or `GET-FAILED`. The URL is single-quoted: the
/// brackets of an IPv6 literal (`http://[2001:2::1]/`) are glob characters to the shell.
fn get(url: &str) -> String {
    // busybox wget crashes with -q and -T together: timeout(1) bounds it instead.
    format!("timeout 5 wget -q -O- '{url}' 2>/dev/null || echo GET-FAILED")
}

/// A probe's results (`TOKEN: RESULT` lines) by token.
fn probe_results(out: &str) -> std::collections::BTreeMap<String, String> {
    out.lines().filter_map(|l| l.split_once(": ")).map(|(k, v)| (k.to_string(), v.trim().to_string())).collect()
}

/// A job in the network lab serving `secret` over HTTP on port 9000 of all its
/// addresses, for attacks on its listener from elsewhere; `addr` is its address. It is
/// killed if the test fails first.
struct ListeningJob {
    job: HostProc,
    /// Its stdout, open until it ends.
    _stdout: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    addr: String,
}

impl ListeningJob {
    /// On IPv4; `addr`, the job's IPv4 address.
    fn v4(lab: &netlab::NetLab, h: &TestHome, secret: &str) -> ListeningJob {
        ListeningJob::start(lab, h, secret, "9000", "-4", "http://127.0.0.1:9000/")
    }

    /// On IPv6 (and IPv4); `addr`, the job's IPv6 address.
    fn v6(lab: &netlab::NetLab, h: &TestHome, secret: &str) -> ListeningJob {
        ListeningJob::start(lab, h, secret, "'[::]:9000'", "-6", "http://[::1]:9000/")
    }

    /// The job prints its address, then what its own listener (at `own`) answers it.
    fn start(lab: &netlab::NetLab, h: &TestHome, secret: &str, listen: &str, family: &str, own: &str) -> ListeningJob {
        use std::io::BufRead;
        let mut job = HostProc(
            h.lab_command(lab)
                .args(["exec", "--rootfs", "esc", "--", "sh", "-c"])
                // Up to 30 s for httpd to listen (a busy machine); an hour to live: the test
                // stops it.
                .arg(format!(
                    "mkdir /tmp/w && echo {secret} > /tmp/w/index.html && httpd -f -p {listen} -h /tmp/w & \
                     n=0; until [ \"$({get})\" = {secret} ] || [ $n -ge 300 ]; do sleep 0.1; n=$((n+1)); done; \
                     echo addr=$(ip {family} -o addr show dev eth0 | awk '{{print $4}}' | cut -d/ -f1); \
                     {get}; sleep 3600",
                    get = get(own)
                ))
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let mut lines = std::io::BufReader::new(job.0.stdout.take().unwrap()).lines();
        let addr = lines.next().unwrap().unwrap();
        let addr = addr.strip_prefix("addr=").unwrap_or_else(|| panic!("{addr}")).to_string();
        assert_eq!(lines.next().unwrap().unwrap(), secret, "the job's own listener answers it");
        ListeningJob { job, _stdout: lines, addr }
    }

    /// Ends the job as its caller would: SIGTERM to its `exec`, which tears it down.
    fn stop(mut self) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.job.0.id() as i32), nix::sys::signal::SIGTERM).unwrap();
        self.job.0.wait().unwrap();
    }
}

// ---------------------------------------------------------------------------------------
// 1. Writing host paths
// ---------------------------------------------------------------------------------------

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t01_job_cannot_write_host_paths() {
    require_root!();
    let h = home("write");
    let tree = lower(&h);
    let files = ["bin/busybox", "bin/probe", "bin/busybox-suid", "etc/passwd", "etc/group"];
    let before = hashes(&tree, &files);
    let tree_before = walk(&tree);
    let resolv_before = sha256_file(Path::new("/etc/resolv.conf"));
    let data = h.dir.join("dataset");
    fs::create_dir_all(&data).unwrap();
    fs::write(data.join("labels.txt"), "cat\n").unwrap();
    let sentinel = h.dir.join("sentinel");
    fs::create_dir_all(&sentinel).unwrap();
    let vol = format!("{}:/data", data.display());
    for (who, user) in USERS {
        let u = unique(&format!("esc-w-{who}"));
        // Host paths that must never appear: in / of the host, and in the test's dir.
        let host_root_names: Vec<String> = ["a", "b", "c", "d", "e"].iter().map(|s| format!("/{u}-{s}")).collect();
        let s = sentinel.display();
        let via_proc_root = toks(&[
            &format!("create:/proc/1/root/{u}-a"),
            &format!("create:/proc/self/root/../{u}-b"),
            &format!("create:/../../../{u}-c"),
            &format!("create:/proc/self/cwd/../../{u}-d"),
        ]);
        let ro = toks(&[
            "create:/data/new",
            "open-w:/data/labels.txt",
            "create:/data/../data/new2",
            "open-w:/etc/resolv.conf",
            "open-w:/etc/hosts",
            "open-w:/proc/sys/kernel/hostname",
            "remount-rw:/etc/resolv.conf",
            "remount-rw:/data",
        ]);
        let script = format!(
            "cd /tmp\n{}\n{}\n\
             for p in /proc/[0-9]*; do probe create:$p/cwd/../../{u}-e >/dev/null; done\n\
             probe create:{s}/x create:/proc/1/root{s}/x\n\
             mkdir -p {s} 2>/dev/null && echo x > {s}/x 2>/dev/null && echo SENTINEL-INSIDE\n\
             echo '# escape-suite' >> /etc/passwd 2>/dev/null && echo PASSWD-INSIDE\n\
             echo x >> /bin/busybox-suid 2>/dev/null && echo BINARY-INSIDE\n\
             echo done",
            probe(&via_proc_root),
            probe(&ro),
        );
        let opts = [user, &["--volume", &vol]].concat();
        let out = exec_ok(&h, &opts, &script);
        // The host's root-owned files are unmapped in the job's user namespace (root mode
        // too, since issue 19): its root is refused like any other user (EACCES) before
        // the read-only check.
        let (want_root, ro_want): (String, Vec<&str>) = if who == "root" {
            (
                // Pid 1 (the init) is not dumpable: its root is closed (review::r08).
                expect(&via_proc_root, |t| if t.contains("/proc/1/") { "EACCES".into() } else { "OK".into() }),
                vec!["EROFS", "EACCES", "EROFS", "EACCES", "EACCES", "EACCES", "EPERM", "EPERM"],
            )
        } else {
            (
                expect(&via_proc_root, |_| "EACCES".into()),
                vec!["EROFS", "EACCES", "EROFS", "EACCES", "EACCES", "EACCES", "EPERM", "EPERM"],
            )
        };
        let ro_expect: String = ro.iter().zip(&ro_want).map(|(t, e)| format!("{t}: {e}\n")).collect();
        // Inside the sandbox these writes land in its own layers: root may write anywhere
        // there; uid 1000 only below the world-writable /tmp and /var/tmp, which matters
        // when the checkout (and so the sentinel's path) lives under /tmp, as in some CI
        // clones. The host sentinel is checked separately below.
        let sentinel_path_world_writable = sentinel.starts_with("/tmp") || sentinel.starts_with("/var/tmp");
        let inside = match (who == "root", sentinel_path_world_writable) {
            (true, _) => "SENTINEL-INSIDE\nPASSWD-INSIDE\nBINARY-INSIDE\n",
            (false, true) => "SENTINEL-INSIDE\n",
            (false, false) => "",
        };
        let want =
            format!("{want_root}{ro_expect}create:{s}/x: ENOENT\ncreate:/proc/1/root{s}/x: EACCES\n{inside}done\n");
        assert_eq!(out, want, "as {who}");
        let escaped: Vec<&String> = host_root_names.iter().filter(|p| Path::new(p).exists()).collect();
        for p in &escaped {
            let _ = fs::remove_file(p);
        }
        assert!(escaped.is_empty(), "as {who}: the job created {escaped:?} on the host");
    }
    assert_eq!(fs::read_dir(&sentinel).unwrap().count(), 0, "the job wrote into the host's sentinel dir");
    assert_eq!(walk(&data), vec![data.join("labels.txt")], "dataset changed");
    assert_eq!(fs::read_to_string(data.join("labels.txt")).unwrap(), "cat\n");
    assert_eq!(hashes(&tree, &files), before, "the rootfs lower tree changed");
    assert_eq!(walk(&tree), tree_before, "files appeared in or vanished from the lower tree");
    assert_eq!(sha256_file(Path::new("/etc/resolv.conf")), resolv_before);
    h.assert_no_residue(&[]);
}

// ---------------------------------------------------------------------------------------
// 2. Host processes
// ---------------------------------------------------------------------------------------

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t02_job_sees_and_signals_only_its_own_processes() {
    require_root!();
    let h = home("pids");
    let marker = unique("esc-hostproc");
    // It records any SIGWINCH: the job's `kill -WINCH -1` must not reach it. (WINCH, not
    // KILL: if the pid namespace were ever missing, -1 would mean every host process.)
    let got = h.dir.join("host-got-signal");
    let trap = format!("trap 'echo got > {}' WINCH; while :; do sleep 0.05; done", got.display());
    let host = HostProc(Command::new("sh").args(["-c", &trap, &marker]).spawn().unwrap());
    let host_pid = host.0.id();
    wait_until("host marker process", Duration::from_secs(5), || !processes_matching(&marker).is_empty());
    // The marker split in two so that the job's own command line does not contain it.
    let (m1, m2) = marker.split_at(6);
    for (who, user) in USERS {
        let script = format!(
            "M1='{m1}'; M2='{m2}'\n\
             echo \"pid1=$(tr '\\0\\n' '  ' < /proc/1/cmdline | cut -c1-34)\"\n\
             n=0; for p in /proc/[0-9]*; do n=$((n+1)); grep -q \"$M1$M2\" $p/cmdline 2>/dev/null && echo SEEN $p; done\n\
             [ $n -le 4 ] && echo few-pids\n\
             kill -0 {host_pid} 2>/dev/null && echo SIGNALLED || echo kill-failed\n\
             ls /proc/{host_pid} >/dev/null 2>&1 && echo HOST-PID-VISIBLE || echo no-host-pid\n\
             kill -WINCH -1 2>/dev/null; echo signalled-all"
        );
        let out = exec_ok(&h, user, &script);
        // Pid 1 is the job's own: its init, running the job's command.
        assert_eq!(
            out, "pid1=/dev/.azp-init --seccomp -- sh -c \nfew-pids\nkill-failed\nno-host-pid\nsignalled-all\n",
            "as {who}"
        );
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(!got.exists(), "kill -WINCH -1 in the job reached a host process");
    drop(host);
    h.assert_no_residue(&[]);
}

// ---------------------------------------------------------------------------------------
// 3. The host's /proc/1/root
// ---------------------------------------------------------------------------------------

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t03_proc_1_root_is_the_sandbox_root() {
    require_root!();
    let h = home("proc1root");
    let name = unique("azp-escape-marker");
    let _marker = HostFile::create(PathBuf::from(format!("/{name}")), "host-only\n");
    assert!(Path::new(&format!("/{name}")).exists());
    for (who, user) in USERS {
        let script = format!(
            "readlink /proc/1/root || echo pid1-root-closed; readlink /proc/self/root; readlink /proc/$$/root\n\
             [ \"$(ls -a /proc/$$/root/)\" = \"$(ls -a /)\" ] && echo same-listing\n\
             for p in /proc/1/root /proc/self/root /proc/$$/root /proc/1/root/.. /proc/1/cwd/../.. /proc/$$/cwd/../..; do test -e $p/{name} && echo VISIBLE $p; done\n\
             probe chroot-escape:/{name}"
        );
        let out = exec_ok(&h, user, &script);
        let chroot = if who == "root" { "marker-not-visible" } else { "EPERM" };
        // Pid 1 (the init) is not dumpable: its root is closed to the job (review::r08).
        assert_eq!(out, format!("pid1-root-closed\n/\n/\nsame-listing\nchroot-escape:/{name}: {chroot}\n"), "as {who}");
    }
    h.assert_no_residue(&[]);
}

// ---------------------------------------------------------------------------------------
// 4. Mounts, pivot_root, new namespaces
// ---------------------------------------------------------------------------------------

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t04_job_cannot_mount_unmount_pivot_or_unshare() {
    require_root!();
    let h = home("mount");
    let hosts = fs::read_to_string("/etc/hosts").unwrap();
    let attempts = toks(&[
        "mount-tmpfs:/tmp/m",
        "mount-proc:/tmp/m",
        "mount-bind:/:/tmp/m",
        "remount-rw:/etc/hosts",
        "umount:/etc/hosts",
        "umount:/proc/sys",
        "umount:/proc/keys",
        "pivot-root:/tmp:/tmp/m",
        "unshare-mnt",
        "unshare-user",
        "unshare-net",
        "clone-newuser",
        "open-tree:/",
        "fsopen:tmpfs",
    ]);
    for (who, user) in USERS {
        let script = format!(
            "mkdir -p /tmp/m\n{}\n\
             mount -t tmpfs none /tmp/m 2>/dev/null && echo MOUNTED-TMPFS\n\
             mount -t proc proc /tmp/m 2>/dev/null && echo MOUNTED-PROC\n\
             mount --bind / /tmp/m 2>/dev/null && echo MOUNTED-BIND\n\
             umount /etc/hosts 2>/dev/null && echo UNMOUNTED\n\
             umount -l /etc/hosts 2>/dev/null && echo UNMOUNTED-LAZY\n\
             pivot_root /tmp /tmp/m 2>/dev/null && echo PIVOTED\n\
             unshare -m true 2>/dev/null && echo UNSHARED-M\n\
             unshare -U true 2>/dev/null && echo UNSHARED-U\n\
             unshare -r true 2>/dev/null && echo UNSHARED-R\n\
             probe clone3-newuser\n\
             cat /etc/hosts; grep -c . /proc/self/mountinfo",
            probe(&attempts)
        );
        let out = exec_ok(&h, user, &script);
        let n_mounts = exec_ok(&h, user, "grep -c . /proc/self/mountinfo");
        // clone3 cannot be filtered on its flags: ENOSYS, so that libcs fall back to clone.
        let want = format!("{}clone3-newuser: ENOSYS\n{hosts}{n_mounts}", expect(&attempts, |_| "EPERM".into()));
        assert_eq!(out, want, "as {who}");
    }
    h.assert_no_residue(&[]);
}

// ---------------------------------------------------------------------------------------
// 5. Kernel modules and other kernel state
// ---------------------------------------------------------------------------------------

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t05_job_cannot_load_modules_or_touch_kernel_state() {
    require_root!();
    let h = home("modules");
    let attempts = toks(&[
        "init-module",
        "finit-module:/tmp/fake.ko",
        "delete-module:esc_no_such_module",
        "kexec",
        "syslog",
        "bpf",
        "keyctl",
        "userfaultfd",
        "perf",
        "open-by-handle",
        "io-uring",
    ]);
    for (who, user) in USERS {
        let script = format!(
            "printf '\\177ELF' > /tmp/fake.ko\n{}\n\
             insmod /tmp/fake.ko 2>&1\n\
             dmesg 2>&1 >/dev/null",
            probe(&attempts)
        );
        let out = exec(&h, user, &script);
        let want = format!(
            "{}insmod: can't insert '/tmp/fake.ko': Operation not permitted\ndmesg: klogctl: Operation not permitted\n",
            expect(&attempts, |_| "EPERM".into())
        );
        assert_eq!(out.out, want, "as {who}: {}", out.err);
    }
    h.assert_no_residue(&[]);
}

// ---------------------------------------------------------------------------------------
// 6. Device nodes, host block devices, /sys
// ---------------------------------------------------------------------------------------

/// A block device of the host (e.g. the root disk), by its /dev name.
fn host_block_device() -> Option<String> {
    fs::read_dir("/dev").ok()?.flatten().find_map(|e| {
        let ft = e.file_type().ok()?;
        use std::os::unix::fs::FileTypeExt;
        ft.is_block_device().then(|| e.file_name().to_string_lossy().into_owned())
    })
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t06_job_cannot_create_or_open_device_nodes() {
    require_root!();
    let h = home("devices");
    let attempts = toks(&[
        "mknod-c:/tmp/null:1:3",
        "mknod-b:/tmp/sda:8:0",
        "mknod-c:/dev/mem:1:1",
        "mknod-c:/dev/kmsg:1:11",
        "open-r:/dev/kmsg",
        "open-r:/dev/mem",
        "create:/sys/escape",
        "open-w:/sys/kernel/rcu_expedited",
    ]);
    let block = host_block_device();
    for (who, user) in USERS {
        let mut opts: Vec<&str> = user.to_vec();
        opts.extend(["--volume", "/dev:/hostdev"]);
        let mut host_dev = toks(&["open-r:/hostdev/null", "open-r:/hostdev/zero"]);
        if let Some(b) = &block {
            host_dev.push(format!("open-r:/hostdev/{b}"));
        }
        let script = format!(
            "{}\n{}\n\
             ls /dev | tr '\\n' ' '; echo\n\
             head -c 1 /dev/kcore > /dev/null 2>&1 && echo KCORE-READABLE\n\
             find / -xdev -type b 2>/dev/null; find /dev -type b; echo no-block-devices\n\
             awk '$5 == \"/sys\" {{ print $6 }}' /proc/self/mountinfo",
            probe(&attempts),
            probe(&host_dev)
        );
        let out = exec_ok(&h, &opts, &script);
        // /sys is the job's own sysfs (of its network namespace), mounted read-only by its
        // helper: a write is refused by the read-only superblock before any permission.
        let want_attempts: Vec<&str> = if who == "root" {
            vec!["EPERM", "EPERM", "EPERM", "EPERM", "ENOENT", "ENOENT", "EROFS", "EROFS"]
        } else {
            vec!["EPERM", "EPERM", "EACCES", "EACCES", "ENOENT", "ENOENT", "EROFS", "EROFS"]
        };
        let a: String = attempts.iter().zip(&want_attempts).map(|(t, e)| format!("{t}: {e}\n")).collect();
        // nodev on the bind (and every submount): even /dev/null of the host cannot be opened.
        let d = expect(&host_dev, |_| "EACCES".into());
        // libcontainer links /dev/kcore to /proc/kcore where the kernel has it (Debian's
        // does, this VM's not): /proc/kcore is masked, so the link opens nothing (above).
        let kcore = if Path::new("/proc/kcore").exists() { "kcore " } else { "" };
        let want = format!(
            "{a}{d}fd full {kcore}mqueue null ptmx pts random shm stderr stdin stdout tty urandom zero \nno-block-devices\nro,nosuid,nodev,noexec,relatime\n"
        );
        assert_eq!(out, want, "as {who}");
    }
    h.assert_no_residue(&[]);
}

/// Whether the host mounts the cgroup2 hierarchy (v2, or hybrid's `unified`): then the
/// helper manages the job's cgroup and hides the host's tree (src/sandbox/cgroup.rs).
fn host_has_cgroup2() -> bool {
    fs::read_to_string("/proc/self/mountinfo").unwrap().lines().any(|l| l.contains(" - cgroup2 "))
}

/// devices.list (cgroup v1) of a running job, read from the host.
fn devices_list(name: &str) -> Option<String> {
    let dir = cgroup_dirs_of(name).into_iter().find(|d| d.starts_with("/sys/fs/cgroup/devices"))?;
    fs::read_to_string(dir.join("devices.list")).ok()
}

fn v1_devices_controller() -> bool {
    Path::new("/sys/fs/cgroup/devices/devices.list").exists()
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t06b_devices_cgroup_allows_only_the_default_nodes() {
    require_root!();
    if rootless() {
        return skip(
            "rootless: the devices cgroup can only be written by host root; a rootless job reaches \
             only the device nodes bound into it and cannot create others (t06, t07)",
        );
    }
    if !v1_devices_controller() {
        return skip("no cgroup v1 devices controller (v2 uses an eBPF program; not inspected here)");
    }
    let h = home("devcg");
    let name = unique("esc-devcg");
    let job = WaitingJob::start(&h, &[], &["--name", &name], "");
    let list = devices_list(&name).expect("devices.list of the running job");
    let st = job.finish();
    assert!(st.success(), "{st}");
    let mut lines: Vec<&str> = list.lines().collect();
    lines.sort();
    // Exactly spec.rs's rules, written by the helper (sandbox::cgroup): deny all, then
    // null, zero, full, random, urandom, tty, console, ptmx and the pty slaves. Nothing
    // else: no mknod of anything, no /dev/net/tun (both of which libcgroups' own manager
    // used to append), no block device, no "a *:* rwm".
    assert_eq!(
        lines,
        vec![
            "c 136:* rwm",
            "c 1:3 rwm",
            "c 1:5 rwm",
            "c 1:7 rwm",
            "c 1:8 rwm",
            "c 1:9 rwm",
            "c 5:0 rwm",
            "c 5:1 rwm",
            "c 5:2 rwm"
        ],
    );
    h.assert_no_residue(&[&name]);
}

// ---------------------------------------------------------------------------------------
// 7. Another slot's GPU
// ---------------------------------------------------------------------------------------

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t07_job_cannot_open_another_slots_gpu() {
    require_root!();
    let tree = or_skip!(driver_tree());
    let h = home("gpu");
    let name = unique("esc-gpu");
    let attempts = toks(&["mknod-c:/dev/nvidia0:195:0", "mknod-c:/tmp/nvidia0:195:0", "open-rw:/dev/nvidia0"]);
    let before = format!(
        "ls /dev | grep nvidia | tr '\\n' ' '; echo\n{}\n{}",
        probe(&attempts),
        // The own GPU's node is allowed: opening it gets past the cgroup to the (absent) driver.
        probe(&toks(&["open-rw:/dev/nvidia1"]))
    );
    let tree = tree.to_str().unwrap();
    let job = WaitingJob::start(&h, &["--driver-root", tree], &["--gpus", "1", "--name", &name], &before);
    let out = job.before.clone();
    let list = if v1_devices_controller() { devices_list(&name) } else { None };
    let st = job.finish();
    assert!(st.success(), "{st}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0].trim(), "nvidia-modeset nvidia-uvm nvidia-uvm-tools nvidia1 nvidiactl", "{out}");
    assert_eq!(
        lines[1..4],
        ["mknod-c:/dev/nvidia0:195:0: EPERM", "mknod-c:/tmp/nvidia0:195:0: EPERM", "open-rw:/dev/nvidia0: ENOENT"],
        "{out}"
    );
    // The fake node has no driver behind it: ENXIO/ENODEV, not EPERM (the cgroup allows it).
    assert!(lines[4] == "open-rw:/dev/nvidia1: ENXIO" || lines[4] == "open-rw:/dev/nvidia1: ENODEV", "{out}");
    match list {
        Some(list) => {
            let l: Vec<&str> = list.lines().collect();
            assert!(l.contains(&"c 195:1 rwm"), "own GPU not allowed: {list}");
            assert!(
                !l.iter().any(|x| x.starts_with("c 195:0 ") || x.starts_with("a ") || x.starts_with("c 195:* ")),
                "another GPU allowed: {list}"
            );
        }
        None => skip_part("the job's devices.list is not checked: no cgroup v1 devices controller, or a rootless job"),
    }
    h.assert_no_residue(&[&name]);
}

// ---------------------------------------------------------------------------------------
// 8. Processes outliving the job
// ---------------------------------------------------------------------------------------

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t08_no_process_outlives_the_job() {
    require_root!();
    let h = home("persist");
    for (who, user) in USERS {
        let m = unique(&format!("esc-persist-{who}"));
        // The marker is assembled in the job ($M), so that pid 1's command line does not
        // contain it; `[e]...` keeps grep from matching its own command line. Counted by
        // kind (`$M-bg`, ...): a loop's fork about to exec its `sleep` has the loop's
        // command line for a moment (a sixth match, seen on a busy machine). Debian's
        // busybox has no nohup applet: a function does what it does (ignore SIGHUP, exec).
        let (m1, m2) = m.split_at(8);
        let lp = "while :; do sleep 1; done";
        let script = format!(
            "M1='{m1}'; M2='{m2}'; M=$M1$M2\n\
             command -v nohup >/dev/null || nohup() {{ (trap '' HUP; exec \"$@\"); }}\n\
             ( sh -c '{lp}' $M-doublefork & ) \n\
             setsid sh -c '{lp}' $M-setsid &\n\
             nohup sh -c '{lp}' $M-nohup >/dev/null 2>&1 &\n\
             sh -c '{lp}' $M-bg &\n\
             sh -c 'trap \"\" TERM HUP INT QUIT; {lp}' $M-ignoresig &\n\
             count() {{ for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f 2>/dev/null; echo; done | \
               grep -o \"[e]${{M1#e}}$M2-[a-z]*\" | sort -u | wc -l; }}\n\
             n=0; while [ $(count) -lt 5 ] && [ $n -lt 300 ]; do sleep 0.1; n=$((n+1)); done; count"
        );
        let out = exec_ok(&h, user, &script);
        assert_eq!(out.trim(), "5", "as {who}: the daemons did not all start, the test is not testing");
        let left = processes_matching(&m);
        assert!(left.is_empty(), "as {who}: processes outlived the job: {left:?}");
    }
    h.assert_no_residue(&[]);
}

// ---------------------------------------------------------------------------------------
// 9. Files for the next job
// ---------------------------------------------------------------------------------------

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t09_no_file_reaches_the_next_job() {
    require_root!();
    let h = home("leftover");
    let tree = lower(&h);
    let tree_before = walk(&tree);
    let dirs = "/ /root /tmp /var/tmp /dev/shm /dev/mqueue /etc /home/azp";
    for (who, user) in USERS {
        let u = unique("leak");
        let write = format!(
            "for d in {dirs} $HOME; do echo x > $d/{u} 2>/dev/null && echo wrote $d; done; ln -s /tmp /tmp/{u}-link && echo linked"
        );
        let out = exec_ok(&h, user, &write);
        let want = if who == "root" {
            // (mqueue accepts no plain files: nothing to leave there.)
            "wrote /\nwrote /root\nwrote /tmp\nwrote /var/tmp\nwrote /dev/shm\nwrote /etc\nwrote /home/azp\nwrote /root\nlinked\n"
        } else {
            "wrote /tmp\nwrote /var/tmp\nwrote /dev/shm\nwrote /home/azp\nwrote /home/azp\nlinked\n"
        };
        assert_eq!(out, want, "as {who}");
        for (who2, user2) in USERS {
            let read = format!("for d in {dirs} /home/azp /root; do ls -d $d/{u}* 2>/dev/null; done; echo clean");
            assert_eq!(exec_ok(&h, user2, &read), "clean\n", "{who} left a file for {who2}");
        }
    }
    assert_eq!(walk(&tree), tree_before, "the lower tree changed");
    h.assert_no_residue(&[]);
}

/// A job's System V IPC objects and POSIX message queues live in an IPC namespace of its
/// own (made by its helper, which mounts its /dev/mqueue): another job running at the same
/// time, the next job and the host find none of them.
#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t09b_no_ipc_object_reaches_another_job_or_the_host() {
    require_root!();
    let h = home("ipc");
    let host_ns = fs::read_link("/proc/self/ns/ipc").unwrap();
    for (who, user) in USERS {
        let u = unique("q");
        // A key that no one else uses: the queue's name as a number.
        let key = u.bytes().fold(0x617a_7000u32, |k, b| k.rotate_left(5) ^ b as u32) & 0x7fff_ffff;
        let mine = toks(&[&format!("shm-create:{key:#x}"), &format!("mq-create:/{u}")]);
        let found = toks(&[&format!("shm-find:{key:#x}"), &format!("mq-find:/{u}")]);
        // The first job makes them, finds them itself, says so, and waits.
        let first = WaitingJob::start(
            &h,
            &[],
            user,
            &format!(
                "{}; {}; readlink /proc/self/ns/ipc; ls -ldn /dev/mqueue | awk '{{print $1, $3, $4}}'",
                probe(&mine),
                probe(&found)
            ),
        );
        let seen: Vec<&str> = first.before.lines().collect();
        assert_eq!(seen.len(), 6, "as {who}: {seen:?}");
        assert_eq!(
            seen[..4].join("\n") + "\n",
            expect(&mine, |_| "OK".into()) + &expect(&found, |_| "OK".into()),
            "as {who}"
        );
        let ns = seen[4];
        assert_ne!(Path::new(ns), host_ns, "as {who}: the job has the host's IPC namespace");
        assert!(ns.starts_with("ipc:["), "as {who}: {ns}");
        // Its queues' dir is the job's root's, sticky and open to all, as a job's own mount.
        assert_eq!(seen[5], "drwxrwxrwt 0 0", "as {who}");
        // While it runs: another job, and the host, see neither.
        for (who2, user2) in USERS {
            let out = exec_ok(&h, user2, &format!("{}; readlink /proc/self/ns/ipc", probe(&found)));
            let want = expect(&found, |_| "ENOENT".into());
            assert!(out.starts_with(&want), "{who}'s objects reached {who2}: {out}");
            assert_ne!(out[want.len()..].trim(), ns, "{who2} shares {who}'s IPC namespace");
        }
        let host_keys = fs::read_to_string("/proc/sysvipc/shm").unwrap();
        let key = key.to_string();
        assert!(
            !host_keys.lines().any(|l| l.split_whitespace().next() == Some(key.as_str())),
            "on the host: {host_keys}"
        );
        assert!(first.finish().success(), "as {who}: the first job failed");
    }
    h.assert_no_residue(&[]);
}

// ---------------------------------------------------------------------------------------
// 10. Host memory and pids
// ---------------------------------------------------------------------------------------

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t10_memory_hog_in_a_child_is_killed_and_pid_1_survives() {
    require_root!();
    let h = home("memhog");
    let name = unique("esc-memhog");
    // oom_score_adj cannot be lowered (CAP_SYS_RESOURCE is not kept).
    let script = "probe hog:1024; echo hog=$?; cat /proc/self/oom_score_adj; \
                  echo -1000 > /proc/self/oom_score_adj 2>/dev/null && echo LOWERED; echo alive";
    let started = Instant::now();
    let out = exec_ok(&h, &["--name", &name, "--memory", "64M"], script);
    assert_eq!(out, "hog=137\n1000\nalive\n");
    assert!(started.elapsed() < Duration::from_secs(60));
    h.assert_no_residue(&[&name]);
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t10b_thread_bomb_is_contained_by_the_pids_limit() {
    require_root!();
    let h = home("threadbomb");
    for (who, user) in USERS {
        let name = unique("esc-threads");
        let mut opts = vec!["--name", name.as_str(), "--pids", "64"];
        opts.extend_from_slice(user);
        // 2000, not more: harmless to the host if the limit were ever missing.
        let out = exec_ok(&h, &opts, "probe threads:2000; echo alive");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert_eq!(lines[1], "alive");
        let created: u32 = lines[0]
            .strip_prefix("threads:2000: created ")
            .and_then(|s| s.strip_suffix(" then EAGAIN"))
            .unwrap_or_else(|| panic!("as {who}: {out}"))
            .parse()
            .unwrap();
        eprintln!("as {who}: the thread bomb created {created} threads, then EAGAIN");
        // 64 tasks: the init, sh, the probe's main thread and at most 61 more.
        assert!(
            (48..=61).contains(&created),
            "as {who}: {created} threads: limit not enforced, or bomb never went off"
        );
        h.assert_no_residue(&[&name]);
    }
}

// ---------------------------------------------------------------------------------------
// 11. setuid binaries and capabilities
// ---------------------------------------------------------------------------------------

/// Capabilities a root job keeps (spec.rs JOB_CAPABILITIES), as a /proc/PID/status mask:
/// CHOWN 0, DAC_OVERRIDE 1, FOWNER 3, FSETID 4, KILL 5, SETGID 6, SETUID 7, SETPCAP 8,
/// NET_BIND_SERVICE 10, SYS_CHROOT 18, AUDIT_WRITE 29.
const JOB_CAPS: u64 = (1 << 0)
    | (1 << 1)
    | (1 << 3)
    | (1 << 4)
    | (1 << 5)
    | (1 << 6)
    | (1 << 7)
    | (1 << 8)
    | (1 << 10)
    | (1 << 18)
    | (1 << 29);

fn status_field(status: &str, key: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key} in {status}"))
        .trim()
        .to_string()
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t11_setuid_binary_does_not_escalate_and_capabilities_are_minimal() {
    require_root!();
    let h = home("setuid");
    for f in ["bin/busybox-suid", "bin/probe-suid"] {
        let m = fs::metadata(lower(&h).join(f)).unwrap();
        let what = (m.mode() & 0o7777, m.uid());
        assert_eq!(
            what,
            (0o4755, store_uid_of_image_root()),
            "the rootfs must carry setuid-root binaries, or this test tests nothing"
        );
    }
    // The probe keeps what setuid gives it (busybox drops it for most applets by itself).
    let ids = exec_ok(&h, &["--user", "1000:1000"], "probe-suid ids open-r:/etc/passwd create:/etc/x");
    let want = "ids: ruid=1000 euid=1000 suid=1000\nopen-r:/etc/passwd: OK\ncreate:/etc/x: EACCES\n";
    assert_eq!(ids, want, "a setuid-root binary of the rootfs raised a uid 1000 job's privileges");
    let out = exec_ok(&h, &["--user", "1000:1000"], "busybox-suid id -u; busybox-suid cat /proc/self/status; echo ==; busybox-suid sh -c 'id -u; cat /etc/shadow 2>&1 | head -c 0; touch /root/x 2>/dev/null && echo ROOT-WRITE; echo end'");
    let (first, rest) = out.split_once("==\n").unwrap();
    let (id, status) = first.split_once('\n').unwrap();
    assert_eq!(id, "1000", "setuid busybox ran as root: {out}");
    assert_eq!(status_field(status, "Uid"), "1000\t1000\t1000\t1000");
    assert_eq!(status_field(status, "NoNewPrivs"), "1");
    assert_eq!(status_field(status, "Seccomp"), "2");
    for k in ["CapInh", "CapPrm", "CapEff", "CapAmb"] {
        assert_eq!(status_field(status, k), "0000000000000000", "{k} of a uid 1000 job");
    }
    // The bounding set stays the job set (as runc/Docker for non-root users): with
    // no_new_privileges nothing can raise capabilities into it, setuid included.
    assert_eq!(status_field(status, "CapBnd"), format!("{JOB_CAPS:016x}"));
    assert_eq!(rest, "1000\nend\n");

    let status = exec_ok(&h, &[], "cat /proc/self/status");
    for k in ["CapPrm", "CapEff", "CapBnd"] {
        assert_eq!(status_field(&status, k), format!("{JOB_CAPS:016x}"), "{k} of a root job");
    }
    assert_eq!(status_field(&status, "CapAmb"), "0000000000000000");
    assert_eq!(status_field(&status, "CapInh"), "0000000000000000");
    assert_eq!(status_field(&status, "NoNewPrivs"), "1");
    // Named, for the reader: none of these is in the set.
    for (cap, bit) in [
        ("SYS_ADMIN", 21),
        ("MKNOD", 27),
        ("SYS_MODULE", 16),
        ("SYS_PTRACE", 19),
        ("SYS_RAWIO", 17),
        ("DAC_READ_SEARCH", 2),
        ("NET_ADMIN", 12),
        ("NET_RAW", 13),
        ("SYS_RESOURCE", 24),
        ("SETFCAP", 31),
        ("SYS_BOOT", 22),
        ("BPF", 39),
        ("PERFMON", 38),
    ] {
        assert_eq!(JOB_CAPS & (1u64 << bit), 0, "CAP_{cap}");
    }
    h.assert_no_residue(&[]);
}

// ---------------------------------------------------------------------------------------
// 12. The azp-sandbox binary (CVE-2019-5736 class)
// ---------------------------------------------------------------------------------------

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t12_host_binary_is_unreachable_and_unchanged() {
    require_root!();
    let h = home("hostbin");
    let host_bin = fs::canonicalize(bin()).unwrap();
    let before = sha256sum(&host_bin);
    let size = fs::metadata(&host_bin).unwrap().len();
    for (who, user) in USERS {
        let script = format!(
            "readlink /proc/self/exe; readlink /proc/1/exe || tr '\\0' '\\n' < /proc/1/cmdline | head -n 1\n\
             for p in /proc/[0-9]*; do readlink $p/exe; probe open-w:$p/exe open-rw:$p/exe; done | sort | uniq -c | sed 's/^ *//'\n\
             find / -xdev -type f -size {size}c 2>/dev/null | while read f; do sha256sum \"$f\"; done | grep -c {before}"
        );
        let out = exec(&h, user, &script);
        let lines: Vec<&str> = out.out.lines().collect();
        assert_eq!(lines[0], "/bin/busybox", "as {who}: {}", out.out);
        // Pid 1 is the jobs' init, a read-only bind of a host file (not dumpable: its exe
        // link is closed to the job, its command line is not).
        assert!(lines[1].starts_with("/dev/.azp-init"), "as {who}: {}", out.out);
        // Every process's exe is a binary of the rootfs or the init, busy (root) or not
        // writable (uid 1000). The init is a host file whose owner is no id of the job's
        // user namespace: not writable even by the job's root.
        let e = if who == "root" { "ETXTBSY" } else { "EACCES" };
        for l in &lines[2..lines.len() - 1] {
            let (_, what) = l.split_once(' ').unwrap_or_else(|| panic!("as {who}: `{l}` in\n{}", out.out));
            let ok = ["/bin/busybox", "/bin/probe", "/dev/.azp-init"].contains(&what)
                || what.ends_with(&format!("/exe: {e}"))
                || what.starts_with("open-w:/proc/1/exe: EACCES")
                || what.starts_with("open-rw:/proc/1/exe: EACCES");
            assert!(ok, "as {who}: unexpected `{l}` in\n{}", out.out);
        }
        assert_eq!(*lines.last().unwrap(), "0", "as {who}: a copy of the host binary is visible in the job");
    }
    assert_eq!(sha256sum(&host_bin), before, "the host binary changed");
    // And so is the init: one file, as written, read-only.
    let inits: Vec<PathBuf> = fs::read_dir(h.dir.join("cache/init")).unwrap().flatten().map(|e| e.path()).collect();
    assert_eq!(inits.len(), 1, "{inits:?}");
    assert_eq!(sha256_file(&inits[0]), sha256_hex(azp_sandbox::sandbox::init::BINARY), "the jobs' init changed");
    assert_eq!(fs::metadata(&inits[0]).unwrap().mode() & 0o7777, 0o555);
    h.assert_no_residue(&[]);
}

// ---------------------------------------------------------------------------------------
// 13. Inherited fds (CVE-2024-21626 class)
// ---------------------------------------------------------------------------------------

/// Host fds opened without O_CLOEXEC (so every child of this test process inherits them);
/// closed when the test ends.
struct LeakedFds(Vec<i32>);
impl Drop for LeakedFds {
    fn drop(&mut self) {
        for fd in &self.0 {
            // SAFETY: closing fds this test opened and owns.
            unsafe { libc::close(*fd) };
        }
    }
}

fn open_leaky(p: &Path, flags: i32) -> i32 {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; flags deliberately lack O_CLOEXEC.
    let fd = unsafe { libc::open(c.as_ptr(), flags) };
    assert!(fd >= 0, "cannot open {}", p.display());
    fd
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t13_inherited_host_fds_do_not_reach_the_job() {
    require_root!();
    let h = home("fds");
    let hostdir = h.dir.join("hostdir");
    fs::create_dir_all(&hostdir).unwrap();
    let secret = unique("fd-secret");
    fs::write(hostdir.join("secret"), &secret).unwrap();
    let mut fds = LeakedFds(vec![
        open_leaky(&hostdir, libc::O_RDONLY | libc::O_DIRECTORY),
        open_leaky(&hostdir.join("secret"), libc::O_RDONLY),
        open_leaky(Path::new("/"), libc::O_RDONLY | libc::O_DIRECTORY),
    ]);
    // And one opened by std (O_CLOEXEC), then made inheritable.
    let f = fs::File::open(&hostdir).unwrap();
    let fd = std::os::fd::IntoRawFd::into_raw_fd(f);
    // SAFETY: fcntl on an fd we own.
    assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }, 0);
    fds.0.push(fd);
    let max = *fds.0.iter().max().unwrap() + 8;
    for (who, user) in USERS {
        let script = format!(
            "probe fds\n\
             n=3; while [ $n -le {max} ]; do\n\
               ls /proc/self/fd/$n/.. /proc/self/fd/$n/ 2>/dev/null && echo LISTED $n\n\
               cat /proc/self/fd/$n 2>/dev/null; cat /proc/self/fd/$n/secret 2>/dev/null\n\
               cd /proc/self/fd/$n 2>/dev/null && echo CD $n; n=$((n+1)); done\n\
             readlink /proc/self/cwd; readlink /proc/1/cwd || echo pid1-cwd-closed; echo end"
        );
        let out = exec_ok(&h, user, &script);
        // The init (pid 1) is not dumpable: its cwd is closed to the job (review::r08).
        assert_eq!(out, "fds: 0 1 2\n/\npid1-cwd-closed\nend\n", "as {who}");
        assert!(!out.contains(&secret));
        // The runc escape: a working directory through a leaked fd. Refused before the
        // job runs (libcontainer checks the cwd is inside the rootfs).
        for fd in &fds.0 {
            let mut opts = user.to_vec();
            let wd = format!("/proc/self/fd/{fd}");
            opts.extend(["--workdir", &wd]);
            let o = exec(&h, &opts, "echo JOB-RAN; pwd; ls");
            assert_eq!(o.code, 125, "as {who}, --workdir {wd}: {}\n{}", o.out, o.err);
            assert!(!o.out.contains("JOB-RAN"), "as {who}, --workdir {wd}: {}", o.out);
            // "failed to verify if current working directory is safe" (a dir outside the
            // rootfs) or "failed to chdir ... ENOTDIR" (a file): either way one error line.
            assert!(o.err.contains("azp-sandbox: error: cannot create the sandbox"), "as {who}: {}", o.err);
        }
        let o = exec(&h, &[user, &["--workdir", "/tmp"]].concat(), "readlink /proc/self/cwd; pwd");
        assert_eq!((o.code, o.out.as_str()), (0, "/tmp\n/tmp\n"), "as {who}: {}", o.err);
    }
    drop(fds);
    h.assert_no_residue(&[]);
}

// ---------------------------------------------------------------------------------------
// 14. The PAT / token file
// ---------------------------------------------------------------------------------------

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t14_token_file_is_unreachable() {
    require_root!();
    let h = home("token");
    let mut rnd = [0u8; 16];
    std::io::Read::read_exact(&mut fs::File::open("/dev/urandom").unwrap(), &mut rnd).unwrap();
    let token = hex(rnd);
    let tf = h.dir.join("pat");
    fs::write(&tf, format!("{token}\n")).unwrap();
    fs::set_permissions(&tf, fs::Permissions::from_mode(0o600)).unwrap();
    let t = tf.display();
    let (p1, p2) = token.split_at(16);
    for (who, user) in USERS {
        // Only awk sees the token whole, and not in its argv (a grep for it would find
        // itself in /proc/PID/cmdline).
        let script = format!(
            "P1='{p1}'; P2='{p2}'\n\
             for p in {t} /proc/1/root{t} /proc/self/root/../..{t} /proc/1/cwd/../..{t}; do cat $p 2>/dev/null && echo READ $p; done\n\
             grep -rl \"$P1$P2\" / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev 2>/dev/null | wc -l\n\
             has() {{ awk -v a=\"$P1\" -v b=\"$P2\" 'index($0, a b) {{ n++ }} END {{ print n + 0 }}'; }}\n\
             cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n' | has"
        );
        let out = exec(&h, user, &script);
        assert_eq!(out.out, "0\n0\n", "as {who}: {}", out.err);
        assert!(!out.out.contains(&token) && !out.err.contains(&token), "as {who}: the token leaked");
    }
    h.assert_no_residue(&[]);
}

// ---------------------------------------------------------------------------------------
// 15. Hostile inputs
// ---------------------------------------------------------------------------------------

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t15_malformed_config_and_job_records() {
    require_root!();
    let h = home("hostile");
    // TOML: a one-line error naming the file, exit 125, nothing created.
    for (name, body) in
        [("bad.toml", "url = \"unterminated\npool = [\n"), ("type.toml", "pool = 5\n"), ("bin.toml", "\u{0}\u{1}\u{2}")]
    {
        let p = h.dir.join(name);
        fs::write(&p, body).unwrap();
        let o = h.run(&["run", "--config", p.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(125), "{name}: {err}");
        assert_eq!(err.lines().count(), 1, "{name}: {err}");
        assert!(
            err.contains("azp-sandbox: error: bad config file") && err.contains(p.to_str().unwrap()),
            "{name}: {err}"
        );
    }
    // JSON: job records that are garbage, truncated, empty or of the wrong shape.
    let (jobs, home) = (h.jobs_dir(), h.home());
    let records: [(&str, &[u8]); 4] = [
        ("garbage", b"\x00\xff not json"),
        ("truncated", b"{\"id\":\"truncated\",\"cgroup_path\":\"/azp-sa"),
        ("empty", b""),
        ("wrongshape", b"[1,2,3]"),
    ];
    for (id, body) in records {
        let (d, l) = (jobs.join(format!("esc-json-{id}")), home.job_layers_dir(&format!("esc-json-{id}")));
        for sub in [d.join("merged"), d.join("bundle"), l.join("upper/etc"), l.join("work")] {
            fs::create_dir_all(sub).unwrap();
        }
        fs::write(l.join("upper/etc/leftover"), "x").unwrap();
        fs::write(d.join("state.json"), body).unwrap();
        fs::write(d.join("plan.json"), body).unwrap();
        fs::write(d.join("lock"), "").unwrap();
    }
    // And layers whose record is gone altogether: in their bucket, and directly in
    // layers/ (a home from before buckets).
    fs::create_dir_all(home.job_layers_dir("esc-json-norecord").join("upper")).unwrap();
    fs::create_dir_all(home.layers_dir().join("esc-json-legacy/upper")).unwrap();
    give_to_test_user(jobs.parent().unwrap());
    give_to_test_user(&home.layers_dir());
    let o = h.run(&["gc"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    h.assert_no_residue(&[]);
    // And a job runs fine afterwards.
    assert_eq!(exec_ok(&h, &[], "echo ok"), "ok\n");
    h.assert_no_residue(&[]);
}

/// Mount options (field 6) of every mount at or below `dst` in a job's mountinfo.
fn mount_opts_under<'a>(mountinfo: &'a str, dst: &str) -> Vec<(&'a str, &'a str)> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let (at, opts) = (*f.get(4)?, *f.get(5)?);
            (at == dst || at.starts_with(&format!("{dst}/"))).then_some((at, opts))
        })
        .collect()
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t15b_volume_of_root_or_shadow_is_read_only_nosuid_nodev_all_the_way_down() {
    require_root!();
    // Root mode trusts the admin: `--volume /:/host` and `--volume /etc/shadow:/x` are
    // allowed (there is no site policy in root mode). What must hold is that such binds
    // are read-only, nosuid and nodev, including every mount below them (/host/dev/shm,
    // /host/sys/fs/cgroup/*, ...), so the job cannot write the host through them.
    let h = home("rootvol");
    let u = unique("esc-vol");
    let shm_probe = PathBuf::from(format!("/dev/shm/{u}"));
    let tmp_probe = PathBuf::from(format!("/tmp/{u}"));
    for (who, user) in USERS {
        let mut opts = user.to_vec();
        opts.extend(["--volume", "/:/host", "--volume", "/etc/shadow:/x"]);
        let attempts = toks(&[
            &format!("create:/host/dev/shm/{u}"),
            &format!("create:/host/tmp/{u}"),
            &format!("create:/host{}/{u}", h.dir.display()),
            "open-w:/host/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "open-w:/host/sys/fs/cgroup/pids/cgroup.procs",
            "open-w:/x",
            "open-r:/host/proc/1/root/etc/hostname",
        ]);
        let script = format!("cat /proc/self/mountinfo; echo ==; {}", probe(&attempts));
        let out = exec_ok(&h, &opts, &script);
        let (mountinfo, results) = out.split_once("==\n").unwrap();
        let mut under = mount_opts_under(mountinfo, "/host");
        under.extend(mount_opts_under(mountinfo, "/x"));
        assert!(under.len() >= 3, "as {who}: expected /host, its submounts and /x: {under:?}");
        for (at, o) in &under {
            let o: Vec<&str> = o.split(',').collect();
            for want in ["ro", "nosuid", "nodev"] {
                assert!(o.contains(&want), "as {who}: {at} is not {want}: {o:?}");
            }
        }
        let mut expected: Vec<String> = attempts[..6]
            .iter()
            .map(|t| {
                let cgroup_hidden = t.contains("/sys/fs/cgroup/") && (rootless() || host_has_cgroup2());
                let e = match (t.starts_with("create:"), cgroup_hidden) {
                    (true, _) => "EROFS",
                    // The helper covers the host's cgroup tree with its own cgroup2 view
                    // before the job exists (rootless, or as root when the host has a
                    // cgroup2 hierarchy): the v1 hierarchies are not even there.
                    (false, true) => "ENOENT",
                    // Host-root-owned files are unmapped for the job's root (its own user
                    // namespace), as for any other id.
                    (false, false) => "EACCES",
                };
                format!("{t}: {e}")
            })
            .collect();
        // Host procfs under /host/proc: pid 1's root needs ptrace access (CAP_SYS_PTRACE).
        expected.push(format!("{}: EACCES", attempts[6]));
        assert_eq!(results.lines().collect::<Vec<_>>(), expected, "as {who}");
        let wrote = shm_probe.exists() || tmp_probe.exists();
        let _ = (fs::remove_file(&shm_probe), fs::remove_file(&tmp_probe));
        assert!(!wrote, "as {who}: the job wrote the host");
    }
    // Readable by a root job (the admin chose to bind it), not by uid 1000 (mode 0640).
    if Path::new("/etc/shadow").exists() {
        let o =
            exec(&h, &["--user", "1000:1000", "--volume", "/etc/shadow:/x"], "cat /x >/dev/null 2>&1 || echo denied");
        assert_eq!(o.out, "denied\n", "{}", o.err);
    }
    h.assert_no_residue(&[]);
}

// ---------------------------------------------------------------------------------------
// 16. Faults: kill -9 of the manager, disk full
// ---------------------------------------------------------------------------------------

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t16_kill_9_of_the_manager_mid_job_then_gc_leaves_nothing() {
    require_root!();
    let lab = or_skip!(common::netlab::NetLab::new());
    let fake = common::fake_azure::FakeAzure::start_in(&lab);
    let h = TestHome::with_busybox("esc-mgr-kill");
    let tf = h.dir.join("pat");
    fs::write(&tf, format!("{}\n", fake.pat())).unwrap();
    let m = unique("esc-mgrjob");
    fake.enqueue_job(&format!(
        "sh -c 'while :; do sleep 1; done' {m} &\nsh -c 'trap \"\" TERM HUP; while :; do sleep 1; done' {m}-2\n"
    ));
    let log = fs::File::create(h.dir.join("manager.log")).unwrap();
    let mut mgr = HostProc(
        h.lab_command(&lab)
            .args(["run", "--pool", "gpu", "--url", &fake.url(), "--token-file", tf.to_str().unwrap()])
            .args(["--agents", "1", "--gpus-per-agent", "none", "--rootfs", "bb", "--name-prefix", "esckill"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let log = || fs::read_to_string(h.dir.join("manager.log")).unwrap_or_default();
    wait_until("the job to start", Duration::from_secs(90), || {
        processes_matching(&m).len() >= 2 || mgr.0.try_wait().unwrap().is_some()
    });
    assert!(mgr.0.try_wait().unwrap().is_none(), "manager exited: {}", log());
    let jobs: Vec<String> =
        fs::read_dir(h.jobs_dir()).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert!(!jobs.is_empty());
    mgr.0.kill().unwrap(); // SIGKILL
    mgr.0.wait().unwrap();
    // The helpers die with the manager (PDEATHSIG); the job's processes are gc's to kill.
    let out = h.lab_command(&lab).arg("gc").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    wait_until("the job's processes to be gone", Duration::from_secs(10), || processes_matching(&m).is_empty());
    let names: Vec<&str> = jobs.iter().map(String::as_str).collect();
    h.assert_no_residue(&names);
    assert!(processes_matching(h.dir.to_str().unwrap()).is_empty(), "processes of this home left");
    for j in &jobs {
        assert!(cgroup_dirs_of(j).is_empty(), "cgroup of {j} left");
    }
    // The jobs' links and the host's table (root mode) are gone too.
    let out = h.lab_command(&lab).arg("gc").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(lab.host_network_residue(), Vec::<String>::new());
}

/// A small tmpfs, unmounted (lazily) when dropped, even when the test fails.
struct Tmpfs(PathBuf);
impl Tmpfs {
    fn mount(dir: PathBuf, size: &str) -> Tmpfs {
        fs::create_dir_all(&dir).unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            &dir,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(format!("size={size},mode=0755").as_str()),
        )
        .unwrap_or_else(|e| panic!("cannot mount a tmpfs on {}: {e}", dir.display()));
        Tmpfs(dir)
    }
}
impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        let _ = fs::remove_dir(&self.0);
    }
}

fn free_bytes(p: &Path) -> u64 {
    let s = nix::sys::statvfs::statvfs(p).unwrap();
    s.blocks_available() as u64 * s.fragment_size() as u64
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t16b_disk_full_import_and_job() {
    require_root!();
    // Its home is on a tmpfs: the job's idmapped lower layers there need Linux 6.3 (older
    // kernels get `exec`'s one-line refusal, which is not what this test is about).
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut v = release.trim().split(|c: char| !c.is_ascii_digit()).map(|n| n.parse::<u32>().unwrap_or(0));
    if (v.next().unwrap_or(0), v.next().unwrap_or(0)) < (6, 3) {
        return common::skip::skip(format!("kernel {}: idmapped mounts of tmpfs need 6.3", release.trim()));
    }
    let outer = TestHome::new("esc-diskfull");
    let tmpfs = Tmpfs::mount(outer.dir.join("small"), "8m");
    // The home is a dir inside the tmpfs (the tmpfs's own mount is not residue).
    let h = TestHome { dir: tmpfs.0.join("home") };
    fs::create_dir_all(&h.dir).unwrap();
    give_to_test_user(&h.dir);
    // (a) A rootfs larger than the disk: one line, and no partial rootfs.
    let big = outer.dir.join("big.tar");
    {
        let mut b = tar::Builder::new(Vec::new());
        let mut x: u64 = 0x9e3779b97f4a7c15;
        let data: Vec<u8> = (0..12 << 20)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        tar_file(&mut b, "./big.bin", &data, 0o644);
        fs::write(&big, b.into_inner().unwrap()).unwrap();
    }
    let o = h.run(&["rootfs", "import", big.to_str().unwrap(), "--name", "big"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.to_lowercase().contains("no space left"), "{err}");
    let left = walk(&h.dir.join("rootfs"));
    assert!(left.is_empty(), "partial rootfs left: {left:?}");
    assert!(!h.ok(&["rootfs", "list"]).contains("big"));
    // (b) A job that writes more than fits: it sees ENOSPC, exec returns, nothing is left.
    h.import(&busybox_tar(), "bb");
    // The first job writes the jobs' init into the home's cache, once per home: not a
    // job's residue.
    h.ok(&["exec", "--rootfs", "bb", "--", "true"]);
    let free = free_bytes(&h.dir);
    let o = h
        .command()
        .args(["exec", "--rootfs", "bb", "--", "sh", "-c", "dd if=/dev/zero of=/fill bs=1M count=64 2>&1 | grep -o 'No space left on device' | head -1; echo more > /x || echo x=failed; echo end"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        (o.status.code(), out.as_ref()),
        (Some(0), "No space left on device\nx=failed\nend\n"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    h.assert_no_residue(&[]);
    assert!(free_bytes(&h.dir) + (64 << 10) >= free, "space not given back: {} < {free}", free_bytes(&h.dir));
    std::mem::forget(h); // its dir is the tmpfs: the guard unmounts it
    drop(tmpfs);
}

// ---------------------------------------------------------------------------------------
// Holes found by this suite and fixed: the job's output goes through a pipe (runner.rs),
// and the manager reads the upper dir without following what the job planted (slot.rs).
// ---------------------------------------------------------------------------------------

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t17_job_cannot_read_back_the_file_its_stdout_appends_to() {
    require_root!();
    let h = home("stdout-reopen");
    let logf = h.dir.join("shared.log");
    fs::write(&logf, "PREVIOUS-JOB-OUTPUT\n").unwrap();
    let f = fs::OpenOptions::new().append(true).open(&logf).unwrap();
    let o = h
        .command()
        .args([
            "exec",
            "--rootfs",
            "esc",
            "--user",
            "1000:1000",
            "--",
            "sh",
            "-c",
            "exec 3</proc/self/fd/1; cat <&3 >&2",
        ])
        .stdout(f)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("PREVIOUS-JOB-OUTPUT"), "the job read earlier contents of its log file: {err}");
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t18_manager_does_not_follow_files_the_job_planted_in_its_upper_dir() {
    require_root!();
    let lab = or_skip!(common::netlab::NetLab::new());
    let fake = common::fake_azure::FakeAzure::start_in(&lab);
    let h = TestHome::with_busybox("esc-mgr-fifo");
    let tf = h.dir.join("pat");
    fs::write(&tf, format!("{}\n", fake.pat())).unwrap();
    fake.enqueue_job("mkdir -p /azp/agent/_diag && mkfifo /azp/agent/_diag/zz-evil.log && echo planted");
    let log = fs::File::create(h.dir.join("manager.log")).unwrap();
    let mut mgr = HostProc(
        h.lab_command(&lab)
            .args(["run", "--pool", "gpu", "--url", &fake.url(), "--token-file", tf.to_str().unwrap()])
            .args(["--agents", "1", "--gpus-per-agent", "none", "--rootfs", "bb", "--name-prefix", "escfifo"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let results = fake.wait_results(1, Duration::from_secs(120));
    assert_eq!(results.len(), 1, "the job never ran");
    assert!(results[0].output.contains("planted"), "{}", results[0].output);
    let log = || fs::read_to_string(h.dir.join("manager.log")).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !log().contains("job finished") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let finished = log().contains("job finished");
    let _ = mgr.0.kill();
    let _ = mgr.0.wait();
    let _ = h.run(&["gc"]);
    assert!(finished, "the slot hung on a FIFO the job left in its upper dir:\n{}", log());
}

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t11b_setuid_binary_left_in_the_upper_dir_is_unreachable_for_host_users() {
    require_root!();
    // A root job keeps CAP_FOWNER/FSETID, so it can leave a binary setuid to its root in
    // its upper dir: setuid to the job's own host uid since issue 19 (host root with
    // --userns host). The upper dir is on the host's filesystem: no host user may reach
    // it (running it as the job's uid would let them signal or trace the next job of
    // that block, or any job with --userns host).
    let h = home("upper-suid");
    let name = unique("esc-upper-suid");
    let marker = unique("suid");
    let job = WaitingJob::start(
        &h,
        &[],
        &["--name", &name],
        &format!("echo {marker} >/dev/null; cp /bin/probe /p && chmod 4755 /p"),
    );
    let planted = h.home().job_layers_dir(&name).join("upper/p");
    let meta = fs::metadata(&planted).expect("the job's file in its upper dir");
    let root = identity::job_statuses(&marker).first().map(|(_, st)| identity::ids(st, "Uid:")[0]);
    assert_eq!((meta.mode() & 0o7777, Some(meta.uid())), (0o4755, root), "the test is not testing");
    // A host user (nobody) tries to run it.
    let o = Command::new(&planted).uid(65534).gid(65534).args(["ids", "open-r:/etc/shadow"]).output();
    let st = job.finish();
    assert!(st.success(), "{st}");
    match o {
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}"),
        Ok(o) => panic!("a host user ran the job's setuid binary: {}", String::from_utf8_lossy(&o.stdout)),
    }
    h.assert_no_residue(&[&name]);
}

// ---------------------------------------------------------------------------------------
// 19. A hostile rootfs: symlinks that point out of the tree, followed by the host side
// ---------------------------------------------------------------------------------------

#[test]
#[cfg_attr(not(test_as_root), ignore = "needs root: creates real sandboxes (CI runs the suite as root)")]
fn t19_rootfs_symlinks_do_not_redirect_the_helpers_writes_to_the_host() {
    require_root!();
    let tree = or_skip!(driver_tree());
    let h = home("symlinked-etc");
    // An image whose /etc is an absolute symlink to a host dir (as a pulled layer could
    // carry): a GPU job makes the helper, host root, write the linker config and library
    // links into the job's tree before the container exists.
    let sentinel = h.dir.join("host-etc");
    fs::create_dir_all(&sentinel).unwrap();
    let etc = lower(&h).join("etc");
    fs::remove_dir_all(&etc).unwrap();
    std::os::unix::fs::symlink(&sentinel, &etc).unwrap();
    let usr_lib = lower(&h).join("usr/lib");
    let _ = fs::remove_dir_all(&usr_lib);
    fs::create_dir_all(lower(&h).join("usr")).unwrap();
    std::os::unix::fs::symlink(&sentinel, &usr_lib).unwrap();
    let o = h
        .command()
        .args(["--driver-root", tree.to_str().unwrap(), "exec", "--rootfs", "esc", "--gpus", "1", "--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    // Refused (the path does not exist inside the tree) or done inside the tree; never
    // on the host.
    let left: Vec<PathBuf> = walk(&sentinel);
    assert!(left.is_empty(), "the helper wrote through the rootfs's symlink onto the host: {left:?} ({err})");
    if !o.status.success() {
        assert_eq!(o.status.code(), Some(125), "{err}");
        assert_eq!(err.lines().filter(|l| l.contains("error")).count(), 1, "{err}");
    }
    h.assert_no_residue(&[]);
}

#[path = "escape/supervisor.rs"]
mod supervisor;

// ---------------------------------------------------------------------------------------
// Exhaustion: pids, memory, swap, disk (issue 25)
// ---------------------------------------------------------------------------------------

#[path = "escape/disk.rs"]
mod disk;
#[path = "escape/exhaust.rs"]
mod exhaust;
