"""stepsim's all-reduce bus bandwidth next to measured NCCL figures.

    python benchmarks/collectives.py            # print the table
    python benchmarks/collectives.py --write    # also write docs/network.md and its plot

Each case builds the cluster from stepsim's node presets, runs one all-reduce of
S bytes alone through the fair-share network and reports the nccl-tests bus
bandwidth, busbw = S / time x 2(n-1)/n. The measured values are the peak
all-reduce busbw figures of NVIDIA's GTC24 talk S62129 as collected in the
project's hardware reference (docs/reference.md). Nothing here is fitted to
them; the small-message latencies are the exception, see presets.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from matplotlib.figure import Figure  # noqa: E402

from stepsim.engine.core import simulate  # noqa: E402
from stepsim.engine.network import FairShareNetwork  # noqa: E402
from stepsim.run import build_cluster  # noqa: E402
from stepsim.scenario import scenario_from_dict  # noqa: E402
from stepsim.units import us_to_s  # noqa: E402
from stepsim.vocabulary import TP_COMM  # noqa: E402
from stepsim.workload import collectives  # noqa: E402
from stepsim.workload.collectives import Fabric  # noqa: E402
from stepsim.workload.ops import WorkloadBuilder  # noqa: E402

SIZES = [2**k for k in range(10, 33, 2)]  # 1 KiB .. 4 GiB
PEAK_SIZE = 2**32

# (label, cluster keys, GPUs in the group, measured busbw GB/s, what was measured)
CASES = [
    ("DGX A100, 1 node", {"node": "dgx-a100", "num_nodes": 1}, 8, 232.0, "8 GPUs, NVLink 3"),
    (
        "DGX A100, 4 nodes",
        {"node": "dgx-a100", "num_nodes": 4},
        32,
        192.0,
        "8 x 200 Gb/s RDMA per node",
    ),
    (
        "DGX-1 V100, 1 node",
        {"node": "dgx-1-v100", "num_nodes": 1},
        8,
        122.0,
        "8 GPUs, NVLink 2 cube-mesh",
    ),
    (
        "DGX H100, 1 node",
        {"node": "dgx-h100", "num_nodes": 1},
        8,
        370.0,
        "8 GPUs, NVLink 4 (480 with NVLS)",
    ),
    (
        "DGX H100, 4 nodes",
        {"node": "dgx-h100", "num_nodes": 4},
        32,
        380.0,
        "8 x 400 Gb/s RDMA per node (480 with SHARP)",
    ),
    (
        "one 200 Gb/s NIC",
        {"node": "dgx-a100", "num_nodes": 2, "gpus_per_node": 1, "nics_per_node": 1},
        2,
        24.0,
        "2 nodes, 1 GPU and 1 NIC each",
    ),
    (
        "one 400 Gb/s NIC",
        {"node": "dgx-h100", "num_nodes": 2, "gpus_per_node": 1, "nics_per_node": 1},
        2,
        48.0,
        "2 nodes, 1 GPU and 1 NIC each",
    ),
]
# Small-message ring all-reduce on one DGX A100 (nccl-tests issue #123), in us.
LATENCY_CASES = [(2, 10.0), (4, 16.9), (6, 25.2), (8, 33.7)]


def _fabric(cluster_keys: dict):
    doc = {
        "name": "collective",
        "model": {
            "num_layers": 1,
            "hidden_size": 64,
            "num_attention_heads": 1,
            "seq_length": 8,
            "vocab_size": 8,
        },
        "cluster": cluster_keys,
        "parallel": {"data_parallel_size": 1},
        "training": {"global_batch_size": 1},
    }
    spec = scenario_from_dict(doc).cluster
    cluster = build_cluster(spec)
    return cluster, Fabric.of(cluster, us_to_s(spec.collective_base_latency_us))


def all_reduce_s(cluster, fabric, n: int, size: float, algorithm: str) -> float:
    collective = collectives.all_reduce(algorithm, [list(range(n))], size, fabric)
    builder = WorkloadBuilder()
    lane = builder.lane(gpu=0, stream="compute", stage=0)
    builder.add(lane, TP_COMM, "all-reduce", transfer=collective)
    capacities = [link.bandwidth_bytes_per_s for link in cluster.links]
    return simulate(builder.build(), network=FairShareNetwork.factory(capacities)).end_s


def busbw_gb_per_s(time_s: float, n: int, size: float) -> float:
    return size / time_s * 2 * (n - 1) / n / 1e9


def sweep() -> list[dict]:
    rows = []
    for label, keys, n, measured, note in CASES:
        cluster, fabric = _fabric(keys)
        curves = {}
        for algorithm in ("ring", "auto"):
            curves[algorithm] = [
                busbw_gb_per_s(all_reduce_s(cluster, fabric, n, s, algorithm), n, s) for s in SIZES
            ]
        rows.append({"label": label, "n": n, "measured": measured, "note": note, **curves})
    return rows


def latencies() -> list[tuple[int, float, float]]:
    cluster, fabric = _fabric({"node": "dgx-a100", "num_nodes": 1})
    return [
        (n, all_reduce_s(cluster, fabric, n, 8.0, "ring") * 1e6, measured)
        for n, measured in LATENCY_CASES
    ]


def table(rows: list[dict]) -> str:
    lines = [
        "| case | GPUs | measured busbw GB/s | stepsim ring | error | stepsim auto | error |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ring, auto = r["ring"][-1], r["auto"][-1]
        lines.append(
            f"| {r['label']} ({r['note']}) | {r['n']} | {r['measured']:g} | {ring:.0f} | "
            f"{round(100 * (ring / r['measured'] - 1)) + 0:+d} % | {auto:.0f} | "
            f"{round(100 * (auto / r['measured'] - 1)) + 0:+d} % |"
        )
    return "\n".join(lines)


def figure(rows: list[dict]) -> Figure:
    fig = Figure(figsize=(11, 5), layout="constrained")
    ax = fig.add_subplot()
    for i, r in enumerate(rows):
        color = f"C{i}"
        ax.plot(SIZES, r["auto"], color=color, marker="o", markersize=3, label=r["label"])
        ax.axhline(r["measured"], color=color, linestyle="--", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("all-reduce bus bandwidth (GB/s)")
    ax.set_title("stepsim all-reduce (lines, algorithm auto) vs measured NCCL peak (dashed)")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3, which="both")
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write docs/network.md and plot")
    args = parser.parse_args()
    rows = sweep()
    print(table(rows))
    lat = latencies()
    for n, simulated, measured in lat:
        print(f"small all-reduce, {n} GPUs: stepsim {simulated:.1f} us, measured {measured} us")
    if args.write:
        text = render(rows, lat, ROOT / "docs" / "images")
        (ROOT / "docs" / "network.md").write_text(text)
        print("wrote docs/network.md and docs/images/network-busbw.png")


def render(rows: list[dict], lat: list[tuple[int, float, float]], images: Path | None) -> str:
    """docs/network.md from the sweep and the latencies; the plot into ``images``."""
    if images is not None:
        figure(rows).savefig(images / "network-busbw.png", dpi=110)
    sweep_rows = "\n".join(
        f"| {s:,} | " + " | ".join(f"{r['auto'][i]:.1f}" for r in rows) + " |"
        for i, s in enumerate(SIZES)
    )
    head = "| bytes | " + " | ".join(r["label"] for r in rows) + " |"
    rule = "|---:|" + "---:|" * len(rows)
    lat_rows = "\n".join(f"| {n} | {m} | {s:.1f} |" for n, s, m in lat)
    return TEMPLATE.format(
        table=table(rows), sweep="\n".join([head, rule, sweep_rows]), latency=lat_rows
    )


TEMPLATE = """# The network model against measured NCCL bandwidth

