"""The attention core: Megatron's fused-softmax rule and its fallback, flash attention."""

import dataclasses

import pytest

from stepsim.cost.attention import causal_fraction
from stepsim.cost.compute import ComputeModel
from stepsim.cost.kernels import gemm_efficiency
from stepsim.cost.memory import activation_bytes_per_layer
from stepsim.report.summary import summary_text
from stepsim.run.iteration import run as simulate
from stepsim.scenario import ScenarioError
from stepsim.scenario.softmax import fused_softmax_path
from tests.helpers import load


def _a100(t=8, b=1, s=2048, a=16, h=2048, **training):
    return load(
        model={"hidden_size": h, "num_attention_heads": a, "seq_length": s},
        parallel={"tensor_model_parallel_size": t, "data_parallel_size": 8 // t},
        training={"micro_batch_size": b, "global_batch_size": 8 * b, **training},
    )


def _kernel(scenario, name, part):
    kernels = ComputeModel(scenario).kernels()
    return next(k.work for k in kernels if k.name == name and k.part == part)


# -- Megatron's rule (docs/frameworks.md §9(a)) ---------------------------------------------


@pytest.mark.parametrize(
    ("version", "heads", "b", "s", "fused", "reason"),
    [
        ("2021", 2, 1, 2048, False, "= 2 not divisible by 4"),
        ("2021", 2, 2, 2048, True, ""),
        ("2021", 4, 1, 4096, False, "outside 16 < s <= 2048"),
        ("2021", 4, 1, 16, False, "outside 16 < s <= 2048"),
        ("2021", 4, 1, 2046, False, "not divisible by 4"),
        ("2021", 4, 1, 128, False, "= 4 not divisible by 8"),  # batch per block 8
        ("2021", 8, 1, 128, True, ""),
        ("2022", 4, 1, 2048, True, ""),
    ],
)
def test_fused_softmax_rule(version, heads, b, s, fused, reason):
    path = fused_softmax_path(version, heads_per_rank=heads, micro_batch=b, seq_length=s)
    assert path.fused is fused
    assert reason in path.reason
    assert not path.aborts


def test_2022_rule_lets_long_causal_rows_through_to_the_kernels_assertion():
    path = fused_softmax_path("2022", heads_per_rank=4, micro_batch=1, seq_length=4096)
    assert path.aborts and "asserts s <= 2048" in path.reason
    path = fused_softmax_path("2022", heads_per_rank=4, micro_batch=1, seq_length=8192)
    assert not path.aborts and "outside 16 < s <= 4096" in path.reason
    with pytest.raises(ValueError, match="unknown Megatron softmax rule version '2019'"):
        fused_softmax_path("2019", heads_per_rank=4, micro_batch=1, seq_length=1024)


def test_unfused_softmax_costs_36_and_40_bytes_against_4_and_6():
    """§9(d): a = 16, T = 8, b = 1 (two heads per rank), s = 2048: the softmax forward
    takes exactly 9 times, its backward 20/3 times, the fused time; with b = 2 (four per
    rank) the fused costs apply again, per score element."""
    fallback = _a100(b=1)
    forced = _a100(b=1, masked_softmax_fusion=False)
    fused_b2 = _a100(b=2)
    hbm = fallback.cluster.gpu.hbm_gbytes_per_s * 1e9
    eff = fallback.cluster.gpu.kernels.memory_efficiency
    scores = 2 * 2048 * 2048
    assert _kernel(fallback, "softmax", "forward").duration_s == pytest.approx(
        9 * 4 * scores / (hbm * eff)
    )
    assert _kernel(fallback, "softmax", "input").duration_s == pytest.approx(
        20 / 3 * 6 * scores / (hbm * eff)
    )
    assert _kernel(forced, "softmax", "forward") == _kernel(fallback, "softmax", "forward")
    # b = 2: twice the scores at the fused 4 and 6 bytes
    assert _kernel(fused_b2, "softmax", "forward").duration_s == pytest.approx(
        4 * 2 * scores / (hbm * eff)
    )
    assert _kernel(fused_b2, "softmax", "input").duration_s == pytest.approx(
        6 * 2 * scores / (hbm * eff)
    )


def test_unfused_softmax_keeps_its_fp32_output():
    """Korthikanti's 5 a s^2 b bytes of the attention core become 7: the softmax output
    is kept in fp32 (4 bytes) instead of fp16."""
    fused, fallback = _a100(b=2), _a100(b=2, masked_softmax_fusion=False)
    extra = activation_bytes_per_layer(fallback) - activation_bytes_per_layer(fused)
    assert extra == pytest.approx(2 * 2 * (16 // 8) * 2048 * 2048)


def test_the_summary_says_when_the_softmax_falls_back():
    text = summary_text(simulate(_a100(b=1)))
    assert (
        "attention softmax unfused: heads per TP rank x micro-batch = 2 not divisible by 4 "
        "(Megatron fused_softmax.py)"
    ) in text
    assert "softmax unfused" not in summary_text(simulate(_a100(b=2)))


# -- flash attention -------------------------------------------------------------------------


def test_causal_flash_computes_the_blocks_up_to_the_diagonal():
    assert causal_fraction(128) == 1.0
    assert causal_fraction(256) == pytest.approx(3 / 4)  # 3 of 2 x 2 blocks
    assert causal_fraction(4096) == pytest.approx(33 / 64)  # (n + 1) / 2n, n = 32


def test_flash_attention_time_is_its_matmuls_and_exponentials():
    """One rank, b = 1, a = 16, T = 8 (2 heads), s = 256 (2 x 2 blocks, 3 computed), head
    dimension 128: the forward executes 3/4 of 4 x 2 x 256^2 x 128 matmul FLOPs plus 3/4
    of 2 x 256^2 exponentials at 128 tensor FLOPs each (A100); the backward 2.5 times the
    matmuls and the same exponentials; both at the score GEMM's efficiency. The FLOPs
    reported are the model's: 4 b s^2 h / T forward, twice that backward."""
    scenario = _a100(s=256, attention_kernel="flash")
    gpu = scenario.cluster.gpu
    heads, s, d = 2, 256, 128
    rate = gpu.peak_tflops * 1e12 * gemm_efficiency(gpu.kernels, s, s, d, heads)
    matmul = 4 * heads * s * s * d
    exps = heads * s * s * 3 / 4
    forward = _kernel(scenario, "flash attention", "forward")
    backward = _kernel(scenario, "flash attention backward", "input")
    assert gpu.tensor_flops_per_exp == 128
    assert forward.duration_s == pytest.approx((matmul * 3 / 4 + 128 * exps) / rate)
    assert backward.duration_s == pytest.approx((2.5 * matmul * 3 / 4 + 128 * exps) / rate)
    assert forward.flops == matmul == 4 * 1 * s * s * 2048 / 8
    assert backward.flops == 2 * matmul


CORE = {"scores", "softmax", "dropout", "context", "context dP", "context dV", "scores dQ"}


def test_flash_attention_replaces_only_the_attention_core():
    unfused, flash = _a100(b=2), _a100(b=2, attention_kernel="flash")
    core = CORE | {"scores dK"}
    kept = [k for k in ComputeModel(unfused).kernels() if k.name not in core]
    flash_kernels = ComputeModel(flash).kernels()
    assert [k for k in flash_kernels if k.name not in core and "flash" not in k.name] == kept
    assert [k.name for k in flash_kernels if "flash" in k.name] == [
        "flash attention",
        "flash attention backward",
    ]
    # layer FLOPs stay Megatron's count whichever the kernel
    a, b = ComputeModel(unfused).layer(), ComputeModel(flash).layer()
    assert a.attention_forward.flops == pytest.approx(b.attention_forward.flops)
    assert a.attention_backward.flops == pytest.approx(b.attention_backward.flops)


def test_flash_attention_keeps_no_score_matrix():
    """Korthikanti's per-layer activations with the 5 a s^2 b bytes of the core replaced by
    one fp32 log-sum-exp per query row and head (4 a s b / T)."""
    t, b, s, h, a = 8, 2, 2048, 2048, 16
    unfused = activation_bytes_per_layer(_a100(b=b))
    flash = activation_bytes_per_layer(_a100(b=b, attention_kernel="flash"))
    assert unfused - flash == pytest.approx(5 * a * s * s * b / t - 4 * a * s * b / t)
    assert flash == pytest.approx(s * b * h * (10 + 24 / t) + 4 * a * s * b / t)


def test_flash_attention_ignores_the_softmax_rule():
    text = summary_text(simulate(_a100(b=1, attention_kernel="flash")))
    assert "softmax unfused" not in text
    assert " · flash attention" in text


def test_bad_attention_kernel_is_a_one_line_error():
    with pytest.raises(ScenarioError, match=r"training\.attention_kernel.*'fused'"):
        _a100(attention_kernel="fused")


def test_the_framework_chooses_the_attention_core():
    """Megatron-LM 2021/2022 run the unfused core, Megatron-Core r0.8.0 (2024) TE's
    fused attention; a scenario's own choice wins."""
    s = _a100(b=2)
    assert s.training.attention_kernel is None  # not set: the framework's
    assert s.training.mechanism("attention_kernel") == "unfused"  # megatron 2021
    assert s.training.masked_softmax_fusion is True
    core = dataclasses.replace(s.training, framework_version="2024")
    assert core.mechanism("attention_kernel") == "flash"
    mine = dataclasses.replace(core, attention_kernel="unfused")
    assert mine.mechanism("attention_kernel") == "unfused"


# -- --tp-comm-overlap -----------------------------------------------------------------------


def _tp2(**training):
    return load(
        parallel={"tensor_model_parallel_size": 2, "sequence_parallel": True},
        training={"micro_batch_size": 1, "global_batch_size": 1, **training},
    )


def test_tp_comm_overlap_hides_each_collective_behind_its_gemm():
    """One stage, TP 2 with SP, one micro-batch, four layers; every op runs one after the
    other, so the iteration is the sum of its parts. Each block's all-gather (a) and
    reduce-scatter (r) cost what they cost without the overlap; with it, a forward block
    takes max(a, G) + (W - G - S) + max(r, S') instead of a + W + r (G the GEMM the
    gather feeds, S the GEMM feeding the scatter, S' the same on 16 fewer SMs), a
    backward block max(a, G_b) + (W_b - G_b - L) + max(r, L) instead of a + W_b + r
    (G_b the projection's or fc2's dX, L the weight gradient of QKV or fc1)."""
    base, overlapped = _tp2(), _tp2(tp_comm_overlap=True)
    result = simulate(base)
    comm = [sp.end_s - sp.start_s for sp in result.trace.spans if sp.kind == "tp_comm"]
    a, r = comm[0], comm[1]  # the first block's all-gather and reduce-scatter
    assert comm[:4] == pytest.approx([a, r, a, r])
    layer = ComputeModel(base).layer()
    saved = 0.0
    for w, wb, last, g in (
        (
            layer.attention_forward,
            layer.attention_backward,
            layer.attention_last_weight,
            layer.attention_overlap,
        ),
        (layer.mlp_forward, layer.mlp_backward, layer.mlp_last_weight, layer.mlp_overlap),
    ):
        G, S, S2 = g.gather.duration_s, g.scatter.duration_s, g.scatter_shared.duration_s
        Gb, L = g.gather_backward.duration_s, last.duration_s
        forward = max(a, G) + (w.duration_s - G - S) + max(r, S2)
        backward = max(a, Gb) + (wb.duration_s - Gb - L) + max(r, L)
        saved += (a + w.duration_s + r - forward) + (a + wb.duration_s + r - backward)
    assert S2 > S  # the GEMM runs on 92 of the A100's 108 SMs
    expected = result.metrics.iteration_time_s - 4 * saved
    assert simulate(overlapped).metrics.iteration_time_s == pytest.approx(expected, rel=1e-9)


def test_tp_comm_overlap_needs_sequence_parallelism():
    with pytest.raises(ScenarioError, match=r"training\.tp_comm_overlap=True overlaps sequence"):
        load(
            parallel={"tensor_model_parallel_size": 2},
            training={"tp_comm_overlap": True},
        )


def test_measure_attention_synthetic_writes_the_model_beside_itself(tmp_path):
    import contextlib
    import csv
    import io

    from tests.helpers import benchmark_script

    out = tmp_path / "attention.csv"
    script = benchmark_script("measure_attention")
    with contextlib.redirect_stdout(io.StringIO()):
        assert script.main(["--synthetic", "h100-sxm5-80gb", "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    # the H100 set's heads per GPU, without and with dropout; the model against itself
    assert [(int(r["heads"]), float(r["dropout"])) for r in rows] == [
        (h, d) for h in (7, 8, 10, 12, 16, 18) for d in (0.0, 0.1)
    ]
    assert {float(r["forward_ratio"]) for r in rows} == {1.0}
    # more heads, more time (not exactly in proportion: the heads are the kernel's
    # batch, whose last wave of tiles may leave SMs idle)
    forward = [float(r["model_forward_s"]) for r in rows[::2]]
    assert forward == sorted(forward) and len(set(forward)) == len(forward)


def test_a_gpu_with_attention_timings_runs_flash_at_its_own_rate():
    """H100 (attention constants fitted on cuDNN timings): the forward's matmuls and the
    exposed share of the exponentials at forward_efficiency x L / (L + kv_half) of the
    peak, L the keys a query row attends to (s x the causal fraction); the backward at
    backward_efficiency with 2.5 times the matmuls; no score GEMM efficiency in it."""
    scenario = load(
        cluster={"node": "dgx-h100"},
        model={"hidden_size": 2048, "num_attention_heads": 16, "seq_length": 4096},
        parallel={"tensor_model_parallel_size": 8, "data_parallel_size": 1},
        training={"micro_batch_size": 1, "global_batch_size": 1, "attention_kernel": "flash"},
    )
    gpu = scenario.cluster.gpu
    a = gpu.attention_kernels
    assert a is not None and a.source
    heads, s, d = 2, 4096, 128
    done = causal_fraction(s)
    pairs = heads * s * s * done
    loop = s * done
    exps = a.exp_exposed * gpu.tensor_flops_per_exp * pairs
    peak = gpu.peak_tflops * 1e12
    forward = _kernel(scenario, "flash attention", "forward")
    backward = _kernel(scenario, "flash attention backward", "input")
    assert forward.duration_s == pytest.approx(
        (4 * d * pairs + exps) / (peak * a.forward_efficiency * loop / (loop + a.kv_half))
    )
    assert backward.duration_s == pytest.approx(
        (10 * d * pairs + exps) / (peak * a.backward_efficiency * loop / (loop + a.kv_half))
    )
    # the GEMM constants do not enter: another gemm_k_half leaves the kernel as it was
    other = dataclasses.replace(gpu.kernels, gemm_k_half=0.0, gemm_efficiency=0.3)
    assert (
        _kernel(dataclasses.replace(scenario, calibration=other), "flash attention", "forward")
        == forward
    )
