"""Calibrating to measured iterations (`stepsim calibrate --measured`): the fit recovers
the parameters that made synthetic measurements (stepsim's own times, or a closed form);
the file round-trips and is refused on another GPU or node; malformed CSVs are one-line
errors naming the line and the column; every output that uses a fitted file says so.
No published number is asserted."""

import csv
import json
import math
from dataclasses import replace

import pytest

from stepsim.calibration.measured import MeasuredRun, calibrate
from stepsim.cost.attention import core_kernels
from stepsim.cost.compute import ComputeModel
from stepsim.run.iteration import run
from stepsim.scenario import ScenarioError, load_scenario
from stepsim.scenario.files import dumps_calibration, read_calibration_file
from stepsim.scenario.fitted import MeasuredFit
from stepsim.scenario.loader import apply_fit
from tests.helpers import ROOT, main_in_process

TINY = "tiny-2gpu"  # 2 A100s, PP 2, 8 micro-batches, 1F1B
LAYOUTS = {
    "pp2": (),
    "tp2": ("parallel.tensor_model_parallel_size=2", "parallel.pipeline_model_parallel_size=1"),
    "mb4": ("training.micro_batch_size=4",),
}


def seconds(scenario) -> float:
    return run(scenario, spans=False).metrics.iteration_time_s


def write_runs(path, truth: MeasuredFit, layouts=LAYOUTS):
    """A CSV of 'measured' times that stepsim itself gives with ``truth`` applied."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "scenario", "overrides", "measured_iteration_s"])
        for name, overrides in layouts.items():
            scenario = apply_fit(load_scenario(TINY, overrides), truth)
            writer.writerow([name, TINY, "; ".join(overrides), repr(seconds(scenario))])
    return path


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A file fitted on times made with the GEMMs at 0.9 of their built-in efficiency."""
    folder = tmp_path_factory.mktemp("calibrate")
    runs = write_runs(folder / "runs.csv", MeasuredFit(gemm=0.9))
    out = folder / "cal.toml"
    code, stdout, stderr = main_in_process(
        "calibrate", "--measured", str(runs), "--out", str(out), "--quiet", cwd=ROOT
    )
    assert (code, stderr) == (0, "")
    return out, stdout


def test_stepsims_own_times_are_fitted_back_to_the_gemm_efficiency_that_made_them(fitted):
    out, stdout = fitted
    constants, fit = read_calibration_file(out)
    assert constants is None and fit is not None
    assert fit.freed == ("gemm",) and fit.at_bound == ()
    assert fit.gemm == pytest.approx(0.9, rel=2e-3)  # the penalty's pull: under 0.1 %
    assert [fit.attention, fit.memory, fit.nvlink, fit.nic, fit.overhead_s] == [1, 1, 1, 1, 0]
    assert (fit.gpu, fit.node, fit.measurements) == ("a100-sxm4-80gb", "dgx-a100", 3)
    assert fit.loo_error < 2e-3 and fit.fit_error < 2e-3
    assert "leave-one-out" in stdout and "x0.9" in stdout


