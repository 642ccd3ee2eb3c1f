"""Where a batch of simulations runs: this process, a pool of local processes, or Ray.

Each executor is called with a batch of scenarios and a ``done(index, metrics)``
callback, which it calls once per scenario as results come back, in any order.
Every executor runs the same function (search.simulate_row, which returns a
results.MetricsRow) on the same frozen scenarios, so the metrics are the same bit
for bit whichever runs them.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any

from ..scenario import Scenario, ScenarioError
from .search import Done, serial_executor, simulate_row


def default_jobs() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


PARENT_POLL_S = 0.5  # how often a worker checks that the search that started it lives


def die_with_parent(parent_pid: int) -> None:
    """Run in each worker as it starts: a thread that ends the worker once its parent
    is gone. A worker waits on a queue whose both pipe ends it holds itself, so a
    parent killed with SIGKILL (no chance to shut the pool down) would otherwise leave
    it waiting for ever; os.getppid() changes when the orphan is re-parented."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


class LocalPool:
    """Worker processes on this machine (spawned, so nothing of the parent's state
    leaks into them), kept for the whole search."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self.pool: ProcessPoolExecutor | None = None

    def __call__(self, batch: Sequence[Scenario], done: Done) -> None:
        if self.jobs == 1:
            serial_executor(batch, done)
            return
        if self.pool is None:
            self.pool = ProcessPoolExecutor(
                self.jobs,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=die_with_parent,
                initargs=(os.getpid(),),
            )
        futures = {self.pool.submit(simulate_row, s): i for i, s in enumerate(batch)}
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in sorted(finished, key=futures.__getitem__):
                done(futures[future], future.result())

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None


class RayPool:
    """Tasks on a Ray cluster: ``address`` of a running cluster, or None to start Ray on
    this machine (``ray.init()``) with ``jobs`` CPUs. On a cluster ``package_dir`` (a
    folder named stepsim holding the package, cli.common.ray_package_dir) travels with
    the tasks (runtime_env py_modules), so its nodes need Ray and stepsim's
    dependencies but not stepsim itself."""

    def __init__(self, address: str | None, jobs: int, package_dir: str | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise ScenarioError(
                "--ray needs Ray, an optional extra: pip install 'stepsim[ray]'"
            ) from None
        self.ray = ray
        self.started = False
        if not ray.is_initialized():
            options: dict[str, Any] = {
                "include_dashboard": False,
                "log_to_driver": False,
                "configure_logging": False,
            }
            if address:
                options["address"] = address
                if package_dir is not None:  # the stepsim package, as the tasks import it
                    options["runtime_env"] = {"py_modules": [package_dir]}
            else:
                # Ray listens on every interface; from Ray 2.59 (what stepsim[ray]
                # requires) a local start makes and requires its own token by default
                options["num_cpus"] = jobs
            try:
                ray.init(**options)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                first = next((line for line in str(exc).splitlines() if line.strip()), "")
                why = first.strip() or type(exc).__name__  # Ray's messages run to pages
                raise ScenarioError(f"--ray {address or ''}".strip() + f": {why}") from None
            self.started = True
        self.task = ray.remote(num_cpus=1)(simulate_row)

    def __call__(self, batch: Sequence[Scenario], done: Done) -> None:
        refs = [self.task.remote(s) for s in batch]
        index = {ref: i for i, ref in enumerate(refs)}
        pending = refs
        while pending:
            ready, pending = self.ray.wait(pending, num_returns=1)
            for ref in ready:
                done(index[ref], self.ray.get(ref))

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()
            self.started = False
