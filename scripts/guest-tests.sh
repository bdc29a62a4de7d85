#!/usr/bin/env bash
# Runs test binaries (already built as root: cargo build --tests) in a QEMU guest with
# Debian's stock kernel, for what the test VM's own kernel cannot show: project quotas (its
# kernel has no CONFIG_QFMT_V2: ext4 with `-O quota,project` does not mount) and a cgroup v2
# only host. The guest's / is the host's own / (so the binaries' compiled-in paths hold),
# shared READ-ONLY over 9p under a tmpfs overlay (what the tests write to /etc, /work, ...
# stays in the guest), with a fresh /run, /tmp, cgroup2 at /sys/fs/cgroup, the kernel's
# modules at /lib/modules, and `target/tmp` (the tests' CARGO_TARGET_TMPDIR, where every
# test home is made) on a disk mounted `prjquota` (ext4; AZP_GUEST_FS=xfs for XFS): every
# job of every test gets a disk quota there. Only target/guest/out is written back.
#
#   sudo scripts/guest-tests.sh [TEST[:FILTER] ...]   default: escape_suite sandbox_exec
#        e.g. escape_suite:exhaust sandbox_exec:bomb,memory  (FILTER: libtest's name filters)
#   sudo scripts/guest-tests.sh --bench N      the disk quota's cost: N interleaved rounds of
#                                              `exec -- true` (release build), a home with
#                                              project quotas against one without
#
# Environment: AZP_GUEST_FS=ext4|xfs (target/tmp's filesystem), AZP_GUEST_TEST_ARGS (more
# libtest arguments, e.g. --nocapture), AZP_GUEST_CMD (a shell command the guest runs
# before the tests, output in out/cmd.log), AZP_GUEST_TIMEOUT (seconds, default 5400),
# AZP_GUEST_SMP (default 2), AZP_GUEST_ACCEL (tcg|kvm). Exit status 0 only when every
# test binary exited 0. `--bench` needs a release build (cargo build --release).
#
# Needs qemu-system-x86, kmod and xfsprogs (scripts/setup.sh), and the Debian mirror once
# (the kernel package is cached in target/guest). TCG by default: nested KVM hung in early
# boot on the test VM (AZP_GUEST_ACCEL=kvm to try it elsewhere). Results:
# target/guest/out/*.log; the guest's serial console: target/guest/console.log.
# docs/testing.md says what it proved, with timings.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
g=$repo/target/guest
mkdir -p "$g" && cd "$g"
start=$(date +%s)
bench=""
if [ "${1:-}" = "--bench" ]; then bench=${2:?--bench N}; shift 2; fi
tests=${*:-escape_suite sandbox_exec}

# 1. Debian's kernel and an initrd that mounts / (virtio, 9p, overlay); again when this
# script is newer than the initrd.
if [ ! -f vmlinuz ] || [ ! -f initrd.cpio ] || [ "$repo/scripts/guest-tests.sh" -nt initrd.cpio ]; then
  apt-get download "$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')"
  rm -rf k && mkdir k && dpkg-deb -x linux-image-*.deb k && rm -f linux-image-*.deb
  # All modules stay (bound at /lib/modules in the guest, for what the tests modprobe:
  # veth, nf_tables, ...); the initrd loads only what mounting / needs.
  depmod -b k "$(ls k/lib/modules)"
  cp k/boot/vmlinuz-* vmlinuz
  rm -rf initrd && mkdir -p initrd/bin initrd/mods
  python3 - <<'EOF'
import os, subprocess
root = [os.path.join("k/lib/modules", d, "kernel") for d in os.listdir("k/lib/modules")][0]
idx = {f[:-3].replace("-", "_"): os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".ko")}
def deps(m):
    for l in subprocess.run(["strings", "-a", idx[m]], capture_output=True, text=True).stdout.splitlines():
        if l.startswith("depends="):
            return [x.replace("-", "_") for x in l[8:].split(",") if x]
    return []
order = []
def visit(m):
    if m in order or m not in idx: return
    for d in deps(m): visit(d)
    order.append(m)
