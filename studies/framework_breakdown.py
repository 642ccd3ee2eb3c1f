"""What each framework's pipeline mechanisms cost on a scenario, per micro-batch and
per iteration (docs/frameworks.md, "MT-NLG and BigScience: deepspeed vs megatron").

    python studies/framework_breakdown.py scenarios/mt-nlg-530b-420nodes.toml
    python studies/framework_breakdown.py scenarios/bigscience-175b-v100.toml

Per micro-batch, from a middle stage's trace: one pipeline transfer each way (data and,
DeepSpeed, its meta message) and the pipeline all-gathers (the receiver's, DeepSpeed's
re-gather of its own output). Per iteration: the iteration time and the mean breakdown
of each variant, each differing from the one above it in one mechanism key.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stepsim.ir.vocabulary import PP_SEND, TP_COMM  # noqa: E402
from stepsim.run.iteration import run  # noqa: E402
from stepsim.scenario import load_scenario  # noqa: E402

# The gradient path pinned to Megatron-LM 2021's values, so that DeepSpeed's engine can
# be walked in one mechanism at a time
_MEGATRON_GRADIENTS = [
    "training.tied_grad_reduce_order=after-dp",
    "training.reduce_bucket_size=0",
    "training.allgather_bucket_size=0",
]
_DS = "training.framework=deepspeed"
# the version named, as the labels do (a scenario naming none runs the newest modelled)
_MEGATRON_2021 = ["training.framework=megatron", 'training.framework_version="2021"']
# (label, overrides), each one mechanism away from the one before
VARIANTS = [
    ("megatron 2021, overlapped p2p", [*_MEGATRON_2021, "training.pipeline_p2p=overlapped"]),
    ("megatron 2021 (its defaults: batched-blocking p2p)", _MEGATRON_2021),
    (
        "deepspeed 0.5.4 with Megatron's p2p, no re-gather, Megatron's gradient path",
        [
            _DS,
            "training.pipeline_p2p=batched-blocking",
            "training.pipeline_regather_output=false",
            *_MEGATRON_GRADIENTS,
        ],
    ),
    (
        "+ sequential-blocking p2p (one call per instruction)",
        [_DS, "training.pipeline_regather_output=false", *_MEGATRON_GRADIENTS],
    ),
    ("+ re-gather of the stage's own output", [_DS, *_MEGATRON_GRADIENTS]),
    (
        "+ tied embedding all-reduce before the DP reduction",
        [_DS, "training.reduce_bucket_size=0", "training.allgather_bucket_size=0"],
    ),
    ("+ 5e8-element gradient buckets = deepspeed 0.5.4 (all its defaults)", [_DS]),
    ("deepspeed 0.5.0 (gradients whole)", [_DS, "training.framework_version=0.5.0"]),
]


def variants_table(path: str) -> str:
    """The variants as a markdown table: iteration and the exposed communication."""
    lines = [
        "| variant | iteration | pp p2p exposed | tp comm | dp sync exposed |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, overrides in VARIANTS:
        m = run(load_scenario(path, overrides)).metrics
        b = m.breakdown_s
        lines.append(
            f"| {label} | {m.iteration_time_s:.3f} s | {b['pp_p2p']:.3f} s | "
            f"{b['tp_comm']:.3f} s | {b['dp_sync']:.3f} s |"
        )
    return "\n".join(lines)


def per_microbatch(result, stage: int) -> dict[str, float]:
    """Seconds of one micro-batch's pipeline transfers and all-gathers on ``stage``: each
    direction's data transfer and, where the framework sends one, its meta message."""
    gpu = result.workload.lanes[stage].gpu
    spans = [s for s in result.trace.spans if s.gpu == gpu and s.microbatch == 1]
    out: dict[str, float] = {}
    for s in spans:
        if s.kind == PP_SEND and s.stream == "pp":
            # "send F1", "recv B1 meta" (blocking calls) or "F1" (overlapped sends)
            words = s.label.split()
            key = f"p2p {words[1 if len(words) > 1 else 0][0]}" + (" meta" * (words[-1] == "meta"))
            out[key] = max(out.get(key, 0.0), s.end_s - s.start_s)
        elif s.kind == TP_COMM and s.label.endswith("gather"):
            key = f"{s.label.split()[-1]} {s.label[0]}"
            out[key] = out.get(key, 0.0) + s.end_s - s.start_s
    return out


def main(path: str) -> None:
    for label, overrides in VARIANTS:
        result = run(load_scenario(path, overrides))
        m = result.metrics
        b = m.breakdown_s
        stage = result.scenario.parallel.pipeline_model_parallel_size // 2
        micro = per_microbatch(result, stage)
        print(
            f"{label:<48} iteration {m.iteration_time_s:8.3f} s  compute {b['compute']:.3f}"
            f"  tp_comm {b['tp_comm']:.3f}  pp_p2p {b['pp_p2p']:.4f}  idle {b['idle']:.3f}"
        )
        parts = ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in sorted(micro.items()))
        print(f"    per micro-batch (stage {stage}): {parts}")


if __name__ == "__main__":
    main(sys.argv[1])
