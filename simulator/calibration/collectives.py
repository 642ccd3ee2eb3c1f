"""Collective-level validation and fits: stepsim's network against published NCCL
collective measurements, row by row, and the node efficiencies fitted on them.

The measurements are copied into scenarios/validation/collectives/ (its README.md cites
each file, its source commit and its caveats); the file layer reads them
(``scenario.files.read_collective_tables``), this module reads no file. Every row becomes
a ``CollectiveRow``: the published time of one collective (``kind`` over ``groups``
groups of ``group_size`` consecutive GPUs, of ``size_bytes``) on a cluster built from one
of stepsim's node presets, and stepsim's time for the same collective run alone through
its network (the flows of ``comm.collectives`` on the cluster's links, simulated by
``engine.core.simulate`` with the fair-share network, as studies/collectives.py does).
The algorithm is the one NCCL would run (``auto``: ``comm.collectives.chosen``), or the
one a table states it ran (``ring``, ``nvls``). Published times are the table's own
(nccl-tests' time column) or its size over its algorithm bandwidth; where a table gives
only the bus bandwidth, algbw = busbw / (2(n-1)/n) for an all-reduce and busbw /
((n-1)/n) for the others (the nccl-tests convention, n the ranks of a group).

Rows are grouped into ``CollectiveSection``s (one table, one node preset, one kind), each
``fit`` (a network constant of that node was fitted on its rows marked ``fitted``) or
``check``. A row is ``large`` when bandwidth, not latency, decides it: each rank's share
of the buffer (size / ranks of a group) is ``LARGE_SHARE_BYTES`` or more, so that
stepsim's per-step latency is about 1 % of its time, and the group holds 8 GPUs or more
(NCCL reaches less on groups of 2 and 4 GPUs than on 8 of the same node, which stepsim's
links do not model: those rows are shown, not fitted). Only large rows are fitted on.

The fits (``COLLECTIVE_FITS``, ``fit_efficiency``) are grid searches (0.30-1.00 by 0.01)
for the least sum of squared relative time errors over a fit's rows, of one node's
``nvlink_efficiency`` or ``nic_efficiency`` with every other constant at the preset's;
``stepsim validate --network-fits`` runs them and prints what each gives beside
what scenario/hardware.py carries.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from ..comm import collectives
from ..comm.collectives import Fabric
from ..engine.core import simulate
from ..engine.network import FairShareNetwork
from ..ir.flows import Collective, Transfer
from ..ir.ops import WorkloadBuilder
from ..ir.units import us_to_s
from ..ir.vocabulary import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    AUTO,
    NVLS,
    REDUCE_SCATTER,
    RING,
    TP_COMM,
)
from ..scenario import ClusterSpec
from ..scenario.files import NcclTestsLog
from ..scenario.presets import GPUS, NODES
from .kernels import summary

Row = Mapping[str, str]

# Rows under this size are not copied (latency-bound: stepsim's latency model, a fixed
# base and a hop per step, is fitted elsewhere, docs/network.md) and log rows under it
# are not compared.
MIN_BYTES = 2**24  # 16 MiB
# A row is bandwidth-bound ("large") from this share of the buffer per rank: stepsim's
# latency per ring step (2 us over NVLink) is then about 1 % of moving the share at
# ~700 GB/s, and NCCL's bus bandwidth has stopped climbing in every table here.
LARGE_SHARE_BYTES = 2**27  # 128 MiB
LARGE_MIN_GPUS = 8

FIT, CHECK = "fit", "check"
DGX_H100, DGX_H200, DGX_B200 = "dgx-h100", "dgx-h200", "dgx-b200"
GB200_NVL72, GB300_NVL72 = "gb200-nvl72", "gb300-nvl72"
NVLINK, NIC = "nvlink_efficiency", "nic_efficiency"

_KIND_NAMES: dict[str, str] = {
    ALL_REDUCE: "all-reduce",
    ALL_GATHER: "all-gather",
    REDUCE_SCATTER: "reduce-scatter",
    ALL_TO_ALL: "all-to-all",
}
_KINDS = {name: kind for kind, name in _KIND_NAMES.items()}


def bus_factor(kind: str, ranks: int) -> float:
    """busbw / algbw by nccl-tests' convention: 2(n-1)/n for an all-reduce, (n-1)/n for
    a reduce-scatter, all-gather or all-to-all."""
    return (2.0 if kind == ALL_REDUCE else 1.0) * (ranks - 1) / ranks


class CollectiveSection(NamedTuple):
    """One table's rows of one collective kind on one node preset."""

    key: str
    title: str
    node: str  # the node preset the rows are simulated on
    source: str  # the file (scenarios/validation/collectives/README.md cites it in full)
    kind: str  # vendor / third party; what is assumed
    role: str  # FIT or CHECK
    what: str  # what the rows fit or check

    @property
    def label(self) -> str:
        """The kind in a word or two: vendor or third party, and "assumed" where something
        of the measured machine is assumed (its network, its number of GPUs)."""
        who = self.kind.split(" (")[0].split(";")[0]
        return who + (", assumed" if "assumed" in self.kind else "")


