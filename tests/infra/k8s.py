"""A real Kubernetes control plane on loopback for tests: etcd + kube-apiserver (envtest style).

The binaries are built from their published Go modules by ``tools/build-k8s-bins.sh`` (versions in
``tools/k8s-versions.env``) and cached in ``${DYNOPLAN_CACHE:-~/.cache/dynoplan}/bin``; override a
path with ``DYNOPLAN_ETCD`` / ``DYNOPLAN_KUBE_APISERVER`` / ``DYNOPLAN_HELM``.

What runs: one etcd (in-memory-ish: ``--unsafe-no-fsync``) and one kube-apiserver with
``--authorization-mode=RBAC``, a self-signed CA and serving certificate for 127.0.0.1 (made with the
``cryptography`` package), a service-account signing key (so TokenRequest works), a static admin
bearer token in group ``system:masters`` and an admin client certificate. There is no
controller-manager or scheduler: Deployments are stored but never create Pods, their status stays
empty unless a test writes it, and deleted namespaces stay ``Terminating``.

Usage::

    from tests.infra.k8s import ControlPlane
    with ControlPlane.start() as cp:
        api = kubernetes.client.ApiClient(cp.admin_configuration())
        token = cp.service_account_token("default", "operator")   # creates the SA if missing
        sa_api = kubernetes.client.ApiClient(cp.configuration_for_token(token))
        cp.restart_apiserver()                                     # fault injection
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

import requests
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from tests.infra._proc import REPO_ROOT, free_port, start_process, stop_process, wait_until

VERSIONS_FILE = REPO_ROOT / "tools" / "k8s-versions.env"
BUILD_SCRIPT = REPO_ROOT / "tools" / "build-k8s-bins.sh"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


def pinned_versions() -> dict[str, str]:
    """KEY=VALUE pairs of ``tools/k8s-versions.env`` (e.g. ``KUBERNETES_VERSION``)."""
    out: dict[str, str] = {}
    for line in VERSIONS_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def cache_bin_dir() -> Path:
    """Where build-k8s-bins.sh caches binaries: ``${DYNOPLAN_CACHE:-~/.cache/dynoplan}/bin``."""
    return Path(os.environ.get("DYNOPLAN_CACHE", Path.home() / ".cache" / "dynoplan")) / "bin"


def binary_path(name: str) -> Path:
    """Path of the cached ``etcd``, ``kube-apiserver`` or ``helm`` binary at its pinned version.

    Raises:
        FileNotFoundError: the binary has not been built; the message says how to build it.
    """
    env_key = {
        "etcd": "DYNOPLAN_ETCD",
        "kube-apiserver": "DYNOPLAN_KUBE_APISERVER",
        "helm": "DYNOPLAN_HELM",
        "kube-controller-manager": "DYNOPLAN_KUBE_CONTROLLER_MANAGER",
    }
    version_key = {
        "etcd": "ETCD_VERSION",
        "kube-apiserver": "KUBERNETES_VERSION",
        "helm": "HELM_VERSION",
        "kube-controller-manager": "KUBERNETES_VERSION",
    }
    if name not in env_key:
        raise ValueError(f"binary name {name!r}: expected one of {sorted(env_key)}")
    override = os.environ.get(env_key[name])
    path = Path(override) if override else cache_bin_dir() / f"{name}-{pinned_versions()[version_key[name]]}"
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise FileNotFoundError(
            f"{name} binary not found at {path}; build it with `{BUILD_SCRIPT} {name}` (or `make test`,"
            f" which runs the build when missing)"
        )
    return path


# --------------------------------------------------------------------------------------------- certs
def _write_key(path: Path, key) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _make_pki(d: Path) -> dict[str, Path]:
    """Self-signed CA, apiserver serving cert (SAN 127.0.0.1, localhost), admin client cert, SA key."""
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    until = now + dt.timedelta(days=2)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dynoplan-test-ca")])
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

    def leaf(subject: x509.Name, server: bool):
        key = ec.generate_private_key(ec.SECP256R1())
        b = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(until)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        if server:
            b = b.add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DNSName("localhost"),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                        x509.DNSName("kubernetes.default.svc"),
                    ]
                ),
                critical=False,
            )
            b = b.add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        else:
            b = b.add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        return key, b.sign(ca_key, hashes.SHA256())

    serving_key, serving = leaf(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]), True)
    admin_key, admin = leaf(
        x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
                x509.NameAttribute(NameOID.COMMON_NAME, "dynoplan-admin"),
            ]
        ),
        False,
    )
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    paths = {
        k: d / f"{k}.pem" for k in ("ca", "ca_key", "serving", "serving_key", "admin", "admin_key", "sa_key", "sa_pub")
    }
    _write_cert(paths["ca"], ca)
    _write_key(paths["ca_key"], ca_key)
    _write_cert(paths["serving"], serving)
    _write_key(paths["serving_key"], serving_key)
    _write_cert(paths["admin"], admin)
    _write_key(paths["admin_key"], admin_key)
    _write_key(paths["sa_key"], sa_key)
    paths["sa_pub"].write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return paths


# ------------------------------------------------------------------------------------- control plane
class ControlPlane:
    """etcd + kube-apiserver on 127.0.0.1 free ports, in a private temp directory.

    Attributes:
        url: ``https://127.0.0.1:<port>`` of the apiserver.
        ca_file: PEM of the CA that signed the serving and admin certificates.
        admin_token: static bearer token of user ``dynoplan-admin`` in group ``system:masters``.
        kubeconfig: path of a kubeconfig file for the admin (for helm, kopf, kubectl).
        base_dir: the temp directory (logs: ``etcd.log``, ``kube-apiserver.log``); removed by stop().
    """

    def __init__(self, base_dir: Path | None = None, keep_dir: bool = False, controller_manager: bool = False) -> None:
        # Binaries first: a missing one raises before any temp dir exists.
        self.etcd_bin = binary_path("etcd")
        self.apiserver_bin = binary_path("kube-apiserver")
        self.controller_manager_bin = binary_path("kube-controller-manager") if controller_manager else None
        self._own_dir = base_dir is None
        self.base_dir = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix="dynoplan-k8s-"))
        self._keep_dir = keep_dir
        self.pki = _make_pki(self.base_dir)
        self.admin_token = secrets.token_hex(16)
        tokens = self.base_dir / "tokens.csv"
        tokens.write_text(f'{self.admin_token},dynoplan-admin,dynoplan-admin-uid,"system:masters"\n')
        tokens.chmod(0o600)
        self.etcd_client_port = free_port()
        self.etcd_peer_port = free_port()
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.ca_file = self.pki["ca"]
        self.kubeconfig = self.base_dir / "kubeconfig"
        self._write_kubeconfig()
        self.etcd_proc: subprocess.Popen | None = None
        self.apiserver_proc: subprocess.Popen | None = None
        self.controller_manager_proc: subprocess.Popen | None = None

    # ---------------------------------------------------------------- lifecycle
    @classmethod
    def start(
        cls, base_dir: Path | None = None, timeout_s: float = 120.0, controller_manager: bool = False
    ) -> ControlPlane:
        """Create, start etcd and kube-apiserver, wait until ``/readyz`` answers 200. On failure, stop.

        With ``controller_manager=True`` also run kube-controller-manager (Deployment/ReplicaSet,
        garbage-collector, namespace, service-account controllers...; there is still no scheduler or
        kubelet, so Pods stay Pending unless a test writes their status).
        """
        cp = cls(base_dir, controller_manager=controller_manager)
        try:
            cp.start_etcd(timeout_s)
            cp.start_apiserver(timeout_s)
            if controller_manager:
                cp.start_controller_manager(timeout_s)
        except BaseException:
            cp.stop()
            raise
        return cp

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start_etcd(self, timeout_s: float = 60.0) -> None:
        client = f"http://127.0.0.1:{self.etcd_client_port}"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        log = self.base_dir / "etcd.log"
        self.etcd_proc = start_process(
            [
                str(self.etcd_bin),
                "--name=default",
                f"--data-dir={self.base_dir / 'etcd-data'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
            log,
        )
        wait_until(lambda: requests.get(f"{client}/health", timeout=2).ok, timeout_s, "etcd", self.etcd_proc, log)

    def _apiserver_argv(self) -> list[str]:
        p = self.pki
        return [
            str(self.apiserver_bin),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_client_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--cert-dir={self.base_dir / 'apiserver-certs'}",
            f"--tls-cert-file={p['serving']}",
            f"--tls-private-key-file={p['serving_key']}",
            f"--client-ca-file={p['ca']}",
            f"--token-auth-file={self.base_dir / 'tokens.csv'}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={p['sa_pub']}",
            f"--service-account-signing-key-file={p['sa_key']}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--authorization-mode=RBAC",
            # No Endpoints for the "kubernetes" Service: a loopback advertise address is refused by the
            # reconciler ("may not be in the loopback range"), and nothing here needs that Service.
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",
            "--v=1",
        ]

    def start_apiserver(self, timeout_s: float = 120.0) -> None:
        """Start kube-apiserver (same port, same etcd) and wait for ``/readyz``."""
        if self.apiserver_proc is not None and self.apiserver_proc.poll() is None:
            raise RuntimeError("kube-apiserver is already running")
        log = self.base_dir / "kube-apiserver.log"
        self.apiserver_proc = start_process(self._apiserver_argv(), log)
        wait_until(self.is_ready, timeout_s, "kube-apiserver", self.apiserver_proc, log, interval_s=0.25)

    def start_controller_manager(self, timeout_s: float = 120.0) -> None:
        """Start kube-controller-manager (admin client cert kubeconfig, no leader election) and wait
        until it has created the ``default`` ServiceAccount in namespace ``default``."""
        if self.controller_manager_bin is None:
            raise RuntimeError("ControlPlane was created with controller_manager=False")
        log = self.base_dir / "kube-controller-manager.log"
        self.controller_manager_proc = start_process(
            [
                str(self.controller_manager_bin),
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                f"--cert-dir={self.base_dir / 'kcm-certs'}",
                f"--service-account-private-key-file={self.pki['sa_key']}",
                f"--root-ca-file={self.ca_file}",
                "--use-service-account-credentials=false",
                # No kubelets: the node-lifecycle controller would mark test-readied Pods NotReady.
                "--controllers=*,-nodelifecycle",
                "--v=1",
            ],
            log,
        )

        def default_sa() -> bool:
            r = requests.get(
                f"{self.url}/api/v1/namespaces/default/serviceaccounts/default",
                headers={"Authorization": f"Bearer {self.admin_token}"},
                verify=str(self.ca_file),
                timeout=5,
            )
            return r.status_code == 200

        wait_until(default_sa, timeout_s, "kube-controller-manager", self.controller_manager_proc, log, interval_s=0.25)

    def server_side_apply(
        self,
        manifests: str | dict | list[dict],
        field_manager: str = "dynoplan-tests",
        namespace: str = "default",
        wait_crds: bool = True,
    ) -> list[dict]:
        """Server-side apply YAML text (multi-document, e.g. ``helm template`` output) or objects, in
        order, as the admin; namespaced objects without a namespace go to ``namespace``. CRDs are
        waited for until Established (when ``wait_crds``) before later documents are applied.
        Returns the applied objects as the server stored them.

        Raises:
            kubernetes.client.rest.ApiException: the apiserver rejected a document (schema, RBAC...).
            ValueError: a document lacks apiVersion/kind/metadata.name.
        """
        from kubernetes.dynamic import DynamicClient

        if isinstance(manifests, str):
            docs = [d for d in yaml.safe_load_all(manifests) if d]
        elif isinstance(manifests, dict):
            docs = [manifests]
        else:
            docs = list(manifests)
        applied: list[dict] = []
        with self.admin_client() as api:
            dyn = DynamicClient(api)
            for i, doc in enumerate(docs):
                if not (doc.get("apiVersion") and doc.get("kind") and doc.get("metadata", {}).get("name")):
                    raise ValueError(
                        f"manifest document {i}: expected apiVersion, kind and metadata.name, got keys {sorted(doc)}"
                    )
                try:
                    res = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
                except Exception:  # noqa: BLE001 - a CRD applied just before: refresh discovery once
                    dyn = DynamicClient(api)
                    res = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
                ns = (doc["metadata"].get("namespace") or namespace) if res.namespaced else None
                out = res.server_side_apply(
                    body=doc, namespace=ns, field_manager=field_manager, force_conflicts=True
                ).to_dict()
                applied.append(out)
                if wait_crds and doc["kind"] == "CustomResourceDefinition":
                    self.wait_crd_established(doc["metadata"]["name"])
        return applied

    def wait_crd_established(self, name: str, timeout_s: float = 30.0) -> None:
        """Wait until CRD ``name`` has condition Established=True (its API is served)."""
        import kubernetes

        with self.admin_client() as api:
            ext = kubernetes.client.ApiextensionsV1Api(api)

            def established() -> bool:
                crd = ext.read_custom_resource_definition(name)
                return any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))

            wait_until(established, timeout_s, f"CRD {name} Established")

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run the pinned helm binary against this cluster (``--kubeconfig`` = admin); text output.

        Raises:
            subprocess.CalledProcessError: helm exited non-zero and ``check`` (stderr in the message).
        """
        proc = subprocess.run(
            [str(binary_path("helm")), *args, "--kubeconfig", str(self.kubeconfig)], capture_output=True, text=True
        )
        if check and proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, proc.args, proc.stdout, proc.stderr)
        return proc

    def mark_pods_ready(self, namespace: str, label_selector: str = "", ready: bool = True) -> int:
        """Play kubelet: set phase Running and the Ready/ContainersReady conditions on every Pod of
        ``namespace`` matching ``label_selector`` (through the ``pods/status`` subresource), so the
        Deployment/ReplicaSet controllers count them ready. Needs ``controller_manager=True`` for the
        Pods to exist at all. Returns the number of Pods patched.
        """
        import kubernetes

        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        status = "True" if ready else "False"
        body = {
            "status": {
                "phase": "Running",
                "conditions": [
                    {"type": t, "status": status, "lastTransitionTime": now}
                    for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
                ],
            }
        }
        with self.admin_client() as api:
            core = kubernetes.client.CoreV1Api(api)
            pods = core.list_namespaced_pod(namespace, label_selector=label_selector).items
            for pod in pods:
                core.patch_namespaced_pod_status(pod.metadata.name, namespace, body)
        return len(pods)

    def stop_apiserver(self) -> None:
        """SIGTERM kube-apiserver (SIGKILL after 15 s); etcd keeps running and keeps the data."""
        stop_process(self.apiserver_proc)
        self.apiserver_proc = None

    def restart_apiserver(self, down_s: float = 0.0, timeout_s: float = 120.0) -> None:
        """Stop kube-apiserver, stay down ``down_s`` seconds, start it again on the same port and
        wait until ready. Clients see connection errors meanwhile; stored objects survive (etcd)."""
        import time

        self.stop_apiserver()
        if down_s > 0:
            time.sleep(down_s)
        self.start_apiserver(timeout_s)

    def stop(self) -> None:
        """Stop the controller-manager, kube-apiserver and etcd (process groups, no orphans); remove the
        temp dir. Idempotent."""
        stop_process(self.controller_manager_proc)
        self.controller_manager_proc = None
        stop_process(self.apiserver_proc)
        self.apiserver_proc = None
        stop_process(self.etcd_proc)
        self.etcd_proc = None
        if self._own_dir and not self._keep_dir and self.base_dir.exists():
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def is_ready(self) -> bool:
        """True when ``GET /readyz`` (as admin) answers 200."""
        r = requests.get(
            f"{self.url}/readyz",
            headers={"Authorization": f"Bearer {self.admin_token}"},
            verify=str(self.ca_file),
            timeout=5,
        )
        return r.status_code == 200

    # ---------------------------------------------------------------- clients
    def configuration_for_token(self, token: str):
        """A ``kubernetes.client.Configuration`` that authenticates with bearer ``token``."""
        import kubernetes

        cfg = kubernetes.client.Configuration()
        cfg.host = self.url
        cfg.ssl_ca_cert = str(self.ca_file)
        cfg.verify_ssl = True
        cfg.api_key = {"authorization": token}
        cfg.api_key_prefix = {"authorization": "Bearer"}
        return cfg

    def admin_configuration(self):
        """``kubernetes.client.Configuration`` for the cluster admin (group ``system:masters``)."""
        return self.configuration_for_token(self.admin_token)

    def admin_client(self):
        """A ``kubernetes.client.ApiClient`` for the admin; close it (or use ``with``) when done."""
        import kubernetes

        return kubernetes.client.ApiClient(self.admin_configuration())

    def service_account_token(
        self,
        namespace: str,
        name: str,
        expiration_s: int = 3600,
        create: bool = True,
        audiences: list[str] | None = None,
    ) -> str:
        """A bound token of ServiceAccount ``namespace/name`` from the TokenRequest API.

        Creates the namespace and the ServiceAccount first when ``create`` (409 Conflict ignored).
        The token carries only what RBAC grants that ServiceAccount (nothing, until a test binds a
        Role/ClusterRole to it). ``audiences`` defaults to the apiserver's issuer.
        """
        import kubernetes
        from kubernetes.client.rest import ApiException

        with self.admin_client() as api:
            core = kubernetes.client.CoreV1Api(api)
            if create:
                for call, body in (
                    (lambda b: core.create_namespace(b), {"metadata": {"name": namespace}}),
                    (lambda b: core.create_namespaced_service_account(namespace, b), {"metadata": {"name": name}}),
                ):
                    try:
                        call(body)
                    except ApiException as exc:
                        if exc.status != 409:
                            raise
            spec: dict = {"expirationSeconds": int(expiration_s)}
            if audiences:
                spec["audiences"] = list(audiences)
            tr = core.create_namespaced_service_account_token(name, namespace, {"spec": spec})
            return tr.status.token

    def service_account_kubeconfig(self, namespace: str, name: str, path: Path, **kw) -> Path:
        """Write a kubeconfig at ``path`` that authenticates as ServiceAccount ``namespace/name``
        (token via :meth:`service_account_token`), e.g. to run the operator as the chart's SA."""
        token = self.service_account_token(namespace, name, **kw)
        self._write_kubeconfig(
            path, user=f"system:serviceaccount:{namespace}:{name}", auth={"token": token}, namespace=namespace
        )
        return Path(path)

    def _write_kubeconfig(
        self,
        path: Path | None = None,
        user: str = "dynoplan-admin",
        auth: dict | None = None,
        namespace: str = "default",
    ) -> None:
        auth = auth or {"client-certificate": str(self.pki["admin"]), "client-key": str(self.pki["admin_key"])}
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "dynoplan-test",
            "clusters": [
                {"name": "dynoplan-test", "cluster": {"server": self.url, "certificate-authority": str(self.ca_file)}}
            ],
            "users": [{"name": user, "user": auth}],
            "contexts": [
                {"name": "dynoplan-test", "context": {"cluster": "dynoplan-test", "user": user, "namespace": namespace}}
            ],
        }
        target = Path(path) if path else self.kubeconfig
        target.write_text(yaml.safe_dump(doc))
        target.chmod(0o600)
