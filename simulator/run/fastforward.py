"""The steady-state fast-forward: a long pipeline from a short one, with a proof.

A pipeline schedule's steady state repeats: under 1F1B each stage runs one forward and
one backward per micro-batch, under Megatron's interleaving a group of micro-batches per
round. `fast_forward` simulates the scenario with a few micro-batches, ``m'`` (warm-up,
some steady periods, cool-down), proves that the simulation repeats, and adds the
``k = (m - m') / q`` periods of ``q`` micro-batches it left out. The proof, in three
checks (docs/design.md, "The steady-state fast-forward"):

1. **The schedule inserts periods.** Each rank's passes (and framework p2p calls) for
   ``m`` are those for ``m'`` with ``k`` copies of one period inserted, micro-batches
   renumbered, and the lowering of ``m' + q`` micro-batches is that of ``m'`` with one
   period of ops inserted on every lane (kinds, durations, FLOPs, transfers, blocking,
   micro-batches, dependencies and collectives' members, moved by one period): from
   position ``b`` of a lane on, ``m' + q``'s ops are ``m'``'s one period later, and
   before position ``a`` they are the same.
2. **The state repeats.** In the simulation of ``m'``, two instants ``T`` and
   ``T + Δ`` a period apart (the starts of consecutive periods on the first lane) have
   equal states (engine/steady.py: every lane's position moved by its period, the ops in
   flight, every pending event and every flow's bytes left and rate, relative to the
   instant; times within 1e-9 of the period, other numbers within 1e-9 relative).
3. **Inside the steady part.** By ``T`` every op before ``b`` has finished, and by
   ``T + Δ`` no op from ``a`` on has started.

Then a run of ``m' + q`` micro-batches is the run of ``m'`` up to ``T + Δ`` (the same ops
have started), from there its state is the one at ``T`` moved by a period and what is
left to run is too, so it goes on as ``m'`` did from ``T``, ``Δ`` later; by induction
``m = m' + k q`` is ``m'`` with ``k`` copies of ``[T, T + Δ)`` inserted at ``T + Δ``.
Everything the metrics read is additive over time: the iteration is ``m'``'s plus
``k Δ``; each lane's seconds per category, FLOPs, transfers and spans are ``m'``'s plus
``k`` times one period's (spans counted by start); each link's bytes likewise, and its
utilization over time is read off the inserted copies. The result's workload and trace
(trace.json) are the ``m'`` run's; the summary says so. The timeline draws the whole
iteration, cutting and copying the ``m'`` run's intervals so (report/timeline.py
`full_iteration`).

Exact mode is fast-forwarded as symmetric mode is (its lanes, a congruent TP group's
collapsed ones included, are the state compared; spans and transfers are counted per
GPU). Not used (the run is simulated in full, as before): perturbations, a custom
schedule, ``network.fast_forward = false``, or when it is not expected to cost less than
the full run (`worth_it`: ``SHORT_COST x m' + ORDERS_COST x m < m``, costs measured by
benchmarks/fastforward_cost.py: from about m = 2.2 m'; schedules that split the
backward, whose proof failed on every large layout measured, from m = 10 m'); and
whenever a check fails (GPipe and looped BFS insert no period, which the orders of
``m' + q`` show before anything is lowered; a schedule whose state never repeats in
``m'``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from operator import itemgetter
from typing import Any, NamedTuple, get_type_hints

import numpy as np

from stepsim.schedules import INTERLEAVED

from ..comm.congruent import copies_of, exact_transfers
from ..cost.orders import stage_orders
from ..emit.p2pcalls import p2p_items
from ..engine.network import NetworkFactory
from ..engine.steady import NotSteady, Snapshot, same, simulate_observed
from ..ir.ops import Lane, Op, Workload
from ..ir.results import FastForward, Trace
from ..ir.vocabulary import CATEGORY_OF_KIND
from ..report.linkstats import Utilization, bytes_by, cumulative_load, link_utilization
from ..report.metrics import Tally, gpu_flops, lane_flops, lane_seconds, num_spans
from ..scenario import Scenario, ScenarioError

# What the fast-forward costs, in micro-batches of the full run it replaces (a full run
# costs a fixed part, which the fast-forward pays too, and one such unit per
# micro-batch): SHORT_COST per micro-batch of the short run m' (the orders and the
# lowerings of m' and m' + q, the insertion check, the observed simulation of m' with
# its snapshots, the proof, the metrics) and ORDERS_COST per micro-batch of m (the
# schedule check builds m's orders). The medians of benchmarks/fastforward_cost.py's
# two columns, 10 layouts x 2 sittings (CPU time, 2-core machine, 2026-11-28; see
# docs/performance.md, "The fast-forward's threshold, measured"): SHORT_COST 2.07
# (1.55 - 2.79), ORDERS_COST 0.059 (0.004 - 0.101). It pays from m = 2.2 m' (1F1B at
# p = 16: m >= 81). (Before the observed simulation ran the engine's own loop and the
# insertion and schedule checks compared item by item, the same measure gave 2.88 and
# 0.069: from m = 3.1 m'.)
SHORT_COST = 2.1
ORDERS_COST = 0.06
# Schedules that split the backward (zero bubble, DualPipe) failed the state check on
# every GPT-3 175B layout measured (zbh1 at p = 8 and 16, zbv at p = 16: within the
# short run a stage keeps up by deferring weight gradients, so the lanes drift), and
# there a try costs 1.5 - 1.8x the full run (benchmarks/fastforward_cost.py). They are
# tried from m >= RISKY_SAVING m' only, the bar of before, where a failed try costs
# about a quarter of the full run and a proved one saves about three quarters.
RISKY_SAVING = 10
# the short run: warm-up and cool-down (WARM_PERIODS pipeline depths of micro-batches,
# times the chunks) and STEADY_PERIODS periods between them. The least that leaves a
# steady part of two periods on every lane: on the 31 layouts of docs/performance.md
# ("The short run shortened") the proof held wherever it held with 2 and 4, and on more.
# Schedules that split the backward drift within so short a run (a stage keeps up by
# deferring weight gradients: zbh1 at p = 4 failed the proof with m' = p + 2, held with
# 2 p + 4): they keep SPLIT_WARM_PERIODS and SPLIT_STEADY_PERIODS.
WARM_PERIODS = 1
STEADY_PERIODS = 2
SPLIT_WARM_PERIODS = 2
SPLIT_STEADY_PERIODS = 4
TIME_TOL = 1e-9  # of the period, for times in the states compared
REL_TOL = 1e-9  # for every other number


class Plan(NamedTuple):
    """A fast-forward that passed the checks: the short scenario's run and the proof."""

    short: Scenario
    workload: Workload
    trace: Trace
    first: Snapshot  # at T
    second: Snapshot  # at T + period
    periods: int  # k
    period_microbatches: int  # q
    lane_period: list[int]  # ops per period on each lane
    lane_end: list[int]  # where the period is inserted on each lane (a)


