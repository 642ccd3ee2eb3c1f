"""Calibrating the network to nccl-tests logs (`stepsim calibrate --nccl-tests`): a log
that stepsim's own model printed is fitted back to the constants that made it; a real
log (2 x 8 H100, nccl-tests' own output, scenarios/validation/collectives/README.md
cites it) is fitted and every size's residual reported; which collective a log timed is
read from it or refused in one line; the file round-trips, labels what uses it, and
combines with a fit on measured iterations. No published number is asserted to digits."""

import json
import math
from dataclasses import replace

import pytest

from stepsim.calibration.nccl import (
    KIND_NAMES,
    Network,
    bus_factor,
    calibrate_network,
    collective_log,
    is_large,
    log_kind,
)
from stepsim.ir.vocabulary import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, REDUCE_SCATTER
from stepsim.run.iteration import build_cluster
from stepsim.scenario import ScenarioError, load_scenario
from stepsim.scenario.files import parse_nccl_tests, read_calibration_file
from stepsim.scenario.fitted import MeasuredFit
from tests.helpers import ROOT, main_in_process

TINY = "tiny-2gpu"  # a dgx-a100 node cut to 2 GPUs and 2 NICs
H100_LOG = (
    ROOT / "scenarios/validation/collectives/nccl_logs/h100_2node_16gpu_all_reduce_a3mega.txt"
)
SIZES = (1024, 65536, 2**20, 2**24, 2**30, 2**32)  # the last two bandwidth-bound on 4 ranks
REDOP = {ALL_REDUCE: "sum", REDUCE_SCATTER: "sum", ALL_GATHER: "none", ALL_TO_ALL: "none"}


def log_text(kind, hosts, per_host, times_s, sizes=SIZES, device="NVIDIA A100-SXM4-80GB"):
    """nccl-tests' output for ``times_s`` (seconds per size), ranks host-major."""
    n = hosts * per_host
    lines = ["# nThread 1 nGpus 1 minBytes 1024 maxBytes 4294967296 step: 2(factor)", "#"]
    lines.append("# Using devices")
    for r in range(n):
        lines.append(
            f"#  Rank {r:2d} Group  0 Pid {100 + r} on host{r // per_host} device "
            f"{r % per_host} [0000:0{r % per_host}:00] {device}"
        )
    lines.append("#       size         count      type   redop    root     time   algbw   busbw")
    for size, t in zip(sizes, times_s, strict=True):
        us = t * 1e6
        algbw = size / t / 1e9
        busbw = algbw * bus_factor(kind, n)
        count = size // 4 if kind == ALL_REDUCE else size // 4 // n
        cells = f"{us:.6f} {algbw:.4f} {busbw:.4f} 0"
        lines.append(f"{size} {count} float {REDOP[kind]} -1 {cells} {cells}")
    return "\n".join(lines) + "\n"


def simulated_log(kind, truth: MeasuredFit, hosts=2, per_host=2, sizes=SIZES):
    """The log stepsim's model prints for ``kind`` on the tiny cluster with ``truth``."""
    cluster = load_scenario(TINY).cluster
    network = Network(cluster, build_cluster)
    blank = parse_nccl_tests(log_text(kind, hosts, per_host, [1.0] * len(sizes), sizes), "x")
    log = collective_log(blank, "x", kind, cluster.gpus_per_node)
    times = [network.run(log, p, truth)[0] for p in log.points]
    return log_text(kind, hosts, per_host, times, sizes)


def fit_text(text, name="log.txt", given=None):
    cluster = load_scenario(TINY).cluster
    log = parse_nccl_tests(text, name)
    kind = log_kind(log, name, given)
    collective = collective_log(log, name, kind, cluster.gpus_per_node)
    return calibrate_network(Network(cluster, build_cluster), [collective], "a", "b")


def test_a_curve_stepsim_printed_across_two_nodes_is_fitted_back_exactly():
    truth = MeasuredFit(nic=0.6, collective_base_latency_us=30.0)
    report = fit_text(simulated_log(ALL_REDUCE, truth))
    fit = report.full.fit
    assert report.full.freed == ("nic", "base_latency")
    assert fit.nic == pytest.approx(0.6, rel=1e-6)
    assert fit.collective_base_latency_us == pytest.approx(30.0, rel=1e-6)
    assert fit.nvlink == 1.0 and fit.nvlink_latency_us is None and fit.ib_latency_us is None
    assert report.full.error < 1e-6 < report.full.builtin_error


def test_inside_one_node_the_nvlink_efficiency_is_fitted_and_the_nic_left_alone():
    truth = MeasuredFit(nvlink=0.8)
    sizes = (2**20, 2**29, 2**30)
    report = fit_text(simulated_log(ALL_GATHER, truth, hosts=1, sizes=sizes), "all_gather.txt")
    assert report.full.fit.nvlink == pytest.approx(0.8, rel=1e-6)
    assert report.full.fit.nic == 1.0
    assert any(n.startswith("nic: no size of the logs moves it") for n in report.full.notes)


