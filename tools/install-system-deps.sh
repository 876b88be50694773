#!/usr/bin/env bash
# Install the Debian packages the integration tests run for real, when missing (non-interactive):
#   prometheus (server scraped in tests), chromium + chromium-driver (headless browser tests),
#   openssl (handy for inspecting the test PKI); for the local cluster (tools/cluster.py): containerd,
#   runc, containernetworking-plugins (CNI plugins in /usr/lib/cni), iptables, conntrack, socat, and for
#   its images (tools/build-images.sh) buildah, debootstrap, gcc + libc6-dev (the static pause binary).
#   Quick no-op when everything is present.
set -euo pipefail
need=()
command -v prometheus >/dev/null || need+=(prometheus)
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || need+=(chromium-driver)
command -v openssl >/dev/null || need+=(openssl)
for c in containerd runc buildah debootstrap iptables conntrack socat gcc; do command -v "$c" >/dev/null || need+=("$c"); done
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
[ -f /usr/lib/x86_64-linux-gnu/libc.a ] || [ -f /usr/lib/aarch64-linux-gnu/libc.a ] || need+=(libc6-dev)
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-system-deps: need root (or sudo) to apt-get install ${need[*]}" >&2; exit 1; }
  sudo="sudo -n"
fi
echo "install-system-deps: apt-get install ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q "${need[@]}"
