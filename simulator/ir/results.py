"""What a simulation produces: spans on a trace, the metrics, and a run's whole result.

Kept apart from the engine and from the run orchestration so that presentation
(report/, plan/answers.py) reads results without importing either. The metrics are
typed: ``Metrics.to_json()`` is metrics.json (and ``stepsim run --json``), and
``MetricsRow`` is the flat row of one simulated point that sweep.csv, search.csv and
the search journal hold and the executors send back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, NamedTuple

from .units import bytes_to_gib
from .vocabulary import (
    ALL_BREAKDOWN_KEYS,
    BREAKDOWN_COLUMN,
    BREAKDOWN_KEYS,
    CP_COMM,
    EP_COMM,
    EXPOSED_COMM_KEYS,
    OFFLOAD,
)

# The version of every JSON document stepsim writes (metrics.json and each command's
# --json). Raised when a key is renamed or removed or its meaning changes; keys may be
# added without raising it. 1: until 2026-11; 2: the field itself, and `stepsim schedule`'s
# bubble_ratio/bubble_rate renamed bubble_over_ideal/bubble_fraction.
SCHEMA_VERSION = 2

if TYPE_CHECKING:
    from stepsim.topologies import AnyCluster

    from ..scenario import Scenario
    from .ops import Lane, Workload


class Span(NamedTuple):
    """Something a lane did or waited for, from start to end (vocabulary names kinds)."""

    gpu: int
    stream: str
    kind: str
    label: str
    microbatch: int
    start_s: float
    end_s: float
    op: int  # the op it belongs to (a wait: the op that waited); workload.ops index


class Trace(NamedTuple):
    spans: list[Span]
    lanes: tuple[Lane, ...]
    end_s: float  # when the last op finished
    num_transfers: int
    link_intervals: list  # ir.flows.Interval: which links carried what, when
    # with blame tracking (perturbed runs): Wait records, who waited for whom
    waits: tuple = ()


class Wait(NamedTuple):
    """A lane's wait at a collective for its last member: ``seconds`` on lane ``lane``
    (each of the GPUs it stands for), charged to lane ``cause``, the last to arrive."""

    lane: int
    cause: int
    seconds: float
    kind: str  # the collective's op kind


class WaitCause(NamedTuple):
    """GPU time lost waiting, summed by what caused it (simulator/run/perturb.py)."""

    cause: str  # "replica 2 (slow_gpu gpu=17 factor=1.05)", ...
    replica: int  # the data-parallel replica of the last arrivers (-1: the representatives)
    gpu: int  # the last arriver charged the most of it (-1: the representative lanes)
    gpu_seconds: float


class FastForward(NamedTuple):
    """How a run was fast-forwarded (simulator/run/fastforward.py): it simulated
    ``simulated_microbatches`` micro-batches, proved that the state after one period of
    ``period_microbatches`` micro-batches equals the state before it shifted by
    ``period_s`` (the instant ``proved_at_s`` against one period later), and added
    ``periods_skipped`` such periods."""

    simulated_microbatches: int
    period_microbatches: int
    periods_skipped: int
    period_s: float
    proved_at_s: float


class LinkLoad(NamedTuple):
    """One of the busiest links of its role: its name, role (topologies.describe.LINK_ROLES:
    nvlink, pcie, nic, uplink), index in the cluster's links, mean utilization over the
    iteration, the gigabytes it carried, and its peak: the mean utilization of its
    busiest hundredth of the iteration."""

    link: str
    kind: str
    index: int  # type: ignore[assignment]  # shadows tuple.index; renaming changes the API
    utilization: float
    gbytes: float
    peak_utilization: float


@dataclass(frozen=True, slots=True, kw_only=True)
class StageMetrics:
    """One pipeline stage: the mean breakdown over its GPUs (seconds per category, in
    vocabulary.BREAKDOWN_KEYS order) and one of its GPUs' memory."""

    stage: int
    gpu: int  # the simulated GPU that stands for the stage
    stands_for_gpus: int
    breakdown_s: dict[str, float]
    memory: StageMemory

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "gpu": self.gpu,
            "stands_for_gpus": self.stands_for_gpus,
            "breakdown_s": dict(self.breakdown_s),
            "memory_gib": self.memory.as_gib(),
            "inflight_activations": self.memory.inflight_activations,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Metrics:
    """The numbers of one simulated iteration (report.metrics.summarize explains them).
    Fields are in metrics.json's key order."""

    name: str
    iteration_time_s: float
    hardware_tflops_per_gpu: float  # recomputation included
    model_tflops_per_gpu: float
    mfu: float
    bubble_fraction: float
    num_gpus: int
    num_microbatches: int
    tokens_per_s: float
    memory_per_gpu_gib: float  # the fullest GPU's
    memory_peak_stage: int
    gpu_memory_gib: float
    calibration: str  # how the GPU's kernel constants were obtained (fitted, file, or scaled)
    framework: str  # the engine simulated, e.g. "megatron 2021"
    framework_mechanisms: dict[str, Any]  # its mechanism keys as resolved (frameworks.py)
    breakdown_s: dict[str, float]  # mean per GPU, in vocabulary.BREAKDOWN_KEYS order
    stages: tuple[StageMetrics, ...]
    simulated_transfers: int
    simulated_spans: int
    out_of_memory: str | None = None  # why the layout does not fit, None when it does
    busiest_links: tuple[LinkLoad, ...] = ()
    # perturbed runs: GPU time lost waiting at collectives, by cause, most first
    waits: tuple[WaitCause, ...] = ()
    perturbations: tuple[str, ...] = ()  # each perturbation's one-line description
    # the steady-state fast-forward, when it was used (simulator/run/fastforward.py)
    fast_forward: FastForward | None = None
    # a calibration file's fit on measured iterations (scenario/fitted.py MeasuredFit.record:
    # the file, its measurements, leave-one-out error, parameters), when the run used one
    calibration_fit: dict[str, Any] | None = None
    # the idle above split by cause (run/bubble.py idle_causes): "schedule" (the
    # schedule's own bubble), "imbalance" (unequal stages), "communication" (waits on
    # transfers); seconds per GPU adding up to breakdown_s["idle"]; None without a pipeline
    idle_by_cause_s: dict[str, float] | None = None
    # what the result assumes that may flatter it (report/labels.py: one non-blocking
    # switch for a whole cluster, links at line rate, borrowed network constants)
    assumptions: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """metrics.json as a dict (json.dumps writes the file)."""
        out: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
        out.update({f.name: getattr(self, f.name) for f in fields(self)})
        if not self.perturbations:  # a clean run's file keeps its keys
            del out["waits"], out["perturbations"]
        else:
            out["waits"] = [w._asdict() for w in self.waits]
            out["perturbations"] = list(self.perturbations)
        if self.fast_forward is None:  # a run simulated in full keeps its keys
            del out["fast_forward"]
        else:
            out["fast_forward"] = self.fast_forward._asdict()
        if self.calibration_fit is None:  # a run without a fitted calibration keeps its keys
            del out["calibration_fit"]
        else:
            out["calibration_fit"] = dict(self.calibration_fit)
        if self.idle_by_cause_s is None:  # no pipeline: idle is not split
            del out["idle_by_cause_s"]
        else:
            out["idle_by_cause_s"] = dict(self.idle_by_cause_s)
        out["assumptions"] = list(self.assumptions)
        out["breakdown_s"] = dict(self.breakdown_s)
        out["framework_mechanisms"] = dict(self.framework_mechanisms)
        out["stages"] = [stage.to_json() for stage in self.stages]
        out["busiest_links"] = [link._asdict() for link in self.busiest_links]
        return out

    def exposed_comm_s(self) -> float:
        """Exposed tensor-parallel, pipeline and data-parallel communication (and
        context-parallel, with CP; expert-parallel; activation offloading's host copies),
        mean per GPU."""
        exposed = sum(self.breakdown_s[key] for key in EXPOSED_COMM_KEYS)
        exposed += self.breakdown_s.get(CP_COMM, 0.0) + self.breakdown_s.get(EP_COMM, 0.0)
        return exposed + self.breakdown_s.get(OFFLOAD, 0.0)

    def summary_row(self) -> MetricsRow:
        """The scalars of these metrics with the exposed-communication share and whether
        the layout fits: what a sweep or a search keeps of a run."""
        iteration_s = self.iteration_time_s
        shared = {f.name for f in fields(MetricsRow)} & {f.name for f in fields(Metrics)}
        return MetricsRow(
            **{name: getattr(self, name) for name in shared},
            exposed_comm_fraction=self.exposed_comm_s() / iteration_s if iteration_s > 0 else 0.0,
            fits_in_memory=self.out_of_memory is None,
        )

    def row(self) -> dict[str, Any]:
        """The flat row sweep.csv and search.csv hold for this point."""
        return self.summary_row().row()


