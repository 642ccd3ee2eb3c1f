"""Scenario files (TOML) in, a validated frozen `Scenario` out; and back to TOML.

This layer and the CLI are the only places that touch files. What the loader checks
and fills comes from the schema (`schema.keys()`, read from the specs' fields): each
key's type, range and choices, the defaults and the required keys. It adds what only
a file has: presets (model.preset, cluster.node, cluster.gpu by name), a Hugging Face
config.json (model.hf_config, hfconfig.py), defaults derived from other keys, and a
custom schedule's file. The rules across keys run when the specs are built (`rules`),
as for a scenario built in Python. Every error a user can cause is a `ScenarioError`
whose message names the key, the value and the rule, e.g.
``parallel.tensor_model_parallel_size=6 must divide model.num_attention_heads=128``;
a mistyped key or section gets its close matches (suggest.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from stepsim.schedules import LOOPED
from stepsim.schedules import SCHEDULES as SCHEDULE_INFO
from stepsim.schedules.custom import sizes_of

from ..ir.vocabulary import SHARD_OPTIMIZER
from . import frameworks, hfconfig, presets, rules, schema
from .errors import ScenarioError
from .fields import check_value
from .files import (
    parse_value,
    read_calibration_file,
    read_schedule_file,
    read_shares_file,
    read_toml,
    scenario_path,
)
from .fitted import LATENCIES, MeasuredFit
from .perturbation import SECTION as PERTURBATION
from .perturbation import PerturbationSpec, where
from .spec import (
    ClusterSpec,
    GpuSpec,
    ModelSpec,
    NetworkConfig,
    ParallelConfig,
    Scenario,
    TrainingConfig,
)
from .suggest import did_you_mean

__all__ = [
    "apply_calibration",
    "apply_fit",
    "fitted_network",
    "apply_override",
    "dumps_toml",
    "load_scenario",
    "parse_override",
    "scenario_from_dict",
    "scenario_to_dict",
]


def load_scenario(
    path: str | Path,
    overrides: Iterable[str] = (),
    calibration: str | Path | None = None,
    hf_config: str | Path | None = None,
) -> Scenario:
    """Read a scenario file, apply ``section.key=value`` overrides, validate; with
    ``calibration``, use that file's kernel constants for the scenario's GPU; with
    ``hf_config`` (the CLI's --hf-config), take the model from that Hugging Face
    config.json (`apply_hf_config`)."""
    path = scenario_path(path)
    raw = read_toml(path, "scenario file")
    if hf_config is not None:  # before --set, which wins over it
        apply_hf_config(raw, hf_config)
    for item in overrides:
        apply_override(raw, item)
    scenario = scenario_from_dict(raw, base_dir=path.parent)
    if calibration is None:
        return scenario
    return apply_calibration(scenario, calibration)


def apply_calibration(scenario: Scenario, calibration: str | Path) -> Scenario:
    """The scenario with a calibration file's kernel constants ([constants]) in place of
    its GPU's, then its fit on measured iterations ([fit], `apply_fit`); a file made for
    another GPU or node is refused in one line naming it."""
    constants, fit = read_calibration_file(calibration)
    if constants is not None:
        # the label the run summary and metrics.json carry: which file, and what it says
        labelled = replace(
            constants, source=f"calibration file {str(calibration)!r}: {constants.source}"
        )
        try:
            scenario = replace(scenario, calibration=labelled)
        except ScenarioError as exc:
            if exc.key != "calibration.gpu":
                raise
            # rules.check_calibration; the user gave a file, so the line names it
            raise ScenarioError(
                f"calibration file {str(calibration)!r} has gpu={constants.gpu!r} but the "
                f"scenario runs on cluster.gpu={scenario.cluster.gpu.name!r}",
                key=exc.key,
                value=exc.value,
                rule=exc.rule,
            ) from None
    if fit is None:
        return scenario
    gpu, node = scenario.cluster.gpu.name, node_kind(scenario.cluster)
    if (fit.gpu, fit.node) != (gpu, node):
        what = "gpu" if fit.gpu != gpu else "node"
        mine, theirs = (fit.gpu, gpu) if what == "gpu" else (fit.node, node)
        key = "cluster.gpu" if what == "gpu" else "cluster.node"
        raise ScenarioError(
            f"calibration file {str(calibration)!r} was fitted on {what}={mine!r} but the "
            f"scenario runs on {key}={theirs!r} (a fit holds for the GPU and node it was "
            "measured on)",
            key=f"fit.{what}",
            value=mine,
            rule=f"must be the scenario's {key}",
        )
    label = f"calibration file {str(calibration)!r}: {fit.label()}"
    if constants is not None:
        label += f"; on kernel constants {constants.source}"
    return apply_fit(scenario, fit, label)


def node_kind(cluster: ClusterSpec) -> str:
    """What a calibration calls the cluster's node: its preset's name, or "custom"."""
    return cluster.node or "custom"


def apply_fit(scenario: Scenario, fit: MeasuredFit, label: str | None = None) -> Scenario:
    """The scenario with a fit on measured iterations applied (scenario/fitted.py): its
    GEMM and memory fractions (and the FP8 GEMMs') and the cluster's NVLink and NIC
    fractions multiplied, each capped at 1 (the fit's bounds keep them under it on the
    GPU and node it was made on; a scenario that sets a fraction itself may reach it),
    the fit kept on the scenario for the attention multiplier, the host overhead and
    the reports; ``label`` (default: the constants' own) is what the run summary and
    metrics.json say of the kernel constants. The identity fit changes no number."""
    base = scenario.kernel_constants
    constants = replace(
        base,
        gemm_efficiency=min(1.0, base.gemm_efficiency * fit.gemm),
        memory_efficiency=min(1.0, base.memory_efficiency * fit.memory),
        source=base.source if label is None else label,
    )
    cluster = scenario.cluster
    gpu = cluster.gpu
    if gpu.fp8_kernels is not None and fit.gemm != 1.0:
        fp8 = gpu.fp8_kernels
        gpu = replace(
            gpu,
            fp8_kernels=replace(
                fp8,
                gemm_efficiency=min(1.0, fp8.gemm_efficiency * fit.gemm),
                fast_accum_gemm_efficiency=min(1.0, fp8.fast_accum_gemm_efficiency * fit.gemm),
            ),
        )
    cluster = fitted_network(replace(cluster, gpu=gpu), fit)
    return replace(scenario, cluster=cluster, calibration=constants, measured=fit)


def fitted_network(cluster: ClusterSpec, fit: MeasuredFit) -> ClusterSpec:
    """The cluster with a fit's network parameters applied: its NVLink and NIC fractions
    multiplied (each capped at 1) and the latencies a fit on nccl-tests logs set in place
    of its own (LATENCIES; None keeps the cluster's)."""
    latencies: dict[str, Any] = {}
    for name, la in LATENCIES.items():
        value = fit.latency_us(name)
        if value is not None:
            latencies[la.replaces.removeprefix("cluster.")] = value
    return replace(
        cluster,
        nvlink_efficiency=min(1.0, cluster.nvlink_efficiency * fit.nvlink),
        nic_efficiency=min(1.0, cluster.nic_efficiency * fit.nic),
        **latencies,
    )


def parse_override(item: str) -> tuple[str, str, Any]:
    """Split ``section.key=value`` into (section, key, value); value parsed as TOML."""
    target, sep, text = item.partition("=")
    target = target.strip()
    if not sep or not target:
        raise ScenarioError(f"--set {_shown(item)!r} must look like section.key=value")
    section, dot, key = target.partition(".")
    if not dot:
        section, key = "", target
    if section in schema.ARRAYS:
        raise ScenarioError(
            f"--set {_shown(target)}: [[{section}]] tables are not set from the command line; "
            f"write them in the scenario file (scenarios/README.md)"
        )
    if section and section not in schema.SECTIONS:
        raise ScenarioError(
            f"--set {_shown(target)}: unknown section {_shown(section)!r}; "
            + (did_you_mean(section, schema.SECTIONS) or f"known: {_known(schema.SECTIONS)}")
        )
    if "." in key:  # no key has a dot; say so before a long dotted key is stored
        raise ScenarioError(f"--set {_shown(target)}: unknown key; keys are section.key")
    if "\n" in text or "\r" in text:  # TOML would read the first line and drop the rest
        raise ScenarioError(
            f"--set {_shown(target)}: the value holds a line break; give one value on one line"
        )
    return section, key, parse_value(text.strip(), f"--set {_shown(target)}")


def _shown(text: str, most: int = 80) -> str:
    """What the user typed, cut short for a one-line message."""
    return text if len(text) <= most else text[: most - 3] + "..."


def apply_override(raw: dict[str, Any], item: str) -> None:
    section, key, value = parse_override(item)
    if not section:
        raw[key] = value
        return
    table = raw.setdefault(section, {})
    if not isinstance(table, dict):
        raise ScenarioError(f"--set {section}.{key}: [{section}] is not a table in the file")
    table[key] = value


def apply_hf_config(raw: dict[str, Any], path: str | Path) -> None:
    """``--hf-config PATH``: the model of the Hugging Face config.json at PATH (relative
    to the working folder, as a command-line path is) in place of the file's: its
    model.preset or hf_config and the [model] keys the config gives are dropped, its
    other [model] keys (seq_length, routing, ...) stay, and so does the seq_length of
    a preset it replaces (the training length, which no config.json gives); --set,
    applied after, wins."""
    table = raw.setdefault("model", {})
    if not isinstance(table, dict):
        raise ScenarioError("--hf-config: [model] is not a table in the scenario file")
    written = str(Path(path).absolute())
    given = hfconfig.model_keys(Path(written), f"--hf-config {str(path)!r}")
    preset = table.get("preset")
    if isinstance(preset, str) and preset in presets.MODELS:
        table.setdefault("seq_length", presets.MODELS[preset]["seq_length"])
    for key in ("preset", *given):
        table.pop(key, None)
    table["hf_config"] = written


def scenario_from_dict(raw: Mapping[str, Any], base_dir: Path | None = None) -> Scenario:
    """Validate a parsed TOML document and build the frozen Scenario. A relative
    ``training.schedule_file`` is read from ``base_dir`` (the scenario's folder)."""
    allowed_top = {*schema.keys()[schema.TOP_LEVEL], *schema.SECTIONS, *schema.ARRAYS}
    for key in raw:
        if key not in allowed_top:
            raise ScenarioError(
                f"unknown key {_shown(key)!r} at top level; " + _unknown_hint(key, "", allowed_top)
            )
    name = raw.get("name")
    rules.check_name(name)  # first, as Scenario runs it only once the sections are built
    assert isinstance(name, str)  # check_name refused anything else
    tables = {}
    for section in schema.SECTIONS:
        table = raw.get(section, {})
        if not isinstance(table, Mapping):
            raise ScenarioError(f"{section}={table!r} must be a table [{section}]")
        tables[section] = _check_table(section, table)

    model = _build_model(tables["model"], base_dir)
    cluster = _build_cluster(tables["cluster"])
    untie = model.untie_embeddings_and_output_weights
    if untie is not None:  # the model's key is the source of truth (rules.check_tied_embeddings)
        tables["training"].setdefault("share_embeddings_and_output_weights", not untie)
    if tables["training"].get("use_distributed_optimizer") is True:  # Megatron-Core's switch
        tables["training"].setdefault("data_parallel_sharding", SHARD_OPTIMIZER)
    tables["training"].setdefault("params_dtype", default_params_dtype(cluster, tables["training"]))
    training = _build_training(tables["training"], base_dir)
    parallel = _build_parallel(tables["parallel"], model, cluster, training)
    _require("network", tables["network"])
    network = NetworkConfig(**tables["network"])
    perturbations = _build_perturbations(raw.get(PERTURBATION, []))
    try:
        return Scenario(
            name=name,
            model=model,
            cluster=cluster,
            parallel=parallel,
            training=training,
            network=network,
            perturbations=perturbations,
        )
    except ScenarioError as exc:
        written = tables["training"].get("schedule_file")
        if exc.key == "training.schedule_file" and written != training.schedule_file:
            # the file's rules name the resolved path; the user wrote this one
            raise ScenarioError(key=exc.key, value=written, rule=exc.rule) from None
        raise


def _build_perturbations(tables: Any) -> tuple[PerturbationSpec, ...]:
    """The [[perturbation]] tables, in file order; an error names which one."""
    if not isinstance(tables, list) or not all(isinstance(t, Mapping) for t in tables):
        raise ScenarioError(
            f"{PERTURBATION} must be written as [[{PERTURBATION}]] tables, one per perturbation"
        )
    built = []
    for i, table in enumerate(tables):
        try:
            _require(PERTURBATION, _check_table(PERTURBATION, table))
            built.append(PerturbationSpec(**table))
        except ScenarioError as exc:
            raise ScenarioError(
                f"{where(i)}: {exc}", key=exc.key, value=exc.value, rule=exc.rule, fix=exc.fix
            ) from None
    return tuple(built)


def _known(keys: Iterable[str]) -> str:
    return ", ".join(sorted(keys))


def _check_table(section: str, table: Mapping[str, Any]) -> dict[str, Any]:
    known = schema.keys()[section]
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key not in known:
            raise ScenarioError(
                f"unknown key {_shown(f'{section}.{key}')!r}; " + _unknown_hint(key, section, known)
            )
        out[key] = check_value(known[key], value)
    return out


def _unknown_hint(key: str, section: str, known: Iterable[str]) -> str:
    """What to say of an unknown key: the section that holds it, if another does (a
    scenario section's key given at the top level or in the wrong section); else its
    close matches in its own table; else its close matches in the other sections; else
    the table's keys."""
    others = schema.SECTIONS if section in (schema.TOP_LEVEL, *schema.SECTIONS) else {}
    holders = [s for s in others if s != section and key in schema.keys()[s]]
    if holders:
        where = " or ".join(f"[{s}] ({s}.{key})" for s in holders)
        return f"it belongs in {where}"
    hint = did_you_mean(key, known, prefix=f"{section}." if section else "")
    for other in others:
        if not hint and other != section:
            hint = did_you_mean(key, schema.keys()[other], prefix=f"{other}.")
    if hint:
        return hint
    table = f"[{section}]" if section else "the top level"
    return f"known in {table}: {_known(known)}"


def _with_preset(section: str, table: dict[str, Any], named: Mapping[str, Mapping]) -> dict:
    """The section's keys: its preset's values (if it names one), then the table's;
    a ScenarioError names the first required key that neither gives."""
    preset_key = schema.PRESET_KEYS[section]
    preset = table.get(preset_key)
    values: dict[str, Any] = {preset_key: preset}
    if preset is not None:
        values.update(named[preset])
    values.update({k: v for k, v in table.items() if k != preset_key})
    _require(section, values)
    return values


def _require(section: str, values: Mapping[str, Any]) -> None:
    """A ScenarioError naming the first key the spec requires (`schema.Key.required`)
    that ``values`` lacks; for a key a preset may fill, where to set the preset."""
    for key in schema.keys()[section].values():
        if key.required and key.name not in values:
            hint = schema.PRESET_HINTS[section] if key.preset else ""
            raise ScenarioError(f"missing key {key.full_name}{hint}")


def _relative_to(written: str, base_dir: Path | None) -> Path:
    """A path a scenario names, relative to its folder (``base_dir``) unless absolute."""
    path = Path(written)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return path


def _with_hf_config(table: dict[str, Any], base_dir: Path | None) -> dict[str, Any]:
    """The [model] table with its ``hf_config`` read (hfconfig.py): the config's keys,
    then the table's, which win; the path resolved. A preset as well is refused (two
    sources of every key), and so is a missing seq_length, which no config.json gives."""
    written = table.get("hf_config")
    if written is None:
        return table
    if table.get("preset") is not None:
        raise ScenarioError(
            f"model.hf_config={written!r} and model.preset={table['preset']!r} both fill "
            "[model]; give one (the table's own keys override either)",
            key="model.hf_config",
            value=written,
            rule="not with model.preset",
        )
    path = _relative_to(written, base_dir)
    name = f"model.hf_config={written!r}"
    values = {**hfconfig.model_keys(path, name), **table, "hf_config": str(path.resolve())}
    if "seq_length" not in values:
        raise ScenarioError(
            f"missing key model.seq_length: {name} gives the model, not the sequence length "
            "it is trained on (a config.json's max_position_embeddings is the longest it "
            "takes); set [model] seq_length or --set model.seq_length=N",
            key="model.seq_length",
            rule="required with model.hf_config",
        )
    return values


def _build_model(table: dict[str, Any], base_dir: Path | None = None) -> ModelSpec:
    """The model spec; a Hugging Face config.json and a routing shares file are read
    here, their paths resolved."""
    values = _with_preset("model", _with_hf_config(table, base_dir), presets.MODELS)
    written = values.get("moe_routing_shares_file")
    if written is not None:
        path = _relative_to(written, base_dir)
        name = f"model.moe_routing_shares_file={written!r}"
        values["moe_routing_shares"] = read_shares_file(path, name)
        values["moe_routing_shares_file"] = str(path.resolve())
    values.setdefault("ffn_hidden_size", 4 * values["hidden_size"])  # the GPT shape
    return ModelSpec(**values)


def _build_cluster(table: dict[str, Any]) -> ClusterSpec:
    values = _with_preset("cluster", table, presets.NODES)
    return ClusterSpec(**{**values, "gpu": presets.GPUS[values["gpu"]]})


def default_params_dtype(cluster: ClusterSpec, training: Mapping[str, Any]) -> str:
    """``training.params_dtype`` when the file leaves it out: bf16 where the GPU has it
    (compute capability 8.0, the A100, and newer) and the software is today's
    Megatron-Core (``frameworks.BF16_DEFAULT_VERSIONS``); fp16 otherwise, as the
    older versions' scripts ran."""
    framework = training.get("framework", frameworks.MEGATRON)
    version = training.get("framework_version")
    if not isinstance(framework, str) or framework not in frameworks.DEFAULT_VERSION:
        return "fp16"  # the framework's own rule names the bad value
    if version is None:
        version = frameworks.DEFAULT_VERSION[framework]
    modern = framework == frameworks.MEGATRON and version in frameworks.BF16_DEFAULT_VERSIONS
    return "bf16" if modern and cluster.gpu.compute_capability >= (8, 0) else "fp16"


def _build_training(table: dict[str, Any], base_dir: Path | None) -> TrainingConfig:
    """The training spec; a custom schedule's file is read and checked here (a file
    given for a named schedule is left to the spec's rule, which refuses it)."""
    values = dict(table)
    written = table.get("schedule_file")
    if table.get("schedule") == rules.CUSTOM and written is not None:
        path = Path(written)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        placement = table.get("schedule_placement")
        where = f"training.schedule_file={written!r}"
        orders, placement = read_schedule_file(path, where, placement)
        if placement != LOOPED:  # a torch CSV's stages can fix it
            values["schedule_placement"] = placement
        values["schedule_file"] = str(path.resolve())
        values["custom_orders"] = tuple(tuple(order) for order in orders)
    _require("training", values)
    return TrainingConfig(**values)


def _build_parallel(
    table: dict[str, Any], model: ModelSpec, cluster: ClusterSpec, training: TrainingConfig
) -> ParallelConfig:
    """The parallel spec with its derived defaults: the chunks a schedule needs (a
    custom file's count, two for a chunked named schedule) and the data-parallel size
    that fills the cluster."""
    values = dict(table)
    _require("parallel", values)
    if "virtual_pipeline_model_parallel_size" not in values:
        values["virtual_pipeline_model_parallel_size"] = default_chunks(training)
    if "data_parallel_size" not in values:
        probe = ParallelConfig(**{**values, "data_parallel_size": 1})
        model_gpus = probe.tensor_model_parallel_size * probe.pipeline_model_parallel_size
        model_gpus *= probe.cp_size
        if cluster.num_gpus % model_gpus:
            rules.check_model_split(model, probe)  # its errors come first, as when set
            raise ScenarioError(
                f"cluster GPUs={cluster.num_gpus} (num_nodes x gpus_per_node) must be a multiple "
                f"of tensor x pipeline parallel size={model_gpus} to derive "
                f"parallel.data_parallel_size; set it explicitly or change the sizes",
                key="parallel.data_parallel_size",
                rule="derived from the cluster's GPUs / (tensor x pipeline parallel size)",
                fix="set it explicitly or change the sizes",
            )
        values["data_parallel_size"] = cluster.num_gpus // model_gpus
    return ParallelConfig(**values)


def default_chunks(training: TrainingConfig) -> int:
    """Chunks per rank when the scenario does not say: a custom file's count; two for a
    chunked named schedule (ZB-V runs exactly two); one otherwise."""
    if training.custom_orders is not None:
        return sizes_of(training.custom_orders)[2]
    info = SCHEDULE_INFO.get(training.schedule)
    return 2 if info is not None and info.chunked else 1


# --- back to TOML -----------------------------------------------------------------------


def scenario_to_dict(scenario: Scenario) -> dict[str, Any]:
    """Every key with its resolved value, in the schema's order (keys whose value is
    None are left out): loading this gives the same Scenario."""

    def table(spec: object, section: str) -> dict[str, Any]:
        values = {name: _file_value(getattr(spec, name)) for name in schema.keys()[section]}
        if isinstance(spec, TrainingConfig):  # the framework's mechanism keys as resolved
            values.update(spec.resolved)
        return {k: v for k, v in values.items() if v is not None}

    top = table(scenario, schema.TOP_LEVEL)
    doc = {**top, **{s: table(getattr(scenario, s), s) for s in schema.SECTIONS}}
    if scenario.perturbations:  # absent when there are none: clean runs' files stay as they were
        doc[PERTURBATION] = [p.given() for p in scenario.perturbations]
    return doc


def _file_value(value: Any) -> Any:
    """A spec's value as the file writes it: a GPU by its preset name."""
    return value.name if isinstance(value, GpuSpec) else value


def dumps_toml(doc: Mapping[str, Any]) -> str:
    """A small TOML writer for flat tables (and arrays of them) of str, int, float, bool."""
    lines = []
    for key, value in doc.items():
        if not isinstance(value, Mapping | list):
            lines.append(f"{key} = {_toml_value(value)}")
    for key, value in doc.items():
        if isinstance(value, Mapping):
            lines.append("")
            lines.append(f"[{key}]")
            lines.extend(f"{k} = {_toml_value(v)}" for k, v in value.items())
    for key, value in doc.items():
        if isinstance(value, list):  # an array of tables
            for item in value:
                lines.append("")
                lines.append(f"[[{key}]]")
                lines.extend(f"{k} = {_toml_value(v)}" for k, v in item.items())
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


def cluster_of_table(table: Mapping[str, Any]) -> ClusterSpec:
    """A ``[cluster]`` table checked and built as a scenario's is (a jobs file's shared
    cluster)."""
    return _build_cluster(_check_table("cluster", table))
