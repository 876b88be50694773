#!/usr/bin/env python3
"""A real one-node Kubernetes cluster on this machine, for the walkthrough of docs/kubernetes.md where there is no
Docker Hub and no container engine (kind needs both). Run it as root::

    .venv/bin/python tools/cluster.py up            # start, wait until usable (a healthy running cluster is kept)
    .venv/bin/python tools/cluster.py status        # which components run; exit 1 when not all
    .venv/bin/python tools/cluster.py down          # stop everything, undo every host change
    .venv/bin/python tools/cluster.py down --purge  # ... and delete the state directory (image cache, logs)

``up`` prints the ``export KUBECONFIG=... PATH=...`` that makes ``kubectl`` and ``helm`` (the pinned
builds) talk to the cluster. When every component already runs and the apiserver and the node are
healthy, ``up`` changes nothing and prints that line again; state of an earlier run that is not a
healthy cluster (some components stopped, or leftovers of a crash) is brought down first. A failed
``up`` brings down what it started before it exits (exit 1).

What runs, each as a plain process (no systemd), logs in ``<state>/logs``:
etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy (iptables mode),
CoreDNS (Service ``kube-system/kube-dns``), containerd + runc with the CNI bridge plugin. Binaries come
from ``tools/build-k8s-bins.sh`` (Go modules, cached by version), images from ``tools/build-images.sh``
(debootstrap + buildah; imported with ``ctr -n k8s.io images import``).

Networking stays inside the machine: the node address ``10.213.0.1`` lives on a dummy interface ``dynoplan0``
that this tool creates (a bridge without ports where the kernel lacks the dummy module); Pods get
``10.214.0.0/24`` on the bridge ``cni0``; Services use ``10.215.0.0/24`` (``kubernetes`` = .1, DNS = .10).
Nothing binds to the machine's own interfaces.

``down`` (also run by ``up`` first when a previous run left anything behind) stops the processes, kills
the containers, unmounts what the kubelet and containerd mounted (``/var/lib/kubelet``, ``/run/netns``,
containerd's snapshots), deletes ``cni0`` and ``dynoplan0``, removes the iptables chains the kubelet,
kube-proxy and the CNI plugins made (``KUBE-*``, ``CNI-*``) and the kubepods cgroups, and restores the
kernel settings they change (``kernel.panic``, ``kernel.panic_on_oops``, ``vm.overcommit_memory``,
``net.ipv4.ip_forward``, ``route_localnet``) to the values saved by ``up``. It keeps the state directory
(containerd's image store, about 3 GB, and the logs) as a cache for the next ``up``; ``down --purge``
deletes it too.

Settings from the environment: ``DYNOPLAN_CACHE`` (binaries and images, default ``~/.cache/dynoplan``),
``DYNOPLAN_CLUSTER_DIR`` (state, default ``/var/lib/dynoplan-cluster``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import json
import os
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("DYNOPLAN_CACHE", Path.home() / ".cache" / "dynoplan"))
STATE = Path(os.environ.get("DYNOPLAN_CLUSTER_DIR", "/var/lib/dynoplan-cluster"))
RUN = Path("/run/dynoplan-cluster")
LOGS = STATE / "logs"
PKI = STATE / "pki"
KUBECONFIG = STATE / "kubeconfig"
BIN_LINKS = STATE / "bin"

NODE_NAME = "dynoplan-node"
NODE_IP = "10.213.0.1"
DUMMY_IF = "dynoplan0"
BRIDGE = "cni0"
POD_CIDR = "10.214.0.0/24"
SERVICE_CIDR = "10.215.0.0/24"
KUBERNETES_SVC_IP = "10.215.0.1"
DNS_IP = "10.215.0.10"
APISERVER = f"https://{NODE_IP}:6443"
CONTAINERD_SOCK = RUN / "containerd" / "containerd.sock"
KUBELET_DIR = Path("/var/lib/kubelet")
CGROUP_ROOT = Path("/sys/fs/cgroup")

# Kernel settings the kubelet (protectKernelDefaults=false), kube-proxy and the bridge plugin change.
SYSCTLS = (
    "kernel.panic",
    "kernel.panic_on_oops",
    "vm.overcommit_memory",
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.route_localnet",
    "net.bridge.bridge-nf-call-iptables",
)
SYSCTL_SAVE = STATE / "sysctl-saved.json"

# Start order; down stops them in reverse.
COMPONENTS = (
    "containerd",
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kube-proxy",
    "coredns",
)
IMAGES = ("pause", "prometheus", "dynoplan")


class ClusterError(Exception):
    """A step of up/down failed; the message names the step and quotes the component's log."""