def with_microbatches(scenario: Scenario, m: int) -> Scenario:
    """The scenario with ``m`` micro-batches per pipeline (the global batch changed)."""
    tr, par = scenario.training, scenario.parallel
    batch = m * tr.micro_batch_size * par.data_parallel_size
    return replace(scenario, training=replace(tr, global_batch_size=batch))


def periods(scenario: Scenario) -> list[int]:
    """The periods to try, in micro-batches: 1, or the interleaved schedule's
    micro-batch group (its rounds)."""
    tr, p = scenario.training, scenario.parallel.pipeline_model_parallel_size
    if tr.schedule == INTERLEAVED:
        return [tr.microbatch_group_size_per_vp_stage or p]
    return [1]


def short_microbatches(scenario: Scenario, q: int) -> int:
    """m': enough for warm-up, cool-down and a few periods, a multiple of q when q > 1
    (the interleaved schedule's rule), and m - m' a multiple of q."""
    par = scenario.parallel
    depth = par.pipeline_model_parallel_size * par.virtual_pipeline_model_parallel_size
    if scenario.training.split_backward:
        base = SPLIT_WARM_PERIODS * depth + SPLIT_STEADY_PERIODS * q
    else:
        base = WARM_PERIODS * depth + STEADY_PERIODS * q
    return base + (scenario.num_microbatches - base) % q


