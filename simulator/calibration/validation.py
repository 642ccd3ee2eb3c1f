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


# what a row compares: a time, or (the H100 set) a throughput as its table publishes it
ITERATION = "iteration"
MODEL_TFLOPS = "model TFLOP/s"  # model TFLOP/s per GPU
SECONDS = "s"
TFLOPS = "TFLOP/s"


class Comparison(NamedTuple):
    id: str
    what: str  # ITERATION, "layer forward", "layer backward", "layer total", MODEL_TFLOPS
    model: str
    setting: str
    # the measured time: as published, or from a published throughput by ``time_of_tflops``
    measured_s: float
    simulated_s: float
    published: float  # the figure as its source prints it, in ``published_unit``
    published_unit: str  # "ms", "s" or "TFLOP/s" (model TFLOP/s per GPU)
    simulated_tflops: float | None = None  # MODEL_TFLOPS rows: stepsim's, per GPU

    @property
    def unit(self) -> str:
        """The unit the row is shown and compared in: TFLOP/s for a model TFLOP/s row
        (its measured figure is the published one itself), else seconds."""
        return TFLOPS if self.what == MODEL_TFLOPS else SECONDS

    @property
    def measured(self) -> float:
        """The measured figure in ``unit``."""
        return self.published if self.unit == TFLOPS else self.measured_s

    @property
    def simulated(self) -> float:
        """The simulated figure in ``unit``."""
        if self.unit == TFLOPS:
            assert self.simulated_tflops is not None  # compare() sets it on these rows
            return self.simulated_tflops
        return self.simulated_s

    @property
    def error(self) -> float:
        """Signed relative error of the simulated time: simulated / measured time - 1,
        negative where stepsim is faster. A model TFLOP/s row at the same FLOPs:
        measured / simulated TFLOP/s - 1, the same ratio."""
        if self.unit == TFLOPS:
            return self.measured / self.simulated - 1.0
        return self.simulated_s / self.measured_s - 1.0

    def as_json(self) -> dict[str, Any]:
        """The row for ``validate --json``: the figures in ``unit``, the times, the
        published figure in its own unit and the error."""
        return {
            **self._asdict(),
            "unit": self.unit,
            "measured": self.measured,
            "simulated": self.simulated,
            "error": self.error,
        }


ERROR_CONVENTION = (
    "error = simulated / measured time - 1, negative where stepsim is faster "
    "(a model TFLOP/s row: measured / simulated TFLOP/s - 1, the same ratio)"
)


def time_of_tflops(flops: float, gpus: int, tflops_per_gpu: float) -> float:
    """The iteration time a throughput implies: FLOPs / (GPUs x TFLOP/s per GPU)."""
    return flops / (gpus * tflops_per_gpu * 1e12)


def tflops_of_time(flops: float, gpus: int, time_s: float) -> float:
    """The throughput per GPU an iteration time gives: FLOPs / (GPUs x time), in
    TFLOP/s; ``time_of_tflops`` undone."""
    return flops / (gpus * time_s * 1e12)


class Target(NamedTuple):
    row_abs_error: float  # every scored row's |error| at most this
    mean_abs_error: float  # and the set's mean |error| at most this


# The project's accuracy target per calibration set. README.md states it above its
# validation summary ("target: every row within 8 %, mean at most 4 %"); docs/validation.md
# and validate's verdict lines are written from this constant.
TARGET = Target(row_abs_error=0.08, mean_abs_error=0.04)


def target_text(target: Target = TARGET) -> str:
    """The target in words: "every row within 8 %, mean at most 4 %"."""
    return (
        f"every row within {100 * target.row_abs_error:g} %, "
        f"mean at most {100 * target.mean_abs_error:g} %"
    )