def test_a_closed_form_is_fitted_back_to_its_two_parameters_and_says_what_it_kept():
    """T_i = a_i / gemm_efficiency + c_i x overhead + d_i: GEMM and overhead from three runs."""
    base = load_scenario(TINY)
    eff = base.kernel_constants.gemm_efficiency
    shapes = [(1.0, 400.0, 0.2), (2.0, 1000.0, 0.1), (0.5, 800.0, 0.5)]

    def closed_form(scenarios):
        out = []
        for s in scenarios:
            a, c, d = shapes[int(s.name)]
            out.append(
                a * eff / s.kernel_constants.gemm_efficiency + c * s.instruction_overhead_s + d
            )
        return out

    truth = {"gemm": 0.8, "overhead_s": 5e-4}
    runs = []
    for i, (a, c, d) in enumerate(shapes):
        scenario = load_scenario(TINY, [f"name='{i}'"])
        runs.append(MeasuredRun(str(i), scenario, a / truth["gemm"] + c * truth["overhead_s"] + d))
    report = calibrate(runs, closed_form)
    fit = report.full.fit
    assert report.full.freed == ("gemm", "overhead")
    # the penalty toward the built-ins pulls each by its prior / the runs' evidence: < 1 %
    assert fit.gemm == pytest.approx(0.8, rel=3e-3)
    assert fit.overhead_s == pytest.approx(5e-4, rel=1e-2)
    assert report.fit_error < 2e-3
    # d ln T / d ln gemm = -(a / gemm) / T at the built-in values (a one-sided difference)
    for (a, _, d), s in zip(shapes, report.sensitivity["gemm"], strict=True):
        assert s == pytest.approx(-a / (a + d), rel=0.06)
    # one run: one parameter, and the report says the choice was not the run's to make
    one = calibrate(runs[:1], closed_form)
    assert len(one.full.freed) == 1 and one.loo_predicted_s is None
    assert any("under-determined: one run" in note for note in one.full.notes)


def test_a_run_faster_than_any_bound_allows_ends_on_the_bound_and_says_so():
    base = load_scenario(TINY)
    (report,) = [
        calibrate(
            [MeasuredRun("fast", base, 0.5 * seconds(base))], lambda ss: [seconds(s) for s in ss]
        )
    ]
    fit = report.full.fit
    assert fit.at_bound == ("gemm",) and fit.gemm == pytest.approx(0.95 / 0.75)
    assert any("ended on its upper bound" in note for note in report.full.notes)


def test_the_file_round_trips_and_keeps_its_kernel_constants(fitted, tmp_path):
    out, _ = fitted
    _, fit = read_calibration_file(out)
    rows = [{"id": "a", "scenario": TINY, "measured_iteration_s": 0.1}]
    constants = load_scenario(TINY).kernel_constants
    text = dumps_calibration(fit, rows, constants, ["a note"])
    again = tmp_path / "again.toml"
    again.write_text(text)
    constants_back, fit_back = read_calibration_file(again)
    assert constants_back == constants
    assert fit_back.values() == fit.values()
    assert (fit_back.loo_error, fit_back.freed, fit_back.source) == (
        fit.loo_error,
        fit.freed,
        fit.source,
    )
    assert dumps_calibration(fit_back, rows, constants_back, ["a note"]) == text


def test_a_file_for_another_gpu_or_node_is_refused_in_one_line(fitted, tmp_path):
    out, _ = fitted
    code, stdout, stderr = main_in_process(
        "run", "llama3-8b-128k-cp8-h100", "--calibration", str(out), cwd=ROOT
    )
    assert (code, stdout) == (2, "")
    assert stderr.count("\n") == 1
    assert "was fitted on gpu='a100-sxm4-80gb' but the scenario runs on cluster.gpu=" in stderr
    _, fit = read_calibration_file(out)
    other = tmp_path / "other-node.toml"
    other.write_text(out.read_text().replace('node = "dgx-a100"', 'node = "custom"'))
    with pytest.raises(ScenarioError, match="was fitted on node='custom' but the scenario runs"):
        load_scenario(TINY, calibration=other)


def test_run_with_the_fitted_file_is_slower_and_says_so_everywhere(fitted):
    out, _ = fitted
    code, stdout, _ = main_in_process("run", TINY, "--json", "--calibration", str(out), cwd=ROOT)
    assert code == 0
    calibrated = json.loads(stdout)
    builtin = seconds(load_scenario(TINY))
    assert calibrated["iteration_time_s"] > builtin * 1.03  # GEMMs at 0.9: slower
    record = calibrated["calibration_fit"]
    assert record["measurements"] == 3 and record["loo_error"] is not None
    assert record["parameters"]["gemm_scale"] == pytest.approx(0.9, rel=2e-3)
    assert "leave-one-out error" in calibrated["calibration"]
    code, text, _ = main_in_process("run", TINY, "--calibration", str(out), cwd=ROOT)
    assert "calibration fit           3 measured runs, leave-one-out error" in text
    # a clean run's metrics.json keeps its keys
    assert "calibration_fit" not in run(load_scenario(TINY), spans=False).metrics.to_json()
    code, text, _ = main_in_process(
        "plan", "throughput", TINY, "--json", "--calibration", str(out), cwd=ROOT
    )
    assert json.loads(text)["calibration"]["measurements"] == 3


