"""A scenario's perturbations (scenario/perturbation.py) applied to its run, as one
`Perturbation` that iteration.run asks at each step: the network's capacities, the
lowering, the memory check and who waited for whom.

- **Compute** (``slow_gpu``, ``gpu_type``, ``jitter``): the lowered workload's compute
  ops on the touched GPUs' lanes get new durations (`perturb_compute`): a
  ``gpu_type`` node's from a second lowering with that GPU as ``cluster.gpu`` (the same
  ops in the same order: its kernel model, nothing else), then times each ``slow_gpu``
  factor, then times each ``jitter`` draw.
- **Network** (``slow_link``, ``slow_nic``): the cable's two directed links at
  ``bandwidth_factor`` x their capacity (`capacities`); ``down`` takes switch-to-switch
  cables out of routing (`fail_links`, exact mode) and detours a failed NIC's GPUs
  through another NIC of their node (`detours`: the job after its restart).
- **Symmetric mode** (the fast path): the replicas a perturbation touches
  (`touched_replicas`) are lowered as in exact mode, every GPU of them, beside the
  representative lanes, which stand for the untouched replicas (lowering.lower).

Everything here is deterministic: jitter draws from numpy's generator seeded by
(seed, GPU), in the GPU's op order, the same in both modes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from stepsim.topologies import PLANAR, AnyCluster
from stepsim.topologies.detour import Detour

from ..comm.classes import Partition
from ..comm.placement import placement_of
from ..emit.lowering import lower
from ..ir.ops import Workload
from ..ir.results import ClassRun, Metrics, StageMemory, Wait, WaitCause
from ..ir.units import bytes_to_gib
from ..ir.vocabulary import COMPUTE_KINDS, FAIR_SHARE
from ..scenario import Scenario, ScenarioError
from ..scenario.hardware import GPUS
from ..scenario.perturbation import (
    GPU_TYPE,
    JITTER,
    SLOW_GPU,
    SLOW_LINK,
    SLOW_NIC,
    PerturbationSpec,
    where,
)


class Perturbation:
    """A scenario's perturbations as one run applies them. Built once its cluster is
    (failed cables leave the cluster's routing then, `fail_links`; in symmetric mode the
    touched replicas are found, `fast_path`), it gives the network's link capacities,
    the workload lowered with the touched GPUs retimed, the memory problem of a slower
    node's GPUs and the metrics with who waited for whom."""

    def __init__(self, scenario: Scenario, cluster: AnyCluster) -> None:
        self.scenario, self.cluster = scenario, cluster
        # symmetric mode, a switch-to-switch link: class mode (comm/classes.py)
        self.classes = in_classes(scenario, cluster)
        self.touched: frozenset[int] = frozenset()
        self.split: frozenset[tuple[int, int]] = frozenset()
        if not self.classes:
            self.touched, self.split = fast_path(scenario, cluster)
        fail_links(scenario, cluster)

    @classmethod
    def of(cls, scenario: Scenario, cluster: AnyCluster) -> Perturbation | None:
        """The scenario's perturbations on ``cluster``; None when it has none."""
        return cls(scenario, cluster) if scenario.perturbations else None

    def capacities(self, base: list[float]) -> list[float]:
        return capacities(self.scenario, self.cluster, base)

    def lower(self, collapse: bool) -> Workload:
        """The workload as lowering.lower gives it with the touched replicas split out,
        its touched GPUs' compute retimed (`perturb_compute`)."""
        cluster, touched, split = self.cluster, self.touched, self.split
        workload = lower(self.scenario, cluster, touched, split, collapse)
        return perturb_compute(
            self.scenario,
            workload,
            lambda other: lower(other, cluster, touched, split, collapse),
        )

    def memory_problem(self, memory: list[StageMemory]) -> str | None:
        return memory_problem(self.scenario, memory)

    def explained(
        self,
        metrics: Metrics,
        workload: Workload,
        waits: Sequence[Wait],
        classes: ClassRun | None = None,
    ) -> Metrics:
        """``metrics`` with the waits by cause and the perturbations as the summary
        lists them (``classes``: class mode's, whose lanes are classes of GPUs)."""
        return replace(
            metrics,
            waits=wait_causes(self.scenario, self.cluster, workload, waits, classes),
            perturbations=described(self.scenario, self.cluster),
        )


