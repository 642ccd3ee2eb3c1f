"""Time an MoE layer's kernels on this machine's GPU beside stepsim's model of them.

    pip install torch   # CUDA build with torch._grouped_mm (2.8+); not a stepsim dependency
    python benchmarks/measure_moe_kernels.py --gpu h200-sxm-141gb --out h200-moe.csv
    python benchmarks/measure_moe_kernels.py --synthetic h200-sxm-141gb --out model.csv

What it times, bf16, at the expert shapes of four MoE families (hidden and expert FFN
sizes of Mixtral 8x7B, DeepSeek-V3, Qwen3-235B-A22B and Qwen3-30B-A3B; 1 to 32 local
experts; 1,024 or 4,096 rows per expert, and 4,096 on average with a skewed split):

- ``grouped``: one grouped GEMM over the local experts (torch._grouped_mm, the
  CUTLASS grouped kernel PyTorch ships for Hopper): fc1 forward (rows x hidden times
  hidden x 2 FFN, gated), fc2 forward (rows x FFN times FFN x hidden) and fc1's weight
  gradient (hidden x rows times rows x 2 FFN, grouped along the rows);
- ``sequential``: the same GEMMs as one torch.mm per expert launched in a loop (what
  Megatron-Core's SequentialMLP does without moe_grouped_gemm);
- ``swiglu``: the gated activation on fc1's output (silu(a) x b);
- ``permute`` / ``unpermute``: Megatron-Core moe_utils.py's unfused token permutation
  (the routing map transposed, the selected token indices, index_select of the k n rows)
  and un-permutation (rows times their probabilities, scatter_add into zeros), on n
  tokens with top-k routing over E experts.

Each is timed with CUDA events, median of 20 after 5 warm-ups, two ways: ``queued``
(one launch, or the loop of launches, queued behind a ~1 ms GPU busy-wait, so the
host's launch time is not timed unless the GPU outruns it) and ``burst`` (ten in a row
between the events, per call; the GPU warm as in a training step). The model column
is stepsim's own time for the same kernel: cost.routing.grouped_gemm for the GEMMs
(one expert's shape per expert, as moe.py passes them), the memory roofline of
cost.moe (its _unfused_permute bytes, and 3 x 2 bytes per output element for the
gated activation) for the rest, with the GPU record's built-in constants.

Nothing in stepsim reads the CSV: it is kernel-level evidence for the MoE cost model
(docs/calibration.md). --synthetic writes the model's columns only (no GPU needed):
the tests use it, and it shows the columns.
"""

from __future__ import annotations

import csv
import io
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stepsim.cost.kernels import Work  # noqa: E402
from stepsim.cost.moe import _unfused_permute  # noqa: E402
from stepsim.cost.routing import grouped_gemm  # noqa: E402
from stepsim.scenario.presets import GPUS  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling, run or loaded
from measure_attention import measure_main  # noqa: E402

# (family, hidden, expert FFN, experts, top-k): the models' published configurations
FAMILIES = (
    ("mixtral-8x7b", 4096, 14336, 8, 2),
    ("deepseek-v3", 7168, 2048, 256, 8),
    ("qwen3-235b-a22b", 4096, 1536, 128, 8),
    ("qwen3-30b-a3b", 2048, 768, 128, 8),
)
LOCAL_EXPERTS = {"mixtral-8x7b": (1, 2, 8)}  # the others: 4, 8, 32
ROWS_PER_EXPERT = (1024, 4096)
SKEW = (0.25, 1.75)  # skewed split: rows from SKEW[0] to SKEW[1] x the mean, linearly
GEMMS = ("fc1", "fc2", "fc1_wgrad")
PERMUTE_TOKENS = (4096, 16384)  # tokens on the GPU per micro-batch (sequence x batch / TP)
QUEUE_AHEAD_CYCLES = 2_000_000  # about 1 ms at 1980 MHz
BURST = 10
DEVICE = "cuda"  # the tests of the kernels' set-up use "cpu"
COLUMNS = (
    "kernel",
    "family",
    "gemm",
    "experts",
    "rows",
    "skewed",
    "m",
    "n",
    "k",
    "tflop",
    "gbytes",
    "queued_s",
    "burst_s",
    "model_s",
    "queued_ratio",
    "burst_ratio",
    "note",
)


