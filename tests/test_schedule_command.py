"""`stepsim schedule`: the bubble study against the reference vectors, pictures,
custom schedule files and their errors."""

import json
from pathlib import Path

import pytest

from stepsim.cli import main
from stepsim.schedules import build, step_label
from stepsim.schedules.custom import check_orders, parse_orders
from tests import trace_check

VECTORS = json.loads((Path(__file__).parent / "data" / "pipeline_vectors.json").read_text())


def _args(case):
    # the reference file's "zbv" is the unit-time greedy, stepsim's `zbv_unit`
    name = {"zbv": "zbv_unit"}.get(case["schedule"], case["schedule"])
    args = ["schedule", "--schedule", name, "--stages", str(case["p"])]
    args += ["--microbatches", str(case["m"]), "--chunks", str(case["v"])]
    args += ["--forward", str(case["F"]), "--backward", str(case["B"])]
    args += ["--weight", str(case["W"]), "--p2p-latency", str(case["c"])]
    group = case.get("group_size")
    if group and case["schedule"].startswith("interleaved"):
        args += ["--group-size", str(group)]
    return args + ["--json"]


@pytest.mark.parametrize("case", VECTORS["cases"], ids=[c["id"] for c in VECTORS["cases"]])
def test_json_reproduces_every_reference_vector(case, capsys):
    assert main(_args(case)) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["rank_order"] == case["rank_order"]
    assert got["makespan"] == pytest.approx(case["makespan"], abs=1e-9)
    assert got["per_rank_bubble"] == pytest.approx(case["per_rank_bubble"], abs=1e-9)
    assert got["bubble_over_ideal"] == pytest.approx(case["bubble_ratio"], abs=1e-8)
    fraction = (case["makespan"] - got["ideal"]) / case["makespan"]
    assert got["bubble_fraction"] == pytest.approx(fraction, abs=1e-8)
    assert got["per_rank_peak_inflight_w"] == case["per_rank_peak_inflight_w"]


