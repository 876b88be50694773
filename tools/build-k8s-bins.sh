#!/usr/bin/env bash
# Build the Kubernetes binaries, etcd, CoreDNS and helm from their published Go modules with this
# machine's Go, and cache them outside the repository, keyed by version:
#   ${DYNOPLAN_CACHE:-$HOME/.cache/dynoplan}/bin/<name>-<version>
# A binary already present is not rebuilt. Versions: tools/k8s-versions.env.
# Usage: tools/build-k8s-bins.sh [NAME ...]   NAME: etcd kube-apiserver kube-controller-manager helm
#        kube-scheduler kubelet kube-proxy kubectl coredns prometheus (default: all of them, in that order)
# Environment: DYNOPLAN_CACHE (cache root), BUILD_P (go build -p, default 2), and the usual
# GOCACHE/GOMODCACHE/GOPROXY. Prints one line per binary: "<name> <path> <seconds-or-cached>".
set -euo pipefail
# Builds run at lower priority: the machine is shared (2 cores).
if [ -z "${_DYNOPLAN_NICED:-}" ]; then export _DYNOPLAN_NICED=1; exec nice -n 10 "$0" "$@"; fi
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=k8s-versions.env
source "$here/k8s-versions.env"

cache="${DYNOPLAN_CACHE:-${HOME:-/root}/.cache/dynoplan}"
bindir="$cache/bin"
workroot="$cache/build"
mkdir -p "$bindir" "$workroot"
export GOFLAGS="-trimpath -buildvcs=false"
export CGO_ENABLED=0
export GOTOOLCHAIN=local
p="${BUILD_P:-2}"

command -v go >/dev/null || [ ! -x /usr/local/go/bin/go ] || export PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { echo "build-k8s-bins: 'go' not found on PATH or in /usr/local/go/bin (need Go >= 1.26)" >&2; exit 1; }

# write_module DIR MODULE_PATH MAIN_GO_TEXT: a throw-away wrapper module whose main calls the command.
write_module() {
  local dir="$1" mod="$2" main="$3"
  rm -rf "$dir"; mkdir -p "$dir"
  printf 'module %s\n\ngo 1.26\n' "$mod" >"$dir/go.mod"
  printf '%s\n' "$main" >"$dir/main.go"
}

# pin_staging: in the current wrapper module, require k8s.io/kubernetes and pin every staging module
# it replaces with ./staging/src/k8s.io/X to the matching published v0.x release.
pin_staging() {
  go mod download "k8s.io/kubernetes@$KUBERNETES_VERSION"
  local kmod; kmod="$(go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')"
  local staging; staging="$(sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9.-]*\) => \./staging/.*#\1#p' "$kmod")"
  [ -n "$staging" ] || { echo "build-k8s-bins: no staging replace lines found in $kmod" >&2; exit 1; }
  local args=() m
  for m in $staging; do args+=("-replace=$m=$m@$K8S_STAGING_VERSION"); done
  go mod edit "${args[@]}" "-require=k8s.io/kubernetes@$KUBERNETES_VERSION"
}

# k8s_ldflags: version stamps so `--version` prints the pinned Kubernetes version.
k8s_ldflags() {
  local minor="${KUBERNETES_VERSION#v1.}" f="-s -w" v
  minor="${minor%%.*}"
  for v in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    f="$f -X $v.gitVersion=$KUBERNETES_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$f"
}

# build_k8s_cmd NAME APP_CONSTRUCTOR_CALL: a wrapper module whose main is k8s.io/kubernetes/cmd/NAME's main.
build_k8s_cmd() {
  local name="$1" ctor="$2"
  local out="$bindir/$name-$KUBERNETES_VERSION" dir="$workroot/$name-$KUBERNETES_VERSION"
  write_module "$dir" "dynoplan.local/$name" "package main

import (
	\"context\"
	\"os\"
	_ \"time/tzdata\"

	\"k8s.io/component-base/cli\"
	_ \"k8s.io/component-base/logs/json/register\"
	_ \"k8s.io/component-base/metrics/prometheus/clientgo\"
	_ \"k8s.io/component-base/metrics/prometheus/version\"
	\"k8s.io/kubernetes/cmd/$name/app\"
)

var _ = context.Background

func main() { os.Exit(cli.Run(app.$ctor)) }"
  (
    cd "$dir"
    pin_staging
    go mod tidy
    go build -p "$p" -o "$out.tmp" -ldflags "$(k8s_ldflags)" .
  )
  mv "$out.tmp" "$out"
}
build_kube_apiserver() { build_k8s_cmd kube-apiserver "NewAPIServerCommand()"; }
build_kube_controller_manager() { build_k8s_cmd kube-controller-manager "NewControllerManagerCommand()"; }
build_kube_scheduler() { build_k8s_cmd kube-scheduler "NewSchedulerCommand()"; }
build_kube_proxy() { build_k8s_cmd kube-proxy "NewProxyCommand()"; }
# The kubelet's constructor takes the context its command runs under.
build_kubelet() { build_k8s_cmd kubelet "NewKubeletCommand(context.Background())"; }

