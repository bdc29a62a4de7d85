#!/usr/bin/env bash
# gpu-proof.sh --out FILE.md [--bin AZP_SANDBOX] [--driver-root DIR] [--work DIR] [--keep]
#
# One-command proof that a GPU works the same inside an azp-sandbox job as on the host.
# Run as root on a Linux machine with an NVIDIA GPU and driver; needs nothing else (no
# Docker, no network, no package manager): the rootfs is built from the machine itself
# (its static busybox, else its own shell and tools with the libraries `ldd` names), plus
# test programs compiled here (scripts/gpu-proof/: cuprobe.c with `cc`, cuda-proof.cu
# with `nvcc` when the machine has them). It imports that rootfs, runs each check on the
# host and in a sandbox, prints a table, writes it as Markdown to --out, and exits 1 when
# a check failed (2 on bad usage). `--out bench/GPU.md` makes it BENCHMARKS.md's "real
# GPU" section (bench/run.sh includes that file). Checks:
#   - the driver azp-sandbox discovers (`gpu list`) is the host's;
#   - device nodes: a job with --gpus all has every GPU node, --gpus 1 only GPU 1's;
#   - nvidia-smi -L and its exit status;
#   - libcuda through the sandbox's linker (cuprobe: cuDriverGetVersion, cuInit, devices);
#   - cuda-proof (nvcc): device query, device-to-device copy bandwidth, SGEMM throughput,
#     the same binary inside and out: ratios inside/host, target >= 0.99;
#   - with 2+ GPUs: --gpus 1 sees only GPU 1 (its UUID); with MIG: --gpus MIG-<uuid>
#     sees that one instance;
#   - what --gpus all adds to a job's set-up, and NVML's share of it (INFO: measured,
#     not checked);
#   - PyTorch, when the host has it, through a read-only --volume of its environment:
#     torch.cuda sees the GPU inside;
#   - the CUDA compatibility check refuses a rootfs whose CUDA the driver cannot run;
#   - graphics: the EGL vendor file and the library it names are in the sandbox.
#
# --driver-root DIR runs against a driver tree (scripts/make-driver-tree.sh: Debian's
# driver packages, fake device nodes) as far as that goes without a GPU: every row that
# needs one says "SKIPPED: no GPU". The same happens on a host where `nvidia-smi -L`
# finds no GPU. --bin is the azp-sandbox binary (default: on PATH, else this checkout's
# target/release or target/debug). --work keeps the scratch files there (default: a
# temp dir, removed at the end unless --keep).
set -uo pipefail
# With pipefail, `printf '%s\n' "$VAR" | grep -q X` fails now and then: bash writes a
# long value in pieces (20 KiB, then the rest), and a grep that found X in the first and
# exited makes the next write die of SIGPIPE (`gpu list --json` here: 22 KiB, its EGL
# line in the first piece; 3-6 of 2000 such tests failed on one CPU). So a variable is
# searched as a here-string (`grep -q X <<<"$VAR"`: 0 of 2000).

START=$(date +%s)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
OUT="" BIN="" ROOT=/ WORK="" KEEP=0
LIB_DIR=/usr/local/azp-sandbox/nvidia/lib64 # gpu::inject::LIB_DIR
ROOTFS=gpu-proof

usage() { echo "usage: $0 --out FILE.md [--bin AZP_SANDBOX] [--driver-root DIR] [--work DIR] [--keep]" >&2; exit 2; }
die() { echo "gpu-proof: $*" >&2; exit 2; }
log() { echo "gpu-proof: $*" >&2; }

while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT=${2:-}; shift 2 ;;
        --bin) BIN=${2:-}; shift 2 ;;
        --driver-root) ROOT=${2:-}; shift 2 ;;
        --work) WORK=${2:-}; shift 2 ;;
        --keep) KEEP=1; shift ;;
        -h | --help) usage ;;
        *) echo "gpu-proof: unknown argument '$1'" >&2; usage ;;
    esac
done
[ -n "$OUT" ] || usage
[ "$(id -u)" = 0 ] || die "run as root (the sandbox's root mode, mknod-free device binds, rootfs import)"
if [ -z "$BIN" ]; then
    BIN=$(command -v azp-sandbox || true)
    for b in "$REPO/target/release/azp-sandbox" "$REPO/target/debug/azp-sandbox"; do
        [ -n "$BIN" ] || { [ -x "$b" ] && BIN=$b; }
    done
