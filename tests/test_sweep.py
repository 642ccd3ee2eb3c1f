"""stepsim sweep: grids, the CSV's columns, and errors for bad points."""

import csv

import pytest

from simulator.cli import main
from simulator.plan.sweep import grid, split_axes
from simulator.scenario import ScenarioError

TINY = "scenarios/tiny-2gpu.toml"


def test_split_axes_and_grid_order():
    fixed, axes = split_axes(
        [
            "training.global_batch_size=32",
            "cluster.nic_gbps=100,200",
            "training.schedule=gpipe,1f1b",
        ]
    )
    assert fixed == ["training.global_batch_size=32"]
    assert grid(axes) == [
        [("cluster.nic_gbps", "100"), ("training.schedule", "gpipe")],
        [("cluster.nic_gbps", "100"), ("training.schedule", "1f1b")],
        [("cluster.nic_gbps", "200"), ("training.schedule", "gpipe")],
        [("cluster.nic_gbps", "200"), ("training.schedule", "1f1b")],
    ]


def test_sweep_writes_csv_with_swept_and_metric_columns(tmp_path, capsys):
    assert (
        main(
            [
                "sweep",
                TINY,
                "--set",
                "training.global_batch_size=8,32",
                "--set",
                "training.schedule=gpipe,1f1b",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    assert "iteration s" in capsys.readouterr().out
    with (tmp_path / "sweep.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    columns = list(rows[0])
    assert columns[:3] == ["training.global_batch_size", "training.schedule", "iteration_time_s"]
    assert "breakdown_s.idle" in columns and "exposed_comm_fraction" in columns
    by_point = {(r["training.global_batch_size"], r["training.schedule"]): r for r in rows}
    # 4 vs 16 micro-batches: more micro-batches, smaller bubble share
    small, large = by_point[("8", "1f1b")], by_point[("32", "1f1b")]
    assert float(large["bubble_fraction"]) < float(small["bubble_fraction"])
    assert (tmp_path / "sweep.png").read_bytes().startswith(b"\x89PNG")


def test_a_bad_point_fails_before_anything_runs():
    with pytest.raises(ScenarioError, match="sweep point parallel.pipeline_model_parallel_size=3"):
        from simulator.plan.sweep import run_sweep
        from simulator.scenario import load_scenario

        run_sweep(
            lambda o: load_scenario(TINY, o),
            lambda s: pytest.fail("ran"),
            ["parallel.pipeline_model_parallel_size=2,3"],
        )
    assert main(["sweep", TINY, "--set", "cluster.nic_gbps=100"]) == 2  # nothing swept
    with pytest.raises(ScenarioError, match="both swept and fixed"):
        split_axes(["cluster.nic_gbps=100,200", "cluster.nic_gbps=300"])
