"""Small builders shared by tests."""

import subprocess
import sys
from pathlib import Path

from stepsim.engine.core import simulate
from stepsim.engine.network import FairShareNetwork
from stepsim.run import build_cluster
from stepsim.scenario import scenario_from_dict
from stepsim.vocabulary import TP_COMM
from stepsim.workload.lowering import lower
from stepsim.workload.ops import WorkloadBuilder

ROOT = Path(__file__).resolve().parent.parent


def cli_error(path: str | Path, *args: str) -> str:
    """The one line `stepsim run PATH ARGS` prints on bad input (exit 2, nothing on
    stdout), without its ``stepsim: error:`` prefix."""
    proc = subprocess.run(
        [sys.executable, "-m", "stepsim", "run", str(path), *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("stepsim: error: ")
    return line.removeprefix("stepsim: error: ")


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