def gpus_of(p: PerturbationSpec, scenario: Scenario) -> list[int]:
    """The GPUs a compute perturbation touches."""
    gpn = scenario.cluster.gpus_per_node
    if p.gpu is not None:
        return [p.gpu]
    if p.node is not None:
        return list(range(p.node * gpn, (p.node + 1) * gpn))
    return list(range(scenario.cluster.num_gpus))


def named(scenario: Scenario, p: PerturbationSpec) -> str:
    """How an error names a perturbation: its number in the file and what it says."""
    return f"{where(scenario.perturbations.index(p))} ({p.describe()})"


def cable(cluster, index: int, p: PerturbationSpec, scenario: Scenario) -> tuple[int, ...]:
    """The perturbation's cable as link numbers: ``index`` and the link back."""
    links = cluster.links
    if index >= len(links):
        raise ScenarioError(
            f"{named(scenario, p)}: link={index} is not a link of the cluster "
            f"(0 to {len(links) - 1}; stepsim topology --links lists them)",
            key="perturbation.link",
            value=index,
        )
    link = links[index]
    back = _index_of(cluster, link.dst, link.src)
    return (index,) if back is None else (index, back)


def _index_of(cluster, src: tuple, dst: tuple) -> int | None:
    index_of = getattr(cluster, "index_of", None)
    if index_of is not None:
        try:
            return index_of(src, dst)
        except KeyError:
            return None
    return next((link.index for link in cluster.links if (link.src, link.dst) == (src, dst)), None)


def nic_cable(cluster, scenario: Scenario, p: PerturbationSpec) -> tuple[int, ...]:
    """The links between NIC ``p.nic`` of node ``p.node`` and its leaf switch, found on a
    route from one of the node's GPUs to another node's (a NIC carries nothing else)."""
    gpn, nodes = scenario.cluster.gpus_per_node, scenario.cluster.num_nodes
    node = p.node
    assert node is not None  # a slow_nic names its node (scenario/perturbation.py's rules)
    nic = ("nic", node, p.nic)
    if nodes > 1:
        other = ((node + 1) % nodes) * gpn
        links = cluster.links
        for g in range(node * gpn, (node + 1) * gpn):
            out = [i for i in cluster.own_route(g, other + g % gpn) if links[i].src == nic]
            back = [i for i in cluster.own_route(other + g % gpn, g) if links[i].dst == nic]
            if out and back and links[out[0]].dst[0] == "switch":
                return (out[0], back[0])
    raise ScenarioError(
        f"{named(scenario, p)}: no GPU's traffic leaves node {p.node} through NIC {p.nic}",
        key="perturbation.nic",
        value=p.nic,
    )


def cables(scenario: Scenario, cluster) -> list[tuple[PerturbationSpec, tuple[int, ...]]]:
    """Each network perturbation with its links."""
    out = []
    for p in scenario.perturbations:
        if p.kind == SLOW_LINK:
            assert p.link is not None  # a slow_link names its link (the rules)
            out.append((p, cable(cluster, p.link, p, scenario)))
        elif p.kind == SLOW_NIC:
            out.append((p, nic_cable(cluster, scenario, p)))
    return out


def capacities(scenario: Scenario, cluster, base: list[float]) -> list[float]:
    """Link capacities with the slowed cables' scaled (a failed one keeps its own: no
    route takes it)."""
    slowed = [(p, links) for p, links in cables(scenario, cluster) if p.bandwidth_factor]
    if not slowed:
        return base
    out = list(base)
    for p, links in slowed:
        factor = p.bandwidth_factor
        assert factor is not None  # slowed holds the cables with a factor
        for i in links:
            out[i] *= factor
    return out


