"""Chrome/Perfetto traces: a simulated iteration (a process per simulated GPU, a
thread per stream, counters for the busiest links) and the bubble study's schedules.
Dicts only; the CLI writes them as JSON."""

from __future__ import annotations

from ..results import Result
from ..vocabulary import PASS_KINDS, STREAM_ORDER
from .metrics import compute_lanes


def chrome_trace(result: Result) -> dict:
    """Chrome trace event format: a process per simulated GPU, a thread per stream.
    Opens in Perfetto (ui.perfetto.dev) and chrome://tracing."""
    events: list[dict] = []
    streams = sorted({sp.stream for sp in result.trace.spans}, key=lambda s: STREAM_ORDER.get(s, 9))
    tids = {stream: i for i, stream in enumerate(streams)}
    for lane in compute_lanes(result.trace.lanes):
        name = f"GPU {lane.gpu} (stage {lane.stage}"
        name += f", stands for {lane.stands_for} GPUs)" if lane.stands_for > 1 else ")"
        events.append(
            {"ph": "M", "name": "process_name", "pid": lane.gpu, "tid": 0, "args": {"name": name}}
        )
        events.append(
            {
                "ph": "M",
                "name": "process_sort_index",
                "pid": lane.gpu,
                "tid": 0,
                "args": {"sort_index": lane.stage},
            }
        )
        for stream, tid in tids.items():
            events.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": lane.gpu,
                    "tid": tid,
                    "args": {"name": stream},
                }
            )
    for sp in result.trace.spans:
        events.append(
            {
                "ph": "X",
                "name": f"{sp.label} {sp.kind}",
                "cat": sp.kind,
                "pid": sp.gpu,
                "tid": tids[sp.stream],
                "ts": sp.start_s * 1e6,
                "dur": (sp.end_s - sp.start_s) * 1e6,
                "args": {"microbatch": sp.microbatch},
            }
        )
    events += _link_counters(result)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"scenario": result.scenario.name},
    }


NETWORK_PID = 1_000_000_000  # a process of its own for the link counters


def _link_counters(result: Result, top: int = 8, bins: int = 400) -> list[dict]:
    """Utilization of the busiest links over time, as Chrome trace counter tracks."""
    from .linkstats import utilization_over_time

    busiest = result.metrics.busiest_links[:top]
    if not busiest:
        return []
    chosen = [link.index for link in busiest]
    capacities = [link.bandwidth_bytes_per_s for link in result.cluster.links]
    edges, series = utilization_over_time(
        result.trace.link_intervals, capacities, chosen, result.trace.end_s, bins
    )
    events: list[dict] = [
        {
            "ph": "M",
            "name": "process_name",
            "pid": NETWORK_PID,
            "tid": 0,
            "args": {"name": "network: busiest links (utilization %)"},
        }
    ]
    for link in busiest:
        for start, value in zip(edges[:-1], series[link.index], strict=True):
            events.append(
                {
                    "ph": "C",
                    "name": link.link,
                    "pid": NETWORK_PID,
                    "ts": start * 1e6,
                    "args": {"utilization %": round(100 * float(value), 3)},
                }
            )
    return events


def study_trace(studies: list, time_unit_us: float = 1000.0) -> dict:
    """A Chrome/Perfetto trace: a process per schedule, a thread per rank; abstract time
    units are written as milliseconds."""
    events: list[dict] = []
    for pid, study in enumerate(studies):
        events.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": study.name}})
        for rank in range(study.num_ranks):
            events.append(
                {
                    "ph": "M",
                    "pid": pid,
                    "tid": rank,
                    "name": "thread_name",
                    "args": {"name": f"rank {rank}"},
                }
            )
        for span in study.trace.spans:
            if span.kind not in PASS_KINDS:
                continue  # the gaps are the bubble
            events.append(
                {
                    "ph": "X",
                    "pid": pid,
                    "tid": span.gpu,
                    "name": span.label,
                    "cat": span.kind,
                    "ts": span.start_s * time_unit_us,
                    "dur": (span.end_s - span.start_s) * time_unit_us,
                    "args": {"microbatch": span.microbatch},
                }
            )
    return {"traceEvents": events, "displayTimeUnit": "ms"}