build_kubectl() {
  # kubectl's code is the published staging module k8s.io/kubectl; main as in k8s.io/kubernetes/cmd/kubectl.
  local out="$bindir/kubectl-$KUBERNETES_VERSION" dir="$workroot/kubectl-$KUBERNETES_VERSION"
  write_module "$dir" dynoplan.local/kubectl 'package main

import (
	"os"

	_ "k8s.io/client-go/plugin/pkg/client/auth"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	logs.GlogSetter(cmd.GetLogVerbosity(os.Args)) // nolint:errcheck
	if err := cli.RunNoErrOutput(cmd.NewDefaultKubectlCommand()); err != nil {
		util.CheckErr(err)
	}
}'
  (
    cd "$dir"
    go mod edit "-require=k8s.io/kubectl@$K8S_STAGING_VERSION" "-require=k8s.io/client-go@$K8S_STAGING_VERSION" \
      "-require=k8s.io/component-base@$K8S_STAGING_VERSION"
    go mod tidy
    go build -p "$p" -o "$out.tmp" -ldflags "$(k8s_ldflags)" .
  )
  mv "$out.tmp" "$out"
}

build_coredns() {
  # Only the plugins the local cluster's Corefile uses (tools/cluster.py), in CoreDNS's own plugin order;
  # the Kubernetes client libraries pinned to the same staging version as the cluster.
  local out="$bindir/coredns-$COREDNS_VERSION" dir="$workroot/coredns-$COREDNS_VERSION"
  write_module "$dir" dynoplan.local/coredns 'package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	dnsserver.Directives = []string{"bind", "ready", "health", "errors", "log", "loadbalance", "cache", "kubernetes"}
}

func main() { coremain.Run() }'
  (
    cd "$dir"
    go mod edit "-require=github.com/coredns/coredns@$COREDNS_VERSION"
    local m args=()
    for m in api apimachinery client-go; do args+=("-require=k8s.io/$m@$K8S_STAGING_VERSION"); done
    go mod edit "${args[@]}"
    go mod tidy
    go build -p "$p" -o "$out.tmp" -ldflags "-s -w" .
  )
  mv "$out.tmp" "$out"
}

build_etcd() {
  local out="$bindir/etcd-$ETCD_VERSION" dir="$workroot/etcd-$ETCD_VERSION"
  write_module "$dir" dynoplan.local/etcd 'package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }'
  (
    cd "$dir"
    go mod edit "-require=go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    go mod tidy
    go build -p "$p" -o "$out.tmp" -ldflags "-s -w" .
  )
  mv "$out.tmp" "$out"
}

build_helm() {
  # helm's go.mod has no replace directives, so `go install module/cmd@version` builds it with
  # exactly the dependency set helm released (its own go.sum).
  local out="$bindir/helm-$HELM_VERSION" dir="$workroot/helm-$HELM_VERSION"
  rm -rf "$dir"; mkdir -p "$dir"
  GOBIN="$dir" go install -p "$p" -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  mv "$dir/helm" "$out"
}

build_prometheus() {
  # The local cluster's Prometheus (tools/build-images.sh puts it in an image): Debian's prometheus is
  # built without Kubernetes service discovery, which the chart's scrape config uses. Prometheus' go.mod
  # has no replace lines, so `go install` builds exactly its released dependency set (web UI not embedded:
  # the HTTP API is what the dashboards use).
  local out="$bindir/prometheus-$PROMETHEUS_VERSION" dir="$workroot/prometheus-$PROMETHEUS_VERSION"
  rm -rf "$dir"; mkdir -p "$dir"
  local v=github.com/prometheus/common/version
  GOBIN="$dir" go install -p "$p" -ldflags "-s -w -X $v.Version=$PROMETHEUS_RELEASE -X $v.Revision=go-module -X $v.Branch=$PROMETHEUS_VERSION" \
    "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION"
  mv "$dir/prometheus" "$out"
}

want=("$@"); [ ${#want[@]} -gt 0 ] || want=(etcd kube-apiserver kube-controller-manager helm kube-scheduler kubelet kube-proxy kubectl coredns prometheus)
for name in "${want[@]}"; do
  case "$name" in
    kube-apiserver) out="$bindir/kube-apiserver-$KUBERNETES_VERSION"; fn=build_kube_apiserver ;;
    kube-controller-manager) out="$bindir/kube-controller-manager-$KUBERNETES_VERSION"; fn=build_kube_controller_manager ;;
    etcd) out="$bindir/etcd-$ETCD_VERSION"; fn=build_etcd ;;
    helm) out="$bindir/helm-$HELM_VERSION"; fn=build_helm ;;
    kube-scheduler) out="$bindir/kube-scheduler-$KUBERNETES_VERSION"; fn=build_kube_scheduler ;;
    kubelet) out="$bindir/kubelet-$KUBERNETES_VERSION"; fn=build_kubelet ;;
    kube-proxy) out="$bindir/kube-proxy-$KUBERNETES_VERSION"; fn=build_kube_proxy ;;
    kubectl) out="$bindir/kubectl-$KUBERNETES_VERSION"; fn=build_kubectl ;;
    coredns) out="$bindir/coredns-$COREDNS_VERSION"; fn=build_coredns ;;
    prometheus) out="$bindir/prometheus-$PROMETHEUS_VERSION"; fn=build_prometheus ;;
    *) echo "build-k8s-bins: unknown binary '$name' (expected etcd, kube-apiserver, kube-controller-manager, helm, kube-scheduler, kubelet, kube-proxy, kubectl, coredns or prometheus)" >&2; exit 2 ;;
  esac
  if [ -x "$out" ]; then echo "$name $out cached"; continue; fi
  start=$(date +%s)
  echo "build-k8s-bins: building $name (cold builds take minutes; see tools/README.md)" >&2
  "$fn"
  echo "$name $out $(( $(date +%s) - start ))s"
done
