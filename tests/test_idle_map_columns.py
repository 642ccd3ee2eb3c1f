"""The idle map's and the idle split's working parts (run/idlemap.py, run/bubble.py): the
abstract runs kept for a second caller, the spans' order by lane and start, and a
span's step read from its label, each against the plain computation it stands for."""

import numpy as np
import pytest

from stepsim.run import bubble
from stepsim.run.bubble import abstract_runs, free_run, rank_passes, rank_times_of
from stepsim.run.idlemap import LETTERS, _by_lane_then_start, _parts_matched, _PassIndex
from stepsim.schedules import build as build_schedule
from stepsim.schedules.dualpipe import combined_1f1b


def test_the_abstract_runs_kept_are_those_computed_afresh():
    """`abstract_runs` gives `free_run`'s two runs, whether computed or kept; orders that
    differ only in an overlapped pair's mark (equal as steps) are not taken for each
    other, nor are times that differ only in a zero's sign."""
    bubble._KEPT_RUNS.clear()
    orders = build_schedule("1f1b", 4, 8, 1)
    paired = combined_1f1b(orders)
    assert [list(order) for order in paired] == [list(order) for order in orders]
    times = [(1.0, 2.0, 0.0), (1.5, 2.5, 0.0), (1.0, 2.0, 0.0), (1.2, 2.1, 0.0)]
    for each in (orders, paired, orders):
        plans, equal, own = abstract_runs(each, times, num_chunks=1, placement="looped")
        assert plans.passes == [rank_passes(order) for order in each]
        for run, rank_times in zip((equal, own), rank_times_of(times, 1, "looped"), strict=True):
            assert run == free_run(each, rank_times, num_chunks=1, placement="looped")
    assert len(bubble._KEPT_RUNS) == 2
    negative = [(f, b, -0.0) for f, b, _ in times]
    abstract_runs(orders, negative, num_chunks=1, placement="looped")
    assert len(bubble._KEPT_RUNS) == 3
    for _ in range(bubble.KEEP_RUNS + 2):  # no more than KEEP_RUNS kept
        times = [(f + 1.0, b, w) for f, b, w in times]
        abstract_runs(orders, times, num_chunks=1, placement="looped")
    assert len(bubble._KEPT_RUNS) == bubble.KEEP_RUNS


def test_a_deadlock_is_still_an_error():
    """A rank waiting for a backward its neighbour never runs: no run, a ValueError."""
    orders = build_schedule("1f1b", 2, 2, 1)
    broken = [orders[0], [step for step in orders[1] if step.kind != "B"]]
    with pytest.raises(ValueError, match="deadlock"):
        free_run(broken, [(1.0, 2.0, 0.0)] * 2, num_chunks=1, placement="looped")


def test_spans_are_ordered_by_lane_then_start_ties_in_trace_order():
    """The stable sort by lane alone where each lane's starts are in order already, and
    the sort by both where not: the same order as numpy's lexsort, ties kept in order."""
    rng = np.random.default_rng(7)
    lane = rng.integers(0, 5, 400)
    ordered = np.sort(rng.integers(0, 50, 400).astype(float))  # in order, with ties
    shuffled = rng.integers(0, 50, 400).astype(float)
    for start in (ordered, shuffled):
        expected = np.lexsort((start, lane))
        assert _by_lane_then_start(lane, start, 5).tolist() == expected.tolist()


def test_a_spans_step_is_the_first_of_its_label_of_its_kind_and_micro_batch():
    """A label names one step or an overlapped pair (F3&B1); a span takes the chunk of
    the first step of its kind and micro-batch, and none when no step is (a label
    unlike a step's, another micro-batch's)."""
    labels = ["F3", "B1.1", "F3&B1", "x", "F3.1&F3", "B7", "F99999999999999999999"]
    rows = [
        (0, 0, 3, True, 0),  # F3, a forward of micro-batch 3: chunk 0
        (1, 1, 1, True, 1),  # B1.1
        (2, 1, 1, True, 0),  # F3&B1 as the backward of micro-batch 1
        (2, 0, 3, True, 0),  # ... and as the forward of 3
        (2, 0, 1, False, 0),  # ... but no forward of 1
        (3, 0, 3, False, 0),  # no step's label
        (4, 0, 3, True, 1),  # the first that matches
        (5, 0, 7, False, 0),  # a backward's label on a forward span
        (6, 0, 7, False, 0),  # a micro-batch beyond any span's
    ]
    columns = zip(*rows, strict=True)
    label, letter, microbatch, found, chunk = (np.array(c, dtype=np.int64) for c in columns)
    got_found, got_chunk = _parts_matched(labels, label, letter, microbatch)
    assert got_found.tolist() == found.astype(bool).tolist()
    assert got_chunk[got_found].tolist() == chunk[found.astype(bool)].tolist()


def test_the_pass_index_finds_each_steps_pass():
    """Each step of a rank's passes (an overlapped pair's two included) maps to its
    pass's index; steps no pass runs, and micro-batches or chunks beyond the orders',
    to none."""
    orders = combined_1f1b(build_schedule("interleaved", 2, 4, 2))
    passes = [rank_passes(order) for order in orders]
    index = _PassIndex.of(passes)
    for rank, each in enumerate(passes):
        steps = [(k, step) for k, run in enumerate(each) for step in run]
        letter = np.array([LETTERS.index(s.kind) for _, s in steps] + [2, 0, 0, -1])
        microbatch = np.array([s.microbatch for _, s in steps] + [0, 4, 0, 0])
        chunk = np.array([s.chunk for _, s in steps] + [0, 0, 2, 0])
        found = index.of_steps(rank, letter, microbatch, chunk).tolist()
        assert found == [k for k, _ in steps] + [-2] * 4
        assert index.numbers[rank] == len(each)
