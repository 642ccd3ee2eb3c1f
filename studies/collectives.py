"""stepsim's all-reduce bus bandwidth next to measured NCCL figures.

    python studies/collectives.py            # print the table
    python studies/collectives.py --write    # also write docs/network.md and its plot

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

from stepsim.comm import collectives  # noqa: E402
from stepsim.comm.collectives import Fabric  # noqa: E402
from stepsim.engine.core import simulate  # noqa: E402
from stepsim.engine.network import FairShareNetwork  # noqa: E402
from stepsim.ir.ops import WorkloadBuilder  # noqa: E402
from stepsim.ir.units import us_to_s  # noqa: E402
from stepsim.ir.vocabulary import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, TP_COMM  # noqa: E402
from stepsim.run.iteration import build_cluster  # noqa: E402
from stepsim.scenario import scenario_from_dict  # noqa: E402

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
# NVLink SHARP: (label, cluster keys, GPUs, measured NVLS busbw GB/s or None, note). The
# 480 GB/s of one DGX H100 is the nccl-tests figure issue 19 quotes (against 370 for the
# ring); the 4-node figure is NVLS with IB SHARP (CollNet), which stepsim does not model:
# there it runs NVLS_TREE (NVLS in the nodes, double binary trees across).
NVLS_CASES = [
    ("DGX H100, 1 node", {"node": "dgx-h100", "num_nodes": 1}, 8, 480.0, "NVLS"),
    (
        "DGX H100, 4 nodes",
        {"node": "dgx-h100", "num_nodes": 4},
        32,
        480.0,
        "measured with IB SHARP; stepsim: NVLS_TREE",
    ),
    ("DGX B200, 1 node", {"node": "dgx-b200", "num_nodes": 1}, 8, None, "see validate"),
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
    base = us_to_s(spec.collective_base_latency_us)
    return cluster, Fabric.of(cluster, base, spec.nvls_fraction)


def all_reduce_s(
    cluster, fabric, n: int, size: float, algorithm: str, kind: str = ALL_REDUCE
) -> float:
    collective = collectives.collective(algorithm, kind, [list(range(n))], size, fabric)
    return _alone_s(cluster, collective)


def _alone_s(cluster, collective) -> float:
    """How long ``collective`` takes alone on the cluster's links."""
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
        chosen = collectives.chosen("auto", ALL_REDUCE, [list(range(n))], PEAK_SIZE, fabric)
        assert chosen is not None
        rows.append(
            {
                "label": label,
                "n": n,
                "measured": measured,
                "note": note,
                "auto_runs": chosen[0],
                **curves,
            }
        )
    return rows


def nvls_sweep() -> list[dict]:
    """Ring and NVLS all-reduce busbw over the sizes for the NVLS cases, and on one node
    the reduce-scatter and all-gather busbw (S / t x (n-1)/n) at the peak size."""
    rows = []
    for label, keys, n, measured, note in NVLS_CASES:
        cluster, fabric = _fabric(keys)
        row = {"label": label, "n": n, "measured": measured, "note": note}
        for algorithm in ("ring", "nvls"):
            row[algorithm] = [
                busbw_gb_per_s(all_reduce_s(cluster, fabric, n, s, algorithm), n, s) for s in SIZES
            ]
        if n == keys.get("gpus_per_node", 8):
            for kind in (REDUCE_SCATTER, ALL_GATHER):
                group = [list(range(n))]
                for algorithm, collective in (
                    ("ring", collectives.ring(kind, group, PEAK_SIZE, fabric)),
                    ("nvls", collectives.nvls(kind, group, PEAK_SIZE, fabric)),
                ):
                    t = _alone_s(cluster, collective)
                    row[f"{kind}-{algorithm}"] = PEAK_SIZE / t * (n - 1) / n / 1e9
        rows.append(row)
    return rows


