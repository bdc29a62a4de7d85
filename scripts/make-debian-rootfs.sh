#!/usr/bin/env bash
# Builds a Debian minbase rootfs tarball (zstd) with debootstrap, cached: does nothing
# when OUT exists. Usage: make-debian-rootfs.sh OUT.tar.zst [SUITE]
set -euo pipefail
out=${1:?usage: $0 OUT.tar.zst [SUITE]}
suite=${2:-bookworm}
[ -s "$out" ] && exit 0
command -v debootstrap >/dev/null || { echo "debootstrap is not installed: run scripts/setup.sh" >&2; exit 1; }
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
tmp=$(mktemp -d "${TMPDIR:-/var/tmp}/azp-debootstrap.XXXXXX"); trap 'rm -rf "$tmp"' EXIT
echo "debootstrap --variant=minbase $suite from $mirror (about a minute)" >&2
debootstrap --variant=minbase "$suite" "$tmp/root" "$mirror" >"$tmp/log" 2>&1 \
  || { tail -20 "$tmp/log" >&2; echo "debootstrap failed (log above)" >&2; exit 1; }
rm -rf "$tmp/root/var/cache/apt/archives/"*.deb "$tmp/root/var/lib/apt/lists/"*
mkdir -p "$(dirname "$out")"
tar --numeric-owner --xattrs -C "$tmp/root" -cf - . | zstd -q -T0 -3 -o "$out.partial"
mv "$out.partial" "$out"
