"""Reading a jobs file (scenario/jobs.py has the schema): its ``[cluster]`` as a
scenario's, each ``[[job]]``'s scenario loaded, put on the shared cluster in exact
mode, and placed. Every error is one line naming the job."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..ir.vocabulary import FAIR_SHARE
from . import schema
from .errors import ScenarioError
from .files import read_toml, shipped_dir, shipped_scenarios
from .jobs import (
    SECTION,
    JobSpec,
    JobsSpec,
    JobTable,
    check_node_kind,
    needed_nodes,
    parse_nodes,
    place,
)
from .loader import cluster_of_table, load_scenario

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
    return jobs_from_dict(raw, path.parent, default_name=path.stem)


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
    known = schema.keys_of(JobTable, SECTION)
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
