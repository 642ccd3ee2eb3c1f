"""Time fused causal attention on this machine's GPU beside stepsim's flash-kernel model.

    pip install torch            # any CUDA build with PyTorch >= 2.3; not a stepsim dependency
    python benchmarks/measure_attention.py --gpu h100-sxm5-80gb --out h100-attention.csv
    python benchmarks/measure_attention.py --synthetic h100-sxm5-80gb --out model.csv

What it is for: the H100 calibration set is not met, and what is left grows as the
hidden size shrinks, as the attention core's share of a layer does (docs/calibration.md,
"The latest refit"). stepsim's flash kernel (simulator/cost/attention.py) is a
mechanism estimate that was never timed on an H100. This script times PyTorch's
scaled_dot_product_attention, forward and forward + backward, causal, bf16, at the H100
set's own shapes (batch 1, sequence 4096, head dimension 128, 7 to 18 heads per GPU:
the heads of E1..E9 over their tensor-parallel size), without and with attention
dropout 0.1, on each fused backend PyTorch offers (cuDNN's fused attention, which
Transformer Engine also runs on Hopper; FlashAttention-2; memory-efficient), with CUDA
events (median of 20 after 5 warm-ups), and writes one CSV row per (backend, heads,
dropout) with stepsim's modelled time for the same kernel and the ratio measured /
modelled. Nothing in stepsim reads the file: it is the evidence a refit of the
attention kernel would start from.

--synthetic GPU writes the modelled times only (no GPU or PyTorch needed): the tests
use it, and it shows the columns.
"""

from __future__ import annotations

import argparse
import csv
import io
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stepsim.cost.attention import flash_work  # noqa: E402
from stepsim.cost.compute import ComputeModel  # noqa: E402
from stepsim.scenario import scenario_from_dict  # noqa: E402
from stepsim.scenario.presets import GPUS, NODES  # noqa: E402

SEQ_LENGTH = 4096
HEAD_DIM = 128
# heads per GPU of the H100 set's rows: 16/1, 32/2, 48/4, then 56..144 over TP 8
HEADS_PER_GPU = (7, 8, 10, 12, 16, 18)
DROPOUTS = (0.0, 0.1)
BACKENDS = ("cudnn", "flash", "efficient")
COLUMNS = (
    "backend",
    "heads",
    "seq_length",
    "head_dim",
    "dropout",
    "forward_s",
    "backward_s",
    "model_forward_s",
    "model_backward_s",
    "forward_ratio",
    "backward_ratio",
)


class Unavailable(Exception):
    """What this machine lacks for the measurement asked for."""


def _node_of(gpu_name: str) -> str:
    """A node preset carrying the GPU, for the one-GPU scenario the model runs."""
    for name, node in NODES.items():
        if node.get("gpu") == gpu_name:
            return name
    raise Unavailable(f"no node preset carries {gpu_name}")


def modelled_seconds(gpu_name: str, heads: int) -> tuple[float, float]:
    """stepsim's flash-attention forward and backward on one GPU at the set's shape."""
    scenario = scenario_from_dict(
        {
            "name": "attention kernel",
            "model": {
                "num_layers": 1,
                "hidden_size": heads * HEAD_DIM,
                "num_attention_heads": heads,
                "seq_length": SEQ_LENGTH,
                "vocab_size": 1024,
            },
            "cluster": {"node": _node_of(gpu_name), "num_nodes": 1},
            "parallel": {"data_parallel_size": NODES[_node_of(gpu_name)]["gpus_per_node"]},
            "training": {
                "global_batch_size": NODES[_node_of(gpu_name)]["gpus_per_node"],
                "micro_batch_size": 1,
                "attention_kernel": "flash",
            },
        }
    )
    model = ComputeModel(scenario)
    return flash_work(model, False).duration_s, flash_work(model, True).duration_s


def _median_seconds(fn, repeats: int = 20, warmup: int = 5) -> float:
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def measured_seconds(backend: str, heads: int, dropout: float) -> tuple[float, float] | None:
    """Forward, and backward (forward + backward less forward), of one causal SDPA call
    on one backend; None when the backend refuses the shape or is not built in."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    which = {
        "cudnn": getattr(SDPBackend, "CUDNN_ATTENTION", None),
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }[backend]
    if which is None:
        return None
    shape = (1, heads, SEQ_LENGTH, HEAD_DIM)
    q, k, v = (
        torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

    def forward():
        return scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)

    def both():
        forward().backward(grad)

    try:
        with sdpa_kernel(which):
            with torch.no_grad():
                fwd = _median_seconds(forward)
            total = _median_seconds(both)
    except RuntimeError:  # "no available kernel" for this backend and shape
        return None
    return fwd, total - fwd


def rows(gpu_name: str, synthetic: bool) -> list[dict]:
    out = []
    for heads in HEADS_PER_GPU:
        model_fwd, model_bwd = modelled_seconds(gpu_name, heads)
        for dropout in DROPOUTS:
            for backend in ("model",) if synthetic else BACKENDS:
                timed = (model_fwd, model_bwd) if synthetic else None
                if not synthetic:
                    timed = measured_seconds(backend, heads, dropout)
                    if timed is None:
                        continue
                fwd, bwd = timed
                out.append(
                    {
                        "backend": backend,
                        "heads": heads,
                        "seq_length": SEQ_LENGTH,
                        "head_dim": HEAD_DIM,
                        "dropout": dropout,
                        "forward_s": fwd,
                        "backward_s": bwd,
                        "model_forward_s": model_fwd,
                        "model_backward_s": model_bwd,
                        "forward_ratio": fwd / model_fwd,
                        "backward_ratio": bwd / model_bwd,
                    }
                )
    return out


def to_csv(table: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(table)
    return buffer.getvalue()


def main(argv: list[str] | None = None) -> int:
    return measure_main(argv, "measure_attention", __doc__, rows, to_csv, _line)


def _line(r: dict) -> str:
    return (
        f"  {r['backend']:<9} heads {r['heads']:>2} dropout {r['dropout']:.1f}: "
        f"forward {r['forward_s'] * 1e3:.3f} ms (x{r['forward_ratio']:.2f} the model), "
        f"backward {r['backward_s'] * 1e3:.3f} ms (x{r['backward_ratio']:.2f})"
    )


def measure_main(argv, tool: str, doc: str | None, make_rows, csv_of, line) -> int:
    """The command line every kernel measurement shares (measure_moe_kernels.py too):
    --gpu (measure on CUDA) or --synthetic (the model only), the CSV to --out, a line
    per row printed; a machine without what --gpu needs is one line and exit 2."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--gpu", choices=sorted(GPUS), help="the stepsim GPU preset measured")
    parser.add_argument("--synthetic", metavar="GPU", choices=sorted(GPUS), help="model only")
    parser.add_argument("--out", required=True, metavar="FILE", help="CSV to write")
    args = parser.parse_args(argv)
    if bool(args.gpu) == bool(args.synthetic):
        parser.error("give exactly one of --gpu (measure) and --synthetic")
    try:
        if args.gpu:
            try:
                import torch
            except ImportError:
                raise Unavailable(
                    "--gpu needs PyTorch with CUDA; --synthetic needs neither"
                ) from None
            if not torch.cuda.is_available():
                raise Unavailable("no CUDA GPU visible to PyTorch (try --synthetic)")
        table = make_rows(args.gpu or args.synthetic, synthetic=bool(args.synthetic))
    except Unavailable as e:
        print(f"{tool}: {e}", file=sys.stderr)
        return 2
    Path(args.out).write_text(csv_of(table), encoding="utf-8")
    for r in table:
        print(line(r))
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
