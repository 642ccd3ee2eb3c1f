"""`[[perturbation]]` tables: what goes wrong in a run.

A scenario holds a tuple of `PerturbationSpec`, one per ``[[perturbation]]`` table of
its file, in file order (the summary and the errors number them from 1). Each names
its ``kind`` and a target, with the kind's own keys:

- ``slow_gpu``: ``gpu = G`` (or ``node = N``: its every GPU) and ``factor = k``: each
  compute op of that GPU takes k times as long (k < 1: faster).
- ``gpu_type``: ``node = N`` and ``gpu_model = "a100-sxm4-40gb"``: that node's GPUs
  are another model; its compute ops take the time that GPU's kernel model gives.
- ``jitter``: ``sigma = s``, ``seed = n`` and optionally ``gpu`` or ``node`` (absent:
  every GPU): each compute op of each such GPU takes a factor drawn from a lognormal of
  mean 1, exp(s z - s^2 / 2) with z standard normal, drawn per GPU in op order from a
  generator seeded by (seed, GPU): per op, independent between GPUs, the same in every
  run and in both simulation modes.
- ``slow_link``: ``link = L`` (the index `stepsim topology --links` and metrics.json
  print) and ``bandwidth_factor = f`` or ``down = true``: that cable (both directions)
  at f x its bandwidth, or failed (traffic rerouted where the fabric has another path;
  a NIC's cable: the job after its restart without the NIC, simulator/run/perturb.py).
- ``slow_nic``: ``node = N``, ``nic = K`` and ``bandwidth_factor`` or ``down``: the
  cable from that NIC to its leaf switch (both directions), as ``slow_link``.

The spec checks its own keys (which belong to its kind, ranges) when built; targets
against the cluster are `check_targets` (Scenario's rules) and, for link indices,
the run (the cluster's links are drawn there).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from .errors import ScenarioError
from .fields import check_values, key
from .presets import GPUS

SLOW_GPU = "slow_gpu"
GPU_TYPE = "gpu_type"
JITTER = "jitter"
SLOW_LINK = "slow_link"
SLOW_NIC = "slow_nic"
KINDS = (SLOW_GPU, GPU_TYPE, JITTER, SLOW_LINK, SLOW_NIC)
COMPUTE_KINDS = (SLOW_GPU, GPU_TYPE, JITTER)
LOGNORMAL = "lognormal"
DISTRIBUTIONS = (LOGNORMAL,)

SECTION = "perturbation"
# the keys each kind needs (all of one group of alternatives) and may have
_NEEDS: dict[str, tuple[tuple[str, ...], ...]] = {
    SLOW_GPU: (("gpu", "node"), ("factor",)),
    GPU_TYPE: (("node",), ("gpu_model",)),
    JITTER: (("sigma",), ("seed",)),
    SLOW_LINK: (("link",), ("bandwidth_factor", "down")),
    SLOW_NIC: (("node",), ("nic",), ("bandwidth_factor", "down")),
}
_MAY: dict[str, tuple[str, ...]] = {
    SLOW_GPU: ("gpu", "node", "factor"),
    GPU_TYPE: ("node", "gpu_model"),
    JITTER: ("gpu", "node", "sigma", "seed", "distribution"),
    SLOW_LINK: ("link", "bandwidth_factor", "down"),
    SLOW_NIC: ("node", "nic", "bandwidth_factor", "down"),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class PerturbationSpec:
    kind: str = key(
        "what goes wrong: `slow_gpu`, `gpu_type`, `jitter` (compute), `slow_link`, "
        "`slow_nic` (network); docs/what-if.md",
        choices=KINDS,
    )
    gpu: int | None = key(
        "the GPU (its index in the cluster, 0-based) a `slow_gpu` or `jitter` touches",
        default=None,
        may_be_zero=True,
    )
    node: int | None = key(
        "the node (0-based): every GPU of it (`slow_gpu`, `jitter`, `gpu_type`), or the "
        "node of a `slow_nic`",
        default=None,
        may_be_zero=True,
    )
    nic: int | None = key(
        "the NIC of `node` (0-based, as `stepsim topology` names them) a `slow_nic` touches",
        default=None,
        may_be_zero=True,
    )
    link: int | None = key(
        "the link a `slow_link` touches: its index as metrics.json's busiest links and "
        "`stepsim topology --links` give it (the cable: both directions)",
        default=None,
        may_be_zero=True,
    )
    factor: float | None = key(
        "`slow_gpu`: each compute op of the GPU takes this many times as long",
        default=None,
        high=1000,
    )
    bandwidth_factor: float | None = key(
        "`slow_link`, `slow_nic`: the cable runs at this fraction of its bandwidth",
        default=None,
        high=1000,
    )
    down: bool | None = key(
        "`slow_link`, `slow_nic`: the cable has failed: between switches, traffic takes the "
        "fabric's other paths; a NIC's, the job after its restart without the NIC (its "
        "GPUs use another NIC of the node); a GPU's NVLink or PCIe link: an error",
        default=None,
    )
    gpu_model: str | None = key(
        "`gpu_type`: the GPU preset the node has instead of `cluster.gpu`",
        default=None,
        choices=tuple(GPUS),
    )
    distribution: str = key(
        "`jitter`: the distribution of each compute op's factor (lognormal of mean 1)",
        default=LOGNORMAL,
        choices=DISTRIBUTIONS,
    )
    sigma: float | None = key(
        "`jitter`: the standard deviation of the factor's logarithm",
        default=None,
        may_be_zero=True,
        high=2,
    )
    seed: int | None = key(
        "`jitter`: the random seed (with the GPU's index: one stream per GPU)",
        default=None,
        may_be_zero=True,
    )

    def __post_init__(self) -> None:
        check_values(self, SECTION)
        check_kind_keys(self)

    def given(self) -> dict[str, object]:
        """The keys the file gave (None: not given; `distribution` only if not default)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or (f.name == "distribution" and value == LOGNORMAL):
                continue
            out[f.name] = value
        return out

    def describe(self) -> str:
        """One line naming it, for the summary and errors: ``slow_gpu gpu=17 factor=1.05``."""
        rest = " ".join(f"{k}={v}" for k, v in self.given().items() if k != "kind")
        return f"{self.kind} {rest}".strip()


