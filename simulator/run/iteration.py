"""One call from a Scenario to its simulated iteration: cluster, workload, engine, metrics."""

from __future__ import annotations

import gc
import itertools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

import numpy as np

from stepsim.topologies import (
    PLANAR,
    AnyCluster,
    Cluster,
    NodeShape,
    PatternCluster,
    TreePatternCluster,
    build_graph,
    one_switch,
)
from stepsim.topologies.describe import LINK_ROLES, link_name

from ..comm.classes import Partition
from ..comm.collectives import LayoutError
from ..comm.congruent import collapsible, exact_transfers
from ..comm.placement import placement_of
from ..cost.memory import out_of_memory, stage_memory
from ..cost.orders import inflight_per_stage, stage_orders
from ..emit.lowering import lower, lower_classes
from ..engine.core import simulate, simulate_totals
from ..engine.network import AnalyticalNetwork, FairShareNetwork
from ..ir.flows import Members, Uncertified
from ..ir.ops import Workload
from ..ir.results import ClassRun, LinkLoad, Result, StageMemory, Trace
from ..ir.units import gbps_to_bytes_per_s, gbytes_per_s_to_bytes_per_s, us_to_s
from ..ir.vocabulary import ANALYTICAL, FAIR_SHARE, IDLE_TIME
from ..report.linkstats import Utilization, link_utilization, utilization_over_time
from ..report.metrics import summarize, tally
from ..scenario import ClusterSpec, Scenario, ScenarioError, limits
from . import fastforward
from .bubble import PASS_OF_KIND, idle_causes, pass_times
from .perturb import Perturbation, in_classes

# the network model a scenario names (network.model), as the engine's network
NETWORKS = {FAIR_SHARE: FairShareNetwork, ANALYTICAL: AnalyticalNetwork}


def build_cluster(
    spec: ClusterSpec, *, pattern: bool = False
) -> Cluster | PatternCluster | TreePatternCluster:
    """The cluster of ``spec``: the whole graph, or with ``pattern`` its repeating unit
    and switches counted (topologies.pattern on one switch, topologies.tree_pattern on
    fat trees and rails: the same links and routes, and a server more costs nothing).
    Drawing the whole graph is refused over the GPU and link limits
    (scenario/limits.py)."""
    node = NodeShape(
        gpus=spec.gpus_per_node,
        nics=spec.nics_per_node,
        nvlink_topology=spec.nvlink_topology,
        nvlink_bytes_per_s=gbytes_per_s_to_bytes_per_s(spec.nvlink_gbytes_per_s)
        * spec.nvlink_efficiency,
        nvlink_latency_s=us_to_s(spec.nvlink_latency_us),
        pcie_bytes_per_s=gbytes_per_s_to_bytes_per_s(spec.pcie_gbytes_per_s),
        pcie_latency_s=us_to_s(spec.pcie_latency_us),
        nic_bytes_per_s=gbps_to_bytes_per_s(spec.nic_gbps) * spec.nic_efficiency,
    )
    fabric = spec.fabric_shape()
    domain = spec.nvlink_domain_gpus
    if pattern and fabric.kind not in PLANAR:  # rail-only, multi-plane: drawn whole
        kind = PatternCluster if one_switch(spec.num_nodes, fabric) else TreePatternCluster
        return kind(spec.num_nodes, node, fabric, nvlink_domain_gpus=domain)
    limits.check_cluster(spec)
    return Cluster(
        build_graph(spec.num_nodes, node, fabric, nvlink_domain_gpus=domain),
        gpus_per_node=spec.gpus_per_node,
        nvlink_domain_gpus=domain,
    )


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector. Lowering, simulating and summarizing allocate
    millions of ops, spans and events that either live to the end or die by reference
    counting; the collector's repeated passes over them cost a fifth of a large run
    and find nothing to free."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        # What was allocated meanwhile sits in the youngest generation, and the first
        # collection after this would walk all of it (a second per few million ops) and
        # then again as it is promoted. Freezing and unfreezing moves it to the oldest
        # generation unwalked; it stays collectable.
        gc.freeze()
        gc.unfreeze()
        if was_enabled:
            gc.enable()


