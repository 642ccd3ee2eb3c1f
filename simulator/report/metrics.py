"""Numbers from spans: iteration time, throughput, MFU, bubble, breakdown, memory.

Hardware FLOPs are what the GPUs execute, recomputation included (how the
Megatron-LM papers report TFLOP/s); model FLOPs leave recomputation out and
give MFU. Both are summed over the ops of the simulated lanes and multiplied
by the number of GPUs each lane stands for.

The breakdown of a GPU's iteration (its compute stream) adds up to the
iteration time: compute; exposed tensor-parallel communication; exposed
pipeline point-to-point (waiting while an activation or gradient is on the
wire); exposed data-parallel gradient sync; optimizer; idle (waiting for
another stage to produce work, and the tail after the GPU's own optimizer
step). ``bubble_fraction`` is the mean idle share over GPUs. Per stage, the
breakdown is the mean over the stage's GPUs (one lane standing for all of them
in symmetric mode, every GPU in exact mode).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import NamedTuple

from ..comm.congruent import copies_of, per_gpu
from ..ir.ops import Lane, Workload
from ..ir.results import LinkLoad, Metrics, StageMemory, StageMetrics, Trace
from ..ir.units import bytes_to_gib
from ..ir.vocabulary import (
    BREAKDOWN_KEYS,
    CATEGORY_OF_KIND,
    COMPUTE_STREAM,
    IDLE_TIME,
    MODEL_KINDS,
    breakdown_keys,
)
from ..scenario import Scenario
from .labels import assumptions


def compute_lanes(lanes: Sequence[Lane]) -> list[Lane]:
    """One lane per simulated GPU: its compute stream (side lanes carry only transfers).
    A lane simulating a congruent TP group (``copies``, comm/congruent.py) is one
    lane per GPU of it."""
    return [lane for lane in per_gpu(lanes) if lane.stream == COMPUTE_STREAM]


def lane_seconds(trace: Trace) -> dict[tuple[int, str], dict[str, float]]:
    """Seconds per breakdown category (idle excepted) on each simulated GPU's compute
    stream, summed over its spans in trace order (a congruent group's GPUs: its lane's)."""
    by_lane: dict[tuple[int, str], dict[str, float]] = {
        (lane.gpu, lane.stream): defaultdict(float) for lane in compute_lanes(trace.lanes)
    }
    for gpu, stream, kind, _label, _mb, start_s, end_s, _op in trace.spans:
        totals = by_lane.get((gpu, stream))
        if totals is not None:
            totals[CATEGORY_OF_KIND[kind]] += end_s - start_s
    for lane in trace.lanes:
        if lane.copies > 1 and lane.stream == COMPUTE_STREAM:
            totals = by_lane[(lane.gpu, lane.stream)]
            for k in range(1, lane.copies):
                by_lane[(lane.gpu + k, lane.stream)] = totals
    return by_lane


def breakdowns(
    lanes: Sequence[Lane],
    seconds: dict[tuple[int, str], dict[str, float]],
    iteration_s: float,
    keys: Sequence[str] = BREAKDOWN_KEYS,
) -> list[dict[str, float]]:
    """Each compute lane's breakdown from its seconds per category (`lane_seconds`),
    idle filling the rest of the iteration."""
    out = []
    for lane in compute_lanes(lanes):
        totals = seconds[(lane.gpu, lane.stream)]
        row = {key: totals.get(key, 0.0) for key in keys if key != IDLE_TIME}
        row[IDLE_TIME] = max(iteration_s - sum(row.values()), 0.0)
        out.append(row)
    return out


def stage_breakdowns(trace: Trace, keys: Sequence[str] = BREAKDOWN_KEYS) -> list[dict[str, float]]:
    """Seconds per category on each simulated GPU's compute stream, idle filling the rest;
    ``keys``: the categories (vocabulary.breakdown_keys: CP's with context parallelism)."""
    return breakdowns(trace.lanes, lane_seconds(trace), trace.end_s, keys)


def lane_flops(
    workload: Workload, lane: Lane, positions: range | None = None
) -> tuple[float, float]:
    """Hardware and model FLOPs of the lane's ops (or of those at ``positions``)."""
    ops = workload.ops
    lane_hw = lane_model = 0.0
    for index in lane.ops if positions is None else (lane.ops[i] for i in positions):
        op = ops[index]
        flops = op.flops
        lane_hw += flops
        if op.kind in MODEL_KINDS:
            lane_model += flops
    return lane_hw, lane_model


class Tally(NamedTuple):
    """What the metrics read of a simulated iteration: its length, each compute lane's
    seconds per category, FLOPs over every GPU, transfers and spans simulated. `tally`
    reads them off a trace; the steady-state fast-forward extends a shorter run's."""

    iteration_s: float
    seconds: dict[tuple[int, str], dict[str, float]]
    hardware_flops: float
    model_flops: float
    num_transfers: int
    num_spans: int


def tally(
    workload: Workload,
    trace: Trace,
    seconds: dict[tuple[int, str], dict[str, float]] | None = None,
    spans: int | None = None,
) -> Tally:
    """``seconds`` and ``spans``: what `engine.core.simulate_totals` added up while the
    spans ended (the trace then has none); else read off the trace's spans."""
    hardware_flops, model_flops = gpu_flops(workload, lambda lane: lane_flops(workload, lane))
    return Tally(
        trace.end_s,
        lane_seconds(trace) if seconds is None else seconds,
        hardware_flops,
        model_flops,
        trace.num_transfers,
        num_spans(trace) if spans is None else spans,
    )


def gpu_flops(
    workload: Workload, flops_of: Callable[[Lane], tuple[float, float]]
) -> tuple[float, float]:
    """(hardware, model) FLOPs of every GPU: ``flops_of(lane)`` for each lane, times the
    GPUs it stands for and, a congruent group's lane, once per GPU of the group."""
    hardware_flops = model_flops = 0.0
    for lane in workload.lanes:
        lane_hw, lane_model = flops_of(lane)
        for _ in range(lane.copies):  # each GPU of a congruent group, as its own lane
            hardware_flops += lane_hw * lane.stands_for
            model_flops += lane_model * lane.stands_for
    return hardware_flops, model_flops


def spans_per_gpu(trace: Trace) -> list:
    """The trace's spans with a congruent group's lane's (``copies``) given to each GPU
    of the group: each span followed by its copies."""
    copies = copies_of(trace.lanes)
    if not copies:
        return trace.spans
    out = []
    for span in trace.spans:
        out.append(span)
        n = copies.get(span.gpu)
        if n is not None:
            out.extend(span._replace(gpu=span.gpu + k) for k in range(1, n))
    return out


def num_spans(trace: Trace) -> int:
    """The spans recorded, a congruent group's lane's counted once per GPU of it."""
    copies = copies_of(trace.lanes)
    if not copies:
        return len(trace.spans)
    return sum(copies.get(span.gpu, 1) for span in trace.spans)


def _mean_breakdown(lanes: Sequence[Lane], breakdowns: Sequence[dict]) -> dict[str, float]:
    """Mean over GPUs: each lane's breakdown weighted by the GPUs it stands for."""
    weights = [lane.stands_for for lane in lanes]
    total = sum(weights)
    return {
        key: sum(w * row[key] for w, row in zip(weights, breakdowns, strict=True)) / total
        for key in breakdowns[0]
    }


def summarize(
    scenario: Scenario,
    workload: Workload,
    trace: Trace,
    memory: list[StageMemory],
    out_of_memory: str | None = None,
    busiest_links: Sequence[LinkLoad] = (),
    counted: Tally | None = None,
) -> Metrics:
    """The metrics of a simulated iteration; ``out_of_memory`` and ``busiest_links`` are
    what the run found besides (simulator.run); ``counted``: the trace's `tally`, or a
    fast-forward's extension of it."""
    counted = tally(workload, trace) if counted is None else counted
    iteration_s = counted.iteration_s
    num_gpus = scenario.parallel.num_gpus
    hardware_flops, model_flops = counted.hardware_flops, counted.model_flops
    per_gpu = 1.0 / (num_gpus * iteration_s * 1e12) if iteration_s > 0 else 0.0
    hardware_tflops = hardware_flops * per_gpu
    model_tflops = model_flops * per_gpu
    par = scenario.parallel
    expert_comm = scenario.model.moe and par.ep_size * par.etp_size > 1
    rows = breakdowns(
        workload.lanes,
        counted.seconds,
        iteration_s,
        breakdown_keys(par.cp_size > 1, expert_comm, scenario.training.offloaded_layers > 0),
    )
    lanes = compute_lanes(workload.lanes)
    mean = _mean_breakdown(lanes, rows)
    per_stage: dict[int, list[int]] = {}
    for i, lane in enumerate(lanes):
        per_stage.setdefault(lane.stage, []).append(i)
    tokens = scenario.training.global_batch_size * scenario.model.seq_length
    peak = max(memory, key=lambda m: m.total_bytes)
    return Metrics(
        name=scenario.name,
        iteration_time_s=iteration_s,
        hardware_tflops_per_gpu=hardware_tflops,
        model_tflops_per_gpu=model_tflops,
        mfu=model_tflops / scenario.cluster.gpu.peak_tflops,
        bubble_fraction=mean[IDLE_TIME] / iteration_s if iteration_s > 0 else 0.0,
        num_gpus=num_gpus,
        num_microbatches=scenario.num_microbatches,
        tokens_per_s=tokens / iteration_s if iteration_s > 0 else 0.0,
        memory_per_gpu_gib=bytes_to_gib(peak.total_bytes),
        memory_peak_stage=peak.stage,
        gpu_memory_gib=scenario.cluster.gpu.memory_gib,
        calibration=scenario.kernel_constants.source,
        framework=scenario.training.engine_label,
        framework_mechanisms=dict(scenario.training.resolved[1:]),
        breakdown_s=mean,
        stages=tuple(
            StageMetrics(
                stage=stage,
                gpu=lanes[members[0]].gpu,
                stands_for_gpus=sum(lanes[i].stands_for for i in members),
                breakdown_s=_mean_breakdown(
                    [lanes[i] for i in members], [rows[i] for i in members]
                ),
                memory=stage_memory,
            )
            for (stage, members), stage_memory in zip(
                sorted(per_stage.items()), memory, strict=True
            )
        ),
        simulated_transfers=counted.num_transfers,
        simulated_spans=counted.num_spans,
        out_of_memory=out_of_memory,
        busiest_links=tuple(busiest_links),
        calibration_fit=None if scenario.measured is None else scenario.measured.record(),
        assumptions=(
            *assumptions(scenario),
            *(() if out_of_memory is None else ("does not fit in GPU memory, simulated anyway",)),
        ),
    )
