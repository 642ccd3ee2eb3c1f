"""Scenario files (TOML) in, a validated frozen `Scenario` out; and back to TOML.

This module and the CLI are the only places that touch files. Every error a
user can cause is a `ScenarioError` whose message names the key, the value and
the rule, e.g. ``parallel.tensor_model_parallel_size=6 must divide
model.num_attention_heads=128``.
"""

from __future__ import annotations

import csv
import json
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from schedules import SCHEDULES as SCHEDULE_INFO
from schedules import Step
from schedules import check as check_schedule
from schedules.custom import check_orders, parse_orders, sizes_of
from topologies import FABRICS, NVLINK_TOPOLOGIES

from ..vocabulary import (
    ALL_REDUCE_ALGORITHMS,
    DATA_PARALLEL_SHARDING,
    NETWORK_MODELS,
    PLACEMENTS,
    RECOMPUTE_GRANULARITIES,
)
from . import presets
from .spec import (
    SCHEDULES,
    ClusterSpec,
    KernelConstants,
    ModelSpec,
    NetworkConfig,
    ParallelConfig,
    Scenario,
    ScenarioError,
    TrainingConfig,
)

# Each key's expected type: int, float (ints accepted), bool or str.
_KEYS: dict[str, dict[str, type]] = {
    "model": {
        "preset": str,
        "num_layers": int,
        "hidden_size": int,
        "num_attention_heads": int,
        "ffn_hidden_size": int,
        "seq_length": int,
        "vocab_size": int,
    },
    "cluster": {
        "node": str,
        "gpu": str,
        "num_nodes": int,
        "gpus_per_node": int,
        "nics_per_node": int,
        "nic_gbps": float,
        "nvlink_gbytes_per_s": float,
        "pcie_gbytes_per_s": float,
        "nvlink_latency_us": float,
        "pcie_latency_us": float,
        "ib_latency_us": float,
        "collective_base_latency_us": float,
        "nvlink_efficiency": float,
        "nic_efficiency": float,
        "nvlink_topology": str,
        "fabric": str,
        "fabric_levels": int,
        "nodes_per_leaf": int,
        "leaves_per_pod": int,
        "spine_switches": int,
        "oversubscription": float,
    },
    "parallel": {
        "tensor_model_parallel_size": int,
        "pipeline_model_parallel_size": int,
        "data_parallel_size": int,
        "virtual_pipeline_model_parallel_size": int,
        "sequence_parallel": bool,
    },
    "training": {
        "micro_batch_size": int,
        "global_batch_size": int,
        "schedule": str,
        "microbatch_group_size_per_vp_stage": int,
        "schedule_file": str,
        "schedule_placement": str,
        "recompute_granularity": str,
        "overlap_grad_reduce": bool,
        "async_tensor_model_parallel_allreduce": bool,
        "data_parallel_sharding": str,
    },
    "network": {
        "model": str,
        "collective_algorithm": str,
        "symmetry": bool,
    },
}
_CHOICES: dict[str, tuple[str, ...]] = {
    "training.schedule": SCHEDULES,
    "training.schedule_placement": PLACEMENTS,
    "training.recompute_granularity": RECOMPUTE_GRANULARITIES,
    "training.data_parallel_sharding": DATA_PARALLEL_SHARDING,
    "network.model": NETWORK_MODELS,
    "network.collective_algorithm": ALL_REDUCE_ALGORITHMS,
    "model.preset": tuple(presets.MODELS),
    "cluster.node": tuple(presets.NODES),
    "cluster.gpu": tuple(presets.GPUS),
    "cluster.nvlink_topology": NVLINK_TOPOLOGIES,
    "cluster.fabric": FABRICS,
}
_REQUIRED_CLUSTER_KEYS = (
    "gpu",
    "num_nodes",
    "gpus_per_node",
    "nics_per_node",
    "nic_gbps",
    "nvlink_gbytes_per_s",
    "pcie_gbytes_per_s",
    "nvlink_latency_us",
    "pcie_latency_us",
    "ib_latency_us",
    "collective_base_latency_us",
)
# Plausible ranges, so that absurd values give an error rather than NaN or a hang.
_MAX_INT = 10**9
_RANGES: dict[str, tuple[float, float]] = {
    "cluster.num_nodes": (1, 100_000),
    "cluster.nic_gbps": (1e-3, 1e7),
    "cluster.nvlink_gbytes_per_s": (1e-3, 1e7),
    "cluster.pcie_gbytes_per_s": (1e-3, 1e7),
    "cluster.nvlink_latency_us": (0.0, 1e6),
    "cluster.pcie_latency_us": (0.0, 1e6),
    "cluster.ib_latency_us": (0.0, 1e6),
    "cluster.collective_base_latency_us": (0.0, 1e6),
    "cluster.nvlink_efficiency": (0.01, 1.0),
    "cluster.nic_efficiency": (0.01, 1.0),
    "cluster.fabric_levels": (2, 3),
    "cluster.spine_switches": (1, 1024),
    "cluster.oversubscription": (1.0, 1000.0),
}
# Ops per micro-batch and layer are about a dozen; beyond this a run takes hours.
MAX_SIMULATED_OPS = 50_000_000
# Latencies may be zero; every other number must be positive.
_MAY_BE_ZERO = {
    "cluster.nvlink_latency_us",
    "cluster.pcie_latency_us",
    "cluster.ib_latency_us",
    "cluster.collective_base_latency_us",
}