def test_compare_prints_a_table_and_draws_the_picture(tmp_path, capsys):
    args = ["schedule", "--compare", "1f1b,interleaved,zbh1,zbv", "--stages", "4"]
    args += ["--microbatches", "8", "--forward", "1", "--backward", "1", "--weight", "1"]
    assert main(args + ["--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    for name in ("1f1b", "interleaved", "zbh1", "zbv"):
        assert f"\n  {name} " in printed
    assert (tmp_path / "schedule.png").stat().st_size > 20_000
    trace = json.loads((tmp_path / "trace.json").read_text())
    ops = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    # 4 schedules x 4 ranks x 8 micro-batches x (F, B[, W]) x chunks
    assert len(ops) == 4 * 8 * (2 + 2 * 2 + 3 + 3 * 2)
    assert trace_check.problems(trace) == []  # whole nanoseconds: nothing Perfetto drops
    assert main(args + ["--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["schedule"] for r in rows] == ["1f1b", "interleaved", "zbh1", "zbv"]
    assert rows[0]["makespan"] == pytest.approx((8 + 3) * 3.0)  # (m + p - 1)(F + B + W)


def _write_orders(path, orders, v=1):
    path.write_text("\n".join(" ".join(step_label(s, v) for s in o) for o in orders) + "\n")


def test_a_schedule_file_runs_like_the_named_schedule(tmp_path, capsys):
    path = tmp_path / "mine.txt"
    _write_orders(path, build("interleaved", 4, 8, 2), v=2)
    times = ["--forward", "1", "--backward", "2", "--json"]
    assert main(["schedule", "--schedule-file", str(path), *times]) == 0
    mine = json.loads(capsys.readouterr().out)
    assert main(["schedule", "--schedule", "interleaved", "--stages", "4", "--microbatches", "8",
                 *times]) == 0  # fmt: skip
    named = json.loads(capsys.readouterr().out)
    assert mine["makespan"] == named["makespan"] and mine["rank_order"] == named["rank_order"]
    assert mine["schedule"] == "mine"


def test_parse_accepts_commas_comments_and_rank_prefixes():
    text = "# two ranks\nrank 0: F0, F1, B0, B1\n\nrank 1: F0 B0 F1 B1  # 1F1B\n"
    orders = parse_orders(text)
    assert [len(o) for o in orders] == [4, 4]
    check_orders(orders)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("F0 F1 B0\nF0 B0 F1 B1", "rank 0: B1 is missing"),
        ("F0 F1 B0 B1 B1\nF0 B0 F1 B1", "rank 0: B1 appears twice"),
        ("F0 B1 F1 B0\nF0 B0 F1 B1", "rank 0: B1 comes before F1"),
        ("F0 F1 B0 W0 B1 W1\nF0 B0 F1 W1 B1 W0", "rank 1: W1 comes before B1"),
        ("F0 B0 F1 B1\nB0 F0 F1 B1", "rank 1: B0 comes before F0"),
        ("F0 Q1", "line 1, op 2: not an op label"),  # its text is not echoed
        ("# nothing\n", "no op orders found"),
        (None, "No such file or directory"),
        ("rank 1: F0 B0\nrank 0: F0 B0", "line 1: 'rank 1:' where rank 0 is next"),
        # rank 0 waits for B0 before sending F1; rank 1 wants F1 before its B0
        ("F0 B0 F1 B1\nF0 F1 B0 B1", "the orders deadlock: rank 0 at B0 waits for B0 on rank 1"),
    ],
)
def test_bad_schedule_files_get_one_line(tmp_path, capsys, text, message):
    path = tmp_path / "bad.txt"
    if text is not None:
        path.write_text(text)
    assert main(["schedule", "--schedule-file", str(path), "--forward", "1", "--backward", "1",
                 "--weight", "1"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--schedule", "zbh1"], "--weight is required for 'zbh1'"),
        (["--schedule", "zigzag", "--weight", "1"], "schedule 'zigzag' is not one of"),
        (["--schedule", "interleaved", "--microbatches", "6"], "multiple of the micro-batch"),
        (["--schedule", "1f1b", "--forward", "-1"], "--forward=-1.0 must be a finite number"),
        (["--schedule", "1f1b", "--stages", "0"], "--stages=0 must be between 1 and 100000"),
        (["--schedule", "1f1b", "--stages", "1000", "--microbatches", "10000"], "over the limit"),
        (["--schedule", "zbv", "--weight", "1", "--chunks", "3"], "schedule 'zbv' runs 2 chunks"),
        (["--schedule", "zbh1", "--weight", "1", "--group-size", "4"], "takes no micro-batch"),
        (["--schedule", "1f1b", "--forward", "1e308", "--backward", "1e308"], "must be <= 1e12"),
    ],
)
def test_bad_arguments_exit_2_with_the_rule(capsys, args, message):
    base = {"--stages": "4", "--microbatches": "8", "--forward": "1", "--backward": "2"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    argv = ["schedule"] + [x for pair in base.items() for x in pair]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_v_placement_needs_two_chunks(tmp_path, capsys):
    path = tmp_path / "v3.txt"
    path.write_text("F0.0 F0.1 F0.2 B0.2 B0.1 B0.0\nF0.0 F0.1 F0.2 B0.2 B0.1 B0.0\n")
    args = ["schedule", "--schedule-file", str(path), "--placement", "v"]
    assert main(args + ["--forward", "1", "--backward", "1"]) == 2
    assert "a V placement holds exactly 2 chunks per rank; the orders have 3" in (
        capsys.readouterr().err
    )


def test_op_times_are_checked_before_anything_runs():
    from stepsim.run.bubble import OpTimes, op_times
    from stepsim.scenario import ScenarioError

    assert op_times(1.0, 2.0, None, 0.5) == OpTimes(
        forward=1.0, backward=2.0, weight=0.0, p2p_latency=0.5
    )
    with pytest.raises(ScenarioError, match=r"^--weight=-1.0 must be a finite number >= 0$"):
        op_times(1.0, 2.0, -1.0, 0.0)
    with pytest.raises(ScenarioError, match="cannot all be 0"):
        op_times(0.0, 0.0, None, 0.0)
    with pytest.raises(ScenarioError, match="must be <= 1e12"):
        op_times(1.0, 1.0, None, 2e12)


def test_sizes_and_the_op_limit():
    from stepsim.run.bubble import OpTimes, check_sizes, studies_of_schedules
    from stepsim.scenario import ScenarioError

    check_sizes({"--stages": 100_000, "--chunks": None})
    with pytest.raises(ScenarioError, match=r"^--stages=0 must be between 1 and 100000$"):
        check_sizes({"--stages": 0})
    times = OpTimes(forward=1.0, backward=2.0)
    # p m 3 max(v, 2) ops per schedule: 1000 x 200 x 3 x 2 = 1.2 M > 1 M
    with pytest.raises(ScenarioError, match="about 1,200,000 ops, over the limit of 1,000,000"):
        studies_of_schedules(["1f1b"], 1000, 200, times, weight_given=False)
    # two schedules of 1000 x 100 x 3 x 2 = 0.6 M each: 1.2 M in all
    with pytest.raises(ScenarioError, match="x 2 schedule.s. means about 1,200,000 ops"):
        studies_of_schedules(["1f1b", "gpipe"], 1000, 100, times, weight_given=False)
    with pytest.raises(ScenarioError, match=r"^--microbatches is required"):
        studies_of_schedules(["1f1b"], 4, None, times, weight_given=False)


def test_named_schedules_resolve_their_chunks_and_check_the_weight():
    from stepsim.run.bubble import OpTimes, studies_of_schedules
    from stepsim.scenario import ScenarioError

    times = OpTimes(forward=1.0, backward=2.0, weight=1.0)
    studies = studies_of_schedules(
        ["1f1b", "interleaved", "zbv"], 4, 8, times, weight_given=True, chunks=4
    )
    # --chunks applies where it can when comparing; ZB-V always runs a V of 2
    assert [s.num_chunks for s in studies] == [1, 4, 2]
    # 1F1B on 4 stages, 8 micro-batches, fused backward B + W: (m + p - 1)(F + B + W)
    assert studies[0].makespan == (8 + 4 - 1) * (1.0 + 2.0 + 1.0)
    with pytest.raises(ScenarioError, match=r"^--chunks=4: schedule 'zbv' runs 2 chunks$"):
        studies_of_schedules(["zbv"], 4, 8, times, weight_given=True, chunks=4)
    with pytest.raises(ScenarioError, match=r"^--weight is required for 'zbh1'"):
        studies_of_schedules(["zbh1"], 4, 8, times, weight_given=False)