for m in ["virtio_pci", "virtio_blk", "9pnet_virtio", "9p", "overlay"]:
    visit(m)
for m in order:
    subprocess.run(["cp", idx[m], "initrd/mods/"], check=True)
open("initrd/modorder", "w").write("".join(os.path.basename(idx[m]) + "\n" for m in order))
EOF
  tar -xf "$repo/target/fixtures/busybox-rootfs.tar" -C initrd ./bin/busybox
  for l in sh mount insmod mkdir switch_root cat sed tr poweroff; do ln -sf busybox "initrd/bin/$l"; done
  cat > initrd/init <<'EOF'
#!/bin/sh
mkdir -p /proc /sys /dev /newroot
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs dev /dev
for m in $(cat /modorder); do insmod /mods/$m || echo "insmod $m failed"; done
# The host's / read-only, under a tmpfs overlay: the guest cannot write to the host.
mkdir -p /lower /upper
mount -t 9p -o ro,trans=virtio,version=9p2000.L,msize=512000 host /lower || poweroff -f
mount -t tmpfs -o size=1g tmpfs /upper && mkdir /upper/u /upper/w
mount -t overlay overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w /newroot || poweroff -f
exec switch_root /newroot /bin/sh "$(tr ' ' '\n' < /proc/cmdline | sed -n 's/^azp.script=//p')"
EOF
  chmod +x initrd/init
  python3 - <<'EOF'
import os, stat
out = open("initrd.cpio", "wb"); ino = [1]
def hdr(name, mode, size, nlink=1):
    n = name.encode() + b"\0"
    h = "070701" + "".join("%08X" % v for v in [ino[0], mode, 0, 0, nlink, 0, size, 0, 0, 0, 0, len(n), 0])
    ino[0] += 1; b = h.encode() + n
    return b + b"\0" * ((4 - len(b) % 4) % 4)
pad = lambda n: b"\0" * ((4 - n % 4) % 4)
for d, _, fs in os.walk("initrd"):
    rel = os.path.relpath(d, "initrd")
    if rel != ".": out.write(hdr(rel, stat.S_IFDIR | 0o755, 0, 2))
    for f in sorted(fs):
        p = os.path.join(d, f); r = os.path.normpath(os.path.join(rel, f)); st = os.lstat(p)
        data = os.readlink(p).encode() if stat.S_ISLNK(st.st_mode) else open(p, "rb").read()
        mode = stat.S_IFLNK | 0o777 if stat.S_ISLNK(st.st_mode) else stat.S_IFREG | (st.st_mode & 0o7777)
        out.write(hdr(r, mode, len(data))); out.write(data + pad(len(data)))
out.write(hdr("TRAILER!!!", 0, 0))
EOF
fi

# 2. Two disks: project quotas (the tests' target/tmp) and plain ext4 (the bench).
rm -f quota.img plain.img
fs=${AZP_GUEST_FS:-ext4}
truncate -s 3G quota.img
case $fs in
  ext4) mkfs.ext4 -q -F -O quota,project -I 256 -E lazy_itable_init=1 quota.img ;;
  xfs) mkfs.xfs -q -f quota.img ;;
  *) echo "AZP_GUEST_FS=$fs: ext4 or xfs" >&2; exit 2 ;;
esac
truncate -s 1G plain.img && mkfs.ext4 -q -F -E lazy_itable_init=1 plain.img