def fail_links(scenario: Scenario, cluster) -> None:
    """Take failed cables out of routing. A NIC's cable: the job as it runs after its
    restart without that NIC, the NIC's GPUs detoured through another NIC of their
    node (`detours`). A cable between switches: routes avoid it, where every leaf
    still reaches the leaves it reached. A GPU's NVLink or PCIe link: an error (NCCL
    has no path around a GPU's own link; the GPU, so its node, leaves the job)."""
    nics = []
    for p, links in cables(scenario, cluster):
        if not p.down:
            continue
        role = cluster.link_role(links[0])
        if role == "nic":
            nics.append((p, links))
            continue
        if role != "uplink":
            raise ScenarioError(
                f"{named(scenario, p)}: a failed {role} link takes its GPU out of the job "
                f"(NCCL has no path around a GPU's own NVLink or PCIe link; a restart "
                f"leaves the node out: run with one node fewer); use bandwidth_factor for "
                f"a degraded one",
                key="perturbation.down",
                value=True,
            )
        ends = [(cluster.links[i].src, cluster.links[i].dst) for i in links]
        cut = cluster.fail_switch_links(ends)
        if cut:
            raise ScenarioError(
                f"{named(scenario, p)}: with it down, leaf {cut[0][2]} cannot reach every leaf it "
                f"reached (no other path in this fabric)",
                key="perturbation.down",
                value=True,
            )
    if nics:
        cluster.detour(detours(scenario, cluster, nics))


def failed_nic(cluster, links: tuple[int, ...]) -> tuple:
    """The NIC vertex ``("nic", node, k)`` of a NIC's cable."""
    link = cluster.links[links[0]]
    return link.src if link.src[0] == "nic" else link.dst


def detours(scenario: Scenario, cluster, failed) -> dict[int, Detour]:
    """Where the GPUs of each failed NIC send and receive after the restart: through
    the node's NIC ``k ^ 1`` (on a DGX A100 the NIC under the same PCIe switch, which
    NCCL's search picks), else the lowest-numbered NIC up (docs/what-if.md)."""
    spec = scenario.cluster
    gpn, nodes, count = spec.gpus_per_node, spec.num_nodes, spec.nics_per_node
    down = {failed_nic(cluster, links): p for p, links in failed}
    out: dict[int, Detour] = {}
    for (_, node, k), p in down.items():
        if spec.fabric in PLANAR:
            raise ScenarioError(
                f"{named(scenario, p)}: on a {spec.fabric} fabric NIC {k} is node {node}'s "
                f"only way onto its {'rail' if spec.fabric == 'rail-only' else 'plane'}",
                key="perturbation.down",
                value=True,
            )
        order = [k ^ 1] + [j for j in range(count) if j != k ^ 1]
        spare = next(
            (j for j in order if j < count and j != k and ("nic", node, j) not in down), None
        )
        if spare is None:
            raise ScenarioError(
                f"{named(scenario, p)}: node {node} has no other NIC up, so its GPUs cannot "
                f"reach other nodes (the job restarts without the node: run with one node "
                f"fewer)",
                key="perturbation.down",
                value=True,
            )
        other = ((node + 1) % nodes) * gpn  # nodes > 1: nic_cable found the cable
        gpus = range(node * gpn, (node + 1) * gpn)
        leaves = {g: cluster.own_route(g, other) for g in gpus}
        nic_of = {g: cluster.links[route[0]].dst for g, route in leaves.items()}
        via = next(g for g in gpus if nic_of[g] == ("nic", node, spare))
        for g in gpus:
            if nic_of[g] == ("nic", node, k):
                up, back = leaves[g][0], cluster.own_route(other, g)[-1]
                out[g] = Detour(via, up, back, ("nic", node, spare))
    return out


def described(scenario: Scenario, cluster) -> tuple[str, ...]:
    """Each perturbation as the summary and metrics.json list it; a failed NIC cable's
    says that the run is the job's after its restart without that NIC."""
    links_of = {id(p): links for p, links in cables(scenario, cluster)}
    out = []
    for p in scenario.perturbations:
        text, links = p.describe(), links_of.get(id(p))
        if p.down and links and cluster.link_role(links[0]) == "nic":
            _, node, k = nic = failed_nic(cluster, links)
            gpus = sorted(g for g, d in cluster.detours.items() if cluster.links[d.up].dst == nic)
            spare = cluster.detours[gpus[0]].nic[2]
            text += (
                f": the run after the job's restart without NIC {k} of node {node} "
                f"({'GPUs' if len(gpus) > 1 else 'GPU'} {', '.join(map(str, gpus))} "
                f"{'use' if len(gpus) > 1 else 'uses'} NIC {spare}; "
                f"the restart itself: stepsim plan goodput)"
            )
        out.append(text)
    return tuple(out)