IDLE_CAUSES = ("schedule", "imbalance", "communication")  # run/bubble.py idle_causes
IDLE_CAUSE_COLUMN = "idle_by_cause_s.{}"


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsRow:
    """The scalar metrics of one simulated point and its mean breakdown: one row of
    sweep.csv or search.csv, one entry of the search journal. Fields are in the CSV's
    column order; ``row()`` flattens the breakdown into breakdown_s.KEY columns."""

    iteration_time_s: float
    hardware_tflops_per_gpu: float
    model_tflops_per_gpu: float
    mfu: float
    bubble_fraction: float
    num_gpus: int
    num_microbatches: int
    tokens_per_s: float
    memory_per_gpu_gib: float
    breakdown_s: dict[str, float]
    exposed_comm_fraction: float
    fits_in_memory: bool
    # the idle split by cause (Metrics.idle_by_cause_s); None without a pipeline, or
    # when the run left it unsplit
    idle_by_cause_s: dict[str, float] | None = None

    def row(self) -> dict[str, Any]:
        """The flat row: breakdown_s.KEY columns for the breakdown, and
        idle_by_cause_s.schedule, .imbalance, .communication (None, an empty CSV cell,
        where the idle is not split)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "breakdown_s":
                out.update({BREAKDOWN_COLUMN.format(k): v for k, v in self.breakdown_s.items()})
            elif f.name == "idle_by_cause_s":
                causes = self.idle_by_cause_s or {}
                out.update({IDLE_CAUSE_COLUMN.format(k): causes.get(k) for k in IDLE_CAUSES})
            else:
                out[f.name] = getattr(self, f.name)
        return out

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> MetricsRow:
        """Read back what ``row()`` wrote (the search journal)."""
        skip = ("breakdown_s", "idle_by_cause_s")
        values = {f.name: row[f.name] for f in fields(cls) if f.name not in skip}
        breakdown = {
            key: row[BREAKDOWN_COLUMN.format(key)]
            for key in ALL_BREAKDOWN_KEYS
            if key in BREAKDOWN_KEYS or BREAKDOWN_COLUMN.format(key) in row
        }
        columns = {k: IDLE_CAUSE_COLUMN.format(k) for k in IDLE_CAUSES}
        split = (  # None: no pipeline, or a journal written before the split
            {k: float(row[c]) for k, c in columns.items()}
            if all(row.get(c) is not None for c in columns.values())
            else None
        )
        return cls(**values, breakdown_s=breakdown, idle_by_cause_s=split)


class SweepPoint(NamedTuple):
    """One point of a sweep: the swept keys' values (parsed) and what it measured."""

    settings: dict[str, Any]
    metrics: MetricsRow
    calibration: str = ""  # the kernel constants' label (report/labels.py)
    assumptions: tuple[str, ...] = ()  # what may flatter the point (Metrics.assumptions)

    def row(self) -> dict[str, Any]:
        """The point's row of sweep.csv: the swept keys, the metrics (the idle by cause
        among them, empty without a pipeline), then what they rest on (the calibration
        label and the assumptions, joined by '; ')."""
        return {
            **self.settings,
            **self.metrics.row(),
            "calibration": self.calibration,
            "assumptions": "; ".join(self.assumptions),
        }


