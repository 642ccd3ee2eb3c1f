"""FP8 linear layers (`[training] fp8_format`): their GEMMs at the FP8 rate and the
casts Transformer Engine (TE) runs around them, as Megatron-Core's TE layers do.

Which GEMMs: the four linear layers of every transformer layer (QKV and fc1 are TE's
LayerNormLinear, projection and fc2 its Linear), forward (fprop), input gradient (dgrad)
and weight gradient (wgrad). The attention core stays 16-bit (Megatron-Core's
``fp8_dot_product_attention`` is off by default), and so do the embedding and the
output layer (``fp8_output_proj`` is off by default and MXFP8-only): their kernels are
unchanged.

An FP8 GEMM is the 16-bit GEMM's roofline (compute.gemm_seconds: the same tile and
wave model, the GPU's tile and SMs) at the GPU's dense FP8 peak with the FP8 constants
of its record (`GpuSpec.fp8_kernels`: split accumulation for dgrad and wgrad, fast
accumulation for fprop where the recipe says so, scenario.precision.fast_accumulation),
reading 1-byte inputs and writing its 16-bit output.

Casts are memory-bound kernels at the HBM bandwidth x memory_efficiency, per element
(scenario.precision says where each rule comes from):

- a cast reads 2 bytes and writes 1, plus 1 for the second copy the backward reads
  (a transpose on Hopper, a column-wise copy for the block-scaled recipes);
- under current (tensorwise) scaling a pass reading 2 bytes for the tensor's amax
  comes first;
- QKV's and fc1's inputs are cast by the layernorm that produces them (TE's quantized
  norm; not under tensorwise): the norm writes 1 FP8 byte instead of 2 and the second
  copy, counted as no bytes at all;
- each weight is cast once per iteration (Megatron-Core passes ``is_first_microbatch``
  and TE keeps the FP8 weight and its transpose for the later micro-batches), spread
  here over the micro-batches' forwards (the iteration's total is right, the first
  forward is a little short); with ``fp8_param_gather`` the weights are FP8 already and
  only their second copy is made (read 1, write 1);
- the incoming gradient of each linear layer is cast before dgrad (it feeds dgrad and
  wgrad), always a kernel of its own (Megatron's activation and attention backwards
  write 16-bit gradients).

Not modelled: delayed scaling's amax-history update and its amax all-reduce (small
tensors, once per micro-batch), TE's FP8 all-gather of the sequence-parallel input
(the TP collectives stay 16-bit here), the first and last layers in BF16
(``first_last_layers_bf16``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ..scenario import GpuSpec, KernelConstants
from ..scenario.precision import (
    amax_pass,
    fast_accumulation,
    fp8_enabled,
    fp8_param_gather,
    norm_fused_cast,
    recipe_of,
    second_copy,
)
from .kernels import BYTES_PER_ELEMENT, Kernel, LinearKernels, Work, gemm_seconds

if TYPE_CHECKING:
    from .compute import ComputeModel

FP8_BYTES = 1.0  # an FP8 element (E4M3 or E5M2)
NORM_FED = ("QKV", "fc1")  # the linear layers whose input a layernorm produces (TE LayerNormLinear)


def fp8_constants(gpu: GpuSpec, base: KernelConstants, *, fast: bool) -> KernelConstants:
    """The GEMM constants an FP8 GEMM runs with: ``base``'s tile and SMs with the
    record's FP8 fractions (fast accumulation's for ``fast``, else split accumulation's)."""
    fp8 = gpu.fp8_kernels
    assert fp8 is not None, f"{gpu.name} has no FP8 tensor cores"
    efficiency = fp8.fast_accum_gemm_efficiency if fast else fp8.gemm_efficiency
    return dataclasses.replace(base, gemm_efficiency=efficiency, gemm_k_half=fp8.gemm_k_half)


def fp8_gemm_seconds(
    gpu: GpuSpec,
    base: KernelConstants,
    m: float,
    n: float,
    k: float,
    *,
    fast: bool,
    batch: int = 1,
) -> float:
    """An FP8 GEMM (``batch`` of them; 1-byte inputs, 16-bit output) at the GPU's dense
    FP8 peak."""
    assert gpu.peak_tflops_fp8 is not None, f"{gpu.name} has no FP8 tensor cores"
    constants = fp8_constants(gpu, base, fast=fast)
    return gemm_seconds(
        gpu, constants, m, n, k, batch, peak_tflops=gpu.peak_tflops_fp8, input_bytes=FP8_BYTES
    )


