"""Planning: which layouts a model has on a cluster, which fit, and which is fastest.

A *layout* is everything `stepsim search` varies: tensor, pipeline and data
parallel sizes, micro-batch size, pipeline schedule and its chunks, recomputation,
data-parallel sharding and sequence parallelism. The model, the cluster, the
global batch and the network settings come from a base scenario and stay fixed.

A search runs in four steps:

1. enumerate every combination of the search space's values; each is built as a
   Scenario, which runs the loader's own rules (simulator.scenario.rules), so a
   layout the search keeps is one ``stepsim run`` accepts, and one it rejects is
   counted as invalid;
2. drop those that do not fit in GPU memory (the closed-form model in
   simulator.workload.memory; nothing is simulated);
3. compute a lower bound on each one's iteration time (``iteration_lower_bound_s``):
   the compute its busiest pipeline rank must do, after the first micro-batch's
   forwards reach it. Communication, bubbles and waiting only add to it;
4. simulate in rounds of ``ROUND_SIZE`` in order of that bound. After each round the
   k-th best simulated iteration time is a threshold; a layout whose bound is above it
   cannot enter the top k and is *pruned*, not simulated.

The global batch is fixed, so tokens per iteration are too: ranking by iteration
time is ranking by throughput. Rounds depend on the candidates alone, never on how
many workers run or in which order results arrive, so every executor (one process,
a local pool, Ray) simulates the same layouts and returns the same ranking; a
result found in an earlier, interrupted search is used instead of simulating again.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import schedules

from ..scenario.spec import ModelSpec, ParallelConfig, Scenario, ScenarioError, TrainingConfig
from ..vocabulary import DATA_PARALLEL_SHARDING, RECOMPUTE_GRANULARITIES
from ..workload.compute import ComputeModel
from ..workload.memory import StageMemory, output_rank, stage_memory, stage_params_per_rank
from .sweep import result_row

ROUND_SIZE = 16  # layouts simulated between two prunings (fixed: results must not
# depend on the number of workers)
DEFAULT_MICRO_BATCHES = (1, 2, 4, 8)
DEFAULT_SCHEDULES = ("1f1b", "interleaved")
DEFAULT_CHUNKS = (2,)  # chunks per rank for chunked schedules other than ZB-V (always 2)
# training keys that belong to one schedule and go when a layout replaces it (the
# search journal's header leaves them out too)
SCHEDULE_BOUND_KEYS = ("schedule_file", "schedule_placement", "microbatch_group_size_per_vp_stage")


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class Layout:
    tp: int
    pp: int
    dp: int
    micro_batch: int
    schedule: str
    chunks: int  # virtual pipeline size: chunks per rank
    recompute: str
    sharding: str
    sequence_parallel: bool

    @property
    def key(self) -> str:
        """A short name, unique in a search: tp8-pp16-dp8-mb1-1f1b-v1-full-none-sp."""
        sp = "sp" if self.sequence_parallel else "nosp"
        return (
            f"tp{self.tp}-pp{self.pp}-dp{self.dp}-mb{self.micro_batch}-{self.schedule}-"
            f"v{self.chunks}-{self.recompute}-{self.sharding}-{sp}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "micro_batch": self.micro_batch,
            "schedule": self.schedule,
            "chunks": self.chunks,
            "recompute": self.recompute,
            "sharding": self.sharding,
            "sequence_parallel": self.sequence_parallel,
        }

    def overrides(self) -> list[str]:
        """The same layout as `--set` overrides for `stepsim run`."""
        return [
            f"parallel.tensor_model_parallel_size={self.tp}",
            f"parallel.pipeline_model_parallel_size={self.pp}",
            f"parallel.data_parallel_size={self.dp}",
            f"parallel.virtual_pipeline_model_parallel_size={self.chunks}",
            f"parallel.sequence_parallel={str(self.sequence_parallel).lower()}",
            f"training.micro_batch_size={self.micro_batch}",
            f"training.schedule={self.schedule}",
            f"training.recompute_granularity={self.recompute}",
            f"training.data_parallel_sharding={self.sharding}",
        ]


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpace:
    """The values a search tries; None: derived from the model and cluster (tensor
    parallel: the divisors of the GPUs per node; pipeline: the divisors of the layers)."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    micro_batch: tuple[int, ...] = DEFAULT_MICRO_BATCHES
    schedules: tuple[str, ...] = DEFAULT_SCHEDULES
    chunks: tuple[int, ...] = DEFAULT_CHUNKS
    recompute: tuple[str, ...] = RECOMPUTE_GRANULARITIES
    sharding: tuple[str, ...] = ("none", "optimizer")
    sequence_parallel: tuple[bool, ...] = (False, True)

    def check(self) -> None:
        """One-line ScenarioError for a value no layout could take."""
        for name in ("tp", "pp", "micro_batch", "chunks"):
            values = getattr(self, name)
            for value in values or ():
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise ScenarioError(f"search {name}={value!r} must be an integer >= 1")
        for name, values, allowed in (
            ("schedules", self.schedules, tuple(schedules.SCHEDULES)),
            ("recompute", self.recompute, RECOMPUTE_GRANULARITIES),
            ("sharding", self.sharding, DATA_PARALLEL_SHARDING),
        ):
            for value in values:
                if value not in allowed:
                    raise ScenarioError(
                        f"search {name}={value!r} is not one of: {', '.join(allowed)}"
                    )
        for name in ("micro_batch", "schedules", "chunks", "recompute", "sharding"):
            if not getattr(self, name):
                raise ScenarioError(f"search {name} is empty; give at least one value")

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layouts(base: Scenario, space: SearchSpace) -> list[Layout]:
    """Every combination of the space's values that uses the whole cluster (TP x PP x DP
    = its GPUs), in a fixed order. Not yet checked against the loader's rules."""
    num_gpus, gpn = base.cluster.num_gpus, base.cluster.gpus_per_node
    tps = space.tp if space.tp is not None else tuple(divisors(gpn))
    pps = space.pp if space.pp is not None else tuple(divisors(base.model.num_layers))
    out = []
    for tp, pp in itertools.product(sorted(set(tps)), sorted(set(pps))):
        if num_gpus % (tp * pp):
            continue
        dp = num_gpus // (tp * pp)
        for mb, schedule, recompute, sharding, sp in itertools.product(
            sorted(set(space.micro_batch)),
            space.schedules,
            space.recompute,
            space.sharding if dp > 1 else ("none",),
            sorted(set(space.sequence_parallel)) if tp > 1 else (False,),
        ):
            info = schedules.SCHEDULES[schedule]
            if not info.chunked:
                chunk_values: Iterable[int] = (1,)
            elif info.placement == "v":
                chunk_values = (2,)
            else:
                chunk_values = sorted(set(space.chunks))
            if pp == 1 and schedule != "1f1b":
                continue  # with one stage every schedule is the same sequence of passes
            for chunks in chunk_values:
                out.append(
                    Layout(
                        tp=tp,
                        pp=pp,
                        dp=dp,
                        micro_batch=mb,
                        schedule=schedule,
                        chunks=chunks,
                        recompute=recompute,
                        sharding=sharding,
                        sequence_parallel=sp,
                    )
                )
    return out


