"""Planning: which layouts a model has on a cluster, which fit, and which is fastest.

A *layout* is everything `stepsim search` varies: tensor, pipeline and data
parallel sizes, micro-batch size, pipeline schedule and its chunks, recomputation,
data-parallel sharding and sequence parallelism. The model, the cluster, the
global batch and the network settings come from a base scenario and stay fixed.

A search runs in four steps:

1. enumerate every combination of the search space's values; each is built as a
   Scenario, which runs the scenario's own rules (simulator.scenario.rules), so a
   layout the search keeps is one ``stepsim run`` accepts, and one it rejects is
   counted as invalid;
2. drop those that do not fit in GPU memory (the closed-form model in
   simulator.workload.memory; nothing is simulated);
3. compute a lower bound on each one's iteration time (``iteration_lower_bound_s``):
   the compute its busiest pipeline rank must do, after the first micro-batch's
   forwards reach it and, under its schedule, before the last backward's gradient has
   passed back down the pipeline (the schedule's bubble). Communication and waiting
   only add to it;
4. simulate in rounds of ``ROUND_SIZE`` in order of that bound. After each round the
   k-th best simulated iteration time is a threshold; a layout whose bound is above it
   cannot enter the top k and is *pruned*, not simulated. A round goes to the executor
   longest first (by micro-batches per pipeline), so that workers finish it together.

The global batch is fixed, so tokens per iteration are too: ranking by iteration
time is ranking by throughput. Rounds depend on the candidates alone, never on how
many workers run or in which order results arrive, so every executor (one process,
a local pool, Ray) simulates the same layouts and returns the same ranking; a
result found in an earlier, interrupted search is used instead of simulating again.
"""

from __future__ import annotations

import gc
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from stepsim.schedules import ONE_F_ONE_B

from .. import __version__
from ..ir.results import MetricsRow
from ..ir.units import bytes_to_gib
from ..ir.vocabulary import NO_SHARDING, RECOMPUTE_FULL
from ..scenario import Scenario, ScenarioError, scenario_to_dict
from .bound import Inflight, iteration_lower_bound_s, memory_of
from .planning import apply_layout
from .space import (
    SCHEDULE_BOUND_KEYS,
    Layout,
    SearchSpace,
    divisors,
    layouts,
    pipeline_sizes,
)

ROUND_SIZE = 16  # layouts simulated between two prunings (fixed: results must not
# depend on the number of workers)

SIMULATED, PRUNED, OUT_OF_MEMORY = "simulated", "pruned", "out of memory"


@dataclass(slots=True, kw_only=True)
class Candidate:
    layout: Layout
    scenario: Scenario
    memory_gib: float  # the fullest GPU's total
    bound_s: float  # iteration_lower_bound_s (0 when out of memory: never computed)
    status: str = ""  # SIMULATED, PRUNED or OUT_OF_MEMORY
    metrics: MetricsRow | None = None  # when simulated
    resumed: bool = False  # the metrics came from an earlier search's journal

    @property
    def simulated_metrics(self) -> MetricsRow:
        """The metrics of a candidate the search simulated (status SIMULATED)."""
        assert self.metrics is not None, f"{self.layout.key} was not simulated"
        return self.metrics


@dataclass(slots=True, kw_only=True)
class SearchResult:
    candidates: list[Candidate]
    invalid: dict[str, int] = field(default_factory=dict)  # rule -> layouts it rejected
    top: int = 10
    enumerated: int = 0
    space: SearchSpace | None = None  # what was searched (its memory headroom)

    @property
    def ranked(self) -> list[Candidate]:
        """Simulated layouts, fastest first (ties: by layout key)."""
        done = [c for c in self.candidates if c.status == SIMULATED]
        return sorted(done, key=lambda c: (c.simulated_metrics.iteration_time_s, c.layout.key))

    def count(self, status: str) -> int:
        return sum(1 for c in self.candidates if c.status == status)

    @property
    def num_invalid(self) -> int:
        return sum(self.invalid.values())


def _rule_of(message: str) -> str:
    """The key a loader error names first: what the report groups invalid layouts by."""
    head = message.split(" ", 1)[0]
    return head.split("=", 1)[0] if "=" in head else message.split(":", 1)[0][:60]


