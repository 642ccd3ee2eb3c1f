"""Every size a user's input can make large enough to run for minutes or exhaust memory,
in one place: its limit, why that value, and how to raise it.

Each size is estimated from the input BEFORE anything is built or read in full (a
file's bytes from ``os.stat``, the GPUs and links from the cluster keys, the ops from
the layout), so an input over a limit is refused in a fraction of a second with one
line naming it. A limit is raised by the environment variable ``STEPSIM_MAX_<NAME>``
(e.g. ``STEPSIM_MAX_GPUS=200000 stepsim run big.toml``); scenarios/README.md lists them.
The values were chosen from measurements on a 2-core machine (docs/design.md, "Limits").
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stepsim.topologies import cable_count

from .errors import ScenarioError

if TYPE_CHECKING:
    from .model import ModelSpec
    from .spec import ClusterSpec, ParallelConfig
    from .training import TrainingConfig

ENV_PREFIX = "STEPSIM_MAX_"


@dataclass(frozen=True, slots=True)
class Limit:
    name: str  # STEPSIM_MAX_<NAME.upper()>
    value: int  # the default
    unit: str
    reason: str  # what going over it costs

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


LIMITS = {
    limit.name: limit
    for limit in (
        Limit(
            "input_bytes",
            16 * 2**20,
            "bytes",
            "a scenario, calibration, schedule or validation file; the largest shipped is "
            "under 100 kB, a schedule file at the ops limit about 10 MB",
        ),
        Limit(
            "journal_bytes",
            512 * 2**20,
            "bytes",
            "a search journal (search.jsonl) read back to resume; about 1 kB per layout",
        ),
        Limit(
            "trace_bytes",
            1024 * 2**20,
            "bytes",
            "a PyTorch profiler trace (stepsim compare), after decompression: a few "
            "iterations of one rank are tens to hundreds of MB, parsed whole into memory "
            "(about ten times its size)",
        ),
        Limit(
            "toml_depth",
            32,
            "levels",
            "nested arrays, inline tables or dotted keys in one TOML value; a scenario "
            "needs 2, and parsing costs grow with the square of the depth",
        ),
        Limit(
            "gpus",
            65_536,
            "GPUs",
            "the whole cluster graph and per-GPU state, built in exact mode and for a "
            "drawing: 65,536 GPUs of a small model take about 16 s and 1 GB",
        ),
        Limit(
            "links",
            2_000_000,
            "links",
            "the cluster graph's links (directed), which every flow is routed over",
        ),
        Limit(
            "simulated_ops",
            5_000_000,
            "ops",
            "ops the engine simulates (about a dozen per layer and micro-batch): about "
            "50 s and 1 GB at the limit on a 2-core machine",
        ),
        Limit(
            "schedule_ops",
            1_000_000,
            "ops",
            "ops of `stepsim schedule`, over all the schedules it runs and draws, zbv's "
            "builders and --out's picture counted as the ops whose time they take: under a "
            "minute at the limit on a 2-core machine",
        ),
    )
}


def limit(name: str) -> int:
    """The limit in force: ``STEPSIM_MAX_<NAME>`` when set (a positive integer), else the
    default. A malformed variable is an error, not silently the default."""
    spec = LIMITS[name]
    text = os.environ.get(spec.env)
    if text is None or not text.strip():
        return spec.value
    try:
        value = int(text.strip().replace("_", ""))
    except ValueError:
        value = 0
    if value < 1:
        raise ScenarioError(f"{spec.env}={text[:40]!r} must be a positive integer")
    return value


def check(
    name: str,
    amount: int,
    what: str,
    key: str | None = None,
    value: object = None,
    fix: str = "make it smaller",
) -> None:
    """Raise a one-line ScenarioError when ``amount`` is over the limit ``name``. The
    line reads ``{what} about {amount} {unit}, over the limit ...``, after
    ``{key}={value!r} `` when a scenario key drives the size; ``fix`` says what to
    change (the limit's variable follows it)."""
    allowed = limit(name)
    if amount <= allowed:
        return
    spec = LIMITS[name]
    rule = (
        f"{what} about {amount:,} {spec.unit}, over the limit of {allowed:,} {spec.unit} "
        f"({spec.reason})"
    )
    fix = f"{fix}, or raise the limit with {spec.env}=N"
    if key is None:
        raise ScenarioError(f"{rule}; {fix}")
    raise ScenarioError(key=key, value=value, rule=rule, fix=fix)


def check_cluster(cluster: ClusterSpec, *, whole: bool = True) -> None:
    """The cluster's GPUs and links, counted from its keys before the graph is drawn.
    ``whole=False``: only its repeating unit is built (a symmetric run: topologies'
    PatternCluster, TreePatternCluster), so nothing per GPU; the links still count (the
    network and the link statistics keep a number per link)."""
    nodes, gpus = cluster.num_nodes, cluster.gpus_per_node
    if whole:
        check(
            "gpus", nodes * gpus, f"x cluster.gpus_per_node={gpus} is", "cluster.num_nodes", nodes
        )
    fabric = cluster.fabric_shape()
    links = 2 * cable_count(nodes, gpus, cluster.nics_per_node, cluster.nvlink_topology, fabric)
    check(
        "links",
        links,
        f"with cluster.fabric={cluster.fabric!r} and cluster.spine_switches="
        f"{cluster.spine_switches} draws",
        "cluster.num_nodes",
        nodes,
    )


# the bucket keys and the collectives they split (emit/dataparallel.py: a stage's
# gradients after the flush, the routed experts' gradients, ZeRO-1's parameter gather)
BUCKET_KEYS = {
    "reduce_bucket_size": "gradient collectives",
    "allgather_bucket_size": "parameter all-gathers",
}


def pipeline_params(model: ModelSpec, parallel: ParallelConfig, tied: bool = True) -> float:
    """About how many parameters one GPU of each pipeline stage holds, summed over the
    stages: what a bucket key splits into calls. An estimate from the model's widths (the
    weight matrices, the word embedding and output layer; norms and biases left out;
    cost/params.py counts them exactly, but the scenario layer may not import cost/):
    the dense weights over tensor parallelism, the routed experts over expert and expert
    tensor parallelism. The word embedding counts twice unless ``tied`` on one stage."""
    h = model.hidden_size
    attention = h * model.qkv_width + model.attention_width * h
    dense_mlp = h * model.fc1_width + model.ffn_hidden_size * h
    experts = 0.0
    moe = model.num_moe_layers if model.moe else 0
    if moe:
        assert model.num_experts is not None
        one = h * model.expert_fc1_width + model.expert_ffn * h
        shared = h * (2 if model.gated else 1) * model.shared_expert_ffn
        shared += model.shared_expert_ffn * h
        experts = moe * model.num_experts * one / (parallel.ep_size * parallel.etp_size)
        dense = model.num_layers * attention + (model.num_layers - moe) * dense_mlp
        dense += moe * shared
    else:
        dense = model.num_layers * (attention + dense_mlp)
    copies = 1 if tied and parallel.pipeline_model_parallel_size == 1 else 2
    dense += copies * model.vocab_size * h
    return dense / parallel.tensor_model_parallel_size + experts


def check_buckets(model: ModelSpec, parallel: ParallelConfig, training: TrainingConfig) -> None:
    """A bucket key small enough to split a stage's gradients or parameters into more
    collectives than the engine is allowed ops (``simulated_ops``) is refused before any
    op is built: one call per ``bucket`` elements of every stage (symmetric mode's
    pipeline of one GPU per stage; whether the run's data-parallel mode uses the key is
    not asked, so the count is an upper bound)."""
    for name, what in BUCKET_KEYS.items():
        bucket = training.mechanism(name)
        if not bucket:
            continue
        params = pipeline_params(model, parallel, training.share_embeddings_and_output_weights)
        calls = math.ceil(params / bucket) + parallel.pipeline_model_parallel_size
        check(
            "simulated_ops",
            calls,
            f"splits the pipeline's {params:,.0f} parameters per GPU into {what} of at most "
            f"{bucket:,} elements:",
            f"training.{name}",
            bucket,
            fix="make the buckets larger (0: one call)",
        )
