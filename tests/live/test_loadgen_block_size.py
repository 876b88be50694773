"""``dynoplan loadgen`` against workers of another trace block size: refused before any request, in one line.

Real worker and frontend processes on loopback. Both publish the tokens per ``hash_ids`` entry their workers take on
``GET /v1/models`` (a dynoplan extension field, ``trace_block_size``); loadgen compares its ``--trace-block-size``.
Was: every request sent and refused by the frontend (``http_400 ... expected at least ceil(prompt / 16) ids``), exit 1.
"""

from __future__ import annotations

import subprocess

import requests

from tests.live.procs import DYNOPLAN, LiveStack

WORKER_FLAGS = ("--speedup-ratio", "20", "--num-gpu-blocks", "2048", "--block-size", "16", "--trace-block-size", "16")
TRACE = "synthetic:poisson?rate=20&num_requests=5&isl=uniform:100:200&osl=uniform:5:10&seed=1"


def _loadgen(url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    argv = [*DYNOPLAN, "loadgen", "--quiet", "--url", url, "--trace", TRACE, *flags]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def _started(frontend_url: str) -> float:
    """The frontend's ``dynamo_frontend_requests_started_total``, summed over its labels (0 before any series)."""
    lines = requests.get(frontend_url + "/metrics", timeout=5).text.splitlines()
    return sum(float(x.rsplit(" ", 1)[1]) for x in lines if x.startswith("dynamo_frontend_requests_started_total"))


def test_a_trace_block_size_the_workers_do_not_take_is_refused_before_sending():
    with LiveStack() as st:
        w = st.worker("w", *WORKER_FLAGS)
        fe = st.frontend("fe", "--workers", w)
        for url in (fe, w):
            model = requests.get(url + "/v1/models", timeout=5).json()["data"][0]
            assert model["trace_block_size"] == 16
            p = _loadgen(url)  # the default, 512
            assert (p.returncode, p.stdout) == (2, ""), p.stderr
            assert p.stderr == (
                f"dynoplan loadgen: error: --trace-block-size 512: the server at {url} takes hash_ids of 16-token "
                "blocks (its workers' trace_block_size); expected --trace-block-size 16 (a trace file's hash_ids "
                "must have been written in the workers' block size)\n"
            )
        assert _started(fe) == 0  # nothing was sent
        p = _loadgen(fe, "--trace-block-size", "16")
        assert p.returncode == 0, p.stderr
        assert _started(fe) == 5  # the count reads the requests that were sent
        # text prompts carry no hash_ids: no block size to agree on
        p = _loadgen(fe, "--prompt-mode", "text", "--max-requests", "1")
        assert p.returncode in (0, 1) and "--trace-block-size" not in p.stderr, p.stderr


def test_the_published_block_size_is_read_only_from_a_positive_integer_of_the_first_model():
    from mocker.live.loadgen import _published_block_size as read

    ok = b'{"object": "list", "data": [{"id": "m", "trace_block_size": 16}, {"id": "n", "trace_block_size": 64}]}'
    assert read(200, ok) == 16
    assert read(404, ok) is None  # another status: nothing published
    for body in (b"not json", b"[]", b'{"data": []}', b'{"data": [{"id": "m"}]}', b'{"data": ["m"]}'):
        assert read(200, body) is None, body
    for value in (b"true", b"0", b"-16", b"16.0", b'"16"'):  # a bool, not positive, not an integer
        assert read(200, b'{"data": [{"trace_block_size": ' + value + b"}]}") is None, value
