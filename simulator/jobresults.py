"""What simulating several jobs on one fabric gives (simulator/jobs.py): per job its
iteration alone and together, slowdown, breakdowns and the links it shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from .results import SCHEMA_VERSION, Metrics, Trace

ITERATION_STREAM = "iteration"  # the lane of a job's barriers between iterations (jobs.py)


class SharedLink(NamedTuple):
    """A link a job's traffic shared with another job's, over the together run."""

    link: str
    kind: str  # topologies.describe.LINK_ROLES
    index: int
    utilization: float  # all jobs' bytes over what it could carry in the together run
    gbytes_own: float  # this job's bytes on it
    gbytes_others: float  # the other jobs'


@dataclass(frozen=True, slots=True)
class JobResult:
    name: str
    nodes: tuple[int, ...]
    num_gpus: int
    iterations: int  # run together, back to back
    alone: Metrics  # one iteration alone on the same nodes
    together_iterations_s: tuple[float, ...]  # each iteration's time, together
    together_breakdown_s: dict[str, float]  # mean per GPU and iteration, together

    @property
    def alone_s(self) -> float:
        return self.alone.iteration_time_s

    @property
    def together_s(self) -> float:
        """The mean iteration together."""
        return sum(self.together_iterations_s) / len(self.together_iterations_s)

    @property
    def slowdown(self) -> float:
        return self.together_s / self.alone_s if self.alone_s > 0 else 1.0


@dataclass(frozen=True, slots=True)
class JobsResult:
    name: str
    jobs: tuple[JobResult, ...]
    shared_links: dict[str, tuple[SharedLink, ...]]  # by job name, busiest first
    window_s: float  # the together run's end
    trace: Trace | None = None  # the together run (every job's lanes, the cluster's GPUs)
    workload: Any = None
    cluster: Any = None  # with the trace: the cluster it ran on

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "name": self.name,
            "together_s": self.window_s,
            "jobs": [
                {
                    "name": job.name,
                    "nodes": list(job.nodes),
                    "num_gpus": job.num_gpus,
                    "iterations": job.iterations,
                    "alone_s": job.alone_s,
                    "together_s": job.together_s,
                    "together_iterations_s": list(job.together_iterations_s),
                    "slowdown": job.slowdown,
                    "breakdown_alone_s": dict(job.alone.breakdown_s),
                    "breakdown_together_s": dict(job.together_breakdown_s),
                    "shared_links": [s._asdict() for s in self.shared_links[job.name]],
                    "alone": job.alone.to_json(),
                }
                for job in self.jobs
            ],
        }