def test_the_identity_fit_changes_nothing_and_the_host_overhead_adds_per_instruction():
    base = load_scenario(TINY)
    assert seconds(apply_fit(base, MeasuredFit())) == seconds(base)  # bit for bit
    # 1F1B on p = 2 stages, m = 8 micro-batches (blocking p2p): the critical path holds
    # 2 (m + p - 1) passes, each waiting the overhead once
    overhead = 1e-3
    added = seconds(apply_fit(base, MeasuredFit(overhead_s=overhead))) - seconds(base)
    assert added == pytest.approx(2 * (8 + 2 - 1) * overhead, rel=1e-9)


@pytest.mark.parametrize("kernel", ["flash", "unfused"])
def test_the_attention_multiplier_divides_the_attention_cores_matmul_time(kernel):
    base = load_scenario(TINY, [f"training.attention_kernel={kernel}"])
    plain, faster = (
        core_kernels(ComputeModel(s)) for s in (base, apply_fit(base, MeasuredFit(attention=2)))
    )
    for before, after in zip(plain[0] + plain[1], faster[0] + faster[1], strict=True):
        ratio = after.work.duration_s / before.work.duration_s
        if kernel == "flash":
            assert 0.5 - 1e-12 <= ratio < 1  # its compute halved, unless its bytes bind
        elif before.name.startswith(("scores", "context")):  # the score and context GEMMs
            assert ratio == pytest.approx(0.5)
        else:
            assert ratio == 1  # softmax and dropout are memory-bound: the memory multiplier's


def test_jobs_take_the_fit_on_the_shared_network(tmp_path):
    from stepsim.scenario import dumps_toml
    from tests.helpers import scenario

    job = {
        "model": {"num_layers": 2, "hidden_size": 512, "num_attention_heads": 8, "seq_length": 512},
        "cluster": {"node": "dgx-a100", "num_nodes": 2, "gpus_per_node": 1, "nics_per_node": 1},
        "parallel": {"data_parallel_size": 2},
        "training": {"micro_batch_size": 1, "global_batch_size": 2},
    }
    (tmp_path / "job.toml").write_text(dumps_toml(scenario(**job)))
    doc = {
        "cluster": job["cluster"],
        "job": [{"name": "a", "scenario": "job.toml", "nodes": "0-1"}],
    }
    (tmp_path / "jobs.toml").write_text(dumps_toml(doc))
    fit = MeasuredFit(nic=0.25, gpu="a100-sxm4-80gb", node="dgx-a100", measurements=2, source="t")
    (tmp_path / "nic.toml").write_text(dumps_calibration(fit, []))
    times = []
    for extra in ((), ("--calibration", str(tmp_path / "nic.toml"))):
        code, stdout, _ = main_in_process("jobs", str(tmp_path / "jobs.toml"), "--json", *extra)
        assert code == 0
        document = json.loads(stdout)
        times.append(document["jobs"][0]["alone_s"])
    assert times[1] > times[0]  # the gradient all-reduce crosses the slower NICs
    assert document["calibration"]["parameters"]["nic_scale"] == 0.25


# -- malformed input: one line naming the line, the column and the rule -------------------

