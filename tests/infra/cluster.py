"""The local one-node cluster of ``tools/cluster.py`` for tests: built, started, and always torn down.

:meth:`LocalCluster.start` runs ``tools/build-images.sh`` (a no-op when the image archives match the
sources) and ``tools/cluster.py up``; :meth:`LocalCluster.stop` runs ``tools/cluster.py down``, which
restores every host change. Both print the tool's output into the failure message when they fail.

Usage::

    with LocalCluster.start() as c:
        c.kubectl("get", "nodes")            # CompletedProcess; raises on a non-zero exit
        c.run("helm install ...", cwd=...)   # a shell command line with KUBECONFIG and PATH set
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.infra._proc import REPO_ROOT

TOOL = REPO_ROOT / "tools" / "cluster.py"
IMAGES = REPO_ROOT / "tools" / "build-images.sh"
STATE = Path(os.environ.get("DYNOPLAN_CLUSTER_DIR", "/var/lib/dynoplan-cluster"))


class LocalCluster:
    """A running cluster: ``kubeconfig`` (admin), ``bin_dir`` (``kubectl`` and ``helm`` links), ``env``."""

    def __init__(self) -> None:
        self.kubeconfig = STATE / "kubeconfig"
        self.bin_dir = STATE / "bin"
        self.logs = STATE / "logs"
        self.env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": f"{self.bin_dir}:{os.environ.get('PATH', '')}",
        }

    @classmethod
    def start(cls, timeout_s: float = 900.0) -> LocalCluster:
        """Build missing images, bring the cluster up. Raises RuntimeError with the tool's output."""
        if os.geteuid() != 0:
            raise RuntimeError("the local cluster needs root (kubelet, containerd, network setup)")
        for argv, what in (
            ([str(IMAGES)], "tools/build-images.sh"),
            ([sys.executable, str(TOOL), "up"], "tools/cluster.py up"),
        ):
            p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
            if p.returncode != 0:
                if what.endswith("up"):
                    subprocess.run([sys.executable, str(TOOL), "down"], capture_output=True, text=True)
                raise RuntimeError(f"{what} failed (exit {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}")
        return cls()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """``tools/cluster.py down``. Raises RuntimeError when it reports leftovers."""
        p = subprocess.run([sys.executable, str(TOOL), "down"], capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"tools/cluster.py down failed (exit {p.returncode}):\n{p.stdout}\n{p.stderr}")

    def run(
        self, command: str, cwd: Path | None = None, timeout_s: float = 300.0, check: bool = True
    ) -> subprocess.CompletedProcess:
        """Run a shell command line (as a user types it) against the cluster; text output.

        Raises:
            RuntimeError: non-zero exit (with ``check``) or no exit within ``timeout_s``; the message
                names the command and quotes its output.
        """
        try:
            p = subprocess.run(
                ["bash", "-c", command], cwd=cwd, env=self.env, capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(
                f"`{command}` did not finish within {timeout_s:.0f} s; output so far:\n"
                f"{(e.stdout or b'')[-3000:]!r}\n{(e.stderr or b'')[-3000:]!r}"
            ) from None
        if check and p.returncode != 0:
            raise RuntimeError(f"`{command}` exited {p.returncode}:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}")
        return p

    def kubectl(self, *args: str, timeout_s: float = 120.0, check: bool = True) -> subprocess.CompletedProcess:
        import shlex

        return self.run("kubectl " + " ".join(shlex.quote(a) for a in args), timeout_s=timeout_s, check=check)
