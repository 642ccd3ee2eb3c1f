"""The rules run on every Scenario built, in Python as from a file, with the same
one-line errors; planning edits scenarios with dataclasses.replace under them."""

import re
import subprocess
import sys
from dataclasses import replace

import pytest

from simulator.plan import planning, questions
from simulator.scenario import ScenarioError, check_scenario, load_scenario
from simulator.scenario.presets import GPUS

TINY = "scenarios/tiny-2gpu.toml"


def _cli_error(*overrides: str) -> str:
    """The one line `stepsim run TINY --set ...` prints, without its prefix."""
    args = [x for item in overrides for x in ("--set", item)]
    proc = subprocess.run(
        [sys.executable, "-m", "simulator.cli", "run", TINY, *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    return line.removeprefix("stepsim: error: ")


def test_a_bad_layout_built_in_python_raises_the_line_the_cli_prints():
    base = load_scenario(TINY)
    with pytest.raises(
        ScenarioError, match=r"^parallel\.tensor_model_parallel_size=3 must divide"
    ) as err:
        replace(base, parallel=replace(base.parallel, tensor_model_parallel_size=3))
    assert str(err.value) == _cli_error("parallel.tensor_model_parallel_size=3")
    assert str(err.value) == (
        "parallel.tensor_model_parallel_size=3 must divide model.num_attention_heads=16"
    )
    assert err.value.key == "parallel.tensor_model_parallel_size"
    assert err.value.value == 3
    assert err.value.rule == "must divide model.num_attention_heads=16"


@pytest.mark.parametrize(
    ("section", "changes", "override"),
    [
        ("cluster", {"num_nodes": 0}, "cluster.num_nodes=0"),
        ("cluster", {"nics_per_node": 3}, "cluster.nics_per_node=3"),
        ("training", {"global_batch_size": 15}, "training.global_batch_size=15"),
        (
            "parallel",
            {"virtual_pipeline_model_parallel_size": 2},
            "parallel.virtual_pipeline_model_parallel_size=2",
        ),
        ("network", {"model": "exact"}, "network.model=exact"),
    ],
)
def test_every_kind_of_rule_fails_alike_in_python_and_on_the_command_line(
    section, changes, override
):
    base = load_scenario(TINY)
    with pytest.raises(ScenarioError, match="^" + re.escape(override.split("=")[0] + "=")) as err:
        replace(base, **{section: replace(getattr(base, section), **changes)})
    assert str(err.value) == _cli_error(override)


def test_error_parts_make_the_line():
    err = ScenarioError(key="a.b", value="x", rule="must be y", fix="set z")
    assert str(err) == "a.b='x' must be y; set z"
    assert (err.key, err.value, err.rule, err.fix) == ("a.b", "x", "must be y", "set z")
    assert str(ScenarioError("as written")) == "as written"


def test_check_scenario_passes_what_the_loader_built():
    check_scenario(load_scenario(TINY))  # raises nothing


def _custom_tiny() -> str:
    """The tiny scenario on a custom schedule read from orders.txt beside it."""
    with open(TINY, encoding="utf-8") as f:
        text = f.read()
    return text.replace('schedule = "1f1b"', 'schedule = "custom"\nschedule_file = "orders.txt"')


def test_planning_edits_keep_the_calibration_and_the_custom_orders(tmp_path):
    """Edits are dataclasses.replace, not a TOML round trip: the kernel constants stay
    and a custom schedule's orders are not read from disk again."""
    orders = tmp_path / "orders.txt"
    orders.write_text("F0 F1 B0 B1\nF0 B0 F1 B1\n")
    path = tmp_path / "s.toml"
    path.write_text(_custom_tiny().replace("global_batch_size = 16", "global_batch_size = 4"))
    calibration = replace(GPUS["a100-sxm4-80gb"].kernels, source="test")
    base = replace(load_scenario(path), calibration=calibration)
    orders.unlink()  # an edit that read the file again would fail now
    (one, scaled, why), *_ = questions.scale_scenarios(base, [1], "global-batch")
    assert why == "" and scaled.training.custom_orders == base.training.custom_orders
    assert scaled.calibration is calibration
    for edited in (planning.with_nodes(base, 2), planning.with_model(base, "m", 4, 512, 8)):
        assert edited.calibration is calibration
        assert edited.training.schedule == "1f1b"
        assert edited.training.custom_orders is None and edited.training.schedule_file is None
        assert edited.parallel.num_gpus == 1
    assert planning.with_model(base, "m", 4, 512, 8).model.ffn_hidden_size == 2048


def test_a_custom_file_that_does_not_fit_is_named_as_written(tmp_path):
    (tmp_path / "orders.txt").write_text("F0 B0\nF0 B0\nF0 B0\n")
    path = tmp_path / "s.toml"
    path.write_text(_custom_tiny())
    with pytest.raises(ScenarioError, match="schedule_file='orders.txt' has 3 ranks") as err:
        load_scenario(path)
    assert str(err.value) == (
        "training.schedule_file='orders.txt' has 3 ranks but "
        "parallel.pipeline_model_parallel_size=2"
    )
