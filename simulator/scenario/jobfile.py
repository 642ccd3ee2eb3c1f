"""A jobs file: several jobs on one fabric. Its schema, where each job's nodes are, and
reading it (its ``[cluster]`` as a scenario's, each ``[[job]]``'s scenario loaded, put on
the shared cluster in exact mode, and placed; every error is one line naming the job).

A jobs file has one ``[cluster]`` table (the shared machine, as a scenario's) and
``[[job]]`` tables, each naming a scenario (its model, layout and training are the
job's; its cluster must be of the shared node kind; its GPU count gives its node
count) and where it runs: ``nodes = "0-3,8-11"`` (a string of ranges, in that order)
or ``placement`` with, for ``random``, a ``seed``. `JobTable` holds one table as
written; `JobSpec` a job resolved (its scenario, its nodes); `JobsSpec` the whole.

Placement (`place`), over the nodes no job holds yet: jobs with ``nodes`` first, then
the others in file order, each taking the nodes its GPU count needs:

- ``packed``: the first free nodes in index order;
- ``spread``: round robin over the fabric's leaf groups (``nodes_per_leaf`` nodes
  under one leaf; on a 3-level fat tree over pods first, then the leaves of a pod),
  so the job's nodes sit under as many leaves (pods) as it has nodes and the fabric
  has: the free nodes ordered by (their rank among their leaf's free nodes, their
  leaf's rank in its pod, their pod), the first taken. On one switch and on
  rail-only fabrics (no leaf groups) it is ``packed``;
- ``random``: numpy's ``default_rng(seed).permutation`` of the free nodes (in index
  order), the first taken.

A job's GPU g sits on GPU ``g mod G`` of the ``g // G``-th node of its list (G GPUs
a node), in the list's order (the order the policy took them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..ir.vocabulary import FAIR_SHARE
from . import schema
from .errors import ScenarioError
from .fields import check_value, key, keys_of
from .files import read_toml, shipped_dir, shipped_scenarios
from .loader import cluster_of_table, load_scenario
from .spec import ClusterSpec, Scenario

SECTION = "job"
PACKED, SPREAD, RANDOM = "packed", "spread", "random"
PLACEMENTS = (PACKED, SPREAD, RANDOM)
# the keys of the node kind a job's scenario must share with the jobs file's cluster
NODE_KEYS = (
    "gpu",
    "gpus_per_node",
    "nics_per_node",
    "nic_gbps",
    "nvlink_gbytes_per_s",
    "nvlink_topology",
    "pcie_gbytes_per_s",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobTable:
    """One ``[[job]]`` table as written."""

    name: str = key("the job's name (unique; the summary and the trace's processes name it)")
    scenario: str = key(
        "its scenario: a file (relative to the jobs file) or a shipped scenario's name; "
        "its model, parallel and training sections are the job's"
    )
    nodes: str | None = key(
        'its nodes as ranges, in order: `"0-15"`, `"0-3,8-11"` (or `placement`)', default=None
    )
    placement: str | None = key(
        "where the job's nodes are chosen among the free ones (or `nodes`)",
        default=None,
        choices=PLACEMENTS,
    )
    seed: int | None = key("`random` placement's seed", default=None, may_be_zero=True)
    iterations: int | None = key(
        "iterations the job runs together with the others (default: enough to cover the "
        "longest job's iteration alone)",
        default=None,
        high=1000,
    )

    def __post_init__(self) -> None:
        for k in keys_of(JobTable, SECTION).values():
            value = getattr(self, k.name)
            if value is not None:
                check_value(k, value)
        if not self.name:
            raise ScenarioError(key="job.name", value=self.name, rule="must not be empty")
        if (self.nodes is None) == (self.placement is None):
            raise ScenarioError(
                f"job {self.name!r}: give either nodes or placement "
                f"({', '.join(PLACEMENTS)}), not {'both' if self.nodes else 'neither'}",
                key="job.placement",
            )
        if (self.seed is not None) != (self.placement == RANDOM):
            raise ScenarioError(
                f"job {self.name!r}: seed goes with placement = {RANDOM!r} (and it needs one)",
                key="job.seed",
                value=self.seed,
            )


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A job resolved: its scenario (on the shared cluster, exact mode) and its nodes."""

    name: str
    scenario: Scenario
    nodes: tuple[int, ...]
    iterations: int | None = None  # None: the default (simulator/run/multijob.py)


@dataclass(frozen=True, slots=True)
class JobsSpec:
    name: str
    cluster: ClusterSpec
    jobs: tuple[JobSpec, ...]

    def __post_init__(self) -> None:
        names = [job.name for job in self.jobs]
        if not names:
            raise ScenarioError("a jobs file needs at least one [[job]] table", key="job")
        for name in names:
            if names.count(name) > 1:
                raise ScenarioError(f"job {name!r}: two jobs share the name", key="job.name")
        held: dict[int, str] = {}
        for job in self.jobs:
            check_nodes(job.name, job.nodes, needed_nodes(job.scenario, self.cluster), self.cluster)
            for n in job.nodes:
                if n in held:
                    raise ScenarioError(
                        f"job {job.name!r}: node {n} is held by job {held[n]!r} too",
                        key="job.nodes",
                        value=n,
                    )
                held[n] = job.name


