"""The stepsim command as a user runs it, and every shipped scenario."""

import io
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from stepsim.cli import main
from stepsim.scenario import load_scenario
from tests.helpers import cli_error

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "scenarios" / "tiny-2gpu.toml")
SCENARIOS = sorted((ROOT / "scenarios").glob("*.toml"))
REQUIRED_KEYS = {
    "iteration_time_s",
    "hardware_tflops_per_gpu",
    "model_tflops_per_gpu",
    "mfu",
    "bubble_fraction",
    "num_gpus",
    "memory_per_gpu_gib",
    "breakdown_s",
}


def test_run_writes_every_output(tmp_path, capsys):
    assert main(["run", TINY, "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "iteration time" in printed and "where the time goes" in printed
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics.keys() >= REQUIRED_KEYS
    trace = json.loads((tmp_path / "trace.json").read_text())
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert complete and all(e["dur"] >= 0 and "pid" in e and "tid" in e for e in complete)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {"GPU 0 (stage 0)", "GPU 1 (stage 1)", "network: busiest links (utilization %)"}
    last_end_us = max(e["ts"] + e["dur"] for e in complete)
    assert last_end_us == pytest.approx(metrics["iteration_time_s"] * 1e6)
    for svg in ("timeline.svg", "breakdown.svg"):
        data = (tmp_path / svg).read_bytes()
        assert data.startswith(b"<?xml") and b"<svg" in data and len(data) > 2_000
    assert main(["run", TINY, "--out", str(tmp_path / "png"), "--pictures", "png"]) == 0
    for png in ("timeline.png", "breakdown.png"):
        data = (tmp_path / "png" / png).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 10_000
    assert not (tmp_path / "png" / "timeline.svg").exists()
    resolved = tomllib.loads((tmp_path / "scenario.resolved.toml").read_text())
    assert resolved["cluster"]["nvlink_gbytes_per_s"] == 300.0
    assert load_scenario(tmp_path / "scenario.resolved.toml") == load_scenario(TINY)


def test_json_prints_only_json_and_set_overrides(capsys):
    assert (
        main(
            [
                "run",
                TINY,
                "--json",
                "--set",
                "training.global_batch_size=32",
                "--set",
                "training.schedule=gpipe",
            ]
        )
        == 0
    )
    metrics = json.loads(capsys.readouterr().out)
    assert metrics.keys() >= REQUIRED_KEYS
    assert metrics["num_microbatches"] == 16 and metrics["num_gpus"] == 2
    assert set(metrics["breakdown_s"]) == {
        "compute",
        "tp_comm",
        "pp_p2p",
        "dp_sync",
        "optimizer",
        "idle",
    }


@pytest.mark.parametrize(
    "args, key",
    [
        (
            ["--set", "parallel.tensor_model_parallel_size=3"],
            "parallel.tensor_model_parallel_size=3",
        ),
        (["--set", "training.flavour=x"], "training.flavour"),
        (["--set", "cluster.num_nodes=0"], "cluster.num_nodes=0"),
        (["--set", "parallel.data_parallel_size=4"], "parallel.data_parallel_size=4"),
    ],
)
def test_bad_input_exits_2_with_one_line_naming_the_key(args, key):
    assert key in cli_error(TINY, *args)  # one line: no traceback


def test_bad_input_in_a_real_process_exits_2_with_the_line_main_prints():
    """The other tests call main in this process; the command a user types ends alike
    (tests/test_fuzz.py runs more malformed inputs as real processes)."""
    args = ("--set", "cluster.num_nodes=0")
    assert cli_error(TINY, *args, process=True) == cli_error(TINY, *args)


def test_missing_file_and_bad_flags_exit_2(capsys):
    assert main(["run", "no/such/file.toml"]) == 2
    with pytest.raises(SystemExit, match="^2$") as info:
        main(["run", TINY, "--frobnicate"])
    assert info.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_every_shipped_scenario_loads_and_runs(path, capsys):
    scenario = load_scenario(path)
    # few micro-batches per pipeline keep the suite fast; the layout stays as shipped
    # (Megatron's interleaving needs a multiple of the pipeline size, DualPipe(V) 2 p)
    p = scenario.parallel.pipeline_model_parallel_size
    per_pipeline = {"interleaved": p, "dualpipe": 2 * p, "dualpipev": 2 * p}.get(
        scenario.training.schedule, 2
    )
    small = scenario.training.micro_batch_size * scenario.parallel.data_parallel_size * per_pipeline
    assert main(["run", str(path), "--json", "--set", f"training.global_batch_size={small}"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["num_gpus"] == scenario.parallel.num_gpus
    assert metrics["iteration_time_s"] > 0
    assert metrics["memory_per_gpu_gib"] < scenario.cluster.gpu.memory_gib


def test_same_output_in_separate_processes_with_different_hash_seeds():
    outputs = []
    for seed in ("1", "2"):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "stepsim",
                "run",
                TINY,
                "--json",
                "--set",
                "parallel.pipeline_model_parallel_size=1",
                "--set",
                "parallel.data_parallel_size=2",
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={"PYTHONHASHSEED": seed},
            check=True,
        )
        outputs.append(proc.stdout)
    assert outputs[0] == outputs[1] and json.loads(outputs[0])["breakdown_s"]["dp_sync"] > 0


def test_large_runs_draw_the_timeline_as_an_image(tmp_path, monkeypatch):
    from matplotlib.colors import to_rgb

    from stepsim.report import timeline as figures
    from stepsim.run.iteration import run

    monkeypatch.setattr(figures, "RASTER_ABOVE_SPANS", 10)
    result = run(load_scenario(TINY))
    figure = figures.timeline_figure(result)
    (axes,) = figure.axes
    (picture,) = axes.images  # per GPU a compute band, a gap, a transfer band, a gap
    lane = figures.RASTER_PIXELS[0] + 1 + figures.RASTER_PIXELS[1] + 1
    assert picture.get_array().shape == (2 * lane - 1, figures.RASTER_COLUMNS, 4)
    image = picture.get_array()[: figures.RASTER_PIXELS[0], :, :3]

    def rgb(kind: str) -> tuple[int, ...]:
        return tuple(round(255 * c) for c in to_rgb(figures.COLORS[kind]))

    # stage 0's compute band: its first micro-batches' forwards on top, idle below none
    # of it at the start; the optimizer (black) in its last columns
    assert tuple(image[0, 0]) == rgb("forward")
    assert tuple(image[-1, -1]) == rgb("optimizer")
    legend = {t.get_text() for t in figure.legends[0].get_texts()}
    assert "weight gradient" not in legend and "tensor-parallel comm" not in legend
    assert {"forward", "optimizer", "idle (bubble)"} <= legend
    # the title and the legend say that the picture is binned
    assert "binned:" in axes.get_title() and "time slices" in axes.get_title()
    assert figure.legends[0].get_title().get_text().startswith("binned")
    figure.savefig(tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 10_000
    monkeypatch.setattr(figures, "RASTER_ABOVE_SPANS", 10**9)
    bars = figures.timeline_figure(result)
    assert "binned" not in bars.axes[0].get_title() and bars.legends[0].get_title().get_text() == ""


def test_micro_batch_numbers_are_drawn_only_where_they_fit():
    """A number needs its digits' width plus a point each side: neighbours never overlap,
    so a pass at least as wide as its label gets one and a narrower one none."""
    from stepsim.report import timeline

    end_s = 1.0
    per_pt = end_s / timeline.AXIS_WIDTH_PT
    one, three = timeline._label_width_s("7", end_s), timeline._label_width_s("127", end_s)
    assert one == pytest.approx((timeline.LABEL_FONT_PT * 0.6 + 2) * per_pt)
    assert three == pytest.approx((3 * timeline.LABEL_FONT_PT * 0.6 + 2) * per_pt)
    from stepsim.run.iteration import run

    result = run(load_scenario(TINY, ["training.global_batch_size=64"]))  # 32 micro-batches
    figure = timeline.timeline_figure(result)
    texts = sorted(figure.axes[0].texts, key=lambda t: (t.get_position()[1], t.get_position()[0]))
    figure.canvas.draw()
    boxes = [t.get_window_extent() for t in texts]
    for a, b in zip(boxes, boxes[1:], strict=False):
        assert not a.overlaps(b)


def test_sweep_panels_start_at_zero():
    from stepsim.plan.sweep import run_sweep
    from stepsim.report.figures import sweep_figure
    from stepsim.run.iteration import run

    done = run_sweep(
        lambda overrides: load_scenario(TINY, overrides),
        lambda scenario: run(scenario).metrics,
        ["cluster.nic_gbps=135,400"],
    )
    figure = sweep_figure(done.keys, done.points, "t")
    for ax in figure.axes:
        low, high = ax.get_ylim()
        assert low == 0.0 and high > 0


def test_progress_reaches_the_whole_run_in_order():
    from stepsim.run.iteration import run

    seen = []
    run(load_scenario(TINY), seen.append)
    assert seen and seen == sorted(seen) and seen[-1] == 1.0


def test_progress_line_only_on_a_terminal_and_cleared_after(capsys):
    import io

    from stepsim.cli import Progress

    stream = io.StringIO()
    shown = Progress(True, stream)
    shown.begin("simulating")
    shown.update(0.5, force=True)
    shown.clear()
    assert "simulating  50%" in stream.getvalue() and stream.getvalue().endswith("\r\x1b[K")
    silent = io.StringIO()
    hidden = Progress(False, silent)
    hidden.begin("simulating")
    hidden.update(1.0, force=True)
    hidden.clear()
    assert silent.getvalue() == ""
    # under pytest stderr is not a terminal: a run prints no progress at all
    assert main(["run", TINY]) == 0
    assert capsys.readouterr().err == ""
    assert main(["run", TINY, "--quiet", "--json"]) == 0


def test_progress_says_the_time_left_at_the_pace_so_far_over_a_sweeps_points():
    from stepsim.cli import Progress

    stream = io.StringIO()
    shown = Progress(True, stream)
    shown.started -= 2.0  # two seconds in
    shown.part = (1, 4)  # the second of four points, half done: 3/8 of the sweep
    shown.update(0.5, force=True)
    assert stream.getvalue().endswith("2.0 s, ~3 s left")  # 2 s x (5/8) / (3/8)
    shown.part = None
    shown.update(0.05, force=True)  # under a tenth done: no guess yet
    assert stream.getvalue().endswith("2.0 s")
    shown.stage("writing out/")
    assert stream.getvalue().endswith("writing out/    2.0 s")


def test_ctrl_c_of_run_is_one_line_and_status_130(monkeypatch, capsys):
    from stepsim.run import iteration as run_module

    def interrupted(scenario, progress=None, *, spans=True):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_module, "run", interrupted)
    assert main(["run", TINY, "--quiet"]) == 130
    captured = capsys.readouterr()
    assert captured.err == "stepsim: interrupted\n" and captured.out == ""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_stepsim_killed_with_sigterm_says_so_in_one_line_and_exits_143():
    """The installed program turns SIGTERM into the Ctrl-C path (cli.program)."""
    import signal
    import time

    process = subprocess.Popen(
        [sys.executable, "-m", "stepsim", "run", "mt-nlg-530b-280nodes", "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    # once its handler is in place (the SigCgt mask names the signals a process catches;
    # under load the imports before it can take seconds), while it simulates
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = Path(f"/proc/{process.pid}/status").read_text()
        caught = int(next(x for x in status.splitlines() if x.startswith("SigCgt:")).split()[1], 16)
        if caught & (1 << (signal.SIGTERM - 1)):
            break
        time.sleep(0.05)
    time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert err.strip() == "stepsim: terminated by SIGTERM"