# -- symmetric mode: which replicas leave the representative ---------------------------


def between_switches(scenario: Scenario, cluster) -> list[PerturbationSpec]:
    """The perturbations of a link between switches (a leaf's uplink, say): their
    traffic is many replicas', which the fast path cannot split."""
    gpn = scenario.cluster.gpus_per_node
    out = []
    for p in scenario.perturbations:
        if p.kind == SLOW_LINK:
            assert p.link is not None  # a slow_link names its link (the rules)
            links = cable(cluster, p.link, p, scenario)
            if _node_of(cluster.links[links[0]], gpn) is None:
                out.append(p)
    return out


def in_classes(scenario: Scenario, cluster) -> bool:
    """Whether symmetric mode runs the scenario in class mode (comm/classes.py): a link
    between switches is perturbed. Class mode takes only what acts on links (slow or
    failed links and NICs) and the layouts the fast path takes; a one-line error for
    the rest, before the run draws the whole cluster that class mode routes on."""
    if not scenario.network.symmetry or not scenario.perturbations:
        return False
    switched = between_switches(scenario, cluster)
    if not switched:
        return False
    off = "; set network.symmetry = false (exact mode) for it"
    what = named(scenario, switched[0])
    others = [p for p in scenario.perturbations if p.kind not in (SLOW_LINK, SLOW_NIC)]
    if others:
        raise ScenarioError(
            f"{what}: a link between switches is simulated by classes of GPUs that run "
            f"alike, which take only link perturbations; {named(scenario, others[0])} "
            f"acts on a GPU{off}",
            key="network.symmetry",
            value=True,
        )
    if scenario.cluster.fabric == "fat-tree" and scenario.cluster.fabric_levels > 2:
        # measured: on llama3.1-405b-16k-h100's 3-level tree the first run, one class a
        # stage, took 322 s, about exact mode's time (docs/performance.md)
        raise ScenarioError(
            f"{what}: a link between switches in symmetric mode is simulated by classes of "
            f"GPUs on 2-level fabrics only (on a 3-level fat tree it costs about what exact "
            f"mode does){off}",
            key="cluster.fabric_levels",
            value=scenario.cluster.fabric_levels,
        )
    if scenario.network.model != FAIR_SHARE:
        # the analytical model runs each transfer as if alone: a class transfer's
        # members would share its links where exact mode's transfers do not
        raise ScenarioError(
            f"{what}: a link between switches in symmetric mode is simulated by classes of "
            f"GPUs, which need network.model = 'fair-share'{off}",
            key="network.model",
            value=scenario.network.model,
        )
    training = scenario.training
    if (
        scenario.parallel.cp_size > 1
        or scenario.model.moe
        or training.data_parallel_sharding == "full"
        or training.offloaded_layers
    ):
        raise ScenarioError(
            f"{what}: a link between switches in symmetric mode needs a layout without "
            f"context or expert parallelism, FSDP (data_parallel_sharding='full') or "
            f"activation offloading{off}",
            key="network.symmetry",
            value=True,
        )
    return True