def expected_cost(
    m: int, m_short: int, short_cost: float = SHORT_COST, orders_cost: float = ORDERS_COST
) -> float:
    """The fast-forward's cost beyond what the full run costs whatever m is, when its
    proof holds, in micro-batches of the full run (where the proof fails the full run
    is paid on top)."""
    return short_cost * m_short + orders_cost * m


def worth_it(
    m: int,
    m_short: int,
    short_cost: float = SHORT_COST,
    orders_cost: float = ORDERS_COST,
    *,
    proof_may_fail: bool = False,
) -> bool:
    """Whether fast-forwarding ``m`` micro-batches by a short run of ``m_short`` is
    expected to cost less than simulating all ``m`` (which costs ``m``); where the proof
    is expected to fail (``proof_may_fail``: a schedule that splits the backward), only
    from `RISKY_SAVING` x ``m_short`` on."""
    if proof_may_fail and m < RISKY_SAVING * m_short:
        return False
    return expected_cost(m, m_short, short_cost, orders_cost) < m


def applies(scenario: Scenario) -> bool:
    """Whether the scenario may be fast-forwarded at all (the checks come after)."""
    return (
        scenario.network.fast_forward is not False
        and not scenario.perturbations
        and scenario.training.custom_orders is None
        and scenario.parallel.pipeline_model_parallel_size > 1
    )


def fast_forward(scenario: Scenario, lower, network: NetworkFactory) -> Plan | None:
    """The proved fast-forward of the scenario, or None (simulate it in full).
    ``lower(scenario)`` lowers a scenario on the run's cluster."""
    if not applies(scenario):
        return None
    m = scenario.num_microbatches
    split = scenario.training.split_backward
    for q in periods(scenario):
        m_short = short_microbatches(scenario, q)
        if not worth_it(m, m_short, proof_may_fail=split):
            continue
        try:  # the short scenarios keep every rule (a schedule may refuse their m)
            short = with_microbatches(scenario, m_short)
            longer = with_microbatches(scenario, m_short + q)
        except ScenarioError:
            continue
        k = (m - m_short) // q
        # the orders of m' + q first, before any lowering: a schedule that inserts no
        # period (GPipe, looped BFS) costs two short orders, not two short lowerings
        if not _orders_insert(short, longer, 1, q):
            continue
        workload = lower(short)
        shape = _insertion(workload, lower(longer), q)
        if shape is None:
            continue
        plan = _prove(short, workload, network, shape, k, q)
        # the full schedule's orders last: some schedules take long to build them
        if plan is not None and _orders_insert(short, scenario, k, q):
            return plan
    return None


# -- 1. the schedule and the lowering insert periods --------------------------------------


def _moved(x: Any, y: Any, by: int) -> bool:
    """Whether schedule item ``y`` is ``x`` with its micro-batches + ``by`` (those of
    -1, none, stay): ``x``'s type and every field equal but a non-negative
    ``microbatch``, which is ``by`` more; a field that is a plain tuple (a p2p Call's
    transfers) element by element, the same way but for the elements' types."""
    if type(x) is not type(y):
        return False
    return _moved_fields(x, y, by)


# a NamedTuple whose fields are all annotated as one of these holds no nested items
_SCALARS = frozenset({int, str, bool, float})
_PLANS: dict[type, tuple[int, bool]] = {}