HEADER = "id,scenario,overrides,measured_iteration_s\n"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("id,scenario,time\n", "line 1, column 'time': unknown column; known:"),
        ("id,scenario\na,tiny-2gpu\n", "line 1, column 'measured_iteration_s': missing column"),
        (HEADER + "a,,,0.1\n", "line 2, column 'scenario': is empty"),
        (HEADER + "# a comment\na,tiny-2gpu,,fast\n", "line 3, column 'measured_iteration_s': "),
        (HEADER + "a,tiny-2gpu,,-1\n", "'-1' must be a number of seconds > 0"),
        (HEADER + "a,tiny-2gpu,,nan\n", "line 2, column 'measured_iteration_s'"),
        (HEADER + "a,tiny-2gpu,cluster.num_nodes,0.1\n", "line 2, column 'overrides': "),
        (HEADER + "a,tiny-2gpu,,0.1,9\n", "line 2, column '#5': 5 cells where the header has 4"),
        (HEADER, "holds no measurements"),
        (
            HEADER + "a,tiny-2gpu,,0.1\na,tiny-2gpu,,0.2\n",
            "line 3, column 'id': 'a' names line 2 too",
        ),
        (HEADER + "a,no-such-scenario,,0.1\n", "line 2, column 'scenario': no scenario file"),
        (
            HEADER + "a,tiny-2gpu,parallel.tensor_model_parallel_size=3,0.1\n",
            "line 2, column 'overrides': parallel.tensor_model_parallel_size=3 must divide",
        ),
        (
            HEADER + "a,tiny-2gpu,,0.1\nb,llama3-8b-128k-cp8-h100,,1\n",
            "line 3: runs on gpu='h100-sxm5-80gb', node='dgx-h100' but line 2 on "
            "gpu='a100-sxm4-80gb'",
        ),
    ],
)
def test_bad_measured_csvs_are_one_line_errors(tmp_path, text, expected):
    path = tmp_path / "runs.csv"
    path.write_text(text)
    code, stdout, stderr = main_in_process("calibrate", "--measured", str(path), cwd=ROOT)
    assert (code, stdout) == (2, "")
    assert stderr.count("\n") == 1 and "Traceback" not in stderr
    assert f"{path} " in stderr and expected in stderr


def test_bad_calibrate_flags_are_one_line_errors(fitted, tmp_path):
    out, _ = fitted
    path = write_runs(tmp_path / "runs.csv", MeasuredFit(), {"pp2": ()})
    for args, expected in (
        (("--free", "gemm,flops"), "--free 'flops': not a parameter"),
        (("--calibration", str(out)), "holds a [fit] already"),
    ):
        code, _, stderr = main_in_process("calibrate", "--measured", str(path), *args, cwd=ROOT)
        assert code == 2 and stderr.count("\n") == 1 and expected in stderr
    assert not math.isnan(seconds(load_scenario(TINY)))


def test_a_fit_on_top_of_kernel_constants_keeps_them_in_its_file(tmp_path):
    from stepsim.calibration.fit import calibration_toml

    base = load_scenario(TINY).kernel_constants
    kernels = tmp_path / "kernels.toml"
    kernels.write_text(calibration_toml(replace(base, gemm_efficiency=0.6, source="mine"), [], []))
    runs = write_runs(tmp_path / "runs.csv", MeasuredFit(), {"pp2": ()})
    out = tmp_path / "both.toml"
    argv = ("calibrate", "--measured", str(runs), "--calibration", str(kernels), "--out", str(out))
    code, stdout, _ = main_in_process(*argv, "--quiet", cwd=ROOT)
    assert code == 0 and "not available with one run" in stdout
    constants, fit = read_calibration_file(out)
    assert constants is not None and constants.gemm_efficiency == 0.6
    assert fit is not None and fit.measurements == 1 and fit.loo_error is None
    assert fit.gemm > 1  # the built-in times, measured on top of slower kernel constants
    label = run(load_scenario(TINY, calibration=out), spans=False).metrics.calibration
    assert label.endswith("on kernel constants mine") and "no leave-one-out error" in label