def row_counts(experts: int, rows: int, skewed: bool) -> list[int]:
    """Rows per local expert, multiples of 16 (the grouped kernel's alignment): equal,
    or spread linearly from SKEW[0] to SKEW[1] times ``rows`` (the same total)."""
    if not skewed or experts == 1:
        return [rows] * experts
    lo, hi = SKEW
    raw = [rows * (lo + (hi - lo) * i / (experts - 1)) for i in range(experts)]
    counts = [max(16, int(round(r / 16)) * 16) for r in raw]
    counts[-1] += rows * experts - sum(counts)
    return counts


def gemm_shapes(gemm: str, hidden: int, ffn: int, counts: list[int]) -> list[tuple[int, int, int]]:
    """(m, n, k) per expert, as cost.moe passes them: fc1 forward rows x 2 FFN over
    hidden (gated), fc2 forward rows x hidden over FFN, fc1's weight gradient hidden x
    2 FFN over the rows."""
    if gemm == "fc1":
        return [(c, 2 * ffn, hidden) for c in counts]
    if gemm == "fc2":
        return [(c, hidden, ffn) for c in counts]
    return [(hidden, 2 * ffn, c) for c in counts]


def _cm(gpu_name: str) -> SimpleNamespace:
    """What cost.routing.grouped_gemm reads of a ComputeModel: the GPU and its kernel
    constants."""
    gpu = GPUS[gpu_name]
    return SimpleNamespace(gpu=gpu, constants=gpu.kernels)


def _memory_bound(gpu_name: str, num_bytes: float) -> Work:
    gpu = GPUS[gpu_name]
    return Work(
        duration_s=num_bytes / (gpu.hbm_gbytes_per_s * 1e9 * gpu.kernels.memory_efficiency),
        flops=0.0,
    )


def permute_model(gpu_name: str, tokens: int, hidden: int, experts: int, topk: int):
    """stepsim's unfused permute and unpermute (cost.moe._unfused_permute) on ``tokens``."""
    cm = SimpleNamespace(
        model=SimpleNamespace(hidden_size=hidden, router_topk=topk),
        memory_bound=lambda b: _memory_bound(gpu_name, b),
    )
    return _unfused_permute(cm, tokens, experts)


def _time(fn, queue_ahead: bool, repeats: int = 20, warmup: int = 5) -> float:
    import torch

    for _ in range(warmup):
        fn()
    calls = 1 if queue_ahead else BURST
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if queue_ahead:
            torch.cuda._sleep(QUEUE_AHEAD_CYCLES)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    return statistics.median(times)


def _gemm_fns(torch, gemm: str, hidden: int, ffn: int, counts: list[int]):
    """The grouped and the sequential form of one expert GEMM, on random bf16 data."""
    dev, bf = DEVICE, torch.bfloat16
    total = sum(counts)
    e = len(counts)
    ends = torch.tensor([sum(counts[: i + 1]) for i in range(e)], device=dev, dtype=torch.int32)
    if gemm in ("fc1", "fc2"):
        k_in, n_out = (hidden, 2 * ffn) if gemm == "fc1" else (ffn, hidden)
        x = torch.randn(total, k_in, device=dev, dtype=bf)
        w = torch.randn(e, n_out, k_in, device=dev, dtype=bf)  # (out, in) as nn.Linear
        wt = w.transpose(-2, -1)  # (e, in, out), column-major: what _grouped_mm takes
        xs = list(torch.split(x, counts))

        def grouped():
            return torch._grouped_mm(x, wt, offs=ends, out_dtype=bf)

        def sequential():
            return [torch.mm(xs[i], wt[i]) for i in range(e)]

        return grouped, sequential
    # weight gradient of fc1: dW_e = x_e^T (hidden x rows) @ dy_e (rows x 2 FFN)
    xt = torch.randn(hidden, total, device=dev, dtype=bf)
    dy = torch.randn(2 * ffn, total, device=dev, dtype=bf)
    dyt = dy.t()  # (rows, 2 FFN), column-major
    starts = [sum(counts[:i]) for i in range(e)]

    def grouped_w():
        return torch._grouped_mm(xt, dyt, offs=ends, out_dtype=bf)

    def sequential_w():
        return [
            torch.mm(xt[:, s : s + c], dyt[s : s + c]) for s, c in zip(starts, counts, strict=True)
        ]

    return grouped_w, sequential_w