def _nothing_valid(
    base: Scenario, space: SearchSpace, invalid: Mapping[str, int], enumerated: int
) -> str:
    """Why a search has no layout to weigh: none uses the whole cluster, or every one
    breaks a rule (the rule that rejected most, with one of its messages)."""
    gpus = base.cluster.num_gpus
    if not enumerated:
        tps = space.tp if space.tp is not None else tuple(divisors(base.cluster.gpus_per_node))
        pps = space.pp if space.pp is not None else tuple(pipeline_sizes(base.model.num_layers))
        return (
            f"search: no layout: no TP in {list(tps)} times PP in {list(pps)} divides the "
            f"cluster's {gpus} GPUs (TP x PP x DP must equal them); give other --tp/--pp"
        )
    rule = max(invalid, key=lambda k: (invalid[k], k))
    example = ""
    for layout in layouts(base, space):  # the first layout that rule rejected, again
        try:
            apply_layout(base, layout)
        except ScenarioError as exc:
            if _rule_of(str(exc)) == rule:
                example = str(exc)
                break
    return (
        f"search: no valid layout: all {enumerated} layouts break a rule, most often "
        f"{rule} ({invalid[rule]}): {example}"
    )


def candidates(base: Scenario, space: SearchSpace) -> tuple[list[Candidate], dict[str, int], int]:
    """(fitting and non-fitting candidates, invalid layouts by rule, number enumerated)."""
    space.check()
    inflight = Inflight()
    capacity = space.usable_gib(base.cluster.gpu.memory_gib)
    found: list[Candidate] = []
    invalid: dict[str, int] = {}
    enumerated = layouts(base, space)
    for layout in enumerated:
        try:
            scenario = apply_layout(base, layout)
        except ScenarioError as exc:
            rule = _rule_of(str(exc))
            invalid[rule] = invalid.get(rule, 0) + 1
            continue
        memory = max(bytes_to_gib(m.total_bytes) for m in memory_of(scenario, inflight))
        if memory > capacity:
            found.append(
                Candidate(
                    layout=layout,
                    scenario=scenario,
                    memory_gib=memory,
                    bound_s=0.0,
                    status=OUT_OF_MEMORY,
                )
            )
            continue
        found.append(
            Candidate(
                layout=layout,
                scenario=scenario,
                memory_gib=memory,
                bound_s=iteration_lower_bound_s(scenario, inflight.shape(scenario)),
            )
        )
    return found, dict(sorted(invalid.items())), len(enumerated)


# An executor simulates a batch of scenarios; it calls back with (index in the batch,
# metrics) as each finishes, in any order.
Done = Callable[[int, MetricsRow], None]
Executor = Callable[[Sequence[Scenario], Done], None]


GC_AFTER_S = 0.2  # a layout that took longer than this leaves enough cycles to collect


def simulate_row(scenario: Scenario) -> MetricsRow:
    """Simulate one layout; its row of scalar metrics and breakdown. Through the totals
    path (`run(spans=False)`: the engine adds spans up instead of keeping them; the
    metrics are the same bit for bit), with the idle split by cause, and with the
    collector run after a large layout: a run leaves its ops and spans in cycles the
    collector was paused for (run.iteration.gc_paused), and a worker that simulates a
    hundred layouts would otherwise hold them all (3.7 GiB on the 175B search; issue 34)."""
    from ..run.iteration import run

    started = time.monotonic()
    row = run(scenario, spans=False).metrics.summary_row()
    if time.monotonic() - started > GC_AFTER_S:
        gc.collect()
    return row


def serial_executor(batch: Sequence[Scenario], done: Done) -> None:
    for i, scenario in enumerate(batch):
        done(i, simulate_row(scenario))


def _work_of(candidate: Candidate) -> int:
    """What a layout's simulation costs, roughly: its micro-batches per pipeline times
    the chunks each rank holds (the passes of one rank)."""
    scenario = candidate.scenario
    return scenario.num_microbatches * scenario.parallel.virtual_pipeline_model_parallel_size


