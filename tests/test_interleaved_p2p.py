"""Megatron's blocking batched p2p on the interleaved schedule (docs/frameworks.md
§1(c)): the call sites, a closed form derived by hand, no deadlock on any small size the
schedule accepts, and never faster than the overlapped sends."""

import pytest

from stepsim.ir.vocabulary import BACKWARD, FORWARD, PP_SEND, RECOMPUTE
from stepsim.run.iteration import run
from stepsim.schedules import build, check
from stepsim.schedules.p2p import Call, Step, megatron_interleaved_calls
from tests.helpers import load

NO_LATENCY = {
    "nvlink_latency_us": 0.0,
    "pcie_latency_us": 0.0,
    "ib_latency_us": 0.0,
    "collective_base_latency_us": 0.0,
}


def _sizes():
    """Every (p, v, m, group) the interleaved schedule accepts for p 2..4, v 2..3, m a
    multiple of p up to 3p: group None (= p) and every other size from p to m that
    divides m (schedules.check)."""
    for p in (2, 3, 4):
        for v in (2, 3):
            for m in (p, 2 * p, 3 * p):
                yield p, v, m, None
                for group in range(p + 1, m + 1):
                    if m % group == 0:
                        yield p, v, m, group


SIZES = list(_sizes())


def _interleaved(p, v, m, mode, group=None, symmetry=True, dp=1):
    training = {
        "schedule": "interleaved",
        "global_batch_size": m * dp,
        "pipeline_p2p": mode,
        "share_embeddings_and_output_weights": False,
    }
    if group is not None:
        training["microbatch_group_size_per_vp_stage"] = group
    return run(
        load(
            model={
                "vocab_size": 16,
                "num_layers": p * v,
                "hidden_size": 256,
                "num_attention_heads": 4,
                "seq_length": 256,
            },
            cluster=NO_LATENCY,
            parallel={
                "pipeline_model_parallel_size": p,
                "virtual_pipeline_model_parallel_size": v,
                "data_parallel_size": dp,
            },
            training=training,
            network={"symmetry": symmetry},
        )
    )


# -- the call sites ---------------------------------------------------------------------


@pytest.mark.parametrize("p, v, m, group", SIZES)
def test_calls_keep_the_order_and_pair_every_send_with_one_receive(p, v, m, group):
    assert check("interleaved", p, m, v, group) is None
    orders = build("interleaved", p, m, v, group)
    calls = megatron_interleaved_calls(orders, v, group)
    sends, receives = [], []
    for rank, items in enumerate(calls):
        assert [x for x in items if isinstance(x, Step)] == orders[rank]
        for call in (x for x in items if isinstance(x, Call)):
            for x in call.transfers:
                step = 1 if x.kind == "F" else -1
                sender = rank if x.direction == "send" else (rank - step) % p
                (sends if x.direction == "send" else receives).append(
                    (sender, x.kind, x.microbatch, x.chunk)
                )
    # every virtual stage boundary crossed once per micro-batch each way
    assert len(sends) == 2 * m * (p * v - 1)
    assert sorted(sends) == sorted(receives)


def test_the_ring_wraps_from_the_last_rank_to_the_first_ranks_next_chunk():
    """p = 2, v = 2, m = 2: rank 0 receives micro-batch 0's activation from rank 1's
    chunk 0 (virtual stage 1) in the call after its second forward, and sends each
    backward's gradient on rank 1 (chunk 1 of rank 0's B0.1 feeds rank 1's B0.0)."""
    rank0, rank1 = megatron_interleaved_calls(build("interleaved", 2, 2, 2), 2)
    calls0 = [x for x in rank0 if isinstance(x, Call)]
    assert [(x.direction, x.kind, x.microbatch, x.chunk) for x in calls0[1].transfers] == [
        ("send", "F", 1, 0),
        ("recv", "F", 0, 0),
    ]
    calls1 = [x for x in rank1 if isinstance(x, Call)]
    assert len(calls0) == len(calls1) == 8  # lockstep: call i meets call i


# -- closed form ------------------------------------------------------------------------


def _pass_s(result, gpu, label):
    return sum(
        s.end_s - s.start_s
        for s in result.trace.spans
        if s.gpu == gpu
        and s.label == label
        and s.stream == "compute"
        and s.kind in (FORWARD, BACKWARD, RECOMPUTE)
    )


def _last_backward_end_s(result, gpu):
    return max(s.end_s for s in result.trace.spans if s.gpu == gpu and s.kind == BACKWARD)