def fast_path(scenario: Scenario, cluster) -> tuple[frozenset[int], frozenset[tuple[int, int]]]:
    """Symmetric mode's fast path: the data-parallel replicas a perturbation touches
    (lowered besides the representative), and their (replica, stage) TP groups that hold
    a touched GPU (a lane per GPU; the replica's other groups a lane each); a one-line
    error for what it cannot simulate."""
    if not scenario.perturbations or not scenario.network.symmetry:
        return frozenset(), frozenset()
    par, placement = scenario.parallel, placement_of(scenario)
    off = "; set network.symmetry = false (exact mode) for it"
    if par.cp_size > 1 or scenario.model.moe:
        raise ScenarioError(
            "perturbations in symmetric mode need a layout without context or expert "
            f"parallelism{off}",
            key="network.symmetry",
            value=True,
        )
    if scenario.training.data_parallel_sharding == "full":
        raise ScenarioError(
            f"perturbations in symmetric mode do not support data_parallel_sharding='full'{off}",
            key="network.symmetry",
            value=True,
        )
    gpn = scenario.cluster.gpus_per_node
    touched: set[int] = set()
    split: set[tuple[int, int]] = set()
    per_stage = placement.tensor * placement.data
    for i, p in enumerate(scenario.perturbations):
        gpus: Sequence[int]
        if p.kind == SLOW_NIC:
            links = nic_cable(cluster, scenario, p)
        elif p.kind == SLOW_LINK:
            assert p.link is not None  # a slow_link names its link (the rules)
            links = cable(cluster, p.link, p, scenario)
        if p.kind in (SLOW_LINK, SLOW_NIC):
            node = _node_of(cluster.links[links[0]], gpn)
            if node is None:
                raise ScenarioError(
                    f"{where(i)} ({p.describe()}): a switch-to-switch link carries (or, "
                    f"failed, reroutes) traffic of many replicas, which symmetric mode "
                    f"cannot split{off}",
                    key="network.symmetry",
                    value=True,
                )
            gpus = range(node * gpn, (node + 1) * gpn)
        else:
            if p.kind == JITTER and p.gpu is None and p.node is None:
                raise ScenarioError(
                    f"{where(i)} ({p.describe()}): jitter on every GPU touches every replica; "
                    f"give it a gpu or node{off}",
                    key="network.symmetry",
                    value=True,
                )
            gpus = gpus_of(p, scenario)
        for g in gpus:
            d = placement.replica_of(g)
            if d == 0:
                raise ScenarioError(
                    f"{where(i)} ({p.describe()}) touches data-parallel replica 0, which "
                    "stands for the untouched replicas in symmetric mode: target another "
                    f"replica (GPUs {placement.tensor} to {per_stage - 1} of stage 0 are "
                    f"replicas 1 and up; replicas are alike){off}",
                    key="network.symmetry",
                    value=True,
                )
            touched.add(d)
            split.add((d, g // per_stage))
    # the tied embedding's all-reduce pairs the first and last stage's groups: both
    # whole or both split
    last = placement.pipeline - 1
    split |= {(d, s) for d, _ in list(split) for s in (0, last) if {(d, 0), (d, last)} & split}
    return frozenset(touched), frozenset(split)


def _node_of(link, gpus_per_node: int) -> int | None:
    """The node a link of one node belongs to; None for a link between switches."""
    for vertex in (link.src, link.dst):
        if vertex[0] == "gpu":
            return vertex[1] // gpus_per_node
        if vertex[0] in ("nic", "nvswitch"):
            return vertex[1]
    return None


# -- compute --------------------------------------------------------------------------


def perturb_compute(
    scenario: Scenario, workload: Workload, lower_with: Callable[[Scenario], Workload]
) -> Workload:
    """The workload with the touched GPUs' compute ops retimed (module docstring).
    ``lower_with(other)`` lowers ``other`` (the scenario on another GPU) as the
    workload was lowered."""
    compute = [(i, p) for i, p in enumerate(scenario.perturbations) if p.kind in _COMPUTE]
    if not compute:
        return workload
    lanes_of: dict[int, list[int]] = {}
    for lane in workload.lanes:
        lanes_of.setdefault(lane.gpu, []).append(lane.index)
    ops = list(workload.ops)
    simulated = set(lanes_of)
    for i, p in compute:
        gpus = [g for g in gpus_of(p, scenario) if g in simulated]
        if p.kind == GPU_TYPE:
            other = _lowered_on(scenario, p, i, lower_with, workload)
            for g in gpus:
                for index in _compute_ops(workload, lanes_of[g]):
                    ops[index] = ops[index]._replace(duration_s=other.ops[index].duration_s)
        elif p.kind == SLOW_GPU:
            factor = p.factor
            assert factor is not None  # a slow_gpu has its factor (the rules)
            for g in gpus:
                for index in _compute_ops(workload, lanes_of[g]):
                    ops[index] = ops[index]._replace(duration_s=ops[index].duration_s * factor)
        else:  # jitter: lognormal of mean 1, per op, one stream per GPU
            sigma = p.sigma
            assert sigma is not None and p.seed is not None  # a jitter has both (the rules)
            for g in gpus:
                indices = _compute_ops(workload, lanes_of[g])
                rng = np.random.default_rng([p.seed, g])
                z = rng.standard_normal(len(indices))
                factors = np.exp(sigma * z - sigma**2 / 2).tolist()
                for index, f in zip(indices, factors, strict=True):
                    ops[index] = ops[index]._replace(duration_s=ops[index].duration_s * f)
    return workload._replace(ops=tuple(ops))


_COMPUTE = (SLOW_GPU, GPU_TYPE, JITTER)


def _compute_ops(workload: Workload, lanes: list[int]) -> list[int]:
    """The GPU's compute ops with a duration, lane by lane in op order."""
    ops = workload.ops
    return [
        index
        for lane in lanes
        for index in workload.lanes[lane].ops
        if ops[index].kind in COMPUTE_KINDS and ops[index].duration_s > 0
    ]


def _lowered_on(
    scenario: Scenario,
    p: PerturbationSpec,
    i: int,
    lower_with: Callable[[Scenario], Workload],
    workload: Workload,
) -> Workload:
    """The workload lowered with the node's GPU model as the cluster's: its own kernel
    constants (not a calibration file's, which is for cluster.gpu)."""
    assert p.gpu_model is not None  # a gpu_type names its model (the rules)
    try:
        other = replace(
            scenario,
            cluster=replace(scenario.cluster, gpu=GPUS[p.gpu_model]),
            calibration=None,
            perturbations=(),
        )
    except ScenarioError as exc:
        raise ScenarioError(
            f"{where(i)} ({p.describe()}): this scenario cannot run on {p.gpu_model}: {exc}",
            key="perturbation.gpu_model",
            value=p.gpu_model,
        ) from None
    lowered = lower_with(other)
    pairs = zip(lowered.ops, workload.ops, strict=False)
    same = len(lowered.ops) == len(workload.ops) and all(
        a.kind == b.kind and a.lane == b.lane for a, b in pairs
    )
    if not same:
        raise ScenarioError(
            f"{where(i)} ({p.describe()}): on {p.gpu_model} this scenario runs other kernels "
            f"(a mechanism depends on the GPU), which a node of it cannot mix in",
            key="perturbation.gpu_model",
            value=p.gpu_model,
        )
    return lowered


def memory_problem(scenario: Scenario, memory) -> str | None:
    """A ``gpu_type`` node whose GPUs hold less memory than a stage on them needs."""
    gpn = scenario.cluster.gpus_per_node
    placement = placement_of(scenario)
    per_stage = placement.tensor * placement.data
    for p in scenario.perturbations:
        if p.kind != GPU_TYPE:
            continue
        node = p.node
        assert p.gpu_model is not None and node is not None  # a gpu_type's (the rules)
        capacity = GPUS[p.gpu_model].memory_gib
        stages = sorted({g // per_stage for g in range(node * gpn, (node + 1) * gpn)})
        for s in stages:
            need = bytes_to_gib(memory[s].total_bytes)
            if need > capacity:
                return (
                    f"{p.describe()}: stage {s} needs {need:.1f} GiB per GPU but "
                    f"{p.gpu_model} has {capacity:g} GiB"
                )
    return None


# -- who waited for whom ----------------------------------------------------------------


def touching(scenario: Scenario, cluster) -> dict[int, list[str]]:
    """Each GPU a perturbation touches, with the perturbations' descriptions (a link's:
    the GPUs of its node)."""
    gpn = scenario.cluster.gpus_per_node
    out: dict[int, list[str]] = {}
    links = dict((id(p), links) for p, links in cables(scenario, cluster))
    for p in scenario.perturbations:
        if p.kind in _COMPUTE:
            gpus = gpus_of(p, scenario)
        else:
            node = _node_of(cluster.links[links[id(p)][0]], gpn)
            gpus = [] if node is None else list(range(node * gpn, (node + 1) * gpn))
        for g in gpus:
            out.setdefault(g, []).append(p.describe())
    return out


def wait_causes(
    scenario: Scenario, cluster, workload: Workload, waits, classes: ClassRun | None = None
) -> tuple[WaitCause, ...]:
    """GPU-seconds lost waiting at collectives (engine Trace.waits), summed by the
    data-parallel replica of the last arriver, named with the perturbations touching a
    GPU of that replica (replicas meet only at data-parallel collectives, so a late
    replica is late by what touches it); most first. In class mode (``classes``) by the
    last arriver's class of GPUs instead."""
    lanes = workload.lanes
    if classes is not None:
        return _class_waits(scenario, workload, waits, classes)
    placement = placement_of(scenario)
    touched = touching(scenario, cluster)
    by_replica: dict[int, set[str]] = {}
    for g, what in touched.items():
        by_replica.setdefault(placement.replica_of(g), set()).update(what)
    totals: dict[int, dict[int, float]] = {}  # replica -> last arriver GPU -> GPU-seconds
    for w in waits:
        gpu = lanes[w.cause].gpu
        replica = placement.replica_of(gpu)
        if replica == 0 and scenario.network.symmetry:  # replica 0's lanes stand for the rest
            replica = gpu = -1
        per_gpu = totals.setdefault(replica, {})
        seconds = w.seconds * lanes[w.lane].stands_for
        # exact mode's congruent TP groups (comm/congruent.py): rank k of the waiting
        # group waited for rank k of the late one, as exact mode's rings of each rank do
        for k in range(lanes[w.lane].copies):
            g = gpu + k if lanes[w.cause].copies > 1 else gpu
            per_gpu[g] = per_gpu.get(g, 0.0) + seconds
    out = []
    for replica, per_gpu in totals.items():
        if replica == -1:
            label = "the replicas no perturbation touches (their representative lanes)"
        else:
            what = sorted(by_replica.get(replica, ()))
            label = f"replica {replica}: " + ("; ".join(what) if what else "no perturbation")
        top = min(per_gpu, key=lambda g: (-per_gpu[g], g))
        out.append(WaitCause(label, replica, top, sum(per_gpu.values())))
    return tuple(sorted(out, key=lambda w: (-w.gpu_seconds, w.replica)))


def _class_waits(
    scenario: Scenario, workload: Workload, waits, classes: ClassRun
) -> tuple[WaitCause, ...]:
    """`wait_causes` in class mode: by the last arriver's class (its tensor ranks and
    replicas), whose GPUs ran alike; a link perturbation touches no GPU of its own."""
    lanes, placement = workload.lanes, placement_of(scenario)
    partition = Partition(classes.ranks, classes.replicas)
    by_class: dict[tuple[int, int], dict[int, float]] = {}  # class -> lane's GPU -> GPU-s
    for w in waits:
        gpu = lanes[w.cause].gpu
        per_gpu = by_class.setdefault(partition.class_of(placement, gpu), {})
        per_gpu[gpu] = per_gpu.get(gpu, 0.0) + w.seconds * lanes[w.lane].stands_for
    out = []
    for (a, b), per_gpu in by_class.items():
        ranks, replicas = classes.ranks[a], classes.replicas[b]
        label = (
            f"tensor rank{'s' if len(ranks) > 1 else ''} {runs_of(ranks)} of "
            f"replica{'s' if len(replicas) > 1 else ''} {runs_of(replicas)} "
            f"({len(ranks) * len(replicas)} GPU{'s' if len(ranks) * len(replicas) > 1 else ''} "
            f"a stage that ran alike)"
        )
        # the class's lane on the stage charged the most (its first GPU), as exact mode names
        # its last arriver charged the most
        top = min(per_gpu, key=lambda g: (-per_gpu[g], g))
        out.append(WaitCause(label, replicas[0], top, sum(per_gpu.values())))
    return tuple(sorted(out, key=lambda w: (-w.gpu_seconds, w.replica, w.gpu)))


def runs_of(values: Sequence[int]) -> str:
    """Sorted integers as runs: 0-3, 7, 9-12."""
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)
