"""stepsim sweep: grids, the CSV's columns, and errors for bad points."""

import csv

import pytest

from stepsim.cli import main
from stepsim.plan.sweep import grid, split_axes
from stepsim.scenario import ScenarioError

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
    # the idle by cause adds up to the idle, per point (run/bubble.py)
    for row in rows:
        causes = [
            float(row[f"idle_by_cause_s.{k}"]) for k in ("schedule", "imbalance", "communication")
        ]
        assert sum(causes) == pytest.approx(float(row["breakdown_s.idle"]), rel=1e-9, abs=1e-12)


def test_a_bad_point_is_kept_with_its_reason_and_the_others_run(tmp_path, capsys):
    from stepsim.plan.sweep import run_sweep
    from stepsim.scenario import load_scenario

    ran = []
    sweep = run_sweep(
        lambda o: load_scenario(TINY, o),
        lambda s: ran.append(s.parallel.pipeline_model_parallel_size) or _metrics(s),
        ["parallel.pipeline_model_parallel_size=2,3"],
    )
    assert ran == [2] and [p.settings for p in sweep.points] == [
        {"parallel.pipeline_model_parallel_size": 2}
    ]
    (settings, reason), *more = sweep.rejected
    assert not more and settings == {"parallel.pipeline_model_parallel_size": 3}
    assert reason.startswith("parallel.pipeline_model_parallel_size=3 must divide")
    # the command: exit 2, the valid point in the table and the CSV, the bad one marked
    argv = ["sweep", TINY, "--set", "parallel.pipeline_model_parallel_size=2,3"]
    assert main([*argv, "--out", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert "rejected parallel.pipeline_model_parallel_size=3: parallel.pipeline" in out
    assert err.strip().splitlines() == [
        "stepsim: error: 1 of 2 sweep points are not valid (each is marked 'rejected' above "
        "with its reason); the others were simulated"
    ]
    with (tmp_path / "sweep.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["error"] == "" for r in rows] == [True, False]
    assert rows[0]["iteration_time_s"] and not rows[1]["iteration_time_s"]
    assert main(["sweep", TINY, "--set", "cluster.nic_gbps=100"]) == 2  # nothing swept
    with pytest.raises(ScenarioError, match="both swept and fixed"):
        split_axes(["cluster.nic_gbps=100,200", "cluster.nic_gbps=300"])


def _metrics(scenario):
    from stepsim.run.iteration import run

    return run(scenario).metrics


def test_ctrl_c_keeps_the_finished_points(tmp_path, capsys):
    """The second of three points is interrupted: exit 130, the first is written."""
    import unittest.mock

    from stepsim.run import iteration as run_module

    real_run = run_module.run
    calls = []

    def run_or_interrupt(scenario, progress=None, **options):
        calls.append(scenario.cluster.nic_gbps)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_run(scenario, **options)

    argv = ["sweep", TINY, "--set", "cluster.nic_gbps=100,200,300", "--out", str(tmp_path)]
    with unittest.mock.patch.object(run_module, "run", run_or_interrupt):
        assert main(argv) == 130
    assert calls == [100, 200]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"stepsim: interrupted after 1 simulated point(s); they are in the table "
        f"and {tmp_path}/sweep.csv"
    ]
    with (tmp_path / "sweep.csv").open() as f:
        assert [r["cluster.nic_gbps"] for r in csv.DictReader(f)] == ["100"]


def test_sigterm_keeps_the_finished_points_as_ctrl_c_does(tmp_path, capsys):
    """SIGTERM during the second of three points: exit 143, the first is written."""
    import os
    import signal
    import unittest.mock

    from stepsim.cli.common import on_terminate
    from stepsim.run import iteration as run_module

    real_run = run_module.run
    calls = []

    def run_or_terminate(scenario, progress=None, **options):
        calls.append(scenario.cluster.nic_gbps)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises here, as in stepsim
        return real_run(scenario, **options)

    argv = ["sweep", TINY, "--set", "cluster.nic_gbps=100,200,300", "--out", str(tmp_path)]
    previous = signal.signal(signal.SIGTERM, on_terminate)
    try:
        with unittest.mock.patch.object(run_module, "run", run_or_terminate):
            assert main(argv) == 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert calls == [100, 200]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"stepsim: terminated by SIGTERM after 1 simulated point(s); they are in the table "
        f"and {tmp_path}/sweep.csv"
    ]
    with (tmp_path / "sweep.csv").open() as f:
        assert [r["cluster.nic_gbps"] for r in csv.DictReader(f)] == ["100"]
