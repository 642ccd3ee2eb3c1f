"""`stepsim topology`: what a scenario's cluster graph holds, and a drawing of it."""

from __future__ import annotations

import argparse
from pathlib import Path

from stepsim.topologies import PLANAR
from stepsim.topologies.describe import link_name, summarize
from stepsim.topologies.fabric import planes_of

from ..ir.results import SCHEMA_VERSION
from ..scenario import ScenarioError
from .common import (
    check_out,
    json_argument,
    load,
    out_errors,
    print_json,
    quiet_argument,
    scenario_arguments,
)
from .outfolder import atomic_write_figure


def add_command(sub) -> None:
    topo = sub.add_parser(
        "topology",
        help="describe a scenario's cluster: GPUs, links, switches, bisection bandwidth",
        description="Print what the cluster graph of SCENARIO holds; optionally draw it.",
    )
    scenario_arguments(topo, "SECTION.KEY=VALUE", "override a scenario key")
    topo.add_argument(
        "--png",
        metavar="FILE",
        help="draw the graph (clusters of up to 288 GPUs: four NVL72 racks)",
    )
    topo.add_argument(
        "--links",
        action="store_true",
        help="list every directed link: its index (what a [[perturbation]] of kind "
        "slow_link names), its ends, role and GB/s",
    )
    json_argument(topo)
    quiet_argument(topo, "accepted as every command takes it (topology shows no progress line)")
    topo.set_defaults(handler=command)


def command(args: argparse.Namespace) -> int:
    from ..report.figures import MAX_DRAWN_GPUS, topology_figure
    from ..report.tables import topology_text
    from ..run.iteration import build_cluster

    if args.png is not None and Path(args.png).suffix.lower() not in ("", ".png"):
        raise ScenarioError(f"--png {args.png!r} must name a .png file")
    check_out("--png", args.png, folder=False)
    scenario = load(args)
    if scenario.perturbations:  # checked against the cluster as `run` checks them
        from ..run.perturb import Perturbation

        checked = build_cluster(scenario.cluster, pattern=scenario.network.symmetry)
        perturbation = Perturbation.of(scenario, checked)
        assert perturbation is not None  # the scenario has perturbations
        perturbation.capacities(checked.capacities)
    cluster = build_cluster(scenario.cluster)
    if args.png and cluster.num_gpus > MAX_DRAWN_GPUS:
        raise ScenarioError(
            f"--png draws clusters of up to {MAX_DRAWN_GPUS} GPUs; this one has "
            f"{cluster.num_gpus} (try --set cluster.num_nodes=4)"
        )
    summary = summarize(cluster.graph, scenario.cluster.gpus_per_node)
    if args.json:
        head = {"schema_version": SCHEMA_VERSION, "command": "topology", "scenario": scenario.name}
        print_json({**head, **summary})
    else:
        print(topology_text(scenario, summary))
    if args.links and not args.json:
        print("\n  link  role     GB/s  from -> to")
        for link in cluster.links:
            print(
                f"  {link.index:>5} {cluster.link_role(link.index):<7}"
                f"{link.bandwidth_bytes_per_s / 1e9:>7.4g}  {link_name(link.src, link.dst)}"
            )
    if args.png:
        spec = scenario.cluster
        planes = planes_of(spec.fabric_shape(), spec.nics_per_node) if spec.fabric in PLANAR else 1
        figure = topology_figure(cluster.graph, scenario.name, planes)
        with out_errors("--png", args.png):
            atomic_write_figure(Path(args.png), figure, dpi=110)
        if not args.json:
            print(f"\n  wrote {args.png}")
    return 0