def test_two_ranks_two_chunks_two_microbatches_closed_form():
    """p = 2, v = 2, m = 2 (m == p: every forward is warm-up). Rank 0 holds virtual
    stages 0 and 2 (forward a, c; backward b0, b2), rank 1 stages 1 and 3 (d, e; b1,
    b3); both run F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0; X one transfer.

    Overlapped (a send leaves when its pass ends, a pass waits for its input):
      r1 F0.0 ends D1 = a + X + d; F1.0 ends D2 = max(D1, 2a + X) + d
      r0 F0.1 ends A3 = max(2a, D1 + X) + c; F1.1 ends A4 = max(A3, D2 + X) + c
      r1 F0.1 ends D3 = max(D2, A3 + X) + e; F1.1 ends D4 = max(D3, A4 + X) + e
      r1 B0.1, B1.1 end D5 = D4 + b3, D6 = D5 + b3
      r0 B0.1 ends A5 = max(A4, D5 + X) + b2; B1.1 ends A6 = max(A5, D6 + X) + b2
      r1 B0.0 ends D7 = max(D6, A5 + X) + b1; B1.0 ends D8 = max(D7, A6 + X) + b1
      r0 B0.0 ends A7 = max(A6, D7 + X) + b0; B1.0 ends A8 = max(A7, D8 + X) + b0.
    Batched blocking: the eight calls of rank 0 meet the eight of rank 1 in order, each
    pair ending X after the later lane reaches it, so rank 0's last backward ends at
      a + max(a, d) + max(c, d) + max(c, e) + e + b3 + max(b2, b3) + max(b2, b1)
        + max(b0, b1) + b0 + 8X.
    With uniform F, B and X below both: overlapped 5F + 5B + 6X, blocking 5F + 5B + 8X."""
    runs = {mode: _interleaved(2, 2, 2, mode) for mode in ("overlapped", "batched-blocking")}
    r = runs["overlapped"]
    a, c = _pass_s(r, 0, "F0.0"), _pass_s(r, 0, "F0.1")
    d, e = _pass_s(r, 1, "F0.0"), _pass_s(r, 1, "F0.1")
    b0, b2 = _pass_s(r, 0, "B0.0"), _pass_s(r, 0, "B0.1")
    b1, b3 = _pass_s(r, 1, "B0.0"), _pass_s(r, 1, "B0.1")
    x = next(s.end_s - s.start_s for s in r.trace.spans if s.kind == PP_SEND)
    assert 0 < x < min(a, c, d, e, b0, b1, b2, b3)
    d1 = a + x + d
    d2 = max(d1, 2 * a + x) + d
    a3 = max(2 * a, d1 + x) + c
    a4 = max(a3, d2 + x) + c
    d3 = max(d2, a3 + x) + e
    d4 = max(d3, a4 + x) + e
    d5 = d4 + b3
    d6 = d5 + b3
    a5 = max(a4, d5 + x) + b2
    a6 = max(a5, d6 + x) + b2
    d7 = max(d6, a5 + x) + b1
    d8 = max(d7, a6 + x) + b1
    a7 = max(a6, d7 + x) + b0
    a8 = max(a7, d8 + x) + b0
    assert _last_backward_end_s(r, 0) == pytest.approx(a8, rel=1e-9)
    blocking = (
        a
        + max(a, d)
        + max(c, d)
        + max(c, e)
        + e
        + b3
        + max(b2, b3)
        + max(b2, b1)
        + max(b0, b1)
        + b0
        + 8 * x
    )
    assert _last_backward_end_s(runs["batched-blocking"], 0) == pytest.approx(blocking, rel=1e-9)


# -- no deadlock, never faster ----------------------------------------------------------


@pytest.mark.parametrize("p, v, m, group", SIZES)
def test_blocking_interleaved_never_deadlocks_and_is_never_faster(p, v, m, group):
    """Every accepted small size runs to the end in symmetric and exact mode (the engine
    raises DeadlockError otherwise), both give the same time, and waiting for the
    partner's call never makes the iteration shorter than the overlapped sends."""
    symmetric = _interleaved(p, v, m, "batched-blocking", group, symmetry=True, dp=2)
    exact = _interleaved(p, v, m, "batched-blocking", group, symmetry=False, dp=2)
    overlapped = _interleaved(p, v, m, "overlapped", group, symmetry=True, dp=2)
    blocking_s = symmetric.metrics.iteration_time_s
    assert exact.metrics.iteration_time_s == pytest.approx(blocking_s, rel=1e-9)
    assert blocking_s >= overlapped.metrics.iteration_time_s * (1 - 1e-12)