fi
[ -n "$BIN" ] && [ -x "$BIN" ] || die "no azp-sandbox binary: build it (cargo build --release) or pass --bin PATH"
BIN=$(realpath "$BIN")
[ -d "$ROOT" ] || die "--driver-root $ROOT is not a directory"
ROOT=$(realpath "$ROOT")
# Jobs run as host ids of their own, leased from the azp-sandbox entry of /etc/subuid and
# /etc/subgid. A machine without it gets the default entry, as `azp-sandbox service
# install` and scripts/setup.sh add it, and keeps it (said so in the table): taking it
# out again would race with another run of this script using it, and rewriting those
# files races with useradd. Appended on a line of its own, one run at a time.
SUBID_ENTRY=azp-sandbox:2147483648:67108864
SUBID_ADDED=() RM_WORK=0
cleanup() {
    # The jobs' network made the host's nftables table (and maybe turned forwarding on):
    # gc takes it away again unless a running azp-sandbox still uses it.
    [ -z "${HOME_DIR:-}" ] || "$BIN" --home "$HOME_DIR" -q gc >/dev/null 2>&1
    [ "$RM_WORK" = 0 ] || rm -rf "$WORK"
}
trap cleanup EXIT
if [ -z "$WORK" ]; then
    WORK=$(mktemp -d /tmp/azp-gpu-proof.XXXXXX)
    # mktemp's 0700 would keep the jobs' own ids from their init in the home below it.
    chmod 0711 "$WORK"
    [ "$KEEP" = 1 ] || RM_WORK=1
fi
mkdir -p "$WORK" || die "cannot create $WORK"
WORK=$(realpath "$WORK")
# The first of DIR and the dirs above it that others cannot search (none: empty). Jobs
# run as ids of their own: they reach nothing below such a dir.
private_dir_above() {
    local d=$1
    while [ "$d" != / ]; do
        [ $(( 0$(stat -c %a "$d") & 1 )) = 1 ] || { echo "$d"; return; }
        d=$(dirname "$d")
    done
}
# The jobs' init is in the home below --work.
d=$(private_dir_above "$WORK")
[ -z "$d" ] || die "--work $WORK: $d is not searchable by others, which the jobs' own ids need: chmod o+x $d, or choose another --work"
HOME_DIR="$WORK/home"
AZP=("$BIN" --home "$HOME_DIR" --driver-root "$ROOT")
{
    command -v flock >/dev/null && flock -x 7
    for f in /etc/subuid /etc/subgid; do
        grep -q '^azp-sandbox:' "$f" 2>/dev/null && continue
        # A last line without its newline would swallow the entry.
        if [ -s "$f" ] && [ -n "$(tail -c1 "$f")" ]; then echo >>"$f"; fi
        echo "$SUBID_ENTRY" >>"$f" || die "cannot add $SUBID_ENTRY to $f"
        SUBID_ADDED+=("$f")
        log "added $SUBID_ENTRY to $f (the jobs' own host ids; it stays)"
    done
} 7>>/etc/subuid # the lock: on the file itself, no file of its own left behind

# ---- results -----------------------------------------------------------------------------
ROWS=() FAILED=0 PASSED=0 SKIPPED=0
# row CHECK HOST SANDBOX RESULT   (RESULT: PASS, FAIL: why, SKIPPED: why)
row() {
    local cell=() c
    for c in "$@"; do
        c=${c%$'\n'}
        c=${c//$'\n'/; }
        cell+=("${c//|/\\|}")
    done
    ROWS+=("| ${cell[0]} | ${cell[1]} | ${cell[2]} | ${cell[3]} |")
    case "$4" in
        PASS*) PASSED=$((PASSED + 1)) ;;
        INFO*) ;; # a measurement, not a check
        SKIPPED*) SKIPPED=$((SKIPPED + 1)) ;;
        *) FAILED=$((FAILED + 1)) ;;
    esac
    printf '%-46s %s\n' "$1" "$4" >&2
    : >"$WORK/last.err" # a later row's FAIL quotes only its own sandbox's stderr
}
verdict() {
    if [ "$1" = 0 ]; then
        echo PASS
    else
        echo "FAIL: $2$([ -s "$WORK/last.err" ] && echo " (stderr: $(tail -n1 "$WORK/last.err"))")"
    fi
}

# Runs a command in a sandbox on the proof rootfs: sandbox GPUS CMD... The job's stdout
# is the output; stderr (the job's and azp-sandbox's) goes to $WORK/last.err (appended to
# $WORK/sandbox.log), whose last line a failed row quotes.
sandbox() {
    local gpus=$1 rc
    shift
    "${AZP[@]}" exec --rootfs "$ROOTFS" --gpus "$gpus" ${NET_ARGS[@]+"${NET_ARGS[@]}"} \
        ${SANDBOX_ARGS[@]+"${SANDBOX_ARGS[@]}"} -- "$@" 2>"$WORK/last.err"
    rc=$?
    cat "$WORK/last.err" >>"$WORK/sandbox.log"
    return $rc
}
SANDBOX_ARGS=()
NET_ARGS=() # --network none where the default (isolated) cannot be set up here (row 2b)
NET_NOTE="isolated (the default)"

kv() { sed -n "s/^$1=//p" | head -n1; } # value of key=value in stdin