def _plan(kind: type) -> tuple[int, bool]:
    """A NamedTuple type's microbatch field position (-1: none) and whether every field
    is annotated as a scalar (no nested items to move), found once per type."""
    plan = _PLANS.get(kind)
    if plan is None:
        fields = kind._fields  # type: ignore[attr-defined]  # a NamedTuple's
        try:  # resolved through the type's bases (a subclass has none of its own)
            notes = get_type_hints(kind)
        except Exception:  # noqa: BLE001  # a name it cannot resolve: compared field by field
            notes = {}
        flat = all(notes.get(name) in _SCALARS for name in fields)
        at = fields.index("microbatch") if "microbatch" in fields else -1
        plan = _PLANS[kind] = (at, flat)
    return plan


def _moved_fields(x: Any, y: Any, by: int) -> bool:
    fields = getattr(x, "_fields", None)
    if fields is None:
        return bool(x == y)
    if not isinstance(y, tuple) or len(x) != len(y):
        return False
    at, flat = _plan(type(x))
    if flat:  # the fields compared as slices (in C), the micro-batch moved
        if at < 0:
            return bool(x == y)
        mine = x[at]
        if (mine + by if mine >= 0 else mine) != y[at]:
            return False
        return bool(x[:at] == y[:at] and x[at + 1 :] == y[at + 1 :])
    for name, value, other in zip(fields, x, y, strict=True):
        if name == "microbatch" and value >= 0:
            if value + by != other:
                return False
        elif type(value) is tuple:
            if not isinstance(other, tuple) or len(value) != len(other):
                return False
            for u, w in zip(value, other, strict=True):
                if not _moved_fields(u, w, by):
                    return False
        elif value != other:
            return False
    return True


def _orders_insert(short: Scenario, full: Scenario, k: int, q: int) -> bool:
    """Whether each rank's items for ``full`` are ``short``'s with k periods inserted."""
    for a_items, b_items in zip(
        p2p_items(short, stage_orders(short)), p2p_items(full, stage_orders(full)), strict=True
    ):
        extra = len(b_items) - len(a_items)
        if extra <= 0 or extra % k:
            return False
        n = extra // k
        a = 0
        while a < len(a_items) and _moved(a_items[a], b_items[a], 0):
            a += 1
        if a < n:
            return False
        period = a_items[a - n : a]
        for i in range(1, k + 1):
            block = b_items[a + (i - 1) * n : a + i * n]
            by = i * q
            if not all(_moved(x, y, by) for x, y in zip(period, block, strict=True)):
                return False
        rest = b_items[a + k * n :]
        by = k * q
        if not all(_moved(x, y, by) for x, y in zip(a_items[a:], rest, strict=True)):
            return False
    return True


# what the engine reads of an op besides its micro-batch, deps and collective, as the
# op's fields (by position: itemgetter builds the tuple in C)
_READ = itemgetter(
    *(Op._fields.index(f) for f in ("kind", "duration_s", "transfer", "blocking", "flops"))
)


def _where(workload: Workload) -> list[tuple[int, int]]:
    """Each op's (lane, position on it)."""
    where = [(0, 0)] * len(workload.ops)
    for lane in workload.lanes:
        i = lane.index
        for position, index in enumerate(lane.ops):
            where[index] = (i, position)
    return where


