"""The together run of `stepsim jobs` as one Perfetto trace: report/trace.py's, every
job's GPUs a process named by its job, the busiest shared links as counter tracks."""

from __future__ import annotations

from types import SimpleNamespace

from ..ir.vocabulary import ITERATION_STREAM
from .trace import chrome_trace


def jobs_trace(result, spec) -> dict:
    trace = result.trace
    spans = [sp for sp in trace.spans if sp.stream != ITERATION_STREAM]
    shared = {link.index: link for links in result.shared_links.values() for link in links}
    view = SimpleNamespace(
        scenario=spec.jobs[0].scenario,
        cluster=result.cluster,
        workload=result.workload,
        trace=trace._replace(spans=spans),
        metrics=SimpleNamespace(
            busiest_links=[shared[i] for i in sorted(shared)], fast_forward=None
        ),  # jobs run in exact mode: never fast-forwarded
    )
    document = chrome_trace(view)
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
