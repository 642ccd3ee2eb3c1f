"""The rules run on every Scenario built, in Python as from a file, with the same
one-line errors; planning edits scenarios with dataclasses.replace under them."""

import copy
import re
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from stepsim.plan import planning, questions
from stepsim.scenario import ScenarioError, check_scenario, load_scenario, rules
from stepsim.scenario.presets import GPUS
from stepsim.schedules import Step
from tests.helpers import cli_error

TINY = "scenarios/tiny-2gpu.toml"


def _cli_error(*overrides: str, path: str | Path = TINY, args: tuple[str, ...] = ()) -> str:
    """The one line `stepsim run PATH --set ...` prints, without its prefix."""
    return cli_error(path, *args, *(x for item in overrides for x in ("--set", item)))


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


SHIPPED = sorted(str(p) for p in Path("scenarios").glob("*.toml"))


def test_check_scenario_is_the_check_every_scenario_runs(monkeypatch):
    """check_scenario passes every shipped scenario and refuses one whose layout was
    swapped behind the constructor's back; and building a Scenario is what runs it."""
    for path in SHIPPED:
        check_scenario(load_scenario(path))  # raises nothing
    base = load_scenario(TINY)
    tampered = copy.copy(base)  # no __post_init__: the rules have not seen it
    object.__setattr__(tampered, "parallel", replace(base.parallel, data_parallel_size=2))
    with pytest.raises(ScenarioError, match=r"^parallel\.data_parallel_size=2 asks for") as err:
        check_scenario(tampered)
    assert err.value.key == "parallel.data_parallel_size"

    def refuse(*specs):
        raise ScenarioError(key="training.global_batch_size", value=0, rule="refused by test")

    monkeypatch.setattr(rules, "check_size", refuse)
    with pytest.raises(ScenarioError, match="refused by test"):
        load_scenario(TINY)
    with pytest.raises(ScenarioError, match="refused by test"):
        replace(base, name="edited")


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


# -- what only the loader used to check, now rules every Scenario runs ------------------


def _custom_scenario(tmp_path, orders: str = "F0 F1 B0 B1\nF0 B0 F1 B1\n") -> Path:
    """The tiny scenario, 4 micro-batches on a custom schedule read from orders.txt."""
    (tmp_path / "orders.txt").write_text(orders)
    path = tmp_path / "s.toml"
    path.write_text(_custom_tiny().replace("global_batch_size = 16", "global_batch_size = 4"))
    return path


def test_custom_orders_with_a_named_schedule_are_refused():
    base = load_scenario(TINY)
    orders = ((Step("F", 0, 0), Step("B", 0, 0)),) * 2
    with pytest.raises(ScenarioError, match=r"^training\.schedule='1f1b' must be 'custom'") as err:
        replace(base, training=replace(base.training, custom_orders=orders))
    assert (err.value.key, err.value.value) == ("training.schedule", "1f1b")


def test_custom_orders_built_in_python_are_checked_as_a_file_is(tmp_path):
    base = load_scenario(_custom_scenario(tmp_path))
    file = base.training.schedule_file
    # no ops at all: the schedule file's rule, not max() of an empty sequence
    with pytest.raises(ScenarioError, match=r": no op orders found") as err:
        replace(base, training=replace(base.training, custom_orders=((), ())))
    assert (err.value.key, err.value.value) == ("training.schedule_file", file)
    (tmp_path / "orders.txt").write_text("# nothing here\n")
    cli = _cli_error(path=tmp_path / "s.toml")
    assert cli == f"training.schedule_file='orders.txt': {err.value.rule}"
    assert str(err.value) == f"training.schedule_file={file!r}: {err.value.rule}"
    # a backward before its forward on rank 1
    rank_1 = (Step("B", 0, 0), Step("F", 0, 0), Step("F", 1, 0), Step("B", 1, 0))
    swapped = (base.training.custom_orders[0], rank_1)
    with pytest.raises(ScenarioError, match=r": rank 1: B0 ") as err:
        replace(base, training=replace(base.training, custom_orders=swapped))
    (tmp_path / "orders.txt").write_text("F0 F1 B0 B1\nB0 F0 F1 B1\n")
    assert _cli_error(path=tmp_path / "s.toml").endswith(err.value.rule)


def test_the_name_is_checked_in_python_as_in_the_file():
    base = load_scenario(TINY)
    for name in ("", None, 7):
        with pytest.raises(ScenarioError, match=r"^name=.* must be a non-empty string$") as err:
            replace(base, name=name)
        assert (err.value.key, err.value.value) == ("name", name)
    with pytest.raises(ScenarioError) as err:
        replace(base, name="")
    assert str(err.value) == _cli_error('name=""') == "name='' must be a non-empty string"


def test_a_gpu_given_by_name_in_python_is_refused():
    """A file names the GPU preset; a spec holds the record (it used to be accepted and
    fail later with an AttributeError)."""
    base = load_scenario(TINY)
    with pytest.raises(ScenarioError, match=r"^cluster\.gpu='a100-sxm4-80gb' must be a GpuSpec"):
        replace(base, cluster=replace(base.cluster, gpu="a100-sxm4-80gb"))


def test_a_calibration_for_another_gpu_is_refused_in_python_and_from_a_file(tmp_path):
    base = load_scenario(TINY)  # on an A100
    v100 = GPUS["v100-sxm2-32gb"].kernels
    with pytest.raises(ScenarioError, match=r"^calibration\.gpu='v100-sxm2-32gb' must be") as err:
        replace(base, calibration=v100)
    assert err.value.rule.startswith("must be the scenario's cluster.gpu='a100-sxm4-80gb'")
    replace(base, calibration=GPUS["a100-sxm4-80gb"].kernels)  # its own GPU's: fine
    file = tmp_path / "v100.toml"
    lines = [f"{k} = {v!r}" for k, v in asdict(v100).items()]
    file.write_text("[constants]\n" + "\n".join(lines).replace("'", '"') + "\n")
    line = _cli_error(args=("--calibration", str(file)))
    assert line == (
        f"calibration file {str(file)!r} has gpu='v100-sxm2-32gb' but the scenario "
        "runs on cluster.gpu='a100-sxm4-80gb'"
    )
    with pytest.raises(ScenarioError) as from_file:
        load_scenario(TINY, calibration=file)
    assert (from_file.value.key, from_file.value.rule) == (err.value.key, err.value.rule)


def test_kernel_constants_out_of_range_are_refused_in_python_as_in_a_file(tmp_path):
    a100 = GPUS["a100-sxm4-80gb"].kernels
    with pytest.raises(ScenarioError, match=r"^calibration\.gemm_efficiency=1\.5 must be") as err:
        replace(a100, gemm_efficiency=1.5)
    assert err.value.rule == "must be between 0.01 and 1"
    with pytest.raises(ScenarioError, match=r"^calibration\.num_sms='108' must be a number$"):
        replace(a100, num_sms="108")
    file = tmp_path / "a100.toml"
    lines = [f"{k} = {v!r}" for k, v in asdict(replace(a100, source="test")).items()]
    text = "[constants]\n" + "\n".join(lines).replace("'", '"') + "\n"
    bad = text.replace(f"gemm_efficiency = {a100.gemm_efficiency!r}", "gemm_efficiency = 1.5")
    assert bad != text
    file.write_text(bad)
    line = _cli_error(args=("--calibration", str(file)))
    assert line == f"constants.gemm_efficiency=1.5 {err.value.rule} (in {str(file)!r})"