def markdown_table() -> str:
    """The [[job]] keys as scenarios/README.md shows them."""
    return schema.markdown_table(SECTION, keys_of(JobTable, SECTION))


def needed_nodes(scenario: Scenario, cluster: ClusterSpec) -> int:
    """The nodes a job's GPUs (TP x CP x PP x DP) fill, whole nodes."""
    return -(-scenario.parallel.num_gpus // cluster.gpus_per_node)


def check_nodes(name: str, nodes: tuple[int, ...], needed: int, cluster: ClusterSpec) -> None:
    last = cluster.num_nodes - 1
    for n in nodes:
        if not 0 <= n <= last:
            raise ScenarioError(
                f"job {name!r}: node {n} is not a node of the cluster (0 to {last})",
                key="job.nodes",
                value=n,
            )
    if len(set(nodes)) != len(nodes):
        raise ScenarioError(f"job {name!r}: nodes names a node twice", key="job.nodes")
    if len(nodes) != needed:
        raise ScenarioError(
            f"job {name!r}: {len(nodes)} nodes given but its {needed * cluster.gpus_per_node} "
            f"GPUs need {needed} ({cluster.gpus_per_node} a node)",
            key="job.nodes",
        )


def parse_nodes(name: str, text: str) -> tuple[int, ...]:
    """``"0-3,8,10-11"`` -> (0, 1, 2, 3, 8, 10, 11), in the order written."""
    out: list[int] = []
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            lo = int(first)
            hi = int(last) if dash else lo
        except ValueError:
            lo = hi = -1
        if lo < 0 or hi < lo or not first.strip().isdigit():
            raise ScenarioError(
                f'job {name!r}: nodes={text!r} must be ranges such as "0-15" or "0-3,8-11" '
                f"(not {part.strip()!r})",
                key="job.nodes",
                value=text,
            )
        if hi - lo > 1_000_000:
            raise ScenarioError(
                f"job {name!r}: nodes={text!r} is too long a range", key="job.nodes"
            )
        out.extend(range(lo, hi + 1))
    return tuple(out)


def leaf_groups(cluster: ClusterSpec) -> tuple[int, int]:
    """(nodes under one leaf, leaves in one pod) as `spread` sees the fabric: (all, 1) on
    one switch and on rail-only fabrics; a 2-level tree's pod is one leaf."""
    fabric = cluster.fabric
    if fabric in ("switch", "rail-only"):
        return cluster.num_nodes, 1
    per_pod = cluster.leaves_per_pod if fabric == "fat-tree" and cluster.fabric_levels == 3 else 1
    return cluster.nodes_per_leaf, per_pod


def place(
    policy: str, count: int, free: list[int], cluster: ClusterSpec, seed: int | None = None
) -> tuple[int, ...]:
    """The ``count`` nodes a policy takes from ``free`` (in index order); fewer if there
    are fewer (the caller says so)."""
    if policy == PACKED:
        return tuple(free[:count])
    if policy == RANDOM:
        import numpy as np  # numpy: only for a random placement

        order = np.random.default_rng(seed).permutation(len(free))
        return tuple(free[int(i)] for i in order[:count])
    per_leaf, per_pod = leaf_groups(cluster)
    rank_in_leaf: dict[int, int] = {}
    keys = []
    for n in free:
        leaf = n // per_leaf
        rank = rank_in_leaf.get(leaf, 0)
        rank_in_leaf[leaf] = rank + 1
        keys.append(((rank, leaf % per_pod, leaf // per_pod), n))
    return tuple(n for _, n in sorted(keys)[:count])


def _shown(value: object) -> object:
    return getattr(value, "name", value)  # a GpuSpec by its preset name


def check_node_kind(name: str, own: ClusterSpec, shared: ClusterSpec) -> None:
    for k in NODE_KEYS:
        mine, theirs = getattr(own, k), getattr(shared, k)
        if mine != theirs:
            raise ScenarioError(
                f"job {name!r}: its scenario's cluster.{k}={_shown(mine)!r} differs from the "
                f"jobs file's cluster.{k}={_shown(theirs)!r} (a job runs on the shared nodes)",
                key=f"cluster.{k}",
                value=_shown(mine),
            )


TOP_KEYS = ("name", "cluster", SECTION)


def jobs_path(text: str | Path) -> Path:
    """A jobs file: a path, or the name of a shipped one (scenarios/jobs/NAME.toml)."""
    path = Path(text)
    if path.exists() or path.suffix or len(path.parts) > 1:
        return path
    shipped = shipped_dir() / "jobs" / f"{text}.toml"
    if shipped.is_file():
        return shipped
    names = ", ".join(sorted(p.stem for p in (shipped_dir() / "jobs").glob("*.toml")))
    raise ScenarioError(
        f"no jobs file {str(text)!r} and no shipped jobs file of that name ({names})"
    )


def load_jobs(text: str | Path) -> JobsSpec:
    path = jobs_path(text)
    raw = read_toml(path, "jobs file")
    try:
        return jobs_from_dict(raw, path.parent, default_name=path.stem)
    except ScenarioError as exc:  # the one line names the file it is about
        if str(path) in str(exc):
            raise
        raise ScenarioError(
            f"jobs file {str(path)!r}: {exc}", key=exc.key, value=exc.value, rule=exc.rule
        ) from None


def jobs_from_dict(raw: Mapping[str, Any], base_dir: Path, default_name: str = "jobs") -> JobsSpec:
    for k in raw:
        if k not in TOP_KEYS:
            raise ScenarioError(
                f"unknown key {k!r} at the top of a jobs file; known: {', '.join(TOP_KEYS)}"
            )
    name = raw.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise ScenarioError(key="name", value=name, rule="must be a non-empty string")
    table = raw.get("cluster")
    if not isinstance(table, Mapping):
        raise ScenarioError(
            "a jobs file needs a [cluster] table (the shared machine)", key="cluster"
        )
    cluster = cluster_of_table(table)
    tables = raw.get(SECTION, [])
    if not isinstance(tables, list) or not all(isinstance(t, Mapping) for t in tables):
        raise ScenarioError(f"jobs are written as [[{SECTION}]] tables, one per job", key=SECTION)
    known = keys_of(JobTable, SECTION)
    written = []
    for i, t in enumerate(tables):
        for k in t:
            if k not in known:
                raise ScenarioError(
                    f"job {i + 1}: unknown key 'job.{k}'; known: {', '.join(known)}",
                    key=f"job.{k}",
                )
        for k in ("name", "scenario"):
            if k not in t:
                raise ScenarioError(f"job {i + 1}: missing key job.{k}", key=f"job.{k}")
        written.append(JobTable(**t))
    scenarios = [_job_scenario(job, base_dir, cluster) for job in written]
    # jobs with nodes first, then the placed ones in file order, over what is left
    nodes: dict[str, tuple[int, ...]] = {}
    for job in written:
        if job.nodes is not None:
            nodes[job.name] = parse_nodes(job.name, job.nodes)
    taken = {n for ns in nodes.values() for n in ns}
    for job, scenario in zip(written, scenarios, strict=True):
        if job.placement is None:
            continue
        free = [n for n in range(cluster.num_nodes) if n not in taken]
        count = needed_nodes(scenario, cluster)
        if count > len(free):
            raise ScenarioError(
                f"job {job.name!r}: placement {job.placement!r} needs {count} nodes but "
                f"{len(free)} of the cluster's {cluster.num_nodes} are free",
                key="job.placement",
            )
        nodes[job.name] = place(job.placement, count, free, cluster, job.seed)
        taken.update(nodes[job.name])
    return JobsSpec(
        name,
        cluster,
        tuple(
            JobSpec(job.name, scenario, nodes[job.name], job.iterations)
            for job, scenario in zip(written, scenarios, strict=True)
        ),
    )


def _job_scenario(job: JobTable, base_dir: Path, cluster) -> Any:
    """The job's scenario on the shared cluster, every GPU simulated (exact mode)."""
    path = base_dir / job.scenario  # relative to the jobs file, else a shipped name
    shipped = shipped_scenarios()
    try:
        scenario = load_scenario(
            path if path.exists() or job.scenario not in shipped else shipped[job.scenario]
        )
    except ScenarioError as exc:
        raise ScenarioError(
            f"job {job.name!r}: {exc}", key=exc.key, value=exc.value, rule=exc.rule
        ) from None
    check_node_kind(job.name, scenario.cluster, cluster)
    if scenario.perturbations:
        raise ScenarioError(
            f"job {job.name!r}: its scenario has [[perturbation]] tables, which a jobs file "
            f"does not run",
            key="perturbation",
        )
    if scenario.network.model != FAIR_SHARE:
        raise ScenarioError(
            f"job {job.name!r}: network.model={scenario.network.model!r}; jobs share links "
            f"through the {FAIR_SHARE!r} network",
            key="network.model",
            value=scenario.network.model,
        )
    try:
        return replace(scenario, cluster=cluster, network=replace(scenario.network, symmetry=False))
    except ScenarioError as exc:
        raise ScenarioError(
            f"job {job.name!r} on the jobs file's cluster: {exc}",
            key=exc.key,
            value=exc.value,
            rule=exc.rule,
        ) from None
