"""Run modes: everything that turns a scenario into a result. iteration.py is one
iteration (cluster, lowering, engine, metrics: `run`); fastforward.py proves a long
pipeline's steady state and skips its repeats; perturb.py applies what-if
perturbations as one `Perturbation` the run asks at each step; multijob.py runs several
jobs on one fabric; bubble.py simulates schedules in abstract time (`stepsim
schedule`, and the idle split by cause); idlemap.py cuts a run's idle into pieces by
cause for its timeline and trace. A new run mode is a module here and its command in cli/.

``from stepsim.run import run`` is the Python entry point (README, "How it works"). It
is looked up when first asked for, so that importing one run mode (bubble.py for
`stepsim schedule`) does not load the whole simulator."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .iteration import build_cluster, memory_per_stage, run

__all__ = ["build_cluster", "memory_per_stage", "run"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import iteration  # start-up: only when the entry point is asked for

        return getattr(iteration, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
