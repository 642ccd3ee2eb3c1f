"""What every command prints for a program (--json) and the exits a user can count on:
a search with nothing to weigh, a broken pipe, numbers in tables."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stepsim.cli import main
from stepsim.ir.results import SCHEMA_VERSION
from stepsim.ir.units import count_text
from stepsim.report.summary import decimal_places

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "scenarios" / "tiny-2gpu.toml")
GPT3 = str(ROOT / "scenarios" / "gpt3-175b-128nodes.toml")


@pytest.mark.parametrize(
    ("args", "command"),
    [
        (["sweep", TINY, "--set", "cluster.nic_gbps=100,200", "--quiet"], "sweep"),
        (["topology", TINY], "topology"),
        (["search", TINY, "--pp", "1", "--micro-batch", "1", "--jobs", "1"], "search"),
        (["plan", "throughput", TINY, "--quiet"], "plan throughput"),
        (["plan", "time-to-train", TINY, "--tokens", "1e9", "--quiet"], "plan time-to-train"),
        (["plan", "scale", TINY, "--nodes", "1,2", "--jobs", "1"], "plan scale"),
        (["plan", "fit", TINY, "--nodes", "1", "--no-simulate"], "plan fit"),
        (["plan", "fit", TINY, "--min-nodes", "--no-simulate"], "plan fit --min-nodes"),
        (["plan", "goodput", TINY, "--quiet"], "plan goodput"),
    ],
)
def test_every_command_prints_one_json_document(args, command, capsys):
    assert main([*args, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["schema_version"] == SCHEMA_VERSION
    assert document["command"] == command
    assert document["scenario"] == "tiny-2gpu"


def test_search_json_ranks_what_the_text_ranks(capsys):
    args = ["search", TINY, "--pp", "1", "--micro-batch", "1,2", "--jobs", "1", "--quiet"]
    assert main([*args, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    layouts = document["layouts"]
    ranked = [row for row in layouts if row["rank"] is not None]
    assert [row["rank"] for row in ranked] == list(range(1, document["simulated"] + 1))
    times = [row["iteration_time_s"] for row in ranked]
    assert times == sorted(times) and layouts[: len(ranked)] == ranked
    assert main(args) == 0
    first = capsys.readouterr().out.split("top ", 1)[1].splitlines()[2].split()
    assert first[:4] == ["1", str(layouts[0]["tp"]), str(layouts[0]["pp"]), str(layouts[0]["dp"])]


def test_search_splits_each_pipelined_layouts_idle_by_cause(capsys):
    args = ["search", TINY, "--pp", "2", "--micro-batch", "1", "--recompute", "none"]
    args += ["--jobs", "1", "--quiet"]
    assert main([*args, "--json"]) == 0
    ranked = [r for r in json.loads(capsys.readouterr().out)["layouts"] if r["rank"]]
    assert ranked
    for row in ranked:  # the three causes add up to the layout's idle (run/bubble.py)
        causes = [row[f"idle_by_cause_s.{k}"] for k in ("schedule", "imbalance", "communication")]
        assert min(causes) >= 0 and sum(causes) == pytest.approx(row["breakdown_s.idle"])
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "idle%  own%  imbal%  comm%" in text and "idle% = own% (the schedule's bubble" in text


def test_time_to_train_has_its_own_header_and_readable_tokens(capsys):
    assert main(["plan", "time-to-train", TINY, "--tokens", "3e11", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("stepsim plan time-to-train · tiny-2gpu")
    assert "300B tokens:" in out and "e+11" not in out


def test_search_with_no_layout_on_the_cluster_names_the_rule(capsys):
    assert main(["search", TINY, "--tp", "3", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "no TP in [3]" in err and "divides the cluster's 2 GPUs" in err


def test_search_where_every_layout_breaks_a_rule_names_it(capsys):
    heads = ["--set", "model.num_attention_heads=15", "--set", "model.hidden_size=1020"]
    assert main(["search", TINY, "--tp", "2", "--pp", "1", *heads, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "no valid layout" in err
    assert "tensor_model_parallel_size=2 must divide model.num_attention_heads=15" in err


def test_search_where_nothing_fits_exits_1_after_its_table(capsys):
    one_node = ["--set", "cluster.num_nodes=1", "--set", "parallel.data_parallel_size=1"]
    one_node += ["--set", "parallel.pipeline_model_parallel_size=1"]
    one_node += ["--set", "training.global_batch_size=8"]
    args = ["search", GPT3, *one_node, "--tp", "8", "--pp", "1", "--micro-batch", "1"]
    assert main([*args, "--jobs", "1", "--quiet"]) == 1
    assert "no layout fits in GPU memory" in capsys.readouterr().out


def test_a_broken_pipe_exits_quietly():
    process = subprocess.Popen(
        [sys.executable, "-m", "stepsim", "topology", TINY, "--json"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
    )
    process.stdout.close()  # the reader goes away before the first byte
    err = process.stderr.read().decode()
    assert process.wait(timeout=60) == 141
    assert err == ""


def test_every_schedule_flag_has_help(capsys):
    with pytest.raises(SystemExit, match="0"):
        main(["schedule", "--help"])
    out = capsys.readouterr().out
    for flag in ("--forward F", "--backward B", "--weight W", "--p2p-latency C"):
        after = out.split(flag, 1)[1].split("\n  -", 1)[0]
        assert len(after.split()) > 3, flag


@pytest.mark.parametrize(("total", "places"), [(34.3, 2), (0.0606, 5), (1234.5, 0), (0.0, 4)])
def test_a_table_shows_its_total_to_four_significant_digits(total, places):
    assert decimal_places(total) == places


def test_the_summary_prints_every_part_with_the_same_places(capsys):
    assert main(["run", TINY]) == 0
    out = capsys.readouterr().out
    block = out.split("where the time goes", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    seconds = [line.split()[-2] for line in block]
    assert len(seconds) == 6 and {len(value.split(".")[1]) for value in seconds} == {5}


@pytest.mark.parametrize(
    ("n", "text"), [(3e11, "300B"), (1.5e12, "1.5T"), (2048, "2,048"), (84_203_520, "84.2M")]
)
def test_counts_read_as_people_write_them(n, text):
    assert count_text(n) == text


def test_docs_lists_and_prints_the_shipped_documents(capsys):
    from stepsim.cli import main

    assert main(["docs"]) == 0
    listing = capsys.readouterr().out
    assert "memory" in listing and "Memory per GPU" in listing
    assert main(["docs", "docs/memory.md"]) == 0
    assert capsys.readouterr().out.startswith("# Memory per GPU")
    assert main(["docs", "memry"]) == 2
    assert "did you mean 'memory'?" in capsys.readouterr().err


def test_an_answer_that_names_a_layout_says_how_to_read_its_name(capsys):
    assert main(["plan", "fit", TINY, "--min-nodes", "--no-simulate", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "leanest layout: tp" in out
    assert "layout names: tp<N>-pp<N>" in out and "-sp|nosp (sequence parallelism)" in out