_XLA_PLATFORMS = {  # platform_key -> (short name, node preset, title)
    "sm_90": ("h100", DGX_H100, "sm_90, 8 GPUs"),
    "sm_100_B200": ("b200", DGX_B200, "B200, 8 GPUs"),
    "sm_100_GB200": ("gb200", GB200_NVL72, "GB200 NVL72"),
    "sm_103": ("gb300", GB300_NVL72, "sm_103 NVL72"),
}
_FITTED_NVLINK = {"b200": DGX_B200, "gb200": GB200_NVL72, "gb300": GB300_NVL72}


def _xla_section(platform: str, kind: str) -> CollectiveSection:
    short, node, title = _XLA_PLATFORMS[platform]
    name = _KIND_NAMES[kind]
    if kind == ALL_REDUCE:  # NVLS in stepsim on groups of 8 or more: its own constant too
        on = "the DGX H100's NVLink (kept)" if short == "h100" else "the fitted NVLink"
        role, what = CHECK, f"NVLS all-reduce (NCCL's nvlsEfficiency) on {on}"
    elif short in _FITTED_NVLINK:
        role, what = FIT, f"{node} nvlink_efficiency (large rows, groups of 8 GPUs or more)"
    else:
        role, what = CHECK, "the DGX H100's nvlink_efficiency (GTC24's 370/450, kept)"
    unstated = "; SKU not stated" if short in ("h100", "gb300") else ""
    return CollectiveSection(
        f"xla-{short}-{name}",
        f"XLA {name}, {title}",
        node,
        "xla_collectives.csv",
        f"vendor (Google){unstated}",
        role,
        what,
    )