def apply_layout(base: Scenario, layout: Layout) -> Scenario:
    """The base scenario with this layout, checked by the scenario's rules (building a
    Scenario runs them). A custom schedule's file and orders, and an interleaved
    group, belong to the schedule the layout replaces and go with it."""
    parallel = ParallelConfig(
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        data_parallel_size=layout.dp,
        virtual_pipeline_model_parallel_size=layout.chunks,
        sequence_parallel=layout.sequence_parallel,
    )
    training = _with_schedule(
        base.training,
        micro_batch_size=layout.micro_batch,
        schedule=layout.schedule,
        recompute_granularity=layout.recompute,
        data_parallel_sharding=layout.sharding,
    )
    return replace(base, parallel=parallel, training=training)


def _with_schedule(training: TrainingConfig, **changes: Any) -> TrainingConfig:
    """The training spec with another named schedule: the keys bound to the old one
    (SCHEDULE_BOUND_KEYS and a custom schedule's orders) are cleared."""
    cleared = dict.fromkeys(SCHEDULE_BOUND_KEYS)
    return replace(training, **cleared, custom_orders=None, **changes)


def _one_gpu_layout(base: Scenario, **changes: Any) -> Scenario:
    """The base scenario (with ``changes`` to its other fields) on one GPU, plain
    1F1B, no recomputation or sharding: a layout every model takes, replaced by
    whatever fit or search picks. The other training and network settings stay."""
    training = _with_schedule(
        base.training,
        micro_batch_size=1,
        schedule="1f1b",
        recompute_granularity="none",
        data_parallel_sharding="none",
    )
    parallel = ParallelConfig(
        tensor_model_parallel_size=1, pipeline_model_parallel_size=1, data_parallel_size=1
    )
    return replace(base, parallel=parallel, training=training, **changes)


