"""What `stepsim jobs` shows: per job its iteration alone and together, slowdown, where
its time went both ways and the links it shared (ir/results.py's JobsResult), and the
together run as one Perfetto trace (trace.py's, every job's GPUs a process named by its
job, the busiest shared links as counter tracks)."""

from __future__ import annotations

from ..ir.results import JobsResult
from ..ir.vocabulary import ITERATION_STREAM, categories_of
from .summary import decimal_places
from .trace import TraceView, view_trace


def _nodes_text(nodes: tuple[int, ...], most: int = 24) -> str:
    """Node numbers as ranges in their order: 0-7, or 0,4,8,12,1,5,9,13."""
    parts: list[str] = []
    i = 0
    while i < len(nodes):
        j = i
        while j + 1 < len(nodes) and nodes[j + 1] == nodes[j] + 1:
            j += 1
        parts.append(str(nodes[i]) if i == j else f"{nodes[i]}-{nodes[j]}")
        i = j + 1
    text = ",".join(parts)
    return text if len(text) <= most else text[: most - 3] + "..."


def jobs_text(result: JobsResult, cluster, header: str) -> str:
    """The summary: ``header`` names the cluster (the CLI's, from the spec)."""
    longest = max(job.alone_s for job in result.jobs)
    places = decimal_places(longest)
    width = max(4, *(len(job.name) for job in result.jobs))
    lines = [
        f"stepsim jobs · {result.name}",
        f"  {header}",
        "  every job's GPUs simulated (exact mode); together: each job runs its iterations "
        "back to back from time 0",
        "",
        f"  {'job':<{width}}  GPUs  {'nodes':<24}  iterations    alone s  together s  slowdown",
    ]
    for job in result.jobs:
        lines.append(
            f"  {job.name:<{width}}  {job.num_gpus:>4}  {_nodes_text(job.nodes):<24}  "
            f"{job.iterations:>10}  {job.alone_s:>9.{places}f}  {job.together_s:>10.{places}f}"
            f"  {job.slowdown:>7.3f}x"
        )
    for job in result.jobs:
        if job.alone.out_of_memory:
            lines.append(f"  WARNING: job {job.name}: {job.alone.out_of_memory}")
    for job in result.jobs:
        lines += [
            "",
            f"  job {job.name}: where the time goes, mean per GPU and iteration (seconds)",
            f"    {'':<34}{'alone':>10}{'together':>10}",
        ]
        for category in categories_of(job.alone.breakdown_s):
            alone = job.alone.breakdown_s[category.key]
            together = job.together_breakdown_s.get(category.key, 0.0)
            lines.append(f"    {category.label:<34}{alone:>10.{places}f}{together:>10.{places}f}")
        shared = result.shared_links[job.name]
        if not shared:
            lines.append("    shares no link with another job")
            continue
        lines.append(
            "    busiest shared links      utilization    GB own  GB others  (all jobs' bytes "
            "over the together run)"
        )
        for link in shared:
            lines.append(
                f"      {link.kind:<8}{100 * link.utilization:>16.1f} %{link.gbytes_own:>10.3g}"
                f"{link.gbytes_others:>11.3g}  {link.link}"
            )
    return "\n".join(lines)


def jobs_trace(result, spec) -> dict:
    trace = result.trace
    spans = [sp for sp in trace.spans if sp.stream != ITERATION_STREAM]
    shared = {link.index: link for links in result.shared_links.values() for link in links}
    view = TraceView(
        spec.jobs[0].scenario.name,
        result.workload,
        trace._replace(spans=spans),
        result.cluster.capacities,
        [shared[i] for i in sorted(shared)],
        None,  # jobs run in exact mode: never fast-forwarded
    )
    document = view_trace(view)
    gpn = spec.cluster.gpus_per_node
    job_of = {
        n * gpn + g: (i, job.name)
        for i, job in enumerate(spec.jobs)
        for n in job.nodes
        for g in range(gpn)
    }
    for event in document["traceEvents"]:
        if event.get("ph") != "M" or event["pid"] not in job_of:
            continue
        number, name = job_of[event["pid"]]
        if event["name"] == "process_name":
            event["args"]["name"] = f"job {name} · {event['args']['name']}"
        elif event["name"] == "process_sort_index":  # by job, then by stage
            event["args"]["sort_index"] += number * 1_000_000
    document["otherData"] = {"jobs": result.name}
    return document
