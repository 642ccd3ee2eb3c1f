"""The calibration set as scenarios, simulated and compared with what was measured.

Two tables (copied into scenarios/validation/ with their citations):

- Narayanan et al. 2021 (arXiv 2104.04473) Table 1: GPT models from 1.7B to 1T
  on up to 3,072 A100s, measured TFLOP/s per GPU. The paper counts
  F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) FLOPs per iteration (its eq. 3,
  recomputation included), so the measured iteration time is
  F / (GPUs x TFLOP/s); that is what the simulated iteration is compared with.
- Korthikanti et al. 2022 (arXiv 2205.05198) Table 4: forward and backward time
  of one 22B layer on 8 A100s with TP 8, per recomputation and sequence
  parallelism. Simulated as a one-layer model on one DGX A100; the layer's
  time is the span between the embedding and the output layer on the GPU's
  compute stream (TP collectives included, as in the measurement).

Rows with pipeline parallelism ran the interleaved schedule, with a number of
chunks per stage the paper does not give; ``chunks_for`` states the rule used.
This module reads no files: the loader turns the CSVs into rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import NamedTuple

from ..results import Trace
from ..scenario.loader import scenario_from_dict
from ..scenario.spec import KernelConstants, Scenario
from ..vocabulary import BACKWARD, FORWARD

Row = Mapping[str, str]


class Comparison(NamedTuple):
    id: str
    what: str  # "iteration", "layer forward", "layer backward", "layer total"
    model: str
    setting: str  # the layout or recomputation, for the table
    measured_s: float
    simulated_s: float

    @property
    def error(self) -> float:
        """Signed relative error of the simulation."""
        return self.simulated_s / self.measured_s - 1.0


def chunks_for(layers_per_stage: int) -> int:
    """Interleaved chunks per pipeline stage assumed for Table 1's pipelined rows:
    the fewest above one that divide the stage's layers (2 whenever the count is
    even, as in the paper's Figure 4; 3 for 15 or 3 layers per stage). Fewer
    chunks mean fewer pipeline sends; the paper gives no number."""
    for chunks in range(2, layers_per_stage + 1):
        if layers_per_stage % chunks == 0:
            return chunks
    return 1


def megatron_flops(row: Row) -> float:
    """Narayanan et al. 2021 eq. 3: FLOPs of one iteration, recomputation included."""
    b, s, layers, h, vocab = (
        int(row[key])
        for key in ("global_batch_size", "seq_length", "num_layers", "hidden_size", "vocab_size")
    )
    return 96.0 * b * s * layers * h * h * (1 + s / (6 * h) + vocab / (16 * layers * h))


def megatron_measured_s(row: Row) -> float:
    return megatron_flops(row) / (
        int(row["num_gpus"]) * float(row["measured_tflops_per_gpu"]) * 1e12
    )


def _gpu_preset(name: str) -> str:
    presets = {"A100-SXM4-80GB": "a100-sxm4-80gb", "A100-SXM4-40GB": "a100-sxm4-40gb"}
    if name not in presets:
        raise ValueError(f"gpu={name!r} has no preset here; known: {', '.join(presets)}")
    return presets[name]


def megatron_scenario(
    row: Row, calibration: KernelConstants | None = None, chunks: int | None = None
) -> Scenario:
    """A Table 1 row on DGX A100 nodes: the model, layout and batch of the row, full
    recomputation, the interleaved schedule when pipelined (``chunks_for``, unless
    ``chunks`` says otherwise), gradients all-reduced after the last backward (not
    overlapped), fair-share network."""
    layers, p = int(row["num_layers"]), int(row["pipeline_parallel"])
    if chunks is None:
        chunks = chunks_for(layers // p) if p > 1 else 1
    gpus, per_node = int(row["num_gpus"]), int(row["gpus_per_node"])
    parallel = {
        "tensor_model_parallel_size": int(row["tensor_parallel"]),
        "pipeline_model_parallel_size": p,
        "data_parallel_size": int(row["data_parallel"]),
    }
    if chunks > 1:
        parallel["virtual_pipeline_model_parallel_size"] = chunks
    raw = {
        "name": f"{row['id']} {row['model']}",
        "model": {
            key: int(row[key])
            for key in (
                "num_layers",
                "hidden_size",
                "num_attention_heads",
                "ffn_hidden_size",
                "seq_length",
                "vocab_size",
            )
        },
        "cluster": {
            "node": "dgx-a100",
            "gpu": _gpu_preset(row["gpu"]),
            "num_nodes": gpus // per_node,
        },
        "parallel": parallel,
        "training": {
            "micro_batch_size": int(row["micro_batch_size"]),
            "global_batch_size": int(row["global_batch_size"]),
            "schedule": "interleaved" if chunks > 1 else "1f1b",
            "recompute_granularity": row["recompute"],
        },
        "network": {"model": "fair-share"},
    }
    return _with_calibration(scenario_from_dict(raw), calibration)


def layer_scenario(
    row: Row, calibration: KernelConstants | None = None, async_allreduce: bool = True
) -> Scenario:
    """A Table 4 row: one layer of the row's shape on one DGX A100 node, TP over the
    row's GPUs, one micro-batch. The vocabulary is GPT's 51,200 (the row gives none;
    the embedding and output layer are cut out of the measured span). The async TP
    all-reduce is on: the Megatron-LM of 2022 overlapped it (``async_allreduce``)."""
    t = int(row["tensor_parallel"])
    raw = {
        "name": f"{row['id']} {row['model']}",
        "model": {
            "num_layers": 1,
            "hidden_size": int(row["hidden_size"]),
            "num_attention_heads": int(row["num_attention_heads"]),
            "ffn_hidden_size": 4 * int(row["hidden_size"]),
            "seq_length": int(row["seq_length"]),
            "vocab_size": 51200,
        },
        "cluster": {"node": "dgx-a100", "gpu": _gpu_preset(row["gpu"]), "num_nodes": 1},
        "parallel": {
            "tensor_model_parallel_size": t,
            "pipeline_model_parallel_size": 1,
            "data_parallel_size": 8 // t,
            "sequence_parallel": row["sequence_parallel"] == "yes",
        },
        "training": {
            "micro_batch_size": int(row["micro_batch_size"]),
            "global_batch_size": int(row["micro_batch_size"]) * (8 // t),
            "recompute_granularity": row["recompute"],
            "async_tensor_model_parallel_allreduce": async_allreduce,
        },
        "network": {"model": "fair-share"},
    }
    return _with_calibration(scenario_from_dict(raw), calibration)


def _with_calibration(scenario: Scenario, calibration: KernelConstants | None) -> Scenario:
    if calibration is None:
        return scenario
    return replace(scenario, calibration=calibration)


def layer_times(trace: Trace) -> tuple[float, float]:
    """Forward and backward time of the single layer of a one-layer, one-micro-batch
    run: from the end of the embedding to the start of the output layer, and from
    the end of the output layer's backward to the start of the embedding's."""
    lane = trace.lanes[0]
    spans = sorted(
        (sp for sp in trace.spans if sp.gpu == lane.gpu and sp.stream == lane.stream),
        key=lambda sp: (sp.start_s, sp.end_s),
    )
    forward = [sp for sp in spans if sp.kind == FORWARD]
    backward = [sp for sp in spans if sp.kind == BACKWARD]
    return (
        forward[-1].start_s - forward[0].end_s,
        backward[-1].start_s - backward[0].end_s,
    )


def compare(
    megatron: Sequence[Row],
    layers: Sequence[Row],
    run: Callable[[Scenario], Trace],
    calibration: KernelConstants | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Comparison]:
    """Every row simulated: Table 1 iterations, then Table 4 layer times."""
    out: list[Comparison] = []
    for row in megatron:
        scenario = megatron_scenario(row, calibration)
        if progress:
            progress(scenario.name)
        par = scenario.parallel
        setting = (
            f"TP {par.tensor_model_parallel_size} PP {par.pipeline_model_parallel_size} "
            f"DP {par.data_parallel_size}"
            + (
                f" v={par.virtual_pipeline_model_parallel_size}"
                if par.virtual_pipeline_model_parallel_size > 1
                else ""
            )
        )
        trace = run(scenario)
        out.append(
            Comparison(
                row["id"], "iteration", row["model"], setting, megatron_measured_s(row), trace.end_s
            )
        )
    for row in layers:
        scenario = layer_scenario(row, calibration)
        if progress:
            progress(scenario.name)
        forward_s, backward_s = layer_times(run(scenario))
        setting = f"recompute {row['recompute']}, SP {row['sequence_parallel']}"
        for what, measured_ms, simulated_s in (
            ("layer forward", row["forward_ms"], forward_s),
            ("layer backward", row["backward_ms"], backward_s),
            ("layer total", row["total_ms"], forward_s + backward_s),
        ):
            out.append(
                Comparison(
                    row["id"], what, row["model"], setting, float(measured_ms) / 1e3, simulated_s
                )
            )
    return out


def summary(comparisons: Sequence[Comparison]) -> dict[str, float]:
    """Mean and worst absolute error over the calibration rows: Table 1 iterations and
    Table 4 layer totals (forward and backward alone are shown, not scored)."""
    scored = [c for c in comparisons if c.what in ("iteration", "layer total")]
    errors = [abs(c.error) for c in scored]
    return {
        "rows": len(scored),
        "mean_abs_error": sum(errors) / len(errors) if errors else 0.0,
        "worst_abs_error": max(errors) if errors else 0.0,
    }