def with_model(base: Scenario, name: str, layers: int, hidden: int, heads: int) -> Scenario:
    """The base scenario with another model of the GPT shape (ffn 4 x hidden)."""
    from ..scenario.presets import FAMILY_SEQ_LENGTH, FAMILY_VOCAB_SIZE

    model = ModelSpec(
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        ffn_hidden_size=4 * hidden,
        seq_length=FAMILY_SEQ_LENGTH,
        vocab_size=FAMILY_VOCAB_SIZE,
    )
    return _one_gpu_layout(base, name=name, model=model)


def with_nodes(base: Scenario, num_nodes: int) -> Scenario:
    """The base scenario on another number of nodes, its layout reset to one GPU."""
    return _one_gpu_layout(base, cluster=replace(base.cluster, num_nodes=num_nodes))


# -- memory and the lower bound ---------------------------------------------------------


class _Inflight:
    """In-flight activations per rank, cached by what they depend on (the schedule's
    shape), since building the orders is the slow part of the memory model."""

    def __init__(self) -> None:
        self.cache: dict[tuple, list[int]] = {}

    def __call__(self, scenario: Scenario) -> list[int]:
        par, tr = scenario.parallel, scenario.training
        key = (
            tr.schedule,
            par.pipeline_model_parallel_size,
            scenario.num_microbatches,
            par.virtual_pipeline_model_parallel_size,
            tr.microbatch_group_size_per_vp_stage,
        )
        if tr.custom_orders is not None:
            key = (key, tr.custom_orders)
        if key not in self.cache:
            from ..workload.lowering import inflight_per_stage

            self.cache[key] = inflight_per_stage(scenario)
        return self.cache[key]


def memory_of(scenario: Scenario, inflight: Callable[[Scenario], list[int]]) -> list[StageMemory]:
    return [stage_memory(scenario, s, n) for s, n in enumerate(inflight(scenario))]


def iteration_lower_bound_s(scenario: Scenario) -> float:
    """A time no simulation of the scenario can beat (closed form, no simulation).

    A rank's compute stream runs one op at a time, so the iteration lasts at least
    the sum of its compute ops (forwards, backwards, recomputation, weight gradients,
    its embedding or output layer, its optimizer step). Rank s starts nothing before
    the first micro-batch's forward has passed virtual stages 0 .. s-1, held by ranks
    0 .. s-1 under both placements. The bound is the largest of those sums over ranks;
    communication, bubbles and waiting only add to the simulated time.
    """
    model = ComputeModel(scenario)
    layer, extras = model.layer(), model.extras()
    par, tr = scenario.parallel, scenario.training
    p, v = par.pipeline_model_parallel_size, par.virtual_pipeline_model_parallel_size
    m = scenario.num_microbatches
    per_rank = scenario.model.num_layers // p
    per_chunk = per_rank // v
    forward = (layer.attention_forward + layer.mlp_forward).duration_s
    backward = (layer.attention_backward + layer.mlp_backward).duration_s
    recompute = {
        "none": 0.0,
        "selective": layer.attention_core_forward.duration_s,
        "full": forward,
    }[tr.recompute_granularity]
    split = tr.split_backward
    embedding = (
        extras.embedding_forward.duration_s
        + (extras.embedding_weight if split else extras.embedding_backward).duration_s
    )
    output = (extras.output_forward + extras.output_backward).duration_s
    d = par.data_parallel_size
    sharded = d > 1 and tr.data_parallel_sharding in ("optimizer", "full")
    last = output_rank(scenario)
    best = 0.0
    fill = 0.0  # the first micro-batch's forwards on ranks before this one
    for s in range(p):
        busy = m * per_rank * (forward + backward + recompute)
        if s == 0:
            busy += m * embedding
        if s == last:
            busy += m * output
        params = stage_params_per_rank(scenario, s)
        busy += model.optimizer(params / d if sharded else params).duration_s
        best = max(best, fill + busy)
        fill += per_chunk * forward + (extras.embedding_forward.duration_s if s == 0 else 0.0)
    return best


