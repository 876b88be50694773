#!/usr/bin/env bash
# Build the container images of the local cluster (tools/cluster.py) without any registry or container
# engine, and write them as OCI archives that `ctr -n k8s.io images import` loads:
#   base       Debian bookworm minbase + python3, python3-venv, from debootstrap (the mirror apt uses),
#              committed with buildah from scratch                      -> localhost/dynoplan/base:bookworm
#   pause      tools/images/pause.c, static, in an empty image          -> localhost/dynoplan/pause:1
#   prometheus Prometheus from its Go module (tools/build-k8s-bins.sh prometheus) on the base
#                                                                       -> localhost/dynoplan/prometheus:local
#   dynoplan   the project's Dockerfile, `buildah bud --build-arg BASE=<base>` -> docker.io/library/dynoplan:latest
# Output: ${DYNOPLAN_CACHE:-~/.cache/dynoplan}/images/<name>.tar and <name>.ref (the image reference);
# the dynoplan archive's layers are uncompressed (written and imported faster; it stays on this machine).
# The dynoplan archive is rebuilt when the files the Dockerfile copies change (content hash in
# images/dynoplan.key); the others are built once. buildah keeps its own storage (vfs) under the cache.
# Usage: tools/build-images.sh [base|pause|prometheus|dynoplan ...]   (default: all four)
set -euo pipefail
if [ -z "${_DYNOPLAN_NICED:-}" ]; then export _DYNOPLAN_NICED=1; exec nice -n 10 "$0" "$@"; fi
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
cache="${DYNOPLAN_CACHE:-${HOME:-/root}/.cache/dynoplan}"
out="$cache/images"
mkdir -p "$out"
BASE_REF=localhost/dynoplan/base:bookworm
PAUSE_REF=localhost/dynoplan/pause:1
DYNOPLAN_REF=docker.io/library/dynoplan:latest
SUITE=bookworm

[ "$(id -u)" -eq 0 ] || { echo "build-images: needs root (debootstrap, buildah with its own storage)" >&2; exit 1; }
for c in buildah debootstrap gcc; do
  command -v "$c" >/dev/null || { echo "build-images: '$c' not found; run tools/install-system-deps.sh" >&2; exit 1; }
done
# buildah's own storage: overlay when the kernel lets us mount it (layers are cheap), else vfs (every
# layer a full copy of the root filesystem: a build writes tens of GB).
driver="${DYNOPLAN_BUILDAH_DRIVER:-}"
if [ -z "$driver" ]; then
  driver=vfs
  probe="$(buildah --storage-driver overlay --root "$cache/buildah/overlay" --runroot /run/dynoplan-buildah-overlay from scratch 2>/dev/null)" \
    && buildah --storage-driver overlay --root "$cache/buildah/overlay" --runroot /run/dynoplan-buildah-overlay mount "$probe" >/dev/null 2>&1 \
    && driver=overlay
  [ -z "${probe:-}" ] || buildah --storage-driver overlay --root "$cache/buildah/overlay" --runroot /run/dynoplan-buildah-overlay rm "$probe" >/dev/null 2>&1 || true
fi
bh() { buildah --storage-driver "$driver" --root "$cache/buildah/$driver" --runroot "/run/dynoplan-buildah-$driver" "$@"; }

# The Debian mirror apt uses (first deb.debian.org-style URI of the main archive).
mirror() {
  local m
  m="$(sed -n 's/^URIs:[[:space:]]*\(http[^[:space:]]*\/debian\)\/*$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)"
  [ -n "$m" ] || m="$(sed -n 's/^deb[[:space:]]\+\(http[^[:space:]]*\/debian\)\/*[[:space:]].*/\1/p' /etc/apt/sources.list 2>/dev/null | head -n1)"
  echo "${m:-http://deb.debian.org/debian}"
}

have_image() { bh images --quiet "$1" >/dev/null 2>&1; }

build_base() {
  if have_image "$BASE_REF"; then echo "base $BASE_REF cached"; return; fi
  # An archive of an earlier build (e.g. into the other storage driver) is as good as a new debootstrap.
  local id
  if [ -s "$out/base.tar" ] && id="$(bh pull --quiet "oci-archive:$out/base.tar" 2>/dev/null)"; then
    bh tag "$id" "$BASE_REF" >/dev/null 2>&1 || true
  fi
  if have_image "$BASE_REF"; then echo "base $BASE_REF cached ($out/base.tar)"; return; fi
  local root="$cache/build/rootfs-$SUITE" start; start=$(date +%s)
  rm -rf "$root"
  debootstrap --variant=minbase --include=python3,python3-venv "$SUITE" "$root" "$(mirror)" >"$cache/build/debootstrap.log" 2>&1 \
    || { tail -n 20 "$cache/build/debootstrap.log" >&2; exit 1; }
  # No package caches or apt lists in the image.
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*.log
  local ctr; ctr="$(bh from scratch)"
  bh copy "$ctr" "$root/" / >/dev/null
  bh config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
    --cmd /bin/bash "$ctr"
  bh commit --quiet --format oci "$ctr" "$BASE_REF" >/dev/null
  bh rm "$ctr" >/dev/null
  rm -rf "$root"
  bh push --quiet "$BASE_REF" "oci-archive:$out/base.tar.tmp:$BASE_REF" && mv "$out/base.tar.tmp" "$out/base.tar"
  echo "base $BASE_REF $(( $(date +%s) - start ))s"
}

