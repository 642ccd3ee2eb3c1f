"""Memory per GPU by hand, and layouts that do not fit."""

import pytest

from stepsim.cli import main
from stepsim.cost.memory import WORKSPACE_BYTES, activation_bytes_per_layer, out_of_memory
from stepsim.run.iteration import memory_per_stage
from tests.helpers import load

BIG = [
    "--set",
    "model.hidden_size=16384",
    "--set",
    "model.num_attention_heads=128",
    "--set",
    "model.num_layers=32",
]


def test_selective_recompute_with_sequence_parallel_keeps_34_sbh_over_t():
    """Korthikanti et al. 2022, Table 2: selective recomputation + SP: s b h 34 / t."""
    s = load(
        parallel={
            "tensor_model_parallel_size": 4,
            "sequence_parallel": True,
            "data_parallel_size": 2,
        },
        training={"recompute_granularity": "selective"},
    )
    assert activation_bytes_per_layer(s) == 1024 * 1 * 1024 * 34 / 4


def test_total_is_the_parts_plus_the_workspace():
    s = load(parallel={"pipeline_model_parallel_size": 2}, training={"global_batch_size": 8})
    for stage in memory_per_stage(s):
        parts = stage.as_gib()
        assert parts["workspace"] == WORKSPACE_BYTES / 2**30 == 2.0
        assert stage.total_bytes == pytest.approx(
            stage.weights_bytes
            + stage.gradients_bytes
            + stage.optimizer_bytes
            + stage.activations_bytes
            + WORKSPACE_BYTES
        )
    assert out_of_memory(s, memory_per_stage(s)) is None


def test_a_layout_that_does_not_fit_is_an_error_naming_the_stage(capsys):
    assert main(["run", "scenarios/tiny-2gpu.toml", *BIG]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "out of memory: pipeline stage 0 needs" in err and "GiB over" in err
    assert "2 of 2 stages do not fit" in err and "--allow-oom" in err


def test_allow_oom_simulates_with_a_warning(capsys):
    assert main(["run", "scenarios/tiny-2gpu.toml", *BIG, "--allow-oom"]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith("warning: out of memory")
    assert "WARNING: out of memory" in captured.out


def test_a_sweep_marks_the_points_that_do_not_fit(capsys):
    assert (
        main(
            [
                "sweep",
                "scenarios/tiny-2gpu.toml",
                "--set",
                "model.num_layers=4,32",
                "--set",
                "model.hidden_size=16384",
                "--set",
                "model.num_attention_heads=128",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.count(" OOM\n") == 2 and "OOM: does not fit" in out


def test_the_allow_oom_hint_is_a_field_of_its_own(capsys):
    """run's line is the memory model's problem, then its --allow-oom hint; plan's is
    the problem alone (no string surgery on run's line)."""
    from stepsim.plan.questions import check_fits
    from stepsim.scenario import ScenarioError

    s = load(model={"hidden_size": 16384, "num_attention_heads": 128, "num_layers": 32})
    problem = out_of_memory(s, memory_per_stage(s))
    assert problem.override == "--allow-oom simulates it anyway"
    assert problem.problem.startswith("out of memory: pipeline stage 0 needs")
    assert problem.problem.endswith("a sharded optimizer would help")
    assert str(problem) == f"{problem.problem}; {problem.override}"
    with pytest.raises(ScenarioError, match=r"would help$") as err:
        check_fits(s)
    assert str(err.value) == problem.problem
    assert main(["run", "scenarios/tiny-2gpu.toml", *BIG]) == 2
    line = capsys.readouterr().err.strip()
    assert line.endswith("would help; --allow-oom simulates it anyway")


def test_sharding_takes_effect_with_more_than_one_replica_only():
    """One decision for the memory model and the search's bound: ZeRO-1 and FSDP shard
    the optimizer over D replicas; with D = 1 there is nothing to shard over."""
    from stepsim.cost.memory import optimizer_sharded, sharding_of

    two = {"cluster": {"num_nodes": 1, "gpus_per_node": 2, "nics_per_node": 1}}
    for sharding, sharded in (("none", False), ("optimizer", True), ("full", True)):
        training = {"data_parallel_sharding": sharding}
        one = load(**two, training=training)
        assert (sharding_of(one), optimizer_sharded(one)) == ("none", False)
        dp2 = load(**two, parallel={"data_parallel_size": 2}, training=training)
        assert (sharding_of(dp2), optimizer_sharded(dp2)) == (sharding, sharded)
        (replicated,) = memory_per_stage(load(**two, parallel={"data_parallel_size": 2}))
        (mine,) = memory_per_stage(dp2)
        halved = replicated.optimizer_bytes / 2 if sharded else replicated.optimizer_bytes
        assert mine.optimizer_bytes == halved