# ------------------------------------------------------------------------------------------ helpers
def versions() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (REPO / "tools" / "k8s-versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def binary(name: str) -> Path:
    v = versions()
    ver = {"etcd": v["ETCD_VERSION"], "helm": v["HELM_VERSION"], "coredns": v["COREDNS_VERSION"]}.get(
        name, v["KUBERNETES_VERSION"]
    )
    return CACHE / "bin" / f"{name}-{ver}"


BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kube-proxy",
    "kubectl",
    "helm",
    "coredns",
)


def run(argv: list[str], check: bool = True, quiet: bool = False, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(argv, capture_output=True, text=True, **kw)
    if check and p.returncode != 0:
        raise ClusterError(f"{' '.join(map(str, argv))}: exit {p.returncode}: {(p.stderr or p.stdout).strip()[-2000:]}")
    return p


def tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_bytes()[-n:].decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


def wait(check, timeout_s: float, what: str, log: Path | None = None, interval_s: float = 0.25) -> None:
    """Poll ``check()`` until true; raise ClusterError naming ``what`` (and the log tail) at the deadline."""
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception as e:  # noqa: BLE001 - refused connections while a component starts
            last = e
        time.sleep(interval_s)
    raise ClusterError(
        f"{what}: not ready after {timeout_s:.0f} s (last error: {last!r})"
        + (f"\n--- {log} (tail) ---\n{tail(log)}" if log else "")
    )


def pid_file(name: str) -> Path:
    return RUN / "pids" / f"{name}.pid"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def running(name: str) -> int | None:
    try:
        pid = int(pid_file(name).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return pid if alive(pid) else None


def start(name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
    """Start one component in its own session (so down can signal its whole group), log to LOGS."""
    LOGS.mkdir(parents=True, exist_ok=True)
    pid_file(name).parent.mkdir(parents=True, exist_ok=True)
    with open(LOGS / f"{name}.log", "ab") as log:
        p = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    pid_file(name).write_text(str(p.pid))
    return p.pid


def stop(name: str, timeout_s: float = 20.0) -> None:
    pid = running(name)
    if pid is not None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + timeout_s
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not alive(pid):
                break
    pid_file(name).unlink(missing_ok=True)


def sysctl_path(key: str) -> Path:
    return Path("/proc/sys") / key.replace(".", "/")


# --------------------------------------------------------------------------------------------- PKI
def make_pki() -> None:
    """CA; apiserver serving cert (node IP, kubernetes Service IP and names); client certs for the admin
    (system:masters), the node (system:node:<name>), kube-proxy, the scheduler and the controller-manager;
    the service-account signing key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    PKI.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    until = now + dt.timedelta(days=30)

    def write_key(path: Path, key) -> None:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        path.chmod(0o600)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dynoplan-cluster-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    (PKI / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    write_key(PKI / "ca-key.pem", ca_key)

    def leaf(name: str, cn: str, org: str | None, server_sans: list | None = None) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = ([x509.NameAttribute(NameOID.ORGANIZATION_NAME, org)] if org else []) + [
            x509.NameAttribute(NameOID.COMMON_NAME, cn)
        ]
        b = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(until)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
        if server_sans:
            b = b.add_extension(x509.SubjectAlternativeName(server_sans), critical=False)
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        b = b.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        (PKI / f"{name}.pem").write_bytes(b.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
        write_key(PKI / f"{name}-key.pem", key)

    ip = lambda s: x509.IPAddress(ipaddress.ip_address(s))  # noqa: E731
    leaf(
        "apiserver",
        "kube-apiserver",
        None,
        [
            ip(NODE_IP),
            ip(KUBERNETES_SVC_IP),
            ip("127.0.0.1"),
            x509.DNSName("localhost"),
            *(
                x509.DNSName(n)
                for n in (
                    "kubernetes",
                    "kubernetes.default",
                    "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local",
                )
            ),
        ],
    )
    leaf("admin", "dynoplan-admin", "system:masters")
    leaf("node", f"system:node:{NODE_NAME}", "system:nodes")
    leaf("kube-proxy", "system:kube-proxy", None)
    leaf("kube-scheduler", "system:kube-scheduler", None)
    leaf("kube-controller-manager", "system:kube-controller-manager", None)
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    write_key(PKI / "sa-key.pem", sa)
    (PKI / "sa.pem").write_bytes(
        sa.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def kubeconfig(path: Path, user: str, cert: str, namespace: str = "default") -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "dynoplan",
        "clusters": [
            {"name": "dynoplan", "cluster": {"server": APISERVER, "certificate-authority": str(PKI / "ca.pem")}}
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate": str(PKI / f"{cert}.pem"), "client-key": str(PKI / f"{cert}-key.pem")},
            }
        ],
        "contexts": [{"name": "dynoplan", "context": {"cluster": "dynoplan", "user": user, "namespace": namespace}}],
    }
    path.write_text(json.dumps(doc, indent=1))
    path.chmod(0o600)
    return path


def api_get(path: str) -> tuple[int, dict]:
    """GET on the apiserver as the admin (client certificate)."""
    ctx = ssl.create_default_context(cafile=str(PKI / "ca.pem"))
    ctx.load_cert_chain(str(PKI / "admin.pem"), str(PKI / "admin-key.pem"))
    try:
        with urllib.request.urlopen(APISERVER + path, context=ctx, timeout=5) as r:
            body = r.read()
            return r.status, (json.loads(body) if body[:1] == b"{" else {})
    except urllib.error.HTTPError as e:
        return e.code, {}


def kubectl(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    return run([str(binary("kubectl")), f"--kubeconfig={KUBECONFIG}", *args], check=check, input=stdin)


# ---------------------------------------------------------------------------------------- configs
def containerd_config() -> Path:
    """``containerd config default`` with the settings this machine needs (see tools/README.md)."""
    text = run(["containerd", "config", "default"]).stdout
    d = STATE / "containerd"
    (STATE / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
    pause_ref = (CACHE / "images" / "pause.ref").read_text().strip()

    def sub(old: str, new: str) -> None:
        nonlocal text
        if old not in text:
            raise ClusterError(f"containerd config default: expected the line {old.strip()!r} (containerd 1.6)")
        text = text.replace(old, new, 1)

    sub('root = "/var/lib/containerd"', f'root = "{d / "root"}"')
    sub('state = "/run/containerd"', f'state = "{RUN / "containerd" / "state"}"')
    sub('address = "/run/containerd/containerd.sock"', f'address = "{CONTAINERD_SOCK}"')
    sub("SystemdCgroup = false", "SystemdCgroup = false")  # cgroupfs (cgroup v1, no systemd)
    sub('snapshotter = "overlayfs"', 'snapshotter = "overlayfs"')
    sub('bin_dir = "/opt/cni/bin"', 'bin_dir = "/usr/lib/cni"')
    sub('conf_dir = "/etc/cni/net.d"', f'conf_dir = "{STATE / "cni" / "net.d"}"')
    sub('sandbox_image = "registry.k8s.io/pause:3.6"', f'sandbox_image = "{pause_ref}"')
    # runc cannot write oom_score_adj without CAP_SYS_RESOURCE: "can't get final child's PID from pipe".
    sub("restrict_oom_score_adj = false", "restrict_oom_score_adj = true")
    sub('stream_server_address = "127.0.0.1"', 'stream_server_address = "127.0.0.1"')
    path = d / "config.toml"
    d.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    (STATE / "cni" / "net.d" / "10-dynoplan.conflist").write_text(
        json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": "dynoplan",
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": BRIDGE,
                        "isGateway": True,
                        "ipMasq": False,
                        "hairpinMode": True,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [[{"subnet": POD_CIDR}]],
                            "routes": [{"dst": "0.0.0.0/0"}],
                            "dataDir": str(RUN / "cni-ipam"),
                        },
                    },
                    {"type": "portmap", "capabilities": {"portMappings": True}},
                ],
            },
            indent=1,
        )
    )
    return path


def kubelet_config() -> Path:
    cfg = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_IP,
        "port": 10250,
        "healthzBindAddress": NODE_IP,
        "healthzPort": 10248,
        "readOnlyPort": 0,
        "authentication": {
            "x509": {"clientCAFile": str(PKI / "ca.pem")},
            "webhook": {"enabled": True},
            "anonymous": {"enabled": False},
        },
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCK}",
        "clusterDNS": [DNS_IP],
        "clusterDomain": "cluster.local",
        "resolvConf": "/etc/resolv.conf",
        "tlsCertFile": str(PKI / "kubelet-serving.pem"),
        "tlsPrivateKeyFile": str(PKI / "kubelet-serving-key.pem"),
        # The machine's disk is shared: evict only when it is really full.
        "evictionHard": {"memory.available": "200Mi", "nodefs.available": "2%", "imagefs.available": "2%"},
        "imageGCHighThresholdPercent": 100,
        "imageMinimumGCAge": "24h",
        "serializeImagePulls": False,
        "registerNode": True,
        "maxPods": 60,
        "fileCheckFrequency": "20s",
        "nodeStatusUpdateFrequency": "5s",
        "localStorageCapacityIsolation": False,
    }
    path = STATE / "kubelet-config.json"
    path.write_text(json.dumps(cfg, indent=1))
    return path


def kubelet_serving_cert() -> None:
    """The kubelet's serving certificate (SAN = node IP), signed by the cluster CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca = x509.load_pem_x509_certificate((PKI / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((PKI / "ca-key.pem").read_bytes(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NODE_NAME)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(NODE_IP)), x509.DNSName(NODE_NAME)]),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (PKI / "kubelet-serving.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (PKI / "kubelet-serving-key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    (PKI / "kubelet-serving-key.pem").chmod(0o600)


def kube_proxy_config(kc: Path) -> Path:
    cfg = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kc)},
        "mode": "iptables",
        "clusterCIDR": POD_CIDR,
        "bindAddress": NODE_IP,
        "healthzBindAddress": f"{NODE_IP}:10256",
        "metricsBindAddress": f"{NODE_IP}:10249",
        "hostnameOverride": NODE_NAME,
        # Leave the conntrack table sizes alone (no sysctl writes the machine may refuse).
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "nodePortAddresses": [f"{NODE_IP}/32"],
        "iptables": {"localhostNodePorts": False, "syncPeriod": "10s", "minSyncPeriod": "0s"},
    }
    path = STATE / "kube-proxy-config.json"
    path.write_text(json.dumps(cfg, indent=1))
    return path


