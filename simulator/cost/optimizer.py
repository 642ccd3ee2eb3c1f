"""What Adam keeps and moves per parameter, by the dtypes of its state.

Megatron-Core's default optimizer keeps fp32 master weights, momentum and variance:
12 bytes per parameter it steps on. Its precision-aware optimizer
(`--use-precision-aware-optimizer`, Megatron-Core optimizer/__init__.py and
optimizer_config.py at d98e8a6; Transformer Engine's FusedAdam) keeps each in the dtype
its key names, and with bf16 weights and fp32 master weights stores only the 16 bits of
each master weight that the bf16 weight lacks (`store_param_remainders`, an int16 shard
in distrib_optimizer.py), when Transformer Engine manages the master weights: always
but under a block-scaled FP8 recipe with fp32 master weights, where Megatron-Core keeps
its own fp32 copy (`use_precision_aware_optimizer_no_fp8_or_ds_fp8`).
"""

from __future__ import annotations

from ..ir.vocabulary import FP8_DELAYED, STATE_BYTES
from ..scenario import TrainingConfig
from ..scenario.precision import fp8_enabled, recipe_of

# fp32 master weights, momentum and variance
DEFAULT_STATE_BYTES_PER_PARAM = 12.0
# Adam's step, default state: it reads and writes the fp32 master weights, momentum and
# variance (3 x 8 bytes), reads the fp32 gradient (4), writes the 16-bit weights (2) and
# zeroes the gradient (2): 32 bytes per parameter.
GRADIENT_READ_BYTES = 4.0
WEIGHT_WRITE_BYTES = 2.0
GRADIENT_ZERO_BYTES = 2.0


def te_master_weights(training: TrainingConfig) -> bool:
    """Whether Transformer Engine's FusedAdam holds the master weights (Megatron-Core's
    `use_precision_aware_optimizer_no_fp8_or_ds_fp8`)."""
    if not training.use_precision_aware_optimizer:
        return False
    no_scaled_fp8 = not fp8_enabled(training) or recipe_of(training) == FP8_DELAYED
    return training.main_params_dtype != "fp32" or no_scaled_fp8


def keeps_remainders(training: TrainingConfig) -> bool:
    """Whether the master weights are bf16 weights' 16-bit remainders."""
    return (
        te_master_weights(training)
        and training.store_param_remainders
        and training.params_dtype == "bf16"
        and training.main_params_dtype == "fp32"
    )


def master_bytes_per_param(training: TrainingConfig) -> float:
    if keeps_remainders(training):
        return 2.0
    if training.use_precision_aware_optimizer:
        return float(STATE_BYTES[training.main_params_dtype])
    return 4.0


def state_bytes_per_param(training: TrainingConfig) -> float:
    """Bytes the optimizer keeps per parameter it steps on (12 by default)."""
    if not training.use_precision_aware_optimizer:
        return DEFAULT_STATE_BYTES_PER_PARAM
    moments = STATE_BYTES[training.exp_avg_dtype] + STATE_BYTES[training.exp_avg_sq_dtype]
    return master_bytes_per_param(training) + moments


def step_bytes_per_param(training: TrainingConfig) -> float:
    """HBM bytes Adam's step moves per parameter: its state read and written, the
    gradient read (the fp32 main gradient; the precision-aware optimizer reads the
    gradient buffer in its own dtype), the 16-bit weights written (and read too when the
    master weights are remainders) and the gradient zeroed."""
    if not training.use_precision_aware_optimizer:
        state = DEFAULT_STATE_BYTES_PER_PARAM
        gradient = GRADIENT_READ_BYTES
    else:
        state = state_bytes_per_param(training)
        gradient = float(training.gradient_bytes)
    weight = WEIGHT_WRITE_BYTES * (2 if keeps_remainders(training) else 1)
    return 2 * state + gradient + weight + GRADIENT_ZERO_BYTES
