"""The calibration set as scenarios, simulated and compared with what was measured.

Four tables, three GPUs (copied into scenarios/validation/ with their citations):

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

- the Megatron-LM README's DGX-2 table (2020): 1B..8B GPT models on one DGX-2
  (16 x V100 SXM3 32 GB), TP 1..8, iteration times as printed.
- Megatron-Core r0.8.0's H100 weak-scaling table (NVIDIA/Megatron-LM README,
  2024): per-GPU model TFLOP/s, compared as stepsim's model TFLOP/s.

Table 1's pipelined rows follow the ``schedule`` column (NVIDIA's own
reproduction script, examples/sc21/run_table_1.sh): 39B and 1T without
interleaving, the others with the chunks per stage it gives (``chunks_of``).
The H100 table leaves micro-batch, recomputation, sequence parallelism and
interleaving unpublished: ``H100Choices`` states what is assumed and why.
This module reads no files: the loader turns the CSVs into rows.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from stepsim.schedules import INTERLEAVED, ONE_F_ONE_B

from ..ir.results import Trace
from ..ir.vocabulary import (
    BACKWARD,
    FAIR_SHARE,
    FORWARD,
    RECOMPUTE_FULL,
    RECOMPUTE_NONE,
    SHARD_OPTIMIZER,
)
from ..scenario import KernelConstants, Scenario, scenario_from_dict

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


def chunks_of(row: Row) -> int:
    """Interleaved chunks per pipeline stage of a Table 1 row, from its ``schedule``
    column ("... (v=3) ..." for interleaved rows; 1 for "1f1b" and "no pipeline")."""
    match = re.search(r"\(v=(\d+)\)", row["schedule"])
    if match:
        return int(match.group(1))
    if "interleaved" in row["schedule"]:
        raise ValueError(f"row {row['id']}: schedule {row['schedule']!r} gives no (v=N)")
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
    presets = {
        "A100-SXM4-80GB": "a100-sxm4-80gb",
        "A100-SXM4-40GB": "a100-sxm4-40gb",
        "V100-SXM3-32GB": "v100-sxm3-32gb",
    }
    if name not in presets:
        raise ValueError(f"gpu={name!r} has no preset here; known: {', '.join(presets)}")
    return presets[name]


def megatron_scenario(
    row: Row, calibration: KernelConstants | None = None, chunks: int | None = None
) -> Scenario:
    """A Table 1 row on DGX A100 nodes: the model, layout and batch of the row, full
    recomputation, the schedule of the row's ``schedule`` column (``chunks_of``,
    unless ``chunks`` says otherwise), gradients all-reduced after the last backward
    (not overlapped) and accumulated by a separate kernel (no fusion in 2021),
    fair-share network."""
    p = int(row["pipeline_parallel"])
    if chunks is None:
        chunks = chunks_of(row) if p > 1 else 1
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
            "schedule": INTERLEAVED if chunks > 1 else ONE_F_ONE_B,
            "recompute_granularity": row["recompute"],
            # Megatron-LM 2021 had no gradient-accumulation fusion (docs/frameworks.md §8)
            "gradient_accumulation_fusion": False,
            # Table 1 ran NVIDIA's examples/sc21 scripts on the Megatron-LM of 2021
            "framework": "megatron",
            "framework_version": "2021",
        },
        "network": {"model": FAIR_SHARE},
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
            "framework": "megatron",
            "framework_version": "2022",  # Korthikanti et al. 2022's code
        },
        "network": {"model": FAIR_SHARE},
    }
    return _with_calibration(scenario_from_dict(raw), calibration)


def dgx2_scenario(row: Row, calibration: KernelConstants | None = None) -> Scenario:
    """A row of the Megatron-LM README's DGX-2 table: one DGX-2 (16 x V100 SXM3 on
    NVSwitch), the row's TP over the row's GPUs, no pipeline, batch = micro-batch,
    full recomputation (the table's TFLOP/s match eq. 3 with it, per the CSV's
    notes), fp16."""
    raw = {
        "name": f"{row['id']} {row['model']}",
        "model": _model_keys(row),
        "cluster": {"node": "dgx-2", "gpu": _gpu_preset(row["gpu"]), "num_nodes": 1},
        "parallel": {
            "tensor_model_parallel_size": int(row["tensor_parallel"]),
            "pipeline_model_parallel_size": int(row["pipeline_parallel"]),
            "data_parallel_size": int(row["data_parallel"]),
        },
        "training": {
            "micro_batch_size": int(row["micro_batch_size"]),
            "global_batch_size": int(row["global_batch_size"]),
            "recompute_granularity": RECOMPUTE_FULL,
            "gradient_accumulation_fusion": False,  # Megatron-LM 2020: no fusion
            # the README's table is of 2020; the table's oldest version is 2021 (v2.0's
            # p2p was batched and blocking too, and these rows have no pipeline)
            "framework": "megatron",
            "framework_version": "2021",
        },
        "network": {"model": FAIR_SHARE},
    }
    return _with_calibration(scenario_from_dict(raw), calibration)


class H100Choices(NamedTuple):
    """What the Megatron-Core H100 table does not publish, as assumed here.

    Megatron-Core's own GPT recipes of mid-2024 (NeMo 2.0's llm/recipes, Megatron-LM
    examples/gpt3/train_gpt3_175b_distributed.sh) train with micro-batch 1, sequence
    parallelism whenever TP > 1, the distributed optimizer, and no activation
    recomputation (flash attention removes the attention core's activations, which
    selective recomputation was for). Interleaving is not assumed: the layer counts
    per stage of the pipelined rows (42, 23, 16, 12, 7) share no chunk count, so any
    choice would be per row; ``benchmarks/calibrate.py --gpu h100 --sensitivity``
    shows what interleaving and recomputation would change."""

    micro_batch_size: int = 1
    recompute: str = RECOMPUTE_NONE
    sequence_parallel: bool = True
    chunks: int = 1
    # Megatron-Core r0.8.0 (tag core_r0.8.0): megatron/training/arguments.py defaults
    # --transformer-impl to transformer_engine, and pretrain_gpt.py then builds its layers
    # with get_gpt_layer_with_transformer_engine_spec, whose core attention is
    # TEDotProductAttention (megatron/core/transformer/custom_layers/transformer_engine.py,
    # a te.pytorch.DotProductAttention: cuDNN fused or FlashAttention-2 kernels). Not an
    # unpublished choice but what the software does; here so the sensitivity can vary it.
    attention_kernel: str = "flash"
    # unfused only: Megatron's fused softmax (its 2022 rule stops a causal s > 2048 on the
    # kernel's assertion, so an unfused variant at s = 4096 runs PyTorch's softmax)
    masked_softmax_fusion: bool = True
    tp_comm_overlap: bool = True  # the table's notes name --tp-comm-overlap
    # The table gives no precision (its MFU divides by 989.4, the H100's dense peak for
    # fp16 and bf16 alike). Megatron-LM's GPT example at tag core_r0.8.0
    # (examples/gpt3/train_gpt3_175b_distributed.sh) trains with --fp16, which keeps
    # 2-byte gradients and reduces them in fp16; --bf16 would reduce in fp32
    # (arguments.py forces accumulate_allreduce_grads_in_fp32), and E4 (TP 8, 4
    # micro-batches, 48 nodes) then spends 0.32 s exposed in the fp32 reduce-scatter,
    # +16 % against the table (docs/calibration.md, "H100").
    params_dtype: str = "fp16"


def h100_scenario(
    row: Row, calibration: KernelConstants | None = None, choices: H100Choices | None = None
) -> Scenario:
    """A row of Megatron-Core's H100 weak-scaling table on DGX H100 nodes: the row's
    model (feed-forward 4 x hidden), layout and batch; BF16; what the run flags say
    as far as stepsim models it: --overlap-grad-reduce (overlap_grad_reduce),
    --overlap-param-gather with the distributed optimizer (data_parallel_sharding =
    "optimizer"), the TP all-reduce overlapped with the weight-gradient GEMM (async
    TP all-reduce), --tp-comm-overlap (tp_comm_overlap: userbuffers pipelining of the
    SP all-gather / reduce-scatter with the GEMMs), and Transformer Engine's fused
    attention (attention_kernel = "flash"). The rest is ``choices`` (default:
    ``H100Choices()``)."""
    choices = choices or H100Choices()
    t, p = int(row["tensor_parallel"]), int(row["pipeline_parallel"])
    parallel = {
        "tensor_model_parallel_size": t,
        "pipeline_model_parallel_size": p,
        "data_parallel_size": int(row["data_parallel"]),
        "sequence_parallel": choices.sequence_parallel and t > 1,
    }
    chunks = choices.chunks if p > 1 else 1
    if chunks > 1:
        parallel["virtual_pipeline_model_parallel_size"] = chunks
    model = _model_keys(row)
    raw = {
        "name": f"{row['id']} {row['model']}",
        "model": model,
        "cluster": {
            "node": "dgx-h100",
            "num_nodes": int(row["num_gpus"]) // int(row["gpus_per_node"]),
        },
        "parallel": parallel,
        "training": {
            "micro_batch_size": choices.micro_batch_size,
            "global_batch_size": int(row["global_batch_size"]),
            "schedule": INTERLEAVED if chunks > 1 else ONE_F_ONE_B,
            "recompute_granularity": choices.recompute,
            "overlap_grad_reduce": True,
            "data_parallel_sharding": SHARD_OPTIMIZER,
            "overlap_param_gather": True,  # the table's notes: --overlap-param-gather
            "params_dtype": choices.params_dtype,
            "async_tensor_model_parallel_allreduce": True,
            "attention_kernel": choices.attention_kernel,
            "masked_softmax_fusion": choices.masked_softmax_fusion,
            # --tp-comm-overlap (the table's notes); userbuffers overlap SP's collectives
            "tp_comm_overlap": choices.tp_comm_overlap and parallel["sequence_parallel"],
            "framework": "megatron",
            "framework_version": "2024",  # Megatron-Core r0.8.0
        },
        "network": {"model": FAIR_SHARE},
    }
    return _with_calibration(scenario_from_dict(raw), calibration)


def h100_table_flops(row: Row) -> float:
    """The model FLOPs per iteration the H100 table's TFLOP/s are counted with:
    72 B s l h^2 (1 + s/(6h) + V/(12 l h)) (forward + backward, no recomputation;
    the CSV's notes)."""
    b, s, layers, h, vocab = (
        int(row[key])
        for key in ("global_batch_size", "seq_length", "num_layers", "hidden_size", "vocab_size")
    )
    return 72.0 * b * s * layers * h * h * (1 + s / (6 * h) + vocab / (12 * layers * h))


def h100_measured_s(row: Row) -> float:
    """The iteration time the table's model TFLOP/s imply under its own FLOP count."""
    return h100_table_flops(row) / (int(row["num_gpus"]) * float(row["measured_value"]) * 1e12)


def h100_rows(rows: Sequence[Row]) -> list[Row]:
    """The weak-scaling rows (E1..E9); E10/E11 publish an MFU but no layout."""
    return [r for r in rows if r["measured_metric"].startswith("TFLOPs/GPU")]


def _model_keys(row: Row) -> dict[str, int]:
    keys = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size")
    out = {key: int(row[key]) for key in keys}
    if row.get("ffn_hidden_size"):
        out["ffn_hidden_size"] = int(row["ffn_hidden_size"])
    return out


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


# the calibration sets: name -> (title, the GPU preset it ran on)
SETS = {
    "a100": "A100 · Narayanan et al. 2021 Table 1 (megatron 2021 engine) + Korthikanti et al. "
    "2022 Table 4 (megatron 2022)",
    "v100": "V100 · Megatron-LM README 2020, one DGX-2 (megatron 2021 engine)",
    "h100": "H100 · Megatron-Core r0.8.0 weak scaling (2024, megatron 2024 engine)",
}


def _setting(scenario: Scenario) -> str:
    par = scenario.parallel
    out = (
        f"TP {par.tensor_model_parallel_size} PP {par.pipeline_model_parallel_size} "
        f"DP {par.data_parallel_size}"
    )
    if par.virtual_pipeline_model_parallel_size > 1:
        out += f" v={par.virtual_pipeline_model_parallel_size}"
    return out


def compare(
    rows: Mapping[str, Sequence[Row]],
    run: Callable[[Scenario], Any],
    calibrations: Mapping[str, KernelConstants] | None = None,
    progress: Callable[[str], None] | None = None,
    sets: Sequence[str] = tuple(SETS),
) -> dict[str, list[Comparison]]:
    """Every row of each set simulated (``run`` returns a Result), per set: A100 Table 1
    iterations and Table 4 layer times; V100 DGX-2 iterations; H100 iterations as
    model TFLOP/s. ``calibrations`` maps a set to the constants to simulate it with
    (default: the GPU's own)."""
    calibrations = calibrations or {}
    out: dict[str, list[Comparison]] = {}

    def tell(scenario: Scenario) -> None:
        if progress:
            progress(scenario.name)

    def iteration(row: Row, scenario: Scenario, measured_s: float) -> Comparison:
        """A row's measured iteration time against the simulated one."""
        simulated_s = run(scenario).metrics.iteration_time_s
        return Comparison(
            row["id"], "iteration", row["model"], _setting(scenario), measured_s, simulated_s
        )

    if "a100" in sets:
        found = out["a100"] = []
        constants = calibrations.get("a100")
        for row in rows["megatron"]:
            scenario = megatron_scenario(row, constants)
            tell(scenario)
            found.append(iteration(row, scenario, megatron_measured_s(row)))
        for row in rows["layers"]:
            scenario = layer_scenario(row, constants)
            tell(scenario)
            forward_s, backward_s = layer_times(run(scenario).trace)
            setting = f"recompute {row['recompute']}, SP {row['sequence_parallel']}"
            for what, measured_ms, simulated_s in (
                ("layer forward", row["forward_ms"], forward_s),
                ("layer backward", row["backward_ms"], backward_s),
                ("layer total", row["total_ms"], forward_s + backward_s),
            ):
                found.append(
                    Comparison(
                        row["id"],
                        what,
                        row["model"],
                        setting,
                        float(measured_ms) / 1e3,
                        simulated_s,
                    )
                )
    if "v100" in sets:
        found = out["v100"] = []
        for row in rows["dgx2"]:
            scenario = dgx2_scenario(row, calibrations.get("v100"))
            tell(scenario)
            found.append(iteration(row, scenario, float(row["measured_iteration_ms"]) / 1e3))
    if "h100" in sets:
        found = out["h100"] = []
        for row in h100_rows(rows["h100"]):
            scenario = h100_scenario(row, calibrations.get("h100"))
            tell(scenario)
            metrics = run(scenario).metrics
            # compared as model TFLOP/s: the time at which stepsim's model TFLOP/s would
            # equal the table's, i.e. measured / simulated TFLOP/s - 1 is the error
            simulated_tflops = metrics.model_tflops_per_gpu
            found.append(
                Comparison(
                    row["id"],
                    "model TFLOP/s",
                    row["model"],
                    _setting(scenario),
                    h100_measured_s(row),
                    h100_measured_s(row) * float(row["measured_value"]) / simulated_tflops,
                )
            )
    return out


def summary(comparisons: Sequence[Comparison]) -> dict[str, float]:
    """Mean and worst absolute error over one set's scored rows: iterations (or model
    TFLOP/s) and layer totals (a layer's forward and backward alone are shown, not
    scored)."""
    scored = [c for c in comparisons if c.what in ("iteration", "model TFLOP/s", "layer total")]
    errors = [abs(c.error) for c in scored]
    return {
        "rows": len(scored),
        "mean_abs_error": sum(errors) / len(errors) if errors else 0.0,
        "worst_abs_error": max(errors) if errors else 0.0,
    }