def test_the_bandwidth_bound_sizes_are_those_of_128_mib_a_rank():
    log = collective_log(
        parse_nccl_tests(log_text(ALL_REDUCE, 2, 2, [1.0] * 6), "x"), "x", ALL_REDUCE, 2
    )
    assert [is_large(log, p) for p in log.points] == [False] * 4 + [True] * 2
    assert bus_factor(ALL_REDUCE, 16) == 2 * 15 / 16 and bus_factor(ALL_GATHER, 16) == 15 / 16


def test_which_collective_a_log_timed_comes_from_its_command_its_name_or_its_columns():
    text = log_text(ALL_GATHER, 2, 2, [1e-3] * 6)
    with pytest.raises(ScenarioError, match="give --collective"):
        log_kind(parse_nccl_tests(text, "x"), "run1.txt")  # all-gather and all-to-all alike
    assert log_kind(parse_nccl_tests(text, "x"), "my_all_gather_run.txt") == ALL_GATHER
    echoed = "$ mpirun -np 4 ./build/alltoall_perf -b 1K -e 4G\n" + text
    assert log_kind(parse_nccl_tests(echoed, "x"), "run1.txt") == ALL_TO_ALL
    assert log_kind(parse_nccl_tests(text, "x"), "run1.txt", ALL_TO_ALL) == ALL_TO_ALL
    reduce = log_text(ALL_REDUCE, 2, 2, [1e-3] * 6)
    assert log_kind(parse_nccl_tests(reduce, "x"), "run1.txt") == ALL_REDUCE
    with pytest.raises(ScenarioError, match=r"says all_gather, but its busbw / algbw is 1\.500"):
        log_kind(parse_nccl_tests(reduce, "x"), "all_gather.txt")
    assert KIND_NAMES[REDUCE_SCATTER] == "reduce_scatter"


@pytest.fixture(scope="module")
def h100_fit(tmp_path_factory):
    out = tmp_path_factory.mktemp("nccl") / "net.toml"
    code, stdout, stderr = main_in_process(
        "calibrate",
        "--nccl-tests",
        str(H100_LOG),
        "--scenario",
        "llama2-70b-64nodes-h100",
        "--out",
        str(out),
        "--json",
        "--quiet",
    )
    assert (code, stderr) == (0, "")
    return out, json.loads(stdout)


def test_a_real_two_node_log_gets_the_nic_and_a_latency_and_every_size_reported(h100_fit):
    out, document = h100_fit
    network = document["network"]
    sizes = network["logs"][0]["sizes"]
    assert len(sizes) == 31 and network["logs"][0]["collective"] == "all_reduce"
    assert network["parameters"]["nic"]["freed"] and network["parameters"]["nic"]["value"] < 1
    assert not network["parameters"]["nvlink"]["freed"]  # one group over two nodes: the NICs
    assert network["fit_error"] < network["builtin_error"]
    large = [s for s in sizes if s["size_bytes"] / 16 >= 2**27]
    assert len(large) == 3
    assert all(abs(s["fitted_s"] / s["measured_s"] - 1) < 0.05 for s in large)
    _, fit = read_calibration_file(out)
    assert fit.collective_logs == 1 and fit.collective_sizes == 31 and fit.measurements == 0
    assert fit.collective_loo_error is None and "nic" in fit.collective_freed


def test_a_network_fit_is_applied_and_labelled_where_it_is_used(h100_fit, tmp_path):
    out, _ = h100_fit
    _, fit = read_calibration_file(out)
    base = load_scenario("llama2-70b-64nodes-h100")
    used = load_scenario("llama2-70b-64nodes-h100", calibration=out)
    assert used.cluster.nic_efficiency == pytest.approx(base.cluster.nic_efficiency * fit.nic)
    assert used.cluster.collective_base_latency_us == fit.collective_base_latency_us
    assert used.cluster.ib_latency_us == base.cluster.ib_latency_us  # not fitted: kept
    code, stdout, stderr = main_in_process(
        "run",
        "llama2-70b-64nodes-h100",
        "--calibration",
        str(out),
        "--set",
        "training.global_batch_size=64",
        "--quiet",
    )
    assert code == 0, stderr
    assert "1 nccl-tests log (31 sizes)" in stdout and "collectives within" in stdout
    code, _, stderr = main_in_process("run", "qwen3-235b-a22b-64-b200", "--calibration", str(out))
    assert code == 2 and "was fitted on gpu='h100-sxm5-80gb'" in stderr


