#!/usr/bin/env bash
# make-driver-tree.sh DEST [CACHE_DIR]
#
# Builds a real NVIDIA driver user-space tree (no GPU, no kernel module) from Debian
# bookworm's non-free driver packages, for tests that use `--driver-root DEST`:
#   - the .debs are fetched with apt-get through a PRIVATE apt configuration (own
#     sources.list, lists and cache under CACHE_DIR): the host's apt setup is untouched;
#   - every package is unpacked with `dpkg -x` (no maintainer scripts run);
#   - the links Debian's alternatives system would create are made by hand
#     (usr/lib/x86_64-linux-gnu/libcuda.so.1 -> /etc/alternatives/... ->
#     usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.1, usr/bin/nvidia-smi -> ...);
#   - the graphics (EGL/GLX/GLES/Vulkan ICD and vendor JSON files, Xorg driver) and video
#     (NVENC/NVDEC/VDPAU/optical flow) packages come too, for the `graphics`, `video` and
#     `display` capabilities; libnvidia-egl-wayland1 has its own version (not the driver's);
#   - etc/ld.so.conf(.d) are written and `ldconfig -r DEST` produces etc/ld.so.cache;
#   - fake device nodes are created with mknod under DEST/dev (never opened by tests):
#     nvidiactl 195:255, nvidia0 195:0, nvidia1 195:1, nvidia-modeset 195:254,
#     nvidia-uvm 511:0, nvidia-uvm-tools 511:1, nvidia-caps/nvidia-cap{1,2} 508:{1,2};
#     plus proc/devices, proc/driver/nvidia/version and the MIG capability files of one
#     instance (gpu0/mig/gi1/ci0 -> nvidia-cap1, nvidia-cap2) as a host would show them.
#
# CACHE_DIR (default: DEST's parent dir/driver-debs) keeps the .debs: a second run with a
# complete cache needs no network. A complete DEST (stamp file) makes the script exit at
# once. Exit status 75 (EX_TEMPFAIL) means the packages could not be downloaded (no
# network / mirror) and no cached copy exists; tests skip on that status only.
# Needs root (mknod, ldconfig -r chroots).
set -euo pipefail

FORMAT=4 # bump when the layout produced below changes (or the package list)
# Pinned to the driver version (libcuda1's candidate).
PACKAGES=(
    libcuda1 libnvidia-ml1 nvidia-smi libnvidia-ptxjitcompiler1
    libnvidia-pkcs11-openssl3 libnvidia-cfg1 libnvidia-allocator1
    libnvcuvid1 libnvidia-encode1 nvidia-cuda-mps firmware-nvidia-gsp
    # video
    libnvidia-opticalflow1 nvidia-vdpau-driver
    # graphics: EGL, GLX, GLES, Vulkan (their JSON files are in the -common packages)
    libegl-nvidia0 libglx-nvidia0 libgles-nvidia1 libgles-nvidia2
    libnvidia-eglcore libnvidia-glcore libnvidia-glvkspirv libnvidia-rtcore
    nvidia-egl-common nvidia-vulkan-common
    # display: the Xorg driver and GLX server module
    xserver-xorg-video-nvidia
)
# Versioned on their own: taken at their candidate version.
UNPINNED=(libnvidia-egl-wayland1)
MULTIARCH=x86_64-linux-gnu
DEB_ARCH=amd64

die() { echo "make-driver-tree: $*" >&2; exit 1; }
log() { echo "make-driver-tree: $*"; }