Generated by `python benchmarks/docs.py --only network` (or `python
benchmarks/collectives.py --write`); edit the prose in that script's TEMPLATE, not here.

stepsim moves bytes as flows on the directed links of the cluster graph, shared
max-min fairly. A collective is a coupled flow per phase (simulator/workload/collectives.py):
rings with one channel per GPU of a node when they cross nodes (each leaving the
node through its own NIC), NVLink Hamiltonian rings inside mesh nodes, double
binary trees or hierarchical rings across nodes, and an `auto` choice by estimated
time. Each case below runs one all-reduce alone and reports the nccl-tests bus
bandwidth, busbw = S / t x 2(n-1)/n, at S = 4 GiB.

## Peak bus bandwidth

{table}

The measured column is NVIDIA's own peak busbw for each system (GTC24 talk S62129,
as quoted in the hardware reference).

What the table says:

- **The peaks agree by construction.** The node presets run every link at the fraction
  of its line rate NCCL reaches (`nvlink_efficiency`, `nic_efficiency` in
  simulator/scenario/presets.py), and those fractions are this very column over the
  line rate (232/300 for A100 NVLink, 192/200 for its NICs, and so on). So this table
  is not an independent check of the bandwidth; it checks that the collectives'
  structure reaches what the links allow: one ring per NIC across nodes (8 on DGX A100
  and DGX H100 nodes), NVLink Hamiltonian rings over all six NVLink 2 lanes of the
  DGX-1 cube-mesh, the single NIC at its rate. The independent checks of the whole are
  the iteration and layer times of [validation.md](validation.md), to which no network
  constant was fitted.
- What remains between the columns is the pipeline of phases and latencies at 4 GiB,
  a fraction of a per cent to a few per cent.
- NVLink SHARP (NVLS) and IB SHARP in-network reductions, which reach 480 GB/s on
  H100 systems, are not modelled.

## Bus bandwidth against message size (algorithm auto, GB/s)

![busbw vs size](images/network-busbw.png)

{sweep}

Small messages are latency-bound: each phase pays a fixed 6 us plus one hop latency
per step (2 us per NVLink step, 5 us per step through one InfiniBand switch).

## Small-message latency, one DGX A100, ring

| GPUs | measured (us) | stepsim (us) |
|---:|---:|---:|
{latency}

These four measurements (nccl-tests issue #123) are where the 6 us base and the
1 us per NVLink hop come from (simulator/scenario/presets.py), so this table shows the fit,
not an independent check.
"""

if __name__ == "__main__":
    main()