# -- the search -------------------------------------------------------------------------

SIMULATED, PRUNED, OUT_OF_MEMORY = "simulated", "pruned", "out of memory"


@dataclass(slots=True, kw_only=True)
class Candidate:
    layout: Layout
    scenario: Scenario
    memory_gib: float  # the fullest GPU's total
    bound_s: float  # iteration_lower_bound_s (0 when out of memory: never computed)
    status: str = ""  # SIMULATED, PRUNED or OUT_OF_MEMORY
    row: dict[str, Any] | None = None  # sweep-style metrics when simulated
    resumed: bool = False  # the row came from an earlier search's journal


@dataclass(slots=True, kw_only=True)
class SearchResult:
    candidates: list[Candidate]
    invalid: dict[str, int] = field(default_factory=dict)  # rule -> layouts it rejected
    top: int = 10
    enumerated: int = 0

    @property
    def ranked(self) -> list[Candidate]:
        """Simulated layouts, fastest first (ties: by layout key)."""
        done = [c for c in self.candidates if c.status == SIMULATED]
        return sorted(done, key=lambda c: (c.row["iteration_time_s"], c.layout.key))

    def count(self, status: str) -> int:
        return sum(1 for c in self.candidates if c.status == status)

    @property
    def num_invalid(self) -> int:
        return sum(self.invalid.values())


def _rule_of(message: str) -> str:
    """The key a loader error names first: what the report groups invalid layouts by."""
    head = message.split(" ", 1)[0]
    return head.split("=", 1)[0] if "=" in head else message.split(":", 1)[0][:60]


def candidates(base: Scenario, space: SearchSpace) -> tuple[list[Candidate], dict[str, int], int]:
    """(fitting and non-fitting candidates, invalid layouts by rule, number enumerated)."""
    space.check()
    inflight = _Inflight()
    capacity = base.cluster.gpu.memory_gib
    found, invalid = [], {}
    enumerated = layouts(base, space)
    for layout in enumerated:
        try:
            scenario = apply_layout(base, layout)
        except ScenarioError as exc:
            rule = _rule_of(str(exc))
            invalid[rule] = invalid.get(rule, 0) + 1
            continue
        memory = max(m.as_gib()["total"] for m in memory_of(scenario, inflight))
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
                bound_s=iteration_lower_bound_s(scenario),
            )
        )
    return found, dict(sorted(invalid.items())), len(enumerated)


# An executor simulates a batch of scenarios; it calls back with (index in the batch,
# row) as each finishes, in any order.
Executor = Callable[[Sequence[Scenario], Callable[[int, dict[str, Any]], None]], None]


def simulate_row(scenario: Scenario) -> dict[str, Any]:
    """Simulate one layout; the sweep's row of scalar metrics and breakdown."""
    from ..run import run

    return result_row(run(scenario).metrics)


def serial_executor(batch: Sequence[Scenario], done: Callable[[int, dict[str, Any]], None]) -> None:
    for i, scenario in enumerate(batch):
        done(i, simulate_row(scenario))


def search(
    base: Scenario,
    space: SearchSpace,
    top: int = 10,
    executor: Executor = serial_executor,
    prune: bool = True,
    known: Mapping[str, dict[str, Any]] | None = None,
    on_result: Callable[[Candidate, int, int], None] | None = None,
) -> SearchResult:
    """Rank the space's layouts for the base scenario's model and cluster by simulated
    iteration time (see the module notes). ``known`` maps layout keys to rows from an
    earlier run of the same search (they are not simulated again); ``on_result(candidate,
    i, n)`` is told of each newly simulated layout, the i-th of at most n."""
    if top < 1:
        raise ScenarioError(f"search top={top} must be >= 1")
    found, invalid, enumerated = candidates(base, space)
    known = known or {}
    fitting = sorted(
        (c for c in found if c.status != OUT_OF_MEMORY), key=lambda c: (c.bound_s, c.layout.key)
    )
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
            row = known.get(c.layout.key)
            if row is not None:
                c.row, c.status, c.resumed = dict(row), SIMULATED, True
            else:
                todo.append(c)

        def finished(i: int, row: dict[str, Any], todo: list[Candidate] = todo) -> None:
            nonlocal simulated
            c = todo[i]
            c.row, c.status = row, SIMULATED
            simulated += 1
            if on_result is not None:
                on_result(c, simulated, len(fitting))

        if todo:
            executor([c.scenario for c in todo], finished)
        for c in batch:
            if c.status != SIMULATED:
                raise RuntimeError(f"the executor returned no result for {c.layout.key}")
        best = sorted(best + [c.row["iteration_time_s"] for c in batch])
    return SearchResult(candidates=found, invalid=invalid, top=top, enumerated=enumerated)