def nvls_table(rows: list[dict]) -> str:
    lines = [
        "| case | GPUs | measured NVLS busbw GB/s | stepsim ring | stepsim nvls | error | "
        "nvls / ring |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ring, nvls = r["ring"][-1], r["nvls"][-1]
        measured = "-" if r["measured"] is None else f"{r['measured']:g}"
        error = (
            "-" if r["measured"] is None else f"{round(100 * (nvls / r['measured'] - 1)) + 0:+d} %"
        )
        lines.append(
            f"| {r['label']} ({r['note']}) | {r['n']} | {measured} | {ring:.0f} | {nvls:.0f} | "
            f"{error} | {nvls / ring:.2f} |"
        )
    return "\n".join(lines)


def nvls_others(rows: list[dict]) -> str:
    """Reduce-scatter and all-gather busbw on one node, ring and NVLS."""
    lines = [
        "| case | reduce-scatter ring | reduce-scatter NVLS | all-gather ring | all-gather NVLS |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        if f"{REDUCE_SCATTER}-ring" not in r:
            continue
        cells = [
            f"{r[f'{kind}-{algorithm}']:.0f}"
            for kind in (REDUCE_SCATTER, ALL_GATHER)
            for algorithm in ("ring", "nvls")
        ]
        lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def latencies() -> list[tuple[int, float, float]]:
    cluster, fabric = _fabric({"node": "dgx-a100", "num_nodes": 1})
    return [
        (n, all_reduce_s(cluster, fabric, n, 8.0, "ring") * 1e6, measured)
        for n, measured in LATENCY_CASES
    ]


def _auto_measured(r: dict) -> float:
    """The measured busbw of what auto runs at the peak size: NCCL's NVLS figure where
    auto takes NVLS on one node (NVLS_CASES), else the case's own (the ring's)."""
    if r["auto_runs"] == "nvls":
        return next(m for label, _, _, m, _ in NVLS_CASES if label == r["label"])
    return r["measured"]


def table(rows: list[dict]) -> str:
    lines = [
        "| case | GPUs | measured busbw GB/s | stepsim ring | error | stepsim auto (runs) "
        "| measured | error |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ring, auto, measured = r["ring"][-1], r["auto"][-1], _auto_measured(r)
        lines.append(
            f"| {r['label']} ({r['note']}) | {r['n']} | {r['measured']:g} | {ring:.0f} | "
            f"{round(100 * (ring / r['measured'] - 1)) + 0:+d} % | {auto:.0f} "
            f"({r['auto_runs']}) | {measured:g} | "
            f"{round(100 * (auto / measured - 1)) + 0:+d} % |"
        )
    return "\n".join(lines)


def figure(rows: list[dict]) -> Figure:
    fig = Figure(figsize=(11, 5), layout="constrained")
    ax = fig.add_subplot()
    for i, r in enumerate(rows):
        color = f"C{i}"
        ax.plot(SIZES, r["auto"], color=color, marker="o", markersize=3, label=r["label"])
        ax.axhline(_auto_measured(r), color=color, linestyle="--", linewidth=0.8)
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
    nvls_rows = nvls_sweep()
    print(nvls_table(nvls_rows))
    print(nvls_others(nvls_rows))
    lat = latencies()
    for n, simulated, measured in lat:
        print(f"small all-reduce, {n} GPUs: stepsim {simulated:.1f} us, measured {measured} us")
    if args.write:
        text = render(rows, lat, ROOT / "docs" / "images", nvls_rows)
        (ROOT / "docs" / "network.md").write_text(text)
        print("wrote docs/network.md and docs/images/network-busbw.png")


def render(
    rows: list[dict],
    lat: list[tuple[int, float, float]],
    images: Path | None,
    nvls_rows: list[dict] | None = None,
) -> str:
    """docs/network.md from the sweeps and the latencies; the plot into ``images``."""
    if nvls_rows is None:
        nvls_rows = nvls_sweep()
    if images is not None:
        figure(rows).savefig(images / "network-busbw.png", dpi=110)
    sweep_rows = "\n".join(
        f"| {s:,} | " + " | ".join(f"{r['auto'][i]:.1f}" for r in rows) + " |"
        for i, s in enumerate(SIZES)
    )
    head = "| bytes | " + " | ".join(r["label"] for r in rows) + " |"
    rule = "|---:|" + "---:|" * len(rows)
    lat_rows = "\n".join(f"| {n} | {m} | {s:.1f} |" for n, s, m in lat)
    nvls_head = "| bytes | " + " | ".join(f"{r['label']} ring | nvls" for r in nvls_rows) + " |"
    nvls_rule = "|---:|" + "---:|---:|" * len(nvls_rows)
    nvls_sizes = "\n".join(
        f"| {s:,} | "
        + " | ".join(f"{r['ring'][i]:.1f} | {r['nvls'][i]:.1f}" for r in nvls_rows)
        + " |"
        for i, s in enumerate(SIZES)
    )
    return TEMPLATE.format(
        table=table(rows),
        sweep="\n".join([head, rule, sweep_rows]),
        latency=lat_rows,
        nvls_table=nvls_table(nvls_rows),
        nvls_others=nvls_others(nvls_rows),
        nvls_sweep="\n".join([nvls_head, nvls_rule, nvls_sizes]),
    )


TEMPLATE = """# The network model against measured NCCL bandwidth

Generated by `python tools/docs.py --only network` (or `python
studies/collectives.py --write`); edit the prose in that script's TEMPLATE, not here.

stepsim moves bytes as flows on the directed links of the cluster graph, shared
max-min fairly. A collective is a coupled flow per phase (simulator/comm/collectives.py):
rings with one channel per GPU of a node when they cross nodes (each leaving the
node through its own NIC), NVLink Hamiltonian rings inside mesh nodes, double
binary trees or hierarchical rings across nodes, NVLink SHARP (NVLS) where the
NVSwitch reduces, and an `auto` choice by estimated time among the algorithms NCCL
enables on the hardware. Each case below runs one all-reduce alone and reports the
nccl-tests bus bandwidth, busbw = S / t x 2(n-1)/n, at S = 4 GiB.

## Peak bus bandwidth

{table}

The measured column is NVIDIA's own peak busbw for each system without in-network
reduction (GTC24 talk S62129, as quoted in the hardware reference); `auto` is compared
with the measurement of what it runs at 4 GiB (in brackets): on one DGX H100 that is
NVLS, measured at 480 GB/s (next section).

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
- The ring column is what NCCL runs without in-network reduction. NVLink SHARP (NVLS),
  which reaches 480 GB/s on one DGX H100, is what `auto` runs there, as NCCL does by
  default: next section. IB SHARP (CollNet) across nodes is not modelled.

## NVLink SHARP (NVLS)

On NVSwitch generation 3 and later (DGX/HGX H100, H200, H800, DGX B200, the NVL72
racks) the switch itself reduces: NCCL's NVLS algorithm (NCCL 2.17+,
src/transport/nvls.cc; all_reduce.h's NVLS kernel) has each GPU own one chunk of
S/k; its `multimem.ld_reduce` makes the switch read that chunk from all k GPUs and
return the sum, and its `multimem.st` sends the sum up once for the switch to
multicast to all k GPUs. On each GPU's NVLink that is S + S/k up (the switch's loads
and the owner's store) and S/k + S down (the owner's sum and the multicast), against
2(k-1)/k S each way for the ring: 9/8 S against 14/8 S on 8 GPUs. NVLS reduce-scatter
is the load-reduce alone (S up, S/k down), all-gather the store alone (S/k up, S
down); NCCL 2.19+ runs both on NVLS inside a node (across nodes only with IB SHARP).

stepsim builds these as flows on the GPU <-> NVSwitch links (chunks of S/k, each GPU's
up link charged k+1 of them for an all-reduce): they share the links with everything
else, and two NVLS collectives on the same GPUs at once each take twice the bytes'
time. What limits NVLS beyond the bytes is the switch: multimem traffic reaches a
fraction of the NVLink rate, which NCCL's tuner carries as `nvlsEfficiency`
(src/graph/tuning.cc, NCCL 2.28: 0.85 on Hopper, 0.74 on Blackwell). stepsim takes
that constant as it is (each NVLS byte occupies 1/0.85 of a byte of link), per node
preset (`hardware.NVLS_EFFICIENCY`, or
`cluster.nvls_efficiency`); nothing is fitted to the measured figure. Latency: the
base plus one GPU -> NVSwitch -> GPU route per step (2 for an all-reduce).

{nvls_table}

So on one DGX H100 the mechanism and NCCL's constant give 1.32 x the ring's bus
bandwidth, within a few per cent of the 480 GB/s measured (issue 19's nccl-tests
figure, against 370 for the ring). NCCL's tuner itself models NVLS all-reduce as twice
the per-channel bandwidth ("AllReduce pipelines two operations") x 0.85, an estimate
for choosing an algorithm rather than a count of bytes on links. Across nodes stepsim
runs NVLS_TREE (NVLS reduce-scatter in each node, double binary trees of each local
rank's shard across nodes, NVLS all-gather): at 4 GiB the NICs bound it as they bound
the ring, so the 480 GB/s that NVIDIA measures across DGX H100 nodes needs IB SHARP
(the InfiniBand switches reducing), which is left out. The DGX B200's NVLink fraction
is fitted on published collective timings, and its NVLS all-reduces are compared with
measured ones (two sources, which disagree) by `stepsim validate --kernels`
(docs/calibration.md, "Network constants").

Reduce-scatter and all-gather on one node by the ring and by NVLS alone, bus
bandwidth S / t x (k-1)/k at 4 GiB. NVLS's busier direction carries S / 0.85, the
ring's (k-1)/k S, so by this mechanism NVLS reduce-scatter and all-gather are slower
than the ring at large sizes (without the all-reduce's saving, only the efficiency
remains) and `auto` keeps the ring for them there:

{nvls_others}

Selection: `auto`, the default, is what NCCL runs by default (NCCL_NVLS_ENABLE=2:
NVLS wherever the NVSwitch supports multicast). Its candidates are NCCL's
(src/graph/tuning.cc ncclTopoTuneModel, src/enqueue.cc updateCollCostTable): for an
all-reduce the ring, trees, and where the switch reduces NVLS inside one node or
NVLS_TREE over several (NVLS across nodes needs IB SHARP, NVLS_TREE a second node);
for a reduce-scatter or all-gather the ring, and NVLS inside one node for up to 32 GPUs
of it (NCCL_MAX_NVLS_ARITY). NVLS needs two GPUs of the group in a node or more. Among
them `auto` takes the least estimate alone on the network, as NCCL's tuner does with
its own latency and bandwidth per algorithm and protocol; stepsim estimates from the
flows it builds instead, without NCCL's protocols (LL, LL128, Simple) and latency
constants. Where that matters: on one DGX H100 NCCL's LL ring (6.6 + 14 x 0.6 = 15 us,
at most 141 x 8/14 GB/s) beats its NVLS (25 us) for all-reduces below roughly a
megabyte (0.8 MB whatever NVLS's bandwidth), where stepsim already takes NVLS.
So on one DGX H100 an all-reduce of 8 GPUs runs NVLS at every size, a reduce-scatter or
all-gather NVLS below about 18 MB and the ring above (one step of latency instead of
k-1, against S / 0.85 instead of (k-1)/k S on the busier direction); on two GPUs the
ring moves less than NVLS and stays. `collective_algorithm = "nvls"` is the same
choice, asked for explicitly: on a node whose switch cannot reduce (DGX A100, DGX-2,
the V100 meshes) it is an error, and it also runs NVLS reduce-scatters and all-gathers
over more than 32 GPUs of a node. Where the switch cannot reduce `auto` is what it
always was (ring, tree, hierarchical), so the A100 and V100 scenarios keep their
numbers; `cluster.nvls_efficiency = 0` turns NVLS off (NCCL_NVLS_ENABLE=0). The H100's
`gemm_k_half` was fitted on its calibration set with rings.

Bus bandwidth against size, ring and NVLS (GB/s):

{nvls_sweep}

## Fabrics without a spine between rails: rail-only and multi-plane

Beside one switch, fat trees of 2 or 3 levels and the rail-optimized fat tree
(topologies/fabric.py), two fabrics keep each NIC index on a network of its own:

- **`rail-only`** (Wang et al., "Rail-only: A Low-Cost High-Performance Network for
  Training LLMs with Trillion Parameters", arXiv 2307.12169): one switch per rail, NIC
  k of every node on rail switch k, no spine. A rail switch holds `nodes_per_leaf`
  nodes (its ports); a larger cluster is an error that points to `multi-plane`.
- **`multi-plane`** (the eight-plane two-layer fat tree DeepSeek-V3 was trained on:
  DeepSeek-AI, arXiv 2412.19437, Sec 3.1, and "Insights into DeepSeek-V3", arXiv
  2505.09343, Sec 5.1): NIC k sits on plane k mod `fabric_planes` (default: one plane
  per NIC), each plane a two-level fat tree of its own (leaves of `nodes_per_leaf`
  nodes, `spine_switches` spines per plane, `oversubscription`), no cable between
  planes.

Traffic between NICs of different rails or planes has no switch path. It crosses
NVLink first, to the GPU of the source server with the destination's local index,
and leaves through that GPU's NIC on the destination's rail (NCCL's PXN, which the
rail-only paper assumes too; DeepSeek-V3 forwards on the receiving side instead, which
loads the same kinds of links). NCCL's rings already hop between GPUs of the same local
index (one ring per NIC, every other node walked backwards), so a ring over an even
number of nodes never leaves its rail and takes the same time on rail-only as on the
rail-optimized fat tree (tests/test_fabrics_planes.py); tree all-reduces and pipeline
sends between whole-node stages stay on rails too. Symmetric mode draws these two
fabrics whole (topologies/pattern.py's builders know one switch, fat trees and
rail-optimized trees), so their set-up grows with the cluster; the run summary says so.

## Bus bandwidth against message size (algorithm auto, GB/s; NVLS on one DGX H100)

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
