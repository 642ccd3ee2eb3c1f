"""What a result rests on is said wherever a planner reads one (report/labels.py): the
kernel constants' provenance and the assumptions that may flatter it, in the text
header, the JSON document and every CSV row of run, sweep, search and plan."""

import csv
import json
from dataclasses import replace

from stepsim.report.labels import assumptions, fabric_text, labels
from stepsim.scenario import load_scenario
from tests.helpers import main_in_process

TWO_NODES = ("--set", "cluster.num_nodes=2")  # tiny-2gpu on two nodes of one switch
SMALLER = ("--set", "cluster.gpu=a100-sxm4-40gb")  # its constants are scaled, uncalibrated
SWITCH = "one non-blocking switch joins all the nodes"


def test_one_node_assumes_nothing_two_on_one_switch_say_so():
    one = load_scenario("tiny-2gpu")
    assert assumptions(one) == () and fabric_text(one.cluster) == "one node"
    two = load_scenario("tiny-2gpu", ["cluster.num_nodes=2"])
    (said,) = assumptions(two)
    assert said.startswith(SWITCH)
    tree = load_scenario("tiny-2gpu", ["cluster.num_nodes=2", "cluster.fabric=fat-tree"])
    assert assumptions(tree) == () and "fat tree" in fabric_text(tree.cluster)


def test_a_custom_node_at_line_rate_and_scaled_constants_are_labelled():
    base = load_scenario("tiny-2gpu", ["cluster.gpu=a100-sxm4-40gb"])
    assert labels(base)["uncalibrated"] and "uncalibrated" in labels(base)["label"]
    line_rate = {"nvlink_efficiency": 1.0, "nic_efficiency": 1.0}  # a custom node's defaults
    custom = replace(base, cluster=replace(base.cluster, node=None, **line_rate))
    assert any("full line rate" in a for a in assumptions(custom))
    assert not labels(load_scenario("tiny-2gpu"))["uncalibrated"]


def test_run_says_it_in_its_summary_and_metrics():
    code, stdout, _ = main_in_process("run", "tiny-2gpu", *TWO_NODES, *SMALLER, "--quiet")
    assert code == 0
    assert "one non-blocking switch for all 2 nodes" in stdout  # the header names the fabric
    assert f"assumes                   {SWITCH}" in stdout
    assert "uncalibrated: scaled from a100-sxm4-80gb" in stdout
    code, stdout, _ = main_in_process("run", "tiny-2gpu", *TWO_NODES, "--json")
    assert json.loads(stdout)["assumptions"][0].startswith(SWITCH)


def test_sweep_says_it_in_its_header_json_and_every_csv_row(tmp_path):
    args = ("sweep", "tiny-2gpu", *TWO_NODES, *SMALLER, "--set", "training.micro_batch_size=1,2")
    code, stdout, _ = main_in_process(*args, "--quiet")
    head = stdout.splitlines()[:3]
    assert code == 0 and head[0] == "stepsim sweep · tiny-2gpu"
    assert "uncalibrated" in head[1] and head[2].startswith(f"  assumes: {SWITCH}")
    code, stdout, _ = main_in_process(*args, "--json")
    record = json.loads(stdout)["calibration"]
    assert record["uncalibrated"] and record["assumptions"][0].startswith(SWITCH)
    code, _, _ = main_in_process(*args, "--out", str(tmp_path), "--quiet")
    with (tmp_path / "sweep.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    assert all("uncalibrated" in r["calibration"] and SWITCH in r["assumptions"] for r in rows)


def test_plan_and_search_say_it_in_their_header_and_json():
    for args in (
        ("plan", "throughput", "tiny-2gpu", *TWO_NODES, *SMALLER, "--tokens", "1e9"),
        ("plan", "fit", "tiny-2gpu", *TWO_NODES, *SMALLER, "--nodes", "2", "--no-simulate"),
        ("search", "tiny-2gpu", *TWO_NODES, *SMALLER, "--top", "2"),
    ):
        code, stdout, stderr = main_in_process(*args, "--quiet")
        assert code == 0, stderr
        head = "\n".join(stdout.splitlines()[:6])
        assert "calibration: uncalibrated: scaled from" in head, args
        assert f"assumes: {SWITCH}" in head, args
        code, stdout, _ = main_in_process(*args, "--json", "--quiet")
        record = json.loads(stdout)["calibration"]
        assert record["uncalibrated"] and record["assumptions"][0].startswith(SWITCH), args


def test_a_layout_simulated_out_of_memory_says_so_among_its_assumptions():
    from stepsim.run.iteration import run

    grown = ["model.seq_length=8192", "training.micro_batch_size=64"]
    grown += ["training.global_batch_size=512"]
    metrics = run(load_scenario("tiny-2gpu", grown), spans=False).metrics
    assert metrics.out_of_memory is not None
    assert "does not fit in GPU memory, simulated anyway" in metrics.assumptions


def test_what_the_framework_turned_off_is_among_the_assumptions():
    """zbh1 splits the backward, so the async TP all-reduce is off (frameworks.resolve)."""
    said = assumptions(load_scenario("tiny-2gpu", ["training.schedule=zbh1"]))
    assert any("async TP all-reduce off for zbh1" in a for a in said)


def test_an_overlap_the_framework_offers_and_the_scenario_leaves_off_is_labelled():
    # DeepSeek-V3 runs DualPipe with its expert all-to-all overlap off (its file says why)
    (said,) = [
        a for a in assumptions(load_scenario("deepseek-v3-2048-h800")) if "not overlapped" in a
    ]
    assert "training.overlap_moe_expert_parallel_comm" in said
    # Mixtral on Megatron-Core 2025 with SP and tp_comm_overlap off: labelled; on
    # Megatron-LM 2022, which has no userbuffers overlap, not
    mixtral = load_scenario("mixtral-8x7b-16-h100")
    assert any("training.tp_comm_overlap" in a for a in assumptions(mixtral))
    on = load_scenario("mixtral-8x7b-16-h100", ["training.tp_comm_overlap=true"])
    assert not any("training.tp_comm_overlap" in a for a in assumptions(on))
    old = load_scenario("mixtral-8x7b-16-h100", ['training.framework_version="2022"'])
    assert not any("not overlapped" in a for a in assumptions(old))
    # DeepSpeed's pipeline engine offers none of them
    assert not any(
        "not overlapped" in a for a in assumptions(load_scenario("mt-nlg-530b-420nodes"))
    )