def corefile(kc: Path) -> Path:
    path = STATE / "Corefile"
    path.write_text(f""".:53 {{
    bind {NODE_IP}
    ready {NODE_IP}:8181
    health {NODE_IP}:8080
    errors
    loadbalance
    cache 5
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kc}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
}}
""")
    return path


# ------------------------------------------------------------------------------------------- up
def check_prerequisites() -> None:
    problems = []
    if os.geteuid() != 0:
        problems.append("run as root (the kubelet, containerd and the network setup need it)")
    for b in BINARIES:
        if not os.access(binary(b), os.X_OK):
            problems.append(f"{binary(b)} missing: run `tools/build-k8s-bins.sh {b}` (or `make infra-deps`)")
    for img in IMAGES:
        if not (CACHE / "images" / f"{img}.tar").is_file():
            problems.append(
                f"image archive {CACHE / 'images' / (img + '.tar')} missing: run `tools/build-images.sh {img}`"
            )
    for cmd in ("containerd", "runc", "ctr", "iptables", "ip", "conntrack"):
        if shutil.which(cmd) is None:
            problems.append(f"command {cmd!r} not found: run tools/install-system-deps.sh")
    if not Path("/usr/lib/cni/bridge").exists():
        problems.append("/usr/lib/cni/bridge missing: apt-get install containernetworking-plugins")
    if problems:
        raise ClusterError("cannot start the cluster:\n  " + "\n  ".join(problems))