def memory_per_stage(scenario: Scenario) -> list[StageMemory]:
    """Memory on one GPU of each pipeline stage (no simulation needed)."""
    return [
        stage_memory(scenario, stage, inflight)
        for stage, inflight in enumerate(inflight_per_stage(scenario))
    ]


def run(
    scenario: Scenario,
    progress: Callable[[float], None] | None = None,
    *,
    spans: bool = True,
    idle_split: bool = True,
) -> Result:
    """Simulate one training iteration of the scenario. A layout that does not fit in
    GPU memory is simulated all the same; ``metrics.out_of_memory`` says so.
    ``progress`` is called with the fraction of ops simulated (see engine.simulate).
    ``spans`` False: the caller reads only the metrics (`stepsim run --json` without
    --out), and the engine may add the spans up as they end rather than record them
    (`engine.core.simulate_totals`; the result's trace then has no spans); the
    metrics are the same, bit for bit. ``idle_split`` False: leave the idle unsplit by
    cause (`metrics.idle_by_cause_s` None; the calibration fits read only the times)."""
    result = _run(scenario, progress, spans=spans)
    if not idle_split or scenario.parallel.pipeline_model_parallel_size == 1:
        return result
    return result._replace(metrics=replace(result.metrics, idle_by_cause_s=idle_split_of(result)))


def idle_split_of(result: Result) -> dict[str, float]:
    """The run's mean idle per GPU by cause (run/bubble.py `idle_causes`), from its
    pipeline's orders and each stage's compute op times per micro-batch."""
    scenario, metrics = result.scenario, result.metrics
    par = scenario.parallel
    times = pass_times(result.workload, par.pipeline_model_parallel_size, PASS_OF_KIND)
    causes = idle_causes(
        stage_orders(scenario),
        times,
        metrics.breakdown_s[IDLE_TIME],
        num_chunks=par.virtual_pipeline_model_parallel_size,
        placement=scenario.training.placement,
    )
    return {
        "schedule": causes.schedule_s,
        "imbalance": causes.imbalance_s,
        "communication": causes.communication_s,
    }


