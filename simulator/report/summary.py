"""The run summary: what `stepsim run` prints, from a result's typed metrics."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from ..results import Result, StageMetrics
from ..scenario import Scenario
from ..scenario.stages import is_uneven
from ..units import bytes_to_gib
from ..vocabulary import BREAKDOWN_KEYS, CATEGORIES


def layer_counts(scenario: Scenario) -> str:
    """Transformer layers per pipeline rank, runs of equal counts folded:
    ``5, 6 x10, 5`` for BLOOM's split."""
    counts = [
        scenario.rank_layers(r) for r in range(scenario.parallel.pipeline_model_parallel_size)
    ]
    runs = [(c, len(list(group))) for c, group in itertools.groupby(counts)]
    return ", ".join(f"{c} x{n}" if n > 1 else str(c) for c, n in runs)


def summary_text(result: Result) -> str:
    s, m = result.scenario, result.metrics
    par, tr, cl = s.parallel, s.training, s.cluster
    node = f"{cl.node} nodes" if cl.node else f"nodes of {cl.gpus_per_node}"
    used = f"{m.num_gpus} GPUs"
    if m.num_gpus < cl.num_gpus:
        used += f" of {cl.num_gpus}"
    lines = [
        f"stepsim · {s.name}",
        f"  {used} ({cl.num_nodes} {node}, {cl.gpu.name}, {cl.nics_per_node} x "
        f"{cl.nic_gbps:g} Gb/s NICs per node)",
        f"  TP {par.tensor_model_parallel_size} x PP {par.pipeline_model_parallel_size} x "
        f"DP {par.data_parallel_size}"
        + (f" (layers per stage {layer_counts(s)})" if is_uneven(par) else "")
        + (" + sequence parallel" if par.sequence_parallel else "")
        + f" · {m.num_microbatches} micro-batches of {tr.micro_batch_size} per pipeline"
        f" · {tr.schedule}"
        + (
            f" ({par.virtual_pipeline_model_parallel_size} chunks per stage)"
            if par.virtual_pipeline_model_parallel_size > 1
            else ""
        )
        + f" · recompute {tr.recompute_granularity}"
        + (" · overlapped grad reduce" if tr.overlap_grad_reduce else "")
        + f" · {s.network.model} network"
        + ("" if s.network.symmetry else " · exact mode (every GPU simulated)"),
        "",
        f"  iteration time            {m.iteration_time_s:.4g} s",
        f"  throughput                {m.tokens_per_s:,.0f} tokens/s",
        f"  hardware TFLOP/s per GPU  {m.hardware_tflops_per_gpu:.1f}  (recomputation included)",
        f"  model TFLOP/s per GPU     {m.model_tflops_per_gpu:.1f}",
        f"  MFU                       {100 * m.mfu:.1f} %",
        f"  pipeline bubble           {100 * m.bubble_fraction:.1f} % of the iteration",
        f"  memory per GPU            {m.memory_per_gpu_gib:.1f} GiB of "
        f"{m.gpu_memory_gib:g} GiB (peak on stage {m.memory_peak_stage})",
        f"  kernel constants          {m.calibration}",
    ]
    if m.out_of_memory:
        lines.append(f"  WARNING: {m.out_of_memory}")
    iteration = m.iteration_time_s
    lines += ["", "  where the time goes, mean per GPU      seconds       %"]
    for category in CATEGORIES:
        value = m.breakdown_s[category.key]
        share = 100 * value / iteration if iteration else 0.0
        lines.append(f"    {category.label:<34}{value:>10.4g}{share:>8.1f}")
    lines += ["", _stage_table(m.stages)]
    if m.busiest_links:
        lines += ["", "  busiest links (mean utilization over the iteration)"]
        for link in m.busiest_links:
            lines.append(
                f"    {100 * link.utilization:5.1f} %  {link.gbytes:>10.3g} GB  "
                f"{link.kind:<7}{link.link}"
            )
    return "\n".join(lines)


def _stage_table(stages: Sequence[StageMetrics]) -> str:
    head = "  per stage (seconds)  " + "".join(f"{k:>10}" for k in BREAKDOWN_KEYS) + "   mem GiB"
    rows = [head]
    shown = list(stages) if len(stages) <= 12 else [*stages[:5], None, *stages[-5:]]
    for stage in shown:
        if stage is None:
            rows.append("    ...")
            continue
        values = "".join(f"{stage.breakdown_s[k]:>10.3g}" for k in BREAKDOWN_KEYS)
        rows.append(
            f"    stage {stage.stage:<3} x{stage.stands_for_gpus:<5}  {values}"
            f"{bytes_to_gib(stage.memory.total_bytes):>10.1f}"
        )
    return "\n".join(rows)
