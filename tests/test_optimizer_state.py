"""Megatron-Core's precision-aware optimizer: the bytes Adam keeps and moves per
parameter by the dtypes of its state (cost/optimizer.py), by hand."""

import pytest

from stepsim.cost.optimizer import state_bytes_per_param, step_bytes_per_param
from stepsim.run.iteration import memory_per_stage
from stepsim.scenario import ScenarioError
from tests.helpers import load

TODAY = {"framework_version": "2025", "params_dtype": "bf16", "data_parallel_sharding": "optimizer"}
TWO = {"cluster": {"num_nodes": 1, "gpus_per_node": 2, "nics_per_node": 1}}


def _aware(**training):
    return load(
        **TWO,
        parallel={"data_parallel_size": 2},
        training={**TODAY, "use_precision_aware_optimizer": True, **training},
    )


def test_the_default_state_is_12_bytes_and_the_step_moves_32():
    t = load(**TWO, parallel={"data_parallel_size": 2}, training=TODAY).training
    assert state_bytes_per_param(t) == 12 and step_bytes_per_param(t) == 32


@pytest.mark.parametrize(
    "training, state, step",
    [
        # bf16 weights, fp32 master weights as 16-bit remainders, fp32 moments:
        # 2 + 4 + 4; the step reads and writes it, reads the 4-byte gradient, reads and
        # writes the bf16 weights, zeroes the gradient: 2 x 10 + 4 + 2 x 2 + 2
        ({}, 10, 30),
        # DeepSeek-V3's bf16 moments: 2 + 2 + 2
        ({"exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}, 6, 22),
        # without remainders the master weights are fp32 again: 4 + 2 + 2; weights written
        (
            {"exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16", "store_param_remainders": False},
            8,
            16 + 4 + 2 + 2,
        ),
        # fp8 moments: 2 + 1 + 1
        ({"exp_avg_dtype": "fp8", "exp_avg_sq_dtype": "fp8"}, 4, 8 + 4 + 4 + 2),
        # bf16 main gradients: read in 2 bytes, accumulated in bf16
        (
            {"main_grads_dtype": "bf16", "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"},
            6,
            12 + 2 + 4 + 2,
        ),
    ],
)
def test_state_and_step_bytes_by_hand(training, state, step):
    t = _aware(**training).training
    assert state_bytes_per_param(t) == state
    assert step_bytes_per_param(t) == step


def test_a_block_scaled_fp8_recipe_keeps_megatron_cores_own_fp32_master_weights():
    """optimizer_config.py `use_precision_aware_optimizer_no_fp8_or_ds_fp8`: under a
    block-scaled recipe with fp32 master weights Megatron-Core keeps them (4 bytes)."""
    h100 = {"node": "dgx-h100", "num_nodes": 1, "gpus_per_node": 2, "nics_per_node": 1}
    fp8 = {**TODAY, "use_precision_aware_optimizer": True, "fp8_format": "e4m3"}
    bf16 = {"exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}
    for recipe, master in (("delayed", 2), ("tensorwise", 4), ("blockwise", 4)):
        t = load(
            cluster=h100,
            parallel={"data_parallel_size": 2},
            training={**fp8, **bf16, "fp8_recipe": recipe},
        ).training
        assert state_bytes_per_param(t) == master + 2 + 2


def test_the_memory_model_holds_the_state_bytes_over_the_replicas():
    (default,) = memory_per_stage(load(**TWO, parallel={"data_parallel_size": 2}, training=TODAY))
    (aware,) = memory_per_stage(_aware(exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16"))
    assert aware.optimizer_bytes == pytest.approx(default.optimizer_bytes * 6 / 12, rel=1e-12)
    assert aware.gradients_bytes == default.gradients_bytes  # fp32 gradients as before
    (bf16_grads,) = memory_per_stage(
        _aware(main_grads_dtype="bf16", exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")
    )
    assert bf16_grads.gradients_bytes == default.gradients_bytes / 2


@pytest.mark.parametrize(
    "training, message",
    [
        (
            {"exp_avg_dtype": "bf16"},
            r"training.exp_avg_dtype='bf16' can only be fp32 without the precision-aware",
        ),
        (
            {"use_precision_aware_optimizer": True, "framework_version": "2024"},
            r"training.use_precision_aware_optimizer=True is Megatron-Core's \(megatron 2025\)",
        ),
        (
            {"use_precision_aware_optimizer": True, "data_parallel_sharding": "none"},
            r"only supported with the distributed optimizer",
        ),
        (
            {
                "use_precision_aware_optimizer": True,
                "main_grads_dtype": "bf16",
                "accumulate_allreduce_grads_in_fp32": True,
            },
            r"must be false with training.main_grads_dtype='bf16'",
        ),
        (
            {"exp_avg_sq_dtype": "fp4"},
            r"exp_avg_sq_dtype='fp4' must be one of",
        ),
    ],
)
def test_bad_precision_aware_settings_name_key_value_and_rule(training, message):
    with pytest.raises(ScenarioError, match=message):
        load(**TWO, parallel={"data_parallel_size": 2}, training={**TODAY, **training})