def _run(
    scenario: Scenario,
    progress: Callable[[float], None] | None = None,
    *,
    spans: bool = True,
) -> Result:
    """`run` without the idle split."""
    # symmetric mode simulates the representative GPUs: the pattern is enough
    cluster = build_cluster(scenario.cluster, pattern=scenario.network.symmetry)
    # class mode routes every GPU's flows (what it refuses is refused before drawing)
    if in_classes(scenario, cluster):
        cluster = build_cluster(scenario.cluster)
    # the scenario's what-ifs, applied at each step below (run/perturb.py)
    perturbation = Perturbation.of(scenario, cluster)
    capacities = cluster.capacities
    if perturbation is not None:
        capacities = perturbation.capacities(capacities)
    network = NETWORKS[scenario.network.model].factory(capacities)
    with gc_paused():
        try:
            # a long pipeline's steady state, proved to repeat (run/fastforward.py)
            # its lowerings differ only in the number of micro-batches: their transfers
            # are built once (collectives.Pattern.memo), the full run's too
            memo: dict = {}
            # exact mode: a congruent TP group as one lane (comm/congruent.py), decided
            # once for every lowering (the fast-forward's, a gpu_type perturbation's two)
            collapse = collapsible(scenario)
            plan = fastforward.fast_forward(
                scenario, lambda s: lower(s, cluster, collapse=collapse, memo=memo), network
            )
            if plan is not None:
                if progress is not None:
                    progress(1.0)
                return _fast_forwarded(scenario, cluster, plan)
            workload: Workload | None = None
            if perturbation is None:
                workload = lower(scenario, cluster, collapse=collapse, memo=memo)
            elif not perturbation.classes:
                workload = perturbation.lower(collapse)
        except LayoutError as exc:  # the layout the user chose: their one-line error
            raise ScenarioError(str(exc)) from None
        blame = perturbation is not None
        # the seconds per category and spans counted as they ended (no spans kept)
        totals: tuple[dict[tuple[int, str], dict[str, float]], int] | None = None
        classes = None
        if workload is None:  # class mode: lowered and run until its classes hold
            workload, trace, totals, classes = _in_classes(
                scenario, cluster, capacities, progress, spans
            )
        elif spans or any(lane.copies != 1 for lane in workload.lanes):
            trace = simulate(workload, network=network, progress=progress, blame=blame)
        else:
            trace, seconds, num_spans = simulate_totals(
                workload, network=network, progress=progress, blame=blame
            )
            totals = (seconds, num_spans)
        trace = trace._replace(num_transfers=exact_transfers(workload, trace.num_transfers))
        counted = None if totals is None else tally(workload, trace, *totals)
        memory = memory_per_stage(scenario)
        problem: object = out_of_memory(scenario, memory)
        if problem is None and perturbation is not None:
            problem = perturbation.memory_problem(memory)
        metrics = summarize(
            scenario,
            workload,
            trace,
            memory,
            out_of_memory=str(problem) if problem is not None else None,
            busiest_links=busiest_links(cluster, trace),
            counted=counted,
        )
        if perturbation is not None:
            metrics = perturbation.explained(metrics, workload, trace.waits, classes)
    return Result(scenario, cluster, workload, trace, memory, metrics, classes)


def _in_classes(
    scenario: Scenario,
    cluster,
    capacities: Sequence[float],
    progress: Callable[[float], None] | None,
    spans: bool,
) -> tuple[Workload, Trace, tuple[dict[tuple[int, str], dict[str, float]], int] | None, ClassRun]:
    """Class mode (comm/classes.py): from one class of every GPU of a stage, lower and
    simulate, and where a class transfer's members would not run as one (the network's
    certificate, gathered over the whole run, or unlike routes), split the classes and
    start again. Each split adds a class of tensor ranks or of replicas, so it ends
    within T + D runs (at worst exact mode's lane per GPU); the run whose certificate
    held throughout is exact mode's, to rounding. The members' own transfers are built
    once for all the runs."""
    placement = placement_of(scenario)
    partition = Partition.whole(placement)
    model = NETWORKS[scenario.network.model]
    built: dict = {}  # the members' own transfers, the same in every run
    for runs in itertools.count(1):
        members: Members = {}
        failed: list[Uncertified] = []  # the run goes on past a failure, gathering them
        found = ClassRun(partition.ranks, partition.replicas, runs)
        totals = None
        try:
            workload = lower_classes(scenario, cluster, partition, members, built)
            network = model.factory(capacities, members, failed)
            if spans:
                trace = simulate(workload, network=network, progress=progress, blame=True)
            else:
                trace, seconds, num_spans = simulate_totals(
                    workload, network=network, progress=progress, blame=True
                )
                totals = (seconds, num_spans)
        except Uncertified as unlike:  # members of unlike shape, found while lowering
            failed = [unlike]
        except LayoutError as exc:
            raise ScenarioError(str(exc)) from None
        if not failed:
            return workload, trace, totals, found
        before = partition
        for error in failed:
            partition = partition.refined(placement, error)
        assert partition != before  # the run's first failure splits a class
    raise AssertionError("unreachable: itertools.count does not end")


