"""When Megatron-LM's fused scale-mask-softmax kernel runs (docs/frameworks.md §9).

Megatron's ``FusedScaleMaskSoftmax`` (megatron/model/fused_softmax.py) runs its CUDA
kernel only under shape conditions, and otherwise falls back to PyTorch
(``forward_torch_softmax``): an fp32 copy, scale, masked_fill and softmax, each a
pass over the b x (a/T) x s x s scores through HBM. The conditions changed with the
version:

- ``"2021"`` (v2.5, 2021-08; v2.6 and main to mid-2022 add the kernel's batch per
  block): fp16/bf16 input, a mask, 16 < sk <= 2048, sq % 4 == 0, and b x (a/T)
  divisible by 4 (by ``get_batch_per_block``, 8 when sk <= 128, for the causal
  kernel; scaled_masked_softmax.h, 128 threads, two rows per warp up to 128 elements).
- ``"2022"`` (from 539e39b 2022-01-20 and 189e72a 2022-07-29, as at e1c334b
  2022-12-21): no mask needed, 16 < sk <= 4096, sk % 4 == 0, the same batch
  conditions. But the causal kernel (scaled_upper_triang_masked_softmax.h) still
  asserts ``softmax_elements <= 2048``: with a causal mask and 2048 < s <= 4096 the
  Python check passes and the run stops on the assertion instead of falling back.

stepsim's activations are always fp16/bf16 and GPT's mask is causal, with sq = sk =
the sequence length. The version is a string argument; a scenario's is the rule of its
framework and version (``frameworks.SOFTMAX_RULE``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from ..ir.vocabulary import ATTENTION_FLASH
from .frameworks import SOFTMAX_RULE

if TYPE_CHECKING:
    from .spec import Scenario

SOURCE = "Megatron fused_softmax.py"
VERSIONS: tuple[str, ...] = ("2021", "2022")
# the causal kernel's compile-time limit (scaled_upper_triang_masked_softmax.h)
CAUSAL_KERNEL_MAX_SEQ = 2048


class SoftmaxPath(NamedTuple):
    """Which softmax Megatron runs: ``fused`` or not, and why not (``reason``, one
    phrase); ``aborts`` when the Python check lets through a shape the kernel rejects."""

    fused: bool
    reason: str = ""
    aborts: bool = False


def _batch_per_block(sk: int) -> int:
    """scaled_masked_softmax.h get_batch_per_block: 128 threads, 32 per warp, two rows
    per warp while a row fits one warp's 128 elements, one row per warp beyond."""
    return 8 if sk <= 128 else 4


def fused_softmax_path(
    version: str, *, heads_per_rank: int, micro_batch: int, seq_length: int, fusion: bool = True
) -> SoftmaxPath:
    """Megatron's choice for GPT's causal attention (sq = sk = ``seq_length``) at
    ``version`` ("2021" or "2022"); ``fusion`` is ``--masked-softmax-fusion``."""
    if version not in VERSIONS:
        raise ValueError(f"unknown Megatron softmax rule version {version!r}; one of {VERSIONS}")
    if not fusion:
        return SoftmaxPath(False, "masked_softmax_fusion = false")
    s, batches = seq_length, heads_per_rank * micro_batch
    top = 2048 if version == "2021" else 4096
    if not 16 < s <= top:
        return SoftmaxPath(False, f"sequence length {s} outside 16 < s <= {top}")
    if s % 4:
        return SoftmaxPath(False, f"sequence length {s} not divisible by 4")
    per_block = _batch_per_block(s)
    if batches % per_block:
        return SoftmaxPath(
            False,
            f"heads per TP rank x micro-batch = {batches} not divisible by {per_block}",
        )
    if s > CAUSAL_KERNEL_MAX_SEQ:  # only "2022" lets it through
        return SoftmaxPath(
            False,
            f"the causal kernel asserts s <= {CAUSAL_KERNEL_MAX_SEQ} (s = {s})",
            aborts=True,
        )
    return SoftmaxPath(True)


def scenario_softmax_path(scenario: Scenario, version: str | None = None) -> SoftmaxPath:
    """The softmax a scenario's unfused attention core runs (always fused under
    ``attention_kernel = "flash"``, whose kernel holds its own softmax), by the rule of
    ``version`` or else of the scenario's framework and version."""
    training = scenario.training
    if version is None:
        version = SOFTMAX_RULE[(training.framework, training.mechanism("framework_version"))]
    if training.mechanism("attention_kernel") == ATTENTION_FLASH:
        return SoftmaxPath(True)
    return fused_softmax_path(
        version,
        heads_per_rank=scenario.model.num_attention_heads
        // scenario.parallel.tensor_model_parallel_size,
        micro_batch=training.micro_batch_size,
        seq_length=scenario.model.seq_length,
        fusion=training.masked_softmax_fusion,
    )
