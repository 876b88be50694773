"""The KV router's book of a core, kept per run of engine blocks, against a per-key reference count.

The book (:class:`mocker.routers._RouterWorkerView`) must give the counts a dict {key: bookings} over
every key of every booked prompt would give: its size (``n_blocks``) and, for a new prompt, the keys it does
not hold (``missing_blocks``). The overlap walks over :class:`mocker.kv.manager.BlockRuns` must equal the
key-list walks they replace.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mocker.config import EngineConfig
from mocker.engine import make_engine
from mocker.kv.manager import BlockKvManager, BlockRuns, engine_block_keys, engine_block_runs
from mocker.records import RequestRecord, TraceRequest
from mocker.routers import _Booking, _RouterWorkerView


def _booking(runs: BlockRuns | None, rid: int) -> _Booking:
    """What KvRouter.choose books for a prompt (whole runs, then the partial last run)."""
    bases = [] if runs is None else runs.bases
    tail_base, tail_len = None, 0
    if runs is not None and bases:
        last = runs.n - (len(bases) - 1) * runs.run
        if last != runs.run:
            tail_base, tail_len, bases = bases[-1], last, bases[:-1]
    b = _Booking(bases, tail_base, tail_len, 0, 0)
    b.record = RequestRecord(request_id=rid, arrival_ms=0.0, input_length=0, output_length=1)
    return b


def _missing(view: _RouterWorkerView, b: _Booking, run: int) -> int:
    return view.missing_blocks(b.full_bases, b.tail_base, b.tail_len, run)


def test_book_counts_by_hand():
    # block 64, trace block 512: runs of 8 blocks. Prompt A: ids (1, 2), 1000 tokens -> 15 blocks = run 1 whole
    # + 7 of run 2; prompt B: ids (1, 2), 1024 tokens -> 16 blocks = both runs whole; prompt C: id (1,), 200
    # tokens -> 3 blocks of run 1.
    ra = engine_block_runs((1, 2), 1000, 64)
    rb = engine_block_runs((1, 2), 1024, 64)
    rc = engine_block_runs((1,), 200, 64)
    assert ra is not None and rb is not None and rc is not None
    assert (ra.run, ra.n, rb.n, rc.n) == (8, 15, 16, 3)
    assert ra.bases == rb.bases and rc.bases == ra.bases[:1]
    a, b, c = _booking(ra, 0), _booking(rb, 1), _booking(rc, 2)
    view = _RouterWorkerView()
    assert _missing(view, a, 8) == 15
    view.book(a, 8)
    assert view.n_blocks == 15
    assert _missing(view, b, 8) == 1  # only the 8th block of run 2
    assert _missing(view, c, 8) == 0  # 3 leading blocks of run 1, held whole
    view.book(c, 8)
    view.book(b, 8)
    assert view.n_blocks == 16
    view.check_invariants(8)
    a.record.finish_ms = b.record.finish_ms = 5.0
    view.refresh(8)
    assert view.n_blocks == 3 and [e.record.request_id for e in view.entries] == [2]
    assert _missing(view, a, 8) == 12  # 5 of run 1 + 7 of run 2
    view.check_invariants(8)


@st.composite
def prompts(draw):
    """Prompts over a few shared id prefixes, as (hash_ids, input_length)."""
    family = draw(st.integers(0, 2))
    n_ids = draw(st.integers(1, 4))
    ids = tuple([family] + [10 * family + k for k in range(1, n_ids)])
    return ids, draw(st.integers(1, n_ids * 512))


@settings(max_examples=60, deadline=None)
@given(
    block_size=st.sampled_from([64, 128, 512, 96, 1000]),
    ops=st.lists(st.tuples(st.booleans(), prompts(), st.integers(0, 30)), min_size=1, max_size=25),
)
def test_book_equals_a_per_key_count(block_size, ops):
    view = _RouterWorkerView()
    ref: dict[int, int] = {}  # key -> bookings holding it (the per-key book the runs replace)
    booked: list[tuple[_Booking, list[int]]] = []
    run = 1
    for i, (add, (ids, isl), pick) in enumerate(ops):
        runs = engine_block_runs(ids, isl, block_size)
        assert runs is not None
        keys = runs.key_list()
        assert keys == engine_block_keys(ids, isl, block_size)
        assert all(keys[j] == runs.bases[j // runs.run] + j % runs.run for j in range(len(keys)))
        run = runs.run
        b = _booking(runs, i)
        assert _missing(view, b, run) == sum(1 for k in keys if k not in ref)
        if add or not booked:
            view.book(b, run)
            booked.append((b, keys))
            for k in keys:
                ref[k] = ref.get(k, 0) + 1
        else:
            gone, gone_keys = booked.pop(pick % len(booked))
            gone.record.finish_ms = 1.0
            view.refresh(run)
            for k in gone_keys:
                ref[k] -= 1
                if not ref[k]:
                    del ref[k]
        assert view.n_blocks == len(ref)
        view.check_invariants(run)


@settings(max_examples=40, deadline=None)
@given(
    block_size=st.sampled_from([64, 128, 96]),
    cached=st.lists(prompts(), min_size=1, max_size=4),
    asked=prompts(),
    evict=st.integers(0, 40),
)
def test_block_overlap_over_runs_equals_the_key_walk(block_size, cached, asked, evict):
    kv = BlockKvManager(400)
    for ids, isl in cached:
        keys = engine_block_keys(ids, isl, block_size) or []
        if len(keys) <= kv.available():  # cache the prompt, then free it: its blocks stay (inactive)
            registered = kv.allocate_full_many(keys)
            kv.release(registered, len(keys) - len(registered))
    kv.allocate_private(min(evict, kv.available()))  # evicts the least recently freed blocks first
    runs = engine_block_runs(*asked, block_size)
    assert runs is not None
    assert kv.match_prefix_runs(runs) == kv.match_prefix(runs.key_list())[0]


def test_radix_overlap_over_runs_equals_the_key_walk():
    cfg = EngineConfig.from_mapping({"backend": "sglang", "num_gpu_blocks": 4096})
    core = make_engine(cfg)
    for i, (ids, isl) in enumerate([((1, 2, 3), 1400), ((1, 2), 900), ((7,), 300)]):
        core.add_request(TraceRequest(i, 0.0, isl, 3, ids), 0.0)
    core.advance_until(float("inf"))
    found = []
    for ids, isl in [((1, 2, 3, 4), 2000), ((1, 2), 1024), ((1, 9), 1000), ((7,), 100), ((5,), 512)]:
        runs = engine_block_runs(ids, isl, core.block_size, core.trace_block_size)
        assert runs is not None
        n = core.kv.match_prefix_runs(runs)
        assert n == core.kv.match_prefix(runs.key_list())[0]
        found.append(n)
    # page 1, so hits are tokens. The tree holds the finished prompts: 1400 tokens of (1, 2, 3) (which also
    # covers the 900 of (1, 2)) and 300 of (7,); (1, 9) shares only the first trace block.
    assert found == [1400, 1024, 512, 100, 0]