def _fast_forwarded(scenario: Scenario, cluster, plan: fastforward.Plan) -> Result:
    """The full run's result from a proved fast-forward: its metrics, and the short
    run's workload and trace (what trace.json and the timeline show)."""
    memory = memory_per_stage(scenario)
    problem = out_of_memory(scenario, memory)
    # exact mode's collapsed TP groups: the transfers every GPU would have started
    started = exact_transfers(plan.workload, plan.trace.num_transfers)
    plan = plan._replace(trace=plan.trace._replace(num_transfers=started))
    end_s, utilization, series_of = fastforward.link_loads(plan, cluster.capacities, PEAK_BINS)
    links = busiest_links(
        cluster, plan.trace, end_s=end_s, utilization=utilization, series_of=series_of
    )
    metrics = summarize(
        scenario,
        plan.workload,
        plan.trace,
        memory,
        out_of_memory=str(problem) if problem is not None else None,
        busiest_links=links,
        counted=fastforward.tally(plan),
    )
    summary = fastforward.summary(plan)
    said = (
        f"fast-forwarded: {summary.simulated_microbatches} of {metrics.num_microbatches} "
        "micro-batches simulated, the rest added as a steady state proved to repeat"
    )
    metrics = replace(metrics, fast_forward=summary, assumptions=(*metrics.assumptions, said))
    return Result(scenario, cluster, plan.workload, plan.trace, memory, metrics)


# the busiest links shown per role, and the time bins their peak is the busiest of
BUSIEST_PER_ROLE = 1
PEAK_BINS = 100


def busiest_links(
    cluster: AnyCluster,
    trace: Trace,
    per_role: int = BUSIEST_PER_ROLE,
    *,
    end_s: float | None = None,
    utilization: Utilization | None = None,
    series_of: Callable[[list[int]], dict[int, np.ndarray]] | None = None,
) -> list[LinkLoad]:
    """The links of each role (NVLink, PCIe, NIC, switch uplink) that carried the most
    bytes relative to what they could carry, in LINK_ROLES order, with their peak.

    In symmetric mode these are the representative GPUs' links, each charged for
    every flow it carries (multiplicities included); in exact mode any link. A
    fast-forward (simulator/run/fastforward.py) gives the iteration's ``end_s``, each link's
    ``utilization`` and the chosen links' utilization over time (``series_of``).
    """
    links, capacities = cluster.links, cluster.capacities
    if end_s is None:
        end_s = trace.end_s
    if utilization is None:
        utilization = link_utilization(trace.link_intervals, capacities, end_s)
    # only links that carried something can be chosen: the others are never looked at
    carried = utilization.values > 0
    used, values = utilization.links[carried], utilization.values[carried]
    # ties: lower first (a fast-forward's sums differ from a full run's in the last bits:
    # its utilization is ranked to 12 decimals, so that links equal in one are in both)
    ranked = values if series_of is None else np.round(values, 12)
    by_rank = np.argsort(-ranked, kind="stable")
    ranked_links = used[by_rank]
    ranked_list = ranked_links.tolist()
    roles_of = getattr(cluster, "link_roles", None)  # a pattern cluster's, on arrays
    found = (
        roles_of(ranked_links)
        if roles_of is not None
        else list(map(cluster.link_role, ranked_list))
    )
    # each role's busiest: its first per_role in rank order (list.index runs in C)
    chosen: list[int] = []
    roles: dict[int, str] = {}
    for role in LINK_ROLES:
        at = -1
        for _ in range(per_role):
            try:
                at = found.index(role, at + 1)
            except ValueError:
                break
            chosen.append(ranked_list[at])
            roles[ranked_list[at]] = role
    if series_of is None:
        _, series = utilization_over_time(
            trace.link_intervals, capacities, chosen, end_s, PEAK_BINS
        )
    else:
        series = series_of(chosen)
    return [
        LinkLoad(
            link=link_name(links[i].src, links[i].dst),
            kind=roles[i],
            index=i,
            utilization=utilization[i],
            gbytes=utilization[i] * capacities[i] * end_s / 1e9,
            peak_utilization=float(series[i].max()),
        )
        for i in chosen
    ]