def _insertion(short: Workload, longer: Workload, q: int) -> tuple[list, list, list] | None:
    """Per lane (ops per period n, where the period is inserted a, where the shifted
    part begins b) if ``longer`` is ``short`` with one period inserted, else None.

    Ops compare on what the engine reads of them: kind, duration, transfer, blocking,
    FLOPs, micro-batch (-1 for none), each dep and the collective's first member named
    by (lane, position). Before a, a lane's ops in both are the same; from b on, the
    longer lane's ops are the short one's n later, with micro-batches + q and the ops
    they name moved by their lanes' n; b <= a - n, so the two cover the longer lane."""
    if [lane[1:5] for lane in short.lanes] != [lane[1:5] for lane in longer.lanes]:
        return None
    n = [len(b.ops) - len(a.ops) for a, b in zip(short.lanes, longer.lanes, strict=True)]
    if min(n) < 0 or n[0] == 0:
        return None
    here_where, there_where = _where(short), _where(longer)
    short_ops, longer_ops = short.ops, longer.ops

    def same(x: Op, y: Op, shift: int, later: bool) -> bool:
        """Whether ``y`` is ``x`` with micro-batches + ``shift`` and, if ``later``,
        the ops ``x`` names one period later (moved by their lanes' n)."""
        if _READ(x) != _READ(y):
            return False
        mx, my = x.microbatch, y.microbatch
        if (mx + shift if mx >= 0 else -1) != (my if my >= 0 else -1):
            return False
        if x.deps or y.deps:
            if len(x.deps) != len(y.deps):
                return False
            for d, e in zip(x.deps, y.deps, strict=True):
                if named(d, later) != there_where[e]:
                    return False
        rx, ry = x.rendezvous, y.rendezvous
        if rx < 0 and ry < 0:
            return True
        return rx >= 0 and ry >= 0 and named(rx, later) == there_where[ry]

    def named(index: int, later: bool) -> tuple[int, int]:
        lane, position = here_where[index]
        return (lane, position + n[lane]) if later else (lane, position)

    ends, starts = [], []
    for lane, there_lane in zip(short.lanes, longer.lanes, strict=True):
        here = [short_ops[i] for i in lane.ops]
        there = [longer_ops[i] for i in there_lane.ops]
        moved = n[lane.index]
        a = 0
        while a < len(here) and same(here[a], there[a], 0, False):
            a += 1
        b = len(here)
        while b > 0 and same(here[b - 1], there[b - 1 + moved], q, True):
            b -= 1
        if b > a - moved:  # the two descriptions must cover the longer lane
            return None
        ends.append(a)
        starts.append(b)
    return n, ends, starts


# -- 2. and 3. the state repeats, inside the steady part ----------------------------------


