"""Run modes: everything that turns a scenario into a result. iteration.py is one
iteration (cluster, lowering, engine, metrics: `run`); run/fastforward.py proves a long
pipeline's steady state and skips its repeats; run/perturb.py applies what-if
perturbations as one `Perturbation` the run asks at each step; multijob.py runs several
jobs on one fabric; run/bubble.py simulates schedules in abstract time (`stepsim
schedule`). A new run mode is a module here and its command in cli/.

``from stepsim.run import run`` is the Python entry point (README, "How it works")."""

from .iteration import build_cluster, memory_per_stage, run

__all__ = ["build_cluster", "memory_per_stage", "run"]