def search(
    base: Scenario,
    space: SearchSpace,
    top: int = 10,
    executor: Executor = serial_executor,
    prune: bool = True,
    known: Mapping[str, MetricsRow] | None = None,
    on_result: Callable[[Candidate, int, int], None] | None = None,
    on_start: Callable[[int, int, int], None] | None = None,
) -> SearchResult:
    """Rank the space's layouts for the base scenario's model and cluster by simulated
    iteration time (see the module notes). ``known`` maps layout keys to metrics from an
    earlier run of the same search (they are not simulated again); ``on_result(candidate,
    i, n)`` is told of each newly simulated layout, the i-th of at most n;
    ``on_start(enumerated, fitting, known)`` once the layouts are weighed, before the
    first simulation (``known``: fitting layouts the earlier run simulated)."""
    if top < 1:
        raise ScenarioError(f"search top={top} must be >= 1")
    found, invalid, enumerated = candidates(base, space)
    if not found:
        raise ScenarioError(_nothing_valid(base, space, invalid, enumerated))
    known = known or {}
    fitting = sorted(
        (c for c in found if c.status != OUT_OF_MEMORY), key=lambda c: (c.bound_s, c.layout.key)
    )
    if on_start is not None:
        on_start(enumerated, len(fitting), sum(c.layout.key in known for c in fitting))
    best: list[float] = []  # simulated iteration times, sorted
    position = 0
    simulated = 0
    while position < len(fitting):
        threshold = best[top - 1] if prune and len(best) >= top else math.inf
        if fitting[position].bound_s > threshold:
            for c in fitting[position:]:
                c.status = PRUNED
            break
        batch = fitting[position : position + ROUND_SIZE]
        position += len(batch)
        todo = []
        for c in batch:
            metrics = known.get(c.layout.key)
            if metrics is not None:
                c.metrics, c.status, c.resumed = metrics, SIMULATED, True
            else:
                todo.append(c)

        def finished(i: int, metrics: MetricsRow, todo: list[Candidate] = todo) -> None:
            nonlocal simulated
            c = todo[i]
            c.metrics, c.status = metrics, SIMULATED
            simulated += 1
            if on_result is not None:
                on_result(c, simulated, len(fitting))

        if todo:
            # longest first (the longest-processing-time rule): the round's last layouts
            # to start are short, so no worker idles long before the next round
            todo.sort(key=_work_of, reverse=True)  # stable: ties keep the bound's order
            executor([c.scenario for c in todo], finished)
        for c in batch:
            if c.status != SIMULATED:
                raise RuntimeError(f"the executor returned no result for {c.layout.key}")
        best = sorted(best + [c.simulated_metrics.iteration_time_s for c in batch])
    return SearchResult(
        candidates=found, invalid=invalid, top=top, enumerated=enumerated, space=space
    )


def result_rows(result: SearchResult) -> list[dict[str, Any]]:
    """Every candidate as one flat row (rank 1 = fastest; blank for those not
    simulated), for CSV and Parquet."""
    rank = {id(c): i + 1 for i, c in enumerate(result.ranked)}
    rows = []
    ordered = result.ranked + sorted(
        (c for c in result.candidates if c.status != SIMULATED),
        key=lambda c: (c.status, c.bound_s, c.layout.key),
    )
    metric_keys = list(result.ranked[0].simulated_metrics.row()) if result.ranked else []
    uneven = any(c.layout.uneven for c in ordered)
    for c in ordered:
        row: dict[str, Any] = {"rank": rank.get(id(c)), "layout": c.layout.key}
        row.update(c.layout.as_dict())
        if uneven:  # the columns only a search with uneven splits has
            row["first_layers"] = c.layout.first_layers
            row["last_layers"] = c.layout.last_layers
        row["status"] = c.status
        row["memory_per_gpu_gib"] = c.memory_gib
        row["memory_free_fraction"] = 1.0 - c.memory_gib / c.scenario.cluster.gpu.memory_gib
        row["lower_bound_s"] = c.bound_s if c.status != OUT_OF_MEMORY else None
        metrics = c.metrics.row() if c.metrics is not None else {}
        for key in metric_keys:
            if key not in row:
                row[key] = metrics.get(key)
        rows.append(row)
    return rows


