"""`stepsim compare SCENARIO TRACE`: a PyTorch profiler trace's kernels classified and
totalled per iteration. Closed forms: a hand-made trace's exposed communication and
idle time; stepsim's own simulated GPU written as a trace is measured back to the
simulated breakdown. A real trace (tests/data/README.md cites it) is read and its
categories add up to its iterations. Bad traces are one-line errors."""

import gzip
import json

import pytest

from stepsim.calibration.trace import (
    ATTENTION,
    COPY,
    GEMM,
    MEMORY,
    OPTIMIZER,
    kernel_class,
    measure,
)
from stepsim.ir.vocabulary import WAIT_OF_COMM
from stepsim.report.compare import EXPOSED, compare
from stepsim.run.iteration import run
from stepsim.scenario import ScenarioError, load_scenario
from stepsim.scenario.files import read_profiler_trace
from tests.helpers import ROOT, main_in_process

REAL = ROOT / "tests/data/ddp_resnet_2gpu_a100.json.gz"


@pytest.mark.parametrize(
    ("name", "category", "cls"),
    [
        (
            "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
            "kernel",
            "nccl all-reduce",
        ),
        (
            "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            "kernel",
            "nccl reduce-scatter",
        ),
        (
            "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            "kernel",
            "nccl all-gather",
        ),
        (
            "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
            "kernel",
            "nccl send/receive",
        ),
        (
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1",
            "kernel",
            GEMM,
        ),
        (
            "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align1>(Params)",
            "kernel",
            GEMM,
        ),
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT", "kernel", GEMM),
        (
            "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64>>(Flash_fwd_params)",
            "kernel",
            ATTENTION,
        ),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3", "kernel", ATTENTION),
        (
            "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>>(...)",
            "kernel",
            OPTIMIZER,
        ),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
            "kernel",
            MEMORY,
        ),
        ("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", COPY),
    ],
)
def test_kernels_are_classified_by_their_names(name, category, cls):
    assert kernel_class(name, category) == cls


def trace_of(events, steps=((0.0, 100.0),), launches=True):
    """A minimal Kineto trace: ``events`` (name, stream, start_us, end_us), each launched
    at its start by a host call in the step whose window holds it."""
    out = [
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "ts": s, "dur": d}
        for i, (s, d) in enumerate(steps)
    ]
    for n, (name, stream, start, end, *launch) in enumerate(events):
        args = {"stream": stream, "correlation": n}
        out.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": name,
                "ts": start,
                "dur": end - start,
                "args": args,
            }
        )
        if launches:
            out.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "ts": launch[0] if launch else start,
                    "dur": 1,
                    "args": {"correlation": n},
                }
            )
    return {"traceEvents": out, "distributedInfo": {"rank": 3, "world_size": 8}}


def test_exposed_communication_is_nccl_time_when_no_compute_runs():
    trace = trace_of(
        [
            ("gemm_a", 7, 0.0, 10.0),
            ("gemm_b", 7, 20.0, 30.0),
            ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 40, 5.0, 25.0),
            ("multi_tensor_apply_kernel", 7, 40.0, 45.0),
        ]
    )
    (it,) = measure(trace).iterations
    assert it.compute_s == pytest.approx(20e-6)
    assert it.exposed_communication_s == pytest.approx(10e-6)  # 10..20 us
    assert it.optimizer_s == pytest.approx(5e-6)
    assert it.idle_s == pytest.approx(100e-6 - 35e-6)
    assert it.compute_s + it.exposed_communication_s + it.optimizer_s + it.idle_s == pytest.approx(
        it.time_s
    )
    assert it.kernel_s == pytest.approx({GEMM: 20e-6, "nccl all-reduce": 20e-6, OPTIMIZER: 5e-6})


def test_a_kernel_belongs_to_the_step_that_launched_it_not_the_one_it_ran_in():
    events = [("gemm", 7, 10.0, 20.0), ("gemm", 7, 102.0, 115.0, 95.0)]  # launched at 95
    trace = trace_of(events, steps=((0.0, 100.0), (100.0, 100.0)))
    measured = measure(trace)
    assert [i.compute_s for i in measured.iterations] == pytest.approx([23e-6])
    assert "no GPU event in ProfilerStep#1" in measured.notes[0]
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e["cat"] != "cuda_runtime"]
    measured = measure(trace)
    assert [i.compute_s for i in measured.iterations] == pytest.approx([10e-6, 13e-6])
    assert "placed in iterations by their own start" in measured.notes[0]


def stepsim_trace(result, gpu):
    """stepsim's simulated GPU written as a profiler trace: its compute spans as GEMM
    kernels, its optimizer as a fused optimizer kernel, its communication as NCCL
    kernels, each on a stream of its lane; one step over the iteration."""
    events, streams = [], {}
    for span in result.trace.spans:
        if span.gpu != gpu or span.end_s <= span.start_s:
            continue
        if span.kind in WAIT_OF_COMM:
            name = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
        elif span.kind == "optimizer":
            name = "multi_tensor_apply_kernel"
        elif span.kind in ("forward", "backward", "weight", "recompute"):
            name = "sm90_xmma_gemm"
        else:
            continue  # waits and idle: no kernel runs
        stream = streams.setdefault(str(span.stream), 7 + len(streams))
        events.append((name, stream, span.start_s * 1e6, span.end_s * 1e6))
    return trace_of(events, steps=((0.0, result.metrics.iteration_time_s * 1e6),))