def load_scenario(
    path: str | Path, overrides: Iterable[str] = (), calibration: str | Path | None = None
) -> Scenario:
    """Read a scenario file, apply ``section.key=value`` overrides, validate; with
    ``calibration``, use that file's kernel constants for the scenario's GPU."""
    path = Path(path)
    raw = _read_toml(path, "scenario file")
    for item in overrides:
        apply_override(raw, item)
    scenario = scenario_from_dict(raw, base_dir=path.parent)
    if calibration is None:
        return scenario
    constants = read_calibration(calibration)
    if constants.gpu != scenario.cluster.gpu.name:
        raise ScenarioError(
            f"calibration file {str(calibration)!r} has gpu={constants.gpu!r} but the scenario "
            f"runs on cluster.gpu={scenario.cluster.gpu.name!r}"
        )
    return replace(scenario, calibration=constants)


def _read_toml(path: Path, what: str) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"cannot read {what} {str(path)!r}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"{what} {str(path)!r} is not UTF-8 text") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: not valid TOML: {exc}") from None


# Calibration files (benchmarks/measure_kernels.py writes them): a [constants] table
# with KernelConstants' fields; [[gemm]] and [[memory]] rows keep the measurements.
_CALIBRATION_KEYS: dict[str, type] = {
    "gpu": str,
    "num_sms": int,
    "tile_m": int,
    "tile_n": int,
    "gemm_efficiency": float,
    "gemm_k_half": float,
    "memory_efficiency": float,
    "source": str,
}
_CALIBRATION_RANGES: dict[str, tuple[float, float]] = {
    "num_sms": (1, 10_000),
    "tile_m": (1, 4096),
    "tile_n": (1, 4096),
    "gemm_efficiency": (0.01, 1.0),
    "gemm_k_half": (0.0, 1e6),
    "memory_efficiency": (0.01, 1.0),
}


def read_calibration(path: str | Path) -> KernelConstants:
    """A calibration file's kernel constants, checked key by key."""
    path = Path(path)
    raw = _read_toml(path, "calibration file")
    table = raw.get("constants")
    if not isinstance(table, Mapping):
        raise ScenarioError(f"calibration file {str(path)!r} needs a [constants] table")
    values: dict[str, Any] = {}
    for key, wanted in _CALIBRATION_KEYS.items():
        if key not in table:
            raise ScenarioError(f"calibration file {str(path)!r}: constants.{key} is missing")
        value = table[key]
        ok = isinstance(value, wanted) or (wanted is float and type(value) is int)
        if not ok or isinstance(value, bool):
            raise ScenarioError(
                f"constants.{key}={value!r} must be {wanted.__name__} (in {str(path)!r})"
            )
        low, high = _CALIBRATION_RANGES.get(key, (None, None))
        if low is not None and not low <= value <= high:
            raise ScenarioError(
                f"constants.{key}={value!r} must be between {low:g} and {high:g} (in {str(path)!r})"
            )
        values[key] = float(value) if wanted is float else value
    unknown = sorted(set(table) - set(_CALIBRATION_KEYS))
    if unknown:
        raise ScenarioError(
            f"unknown key constants.{unknown[0]} in {str(path)!r}; "
            f"known: {_known(_CALIBRATION_KEYS)}"
        )
    if values["gpu"] not in presets.GPUS:
        raise ScenarioError(
            f"constants.gpu={values['gpu']!r} must be one of {_known(presets.GPUS)} "
            f"(in {str(path)!r})"
        )
    return KernelConstants(**values)