def _permute_fns(torch, tokens: int, hidden: int, experts: int, topk: int):
    """Megatron-Core moe_utils.py's unfused permute and unpermute on random routing."""
    dev, bf = DEVICE, torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(tokens, hidden, device=dev, dtype=bf)
    scores = torch.rand(tokens, experts, device=dev, generator=gen)
    probs, idx = torch.topk(scores, topk, dim=1)
    routing_map = torch.zeros(tokens, experts, device=dev, dtype=torch.bool)
    routing_map.scatter_(1, idx, True)
    dense_probs = torch.zeros(tokens, experts, device=dev, dtype=bf)
    dense_probs.scatter_(1, idx, probs.to(bf))

    def permute():
        rmap = routing_map.T.contiguous()
        token_indices = torch.arange(tokens, device=dev).unsqueeze(0).expand(experts, -1)
        sorted_indices = token_indices.masked_select(rmap)
        return x.index_select(0, sorted_indices), sorted_indices

    rows, sorted_indices = permute()
    weights = dense_probs.T.contiguous().masked_select(routing_map.T.contiguous())

    def unpermute():
        weighted = rows * weights.unsqueeze(-1)
        out = torch.zeros(tokens, hidden, device=dev, dtype=bf)
        out.scatter_add_(0, sorted_indices.unsqueeze(1).expand(-1, hidden), weighted)
        return out

    return permute, unpermute


def _ratio(measured: float | None, model: float) -> float | None:
    return None if measured is None else measured / model


def _row(kernel, family, gemm, experts, rows, skewed, shape, flops, nbytes, timed, model_s, note):
    queued, burst = timed
    return {
        "kernel": kernel,
        "family": family,
        "gemm": gemm,
        "experts": experts,
        "rows": rows,
        "skewed": skewed,
        "m": shape[0],
        "n": shape[1],
        "k": shape[2],
        "tflop": flops / 1e12,
        "gbytes": nbytes / 1e9,
        "queued_s": queued,
        "burst_s": burst,
        "model_s": model_s,
        "queued_ratio": _ratio(queued, model_s),
        "burst_ratio": _ratio(burst, model_s),
        "note": note,
    }


def _measure(fn) -> tuple[tuple[float | None, float | None], str]:
    try:
        return (_time(fn, True), _time(fn, False)), ""
    except Exception as e:  # a kernel this build lacks or a shape it refuses: recorded
        return (None, None), f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"