def result_rows(result: SearchResult) -> list[dict[str, Any]]:
    """Every candidate as one flat row (rank 1 = fastest; blank for those not
    simulated), for CSV and Parquet."""
    rank = {id(c): i + 1 for i, c in enumerate(result.ranked)}
    rows = []
    ordered = result.ranked + sorted(
        (c for c in result.candidates if c.status != SIMULATED),
        key=lambda c: (c.status, c.bound_s, c.layout.key),
    )
    metric_keys = list(result.ranked[0].row) if result.ranked else []
    for c in ordered:
        row: dict[str, Any] = {"rank": rank.get(id(c)), "layout": c.layout.key}
        row.update(c.layout.as_dict())
        row["status"] = c.status
        row["memory_per_gpu_gib"] = c.memory_gib
        row["lower_bound_s"] = c.bound_s if c.status != OUT_OF_MEMORY else None
        for key in metric_keys:
            if key not in row:
                row[key] = c.row.get(key) if c.row is not None else None
        rows.append(row)
    return rows


# -- planning questions -----------------------------------------------------------------

SECONDS_PER_DAY = 86_400.0


def model_params(scenario: Scenario) -> float:
    """Parameters of the whole model (embedding and output layer shared, as on one GPU):
    12 L h^2 + 13 L h + (V + s) h + 2 h for the GPT shape with ffn 4h."""
    return stage_params_per_rank(_one_gpu_layout(scenario), 0)


def fits(base: Scenario, space: SearchSpace) -> list[Candidate]:
    """The space's layouts for the base scenario that fit in GPU memory."""
    found, _, _ = candidates(base, space)
    return [c for c in found if c.status != OUT_OF_MEMORY]


@dataclass(frozen=True, slots=True, kw_only=True)
class FitRow:
    name: str
    params: float
    scenario: Scenario
    num_fitting: int  # layouts of the space that fit
    leanest: Candidate | None  # the fitting layout with the least memory on its fullest GPU


def leanest_of(fitting: Sequence[Candidate]) -> Candidate | None:
    return min(fitting, key=lambda c: (c.memory_gib, c.layout.key), default=None)


def fit_family(base: Scenario, family: str, space: SearchSpace) -> list[FitRow]:
    """Which members of a model family fit on the base scenario's cluster."""
    from ..scenario.presets import MODEL_FAMILIES

    rows = []
    for name, layers, hidden, heads in MODEL_FAMILIES[family]:
        scenario = with_model(base, name, layers, hidden, heads)
        fitting = fits(scenario, space)
        rows.append(
            FitRow(
                name=name,
                params=model_params(scenario),
                scenario=scenario,
                num_fitting=len(fitting),
                leanest=leanest_of(fitting),
            )
        )
    return rows


def min_nodes(base: Scenario, space: SearchSpace, max_nodes: int) -> tuple[int, list[Candidate]]:
    """The fewest nodes (1 .. max_nodes) on which some layout of the space fits the base
    scenario's model, and the layouts that fit there; (0, []) when none does."""
    if max_nodes < 1:
        raise ScenarioError(f"--max-nodes={max_nodes} must be >= 1")
    for n in range(1, max_nodes + 1):
        fitting = fits(with_nodes(base, n), space)
        if fitting:
            return n, fitting
    return 0, []


