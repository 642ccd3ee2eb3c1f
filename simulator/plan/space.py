"""The search space: what a layout is, the values a search tries, and every layout
they make on a base scenario's cluster (see plan/search.py for the search itself)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, overload

from stepsim import schedules

from ..ir.vocabulary import (
    DATA_PARALLEL_SHARDING,
    NO_SHARDING,
    RECOMPUTE_GRANULARITIES,
    SHARD_OPTIMIZER,
)
from ..scenario import Scenario, ScenarioError

DEFAULT_MICRO_BATCHES = (1, 2, 4, 8)


DEFAULT_SCHEDULES = (schedules.ONE_F_ONE_B, schedules.INTERLEAVED)
DEFAULT_CHUNKS = (2,)  # chunks per rank for chunked schedules other than ZB-V (always 2)
DEFAULT_SHARDING = (NO_SHARDING, SHARD_OPTIMIZER)  # FSDP on request
# The fraction of a GPU's memory a layout must leave free to count as fitting. A
# judgment, not a fit: what the memory model leaves out (the caching allocator's
# fragmentation, the CUDA context, NCCL's buffers, a framework's own tensors) takes a
# few per cent of 80 GiB in practice, and a layout at 99.9 % of the memory is one
# allocation away from failing. --memory-headroom sets it (0: the bare capacity).
DEFAULT_MEMORY_HEADROOM = 0.05
MAX_MEMORY_HEADROOM = 0.5
# training keys that belong to one schedule and go when a layout replaces it
SCHEDULE_BOUND_KEYS = ("schedule_file", "schedule_placement", "microbatch_group_size_per_vp_stage")


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class Layout:
    tp: int
    pp: int
    dp: int
    micro_batch: int
    schedule: str
    chunks: int  # virtual pipeline size: chunks per rank
    recompute: str
    sharding: str
    sequence_parallel: bool
    # Megatron-Core's decoder_first/last_pipeline_num_layers; None: an even split
    first_layers: int | None = None
    last_layers: int | None = None

    @property
    def uneven(self) -> bool:
        return self.first_layers is not None or self.last_layers is not None

    @property
    def key(self) -> str:
        """A short name, unique in a search: tp8-pp16-dp8-mb1-1f1b-v1-full-none-sp, with
        -first5-last5 after pp for an uneven split."""
        sp = "sp" if self.sequence_parallel else "nosp"
        split = f"-first{self.first_layers}-last{self.last_layers}" if self.uneven else ""
        return (
            f"tp{self.tp}-pp{self.pp}{split}-dp{self.dp}-mb{self.micro_batch}-{self.schedule}-"
            f"v{self.chunks}-{self.recompute}-{self.sharding}-{sp}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "micro_batch": self.micro_batch,
            "schedule": self.schedule,
            "chunks": self.chunks,
            "recompute": self.recompute,
            "sharding": self.sharding,
            "sequence_parallel": self.sequence_parallel,
        }

    def overrides(self) -> list[str]:
        """The same layout as `--set` overrides for `stepsim run`."""
        split = (
            [
                f"parallel.decoder_first_pipeline_num_layers={self.first_layers}",
                f"parallel.decoder_last_pipeline_num_layers={self.last_layers}",
            ]
            if self.uneven
            else []
        )
        return [
            f"parallel.tensor_model_parallel_size={self.tp}",
            f"parallel.pipeline_model_parallel_size={self.pp}",
            *split,
            f"parallel.data_parallel_size={self.dp}",
            f"parallel.virtual_pipeline_model_parallel_size={self.chunks}",
            f"parallel.sequence_parallel={str(self.sequence_parallel).lower()}",
            f"training.micro_batch_size={self.micro_batch}",
            f"training.schedule={self.schedule}",
            f"training.recompute_granularity={self.recompute}",
            f"training.data_parallel_sharding={self.sharding}",
        ]


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpace:
    """The values a search tries; None: derived from the model and cluster (tensor
    parallel: the divisors of the GPUs per node; pipeline: the divisors of the layers
    and the sizes `uneven_split` takes them in)."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    micro_batch: tuple[int, ...] = DEFAULT_MICRO_BATCHES
    schedules: tuple[str, ...] = DEFAULT_SCHEDULES
    chunks: tuple[int, ...] = DEFAULT_CHUNKS
    recompute: tuple[str, ...] = RECOMPUTE_GRANULARITIES
    sharding: tuple[str, ...] = DEFAULT_SHARDING
    sequence_parallel: tuple[bool, ...] = (False, True)
    memory_headroom: float = DEFAULT_MEMORY_HEADROOM  # kept free of each GPU's memory

    def usable_gib(self, capacity_gib: float) -> float:
        """What a layout may use of a GPU's ``capacity_gib``."""
        return capacity_gib * (1.0 - self.memory_headroom)

    def tight_gib(self, capacity_gib: float) -> float:
        """Above this a fitting layout is marked tight: within twice the headroom."""
        return capacity_gib * (1.0 - 2.0 * self.memory_headroom)

    def check(self) -> None:
        """One-line ScenarioError for a value no layout could take."""
        h = self.memory_headroom
        if (
            isinstance(h, bool)
            or not isinstance(h, int | float)
            or not 0.0 <= h < MAX_MEMORY_HEADROOM
        ):
            raise ScenarioError(
                f"search memory_headroom={h!r} must be a fraction from 0 to under "
                f"{MAX_MEMORY_HEADROOM:g} of the GPU's memory"
            )
        for name in ("tp", "pp", "micro_batch", "chunks"):
            values = getattr(self, name)
            for value in values or ():
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise ScenarioError(f"search {name}={value!r} must be an integer >= 1")
        for name, values, allowed in (
            ("schedules", self.schedules, tuple(schedules.SCHEDULES)),
            ("recompute", self.recompute, RECOMPUTE_GRANULARITIES),
            ("sharding", self.sharding, DATA_PARALLEL_SHARDING),
        ):
            for value in values:
                if value not in allowed:
                    raise ScenarioError(
                        f"search {name}={value!r} is not one of: {', '.join(allowed)}"
                    )
        for name in ("micro_batch", "schedules", "chunks", "recompute", "sharding"):
            if not getattr(self, name):
                raise ScenarioError(f"search {name} is empty; give at least one value")

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def uneven_split(num_layers: int, pp: int, chunks: int = 1) -> tuple[int, int] | None:
    """(first, last) stage layers for ``pp`` stages that cannot hold ``num_layers``
    evenly, as Megatron users split them (Megatron-Core's
    ``--decoder-first/last-pipeline-num-layers``): the middle stages hold
    ceil(L / pp) layers each (rounded up to a multiple of the chunks), the first and last
    stage share the rest, at most that many each and the first the fewer, each a
    multiple of the chunks. BLOOM's 70 layers on 12 stages give (5, 5) with 6 in the
    middle. None when the layers split evenly or no such split exists."""
    if num_layers % (pp * chunks) == 0 or pp < 2:
        return None
    v = chunks
    middle = -(-num_layers // pp)
    middle = -(-middle // v) * v
    rest = num_layers - (pp - 2) * middle
    if rest < 2 * v or rest % v or (pp > 2 and rest > 2 * middle):
        return None
    first = rest // v // 2 * v
    return first, rest - first


def pipeline_sizes(num_layers: int) -> list[int]:
    """The pipeline sizes a search tries by default: the divisors of the layers, and the
    sizes that take them in an uneven split (`uneven_split`)."""
    return [
        p
        for p in range(1, num_layers + 1)
        if num_layers % p == 0 or uneven_split(num_layers, p) is not None
    ]


def layouts(base: Scenario, space: SearchSpace) -> list[Layout]:
    """Every combination of the space's values that uses the whole cluster (TP x CP x PP
    x DP = its GPUs, the base scenario's CP kept), in a fixed order. Not yet checked
    against the loader's rules."""
    num_gpus, gpn = base.cluster.num_gpus, base.cluster.gpus_per_node
    cp = base.parallel.cp_size
    tps = space.tp if space.tp is not None else tuple(divisors(gpn))
    num_layers = base.model.num_layers
    pps = space.pp if space.pp is not None else tuple(pipeline_sizes(num_layers))
    out = []
    for tp, pp in itertools.product(sorted(set(tps)), sorted(set(pps))):
        if num_gpus % (tp * pp * cp):
            continue
        dp = num_gpus // (tp * pp * cp)
        for mb, schedule, recompute, sharding, sp in itertools.product(
            sorted(set(space.micro_batch)),
            space.schedules,
            space.recompute,
            space.sharding if dp * cp > 1 else (NO_SHARDING,),
            sorted(set(space.sequence_parallel)) if tp > 1 else (False,),
        ):
            info = schedules.SCHEDULES[schedule]
            if not info.chunked:
                chunk_values: Iterable[int] = (1,)
            elif info.placement == schedules.V_SHAPE:
                chunk_values = (2,)
            else:
                chunk_values = sorted(set(space.chunks))
            if pp == 1 and schedule != schedules.ONE_F_ONE_B:
                continue  # with one stage every schedule is the same sequence of passes
            for chunks in chunk_values:
                split = uneven_split(num_layers, pp, chunks) or (None, None)
                out.append(
                    Layout(
                        tp=tp,
                        pp=pp,
                        dp=dp,
                        micro_batch=mb,
                        schedule=schedule,
                        chunks=chunks,
                        recompute=recompute,
                        sharding=sharding,
                        sequence_parallel=sp,
                        first_layers=split[0],
                        last_layers=split[1],
                    )
                )
    return out


# -- the space from the command line's comma-separated lists -----------------------------

SEQUENCE_PARALLEL_CHOICES = {"both": (False, True), "on": (True,), "off": (False,)}
# SearchSpace fields named by another flag than --FIELD
_FLAG_OF = {"micro_batch": "--micro-batch", "memory_headroom": "--memory-headroom"}


@overload
def int_list(flag: str, text: str) -> tuple[int, ...]: ...
@overload
def int_list(flag: str, text: None) -> None: ...
def int_list(flag: str, text: str | None) -> tuple[int, ...] | None:
    """``"1,2,4"`` as (1, 2, 4); None stays None (the default applies). Errors name the
    flag."""
    if text is None:
        return None
    values = []
    for item in text.split(","):
        try:
            value = int(item.strip())
        except ValueError:
            raise ScenarioError(f"{flag}={text!r}: {item.strip()!r} is not an integer") from None
        if value < 1:
            raise ScenarioError(f"{flag}={text!r}: every value must be >= 1")
        values.append(value)
    return tuple(values)


def name_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def space_from_flags(
    *,
    tp: str | None,
    pp: str | None,
    micro_batch: str,
    schedules: str,
    chunks: str,
    recompute: str,
    sharding: str,
    sequence_parallel: str,
    memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
) -> SearchSpace:
    """The search space the command-line flags give (comma-separated lists), checked;
    an error names the flag, not the field."""
    space = SearchSpace(
        tp=int_list("--tp", tp),
        pp=int_list("--pp", pp),
        micro_batch=int_list("--micro-batch", micro_batch),
        schedules=name_list(schedules),
        chunks=int_list("--chunks", chunks),
        recompute=name_list(recompute),
        sharding=name_list(sharding),
        sequence_parallel=SEQUENCE_PARALLEL_CHOICES[sequence_parallel],
        memory_headroom=memory_headroom,
    )
    try:
        space.check()
    except ScenarioError as exc:
        message = str(exc).removeprefix("search ")
        name = message.split("=", 1)[0].split(" ", 1)[0]
        raise ScenarioError(message.replace(name, _FLAG_OF.get(name, "--" + name), 1)) from None
    return space