def save_sysctls() -> None:
    if SYSCTL_SAVE.exists():  # an earlier up that was not brought down: keep the original values
        return
    saved = {}
    for k in SYSCTLS:
        try:
            saved[k] = sysctl_path(k).read_text().strip()
        except OSError:
            pass
    SYSCTL_SAVE.write_text(json.dumps(saved, indent=1))


def network_up() -> None:
    # A dummy interface; where the kernel has no dummy module, a bridge without ports holds the
    # address just as well (local delivery only, nothing attached).
    if (
        run(["ip", "link", "show", DUMMY_IF], check=False).returncode != 0
        and run(["ip", "link", "add", DUMMY_IF, "type", "dummy"], check=False).returncode != 0
    ):
        run(["ip", "link", "add", DUMMY_IF, "type", "bridge"])
    run(["ip", "addr", "replace", f"{NODE_IP}/32", "dev", DUMMY_IF])
    run(["ip", "link", "set", DUMMY_IF, "up"])
    # Pod -> Service -> Pod on the same bridge goes through the host's routing and iptables.
    sysctl_path("net.ipv4.ip_forward").write_text("1")
    try:
        sysctl_path("net.bridge.bridge-nf-call-iptables").write_text("1")
    except OSError:
        run(["modprobe", "br_netfilter"], check=False)
        sysctl_path("net.bridge.bridge-nf-call-iptables").write_text("1")


def import_images() -> dict[str, str]:
    refs = {}
    ctr = ["ctr", "--address", str(CONTAINERD_SOCK), "-n", "k8s.io"]
    for img in IMAGES:
        ref = (CACHE / "images" / f"{img}.ref").read_text().strip()
        run([*ctr, "images", "import", str(CACHE / "images" / f"{img}.tar")])
        if ref not in run([*ctr, "images", "ls", "-q"]).stdout.split():
            raise ClusterError(f"image {ref} not present in containerd after importing {img}.tar")
        refs[img] = ref
    return refs


