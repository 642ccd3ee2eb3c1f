"""The scenario: its schema (frozen specs), presets, rules, and the files it is read
from and written to. Other packages import the scenario API from here."""

from .loader import (
    MAX_SIMULATED_OPS,
    apply_override,
    dumps_toml,
    load_scenario,
    parse_override,
    read_calibration,
    read_schedule_file,
    read_search_journal,
    read_validation_set,
    scenario_from_dict,
    scenario_to_dict,
)
from .spec import (
    ClusterSpec,
    GpuSpec,
    KernelConstants,
    ModelSpec,
    NetworkConfig,
    ParallelConfig,
    Scenario,
    ScenarioError,
    TrainingConfig,
)

__all__ = [
    "MAX_SIMULATED_OPS",
    "ClusterSpec",
    "GpuSpec",
    "KernelConstants",
    "ModelSpec",
    "NetworkConfig",
    "ParallelConfig",
    "Scenario",
    "ScenarioError",
    "TrainingConfig",
    "apply_override",
    "dumps_toml",
    "load_scenario",
    "parse_override",
    "read_calibration",
    "read_schedule_file",
    "read_search_journal",
    "read_validation_set",
    "scenario_from_dict",
    "scenario_to_dict",
]
