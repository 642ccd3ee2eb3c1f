"""Small builders shared by tests."""

import contextlib
import io
import os
import subprocess
import sys
import warnings
from pathlib import Path

from stepsim.emit.lowering import lower
from stepsim.engine.core import simulate
from stepsim.engine.network import FairShareNetwork
from stepsim.ir.ops import WorkloadBuilder
from stepsim.ir.vocabulary import TP_COMM
from stepsim.run.iteration import build_cluster
from stepsim.scenario import scenario_from_dict

ROOT = Path(__file__).resolve().parent.parent


def cli_error(path: str | Path, *args: str, process: bool = False) -> str:
    """The one line `stepsim run PATH ARGS` prints on bad input (exit 2, nothing on
    stdout), without its ``stepsim: error:`` prefix. In this process by default (what
    ``python -m stepsim`` runs is ``sys.exit(main())``, so the status, stdout and stderr
    are main's; an exception that escaped main would fail the test here as a traceback
    would there, and a warning it shows counts as a line of stderr); ``process=True``
    runs the real command, as a user types it (~0.6 s of imports each)."""
    if process:
        proc = subprocess.run(
            [sys.executable, "-m", "stepsim", "run", str(path), *args],
            capture_output=True,
            text=True,
            check=False,
            cwd=ROOT,
        )
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    else:
        code, out, err = main_in_process("run", str(path), *args, cwd=ROOT)
    assert code == 2
    assert out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("stepsim: error: ")
    return line.removeprefix("stepsim: error: ")


def main_in_process(*argv: str, cwd: str | Path | None = None) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``stepsim ARGV`` run by ``cli.main`` in this
    process, as ``sys.exit(main())`` would end it: argparse's SystemExit gives its code.
    Warnings that a fresh interpreter would show are written to the stderr returned."""
    from stepsim.cli import main

    out, err = io.StringIO(), io.StringIO()
    previous = os.getcwd()
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning):
            warnings.simplefilter("ignore", category)  # hidden by Python's default filters
        try:
            if cwd is not None:
                os.chdir(cwd)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = main(list(argv))
                except SystemExit as exc:
                    if exc.code is None or isinstance(exc.code, int):
                        code = exc.code or 0
                    else:  # sys.exit("message"): Python prints it, status 1
                        code = 1
                        print(exc.code, file=err)
        finally:
            os.chdir(previous)
    for warning in shown:
        err.write(
            warnings.formatwarning(
                warning.message, warning.category, warning.filename, warning.lineno
            )
        )
    return code, out.getvalue(), err.getvalue()


def benchmark_script(name: str):
    """benchmarks/NAME.py as a module, to call its main(argv) in this process (what
    running the script does, less ~0.6 s of a fresh interpreter's imports)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        f"bench_{name}", ROOT / "benchmarks" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def scenario(**sections):
    """A valid scenario dict with the tiny defaults, sections updated by keyword."""
    doc = {
        "name": "test",
        "model": {
            "num_layers": 4,
            "hidden_size": 1024,
            "num_attention_heads": 16,
            "seq_length": 1024,
            "vocab_size": 32000,
        },
        "cluster": {"node": "dgx-a100", "num_nodes": 1},
        "parallel": {
            "tensor_model_parallel_size": 1,
            "pipeline_model_parallel_size": 1,
            "data_parallel_size": 1,
        },
        "training": {"micro_batch_size": 1, "global_batch_size": 8},
        "network": {"model": "fair-share"},
    }
    for name, values in sections.items():
        if isinstance(values, dict):
            doc[name] = {**doc.get(name, {}), **values}
        else:
            doc[name] = values
    # the closed forms of these tests are Megatron-LM 2021's mechanisms (the unfused
    # softmax and its s x s scores, no gradient-accumulation fusion, ...): pinned, since
    # a scenario that names no version gets the newest one modelled
    training = doc.get("training")
    if isinstance(training, dict) and training.get("framework", "megatron") == "megatron":
        training.setdefault("framework_version", "2021")
    return doc


def load(**sections):
    return scenario_from_dict(scenario(**sections))


def time_transfers(cluster, *transfers) -> float:
    """Run transfers at once on the fair-share network, each blocking its own lane;
    when the last one ends."""
    builder = WorkloadBuilder()
    for i, transfer in enumerate(transfers):
        lane = builder.lane(gpu=i, stream="compute", stage=0)
        builder.add(lane, TP_COMM, f"t{i}", transfer=transfer)
    capacities = [link.bandwidth_bytes_per_s for link in cluster.links]
    return simulate(builder.build(), network=FairShareNetwork.factory(capacities)).end_s


def lowered_with_and_without_replay(scenario, monkeypatch):
    """(ops with layer bodies replayed, the ops the blocks make with replay off, how
    many bodies were replayed): lowering.layer_body / WorkloadBuilder.replay checked
    against making every layer anew."""
    cluster = build_cluster(scenario.cluster)
    replays = []
    replay = WorkloadBuilder.replay
    monkeypatch.setattr(
        WorkloadBuilder, "replay", lambda self, *args: replays.append(1) or replay(self, *args)
    )
    replayed = lower(scenario, cluster)
    monkeypatch.setattr(WorkloadBuilder, "body_since", lambda *args: None)
    return replayed, lower(scenario, cluster), len(replays)