def test_the_calibration_file_keeps_the_latencies_and_refuses_them_out_of_bounds(tmp_path):
    path = tmp_path / "c.toml"
    head = '[fit]\ngpu = "a100-sxm4-80gb"\nnode = "dgx-a100"\nmeasurements = 0\nsource = "t"\n'
    path.write_text(head + "collective_sizes = 3\ncollective_logs = 1\nib_latency_us = 7.5\n")
    _, fit = read_calibration_file(path)
    assert fit.ib_latency_us == 7.5 and fit.collective_base_latency_us is None
    assert "ib latency 7.5 us" in fit.label()
    path.write_text(head + "collective_sizes = 3\ncollective_logs = 1\nib_latency_us = 500.0\n")
    with pytest.raises(ScenarioError, match="ib_latency_us"):
        read_calibration_file(path)
    path.write_text(head)
    with pytest.raises(ScenarioError, match="one measurement at least"):
        read_calibration_file(path)


def test_bad_logs_and_wrong_clusters_are_one_line_errors(tmp_path):
    bad = tmp_path / "all_reduce.txt"
    text = log_text(ALL_REDUCE, 2, 2, [1e-3] * 6)
    bad.write_text(text.replace("1073741824 ", "1073741824 x ", 1))
    code, _, stderr = main_in_process("calibrate", "--nccl-tests", str(bad), "--scenario", TINY)
    assert code == 2 and "line 13" in stderr and len(stderr.strip().splitlines()) == 1
    h100 = tmp_path / "h100_all_reduce.txt"
    h100.write_text(log_text(ALL_REDUCE, 2, 2, [1e-3] * 6, device="NVIDIA H100 80GB HBM3"))
    code, _, stderr = main_in_process("calibrate", "--nccl-tests", str(h100), "--scenario", TINY)
    assert code == 2 and "ran on 'NVIDIA H100 80GB HBM3'" in stderr
    wide = tmp_path / "wide_all_reduce.txt"
    wide.write_text(log_text(ALL_REDUCE, 1, 4, [1e-3] * 6))
    code, _, stderr = main_in_process("calibrate", "--nccl-tests", str(wide), "--scenario", TINY)
    assert code == 2 and "device 2 of host0" in stderr and "2 GPUs" in stderr
    code, _, stderr = main_in_process("calibrate", "--nccl-tests", str(wide))
    assert code == 2 and "give --scenario" in stderr
    code, _, stderr = main_in_process("calibrate")
    assert code == 2 and "--measured CSV" in stderr


def test_a_log_without_rank_lines_takes_its_ranks_from_the_command_line(tmp_path):
    truth = MeasuredFit(nic=0.5)
    text = simulated_log(ALL_REDUCE, truth)
    bare = tmp_path / "all_reduce.txt"
    bare.write_text("\n".join(x for x in text.splitlines() if "Rank" not in x) + "\n")
    out = tmp_path / "c.toml"
    code, _, stderr = main_in_process("calibrate", "--nccl-tests", str(bare), "--scenario", TINY)
    assert code == 2 and "give --ranks N" in stderr
    code, _, stderr = main_in_process(
        "calibrate",
        "--nccl-tests",
        str(bare),
        "--scenario",
        TINY,
        "--ranks",
        "4",
        "--out",
        str(out),
        "--quiet",
    )
    assert code == 0, stderr
    assert read_calibration_file(out).fit.nic == pytest.approx(0.5, rel=1e-6)


def test_measured_iterations_are_fitted_on_top_of_the_network_and_leave_its_nic_alone(tmp_path):
    """Logs fix the NIC; the runs' GEMM efficiency is then fitted with the NIC held."""
    from tests.test_calibrate import write_runs

    truth_net = MeasuredFit(nic=0.5)
    log = tmp_path / "all_reduce.txt"
    log.write_text(simulated_log(ALL_REDUCE, truth_net))
    runs = write_runs(tmp_path / "runs.csv", MeasuredFit(gemm=0.9, nic=0.5))
    out = tmp_path / "c.toml"
    code, stdout, stderr = main_in_process(
        "calibrate",
        "--nccl-tests",
        str(log),
        "--measured",
        str(runs),
        "--out",
        str(out),
        "--quiet",
        "--no-loo",
    )
    assert code == 0, stderr
    _, fit = read_calibration_file(out)
    assert fit.nic == pytest.approx(0.5, rel=1e-6) and "nic" not in fit.freed
    assert fit.gemm == pytest.approx(0.9, rel=2e-3) and fit.freed == ("gemm",)
    assert fit.measurements == 3 and fit.collective_logs == 1
    assert "network fitted on 1 nccl-tests log" in stdout and "x0.9" in stdout
    code, _, stderr = main_in_process(
        "calibrate", "--nccl-tests", str(log), "--measured", str(runs), "--free", "nic"
    )
    assert code == 2 and "fitted it already" in stderr
    assert math.isfinite(replace(fit, file="").nic)