# 3. What the guest runs, over the host's /.
[ -n "$bench" ] && tests=""
cat > guest.sh <<EOF
#!/bin/sh
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 out $g/out
mkdir -p /lib/modules && mount --bind $g/k/lib/modules /lib/modules
modprobe loop  # /dev/loop-control appears only once it is loaded (no udev to make it)
echo "booted in \$(cut -d' ' -f1 /proc/uptime) s" > $g/out/boot.txt
mkdir -p /dev/pts /dev/shm; mount -t devpts devpts /dev/pts; mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run; mount -t tmpfs tmpfs /tmp; mount -t cgroup2 cgroup2 /sys/fs/cgroup
ip link set lo up; hostname azp-guest
export HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin AZP_SANDBOX_SKIP_LOG=$g/out/skips.log
mount -o prjquota /dev/vda $repo/target/tmp || echo "mount -o prjquota of target/tmp failed" > $g/out/env.txt
cd $repo
{ uname -r; echo "cgroup2 controllers: \$(cat /sys/fs/cgroup/cgroup.controllers)"; findmnt -no FSTYPE,OPTIONS $repo/target/tmp; } >> $g/out/env.txt 2>&1
[ -s $g/cmd.sh ] && sh $g/cmd.sh > $g/out/cmd.log 2>&1
for t in $tests; do
  name=\${t%%:*} filter=\${t#*:}; [ "\$filter" = "\$t" ] && filter="" || filter=\$(echo "\$filter" | tr , ' ')
  bin=\$(ls -t target/debug/deps/\$name-* 2>/dev/null | grep -v '\.d\$' | head -1)
  [ -n "\$bin" ] || { echo "no test binary \$name in target/debug/deps: cargo build --tests (as root)" > $g/out/\$name.log; continue; }
  s=\$(cut -d' ' -f1 /proc/uptime)
  timeout 3000 \$bin --test-threads=2 ${AZP_GUEST_TEST_ARGS:-} \$filter > $g/out/\$name.log 2>&1; echo "exit \$? after \$(awk -v s=\$s '{print int(\$1-s)}' /proc/uptime) s" >> $g/out/\$name.log
done
if [ -n "$bench" ]; then
  mkdir -p /mnt/plain && mount /dev/vdb /mnt/plain
  python3 $repo/bench/quota_cycle.py target/release/azp-sandbox target/tmp/bench-quota /mnt/plain/bench $bench \
    > $g/out/bench.log 2>&1
fi
sync; echo 1 > /proc/sys/kernel/sysrq; echo o > /proc/sysrq-trigger
sleep 60  # the power-off is asynchronous: pid 1 must not exit first (a panic)
EOF
rm -rf out && mkdir out
rm -f cmd.sh; [ -z "${AZP_GUEST_CMD:-}" ] || printf '%s\n' "$AZP_GUEST_CMD" > cmd.sh
accel=${AZP_GUEST_ACCEL:-tcg}
cpu=max; [ "$accel" = kvm ] && cpu=host
timeout "${AZP_GUEST_TIMEOUT:-5400}" qemu-system-x86_64 -accel "$accel" -cpu "$cpu" -m 4096 -smp "${AZP_GUEST_SMP:-2}" -nographic -no-reboot -nic none \
  -kernel vmlinuz -initrd initrd.cpio -append "console=ttyS0 panic=-1 azp.script=$g/guest.sh" \
  -virtfs local,path=/,mount_tag=host,security_model=passthrough,id=host,multidevs=remap,readonly=on \
  -virtfs local,path="$g/out",mount_tag=out,security_model=passthrough,id=out \
  -drive file=quota.img,if=virtio,format=raw,cache=unsafe -drive file=plain.img,if=virtio,format=raw,cache=unsafe \
  > console.log 2>&1 || true
rm -f quota.img plain.img
cat out/boot.txt out/env.txt 2>/dev/null || { echo "the guest did not start its script: see $g/console.log"; tail -20 console.log; }
echo "wall: $(( $(date +%s) - start )) s"
[ -s out/cmd.log ] && { echo "== out/cmd.log"; cat out/cmd.log; }
for f in out/*.log; do [ "$f" = out/cmd.log ] || [ "$f" = out/skips.log ] && continue; echo "== $f"; grep -E '^test .*(ok|FAILED)$|^test result|^exit|median' "$f" || tail -5 "$f"; done
[ -s out/skips.log ] && { echo "== skipped"; cat out/skips.log; }
# Every test binary asked for must have run and exited 0.
status=0
for t in $tests; do grep -q '^exit 0 ' "out/${t%%:*}.log" 2>/dev/null || status=1; done
exit $status