def test_stepsims_own_timeline_written_as_a_trace_is_measured_back_to_its_breakdown():
    scenario = load_scenario(
        "tiny-2gpu",
        ["parallel.tensor_model_parallel_size=2", "parallel.pipeline_model_parallel_size=1"],
    )
    result = run(scenario)
    gpu = result.metrics.stages[0].gpu
    c = compare(result, measure(stepsim_trace(result, gpu)), 0, "own", [])
    for key in ("iteration", "compute", EXPOSED, "optimizer", "idle"):
        assert c.measured[key] == pytest.approx(c.simulated[key], rel=1e-6, abs=1e-12), key
    assert c.simulated[EXPOSED] > 0  # the check is not vacuous: TP comm is exposed here


def test_a_real_trace_is_read_its_kernels_classified_and_its_categories_add_up():
    measured = measure(read_profiler_trace(REAL))
    assert (measured.rank, measured.world_size) == (0, 2) and "A100" in measured.device
    assert [i.step for i in measured.iterations] == ["ProfilerStep#5", "ProfilerStep#6"]
    assert measured.notes == ()  # every kernel found its launch
    for it in measured.iterations:
        parts = it.compute_s + it.exposed_communication_s + it.optimizer_s + it.idle_s
        assert parts == pytest.approx(it.time_s)
        assert {GEMM, MEMORY, OPTIMIZER, "nccl all-reduce"} <= set(it.kernel_s)
        assert 0 < it.exposed_communication_s <= it.communication_s


def test_compare_prints_both_sides_draws_them_and_says_which_stage(tmp_path):
    png = tmp_path / "c.png"
    code, stdout, stderr = main_in_process(
        "compare", "tiny-2gpu", str(REAL), "--png", str(png), "--quiet"
    )
    assert (code, stderr) == (0, "")
    assert "measured" in stdout and "simulated" in stdout and "nccl all-reduce" in stdout
    assert "stage 0: rank 0" in stdout and png.stat().st_size > 10_000
    code, stdout, _ = main_in_process("compare", "tiny-2gpu", str(REAL), "--json", "--stage", "1")
    document = json.loads(stdout)
    assert code == 0 and document["stage"] == 1 and document["iterations"] == 2
    assert set(document["measured_s"]) == set(document["simulated_s"])


def test_bad_traces_are_one_line_errors(tmp_path):
    cases = {
        "text.json": (b'{"traceEvents": [\n  {"ph": "X",, }]}', "line 2, column"),
        "cut.json.gz": (gzip.compress(b'{"traceEvents": []}')[:-6], "not a readable gzip"),
        "list.json": (b"[1, 2]", "not a profiler trace"),
        "cpu.json": (json.dumps(trace_of([])).encode(), "holds no GPU event"),
    }
    for name, (data, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        code, _, stderr = main_in_process("compare", "tiny-2gpu", str(path))
        assert code == 2 and message in stderr, (name, stderr)
        assert len(stderr.strip().splitlines()) == 1
    code, _, stderr = main_in_process("compare", "tiny-2gpu", str(REAL), "--stage", "5")
    assert code == 2 and "stages 0 to 1" in stderr
    with pytest.raises(ScenarioError, match="traceEvents"):
        measure({"x": 1})


def class_times(scenario, stage=0):
    """stepsim's kernel seconds per iteration by class for one stage (what calibrate
    --trace compares a trace's classes with)."""
    from stepsim.report.compare import stage_class_s

    return stage_class_s(scenario, run(scenario, spans=False).metrics, stage)


def test_a_trace_of_stepsims_own_kernel_classes_is_fitted_back_to_the_multipliers(tmp_path):
    from stepsim.scenario.files import read_calibration_file
    from stepsim.scenario.fitted import MeasuredFit
    from stepsim.scenario.loader import apply_fit

    truth = MeasuredFit(gemm=0.8, attention=1.3, memory=0.9)
    times = class_times(apply_fit(load_scenario("tiny-2gpu"), truth))
    names = {GEMM: "sm90_xmma_gemm", ATTENTION: "flash_fwd_kernel", MEMORY: "elementwise_kernel"}
    events, at = [], 0.0
    for cls, seconds in times.items():
        events.append((names[cls], 7, at, at + seconds * 1e6))
        at += seconds * 1e6
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace_of(events, steps=((0.0, at + 10.0),))))
    out = tmp_path / "c.toml"
    code, stdout, stderr = main_in_process(
        "calibrate",
        "--trace",
        str(path),
        "--scenario",
        "tiny-2gpu",
        "--trace-stage",
        "0",
        "--out",
        str(out),
        "--quiet",
    )
    assert code == 0, stderr
    fit = read_calibration_file(out).fit
    assert (fit.gemm, fit.attention, fit.memory) == pytest.approx((0.8, 1.3, 0.9), rel=1e-6)
    assert fit.trace_iterations == 1 and fit.trace_freed == ("gemm", "attention", "memory")
    assert "a profiler trace (1 iteration)" in fit.label()
    assert "kernel classes fitted on t.json" in stdout