def parse_override(item: str) -> tuple[str, str, Any]:
    """Split ``section.key=value`` into (section, key, value); value parsed as TOML."""
    target, sep, text = item.partition("=")
    target = target.strip()
    if not sep or not target:
        raise ScenarioError(f"--set {item!r} must look like section.key=value")
    section, dot, key = target.partition(".")
    if not dot:
        section, key = "", target
    if section and section not in _KEYS:
        raise ScenarioError(f"--set {target}: unknown section {section!r}; known: {_known(_KEYS)}")
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()  # a bare word such as gpipe or fair-share
    return section, key, value


def apply_override(raw: dict[str, Any], item: str) -> None:
    section, key, value = parse_override(item)
    if not section:
        raw[key] = value
        return
    table = raw.setdefault(section, {})
    if not isinstance(table, dict):
        raise ScenarioError(f"--set {section}.{key}: [{section}] is not a table in the file")
    table[key] = value


def scenario_from_dict(raw: Mapping[str, Any], base_dir: Path | None = None) -> Scenario:
    """Validate a parsed TOML document and build the frozen Scenario. A relative
    ``training.schedule_file`` is read from ``base_dir`` (the scenario's folder)."""
    allowed_top = {"name", *_KEYS}
    for key in raw:
        if key not in allowed_top:
            raise ScenarioError(f"unknown key {key!r} at top level; known: {_known(allowed_top)}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ScenarioError(f"name={name!r} must be a non-empty string")
    tables = {}
    for section in _KEYS:
        table = raw.get(section, {})
        if not isinstance(table, Mapping):
            raise ScenarioError(f"{section}={table!r} must be a table [{section}]")
        tables[section] = _check_table(section, table)

    model = _build_model(tables["model"])
    cluster = _build_cluster(tables["cluster"])
    schedule = tables["training"].get("schedule", "1f1b")
    custom = _read_custom_schedule(tables["training"], base_dir)
    if custom is not None and "virtual_pipeline_model_parallel_size" not in tables["parallel"]:
        tables["parallel"]["virtual_pipeline_model_parallel_size"] = sizes_of(custom[1])[2]
    parallel = _build_parallel(tables["parallel"], model, cluster, schedule)
    training = _build_training(tables["training"], parallel, custom)
    _check_size(model, training, parallel)
    network = NetworkConfig(**tables["network"])
    return Scenario(
        name=name,
        model=model,
        cluster=cluster,
        parallel=parallel,
        training=training,
        network=network,
    )


def _known(keys: Iterable[str]) -> str:
    return ", ".join(sorted(keys))


def _check_table(section: str, table: Mapping[str, Any]) -> dict[str, Any]:
    types = _KEYS[section]
    out: dict[str, Any] = {}
    for key, value in table.items():
        full = f"{section}.{key}"
        if key not in types:
            raise ScenarioError(f"unknown key {full!r}; known in [{section}]: {_known(types)}")
        want = types[key]
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if want is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ScenarioError(f"{full}={value!r} must be an integer")
        if want is float and not isinstance(value, float):
            raise ScenarioError(f"{full}={value!r} must be a number")
        if want is bool and not isinstance(value, bool):
            raise ScenarioError(f"{full}={value!r} must be true or false")
        if want is str and not isinstance(value, str):
            raise ScenarioError(f"{full}={value!r} must be a string")
        if want in (int, float):
            if value < 0 or (value == 0 and full not in _MAY_BE_ZERO):
                rule = "must be >= 0" if full in _MAY_BE_ZERO else "must be positive"
                raise ScenarioError(f"{full}={value!r} {rule}")
            if value != value or value == float("inf"):
                raise ScenarioError(f"{full}={value!r} must be a finite number")
            low, high = _RANGES.get(full, (0, _MAX_INT))
            if not low <= value <= high:
                raise ScenarioError(f"{full}={value!r} must be between {low:g} and {high:g}")
        if full in _CHOICES and value not in _CHOICES[full]:
            raise ScenarioError(f"{full}={value!r} must be one of: {', '.join(_CHOICES[full])}")
        out[key] = value
    return out


def _require(section: str, table: Mapping[str, Any], key: str, hint: str = "") -> Any:
    if key not in table:
        raise ScenarioError(f"missing key {section}.{key}{hint}")
    return table[key]


def _build_model(table: dict[str, Any]) -> ModelSpec:
    values: dict[str, Any] = {}
    preset = table.get("preset")
    if preset is not None:
        values.update(presets.MODELS[preset])
    values.update({k: v for k, v in table.items() if k != "preset"})
    hint = " (or set model.preset)"
    for key in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size"):
        _require("model", values, key, hint)
    values.setdefault("ffn_hidden_size", 4 * values["hidden_size"])
    if values["hidden_size"] % values["num_attention_heads"]:
        raise ScenarioError(
            f"model.num_attention_heads={values['num_attention_heads']} must divide "
            f"model.hidden_size={values['hidden_size']}"
        )
    return ModelSpec(preset=preset, **values)


def _build_cluster(table: dict[str, Any]) -> ClusterSpec:
    values: dict[str, Any] = {}
    node = table.get("node")
    if node is not None:
        values.update(presets.NODES[node])
    values.update({k: v for k, v in table.items() if k != "node"})
    hint = " (or set cluster.node to a preset)"
    for key in _REQUIRED_CLUSTER_KEYS:
        _require("cluster", values, key, hint if key != "num_nodes" else "")
    gpu_name = values.pop("gpu")
    topology = values.get("nvlink_topology", "nvswitch")
    if topology == "all-to-all" and values["gpus_per_node"] > 7:
        raise ScenarioError(
            f"cluster.gpus_per_node={values['gpus_per_node']} must be <= 7 for "
            "cluster.nvlink_topology='all-to-all' (6 NVLink lanes per GPU)"
        )
    if topology == "hybrid-cube-mesh" and values["gpus_per_node"] != 8:
        raise ScenarioError(
            f"cluster.gpus_per_node={values['gpus_per_node']} must be 8 for "
            "cluster.nvlink_topology='hybrid-cube-mesh'"
        )
    if values["nics_per_node"] > values["gpus_per_node"]:
        raise ScenarioError(
            f"cluster.nics_per_node={values['nics_per_node']} must be <= "
            f"cluster.gpus_per_node={values['gpus_per_node']}"
        )
    return ClusterSpec(gpu=presets.GPUS[gpu_name], node=node, **values)


def _build_parallel(
    table: dict[str, Any], model: ModelSpec, cluster: ClusterSpec, schedule: str
) -> ParallelConfig:
    tp = table.get("tensor_model_parallel_size", 1)
    pp = table.get("pipeline_model_parallel_size", 1)
    # chunked schedules default to two chunks per rank (ZB-V runs exactly two)
    vpp = table.get("virtual_pipeline_model_parallel_size", 2 if _chunked(schedule) else 1)
    if model.num_attention_heads % tp:
        raise ScenarioError(
            f"parallel.tensor_model_parallel_size={tp} must divide "
            f"model.num_attention_heads={model.num_attention_heads}"
        )
    if model.ffn_hidden_size % tp:
        raise ScenarioError(
            f"parallel.tensor_model_parallel_size={tp} must divide "
            f"model.ffn_hidden_size={model.ffn_hidden_size}"
        )
    if model.num_layers % pp:
        raise ScenarioError(
            f"parallel.pipeline_model_parallel_size={pp} must divide "
            f"model.num_layers={model.num_layers}"
        )
    if model.num_layers % (pp * vpp):
        raise ScenarioError(
            f"parallel.virtual_pipeline_model_parallel_size={vpp} x "
            f"pipeline_model_parallel_size={pp} must divide model.num_layers={model.num_layers} "
            "(every chunk holds the same number of layers)"
        )
    if "data_parallel_size" in table:
        dp = table["data_parallel_size"]
    else:
        if cluster.num_gpus % (tp * pp):
            raise ScenarioError(
                f"cluster GPUs={cluster.num_gpus} (num_nodes x gpus_per_node) must be a multiple "
                f"of tensor x pipeline parallel size={tp * pp} to derive "
                f"parallel.data_parallel_size; set it explicitly or change the sizes"
            )
        dp = cluster.num_gpus // (tp * pp)
    if tp * pp * dp > cluster.num_gpus:
        raise ScenarioError(
            f"parallel.data_parallel_size={dp} asks for tensor x pipeline x data = "
            f"{tp * pp * dp} GPUs but the cluster has {cluster.num_gpus} "
            f"(cluster.num_nodes={cluster.num_nodes} x gpus_per_node={cluster.gpus_per_node})"
        )
    _check_symmetric(tp, tp * dp, cluster)
    return ParallelConfig(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        data_parallel_size=dp,
        virtual_pipeline_model_parallel_size=vpp,
        sequence_parallel=table.get("sequence_parallel", False),
    )


def _check_symmetric(tp: int, stage_gpus: int, cluster: ClusterSpec) -> None:
    """One GPU per stage is simulated for all its TP ranks and DP replicas, which needs
    every one of them to sit in the cluster the same way (docs/design.md)."""
    gpn, nics = cluster.gpus_per_node, cluster.nics_per_node
    if gpn % nics:
        raise ScenarioError(
            f"cluster.nics_per_node={nics} must divide cluster.gpus_per_node={gpn} "
            "(every NIC serves the same number of GPUs)"
        )
    per_nic = gpn // nics
    for name, size in (
        (f"parallel.tensor_model_parallel_size={tp}", tp),
        (f"tensor x data parallel size={stage_gpus} (the GPUs of one pipeline stage)", stage_gpus),
    ):
        if gpn % size and size % gpn:
            raise ScenarioError(
                f"{name} must divide or be a multiple of cluster.gpus_per_node={gpn}, so "
                "that every group sits in the nodes the same way"
            )
        if (
            cluster.nvlink_topology == "hybrid-cube-mesh"
            and size < gpn
            and size not in (1, gpn // 2)
        ):
            raise ScenarioError(
                f"{name} must be 1, {gpn // 2} or a multiple of {gpn} on a hybrid cube-mesh "
                "node, whose smaller GPU groups are not alike"
            )
        if size < gpn and per_nic % size and size % per_nic:
            raise ScenarioError(
                f"{name} must divide or be a multiple of the {per_nic} GPUs that share a NIC "
                f"(cluster.gpus_per_node={gpn} / nics_per_node={nics})"
            )


def _check_size(model: ModelSpec, training: TrainingConfig, parallel: ParallelConfig) -> None:
    microbatches = training.global_batch_size // (
        training.micro_batch_size * parallel.data_parallel_size
    )
    ops = microbatches * model.num_layers * 12
    if ops > MAX_SIMULATED_OPS:
        raise ScenarioError(
            f"training.global_batch_size={training.global_batch_size} with "
            f"model.num_layers={model.num_layers} means about {ops:,} ops to simulate, over "
            f"the limit of {MAX_SIMULATED_OPS:,}; use fewer micro-batches or layers"
        )


def _read_custom_schedule(
    table: dict[str, Any], base_dir: Path | None
) -> tuple[str, list[list[Step]]] | None:
    """(resolved path, orders) of a custom schedule, checked; None for a named one."""
    schedule, file = table.get("schedule", "1f1b"), table.get("schedule_file")
    if schedule != "custom":
        for key in ("schedule_file", "schedule_placement"):
            if key in table:
                raise ScenarioError(
                    f"training.{key}={table[key]!r} applies to training.schedule='custom' only"
                )
        return None
    if file is None:
        raise ScenarioError(
            "missing key training.schedule_file (per-rank op orders) for training.schedule='custom'"
        )
    path = Path(file)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    placement = table.get("schedule_placement", "looped")
    orders = read_schedule_file(path, f"training.schedule_file={file!r}", placement)
    return str(path.resolve()), orders


def read_schedule_file(path: Path, name: str, placement: str) -> list[list[Step]]:
    """Per-rank op orders from a file, checked (schedules.custom); ``name`` is how the
    one-line ScenarioError refers to the file (the key or the CLI flag)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{name}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"{name} is not UTF-8 text") from None
    try:
        orders = parse_orders(text)
        check_orders(orders, placement)
    except ValueError as exc:
        raise ScenarioError(f"{name}: {exc}") from None
    return orders


def _build_training(
    table: dict[str, Any],
    parallel: ParallelConfig,
    custom: tuple[str, list[list[Step]]] | None = None,
) -> TrainingConfig:
    gbs = _require("training", table, "global_batch_size")
    mbs = table.get("micro_batch_size", 1)
    dp = parallel.data_parallel_size
    if gbs % (mbs * dp):
        raise ScenarioError(
            f"training.global_batch_size={gbs} must be divisible by micro_batch_size x "
            f"data_parallel_size={mbs} x {dp}={mbs * dp}"
        )
    schedule = table.get("schedule", "1f1b")
    group = table.get("microbatch_group_size_per_vp_stage")
    p, v = parallel.pipeline_model_parallel_size, parallel.virtual_pipeline_model_parallel_size
    m = gbs // (mbs * dp)
    if custom is not None:
        if group is not None:
            raise ScenarioError(
                f"training.microbatch_group_size_per_vp_stage={group} does not apply to "
                "training.schedule='custom' (the file fixes the order)"
            )
        path, orders = custom
        ranks, microbatches, chunks, _ = sizes_of(orders)
        for what, wanted, found in (
            ("pipeline_model_parallel_size", p, ranks),
            ("virtual_pipeline_model_parallel_size", v, chunks),
        ):
            if wanted != found:
                raise ScenarioError(
                    f"training.schedule_file={table['schedule_file']!r} has {found} "
                    f"{'ranks' if 'virtual' not in what else 'chunks per rank'} but "
                    f"parallel.{what}={wanted}"
                )
        if microbatches != m:
            raise ScenarioError(
                f"training.schedule_file={table['schedule_file']!r} has {microbatches} "
                f"micro-batches but the scenario runs {m} per pipeline (global_batch_size / "
                "(micro_batch_size x data_parallel_size))"
            )
        return TrainingConfig(
            micro_batch_size=mbs,
            global_batch_size=gbs,
            schedule=schedule,
            schedule_file=path,
            schedule_placement=table.get("schedule_placement"),
            custom_orders=tuple(tuple(order) for order in orders),
            recompute_granularity=table.get("recompute_granularity", "none"),
            overlap_grad_reduce=table.get("overlap_grad_reduce", False),
            async_tensor_model_parallel_allreduce=table.get(
                "async_tensor_model_parallel_allreduce", False
            ),
            data_parallel_sharding=table.get("data_parallel_sharding", "none"),
        )
    info = SCHEDULE_INFO[schedule]
    chunked = [name for name, i in SCHEDULE_INFO.items() if i.chunked]
    if not info.chunked and v != 1:
        raise ScenarioError(
            f"parallel.virtual_pipeline_model_parallel_size={v} needs a schedule with chunks "
            f"({', '.join(chunked)}); training.schedule={schedule!r} runs one per stage"
        )
    if info.placement == "v" and v != 2:
        raise ScenarioError(
            f"parallel.virtual_pipeline_model_parallel_size={v} must be 2 for "
            f"training.schedule={schedule!r} (two chunks in a V)"
        )
    if info.chunked and v < 2:
        raise ScenarioError(
            f"parallel.virtual_pipeline_model_parallel_size={v} must be at least 2 for "
            f"training.schedule={schedule!r}"
        )
    if group is not None and not info.grouped:
        raise ScenarioError(
            f"training.microbatch_group_size_per_vp_stage={group} applies to interleaved "
            f"schedules only, not training.schedule={schedule!r}"
        )
    problem = check_schedule(schedule, p, m, v, group)
    if problem:
        raise ScenarioError(
            f"training.schedule={schedule!r} with {m} micro-batches per pipeline "
            f"(global_batch_size / (micro_batch_size x data_parallel_size)): {problem}"
        )
    return TrainingConfig(
        micro_batch_size=mbs,
        global_batch_size=gbs,
        schedule=schedule,
        microbatch_group_size_per_vp_stage=group,
        recompute_granularity=table.get("recompute_granularity", "none"),
        overlap_grad_reduce=table.get("overlap_grad_reduce", False),
        async_tensor_model_parallel_allreduce=table.get(
            "async_tensor_model_parallel_allreduce", False
        ),
        data_parallel_sharding=table.get("data_parallel_sharding", "none"),
    )


def _chunked(schedule: str) -> bool:
    info = SCHEDULE_INFO.get(schedule)
    return info is not None and info.chunked


# --- back to TOML -----------------------------------------------------------------------


def scenario_to_dict(scenario: Scenario) -> dict[str, Any]:
    """Every key with its resolved value: loading this gives the same Scenario."""

    def table(spec: object, section: str) -> dict[str, Any]:
        values = {k: getattr(spec, k) for k in _KEYS[section] if hasattr(spec, k)}
        return {k: v for k, v in values.items() if v is not None}

    cluster = table(scenario.cluster, "cluster")
    cluster["gpu"] = scenario.cluster.gpu.name
    return {
        "name": scenario.name,
        "model": table(scenario.model, "model"),
        "cluster": cluster,
        "parallel": table(scenario.parallel, "parallel"),
        "training": table(scenario.training, "training"),
        "network": table(scenario.network, "network"),
    }


def dumps_toml(doc: Mapping[str, Any]) -> str:
    """A small TOML writer for flat tables of str, int, float and bool."""
    lines = []
    for key, value in doc.items():
        if not isinstance(value, Mapping):
            lines.append(f"{key} = {_toml_value(value)}")
    for key, value in doc.items():
        if isinstance(value, Mapping):
            lines.append("")
            lines.append(f"[{key}]")
            lines.extend(f"{k} = {_toml_value(v)}" for k, v in value.items())
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        # JSON string escapes are valid TOML; TOML also forbids a raw DEL character.
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


# --- the validation set -----------------------------------------------------------------

VALIDATION_FILES = {
    "megatron": "megatron_2021_table1.csv",
    "layers": "korthikanti_2022_table4_layer.csv",
}


def read_validation_set(folder: str | Path) -> dict[str, list[dict[str, str]]]:
    """The calibration tables (scenarios/validation/) as rows of strings, by table."""
    folder = Path(folder)
    out = {}
    for table, name in VALIDATION_FILES.items():
        path = folder / name
        try:
            with path.open(newline="", encoding="utf-8") as f:
                out[table] = list(csv.DictReader(f))
        except OSError as exc:
            raise ScenarioError(
                f"validation table {str(path)!r} cannot be read: {exc.strerror}"
            ) from None
    return out


def read_search_journal(path: str | Path) -> tuple[dict[str, Any] | None, dict[str, dict]]:
    """(header, {layout key: row}) of a search's results file (stepsim search --out);
    (None, {}) when there is none. A line cut short by an interrupted write is skipped."""
    path = Path(path)
    if not path.exists():
        return None, {}
    header, rows = None, {}
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f):
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if n == 0:
                header = entry.get("search") if isinstance(entry, dict) else None
                if header is None:
                    raise ScenarioError(f"{str(path)!r} is not a stepsim search journal")
            elif isinstance(entry, dict) and "layout" in entry and "row" in entry:
                rows[entry["layout"]] = entry["row"]
    return header, rows