def rows(gpu_name: str, synthetic: bool) -> list[dict]:
    torch = None
    if not synthetic:
        import torch
    out = []
    cm = _cm(gpu_name)
    for family, hidden, ffn, _num_experts, _topk in FAMILIES:
        for experts in LOCAL_EXPERTS.get(family, (4, 8, 32)):
            cases = [(r, False) for r in ROWS_PER_EXPERT] + [(ROWS_PER_EXPERT[-1], True)]
            for per_expert, skewed in cases:
                if skewed and experts == 1:
                    continue
                counts = row_counts(experts, per_expert, skewed)
                for gemm in GEMMS:
                    shapes = gemm_shapes(gemm, hidden, ffn, counts)
                    model = grouped_gemm(cm, [tuple(map(float, s)) for s in shapes])
                    flops = sum(2.0 * m * n * k for m, n, k in shapes)
                    m, n, k = shapes[0]
                    nbytes = sum(2.0 * (a * c + c * b + a * b) for a, b, c in shapes)
                    # the whole group's shape: rows summed (over m, or over k for the wgrad)
                    shape = (m, n, sum(counts)) if gemm == "fc1_wgrad" else (sum(counts), n, k)
                    if synthetic:
                        timed = {"grouped": ((model.duration_s,) * 2, "")}
                    else:
                        grouped, sequential = _gemm_fns(torch, gemm, hidden, ffn, counts)
                        timed = {"grouped": _measure(grouped), "sequential": _measure(sequential)}
                        del grouped, sequential
                    for kernel, (t, note) in timed.items():
                        out.append(
                            _row(kernel, family, gemm, experts, per_expert, skewed, shape,
                                 flops, nbytes, t, model.duration_s, note)
                        )  # fmt: skip
                    if torch is not None:
                        torch.cuda.empty_cache()
                # the gated activation on fc1's output: two halves read, one written
                elements = sum(counts) * ffn
                if not skewed:
                    model_s = _memory_bound(gpu_name, 3 * 2 * elements).duration_s
                    if synthetic:
                        t, note = (model_s, model_s), ""
                    else:
                        a = torch.randn(sum(counts), 2 * ffn, device=DEVICE, dtype=torch.bfloat16)
                        g, u = a.chunk(2, dim=-1)
                        t, note = _measure(lambda g=g, u=u: torch.nn.functional.silu(g) * u)
                        del a, g, u
                    out.append(
                        _row("swiglu", family, "", experts, per_expert, False,
                             (sum(counts), ffn, 0), 0.0, 6.0 * elements, t, model_s, note)
                    )  # fmt: skip
    for family, hidden, _ffn, num_experts, topk in FAMILIES:
        for tokens in PERMUTE_TOKENS:
            permute_work, unpermute_work = permute_model(
                gpu_name, tokens, hidden, num_experts, topk
            )
            if synthetic:
                fns = {"permute": None, "unpermute": None}
            else:
                p, u = _permute_fns(torch, tokens, hidden, num_experts, topk)
                fns = {"permute": p, "unpermute": u}
            for kernel, fn in fns.items():
                model_s = (permute_work if kernel == "permute" else unpermute_work).duration_s
                t, note = ((model_s, model_s), "") if fn is None else _measure(fn)
                out.append(
                    _row(kernel, family, "", num_experts, tokens, False,
                         (tokens * topk, hidden, 0), 0.0,
                         model_s * GPUS[gpu_name].hbm_gbytes_per_s * 1e9
                         * GPUS[gpu_name].kernels.memory_efficiency,
                         t, model_s, note)
                )  # fmt: skip
            if torch is not None:
                del fns
                torch.cuda.empty_cache()
    return out


def to_csv(table: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(table)
    return buffer.getvalue()


def main(argv: list[str] | None = None) -> int:
    return measure_main(argv, "measure_moe_kernels", __doc__, rows, to_csv, _line)


def _line(r: dict) -> str:
    q, b = r["queued_s"], r["burst_s"]
    shown = "failed: " + r["note"] if q is None else (
        f"queued {q * 1e3:.3f} ms (x{r['queued_ratio']:.2f} the model), "
        f"burst {b * 1e3:.3f} ms (x{r['burst_ratio']:.2f})"
    )  # fmt: skip
    return (
        f"  {r['kernel']:<10} {r['family']:<16} {r['gemm']:<9} E{r['experts']:<3} "
        f"rows {r['rows']:>5}{' skewed' if r['skewed'] else '       '} {shown}"
    )


if __name__ == "__main__":
    sys.exit(main())