def verdict(errors: Sequence[tuple[str, float]], target: Target = TARGET) -> dict[str, Any]:
    """A set's scored rows, (id, signed error) each, against ``target``: ``met`` when
    every row's |error| is within the row limit and their mean within the mean limit
    (no rows: not met); ``rows_over`` names the rows over the row limit."""
    abs_errors = [abs(e) for _, e in errors]
    mean = sum(abs_errors) / len(abs_errors) if abs_errors else 0.0
    over = [row for row, e in errors if abs(e) > target.row_abs_error]
    mean_met = mean <= target.mean_abs_error
    return {
        "row_abs_error": target.row_abs_error,
        "mean_abs_error": target.mean_abs_error,
        "met": bool(abs_errors) and not over and mean_met,
        "rows_met": not over,
        "mean_met": mean_met,
        "rows_over": over,
    }


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
    """The iteration time a Table 1 row's TFLOP/s per GPU imply under eq. 3."""
    return time_of_tflops(
        megatron_flops(row), int(row["num_gpus"]), float(row["measured_tflops_per_gpu"])
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
    return time_of_tflops(h100_table_flops(row), int(row["num_gpus"]), float(row["measured_value"]))


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

# how a set's published figures become what its rows compare (none: times as published)
CONVERSIONS = {
    "a100": "Table 1 publishes TFLOP/s per GPU; its measured time = 96 B s l h² "
    "(1 + s/6h + V/16lh) / (GPUs × TFLOP/s), the paper's eq. 3 (recomputation counted), "
    "GPUs = TP × PP × DP. Table 4's times are as published.",
    "h100": "The table publishes model TFLOP/s per GPU, compared as such: stepsim's = "
    "72 B s l h² (1 + s/6h + V/12lh) / (GPUs × simulated iteration time), the table's "
    "FLOP count (forward + backward, no recomputation), GPUs = TP × PP × DP.",
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
    run: Callable[[Scenario, bool], Any],
    calibrations: Mapping[str, KernelConstants] | None = None,
    progress: Callable[[str], None] | None = None,
    sets: Sequence[str] = tuple(SETS),
) -> dict[str, list[Comparison]]:
    """Every row of each set simulated (``run(scenario, spans)`` returns a Result, its
    spans kept only where ``spans``: the layer rows read them), per set: A100 Table 1
    iterations and Table 4 layer times; V100 DGX-2 iterations; H100 iterations as
    model TFLOP/s. ``calibrations`` maps a set to the constants to simulate it with
    (default: the GPU's own)."""
    calibrations = calibrations or {}
    out: dict[str, list[Comparison]] = {}

    def tell(scenario: Scenario) -> None:
        if progress:
            progress(scenario.name)

    def iteration(
        row: Row, scenario: Scenario, measured_s: float, published: float, unit: str
    ) -> Comparison:
        """A row's measured iteration time against the simulated one."""
        simulated_s = run(scenario, False).metrics.iteration_time_s
        return Comparison(
            row["id"],
            ITERATION,
            row["model"],
            _setting(scenario),
            measured_s,
            simulated_s,
            published,
            unit,
        )

    if "a100" in sets:
        found = out["a100"] = []
        constants = calibrations.get("a100")
        for row in rows["megatron"]:
            scenario = megatron_scenario(row, constants)
            tell(scenario)
            tflops = float(row["measured_tflops_per_gpu"])
            found.append(iteration(row, scenario, megatron_measured_s(row), tflops, TFLOPS))
        for row in rows["layers"]:
            scenario = layer_scenario(row, constants)
            tell(scenario)
            forward_s, backward_s = layer_times(run(scenario, True).trace)
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
                        float(measured_ms),
                        "ms",
                    )
                )
    if "v100" in sets:
        found = out["v100"] = []
        for row in rows["dgx2"]:
            scenario = dgx2_scenario(row, calibrations.get("v100"))
            tell(scenario)
            printed_ms = float(row["measured_iteration_ms"])
            found.append(iteration(row, scenario, printed_ms / 1e3, printed_ms, "ms"))
    if "h100" in sets:
        found = out["h100"] = []
        for row in h100_rows(rows["h100"]):
            scenario = h100_scenario(row, calibrations.get("h100"))
            tell(scenario)
            # compared as the table publishes it, model TFLOP/s per GPU; the times are
            # the table's FLOPs over GPUs x each throughput (time_of_tflops)
            published = float(row["measured_value"])
            simulated_tflops = run(scenario, False).metrics.model_tflops_per_gpu
            flops, gpus = h100_table_flops(row), int(row["num_gpus"])
            found.append(
                Comparison(
                    row["id"],
                    MODEL_TFLOPS,
                    row["model"],
                    _setting(scenario),
                    time_of_tflops(flops, gpus, published),
                    time_of_tflops(flops, gpus, simulated_tflops),
                    published,
                    TFLOPS,
                    simulated_tflops,
                )
            )
    return out


SCORED = (ITERATION, MODEL_TFLOPS, "layer total")  # what a set's mean and target count


def summary(comparisons: Sequence[Comparison], target: Target = TARGET) -> dict[str, Any]:
    """Mean and worst absolute error over one set's scored rows (``SCORED``: iterations,
    model TFLOP/s and layer totals; a layer's forward and backward alone are shown, not
    scored), and the set against ``target`` (``verdict``)."""
    scored = [c for c in comparisons if c.what in SCORED]
    errors = [abs(c.error) for c in scored]
    return {
        "rows": len(scored),
        "mean_abs_error": sum(errors) / len(errors) if errors else 0.0,
        "worst_abs_error": max(errors) if errors else 0.0,
        "target": verdict([(c.id, c.error) for c in scored], target),
    }
