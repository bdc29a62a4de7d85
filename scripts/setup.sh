#!/usr/bin/env bash
# Set-up for a fresh Debian (12+) machine: the system packages azp-sandbox builds and
# tests with. Idempotent; run as root (or it re-runs itself with sudo).
#   libseccomp-dev, pkg-config  libcontainer's seccomp support (profiles are enforced, not ignored)
#   busybox-static              the small test rootfs
#   bash-static                 bash in that rootfs, for the agent's bash run.sh stand-in
#   libc6-dev (build-essential) glibc's static libc.a: the jobs' init is linked against it
#   debootstrap                 the real Debian rootfs test, and rootfs recipes
#   runc                        the peer in the sandbox benchmark
#   umoci                       the peer in the pull benchmark (with skopeo)
#   zstd                        .tar.zst rootfs archives (tests and benchmarks)
#   uidmap                      newuidmap/newgidmap for rootless mode (and /etc/subuid, /etc/subgid)
#   libcap2-bin                 setcap (the setuid tests refuse a binary with file capabilities)
#   ca-certificates, curl       downloads (agent package, registries) in recipes
#   nftables                    jobs' own network in root mode (the host's table, issue 23)
#   passt                       jobs' own network in rootless mode (pasta)
#   dnsmasq-base, iperf3        the network tests' fake host and internet, and the throughput bench
#   python3                     the git mirror's test repository, bench summaries
#   qemu-system-x86, kmod       scripts/guest-tests.sh (opt-in): a guest with Debian's kernel; depmod
#                               for its modules, modprobe inside it (the guest runs the host's /)
#   e2fsprogs, xfsprogs         the guest's project-quota disks (mkfs.ext4 -O quota,project, mkfs.xfs)
#   python3-pip                 pip download of the pip cache bench's wheels (scripts/fixtures/pip-index.sh)
#   btrfs-progs                 the btrfs disk quota tests (mkfs.btrfs, btrfs quota enable)
set -euo pipefail
if [ "$(id -u)" != 0 ]; then exec sudo -E "$0" "$@"; fi
export DEBIAN_FRONTEND=noninteractive
pkgs=(build-essential libc6-dev pkg-config libseccomp-dev busybox-static bash-static debootstrap runc zstd uidmap libcap2-bin
      ca-certificates curl git iproute2 procps psmisc docker-registry skopeo apache2-utils umoci
      nftables passt dnsmasq-base iperf3 python3 python3-pip qemu-system-x86 kmod e2fsprogs xfsprogs btrfs-progs)
missing=()
for p in "${pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# pasta (rootless jobs' network) opens /dev/net/tun as the user: 0666, as Debian's udev
# sets it (a host without udev, like a container or a minimal VM, has 0600).
if [ -c /dev/net/tun ] && [ "$(stat -c %a /dev/net/tun)" != 666 ]; then
  chmod 0666 /dev/net/tun
fi
if ! command -v cargo >/dev/null; then
  echo "setup: Rust (cargo >= 1.85) is required: install it with rustup (https://rustup.rs), then re-run" >&2
  exit 1
fi
# The ordinary user the rootless and setuid test passes run as (scripts/test.sh), with
# subordinate ids for its user namespace.
if ! id azp-rootless >/dev/null 2>&1; then
  useradd --create-home --shell /bin/sh azp-rootless
fi
if ! grep -qE '^(azp-rootless|'"$(id -u azp-rootless)"'):' /etc/subuid 2>/dev/null; then
  usermod --add-subuids 200000-265535 --add-subgids 200000-265535 azp-rootless
fi
# The host ids jobs run as in root and setuid modes (src/identity): reserved in
# /etc/subuid and /etc/subgid as `azp-sandbox`, far from accounts (2^31, 1024 blocks of
# 65536). `azp-sandbox service install` adds the same entry; both refuse an overlap.
sub_start=2147483648 sub_count=67108864
for f in /etc/subuid /etc/subgid; do
  if ! grep -q '^azp-sandbox:' "$f" 2>/dev/null; then
    if awk -F: -v s="$sub_start" -v c="$sub_count" \
        'NF==3 && $2+0 < s+c && s < $2+$3 { print FILENAME ": " $0 " overlaps the azp-sandbox range"; bad=1 } END { exit !bad }' "$f" 2>/dev/null; then
      echo "setup: cannot reserve $sub_start:$sub_count in $f (see above): move that entry" >&2
      exit 1
    fi
    echo "azp-sandbox:$sub_start:$sub_count" >> "$f"
  fi
done
# The site's settings dir: the PAT (0600) and config.toml go here (README "A real pool").
install -d -m 0755 -o root -g root /etc/azp-sandbox
echo "setup: ok ($(cargo --version))"