class Fp8Linear:
    """The FP8 kernels of a scenario's linear layers (ComputeModel.fp8)."""

    @classmethod
    def of(cls, compute: ComputeModel) -> Fp8Linear | None:
        return cls(compute) if fp8_enabled(compute.training) else None

    def __init__(self, compute: ComputeModel) -> None:
        self.compute = compute
        gpu, training = compute.gpu, compute.training
        fp8 = gpu.fp8_kernels
        # the rules (precision.check_fp8) allow FP8 only on a GPU with FP8 tensor cores,
        # whose record (hardware.py) has both
        assert fp8 is not None and gpu.peak_tflops_fp8 is not None
        self.recipe = recipe_of(training)
        self.peak_tflops = gpu.peak_tflops_fp8
        base = compute.constants
        self.split = fp8_constants(gpu, base, fast=False)
        self.fprop = fp8_constants(gpu, base, fast=fast_accumulation(self.recipe))
        self.copies = 1 + (1 if second_copy(gpu, self.recipe) else 0)  # FP8 bytes written
        self.amax_bytes = BYTES_PER_ELEMENT if amax_pass(self.recipe) else 0.0
        self.param_gather = fp8_param_gather(training)
        self.microbatches = compute.scenario.num_microbatches

    # -- kernels ------------------------------------------------------------------------

    def gemm(self, m: float, n: float, k: float, *, fprop: bool, extra_bytes: float = 0.0) -> Work:
        """An FP8 GEMM: fprop with the recipe's accumulation, dgrad and wgrad split."""
        constants = self.fprop if fprop else self.split
        duration = gemm_seconds(
            self.compute.gpu,
            constants,
            m,
            n,
            k,
            extra_bytes=extra_bytes,
            peak_tflops=self.peak_tflops,
            input_bytes=FP8_BYTES,
        )
        return Work(duration_s=duration, flops=2.0 * m * n * k)

    def gemm_sharing(self, m: float, n: float, k: float, reserved_sms: int) -> Work:
        """An fprop GEMM on the SMs a reduce-scatter leaves (compute.gemm_sharing)."""
        c = self.fprop
        fewer = dataclasses.replace(c, num_sms=max(1, c.num_sms - reserved_sms))
        duration = gemm_seconds(
            self.compute.gpu, fewer, m, n, k, peak_tflops=self.peak_tflops, input_bytes=FP8_BYTES
        )
        return Work(duration_s=duration, flops=2.0 * m * n * k)

    def cast_bytes_per_element(self) -> float:
        """A 16-bit tensor cast to FP8 by a kernel of its own: the amax pass (tensorwise),
        read 2, write the FP8 copies."""
        return self.amax_bytes + BYTES_PER_ELEMENT + FP8_BYTES * self.copies

    def weight_cast_bytes_per_element(self) -> float:
        """Once per iteration per weight: a cast, or with FP8 parameters the second copy
        alone (read 1, write 1; none where the GEMMs need none)."""
        if self.param_gather:
            return 2 * FP8_BYTES * (self.copies - 1)
        return self.cast_bytes_per_element()

    def input_cast_bytes_per_element(self, name: str) -> float:
        if name in NORM_FED and norm_fused_cast(self.recipe):
            return 0.0  # the layernorm writes FP8 (see the module's notes)
        return self.cast_bytes_per_element()

    def linear(
        self, block: str, name: str, k_in: float, n_out: float, tokens: float
    ) -> LinearKernels:
        """The forward, input-gradient and weight-gradient kernels of one FP8 linear layer,
        Y[tokens, n_out] = X[tokens, k_in] W (compute.ComputeModel.kernels' ``linear``)."""
        mem = self.compute.memory_bound
        weights = k_in * n_out
        forward = []
        x_bytes = self.input_cast_bytes_per_element(name) * tokens * k_in
        if x_bytes:
            forward.append(Kernel(block, "forward", name + " input cast", mem(x_bytes)))
        w_bytes = self.weight_cast_bytes_per_element() * weights / self.microbatches
        if w_bytes:
            forward.append(Kernel(block, "forward", name + " weight cast", mem(w_bytes)))
        forward.append(Kernel(block, "forward", name, self.gemm(tokens, n_out, k_in, fprop=True)))
        grad_cast = mem(self.cast_bytes_per_element() * tokens * n_out)
        backward = [
            Kernel(block, "input", name + " grad cast", grad_cast),
            Kernel(block, "input", name + " dX", self.gemm(tokens, k_in, n_out, fprop=False)),
        ]
        g = self.compute.training.gradient_bytes
        if self.compute.training.mechanism("gradient_accumulation_fusion"):
            weight = self.gemm(k_in, n_out, tokens, fprop=False, extra_bytes=(2 * g - 2) * weights)
        else:
            weight = self.gemm(k_in, n_out, tokens, fprop=False) + mem((2 + 2 * g) * weights)
        return forward, backward, [Kernel(block, "weight", name + " dW", weight)]