SECTIONS: dict[str, CollectiveSection] = {
    s.key: s
    for s in (
        *(
            _xla_section(platform, kind)
            for platform in _XLA_PLATFORMS
            for kind in (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL)
        ),
        CollectiveSection(
            "azure-h100",
            "Azure NCCL all-reduce, ND H100 v5",
            DGX_H100,
            "azure_nccl_allreduce_busbw.csv",
            "third party (Microsoft); 8 GPUs assumed, NVLS as stated",
            CHECK,
            "NVLS on the DGX H100's nvlink_efficiency (kept)",
        ),
        CollectiveSection(
            "azure-h200",
            "Azure NCCL all-reduce, ND H200 v5",
            DGX_H200,
            "azure_nccl_allreduce_busbw.csv",
            "third party (Microsoft); 8 GPUs assumed, NVLS as stated",
            FIT,
            "dgx-h200 nvlink_efficiency through NVLS (NCCL's 0.85)",
        ),
        CollectiveSection(
            "azure-gb200",
            "Azure NCCL all-reduce, ND GB200 v6",
            GB200_NVL72,
            "azure_nccl_allreduce_busbw.csv",
            "third party (Microsoft); 4 GPUs of one tray assumed, ring as stated",
            CHECK,
            "the GB200 NVL72's nvlink_efficiency (fitted on XLA's rows)",
        ),
        CollectiveSection(
            "ml-b200-1node",
            "ml-engineering all-reduce, 1 x P6-B200",
            DGX_B200,
            "mlengineering_allreduce_busbw.csv",
            "third party (independent)",
            CHECK,
            "NVLS all-reduce on the DGX B200's fitted NVLink",
        ),
        CollectiveSection(
            "ml-b200-4nodes",
            "ml-engineering all-reduce, 4 x P6-B200",
            DGX_B200,
            "mlengineering_allreduce_busbw.csv",
            "third party (independent); EFA as the preset's 8 x 400 Gb/s NICs",
            FIT,
            "dgx-b200 nic_efficiency (large rows)",
        ),
        CollectiveSection(
            "ml-b200-4nodes-c1",
            "ml-engineering all-reduce, 4 x 8 B200 (C1)",
            DGX_B200,
            "mlengineering_allreduce_busbw.csv",
            "third party (independent); network and software not stated",
            CHECK,
            "the DGX B200's nic_efficiency",
        ),
        CollectiveSection(
            "ml-h200",
            "ml-engineering all-reduce, 8 x H200",
            DGX_H200,
            "mlengineering_allreduce_busbw.csv",
            "third party (independent)",
            FIT,
            "dgx-h200 nvlink_efficiency through NVLS (NCCL's 0.85)",
        ),
        CollectiveSection(
            "nccl-h100-2nodes",
            "nccl-tests all-reduce, 2 x 8 H100 (A3 Mega?)",
            DGX_H100,
            "nccl_logs/h100_2node_16gpu_all_reduce_a3mega.txt",
            "third party; fabric assumed (not stated: the preset's 8 x 400 Gb/s InfiniBand)",
            CHECK,
            "the DGX H100's efficiencies across nodes",
        ),
        CollectiveSection(
            "nccl-b200-2nodes",
            "nccl-tests all-gather, 2 x GKE a4 (B200)",
            DGX_B200,
            "nccl_logs/b200_2node_16gpu_all_gather_gke_a4.txt",
            "third party; fabric assumed (8 RoCE NICs per node as the preset's 8 x 400 Gb/s)",
            CHECK,
            "the DGX B200's nic_efficiency on another fabric",
        ),
    )
}


class CollectiveRow(NamedTuple):
    """One published collective time and what stepsim should run for it."""

    section: str
    id: str
    shape: str  # the collective in words, for the tables
    kind: str  # ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER or ALL_TO_ALL
    num_nodes: int  # nodes of the section's preset in the cluster
    groups: int  # G groups ...
    group_size: int  # ... of S consecutive GPUs (every group runs the collective)
    size_bytes: float  # the buffer, as nccl-tests' size (all-gather: the output)
    measured_s: float
    algorithm: str = AUTO  # AUTO (NCCL's choice), RING or NVLS (a table's stated one)
    large: bool = False  # bandwidth-bound (LARGE_SHARE_BYTES, LARGE_MIN_GPUS)
    fitted: bool = False  # large, in a section whose constant was fitted on it
    note: str = ""

    @property
    def bus_factor(self) -> float:
        return bus_factor(self.kind, self.group_size)


class CollectiveComparison(NamedTuple):
    section: str
    id: str
    shape: str
    measured_s: float
    simulated_s: float
    fitted: bool
    note: str
    runs: str  # the algorithm stepsim ran ("ring", "nvls", "tree", ...; "all-to-all")
    busbw_factor: float  # size / time x this = bus bandwidth (bytes/s)
    size_bytes: float

    @property
    def error(self) -> float:
        """Signed relative error of the simulated time."""
        return self.simulated_s / self.measured_s - 1.0

    @property
    def measured_busbw_gbytes_per_s(self) -> float:
        return self.size_bytes / self.measured_s * self.busbw_factor / 1e9

    @property
    def simulated_busbw_gbytes_per_s(self) -> float:
        return self.size_bytes / self.simulated_s * self.busbw_factor / 1e9


