"""FP8 training (`[training] fp8_format`, `fp8_recipe`, `fp8_param_gather`): its rules
and the few facts about a recipe that the workload reads.

The keys are Megatron-Core's (megatron/core/transformer/transformer_config.py:
``fp8`` is ``--fp8-format``, ``fp8_recipe`` ``--fp8-recipe``, ``fp8_param`` is what
``--fp8-param-gather`` sets), run through Transformer Engine (TE) as
megatron/core/fp8_utils.py ``get_fp8_recipe`` maps them: ``delayed`` -> TE's
DelayedScaling, ``tensorwise`` -> Float8CurrentScaling, ``blockwise`` ->
Float8BlockScaling, ``mxfp8`` -> MXFP8BlockScaling. Which GPUs run which recipe is
TE's rule (transformer_engine/pytorch/quantization.py): FP8 at all needs compute
capability 8.9 or newer (``_compute_fp8_support``), blockwise scaling 9.0 or newer
(``_compute_fp8_block_scaling_support``), MXFP8 10.x (``_compute_mxfp8_support``:
Blackwell; not 12.0). The format (E4M3 everywhere, or hybrid: E4M3 forward, E5M2
gradients) changes no time or byte here: both are one byte at the same tensor rate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ir.vocabulary import FP8_BLOCKWISE, FP8_DELAYED, FP8_MXFP8, FP8_TENSORWISE, SHARD_OPTIMIZER
from .errors import ScenarioError

if TYPE_CHECKING:
    from .gpu import Fp8KernelConstants, GpuSpec
    from .spec import Scenario, TrainingConfig

FP8_GEMM_EFFICIENCY_RANGE = (0.01, 1.0)
FP8_GEMM_K_HALF_RANGE = (0.0, 1e6)
# the compute capability each recipe needs (TE's quantization.py, above)
FP8_MIN_CAPABILITY = (8, 9)
BLOCKWISE_MIN_CAPABILITY = (9, 0)
MXFP8_CAPABILITY_MAJOR = 10
# from this compute capability on, FP8 GEMMs take any layout (TE's
# utils.is_non_tn_fp8_gemm_supported: 10.x and 13+); before it (Hopper) only "TN",
# so every FP8 tensor used transposed in the backward needs a transposed copy
NON_TN_FP8_CAPABILITY = (10, 0)


def check_fp8_kernel_constants(constants: Fp8KernelConstants) -> None:
    """Each FP8 GEMM constant a number in the BF16 constants' range."""
    for name in ("gemm_efficiency", "fast_accum_gemm_efficiency", "gemm_k_half"):
        low, high = FP8_GEMM_K_HALF_RANGE if name == "gemm_k_half" else FP8_GEMM_EFFICIENCY_RANGE
        value = getattr(constants, name)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not low <= value <= high:
            raise ScenarioError(
                key=f"fp8_kernels.{name}", value=value, rule=f"must be between {low:g} and {high:g}"
            )


def fp8_enabled(training: TrainingConfig) -> bool:
    return training.fp8_format is not None


def recipe_of(training: TrainingConfig) -> str:
    """The recipe in effect: the key, or Megatron-Core's default (``delayed``)."""
    return training.fp8_recipe or FP8_DELAYED


def fp8_param_gather(training: TrainingConfig) -> bool:
    return bool(training.fp8_param_gather)


def second_copy(gpu: GpuSpec, recipe: str) -> bool:
    """Whether each FP8 tensor the backward reads is quantized twice: a transposed copy
    on GPUs whose FP8 GEMMs take only the TN layout (Hopper), or, for the block-scaled
    recipes, a column-wise copy scaled along the other dimension (TE's quantizers'
    ``columnwise_usage``: MXFP8's 1 x 32 and blockwise's 1 x 128 blocks run along the
    inner dimension of the GEMM that reads them)."""
    return recipe in (FP8_BLOCKWISE, FP8_MXFP8) or gpu.compute_capability < NON_TN_FP8_CAPABILITY


def fast_accumulation(recipe: str) -> bool:
    """Whether the forward (fprop) GEMMs use fast accumulation: TE's defaults, module/base.py
    ``_2X_ACC_FPROP = False`` (delayed scaling) and Float8CurrentScaling's
    ``fp8_gemm_fprop = MMParams(use_split_accumulator=False)``; the block-scaled recipes
    keep the split accumulator everywhere (Float8BlockScaling asserts it; MXFP8's MMParams
    default)."""
    return recipe in (FP8_DELAYED, FP8_TENSORWISE)


def amax_pass(recipe: str) -> bool:
    """Whether each cast reads its input once more first for the tensor's amax: current
    (tensorwise) scaling scales by this tensor's own amax, so TE computes it in a pass of
    its own before quantizing; delayed scaling takes the scale from the amax history
    and records the new amax inside the cast; block scaling takes each block's amax
    inside the kernel that quantizes it."""
    return recipe == FP8_TENSORWISE


def norm_fused_cast(recipe: str) -> bool:
    """Whether the layernorm feeding QKV and fc1 writes FP8 itself (TE's LayerNormLinear,
    ``with_quantized_norm``); under current scaling TE's normalization computes the
    BF16 output first, then its amax, then casts."""
    return recipe != FP8_TENSORWISE


def check_fp8(scenario: Scenario) -> None:
    """FP8 keys together, and the GPU the recipe runs on (TE's rules above)."""
    training, gpu = scenario.training, scenario.cluster.gpu
    if not fp8_enabled(training):
        for name in ("fp8_recipe", "fp8_param_gather"):
            value = getattr(training, name)
            if value is not None and value is not False:
                raise ScenarioError(
                    key=f"training.{name}",
                    value=value,
                    rule="has no effect without training.fp8_format (FP8 is off)",
                    fix='set training.fp8_format = "hybrid" or "e4m3", or leave the key out',
                )
        return
    recipe = recipe_of(training)
    if gpu.peak_tflops_fp8 is None or gpu.compute_capability < FP8_MIN_CAPABILITY:
        raise ScenarioError(
            key="training.fp8_format",
            value=training.fp8_format,
            rule=f"needs a GPU with FP8 tensor cores (compute capability 8.9 or newer); "
            f"cluster.gpu={gpu.name!r} has none",
        )
    capability = ".".join(map(str, gpu.compute_capability))
    if recipe == FP8_MXFP8 and gpu.compute_capability[0] != MXFP8_CAPABILITY_MAJOR:
        raise ScenarioError(
            key="training.fp8_recipe",
            value=recipe,
            rule=f"needs a Blackwell GPU (compute capability 10.x, Transformer Engine's "
            f"MXFP8 check); cluster.gpu={gpu.name!r} is {capability}",
            fix='use "delayed", "tensorwise" or "blockwise"',
        )
    if recipe == FP8_BLOCKWISE and gpu.compute_capability < BLOCKWISE_MIN_CAPABILITY:
        raise ScenarioError(
            key="training.fp8_recipe",
            value=recipe,
            rule=f"needs compute capability 9.0 or newer (Transformer Engine's block-scaling "
            f"check); cluster.gpu={gpu.name!r} is {capability}",
        )
    if fp8_param_gather(training) and training.data_parallel_sharding != SHARD_OPTIMIZER:
        raise ScenarioError(
            key="training.fp8_param_gather",
            value=True,
            rule="is modelled with the distributed optimizer only (Megatron-LM's arguments.py: "
            "--fp8-param-gather needs it, or an FSDP stepsim does not model with FP8)",
            fix='set training.data_parallel_sharding = "optimizer"',
        )
