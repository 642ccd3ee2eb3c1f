"""The scenario: its schema (frozen specs, spec.py, read back by schema.py), presets,
the rules across keys (rules.py), and the files it is read from and written to
(loader.py: the scenario's TOML and overrides; files.py: the other files it refers
to). Other packages import the scenario API from here."""

from . import frameworks
from .files import (
    read_calibration,
    read_schedule_file,
    read_validation_set,
    scenario_path,
    shipped_dir,
    shipped_scenarios,
)
from .gpu import GpuSpec, KernelConstants
from .journal import read_search_journal
from .limits import LIMITS, limit
from .limits import check as check_limit
from .loader import (
    apply_override,
    dumps_toml,
    load_scenario,
    parse_override,
    scenario_from_dict,
    scenario_to_dict,
)
from .rules import check_scenario
from .spec import (
    ClusterSpec,
    ModelSpec,
    NetworkConfig,
    ParallelConfig,
    Scenario,
    ScenarioError,
    TrainingConfig,
)

__all__ = [
    "LIMITS",
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
    "check_limit",
    "check_scenario",
    "dumps_toml",
    "frameworks",
    "limit",
    "load_scenario",
    "parse_override",
    "read_calibration",
    "read_schedule_file",
    "read_search_journal",
    "read_validation_set",
    "scenario_from_dict",
    "scenario_path",
    "scenario_to_dict",
    "shipped_dir",
    "shipped_scenarios",
]
