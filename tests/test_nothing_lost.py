"""Nothing silently reused, nothing said that did not run (issue 33): a damaged or foreign
search journal is refused, sizes are refused before work starts, what is written is what
ran, and error lines stay lines."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers import ROOT, main_in_process

from stepsim.cli.cmd_schedule import PANEL_OPS, builder_ops, schedule_work
from stepsim.cost.params import stage_params_per_rank
from stepsim.plan.answers import best_of, ordinal
from stepsim.scenario import ScenarioError, load_scenario
from stepsim.scenario.errors import MAX_MESSAGE, MAX_VALUE
from stepsim.scenario.journal import LAYOUT_KEY, parse_search_journal
from stepsim.scenario.limits import pipeline_params

TINY = str(ROOT / "scenarios" / "tiny-2gpu.toml")
WHAT = "search journal 'J/search.jsonl'"
HEADER = json.dumps({"search": {"version": "0", "scenario": {}, "calibration": None}})
KEY = "tp1-pp2-dp1-mb1-1f1b-v1-none-none-nosp"
ROW = {
    "iteration_time_s": 0.05,
    "hardware_tflops_per_gpu": 100.0,
    "model_tflops_per_gpu": 90.0,
    "mfu": 0.3,
    "bubble_fraction": 0.2,
    "num_gpus": 2,
    "num_microbatches": 8,
    "tokens_per_s": 3e5,
    "memory_per_gpu_gib": 3.0,
    "breakdown_s.compute": 0.04,
    "breakdown_s.tp_comm": 0.0,
    "breakdown_s.pp_p2p": 0.001,
    "breakdown_s.dp_sync": 0.0,
    "breakdown_s.optimizer": 0.001,
    "breakdown_s.idle": 0.008,
    "exposed_comm_fraction": 0.02,
    "fits_in_memory": True,
}


def _row(key: str = KEY, **changes) -> str:
    return json.dumps({"layout": key, "row": {**ROW, **changes}})


def _journal_error(text: str) -> str:
    with pytest.raises(ScenarioError) as caught:
        parse_search_journal(text, WHAT)
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and message.startswith(WHAT)
    assert "delete the file" in message
    return message


# -- 1. a journal verifies itself -------------------------------------------------------


def test_a_good_journal_reads_back_its_header_and_rows():
    header, rows = parse_search_journal(f"{HEADER}\n{_row()}\n", WHAT)
    assert header == json.loads(HEADER)["search"] and rows == {KEY: ROW}


@pytest.mark.parametrize(
    "text, said",
    [
        ("", "is empty"),
        ("\n\n", "line 1"),  # a blank first line is no header
        ("x" + HEADER + "\n" + _row() + "\n", "line 1 is cut short or not JSON"),
        (HEADER[:40], "line 1 is cut short or not JSON"),
        ('{"search": {}}\n' + _row() + "\n", "line 1 names no search"),
        ("[1, 2]\n", "line 1 names no search"),
        ('{"layout": "x"}\n', "line 1 names no search"),
    ],
)
def test_a_missing_empty_cut_or_foreign_header_is_refused(text, said):
    assert said in _journal_error(text)


@pytest.mark.parametrize(
    "row, said",
    [
        (_row(iteration_time_s=-1), "line 3 (" + KEY + "): iteration_time_s=-1 must be > 0"),
        (_row(iteration_time_s=0), "iteration_time_s=0 must be > 0"),
        (_row(iteration_time_s=math.nan), "iteration_time_s=nan must be finite"),
        (_row(mfu=math.inf), "mfu=inf must be finite"),
        (_row(mfu=-0.5), "mfu=-0.5 must be >= 0"),
        (_row(tokens_per_s="fast"), 'tokens_per_s="fast" must be a number'),
        (_row(num_gpus=1.5), "num_gpus=1.5 must be a whole number >= 1"),
        (_row(fits_in_memory=1), "fits_in_memory=1 must be true or false"),
        (json.dumps({"layout": KEY, "row": {"iteration_time_s": 1.0}}), "has no"),
        (json.dumps({"layout": KEY, "row": [1]}), "its row is not a JSON object"),
        (_row("tp1-pp2; rm -rf"), "is not a layout name"),
        (_row("tp0-pp2-dp1-mb1-1f1b-v1-none-none-nosp"), "is not a layout name"),
        (json.dumps({"layout": KEY}), "line 3 is not a row"),
        (HEADER, "line 3 is not a row"),  # a second header (another run's)
        ("x" + _row(), "line 3 is damaged (not JSON)"),
    ],
)
def test_every_row_is_checked_before_it_is_reused(row, said):
    text = "\n".join([HEADER, _row("tp2-pp1-dp1-mb1-1f1b-v1-none-none-nosp"), row, _row()]) + "\n"
    assert said in _journal_error(text)


def test_a_row_cut_by_an_interrupted_write_is_dropped_and_the_next_run_appends_cleanly():
    cut = _row()[:50]
    header, rows = parse_search_journal(f"{HEADER}\n{cut}", WHAT)
    assert rows == {}  # the cut row is simulated again
    other = "tp2-pp1-dp1-mb1-1f1b-v1-none-none-nosp"
    # the resumed run appends its first row to the cut line; it is kept
    header, rows = parse_search_journal(f"{HEADER}\n{cut}{_row(other)}\n{_row()}\n", WHAT)
    assert set(rows) == {other, KEY}


def test_layout_keys_the_search_writes_are_well_formed():
    from stepsim.plan.space import SearchSpace, layouts

    base = load_scenario(TINY)
    keys = [layout.key for layout in layouts(base, SearchSpace())]
    assert keys and all(LAYOUT_KEY.fullmatch(k) for k in keys)
    assert LAYOUT_KEY.fullmatch("tp8-pp12-first5-last5-dp2-mb1-interleaved_zb-v2-full-optimizer-sp")


def _search(out: Path, *extra: str) -> tuple[int, str, str]:
    return main_in_process(
        "search", TINY, "--tp", "1", "--pp", "2", "--micro-batch", "1,2", "--recompute",
        "none", "--sharding", "none", "--schedules", "1f1b", "--jobs", "1", "--out", str(out),
        *extra,
    )  # fmt: skip


def test_a_damaged_journal_of_another_search_is_refused_not_reused(tmp_path):
    code, _, _ = _search(tmp_path)
    assert code == 0
    journal = tmp_path / "search.jsonl"
    journal.write_text("x" + journal.read_text())  # the issue's `sed -i '1s/^/x/'`
    code, out, err = _search(tmp_path, "--set", "cluster.nvlink_gbytes_per_s=10")
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert str(journal) in line and "line 1" in line and "delete the file" in line


def test_a_journal_row_with_a_negative_time_is_refused_with_its_line(tmp_path):
    assert _search(tmp_path)[0] == 0
    journal = tmp_path / "search.jsonl"
    lines = journal.read_text().splitlines()
    entry = json.loads(lines[1])
    entry["row"]["iteration_time_s"] = -1
    lines[1] = json.dumps(entry)
    journal.write_text("\n".join(lines) + "\n")
    code, _, err = _search(tmp_path)
    assert code == 2 and "line 2" in err and "iteration_time_s=-1 must be > 0" in err


# -- 2. sizes bounded up front ------------------------------------------------------------


@pytest.mark.parametrize("key", ["reduce_bucket_size", "allgather_bucket_size"])
def test_a_bucket_size_that_makes_more_calls_than_the_op_limit_is_refused(key):
    with pytest.raises(ScenarioError) as caught:
        load_scenario(TINY, [f"training.{key}=1"])
    message = str(caught.value)
    assert message.startswith(f"training.{key}=1 ") and "STEPSIM_MAX_SIMULATED_OPS" in message
    assert "make the buckets larger" in message
    load_scenario(TINY, [f"training.{key}=500000000"])  # DeepSpeed's default: fine
    load_scenario(TINY, [f"training.{key}=0"])  # one call


def test_the_bucket_estimate_is_near_the_cost_models_parameter_count():
    for overrides in ([], ["parallel.tensor_model_parallel_size=2", "parallel.data_parallel_size=1",
                           "parallel.pipeline_model_parallel_size=1"]):  # fmt: skip
        s = load_scenario(TINY, overrides)
        exact = sum(
            stage_params_per_rank(s, r) for r in range(s.parallel.pipeline_model_parallel_size)
        )
        estimate = pipeline_params(s.model, s.parallel, tied=True)
        assert estimate == pytest.approx(exact, rel=0.05)


def test_zbv_builders_count_in_the_schedule_limit():
    assert builder_ops("1f1b", 1000, 160) == 0
    assert builder_ops("zbv", 1000, 160) == 6 * 1000 * 160  # as much again as its ops
    assert builder_ops("zbv_unit", 10, 1) == 10 * (6 + 40) // 6
    code, out, err = main_in_process(
        "schedule", "--schedule", "zbv", "--stages", "1000", "--microbatches", "160",
        "--forward", "1", "--backward", "1", "--weight", "1",
    )  # fmt: skip
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert "1,920,000 ops" in line and "STEPSIM_MAX_SCHEDULE_OPS" in line


def test_drawing_counts_in_the_schedule_limit():
    assert schedule_work(1000, ["1f1b"], 4, 8, drawn=0) == 1000
    assert schedule_work(1000, ["1f1b", "1f1b"], 4, 8, drawn=2) == 1000 + 1500 + 2 * PANEL_OPS
    assert schedule_work(1000, ["zbv"], 4, 8, drawn=0) == 1000 + 6 * 4 * 8


# -- 3. what is said is what ran ----------------------------------------------------------


@pytest.mark.parametrize("schedule, on", [("zbh1", False), ("zbv", False), ("1f1b", True)])
def test_the_async_tp_all_reduce_is_written_off_where_the_backward_is_split(schedule, on):
    s = load_scenario(
        TINY,
        [f"training.schedule={schedule}", "training.async_tensor_model_parallel_allreduce=true"]
        + (["parallel.virtual_pipeline_model_parallel_size=2"] if schedule == "zbv" else []),
    )
    assert s.training.mechanism("async_tensor_model_parallel_allreduce") is on
    assert ("async TP all-reduce off" in s.training.framework_note) is not on


def test_validate_over_tables_without_rows_says_so_and_exits_2(tmp_path):
    for table in (ROOT / "scenarios" / "validation").glob("*.csv"):
        (tmp_path / table.name).write_text(table.read_text().splitlines()[0] + "\n")
    code, out, err = main_in_process("validate", "--data", str(tmp_path), "--quiet")
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert "no calibration set has a row to score" in line and "0.0 %" not in line


def test_topology_refuses_the_perturbations_run_refuses(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(
        (ROOT / "scenarios" / "tiny-2gpu.toml").read_text()
        + '\n[[perturbation]]\nkind = "slow_link"\nlink = 99999\nbandwidth_factor = 0.5\n'
    )
    code, out, err = main_in_process("topology", str(path))
    assert code == 2 and out == ""
    assert "link=99999 is not a link of the cluster" in err


def test_a_set_value_with_a_newline_is_refused():
    with pytest.raises(ScenarioError, match="line break"):
        load_scenario(TINY, ["cluster.nic_gbps=135\nnum_nodes = 8"])


# -- 4. error lines stay lines ------------------------------------------------------------


def test_an_error_echoes_at_most_a_capped_value_elided_in_the_middle():
    error = ScenarioError(key="training.schedule", value="a" * 100_000, rule="must be short")
    message = str(error)
    assert len(message) < MAX_VALUE + 100 and "(100,002 characters)" in message
    assert message.startswith("training.schedule='aaa") and message.endswith("must be short")
    assert error.value == "a" * 100_000  # the data keeps it whole
    long = str(ScenarioError("x" * 5_000 + " the end"))
    assert len(long) <= MAX_MESSAGE and long.endswith("the end")


def test_a_huge_set_value_gives_a_short_line():
    code, _, err = main_in_process("run", TINY, "--set", "training.schedule=" + "a" * 100_000)
    assert code == 2 and len(err) < 600


def test_ordinals():
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "101st",
        "111th",
    ]  # fmt: skip
    assert (best_of(1), best_of(3), best_of(10)) == ("best", "3rd best", "10th best")


def test_an_os_error_is_a_sentence_and_a_cut_down_name(capsys):
    from stepsim.cli import main

    assert main(["run", "x" * 5000]) == 1
    err = capsys.readouterr().err
    assert "[Errno" not in err and len(err) < 400 and "File name too long" in err
