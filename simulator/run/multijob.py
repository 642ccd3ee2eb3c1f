"""Several jobs on one fabric: every job's workload on one cluster
graph, sharing its links through the fair-share network.

Each job runs in exact mode: its GPU g is lowered as usual against a view of the
shared cluster (`JobCluster`) that maps g onto the cluster GPU its nodes give, so its
collectives and sends are flows on the real links of those GPUs. Symmetric mode
cannot be used: a representative's coupled flow stands for copies whose links carry
the representative's load, and another job's traffic on a copy's links breaks that.

"Together": every job starts at 0 and runs ``iterations`` iterations back to back,
each starting on all its GPUs once the previous one has ended on all of them (a
barrier; within an iteration nothing changes). By default a job runs as many as
cover the longest job's iteration alone, ceil(longest alone / its own alone), so
every job is under the others' load for the whole of the longest one's iteration;
its together time is the mean of its iterations. Alone: one iteration of the job
on the same nodes with no other traffic. Slowdown = together / alone.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Sequence

from stepsim.topologies.describe import link_name

from ..comm.collectives import LayoutError
from ..cost.memory import out_of_memory
from ..emit.lowering import lower
from ..engine.core import simulate
from ..engine.network import FairShareNetwork
from ..ir.flows import Transfer
from ..ir.ops import Lane, Op, Workload
from ..ir.results import JobResult, JobsResult, SharedLink, Trace
from ..ir.vocabulary import BARRIER, ITERATION_STREAM
from ..report.metrics import summarize
from ..scenario import ScenarioError, limits
from ..scenario.jobfile import JobSpec, JobsSpec
from .iteration import build_cluster, busiest_links, gc_paused, memory_per_stage

SHARED_LINKS_SHOWN = 3


class JobCluster:
    """A job's view of the shared cluster: its GPU g is cluster GPU ``gpus[g]`` (GPU
    g mod G of its (g // G)-th node); routes, nodes and rings are the cluster's."""

    def __init__(self, cluster, nodes: Sequence[int]) -> None:
        gpn = cluster.gpus_per_node
        self.cluster, self.gpus_per_node = cluster, gpn
        self.gpus = [nodes[g // gpn] * gpn + g % gpn for g in range(len(nodes) * gpn)]
        self._local = {c: g for g, c in enumerate(self.gpus)}
        self.links, self.capacities = cluster.links, cluster.capacities
        self.route_latency_s = cluster.route_latency_s

    def route(self, src: int, dst: int) -> tuple[int, ...]:
        return self.cluster.route(self.gpus[src], self.gpus[dst])

    def node_of(self, gpu: int) -> int:
        return self.cluster.node_of(self.gpus[gpu])

    def pcie_links(self, gpu: int) -> tuple[int, int]:
        return self.cluster.pcie_links(self.gpus[gpu])

    def intra_node_rings(self, members: Sequence[int]) -> list[list[int]]:
        rings = self.cluster.intra_node_rings([self.gpus[g] for g in members])
        return [[self._local[c] for c in ring] for ring in rings]


def lower_job(job: JobSpec, cluster) -> Workload:
    """The job's one iteration, its lanes on the cluster's GPUs."""
    view = JobCluster(cluster, job.nodes)
    try:
        workload = lower(job.scenario, view, collapse=False)  # lanes on the job's GPUs
    except LayoutError as exc:
        raise ScenarioError(f"job {job.name!r}: {exc}") from None
    lanes = tuple(lane._replace(gpu=view.gpus[lane.gpu]) for lane in workload.lanes)
    return Workload(workload.ops, lanes)


def repeat(workload: Workload, n: int) -> tuple[Workload, list[range]]:
    """``n`` iterations back to back: iteration k + 1's ops on each lane after a barrier
    on one extra lane (stream ``iteration``) that waits for every op of iteration k.
    Returns the workload and each iteration's op indices."""
    size = len(workload.ops)
    if n == 1:
        return workload, [range(size)]
    ops: list[Op] = list(workload.ops)
    lane_ops = [list(lane.ops) for lane in workload.lanes]
    sync_lane, sync_ops = len(workload.lanes), []
    ranges = [range(size)]
    for k in range(1, n):
        done = len(ops)
        ops.append(Op(done, sync_lane, BARRIER, f"iteration {k} done", -1, 0.0, None, True,
                      tuple(ranges[-1]), 0.0, -1))  # fmt: skip
        sync_ops.append(done)
        for lane in workload.lanes:
            i = len(ops)
            ops.append(Op(i, lane.index, BARRIER, f"iteration {k + 1}", -1, 0.0, None, True,
                          (done,), 0.0, -1))  # fmt: skip
            lane_ops[lane.index].append(i)
        off = len(ops)
        for op in workload.ops:
            ops.append(
                op._replace(
                    index=op.index + off,
                    deps=tuple(d + off for d in op.deps),
                    rendezvous=op.rendezvous + off if op.rendezvous >= 0 else -1,
                )
            )
        for lane in workload.lanes:
            lane_ops[lane.index].extend(i + off for i in lane.ops)
        ranges.append(range(off, off + size))
    first = workload.lanes[0]
    lanes = [lane._replace(ops=tuple(lane_ops[lane.index])) for lane in workload.lanes]
    lanes.append(Lane(sync_lane, first.gpu, ITERATION_STREAM, first.stage, 1, tuple(sync_ops)))
    return Workload(tuple(ops), tuple(lanes)), ranges


def merge(workloads: Sequence[Workload]) -> tuple[Workload, list[int]]:
    """One workload of several (their lanes on distinct GPUs); each one's first op index."""
    ops: list[Op] = []
    lanes: list[Lane] = []
    offsets = []
    for w in workloads:
        off, lane_off = len(ops), len(lanes)
        offsets.append(off)
        for op in w.ops:
            ops.append(
                op._replace(
                    index=op.index + off,
                    lane=op.lane + lane_off,
                    deps=tuple(d + off for d in op.deps),
                    rendezvous=op.rendezvous + off if op.rendezvous >= 0 else -1,
                )
            )
        for lane in w.lanes:
            lanes.append(
                lane._replace(index=lane.index + lane_off, ops=tuple(i + off for i in lane.ops))
            )
    return Workload(tuple(ops), tuple(lanes)), offsets


def link_bytes(workload: Workload) -> dict[int, float]:
    """Bytes each link carries for the workload's transfers (each collective once)."""
    out: dict[int, float] = {}
    for op in workload.ops:
        if op.transfer is None or op.rendezvous not in (-1, op.index):
            continue
        phases = (op.transfer,) if type(op.transfer) is Transfer else op.transfer
        for phase in phases:
            for link, mult in zip(phase.links, phase.mults, strict=True):
                out[link] = out.get(link, 0.0) + mult * phase.bytes_per_flow
    return out


def default_iterations(alone_s: Sequence[float]) -> list[int]:
    """ceil(longest / own): each job covers the longest job's iteration alone."""
    longest = max(alone_s)
    return [max(1, math.ceil(longest / t - 1e-9)) if t > 0 else 1 for t in alone_s]


def run_jobs(
    spec: JobsSpec, progress: Callable[[float], None] | None = None, keep_trace: bool = False
) -> JobsResult:
    cluster = build_cluster(spec.cluster)  # the whole graph: every job is exact
    capacities = cluster.capacities
    with gc_paused():
        workloads = [lower_job(job, cluster) for job in spec.jobs]
        alone = []
        for job, workload in zip(spec.jobs, workloads, strict=True):
            trace = simulate(workload, network=FairShareNetwork.factory(capacities))
            memory = memory_per_stage(job.scenario)
            problem = out_of_memory(job.scenario, memory)
            alone.append(
                summarize(
                    job.scenario,
                    workload,
                    trace,
                    memory,
                    out_of_memory=str(problem) if problem is not None else None,
                    busiest_links=busiest_links(cluster, trace),
                )
            )
        counts = default_iterations([m.iteration_time_s for m in alone])
        counts = [job.iterations or n for job, n in zip(spec.jobs, counts, strict=True)]
        total = sum(len(w.ops) * n for w, n in zip(workloads, counts, strict=True))
        together = "the jobs' iterations run together (job.iterations) mean"
        limits.check("simulated_ops", total, together)
        repeated = [repeat(w, n) for w, n in zip(workloads, counts, strict=True)]
        merged, offsets = merge([w for w, _ in repeated])
        trace = simulate(merged, network=FairShareNetwork.factory(capacities), progress=progress)
        results = _split(spec, trace, repeated, offsets, counts, alone)
        shared = _shared_links(spec, cluster, [w for w, _ in repeated], trace.end_s)
    return JobsResult(
        spec.name,
        tuple(results),
        shared,
        trace.end_s,
        trace if keep_trace else None,
        merged if keep_trace else None,
        cluster if keep_trace else None,
    )


def _split(spec, trace: Trace, repeated, offsets, counts, alone) -> list[JobResult]:
    """Each job's iterations and breakdown from the together trace."""
    spans_of: list[list] = [[] for _ in spec.jobs]
    for span in trace.spans:
        if span.stream == ITERATION_STREAM:
            continue
        j = bisect_right(offsets, span.op) - 1
        spans_of[j].append(span._replace(op=span.op - offsets[j]))
    out = []
    for j, job in enumerate(spec.jobs):
        workload, ranges = repeated[j]
        ends = [0.0] * len(ranges)
        iteration_of: dict[int, int] = {}
        for k, r in enumerate(ranges):
            iteration_of.update(dict.fromkeys(r, k))
        for span in spans_of[j]:
            at = iteration_of.get(span.op)
            if at is not None and span.end_s > ends[at]:
                ends[at] = span.end_s
        times = tuple(ends[k] - (ends[k - 1] if k else 0.0) for k in range(len(ends)))
        own = Trace(spans_of[j], workload.lanes, ends[-1], 0, [])
        memory = memory_per_stage(job.scenario)
        metrics = summarize(job.scenario, workload, own, memory)
        n = counts[j]
        out.append(
            JobResult(
                job.name,
                job.nodes,
                job.scenario.parallel.num_gpus,
                n,
                alone[j],
                times,
                {key: value / n for key, value in metrics.breakdown_s.items()},
            )
        )
    return out


def _shared_links(spec, cluster, workloads, window_s) -> dict[str, tuple[SharedLink, ...]]:
    """Per job, the links another job's traffic crossed too, busiest first (all
    jobs' bytes over what the link could carry in the together run)."""
    per_job = [link_bytes(w) for w in workloads]
    out = {}
    for j, (job, carried) in enumerate(zip(spec.jobs, per_job, strict=True)):
        others = {
            i: sum(o.get(i, 0.0) for k, o in enumerate(per_job) if k != j)
            for i in carried
            if carried[i] > 0
        }
        shared = [i for i, b in others.items() if b > 0]
        load = {i: (carried[i] + others[i]) / cluster.capacities[i] for i in shared}
        shared.sort(key=lambda i: (-load[i], i))
        out[job.name] = tuple(
            SharedLink(
                link_name(cluster.links[i].src, cluster.links[i].dst),
                cluster.link_role(i),
                i,
                load[i] / window_s if window_s > 0 else 0.0,
                carried[i] / 1e9,
                others[i] / 1e9,
            )
            for i in shared[:SHARED_LINKS_SHOWN]
        )
    return out