[ $# -ge 1 ] || die "usage: $0 DEST [CACHE_DIR]"
DEST=$(realpath -m "$1")
CACHE=$(realpath -m "${2:-$(dirname "$DEST")/driver-debs}")
STAMP="$DEST/.azp-driver-tree-complete"

# Serialize concurrent builders (parallel test binaries) on the same DEST.
mkdir -p "$(dirname "$DEST")"
if command -v flock >/dev/null; then
    exec 9>"$DEST.lock"
    flock 9
fi

if [ -f "$STAMP" ] && grep -qx "format=$FORMAT" "$STAMP"; then
    log "$DEST is complete ($(grep '^version=' "$STAMP")); nothing to do"
    exit 0
fi
[ "$(id -u)" = 0 ] || die "must run as root (mknod of fake device nodes, ldconfig -r)"
[ "$(dpkg --print-architecture)" = "$DEB_ARCH" ] || die "only $DEB_ARCH hosts are supported"
for tool in apt-get dpkg-deb ldconfig mknod; do
    command -v "$tool" >/dev/null || die "$tool not found (Debian/Ubuntu host expected)"
done

# ---- 1. the .debs, through a private apt configuration --------------------------------
APTDIR="$CACHE/apt"
mkdir -p "$APTDIR/lists/partial" "$APTDIR/cache/archives/partial" "$CACHE/debs"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
[ -f "$KEYRING" ] || die "$KEYRING missing: apt-get install debian-archive-keyring"
cat >"$APTDIR/sources.list" <<EOF
deb [signed-by=$KEYRING] http://deb.debian.org/debian bookworm main non-free non-free-firmware
deb [signed-by=$KEYRING] http://deb.debian.org/debian bookworm-updates main non-free non-free-firmware
deb [signed-by=$KEYRING] http://deb.debian.org/debian-security bookworm-security main non-free non-free-firmware
EOF
APT_OPTS=(
    -o "Dir::Etc::SourceList=$APTDIR/sources.list"
    -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State::Lists=$APTDIR/lists"
    -o "Dir::Cache=$APTDIR/cache"
    -o "APT::Architectures::=$DEB_ARCH"
    -o "APT::Sandbox::User=root"
    -o "Acquire::Retries=3"
    -q
)

# A previous complete download is reused as is (offline reruns, identical trees).
cached_complete() {
    [ -f "$CACHE/debs/complete" ] || return 1
    local p
    for p in "${PACKAGES[@]}" "${UNPINNED[@]}"; do
        compgen -G "$CACHE/debs/${p}_*_*.deb" >/dev/null || return 1
    done
}

if cached_complete; then
    log "using cached packages in $CACHE/debs ($(cat "$CACHE/debs/complete"))"
else
    log "fetching package lists (private apt config in $APTDIR)"
    # A mirror mid-sync can fail one index; what matters is whether the downloads work.
    apt-get "${APT_OPTS[@]}" update >"$APTDIR/update.log" 2>&1 ||
        log "warning: apt-get update reported errors (see $APTDIR/update.log); trying the downloads anyway"
    VERSION_FULL=$(apt-cache "${APT_OPTS[@]}" policy libcuda1 2>/dev/null | awk '/Candidate:/ {print $2}')
    if [ -z "$VERSION_FULL" ] || [ "$VERSION_FULL" = "(none)" ]; then
        echo "make-driver-tree: cannot find libcuda1 in Debian bookworm non-free (no network or mirror?); see $APTDIR/update.log" >&2
        exit 75
    fi
    log "driver packages version $VERSION_FULL"
    rm -f "$CACHE/debs/"*.deb "$CACHE/debs/complete"
    pins=()
    for p in "${PACKAGES[@]}"; do pins+=("$p=$VERSION_FULL"); done
    pins+=("${UNPINNED[@]}")
    if ! (cd "$CACHE/debs" && apt-get "${APT_OPTS[@]}" download "${pins[@]}" >"$APTDIR/download.log" 2>&1); then
        cat "$APTDIR/download.log" >&2
        echo "make-driver-tree: apt-get download failed (network or mirror)" >&2
        exit 75
    fi
    echo "$VERSION_FULL" >"$CACHE/debs/complete"
fi

# ---- 2. unpack --------------------------------------------------------------------------
TMP="$DEST.tmp.$$"
rm -rf "$TMP"
mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
: >"$TMP/.azp-driver-tree.manifest"
for p in "${PACKAGES[@]}" "${UNPINNED[@]}"; do
    deb=$(compgen -G "$CACHE/debs/${p}_*_*.deb" | head -n1)
    dpkg-deb -x "$deb" "$TMP"
    echo "$p $(dpkg-deb -f "$deb" Version)" >>"$TMP/.azp-driver-tree.manifest"
done
VERSION_FULL=$(awk '$1 == "libcuda1" {print $2}' "$TMP/.azp-driver-tree.manifest")
VERSION=${VERSION_FULL%%-*} # upstream version: 535.309.01
log "unpacked $((${#PACKAGES[@]} + ${#UNPINNED[@]})) packages (driver $VERSION) into $DEST"

# ---- 3. what update-alternatives (nvidia-alternative) would create -----------------------
NVDIR="usr/lib/$MULTIARCH/nvidia/current"
[ -f "$TMP/$NVDIR/libcuda.so.$VERSION" ] || die "unexpected package layout: $NVDIR/libcuda.so.$VERSION missing"
mkdir -p "$TMP/etc/alternatives"
for link in "$TMP/$NVDIR"/*.so.[0-9]; do
    name=$(basename "$link")
    alt="nvidia--$name-$MULTIARCH"
    ln -sfn "/$NVDIR/$name" "$TMP/etc/alternatives/$alt"
    ln -sfn "/etc/alternatives/$alt" "$TMP/usr/lib/$MULTIARCH/$name"
done
mkdir -p "$TMP/usr/bin"
ln -sfn /usr/lib/nvidia/current/nvidia-smi "$TMP/etc/alternatives/nvidia--nvidia-smi"
ln -sfn /etc/alternatives/nvidia--nvidia-smi "$TMP/usr/bin/nvidia-smi"
# The Xorg modules, where the X server looks for them.
XMOD=usr/lib/xorg/modules
mkdir -p "$TMP/$XMOD/drivers" "$TMP/$XMOD/extensions"
ln -sfn /usr/lib/nvidia/current/nvidia_drv.so "$TMP/etc/alternatives/nvidia--nvidia_drv.so"
ln -sfn /etc/alternatives/nvidia--nvidia_drv.so "$TMP/$XMOD/drivers/nvidia_drv.so"
ln -sfn /usr/lib/nvidia/current/libglxserver_nvidia.so "$TMP/etc/alternatives/nvidia--libglxserver_nvidia.so"
ln -sfn /etc/alternatives/nvidia--libglxserver_nvidia.so "$TMP/$XMOD/extensions/libglxserver_nvidia.so"

# ---- 4. linker configuration and cache ---------------------------------------------------
mkdir -p "$TMP/etc/ld.so.conf.d"
echo 'include /etc/ld.so.conf.d/*.conf' >"$TMP/etc/ld.so.conf"
printf '# Multiarch support\n/usr/local/lib/%s\n/lib/%s\n/usr/lib/%s\n' \
    "$MULTIARCH" "$MULTIARCH" "$MULTIARCH" >"$TMP/etc/ld.so.conf.d/$MULTIARCH.conf"
ldconfig -r "$TMP"
[ -s "$TMP/etc/ld.so.cache" ] || die "ldconfig -r did not write etc/ld.so.cache"

# ---- 5. fake device nodes and /proc files -------------------------------------------------
mkdir -p "$TMP/dev/nvidia-caps"
node() { mknod -m "$1" "$TMP/dev/$2" c "$3" "$4"; }
node 666 nvidiactl 195 255
node 666 nvidia0 195 0
node 666 nvidia1 195 1
node 666 nvidia-modeset 195 254
node 666 nvidia-uvm 511 0
node 666 nvidia-uvm-tools 511 1
node 400 nvidia-caps/nvidia-cap1 508 1
node 444 nvidia-caps/nvidia-cap2 508 2
mkdir -p "$TMP/proc/driver/nvidia"
printf 'Character devices:\n  1 mem\n195 nvidia-frontend\n508 nvidia-caps\n511 nvidia-uvm\n\nBlock devices:\n  8 sd\n' \
    >"$TMP/proc/devices"
printf 'NVRM version: NVIDIA UNIX x86_64 Kernel Module  %s  (fake, for tests)\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n' \
    "$VERSION" >"$TMP/proc/driver/nvidia/version"
# MIG capabilities as the driver publishes them for a GPU instance 1 / compute instance 0
# on GPU 0: the minors of the nvidia-caps nodes above.
MIGCAPS="$TMP/proc/driver/nvidia/capabilities/gpu0/mig/gi1"
mkdir -p "$MIGCAPS/ci0"
printf 'DeviceFileMinor: 1\nDeviceFileMode: 292\nDeviceFileModify: 1\n' >"$MIGCAPS/access"
printf 'DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n' >"$MIGCAPS/ci0/access"

printf 'format=%s\nversion=%s\n' "$FORMAT" "$VERSION" >"$TMP/.azp-driver-tree-complete"
rm -rf "$DEST"
mv "$TMP" "$DEST"
trap - EXIT

log "done: $DEST"
log "  driver version $VERSION; nvidia-smi: $DEST/usr/bin/nvidia-smi -> /usr/lib/nvidia/current/nvidia-smi"
log "  libraries:"
find "$DEST/$NVDIR" "$DEST/usr/lib/$MULTIARCH" -maxdepth 1 -type f -name "lib*.so.$VERSION" -printf '    %P\n' | sort
log "  device nodes:"
find "$DEST/dev" -type c -printf '    /dev/%P\n' | sort