def _prove(
    short: Scenario, workload: Workload, network: NetworkFactory, shape, k: int, q: int
) -> Plan | None:
    n, ends, starts = shape
    lane0 = workload.lanes[0]
    first = ends[0] - n[0] * ((ends[0] - starts[0]) // n[0])
    triggers = [lane0.ops[pos] for pos in range(first, ends[0], n[0])]
    try:
        trace, snapshots, start_s, end_s = simulate_observed(workload, network, triggers)
    except NotSteady:
        return None
    # per lane, when its ops before b have all finished, and when its op a starts
    settled = []
    for lane, b in zip(workload.lanes, starts, strict=True):
        settled.append(max((end_s[i] for i in lane.ops[:b]), default=0.0))
    leaves = [
        start_s[lane.ops[a]] if a < len(lane.ops) else math.inf
        for lane, a in zip(workload.lanes, ends, strict=True)
    ]
    for one, two in zip(snapshots, snapshots[1:], strict=False):
        period_s = two.time_s - one.time_s
        if any(x + d != y for x, d, y in zip(one.positions, n, two.positions, strict=True)):
            continue
        if max(settled) > one.time_s or min(leaves) <= two.time_s:
            continue
        if same(one.state, two.state, TIME_TOL * period_s, REL_TOL):
            return Plan(short, workload, trace, one, two, k, q, n, ends)
    return None


# -- the metrics of the full run ---------------------------------------------------------


def tally(plan: Plan) -> Tally:
    """The full run's `Tally`: the short run's plus k periods of [T, T + period)."""
    trace, k = plan.trace, plan.periods
    t0, t1 = plan.first.time_s, plan.second.time_s
    seconds = lane_seconds(trace)
    window: dict[tuple[int, str], dict[str, float]] = {key: {} for key in seconds}
    # spans counted once per GPU (a collapsed TP group's lane: once per rank)
    copies = copies_of(trace.lanes)
    spans = num_spans(trace)
    spans_in = 0
    for span in trace.spans:
        start = span.start_s
        if t0 < start <= t1:
            spans_in += copies.get(span.gpu, 1)
        inside = _clipped(start, span.end_s, t0, t1)
        if inside is None:
            continue
        totals = window.get((span.gpu, span.stream))
        if totals is not None:
            category = CATEGORY_OF_KIND[span.kind]
            totals[category] = totals.get(category, 0.0) + inside[1] - inside[0]
    for key, totals in window.items():
        for category, s in totals.items():
            seconds[key][category] += k * s
    workload = plan.workload

    def flops_of(lane: Lane) -> tuple[float, float]:
        """The lane's FLOPs in the short run plus k periods of its own."""
        a, n = plan.lane_end[lane.index], plan.lane_period[lane.index]
        lane_hw, lane_model = lane_flops(workload, lane)
        period_hw, period_model = lane_flops(workload, lane, range(a - n, a))
        return lane_hw + k * period_hw, lane_model + k * period_model

    hardware, model = gpu_flops(workload, flops_of)
    # a period's transfers: those started in the window, and for exact mode's collapsed
    # TP groups the other ranks' of the period's ops (comm/congruent.py)
    started = plan.second.num_transfers - plan.first.num_transfers
    period = exact_transfers(
        workload,
        started,
        lambda lane: range(
            plan.lane_end[lane.index] - plan.lane_period[lane.index], plan.lane_end[lane.index]
        ),
    )
    return Tally(
        iteration_s(plan),
        seconds,
        hardware,
        model,
        trace.num_transfers + k * period,
        spans + k * spans_in,
    )


def _clipped(start_s: float, end_s: float, t0: float, t1: float) -> tuple[float, float] | None:
    """The part of [start_s, end_s) inside the period [t0, t1); None if none is."""
    if end_s <= t0 or start_s >= t1:
        return None
    return max(start_s, t0), min(end_s, t1)


def iteration_s(plan: Plan) -> float:
    return plan.trace.end_s + plan.periods * (plan.second.time_s - plan.first.time_s)


def summary(plan: Plan) -> FastForward:
    return FastForward(
        simulated_microbatches=plan.short.num_microbatches,
        period_microbatches=plan.period_microbatches,
        periods_skipped=plan.periods,
        period_s=plan.second.time_s - plan.first.time_s,
        proved_at_s=plan.first.time_s,
    )


def link_loads(plan: Plan, capacities: Sequence[float], bins: int):
    """The full run's utilization per link, and a function giving the chosen links'
    utilization in each of ``bins`` time bins of the full iteration."""
    trace, k = plan.trace, plan.periods
    t0, t1 = plan.first.time_s, plan.second.time_s
    period_s, end_s = t1 - t0, iteration_s(plan)
    clipped = []
    for iv in trace.link_intervals:
        inside = _clipped(iv.start_s, iv.end_s, t0, t1)
        if inside is not None:
            clipped.append(iv._replace(start_s=inside[0], end_s=inside[1]))
    short = link_utilization(trace.link_intervals, capacities, trace.end_s)
    periods = link_utilization(clipped, capacities, 1.0, short.links)
    utilization = Utilization(
        short.links, (short.values * trace.end_s + k * periods.values) / end_s
    )

    def series_of(chosen: list[int]) -> dict[int, np.ndarray]:
        edges = np.linspace(0.0, end_s, bins + 1)
        out = {}
        for link, (times, integral) in cumulative_load(trace.link_intervals, chosen).items():
            at_t0, at_t1 = bytes_by(times, integral, np.array([t0, t1]))
            per_period = at_t1 - at_t0
            before = np.minimum(edges, t1)
            inside = np.clip(edges - t1, 0.0, k * period_s)
            whole = np.minimum(np.floor(inside / period_s), k)
            part = inside - whole * period_s
            after = np.maximum(edges - t1 - k * period_s, 0.0)
            carried = (
                bytes_by(times, integral, before)
                + whole * per_period
                + (bytes_by(times, integral, t0 + part) - at_t0)
                + (bytes_by(times, integral, t1 + after) - at_t1)
            )
            out[link] = np.diff(carried) / (np.diff(edges) * capacities[link])
        return out

    return end_s, utilization, series_of