class RuleOfThumb(NamedTuple):
    """Megatron-LM's rule-of-thumb layout beside a search: its metrics, and its rank
    among the simulated layouts (None when the search pruned it)."""

    layout: Layout
    metrics: MetricsRow
    rank: int | None


def rule_of_thumb_entry(
    base: Scenario, result: SearchResult, known: Mapping[str, MetricsRow]
) -> RuleOfThumb | None:
    """The rule of thumb's layout for the base scenario with its metrics: from the search
    when it simulated the layout, from an earlier search's journal, or simulated here.
    None when no layout the rule allows fits."""
    rule = rule_of_thumb(base)
    if rule is None:
        return None
    by_key = {c.layout.key: c for c in result.candidates}
    ranks = {c.layout.key: i + 1 for i, c in enumerate(result.ranked)}
    done = by_key.get(rule.key)
    if done is not None and done.status == SIMULATED:
        metrics = done.simulated_metrics
    else:
        metrics = known.get(rule.key) or simulate_row(apply_layout(base, rule))
    return RuleOfThumb(rule, metrics, ranks.get(rule.key))


# -- the journal: what an interrupted search resumes from -------------------------------

# keys of [training] a layout sets; with the schedule-bound keys, not part of a search's
# identity
LAYOUT_TRAINING_KEYS = (
    "micro_batch_size",
    "schedule",
    "recompute_granularity",
    "data_parallel_sharding",
)


def journal_header(base: Scenario) -> dict[str, Any]:
    """What a search's results depend on besides the layout: the base scenario (layout
    keys aside), its kernel constants and stepsim's version. A journal written under
    another header holds another search's results. As JSON reads it back (tuples as
    lists), so that it compares equal to the header read from the file."""
    raw = scenario_to_dict(base)
    raw.pop("parallel")
    for key in (*LAYOUT_TRAINING_KEYS, *SCHEDULE_BOUND_KEYS):
        raw["training"].pop(key, None)
    raw.pop("name")
    calibration = asdict(base.calibration) if base.calibration is not None else None
    header = {"version": __version__, "scenario": raw, "calibration": calibration}
    if base.measured is not None:  # a fit on measured iterations (absent: older journals match)
        header["measured"] = asdict(base.measured)
    return json.loads(json.dumps(header))


def journal_entry(candidate: Candidate) -> dict[str, Any]:
    """One simulated layout as the journal keeps it (one JSON line)."""
    return {"layout": candidate.layout.key, "row": candidate.simulated_metrics.row()}


def journal_known(entries: Mapping[str, Mapping[str, Any]]) -> dict[str, MetricsRow]:
    """The journal's rows by layout key, as ``search(known=...)`` takes them."""
    return {key: MetricsRow.from_row(row) for key, row in entries.items()}


def fits(base: Scenario, space: SearchSpace) -> list[Candidate]:
    """The space's layouts for the base scenario that fit in GPU memory."""
    found, _, _ = candidates(base, space)
    return [c for c in found if c.status != OUT_OF_MEMORY]


def rule_of_thumb(base: Scenario) -> Layout | None:
    """Megatron-LM's folklore layout (Narayanan et al. 2021, Sec 3.3 takeaways): tensor
    parallelism across the GPUs of a node (the largest size up to a node that the heads
    allow), then the smallest pipeline that fits, data parallelism for the rest;
    1F1B, micro-batch 1, full recomputation, no sharding or sequence parallelism (the
    paper's runs). None when no pipeline size fits."""
    gpn, num_gpus = base.cluster.gpus_per_node, base.cluster.num_gpus
    # TP divides the heads and, as Megatron-Core requires, the K/V groups (GQA)
    tps = [t for t in divisors(gpn) if base.model.query_groups % t == 0]
    tp = max(tps)
    space = SearchSpace(
        tp=(tp,),
        micro_batch=(1,),
        schedules=(ONE_F_ONE_B,),
        recompute=(RECOMPUTE_FULL,),
        sharding=(NO_SHARDING,),
        sequence_parallel=(False,),
    )
    fitting = [c for c in fits(base, space) if num_gpus % (c.layout.tp * c.layout.pp) == 0]
    if not fitting:
        return None
    return min(fitting, key=lambda c: c.layout.pp).layout