def rule_of_thumb(base: Scenario) -> Layout | None:
    """Megatron-LM's folklore layout (Narayanan et al. 2021, Sec 3.3 takeaways): tensor
    parallelism across the GPUs of a node (the largest size up to a node that the heads
    allow), then the smallest pipeline that fits, data parallelism for the rest;
    1F1B, micro-batch 1, full recomputation, no sharding or sequence parallelism (the
    paper's runs). None when no pipeline size fits."""
    gpn, num_gpus = base.cluster.gpus_per_node, base.cluster.num_gpus
    tps = [t for t in divisors(gpn) if base.model.num_attention_heads % t == 0]
    tp = max(tps)
    space = SearchSpace(
        tp=(tp,),
        micro_batch=(1,),
        schedules=("1f1b",),
        recompute=("full",),
        sharding=("none",),
        sequence_parallel=(False,),
    )
    fitting = [c for c in fits(base, space) if num_gpus % (c.layout.tp * c.layout.pp) == 0]
    if not fitting:
        return None
    return min(fitting, key=lambda c: c.layout.pp).layout


def scale_scenarios(
    base: Scenario, nodes: Sequence[int], keep: str
) -> list[tuple[int, Scenario | None, str]]:
    """The base layout on each node count, data parallelism taking up the change:
    (nodes, scenario or None, why not). ``keep`` = "global-batch" (strong scaling: the
    same global batch, fewer micro-batches per pipeline as DP grows) or "microbatches"
    (weak scaling: the global batch grows with DP)."""
    if keep not in ("global-batch", "microbatches"):
        raise ScenarioError(f"--keep={keep!r} must be 'global-batch' or 'microbatches'")
    par, tr = base.parallel, base.training
    model_gpus = par.tensor_model_parallel_size * par.pipeline_model_parallel_size
    out = []
    for n in nodes:
        if n < 1:
            raise ScenarioError(f"--nodes value {n} must be >= 1")
        gpus = n * base.cluster.gpus_per_node
        if gpus % model_gpus:
            out.append((n, None, f"{gpus} GPUs are not a multiple of TP x PP = {model_gpus}"))
            continue
        dp = gpus // model_gpus
        training = tr
        if keep == "microbatches":
            gbs = base.num_microbatches * tr.micro_batch_size * dp
            training = replace(tr, global_batch_size=gbs)
        try:
            scenario = replace(
                base,
                cluster=replace(base.cluster, num_nodes=n),
                parallel=replace(par, data_parallel_size=dp),
                training=training,
            )
        except ScenarioError as exc:
            out.append((n, None, str(exc)))
            continue
        out.append((n, scenario, ""))
    return out


def training_time(row: Mapping[str, Any], tokens: float) -> dict[str, float]:
    """Days and GPU-hours to train on ``tokens`` at the row's simulated throughput."""
    seconds = tokens / row["tokens_per_s"]
    return {
        "days": seconds / SECONDS_PER_DAY,
        "gpu_hours": seconds / 3600.0 * row["num_gpus"],
    }


def narayanan_days(
    params: float, tokens: float, num_gpus: int, tflops_per_gpu: float, factor: int = 8
) -> float:
    """Narayanan et al. 2021 Sec 5.1's estimate of end-to-end training time in days,
    8 T P / (n X) with full recomputation (``factor`` 6 without), X in FLOP/s per GPU."""
    return factor * tokens * params / (num_gpus * tflops_per_gpu * 1e12) / SECONDS_PER_DAY


def scale_points(
    entries: Sequence[tuple[int, Scenario | None, str]],
    rows: Sequence[dict[str, Any] | None],
    tokens: float | None,
) -> list[dict[str, Any]]:
    """One point per node count: its row, speedup and scaling efficiency against the
    fewest nodes simulated, and with ``tokens`` the days and GPU-hours."""
    done = [(n, row) for (n, _, _), row in zip(entries, rows, strict=True) if row is not None]
    first = min(done, key=lambda d: d[0]) if done else None
    points = []
    for (nodes, scenario, why), row in zip(entries, rows, strict=True):
        point: dict[str, Any] = {"nodes": nodes, "why": why, "row": row}
        if row is not None and first is not None and scenario is not None:
            speedup = row["tokens_per_s"] / first[1]["tokens_per_s"]
            point.update(
                dp=scenario.parallel.data_parallel_size,
                global_batch=scenario.training.global_batch_size,
                speedup=speedup,
                efficiency=speedup / (nodes / first[0]),
            )
            if tokens is not None:
                point.update(training_time(row, tokens))
        points.append(point)
    return points
