"""The Prometheus source over https with a private CA, against a real Prometheus serving TLS
(``--web.config.file`` with ``tls_server_config``) and a CA + server certificate made here with the
``cryptography`` package.

The scraped target is a small exposition server whose frontend counters grow linearly with wall time:
``requests_started_total = 10 * t`` and every histogram's ``_sum = mean * _count`` with ``_count = 10 * t``.
``_sum`` and ``_count`` are scraped together, so the interval means the source reads are exactly the
means written here (ISL 200 tokens, OSL 20 tokens, TTFT 50 ms, ITL 5 ms, duration 0.15 s) whatever
``increase`` extrapolates; the request count is approximate (about 10 req/s x window).
"""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import threading
import time
from pathlib import Path

import pytest
import requests
import yaml

from planner.sources.prometheus import HISTOGRAMS, REQUESTS_STARTED, PrometheusSourceSettings, PrometheusTrafficSource
from tests.infra._proc import free_port, start_process, stop_process, wait_until
from tests.infra.prometheus import prometheus_binary

pytestmark = pytest.mark.integration

MEANS = {"ttft": 0.05, "itl": 0.005, "duration": 0.15, "isl": 200.0, "osl": 20.0}  # Prometheus units (s, tokens)
RATE_RPS = 10.0


def _make_ca(dir_: Path, name: str) -> tuple[Path, object, object]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
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
        .sign(key, hashes.SHA256())
    )
    path = dir_ / f"{name}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path, cert, key


def _server_cert(dir_: Path, ca_cert, ca_key) -> tuple[Path, Path]:  # type: ignore[no-untyped-def]
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    crt, k = dir_ / "server.crt", dir_ / "server.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return crt, k


class _Exposition(http.server.BaseHTTPRequestHandler):
    t0 = time.time()

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        n = RATE_RPS * (time.time() - self.t0)
        lines = [f"# TYPE {REQUESTS_STARTED[:-6]} counter", f'{REQUESTS_STARTED}{{model="mocker"}} {n}']
        for key, metric in HISTOGRAMS.items():
            lines += [
                f"# TYPE {metric} summary",
                f'{metric}_sum{{model="mocker"}} {MEANS[key] * n}',
                f'{metric}_count{{model="mocker"}} {n}',
            ]
        body = ("\n".join(lines) + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def tls_prometheus(tmp_path):
    ca, ca_cert, ca_key = _make_ca(tmp_path, "test-ca")
    other_ca, _, _ = _make_ca(tmp_path, "other-ca")
    crt, key = _server_cert(tmp_path, ca_cert, ca_key)
    exp = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Exposition)
    threading.Thread(target=exp.serve_forever, daemon=True).start()
    (tmp_path / "web.yml").write_text(
        yaml.safe_dump({"tls_server_config": {"cert_file": str(crt), "key_file": str(key)}})
    )
    (tmp_path / "prometheus.yml").write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "500ms", "scrape_timeout": "500ms", "evaluation_interval": "500ms"},
                "scrape_configs": [
                    {"job_name": "frontend", "static_configs": [{"targets": [f"127.0.0.1:{exp.server_address[1]}"]}]}
                ],
            }
        )
    )
    port = free_port()
    log = tmp_path / "prometheus.log"
    proc = start_process(
        [
            prometheus_binary(),
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--web.config.file={tmp_path / 'web.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        log,
    )
    url = f"https://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return requests.get(url + "/-/ready", verify=str(ca), timeout=1).status_code == 200
        except requests.RequestException:
            return False

    try:
        wait_until(ready, 60, "prometheus over https", proc, log)
        yield url, ca, other_ca
    finally:
        stop_process(proc)
        exp.shutdown()
        exp.server_close()


def test_https_source_verifies_with_the_given_ca(tls_prometheus):
    url, ca, other_ca = tls_prometheus
    # plain http against a TLS listener is refused by the server (not a silent zero)
    assert requests.get(url.replace("https", "http") + "/-/ready", timeout=2).status_code == 400
    src = PrometheusTrafficSource(PrometheusSourceSettings(url=url, model="mocker", ca_file=str(ca), timeout_s=2))

    def window():  # type: ignore[no-untyped-def]
        w = src.read(4.0)
        return w if w is not None and w.num_requests > 0 else None

    wait_until(lambda: window() is not None, 30, f"a window over https ({src.last_error})")
    w = window()
    assert w is not None and src.last_error is None
    # means exact (sum and count scraped together), request count about 10 req/s x 4 s
    assert w.mean_isl_tokens == pytest.approx(200.0, rel=1e-9)
    assert w.mean_osl_tokens == pytest.approx(20.0, rel=1e-9)
    assert w.mean_ttft_ms == pytest.approx(50.0, rel=1e-9)
    assert w.mean_itl_ms == pytest.approx(5.0, rel=1e-9)
    assert w.mean_request_duration_s == pytest.approx(0.15, rel=1e-9)
    assert 0 < w.num_requests <= RATE_RPS * 4.0 * 2


def test_https_source_without_or_with_a_wrong_ca_is_unknown_with_a_clear_reason(tls_prometheus):
    url, ca, other_ca = tls_prometheus
    for ca_file in (None, str(other_ca)):  # system CAs, then a CA that did not sign the server's certificate
        src = PrometheusTrafficSource(PrometheusSourceSettings(url=url, model="mocker", ca_file=ca_file, timeout_s=2))
        assert src.read(4.0) is None
        assert src.last_error is not None
        assert "certificate verify failed" in src.last_error, src.last_error
        assert "prometheus.ca_file" in src.last_error, src.last_error
    # the same source object with the right CA answers (verification, not reachability, made the difference)
    good = PrometheusTrafficSource(PrometheusSourceSettings(url=url, model="mocker", ca_file=str(ca), timeout_s=2))
    wait_until(lambda: good.read(4.0) is not None, 30, f"a window over https ({good.last_error})")