def node_ready() -> bool:
    code, node = api_get(f"/api/v1/nodes/{NODE_NAME}")
    return code == 200 and any(
        c["type"] == "Ready" and c["status"] == "True" for c in node.get("status", {}).get("conditions", [])
    )


def health_problems() -> list[str]:
    """Why the cluster of an earlier ``up`` is not usable; empty when every component runs, the
    apiserver answers ``/readyz`` and the node is Ready."""
    problems = [f"{c} stopped" for c in COMPONENTS if running(c) is None]
    if problems:
        return problems
    try:
        if api_get("/readyz")[0] != 200:
            problems.append("kube-apiserver /readyz is not 200")
        elif not node_ready():
            problems.append(f"node {NODE_NAME} is not Ready")
    except (OSError, ValueError) as e:  # refused, TLS, missing certificates
        problems.append(f"kube-apiserver unreachable ({type(e).__name__}: {e})")
    return problems


def export_line() -> str:
    return f"export KUBECONFIG={KUBECONFIG} PATH={BIN_LINKS}:$PATH"


def up(timeout_s: float = 180.0) -> None:
    """Start the cluster and wait until it is usable; keep a healthy running one as it is.

    State of an earlier run that is not a healthy cluster is brought down first. When a step fails,
    what was started is brought down again and ClusterError is raised (naming the step).
    """
    check_prerequisites()
    if all(running(c) for c in COMPONENTS):
        problems = health_problems()
        if not problems:
            print(
                f"cluster already up and healthy (node {NODE_NAME}, {APISERVER}): nothing changed; "
                "`tools/cluster.py down` first to start afresh"
            )
            print(export_line())
            return
        print(
            f"cluster: an earlier run is running but not healthy ({'; '.join(problems)}); bringing it down first",
            file=sys.stderr,
        )
        down()
    else:
        left = leftovers()
        if left:
            print(
                f"cluster: state of an earlier run found ({', '.join(left[:3])}"
                f"{f' and {len(left) - 3} more' if len(left) > 3 else ''}); bringing it down first",
                file=sys.stderr,
            )
            down()
    try:
        _start(timeout_s)
    except BaseException as e:  # also Ctrl-C: never leave a half-started cluster behind
        print("cluster up failed; bringing down what it started", file=sys.stderr)
        try:
            down()
        except ClusterError as d:
            if isinstance(e, ClusterError):
                raise ClusterError(f"{e}\nand the clean-up after it failed: {d}") from None
            print(f"cluster: the clean-up failed: {d}", file=sys.stderr)
        raise


def start_containerd() -> None:
    """Start containerd and wait until ``ctr`` reaches it (30 s)."""
    start("containerd", ["containerd", "--config", str(containerd_config())])
    wait(
        lambda: run(["ctr", "--address", str(CONTAINERD_SOCK), "version"], check=False).returncode == 0,
        30,
        "containerd",
        LOGS / "containerd.log",
    )