def _bytes_text(size: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if size >= scale:
            value = size / scale
            return f"{value:.4g} {unit}"
    return f"{size:.0f} B"


def _is_large(size: float, group_size: int) -> bool:
    return group_size >= LARGE_MIN_GPUS and size / group_size >= LARGE_SHARE_BYTES


def _row(
    section: str,
    row_id: str,
    kind: str,
    num_nodes: int,
    groups: int,
    group_size: int,
    size: float,
    measured_s: float,
    algorithm: str = AUTO,
    note: str = "",
) -> CollectiveRow:
    large = _is_large(size, group_size)
    where = f"{groups} x {group_size}" + (f" on {num_nodes} nodes" if num_nodes > 1 else "")
    return CollectiveRow(
        section,
        row_id,
        f"{_KIND_NAMES[kind]} {where}, {_bytes_text(size)}",
        kind,
        num_nodes,
        groups,
        group_size,
        size,
        measured_s,
        algorithm,
        large,
        large and SECTIONS[section].role == FIT,
        note,
    )


def _whole(row: Row, key: str) -> int:
    value = float(row[key])
    if value != int(value):
        raise ValueError(f"row {row['id']}: {key}={row[key]!r} is not a whole number")
    return int(value)


def _xla(rows: Sequence[Row]) -> Iterable[CollectiveRow]:
    """OpenXLA's collective table: G groups of S consecutive devices (replica groups
    ``[G,S]<=[N]T(0)``) each run the collective on a buffer of ``tensor_size_bytes``
    (all-gather: the output, reduce-scatter: the input); time = size / algbw."""
    for r in rows:
        platform, opcode = r["platform_key"], r["opcode"]
        if platform not in _XLA_PLATFORMS:
            raise ValueError(
                f"row {r['id']}: platform_key {platform!r} is not one of "
                f"{', '.join(_XLA_PLATFORMS)}"
            )
        if opcode not in _KINDS:
            raise ValueError(f"row {r['id']}: opcode {opcode!r} is not one of {', '.join(_KINDS)}")
        g, s = _whole(r, "num_groups"), _whole(r, "devices_per_group")
        if r["replica_groups_iota"] != f"[{g},{s}]<=[{g * s}]T(0)":
            raise ValueError(
                f"row {r['id']}: replica groups {r['replica_groups_iota']!r} are not "
                f"{g} groups of {s} consecutive devices"
            )
        size = float(_whole(r, "tensor_size_bytes"))
        short = _XLA_PLATFORMS[platform][0]
        section = f"xla-{short}-{opcode}"
        node = SECTIONS[section].node
        if g * s > NODES[node]["gpus_per_node"]:  # type: ignore[operator]  # an int preset
            raise ValueError(f"row {r['id']}: {g * s} devices do not fit one {node} node")
        yield _row(
            section, r["id"], _KINDS[opcode], 1, g, s, size, size / (float(r["algbw_GBps"]) * 1e9)
        )


# Azure's VMs: (section, GPUs of a VM; not stated in the file: Azure's VM sizes)
_AZURE = {
    "ND_H100_v5": ("azure-h100", 8),
    "ND_H200_v5": ("azure-h200", 8),
    "ND_GB200_v6": ("azure-gb200", 4),
}
_AZURE_ALGORITHMS = {"NVLS": NVLS, "Ring": RING}


def _azure(rows: Sequence[Row]) -> Iterable[CollectiveRow]:
    """Azure's nccl-tests all-reduce, in-place busbw; the algorithm as the table states
    it (NVLS on the H100 and H200 VMs, Ring on the GB200 VM)."""
    for r in rows:
        if r["vm"] not in _AZURE:
            raise ValueError(f"row {r['id']}: vm {r['vm']!r} is not one of {', '.join(_AZURE)}")
        if r["nccl_algo"] not in _AZURE_ALGORITHMS:
            raise ValueError(f"row {r['id']}: nccl_algo {r['nccl_algo']!r} is not NVLS or Ring")
        section, n = _AZURE[r["vm"]]
        size = float(_whole(r, "size_bytes_inferred"))
        algbw = float(r["busbw_GBps_inplace"]) * 1e9 / bus_factor(ALL_REDUCE, n)
        yield _row(
            section,
            r["id"],
            ALL_REDUCE,
            1,
            1,
            n,
            size,
            size / algbw,
            _AZURE_ALGORITHMS[r["nccl_algo"]],
        )


def _mlengineering(rows: Sequence[Row]) -> Iterable[CollectiveRow]:
    """ml-engineering's all-reduce sweeps: one group of every GPU of the nodes; time =
    size / algbw (from busbw where the table gives no algbw)."""
    for r in rows:
        table, nodes, gpus = r["table"], _whole(r, "nodes"), _whole(r, "gpus")
        if table in ("A", "C1"):
            section = (
                "ml-b200-1node"
                if nodes == 1
                else ("ml-b200-4nodes" if table == "A" else "ml-b200-4nodes-c1")
            )
        elif table in ("B", "C2"):
            section = "ml-h200"
        else:
            raise ValueError(f"row {r['id']}: table {table!r} is not A, B, C1 or C2")
        per_node = gpus // nodes
        preset = NODES[SECTIONS[section].node]["gpus_per_node"]
        if per_node * nodes != gpus or per_node != preset:
            raise ValueError(
                f"row {r['id']}: {gpus} GPUs on {nodes} nodes is not {preset} GPUs a node"
            )
        size = float(_whole(r, "payload_bytes"))
        algbw_text = r["algbw_GBps"].strip()
        algbw = (
            float(algbw_text) * 1e9
            if algbw_text
            else float(r["busbw_GBps"]) * 1e9 / bus_factor(ALL_REDUCE, gpus)
        )
        note = "nccl-tests" if r["tool"].startswith("nccl-tests") else ""
        yield _row(section, r["id"], ALL_REDUCE, nodes, 1, gpus, size, size / algbw, note=note)


# nccl-tests logs: log -> (section, kind, id prefix); their ranks come from the log
_LOGS = {
    "nccl_h100_a3mega": ("nccl-h100-2nodes", ALL_REDUCE, "NH"),
    "nccl_b200_gke_a4": ("nccl-b200-2nodes", ALL_GATHER, "NB"),
}


def _nccl_logs(logs: Mapping[str, NcclTestsLog]) -> Iterable[CollectiveRow]:
    """The raw nccl-tests logs: every rank of the run in one group, nodes = its hosts;
    the out-of-place time as printed; rows of MIN_BYTES or more. Row ids: the prefix and
    the log's line number."""
    for log, (section, kind, prefix) in _LOGS.items():
        if log not in logs:
            continue
        run = logs[log]
        if not run.hosts:
            raise ValueError(f"log {log}: it prints no '# Rank N ... on HOST' lines")
        hosts = list(dict.fromkeys(run.hosts))
        per_host = len(run.hosts) // len(hosts)
        preset = NODES[SECTIONS[section].node]["gpus_per_node"]
        if per_host != preset or any(run.hosts.count(h) != per_host for h in hosts):
            raise ValueError(f"log {log}: its ranks are not {preset} on each of its hosts")
        for r in run.rows:
            size = float(r["size"])
            if size < MIN_BYTES:
                continue
            yield _row(
                section,
                f"{prefix}{r['line']}",
                kind,
                len(hosts),
                1,
                len(run.hosts),
                size,
                float(r["time"]) * 1e-6,
            )


def collective_rows(
    tables: Mapping[str, Sequence[Row]], logs: Mapping[str, NcclTestsLog]
) -> list[CollectiveRow]:
    """Every row of the collective tables and logs (scenario.files.read_collective_tables)
    as CollectiveRows, in SECTIONS order; a cell the model cannot use raises ValueError
    naming the row."""
    rows = [
        *_xla(tables.get("xla_collectives", ())),
        *_azure(tables.get("azure_nccl", ())),
        *_mlengineering(tables.get("mlengineering", ())),
        *_nccl_logs(logs),
    ]
    order = {key: n for n, key in enumerate(SECTIONS)}
    return sorted(rows, key=lambda r: order[r.section])


# -- stepsim's time ----------------------------------------------------------------------------


def node_cluster(node: str, num_nodes: int, **constants: float) -> ClusterSpec:
    """The cluster spec of ``num_nodes`` nodes of preset ``node`` on one switch, with
    ``constants`` (e.g. nvlink_efficiency) in place of the preset's."""
    values: dict = {**NODES[node], **constants}
    return ClusterSpec(node=node, num_nodes=num_nodes, **{**values, "gpu": GPUS[values["gpu"]]})


class Network:
    """Clusters built once per (node, nodes, constants) by ``build`` (a run's own builder,
    ``run.iteration.build_cluster``, passed in as calibration.validation is passed the
    run: calibration/ imports no run/, which reaches it through report/), and the
    collectives run alone on them: ``seconds(row, constants)`` is stepsim's time for a
    row."""

    def __init__(self, build: Callable[[ClusterSpec], Any]) -> None:
        self._build = build
        self._built: dict[tuple, tuple] = {}
        self._exchanges: dict[tuple, Transfer] = {}  # an all-to-all's flows, of 1 byte

    def _cluster(self, node: str, num_nodes: int, constants: Mapping[str, float]):
        key = (node, num_nodes, tuple(sorted(constants.items())))
        if key not in self._built:
            spec = node_cluster(node, num_nodes, **constants)
            cluster = self._build(spec)
            fabric = Fabric.of(
                cluster, us_to_s(spec.collective_base_latency_us), spec.nvls_fraction
            )
            capacities = [link.bandwidth_bytes_per_s for link in cluster.links]
            self._built[key] = (fabric, capacities)
        return self._built[key]

    def run(
        self, row: CollectiveRow, constants: Mapping[str, float] | None = None
    ) -> tuple[float, str]:
        """(stepsim's seconds, the algorithm it ran) for ``row`` on its section's node
        preset, ``constants`` replacing the preset's."""
        node = SECTIONS[row.section].node
        fabric, capacities = self._cluster(node, row.num_nodes, constants or {})
        if row.kind == ALL_TO_ALL:  # its flows depend on the size only by their bytes
            key = (node, row.num_nodes, tuple(sorted((constants or {}).items())), row.group_size)
            if key not in self._exchanges:
                self._exchanges[key] = build_collective(row._replace(size_bytes=1.0), fabric)[0][0]
            share = row.size_bytes / row.group_size
            return alone_s((self._exchanges[key]._replace(bytes_per_flow=share),), capacities), (
                "all-to-all"
            )
        collective, runs = build_collective(row, fabric)
        return alone_s(collective, capacities), runs

    def seconds(self, row: CollectiveRow, constants: Mapping[str, float] | None = None) -> float:
        return self.run(row, constants)[0]


def build_collective(row: CollectiveRow, fabric: Fabric) -> tuple[Collective, str]:
    """The collective stepsim runs for ``row``, and the algorithm's name. Its first group
    (GPUs 0 to S-1) stands for all G: the groups of a row share one node, each GPU with
    its own links to the NVSwitch, so the other groups' flows cross none of the first
    group's links and change none of its rates (comm/collectives.py's symmetric
    replicas); a row over several nodes is one group."""
    groups = [list(range(row.group_size))]
    if row.kind == ALL_TO_ALL:  # as comm.placement's all-to-all: S / n to every peer
        edge_sets = [[(a, b) for a in g for b in g if a != b] for g in groups]
        exchange = collectives.exchange(edge_sets, row.size_bytes / row.group_size, fabric, True)
        return (exchange,), "all-to-all"
    if row.algorithm == RING:
        ring = collectives.ring(row.kind, groups, row.size_bytes, fabric)
        if ring is None:
            raise ValueError(f"row {row.id}: no ring over one GPU")
        return ring, RING
    if row.algorithm == NVLS:
        nvls = collectives.nvls(row.kind, groups, row.size_bytes, fabric)
        if nvls is None:
            raise ValueError(f"row {row.id}: NVLS does not apply on {SECTIONS[row.section].node}")
        return nvls, NVLS
    pick = collectives.chosen(AUTO, row.kind, groups, row.size_bytes, fabric)
    if pick is None:
        raise ValueError(f"row {row.id}: no collective over one GPU")
    return pick[1], pick[0]


def alone_s(collective: Collective, capacities: Sequence[float]) -> float:
    """How long ``collective`` takes alone on links of ``capacities`` (the engine and the
    fair-share network, as a run simulates it)."""
    builder = WorkloadBuilder()
    lane = builder.lane(gpu=0, stream="compute", stage=0)
    builder.add(lane, TP_COMM, "collective", transfer=collective)
    return simulate(builder.build(), network=FairShareNetwork.factory(capacities)).end_s


# -- comparison ----------------------------------------------------------------------------


def compare_collectives(
    rows: Iterable[CollectiveRow],
    network: Network,
    constants: Mapping[str, Mapping[str, float]] | None = None,
) -> dict[str, list[CollectiveComparison]]:
    """Each row's simulated time on its section's node preset (``constants``: per node,
    values in place of the preset's), by section in SECTIONS order."""
    out: dict[str, list[CollectiveComparison]] = {}
    for row in rows:
        node = SECTIONS[row.section].node
        seconds, runs = network.run(row, (constants or {}).get(node))
        out.setdefault(row.section, []).append(
            CollectiveComparison(
                row.section,
                row.id,
                row.shape,
                row.measured_s,
                seconds,
                row.fitted,
                row.note,
                runs,
                row.bus_factor,
                row.size_bytes,
            )
        )
    return out


def comparison_json(comparisons: Mapping[str, Sequence[CollectiveComparison]]) -> dict:
    """The collectives as JSON: per section its source, role, totals and rows."""
    out = {}
    for key, rows in comparisons.items():
        s, t = SECTIONS[key], summary(rows)
        out[key] = {
            "title": s.title,
            "node": s.node,
            "source": s.source,
            "kind": s.kind,
            "role": s.role,
            "what": s.what,
            "rows": t.rows,
            "mean_abs_error": t.mean_abs_error,
            "worst_error": t.worst.error,
            "worst_id": t.worst.id,
            "fitted_rows": t.fitted_rows,
            "fitted_mean_abs_error": t.fitted_mean_abs_error,
            "detail": [
                {
                    "id": c.id,
                    "shape": c.shape,
                    "size_bytes": c.size_bytes,
                    "measured_s": c.measured_s,
                    "simulated_s": c.simulated_s,
                    "measured_busbw_gbytes_per_s": c.measured_busbw_gbytes_per_s,
                    "simulated_busbw_gbytes_per_s": c.simulated_busbw_gbytes_per_s,
                    "error": c.error,
                    "runs": c.runs,
                    "fitted": c.fitted,
                    "note": c.note,
                }
                for c in rows
            ],
        }
    return out


# -- fits -----------------------------------------------------------------------------------

EFFICIENCY_GRID = tuple(x / 100 for x in range(30, 101))  # 0.30 .. 1.00


class CollectiveFit(NamedTuple):
    """One fit: a network constant of one node preset on the large rows of ``sections``;
    ``shipped``: scenario/hardware.py carries its value (else it says what the tables
    give for a constant kept as it is)."""

    node: str
    constant: str  # NVLINK or NIC
    sections: tuple[str, ...]
    shipped: bool = True


def _ring_kinds(short: str) -> tuple[str, ...]:
    """The XLA sections whose collective stepsim runs as a ring (or an all-to-all) at
    large sizes, where only the NVLink rate decides: not the all-reduce's NVLS."""
    return tuple(f"xla-{short}-{_KIND_NAMES[k]}" for k in (ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL))


COLLECTIVE_FITS = (
    CollectiveFit(DGX_B200, NVLINK, _ring_kinds("b200")),
    CollectiveFit(GB200_NVL72, NVLINK, _ring_kinds("gb200")),
    CollectiveFit(GB300_NVL72, NVLINK, _ring_kinds("gb300")),
    CollectiveFit(DGX_H200, NVLINK, ("azure-h200", "ml-h200")),
    CollectiveFit(DGX_B200, NIC, ("ml-b200-4nodes",)),
    # what the sm_90 rows say about the DGX H100, whose 370/450 (GTC24) is kept
    CollectiveFit(DGX_H100, NVLINK, _ring_kinds("h100"), shipped=False),
    CollectiveFit(DGX_H100, NVLINK, ("azure-h100",), shipped=False),
)


def fit_rows(rows: Iterable[CollectiveRow], sections: Sequence[str]) -> list[CollectiveRow]:
    """The large rows of ``sections`` (those a fit is made on)."""
    chosen = [r for r in rows if r.section in sections and r.large]
    if not chosen:
        raise ValueError(f"no large rows in {', '.join(sections)}")
    return chosen


def rms_error(
    rows: Sequence[CollectiveRow], network: Network, constants: Mapping[str, float]
) -> float:
    errors = [network.seconds(r, constants) / r.measured_s - 1.0 for r in rows]
    return math.sqrt(sum(e * e for e in errors) / len(errors))


def fit_efficiency(
    rows: Sequence[CollectiveRow],
    constant: str,
    network: Network,
    grid: Sequence[float] = EFFICIENCY_GRID,
) -> tuple[float, float]:
    """(value, rms relative error) of ``constant`` (NVLINK or NIC) on the grid that fits
    ``rows`` best (least sum of squared relative time errors), every other constant at
    the preset's. A row whose time is latency + bytes / (rate x e) (checked at e = 1, 1/2
    and 1/4) is evaluated in closed form over the grid; any other (a bottleneck that
    moves between link kinds, an algorithm that changes) is simulated at each value."""
    forms: list[tuple[float, float] | None] = []
    for row in rows:
        t1, t2, t4 = (network.seconds(row, {constant: e}) for e in (1.0, 0.5, 0.25))
        x = t2 - t1
        latency = t1 - x
        linear = math.isclose(t4, latency + 4.0 * x, rel_tol=1e-9, abs_tol=1e-15)
        forms.append((latency, x) if linear else None)

    def loss(e: float) -> float:
        total = 0.0
        for form, row in zip(forms, rows, strict=True):
            t = form[0] + form[1] / e if form is not None else network.seconds(row, {constant: e})
            total += (t / row.measured_s - 1.0) ** 2
        return total

    best = min(grid, key=loss)
    return best, rms_error(rows, network, {constant: best})


def run_fit(
    fit: CollectiveFit, rows: Sequence[CollectiveRow], network: Network
) -> tuple[float, float, float, int]:
    """(fitted value, rms error at it, rms error at the preset's value, rows) of ``fit``."""
    chosen = fit_rows(rows, fit.sections)
    value, rms = fit_efficiency(chosen, fit.constant, network)
    preset = float(NODES[fit.node][fit.constant])  # type: ignore[arg-type]  # a float preset
    return value, rms, rms_error(chosen, network, {fit.constant: preset}), len(chosen)