class ClassRun(NamedTuple):
    """How class mode (comm/classes.py) ran: its classes of tensor ranks and of replicas
    when the certificate held, and how many runs it took to find them."""

    ranks: tuple[tuple[int, ...], ...]
    replicas: tuple[tuple[int, ...], ...]
    runs: int


class Result(NamedTuple):
    scenario: Scenario
    cluster: AnyCluster
    workload: Workload
    trace: Trace
    memory: list[StageMemory]
    metrics: Metrics
    classes: ClassRun | None = None  # class mode's classes; None in every other mode


@dataclass(frozen=True, slots=True, kw_only=True)
class StageMemory:
    """One GPU of a pipeline stage: its parameters and the bytes it holds at peak, by kind
    (the cost model's memory.stage_memory fills it)."""

    stage: int
    params: float
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    inflight_activations: int  # peak forwards held, one chunk's layers each
    workspace_bytes: float  # the CUDA context, libraries' workspaces, fragmentation

    @property
    def total_bytes(self) -> float:
        return (
            self.weights_bytes
            + self.gradients_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.workspace_bytes
        )

    def as_gib(self) -> dict[str, float]:
        return {
            "weights": bytes_to_gib(self.weights_bytes),
            "gradients": bytes_to_gib(self.gradients_bytes),
            "optimizer": bytes_to_gib(self.optimizer_bytes),
            "activations": bytes_to_gib(self.activations_bytes),
            "workspace": bytes_to_gib(self.workspace_bytes),
            "total": bytes_to_gib(self.total_bytes),
        }


# several jobs on one fabric (run/multijob.py): per job its iteration alone and together,
# slowdown, breakdowns and the links it shares


class SharedLink(NamedTuple):
    """A link a job's traffic shared with another job's, over the together run."""

    link: str
    kind: str  # topologies.describe.LINK_ROLES
    index: int  # type: ignore[assignment]  # shadows tuple.index; renaming changes the API
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
