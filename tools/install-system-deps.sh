#!/usr/bin/env bash
# Install the Debian packages the integration tests run for real, when missing (non-interactive):
#   prometheus (server scraped in tests), chromium + chromium-driver (headless browser tests),
#   openssl (handy for inspecting the test PKI). Quick no-op when everything is present.
set -euo pipefail
need=()
command -v prometheus >/dev/null || need+=(prometheus)
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || need+=(chromium-driver)
command -v openssl >/dev/null || need+=(openssl)
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