# ---- 1. the driver azp-sandbox sees -------------------------------------------------------
LIST_JSON=$("${AZP[@]}" gpu list --json --capabilities all 2>"$WORK/gpu-list.err")
LIST_RC=$?
json_str() { printf '%s\n' "$LIST_JSON" | sed -n "s/^  \"$1\": \"\\(.*\\)\",\$/\\1/p" | head -n1; }
# Sources of items of a kind in `gpu list --json` (host paths of the driver's files).
item_sources() {
    printf '%s\n' "$LIST_JSON" | awk -v kind="\"$1\"," '
        $1 == "\"kind\":" { k = $2 }
        $1 == "\"source\":" && k == kind { s = $2; gsub(/[",]/, "", s); print s }'
}
DRIVER=$(json_str driver_version)
NGPUS=$(printf '%s\n' "$LIST_JSON" | grep -c '"minor":' || true)
HOST_SMI=""
for s in "$ROOT/usr/bin/nvidia-smi" "$ROOT/usr/local/nvidia/bin/nvidia-smi" "$ROOT/bin/nvidia-smi"; do
    [ -z "$HOST_SMI" ] && [ -x "$s" ] && HOST_SMI=$s
done
[ "$ROOT" = / ] && [ -z "$HOST_SMI" ] && HOST_SMI=$(command -v nvidia-smi || true)
# The first word like 580.159.04 ("... x86_64 Kernel Module  535.309.01 ..." and the open
# module's "... Open Kernel Module for x86_64  580.159.04 ...").
HOST_DRIVER=$(awk '/^NVRM version:/ { for (i = 3; i <= NF; i++) if ($i ~ /^[0-9]+\.[0-9]+(\.[0-9]+)?$/) { print $i; exit } }' \
    "$ROOT/proc/driver/nvidia/version" 2>/dev/null)

# A real GPU: on the machine itself, nvidia-smi lists one. A driver tree never has one.
REAL_GPU=0
if [ "$ROOT" = / ] && [ -n "$HOST_SMI" ]; then
    HOST_L=$("$HOST_SMI" -L 2>&1)
    HOST_L_RC=$?
    [ "$HOST_L_RC" = 0 ] && grep -q '^GPU ' <<<"$HOST_L" && REAL_GPU=1
fi
NO_GPU="SKIPPED: no GPU"
# Host runs of the test programs load libcuda as the sandbox's do, by SONAME; where the
# driver's dir is not in the host's linker configuration, from the dir azp-sandbox found.
HOST_LIBCUDA_DIR=$(dirname "$(item_sources library | grep -m1 '/libcuda\.so\.')" 2>/dev/null)
host_run() { LD_LIBRARY_PATH="$HOST_LIBCUDA_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; }

if [ "$LIST_RC" = 0 ] && [ -n "$DRIVER" ]; then
    if [ -n "$HOST_DRIVER" ] && [ "$HOST_DRIVER" != "$DRIVER" ]; then
        row "driver found by azp-sandbox" "$HOST_DRIVER" "$DRIVER" "FAIL: not the loaded kernel module's version"
    else
        row "driver found by azp-sandbox" "${HOST_DRIVER:-$DRIVER (no kernel module)}" "$DRIVER, $NGPUS GPU(s) ($(json_str gpu_source))" PASS
    fi
else
    row "driver found by azp-sandbox" "${HOST_DRIVER:--}" "$(json_str error)$(head -c 300 "$WORK/gpu-list.err")" "FAIL: gpu list found no driver"
fi

# ---- 2. the rootfs, from this machine ----------------------------------------------------
RFS="$WORK/rootfs"
rm -rf "$RFS"
mkdir -p "$RFS"/{bin,etc/ld.so.conf.d,tmp,proc,sys,dev,opt/proof,root}
chmod 1777 "$RFS/tmp"
echo 'include /etc/ld.so.conf.d/*.conf' >"$RFS/etc/ld.so.conf"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$RFS/etc/passwd"
printf 'root:x:0:\n' >"$RFS/etc/group"

is_driver_lib() { case "$(basename "$1")" in libcuda.so* | libnvidia-* | libnvcuvid* | *_nvidia.so* | libnvoptix*) return 0 ;; esac; return 1; }
# copy_with_libs FILE [DEST]: FILE into the rootfs (at DEST, default its own path) and
# every library `ldd` names, at the path the host's linker found it (driver libraries
# excepted: the sandbox injects the host's).
copy_with_libs() {
    local f=$1 dest=${2:-$1} lib
    mkdir -p "$RFS$(dirname "$dest")"
    cp -L "$f" "$RFS$dest" || return 1
    while read -r lib; do
        [ -n "$lib" ] && [ -e "$lib" ] || continue
        is_driver_lib "$lib" && continue
        if [ ! -e "$RFS$lib" ]; then
            mkdir -p "$RFS$(dirname "$lib")"
            cp -L "$lib" "$RFS$lib"
            grep -qxF "$(dirname "$lib")" "$RFS/etc/ld.so.conf.d/proof.conf" 2>/dev/null ||
                dirname "$lib" >>"$RFS/etc/ld.so.conf.d/proof.conf"
        fi
    done < <(ldd "$f" 2>/dev/null | sed -n 's/.*=> \(\/[^ ]*\).*/\1/p; s/^[[:space:]]*\(\/[^ ]*\) (0x.*/\1/p')
}

BUSYBOX=$(command -v busybox || true)
if [ -n "$BUSYBOX" ] && ! ldd "$BUSYBOX" >/dev/null 2>&1; then
    ROOTFS_KIND="static busybox ($BUSYBOX)"
    cp -L "$BUSYBOX" "$RFS/bin/busybox"
    for a in $("$BUSYBOX" --list); do [ -e "$RFS/bin/$a" ] || ln -s busybox "$RFS/bin/$a"; done
else
    ROOTFS_KIND="host tools with their libraries"
    for t in sh bash ls cat grep sed head tail tr wc sort cut env echo test readlink uname mkdir true id ldconfig; do
        p=$(type -P "$t") || continue # the program, not the shell's builtin (true, echo, test)
        [ -x "$p" ] && copy_with_libs "$(realpath "$p")" "/bin/$t"
    done
fi
[ -x "$RFS/bin/sh" ] || ln -sf bash "$RFS/bin/sh"
# The libraries the injected driver files need (libcuda, nvidia-smi: glibc's parts).
for f in $(item_sources library | grep -E '/lib(cuda|nvidia-ml)\.so\.') $(item_sources binary); do
    [ -f "$f" ] && while read -r lib; do
        [ -n "$lib" ] && [ -e "$lib" ] && ! is_driver_lib "$lib" && [ ! -e "$RFS$lib" ] && copy_with_libs "$lib"
    done < <(ldd "$f" 2>/dev/null | sed -n 's/.*=> \(\/[^ ]*\).*/\1/p; s/^[[:space:]]*\(\/[^ ]*\) (0x.*/\1/p')
done

# Test programs.
CC=$(command -v cc || command -v gcc || true)
NVCC=$(command -v nvcc || true)
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
HAVE_PROBE=0 HAVE_PROOF=0 HAVE_TRUE=0
[ -x "$RFS/bin/true" ] && HAVE_TRUE=1
if [ -n "$CC" ] && "$CC" -O2 -o "$WORK/cuprobe" "$HERE/gpu-proof/cuprobe.c" -ldl 2>"$WORK/cc.log"; then
    copy_with_libs "$WORK/cuprobe" /opt/proof/cuprobe && HAVE_PROBE=1
fi
if [ -n "$NVCC" ] && [ "$REAL_GPU" = 1 ]; then
    if "$NVCC" -O3 -arch=native -o "$WORK/cuda-proof" "$HERE/gpu-proof/cuda-proof.cu" 2>"$WORK/nvcc.log" ||
        "$NVCC" -O3 -o "$WORK/cuda-proof" "$HERE/gpu-proof/cuda-proof.cu" 2>>"$WORK/nvcc.log"; then
        copy_with_libs "$WORK/cuda-proof" /opt/proof/cuda-proof && HAVE_PROOF=1
    fi
fi

# PyTorch: its interpreter is copied, its stdlib and site dirs are read-only volumes.
PY=$(command -v python3 || true)
TORCH=""
if [ -n "$PY" ]; then
    TORCH=$("$PY" - <<'EOF' 2>/dev/null
import sys, os, sysconfig
import torch
print("version=" + torch.__version__)
print("exe=" + os.path.realpath(sys.executable))
print("home=" + sys.base_prefix + ":" + sys.base_exec_prefix)
print("path=" + ":".join(p for p in sys.path if p and os.path.isdir(p)))
EOF
    ) || TORCH=""
fi
if [ -n "$TORCH" ]; then
    PY_EXE=$(printf '%s\n' "$TORCH" | kv exe)
    PY_PATH=$(printf '%s\n' "$TORCH" | kv path)
    copy_with_libs "$PY_EXE" /opt/proof/python3
    # Volumes: each sys.path dir not under another one (sorted, so parents come first).
    VOLS=()
    while read -r d; do
        [ -n "$d" ] || continue
        covered=0
        for v in ${VOLS[@]+"${VOLS[@]}"}; do case "$d/" in "$v"/*) covered=1 ;; esac; done
        [ "$covered" = 0 ] && VOLS+=("$d")
    done < <(printf '%s\n' "$PY_PATH" | tr ':' '\n' | sort -u)
    PY_VOLUMES=()
    for v in ${VOLS[@]+"${VOLS[@]}"}; do PY_VOLUMES+=(--volume "$v:$v"); done
    # Jobs run as ids of their own, which must search every dir above a volume. An
    # environment under a private dir (/root, a 0700 home) is not reachable: this row then
    # runs with host ids (--userns host) and says so.
    PY_PRIVATE=""
    for v in ${VOLS[@]+"${VOLS[@]}"}; do
        PY_PRIVATE=$(private_dir_above "$(dirname "$v")")
        [ -z "$PY_PRIVATE" ] || break
    done
    [ -z "$PY_PRIVATE" ] || PY_VOLUMES+=(--userns host)
    # The libraries torch's and the stdlib's extensions load from outside those dirs
    # (libstdc++, libgomp; libffi for ctypes, which torch imports).
    while read -r so; do
        while read -r lib; do
            [ -n "$lib" ] && [ -e "$lib" ] && ! is_driver_lib "$lib" || continue
            inside=0
            for v in ${VOLS[@]+"${VOLS[@]}"}; do case "$lib" in "$v"/*) inside=1 ;; esac; done
            [ "$inside" = 0 ] && [ ! -e "$RFS$lib" ] && copy_with_libs "$lib"
        done < <(ldd "$so" 2>/dev/null | sed -n 's/.*=> \(\/[^ ]*\).*/\1/p')
    done < <("$PY" -c 'import torch, os, sysconfig; ds = [os.path.dirname(torch.__file__), os.path.join(sysconfig.get_path("stdlib"), "lib-dynload")]
print("\n".join(os.path.join(r, f) for d in ds for r, _, fs in os.walk(d) for f in fs if ".so" in f))' 2>/dev/null)
fi

# A second rootfs claiming a CUDA no driver has: the compatibility check must refuse it.
mkdir -p "$WORK/newcuda/usr/local/cuda" "$WORK/newcuda/bin"
printf '{"cuda": {"name": "CUDA SDK", "version": "99.0.0"}}\n' >"$WORK/newcuda/usr/local/cuda/version.json"
cp -a "$RFS/." "$WORK/newcuda/" 2>/dev/null

import_rootfs() { # DIR NAME (replacing one of that name a previous run left in --work)
    "${AZP[@]}" rootfs rm "$2" >/dev/null 2>&1
    tar -C "$1" -cf "$WORK/$2.tar" . && "${AZP[@]}" rootfs import "$WORK/$2.tar" --name "$2" >"$WORK/import-$2.log" 2>&1
}
if import_rootfs "$RFS" "$ROOTFS"; then
    row "rootfs from this machine, imported" "$ROOTFS_KIND" "$(du -sh "$RFS" | cut -f1), $(find "$RFS" | wc -l) entries" PASS
else
    row "rootfs from this machine, imported" "$ROOTFS_KIND" "$(tail -n1 "$WORK/import-$ROOTFS.log")" "FAIL: rootfs import failed"
fi

# ---- 2b. a job with the default network -----------------------------------------------------
# A GPU machine may lack what the default network needs (nftables as root): that is its
# own one-line error, not the GPU's (SKIPPED). Any other failure of the default network
# is a FAIL. Either way, where a job with --network none runs, the GPU rows below run
# with it, and the table says so. No GPUs here: this row is the network's alone.
if sandbox none /bin/true; then
    row "a job with the default network (isolated)" "-" "ran /bin/true" PASS
else
    first=$(grep -v '^$' "$WORK/last.err" | tail -n1)
    if "${AZP[@]}" exec --rootfs "$ROOTFS" --network none -- /bin/true 2>>"$WORK/sandbox.log"; then
        NET_ARGS=(--network none)
        NET_NOTE="none (the default, isolated, failed here: $first)"
        if grep -q ' not found: ' <<<"$first"; then
            row "a job with the default network (isolated)" "-" "$first" "SKIPPED: a package is missing here; the rows below run with --network none"
        else
            row "a job with the default network (isolated)" "-" "$first" "FAIL: the rows below run with --network none"
        fi
    else
        row "a job with the default network (isolated)" "-" "$first" "FAIL: a job cannot start"
    fi
fi

# ---- 3. device nodes ---------------------------------------------------------------------
words() { sort -V | tr '\n' ' ' | sed 's/ $//'; }
host_nodes=$(cd "$ROOT/dev" && ls -d nvidia[0-9]* 2>/dev/null | words)
in_nodes=$(sandbox all /bin/sh -c 'cd /dev && ls -d nvidia[0-9]* nvidiactl nvidia-uvm 2>/dev/null' | words)
want_all=$(printf '%s\n' $host_nodes nvidiactl nvidia-uvm | words)
[ "$in_nodes" = "$want_all" ]
ok=$?
row "--gpus all: device nodes" "$host_nodes" "$in_nodes" "$(verdict $ok "expected $want_all")"
if [ "$NGPUS" -ge 2 ]; then
    gpu1_node=$(printf '%s\n' "$LIST_JSON" | awk '$1 == "\"minor\":" { n++; if (n == 2) { gsub(/,/, "", $2); print "nvidia" $2 } }')
    in1=$(sandbox 1 /bin/sh -c 'cd /dev && ls -d nvidia[0-9]*' | tr '\n' ' ' | sed 's/ $//')
    [ "$in1" = "$gpu1_node" ]
    ok=$?
    row "--gpus 1: only GPU 1's node" "$gpu1_node" "$in1" "$(verdict $ok "expected only $gpu1_node")"
else
    row "--gpus 1: only GPU 1's node" "$NGPUS GPU(s)" "-" "SKIPPED: fewer than 2 GPUs"
fi

# ---- 4. nvidia-smi -----------------------------------------------------------------------
IN_L=$(sandbox all nvidia-smi -L)
IN_L_RC=$?
if [ "$REAL_GPU" = 1 ]; then
    [ "$IN_L_RC" = 0 ] && [ "$IN_L" = "$HOST_L" ]
    ok=$?
    row "nvidia-smi -L (exit status)" "$HOST_L ($HOST_L_RC)" "$IN_L ($IN_L_RC)" "$(verdict $ok "differs from the host")"
else
    # Without a GPU the injected nvidia-smi still runs and reaches NVML: exit 9.
    if [ "$IN_L_RC" = 9 ] && grep -q "couldn't communicate with the NVIDIA driver" <<<"$IN_L"; then
        row "nvidia-smi injected, runs (exit status)" "-" "exit $IN_L_RC: couldn't communicate with the driver" PASS
    else
        row "nvidia-smi injected, runs (exit status)" "-" "$IN_L (exit $IN_L_RC)" "FAIL: expected exit 9 (no driver reachable)"
    fi
    row "nvidia-smi -L (exit status)" "-" "-" "$NO_GPU"
fi
if [ "$NGPUS" -ge 2 ] && [ "$REAL_GPU" = 1 ]; then
    host1=$(printf '%s\n' "$HOST_L" | grep '^GPU 1:' | sed 's/^GPU 1/GPU 0/')
    in1=$(sandbox 1 nvidia-smi -L)
    [ "$in1" = "$host1" ]
    ok=$?
    row "--gpus 1: nvidia-smi sees only GPU 1" "$host1" "$in1" "$(verdict $ok "not exactly host GPU 1")"
elif [ "$NGPUS" -ge 2 ]; then
    row "--gpus 1: nvidia-smi sees only GPU 1" "-" "-" "$NO_GPU"
else
    row "--gpus 1: nvidia-smi sees only GPU 1" "$NGPUS GPU(s)" "-" "SKIPPED: fewer than 2 GPUs"
fi
if [ "$REAL_GPU" = 1 ] && grep -q '^  MIG ' <<<"$HOST_L"; then
    # The first MIG device: inside, nvidia-smi must list it alone (under its GPU).
    mig=$(printf '%s\n' "$HOST_L" | sed -n 's/^  MIG .*(UUID: \(MIG-[^)]*\)).*/\1/p' | head -n1)
    in_mig=$(sandbox "$mig" nvidia-smi -L)
    [ "$(printf '%s\n' "$in_mig" | grep -c '^  MIG ')" = 1 ] && grep -q "(UUID: $mig)" <<<"$in_mig"
    ok=$?
    row "MIG: a job given one instance" "$(printf '%s\n' "$HOST_L" | grep -c '^  MIG ') instance(s); $mig" \
        "$in_mig" "$(verdict $ok "expected exactly $mig")"
else
    row "MIG: a job given one instance" "-" "-" "SKIPPED: no MIG instances here"
fi

# ---- 5. libcuda through the sandbox's linker ---------------------------------------------
if [ "$HAVE_PROBE" = 1 ]; then
    IN_P=$(sandbox all /opt/proof/cuprobe)
    IN_P_RC=$?
    in_lib=$(printf '%s\n' "$IN_P" | kv libcuda)
    in_api=$(printf '%s\n' "$IN_P" | kv driver_api)
    if [ "$REAL_GPU" = 1 ]; then
        HOST_P=$(host_run "$WORK/cuprobe" 2>&1)
        HOST_P_RC=$?
        host_dev=$(printf '%s\n' "$HOST_P" | grep '^dev' | tr '\n' ' ')
        in_dev=$(printf '%s\n' "$IN_P" | grep '^dev' | tr '\n' ' ')
        [ "$IN_P_RC" = 0 ] && [ "$HOST_P_RC" = 0 ] && [ "$in_dev" = "$host_dev" ] &&
            [ "$in_api" = "$(printf '%s\n' "$HOST_P" | kv driver_api)" ]
            ok=$?
        row "libcuda: cuInit, devices (cuprobe)" "api $(printf '%s\n' "$HOST_P" | kv driver_api), $host_dev" \
            "api $in_api, $in_dev" "$(verdict $ok "differs from the host")"
    else
        case "$in_lib" in "$LIB_DIR"/*) in_ok=1 ;; *) in_ok=0 ;; esac
        if [ "$in_ok" = 1 ] && [ "${in_api:-0}" -gt 0 ]; then
            row "libcuda loads via the linker (cuprobe)" "-" "$in_lib, cuDriverGetVersion $in_api" PASS
        else
            row "libcuda loads via the linker (cuprobe)" "-" "$IN_P" "FAIL: libcuda.so.1 not the injected one, or no driver API"
        fi
        row "libcuda: cuInit, devices (cuprobe)" "-" "cuInit $(printf '%s\n' "$IN_P" | kv init)" "$NO_GPU"
    fi
else
    row "libcuda: cuInit, devices (cuprobe)" "-" "-" "SKIPPED: no C compiler (cc) here"
fi

# ---- 6. the CUDA program, same binary inside and out --------------------------------------
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "nan" }'; }
ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a >= b) }'; }
if [ "$REAL_GPU" = 0 ]; then
    for c in "CUDA device query (nvcc)" "device-to-device copy, GB/s" "SGEMM 4096, GFLOP/s"; do row "$c" "-" "-" "$NO_GPU"; done
elif [ "$HAVE_PROOF" = 0 ]; then
    why="SKIPPED: no nvcc here"
    [ -n "$NVCC" ] && why="FAIL: nvcc could not build scripts/gpu-proof/cuda-proof.cu ($(tail -n1 "$WORK/nvcc.log"))"
    for c in "CUDA device query (nvcc)" "device-to-device copy, GB/s" "SGEMM 4096, GFLOP/s"; do row "$c" "-" "-" "$why"; done
else
    hq=$(host_run "$WORK/cuda-proof" --query 2>&1 | grep '^dev' | tr '\n' ' ')
    iq=$(sandbox all /opt/proof/cuda-proof --query | grep '^dev' | tr '\n' ' ')
    [ -n "$hq" ] && [ "$hq" = "$iq" ]
    ok=$?
    row "CUDA device query (nvcc)" "$hq" "$iq" "$(verdict $ok "differs from the host")"
    # Interleaved, 3 runs each; the best of each side (the program takes the best of 5
    # trials itself): clocks and other tenants move numbers, the sandbox should not.
    hb=0 ib=0 hg=0 ig=0 bad=""
    for _ in 1 2 3; do
        h=$(host_run "$WORK/cuda-proof" 2>&1) || bad="host: $(printf '%s' "$h" | kv error)"
        i=$(sandbox all /opt/proof/cuda-proof) || bad="sandbox: $(printf '%s' "$i" | kv error)"
        for pair in "hb:$(printf '%s\n' "$h" | kv d2d_GBps)" "ib:$(printf '%s\n' "$i" | kv d2d_GBps)" \
            "hg:$(printf '%s\n' "$h" | kv sgemm_GFLOPs)" "ig:$(printf '%s\n' "$i" | kv sgemm_GFLOPs)"; do
            var=${pair%%:*} val=${pair#*:}
            [ -n "$val" ] && ge "$val" "${!var}" && printf -v "$var" '%s' "$val"
        done
        grep -q '^sgemm_check=bad' <<<"$h"$'\n'"$i" && bad="SGEMM result wrong"
    done
    for m in "device-to-device copy, GB/s:$hb:$ib" "SGEMM 4096, GFLOP/s:$hg:$ig"; do
        IFS=: read -r name hv iv <<<"$m"
        r=$(ratio "$iv" "$hv")
        if [ -n "$bad" ]; then
            row "$name" "$hv" "$iv" "FAIL: $bad"
        else
            ge "$r" 0.99
            ok=$?
            row "$name" "$hv" "$iv (x$r)" "$(verdict $ok "inside/host x$r < 0.99")"
        fi
    done
fi

# ---- 6b. what the GPUs add to a job's set-up -----------------------------------------------
# /bin/true with --gpus all and with --gpus none, interleaved, 5 each (medians); and, from
# one -v job, what NVML's load and the driver's discovery took of it (the lent H200, no
# nvidia-persistenced: ~25 ms more a job, mostly NVML's init, it seemed).
if [ "$HAVE_TRUE" = 1 ]; then
    ms() { echo $(( ($(date +%s%N) - $1) / 1000 )); }
    with="" without=""
    for _ in 1 2 3 4 5; do
        for g in all none; do
            t=$(date +%s%N)
            sandbox "$g" /bin/true >/dev/null 2>&1
            if [ "$g" = all ]; then with="$with $(ms "$t")"; else without="$without $(ms "$t")"; fi
        done
    done
    median() { printf '%s\n' $1 | sort -n | sed -n 3p; }
    w=$(median "$with") wo=$(median "$without")
    nvml=$("${AZP[@]}" -v exec --rootfs "$ROOTFS" --gpus all ${NET_ARGS[@]+"${NET_ARGS[@]}"} -- /bin/true 2>&1 |
        sed -n 's/.*GPUs: \(NVML loaded in .*\)$/\1/p' | head -n1)
    row "a job's set-up: --gpus all vs none (us)" "-" \
        "$w vs $wo: +$(( (w - wo) / 1000 )) ms; ${nvml:-no NVML timing in -v}" "INFO: median of 5 each, interleaved"
fi

# ---- 7. PyTorch through a read-only volume -----------------------------------------------
if [ -z "$TORCH" ]; then
    row "PyTorch (read-only volume)" "-" "-" "SKIPPED: no PyTorch on the host's python3"
else
    PY_CODE='import torch; print("torch=" + torch.__version__); a = torch.cuda.is_available(); print("cuda=%s" % a)
if a: print("devices=%d" % torch.cuda.device_count()); print("name=" + torch.cuda.get_device_name(0)); x = torch.ones(1024, 1024, device="cuda"); print("sum=%d" % int((x @ x).sum().item()))'
    PY_ENV=(-e "PYTHONHOME=$(printf '%s\n' "$TORCH" | kv home)" -e "PYTHONPATH=$PY_PATH")
    HOST_T=$("$PY" -c "$PY_CODE" 2>&1)
    SANDBOX_ARGS=(${PY_VOLUMES[@]+"${PY_VOLUMES[@]}"} "${PY_ENV[@]}")
    IN_T=$(sandbox all /opt/proof/python3 -c "$PY_CODE")
    IN_T_RC=$?
    SANDBOX_ARGS=()
    summary() { printf '%s\n' "$1" | grep -E '^(torch|cuda|devices|name|sum)=' | tr '\n' ' '; }
    [ "$IN_T_RC" = 0 ] && [ "$(printf '%s\n' "$IN_T" | kv torch)" = "$(printf '%s\n' "$HOST_T" | kv torch)" ]
    ok=$?
    row "PyTorch imports (read-only volume)" "$(printf '%s\n' "$HOST_T" | kv torch)" \
        "$(printf '%s\n' "$IN_T" | kv torch) ${#VOLS[@]} volume(s)${PY_PRIVATE:+, --userns host ($PY_PRIVATE is private)}" \
        "$(verdict $ok "$(printf '%s' "$IN_T" | tail -n1)")"
    if [ "$REAL_GPU" = 1 ]; then
        [ "$(summary "$IN_T")" = "$(summary "$HOST_T")" ] && grep -q '^cuda=True' <<<"$IN_T"
        ok=$?
        row "torch.cuda sees the GPU" "$(summary "$HOST_T")" "$(summary "$IN_T")" "$(verdict $ok "differs from the host")"
    else
        row "torch.cuda sees the GPU" "$(summary "$HOST_T")" "$(summary "$IN_T")" "$NO_GPU"
    fi
fi

# ---- 8. CUDA compatibility check ----------------------------------------------------------
if import_rootfs "$WORK/newcuda" "${ROOTFS}-cuda99"; then
    out=$("${AZP[@]}" exec --rootfs "${ROOTFS}-cuda99" --gpus all ${NET_ARGS[@]+"${NET_ARGS[@]}"} -- /bin/true 2>&1)
    rc=$?
    [ "$rc" = 125 ] && [ "$(printf '%s\n' "$out" | grep -c .)" = 1 ] && grep -q "has CUDA 99.0" <<<"$out"
    ok=$?
    row "rootfs with CUDA 99.0 refused before the job" "driver $DRIVER" "exit $rc: $out" \
        "$(verdict $ok "expected exit 125 and one line naming CUDA 99.0")"
else
    row "rootfs with CUDA 99.0 refused before the job" "-" "$(tail -n1 "$WORK/import-${ROOTFS}-cuda99.log")" "FAIL: import failed"
fi

# ---- 9. graphics: the EGL vendor file and its library --------------------------------------
if grep -q '"container_path": "[^"]*egl_vendor.d/10_nvidia.json"' <<<"$LIST_JSON"; then
    f=$(printf '%s\n' "$LIST_JSON" | sed -n 's/.*"container_path": "\([^"]*egl_vendor.d\/10_nvidia.json\)".*/\1/p' | head -n1)
    SANDBOX_ARGS=(--gpu-capabilities compute,utility,graphics)
    out=$(sandbox all /bin/sh -c "lib=\$(sed -n 's/.*\"library_path\" *: *\"\\([^\"]*\\)\".*/\\1/p' $f); test -r $LIB_DIR/\$lib && echo \"\$lib readable in $LIB_DIR\"")
    rc=$?
    SANDBOX_ARGS=()
    row "graphics: $f and its library" "$f" "$out" "$(verdict $rc "the file or its library is not in the sandbox")"
else
    row "graphics: EGL vendor file and its library" "-" "-" "SKIPPED: no NVIDIA EGL files on this host (compute-only driver install)"
fi

# ---- the table -----------------------------------------------------------------------------
ELAPSED=$(($(date +%s) - START))
if [ "$REAL_GPU" = 1 ]; then
    GPUS=$(printf '%s\n' "$HOST_L" | grep '^GPU ' | sed 's/ (UUID.*//' | tr '\n' ';' | sed 's/;$//; s/;/; /g')
else
    GPUS="none ($([ "$ROOT" = / ] && echo "nvidia-smi -L finds no GPU" || echo "driver tree $ROOT, fake device nodes"))"
fi
{
    echo "### Real GPU (\`scripts/gpu-proof.sh\`): $(hostname), $(date -u +%Y-%m-%d)"
    echo
    echo "- machine: $(hostname), $(uname -sr), $(nproc) CPUs; GPUs: $GPUS"
    echo "- driver: ${DRIVER:-not found}; azp-sandbox: $("$BIN" --version 2>/dev/null) ($BIN$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null | sed 's/^/, commit /'))"
    [ "$REAL_GPU" = 1 ] || echo "- no GPU here: each row that needs one says SKIPPED: no GPU (run this on a GPU machine to fill them)"
    echo "- jobs' network: $NET_NOTE"
    [ ${#SUBID_ADDED[@]} = 0 ] || echo "- jobs' ids: ${SUBID_ADDED[*]} had no azp-sandbox entry; $SUBID_ENTRY was added (as \`service install\` does) and stays"
    echo "- rootfs: $ROOTFS_KIND; cc: ${CC:-none}; nvcc: ${NVCC:-none}; PyTorch: $([ -n "$TORCH" ] && printf '%s\n' "$TORCH" | kv version || echo none)"
    echo
    echo "| check | host | sandbox | result |"
    echo "|---|---|---|---|"
    printf '%s\n' "${ROWS[@]}"
    echo
    echo "$PASSED passed, $SKIPPED skipped, $FAILED failed in ${ELAPSED}s (scripts/gpu-proof.sh)."
} >"$OUT.tmp" && mv "$OUT.tmp" "$OUT" || die "cannot write $OUT"
cat "$OUT"
[ "$FAILED" = 0 ]