def where(index: int) -> str:
    """How errors name the ``index``-th (0-based) perturbation of a scenario."""
    return f"perturbation {index + 1}"


def check_kind_keys(p: PerturbationSpec) -> None:
    given = p.given()
    for name in given:
        if name != "kind" and name not in _MAY[p.kind]:
            raise ScenarioError(
                key=f"{SECTION}.{name}",
                value=given[name],
                rule=f"is not a key of kind {p.kind!r}",
                fix=f"its keys: {', '.join(_MAY[p.kind])}",
            )
    for group in _NEEDS[p.kind]:
        present = [k for k in group if k in given]
        if not present:
            raise ScenarioError(
                f"{SECTION} of kind {p.kind!r} needs {' or '.join(group)}", key=f"{SECTION}.kind"
            )
        if len(present) > 1:
            raise ScenarioError(
                f"{SECTION} of kind {p.kind!r} takes one of {', '.join(group)}, not both",
                key=f"{SECTION}.{present[1]}",
            )
    if p.down is False:
        raise ScenarioError(
            key=f"{SECTION}.down", value=False, rule="is only written as down = true", fix=""
        )


def check_targets(perturbations, cluster) -> None:
    """Every target inside the cluster (a link index is checked by the run)."""
    gpus, nodes = cluster.num_gpus, cluster.num_nodes
    for i, p in enumerate(perturbations):
        if p.gpu is not None and p.gpu >= gpus:
            raise ScenarioError(
                f"{where(i)}: gpu={p.gpu} is not a GPU of the cluster (0 to {gpus - 1})",
                key=f"{SECTION}.gpu",
                value=p.gpu,
            )
        if p.node is not None and p.node >= nodes:
            raise ScenarioError(
                f"{where(i)}: node={p.node} is not a node of the cluster (0 to {nodes - 1})",
                key=f"{SECTION}.node",
                value=p.node,
            )
        if p.nic is not None and p.nic >= cluster.nics_per_node:
            raise ScenarioError(
                f"{where(i)}: nic={p.nic} is not a NIC of a node "
                f"(0 to {cluster.nics_per_node - 1})",
                key=f"{SECTION}.nic",
                value=p.nic,
            )
