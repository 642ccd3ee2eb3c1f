"""What each framework's pipeline mechanisms cost on a scenario, per micro-batch and
per iteration (docs/frameworks.md, "MT-NLG and BigScience: deepspeed vs megatron").

    python benchmarks/framework_breakdown.py scenarios/mt-nlg-530b-420nodes.toml
    python benchmarks/framework_breakdown.py scenarios/bigscience-175b-v100.toml

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

from stepsim.run import run  # noqa: E402
from stepsim.scenario import load_scenario  # noqa: E402
from stepsim.vocabulary import PP_SEND, TP_COMM  # noqa: E402

# (label, overrides), each one mechanism away from the one before
VARIANTS = [
    (
        "megatron 2021, overlapped p2p",
        ["training.framework=megatron", "training.pipeline_p2p=overlapped"],
    ),
    ("megatron 2021 (batched-blocking)", ["training.framework=megatron"]),
    (
        "deepspeed 0.5.4, batched-blocking, no re-gather",
        [
            "training.framework=deepspeed",
            "training.pipeline_p2p=batched-blocking",
            "training.pipeline_regather_output=false",
        ],
    ),
    (
        "deepspeed 0.5.4, no re-gather",
        [
            "training.framework=deepspeed",
            "training.pipeline_regather_output=false",
        ],
    ),
    ("deepspeed 0.5.4", ["training.framework=deepspeed"]),
    (
        "deepspeed 0.5.0 (gradients whole)",
        [
            "training.framework=deepspeed",
            "training.framework_version=0.5.0",
        ],
    ),
]


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