build_pause() {
  local tar="$out/pause.tar"
  if [ -s "$tar" ]; then echo "pause $tar cached"; return; fi
  local dir="$cache/build/pause" start; start=$(date +%s)
  rm -rf "$dir"; mkdir -p "$dir"
  gcc -static -O2 -s -o "$dir/pause" "$here/images/pause.c"
  local ctr; ctr="$(bh from scratch)"
  bh copy "$ctr" "$dir/pause" /pause >/dev/null
  bh config --entrypoint '["/pause"]' --user 65535:65535 "$ctr"
  bh commit --quiet --format oci "$ctr" "$PAUSE_REF" >/dev/null
  bh rm "$ctr" >/dev/null
  bh push --quiet "$PAUSE_REF" "oci-archive:$tar.tmp:$PAUSE_REF"
  mv "$tar.tmp" "$tar"; echo "$PAUSE_REF" >"$out/pause.ref"
  echo "pause $tar $(( $(date +%s) - start ))s"
}

build_prometheus() {
  # Prometheus built from its Go module by tools/build-k8s-bins.sh (Debian's has no Kubernetes service
  # discovery, which the chart's scrape config needs).
  source "$here/k8s-versions.env"
  local bin="$cache/bin/prometheus-$PROMETHEUS_VERSION" ver="$PROMETHEUS_VERSION"
  [ -x "$bin" ] || { echo "build-images: $bin missing: run tools/build-k8s-bins.sh prometheus" >&2; exit 1; }
  # A fixed reference (tools/cluster-values.yaml names it); the cache is keyed by the binary's version.
  local ref="localhost/dynoplan/prometheus:local" tar="$out/prometheus.tar"
  if [ -s "$tar" ] && [ "$(cat "$out/prometheus.key" 2>/dev/null)" = "$ver" ]; then echo "prometheus $tar cached ($ver)"; return; fi
  build_base >/dev/null
  local start; start=$(date +%s)
  local ctr; ctr="$(bh from "$BASE_REF")"
  bh copy "$ctr" "$bin" /usr/bin/prometheus >/dev/null
  bh config --entrypoint '["/usr/bin/prometheus"]' --cmd '[]' --user 65534:65534 --workingdir /prometheus "$ctr"
  bh commit --quiet --format oci "$ctr" "$ref" >/dev/null
  bh rm "$ctr" >/dev/null
  bh push --quiet "$ref" "oci-archive:$tar.tmp:$ref"
  mv "$tar.tmp" "$tar"; echo "$ref" >"$out/prometheus.ref"; echo "$ver" >"$out/prometheus.key"
  echo "prometheus $tar $(( $(date +%s) - start ))s ($ver)"
}

# Content key of what the Dockerfile copies (the files as they are in the working tree).
dynoplan_key() {
  (cd "$repo" && { sha256sum Dockerfile pyproject.toml README.md setup.py; \
    git ls-files -co --exclude-standard -- dynoplan mocker planner examples/traces examples/profiles | grep -v '__pycache__' \
      | LC_ALL=C sort | xargs -r sha256sum; } | sha256sum | cut -c1-16)
}

build_dynoplan() {
  local tar="$out/dynoplan.tar" key; key="$(dynoplan_key)"
  if [ -s "$tar" ] && [ "$(cat "$out/dynoplan.key" 2>/dev/null)" = "$key" ]; then echo "dynoplan $tar cached ($key)"; return; fi
  build_base >/dev/null
  local start; start=$(date +%s)
  # --layers: the dependency layer (pyproject.toml only) is reused when only sources change.
  # pip inside the build uses this machine's pip settings and CA bundle (a TLS-inspecting proxy needs its
  # CA), mounted for the build only: nothing of it ends up in a layer.
  local pipconf="$cache/build/pip.conf"
  if [ -f /etc/pip.conf ]; then cp /etc/pip.conf "$pipconf"; else
    printf '[global]\n' >"$pipconf"
    [ -z "${PIP_INDEX_URL:-}" ] || printf 'index-url = %s\n' "$PIP_INDEX_URL" >>"$pipconf"
    [ -z "${PIP_CERT:-}" ] || printf 'cert = %s\n' "$PIP_CERT" >>"$pipconf"
  fi
  local vols=(--volume "$pipconf:/etc/pip.conf:ro")
  [ -d /etc/ssl/certs ] && vols+=(--volume /etc/ssl/certs:/etc/ssl/certs:ro)
  bh bud --quiet --layers --isolation chroot --network host "${vols[@]}" \
    --build-arg "BASE=$BASE_REF" -t "$DYNOPLAN_REF" \
    -f "$repo/Dockerfile" "$repo" >"$cache/build/dynoplan-bud.log" 2>&1 \
    || { tail -n 30 "$cache/build/dynoplan-bud.log" >&2; exit 1; }
  bh push --quiet --disable-compression "$DYNOPLAN_REF" "oci-archive:$tar.tmp:$DYNOPLAN_REF"
  mv "$tar.tmp" "$tar"; echo "$DYNOPLAN_REF" >"$out/dynoplan.ref"; echo "$key" >"$out/dynoplan.key"
  # No `rmi --prune`: the untagged build-stage layers are the cache of the next build.
  echo "dynoplan $tar $(( $(date +%s) - start ))s ($key)"
}

mkdir -p "$cache/build"
want=("$@"); [ ${#want[@]} -gt 0 ] || want=(base pause prometheus dynoplan)
for name in "${want[@]}"; do
  case "$name" in
    base) build_base ;;
    pause) build_pause ;;
    prometheus) build_prometheus ;;
    dynoplan) build_dynoplan ;;
    *) echo "build-images: unknown image '$name' (expected base, pause, prometheus or dynoplan)" >&2; exit 2 ;;
  esac
done