def _start(timeout_s: float) -> None:
    t0 = time.monotonic()
    for d in (STATE / "etcd", PKI, LOGS, RUN):
        shutil.rmtree(d, ignore_errors=True)
    STATE.mkdir(parents=True, exist_ok=True)
    RUN.mkdir(parents=True, exist_ok=True)
    save_sysctls()
    network_up()
    make_pki()
    kubelet_serving_cert()
    kc_admin = kubeconfig(KUBECONFIG, "dynoplan-admin", "admin")
    kc = {
        n: kubeconfig(STATE / f"{n}.kubeconfig", n, n)
        for n in ("node", "kube-proxy", "kube-scheduler", "kube-controller-manager")
    }
    BIN_LINKS.mkdir(parents=True, exist_ok=True)
    for b in ("kubectl", "helm"):
        link = BIN_LINKS / b
        link.unlink(missing_ok=True)
        link.symlink_to(binary(b))

    start_containerd()
    try:
        refs = import_images()
    except ClusterError as e:
        # The image store is a cache that down keeps; one that can no longer take the images (its metadata
        # names a layer snapshot that is gone: "parent snapshot ... does not exist") is rebuilt from the tars.
        root = STATE / "containerd" / "root"
        stop("containerd")
        held = mounts_under(root)
        if held:
            raise ClusterError(f"{e}\nand the image store {root} cannot be rebuilt: still mounted: {held}") from None
        print(
            f"cluster up: containerd's image store could not take the images ({str(e).splitlines()[0][:300]}); "
            f"deleting {root} and importing again",
            file=sys.stderr,
        )
        shutil.rmtree(root, ignore_errors=True)
        start_containerd()
        refs = import_images()

    etcd_url = f"http://{NODE_IP}:2379"
    start(
        "etcd",
        [
            str(binary("etcd")),
            "--name=dynoplan",
            f"--data-dir={STATE / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://{NODE_IP}:2380",
            f"--initial-advertise-peer-urls=http://{NODE_IP}:2380",
            f"--initial-cluster=dynoplan=http://{NODE_IP}:2380",
            f"--listen-metrics-urls=http://{NODE_IP}:2381",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ],
    )
    wait(lambda: urllib.request.urlopen(f"{etcd_url}/health", timeout=2).status == 200, 60, "etcd", LOGS / "etcd.log")
    start(
        "kube-apiserver",
        [
            str(binary("kube-apiserver")),
            f"--etcd-servers={etcd_url}",
            f"--bind-address={NODE_IP}",
            f"--advertise-address={NODE_IP}",
            "--secure-port=6443",
            f"--cert-dir={STATE / 'apiserver-certs'}",
            f"--tls-cert-file={PKI / 'apiserver.pem'}",
            f"--tls-private-key-file={PKI / 'apiserver-key.pem'}",
            f"--client-ca-file={PKI / 'ca.pem'}",
            f"--kubelet-client-certificate={PKI / 'admin.pem'}",
            f"--kubelet-client-key={PKI / 'admin-key.pem'}",
            f"--kubelet-certificate-authority={PKI / 'ca.pem'}",
            "--kubelet-preferred-address-types=InternalIP",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={PKI / 'sa.pem'}",
            f"--service-account-signing-key-file={PKI / 'sa-key.pem'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            "--v=1",
        ],
    )
    wait(lambda: api_get("/readyz")[0] == 200, timeout_s, "kube-apiserver", LOGS / "kube-apiserver.log")
    start(
        "kube-controller-manager",
        [
            str(binary("kube-controller-manager")),
            f"--kubeconfig={kc['kube-controller-manager']}",
            f"--authentication-kubeconfig={kc['kube-controller-manager']}",
            f"--authorization-kubeconfig={kc['kube-controller-manager']}",
            "--leader-elect=false",
            f"--bind-address={NODE_IP}",
            "--secure-port=10257",
            f"--cert-dir={STATE / 'kcm-certs'}",
            f"--service-account-private-key-file={PKI / 'sa-key.pem'}",
            f"--root-ca-file={PKI / 'ca.pem'}",
            "--use-service-account-credentials=true",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--v=1",
        ],
    )
    start(
        "kube-scheduler",
        [
            str(binary("kube-scheduler")),
            f"--kubeconfig={kc['kube-scheduler']}",
            f"--authentication-kubeconfig={kc['kube-scheduler']}",
            f"--authorization-kubeconfig={kc['kube-scheduler']}",
            "--leader-elect=false",
            f"--bind-address={NODE_IP}",
            "--secure-port=10259",
            f"--cert-dir={STATE / 'scheduler-certs'}",
            "--v=1",
        ],
    )
    KUBELET_DIR.mkdir(parents=True, exist_ok=True)
    start(
        "kubelet",
        [
            str(binary("kubelet")),
            f"--config={kubelet_config()}",
            f"--kubeconfig={kc['node']}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={NODE_IP}",
            "--v=1",
        ],
    )
    start("kube-proxy", [str(binary("kube-proxy")), f"--config={kube_proxy_config(kc['kube-proxy'])}", "--v=1"])
    # CoreDNS reads Services and EndpointSlices cluster-wide: the admin credentials (a local tool).
    start("coredns", [str(binary("coredns")), "-conf", str(corefile(kc_admin))])

    wait(node_ready, timeout_s, f"node {NODE_NAME} Ready", LOGS / "kubelet.log", interval_s=0.5)
    wait(
        lambda: api_get("/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
        timeout_s,
        "kube-controller-manager (default ServiceAccount)",
        LOGS / "kube-controller-manager.log",
    )
    kubectl(
        "apply",
        "-f",
        "-",
        stdin=json.dumps(
            {
                "apiVersion": "v1",
                "kind": "List",
                "items": [
                    {
                        "apiVersion": "v1",
                        "kind": "Service",
                        "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
                        "spec": {
                            "clusterIP": DNS_IP,
                            "ports": [
                                {"name": "dns", "port": 53, "protocol": "UDP"},
                                {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
                            ],
                        },
                    },
                    {
                        "apiVersion": "discovery.k8s.io/v1",
                        "kind": "EndpointSlice",
                        "metadata": {
                            "name": "kube-dns-coredns",
                            "namespace": "kube-system",
                            "labels": {
                                "kubernetes.io/service-name": "kube-dns",
                                "endpointslice.kubernetes.io/managed-by": "dynoplan-cluster",
                            },
                        },
                        "addressType": "IPv4",
                        "endpoints": [{"addresses": [NODE_IP], "conditions": {"ready": True}}],
                        "ports": [
                            {"name": "dns", "port": 53, "protocol": "UDP"},
                            {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
                        ],
                    },
                ],
            }
        ),
    )
    wait(
        lambda: urllib.request.urlopen(f"http://{NODE_IP}:8181/ready", timeout=2).status == 200,
        60,
        "CoreDNS ready",
        LOGS / "coredns.log",
    )
    # kube-proxy has programmed the DNS Service (and so the kubernetes Service) into iptables.
    wait(
        lambda: DNS_IP in run(["iptables", "-t", "nat", "-S", "KUBE-SERVICES"], check=False).stdout,
        60,
        "kube-proxy rules for kube-dns",
        LOGS / "kube-proxy.log",
    )
    print(
        f"cluster up in {time.monotonic() - t0:.0f} s: node {NODE_NAME} ({NODE_IP}), images " + ", ".join(refs.values())
    )
    print(export_line())


# ----------------------------------------------------------------------------------------- down
def mounts_under(*prefixes: Path) -> list[str]:
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        target = line.split()[1].replace("\\040", " ")
        if any(target == str(p) or target.startswith(str(p) + "/") for p in prefixes):
            out.append(target)
    return sorted(set(out), key=len, reverse=True)  # deepest first


def leftovers() -> list[str]:
    """What an earlier run left on the machine (empty when clean)."""
    left = [f"process {c}" for c in COMPONENTS if running(c)]
    left += [f"interface {i}" for i in (DUMMY_IF, BRIDGE) if Path(f"/sys/class/net/{i}").exists()]
    left += [f"mount {m}" for m in mounts_under(KUBELET_DIR, Path("/run/netns"), STATE / "containerd", RUN)]
    for table in ("filter", "nat", "mangle"):
        chains = [c for c in _chains("iptables", table) if c.startswith(("KUBE-", "CNI-"))]
        left += [f"iptables {table} chain {c}" for c in chains]
    if SYSCTL_SAVE.exists():
        left.append(f"saved kernel settings {SYSCTL_SAVE}")
    return left


def _chains(cmd: str, table: str) -> list[str]:
    if shutil.which(cmd) is None:
        return []
    p = run([cmd, "-w", "-t", table, "-S"], check=False)
    return [ln.split()[1] for ln in p.stdout.splitlines() if ln.startswith("-N ")]


def clean_iptables() -> None:
    """Delete every rule that jumps to a KUBE-*/CNI-* chain, then flush and delete those chains."""
    for cmd in ("iptables", "ip6tables"):
        if shutil.which(cmd) is None:
            continue
        for table in ("filter", "nat", "mangle"):
            ours = [c for c in _chains(cmd, table) if c.startswith(("KUBE-", "CNI-"))]
            rules = run([cmd, "-w", "-t", table, "-S"], check=False).stdout.splitlines()
            for rule in rules:
                parts = shlex.split(rule)  # rules carry quoted comments
                if (
                    parts[:1] == ["-A"]
                    and parts[1] not in ours
                    and any(parts[i - 1] in ("-j", "-g") and parts[i] in ours for i in range(1, len(parts)))
                ):
                    run([cmd, "-w", "-t", table, "-D", *parts[1:]], check=False)
            for c in ours:
                run([cmd, "-w", "-t", table, "-F", c], check=False)
            for c in ours:
                run([cmd, "-w", "-t", table, "-X", c], check=False)


def kill_containers() -> None:
    if not CONTAINERD_SOCK.exists() or not running("containerd"):
        return
    ctr = ["ctr", "--address", str(CONTAINERD_SOCK), "-n", "k8s.io"]
    tasks = run([*ctr, "tasks", "ls", "-q"], check=False).stdout.split()
    for t in tasks:
        run([*ctr, "tasks", "kill", "-s", "SIGKILL", t], check=False)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(
        ln.split()[-1:] != ["STOPPED"] for ln in run([*ctr, "tasks", "ls"], check=False).stdout.splitlines()[1:]
    ):
        time.sleep(0.2)
    for t in tasks:
        run([*ctr, "tasks", "delete", "-f", t], check=False)
    for c in run([*ctr, "containers", "ls", "-q"], check=False).stdout.split():
        run([*ctr, "containers", "delete", c], check=False)


def remove_cgroups() -> None:
    for hier in CGROUP_ROOT.iterdir() if CGROUP_ROOT.is_dir() else []:
        top = hier / "kubepods"
        if not top.is_dir():
            continue
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            try:
                d.rmdir()
            except OSError:
                pass
        try:
            top.rmdir()
        except OSError:
            pass


def down(purge: bool = False) -> None:
    """Stop everything and undo every host change; safe to run again and on a half-started cluster.
    The state directory (containerd's image store, logs) stays as a cache unless ``purge``."""
    for c in ("kube-proxy", "kube-scheduler", "kube-controller-manager", "kubelet", "coredns"):
        stop(c)
    kill_containers()
    stop("containerd")
    for c in ("kube-apiserver", "etcd"):
        stop(c)
    problems = []
    for m in mounts_under(KUBELET_DIR, Path("/run/netns"), STATE / "containerd", RUN):
        if run(["umount", m], check=False).returncode != 0 and run(["umount", "-l", m], check=False).returncode != 0:
            problems.append(f"could not unmount {m}")
    for ns in Path("/run/netns").glob("cni-*"):
        ns.unlink(missing_ok=True)
    shutil.rmtree(KUBELET_DIR, ignore_errors=True)
    for i in (BRIDGE, DUMMY_IF):
        if Path(f"/sys/class/net/{i}").exists():
            run(["ip", "link", "del", i], check=False)
    clean_iptables()
    if shutil.which("conntrack"):
        for net in (POD_CIDR, SERVICE_CIDR):
            run(["conntrack", "-D", "-s", net], check=False)
            run(["conntrack", "-D", "-d", net], check=False)
    remove_cgroups()
    if SYSCTL_SAVE.exists():
        for k, v in json.loads(SYSCTL_SAVE.read_text()).items():
            try:
                sysctl_path(k).write_text(v)
            except OSError as e:
                problems.append(f"could not restore {k}={v}: {e}")
        SYSCTL_SAVE.unlink()
    shutil.rmtree(RUN, ignore_errors=True)
    left = [x for x in leftovers() if not x.startswith("saved kernel")]
    if problems or left:
        raise ClusterError("cluster down left: " + "; ".join(problems + left))
    print("cluster down: processes stopped, mounts, interfaces, iptables chains and kernel settings restored")
    if purge:
        purge_state()
    elif STATE.exists():
        print(f"cluster down: kept {STATE} (image store and logs, a cache for the next up; `down --purge` deletes it)")


def purge_state() -> None:
    """Delete the state directory; refuses while anything is mounted under it."""
    held = mounts_under(STATE)
    if held:
        raise ClusterError(f"not purging {STATE}: still mounted: {', '.join(held)}")
    if STATE.exists():
        shutil.rmtree(STATE)
        print(f"cluster down: deleted {STATE}")


def status() -> int:
    ok = True
    for c in COMPONENTS:
        pid = running(c)
        ok &= pid is not None
        print(f"{c:24s} {'running pid ' + str(pid) if pid else 'stopped'}")
    if ok:
        print(export_line())
    return 0 if ok else 1


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (``tools/cluster.py: error: ...``), exit 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive_seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not (v > 0 and v != float("inf")):
        raise argparse.ArgumentTypeError(f"got {text!r}, expected seconds > 0")
    return v


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    p = _Parser(
        prog="tools/cluster.py",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=doc.split("\n\nWhat runs")[0].replace("::\n", ":\n"),
        epilog='Details: tools/README.md ("The local cluster").',
    )
    p.add_argument(
        "--timeout-s",
        type=positive_seconds,
        default=180.0,
        metavar="S",
        help="deadline of each wait in up, seconds > 0 (default 180)",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="{up,status,down}", parser_class=_Parser)
    u = sub.add_parser(
        "up",
        help="start the cluster and wait until usable (a healthy running one is kept; "
        "a failed up brings down what it started)",
    )
    u.add_argument(
        "--timeout-s",
        type=positive_seconds,
        default=argparse.SUPPRESS,
        metavar="S",
        help="deadline of each wait, seconds > 0 (default 180)",
    )
    sub.add_parser("status", help="which components run; exit 1 when not all")
    d = sub.add_parser("down", help="stop everything and undo every host change (the state directory stays as a cache)")
    d.add_argument("--purge", action="store_true", help=f"also delete the state directory {STATE} (image store, logs)")
    a = p.parse_args(argv)
    try:
        if a.command == "up":
            up(a.timeout_s)
        elif a.command == "down":
            down(purge=a.purge)
        else:
            return status()
    except ClusterError as e:
        print(f"cluster {a.command}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
