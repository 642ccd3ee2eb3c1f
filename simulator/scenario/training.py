"""`[training]`: the schedule, recomputation, data-parallel mode, the gradient path,
the attention kernels and the framework whose engine ran, each mechanism key resolved
from the framework's defaults (frameworks.py) when the spec is built."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from stepsim import schedules

from ..ir.vocabulary import (
    ADAM_STATE_DTYPES,
    ATTENTION_BACKENDS,
    ATTENTION_KERNELS,
    COMMUNICATION_DTYPES,
    DATA_PARALLEL_SHARDING,
    DTYPE_BYTES,
    FP8_FORMATS,
    FP8_RECIPES,
    MAIN_GRADS_DTYPES,
    MAIN_PARAMS_DTYPES,
    MOE_ALLGATHER,
    MOE_DISPATCHERS,
    NO_SHARDING,
    PARAMS_DTYPES,
    RECOMPUTE_GRANULARITIES,
    RECOMPUTE_NONE,
    RECOMPUTE_SELECTIVE,
    TIED_GRAD_ORDERS,
    ZERO_GRAD_COLLECTIVES,
)
from . import frameworks, rules
from .fields import check_values, key, mechanism_key

RecomputeGranularity = Literal["none", "selective", "full"]
# DeepSeek-V3 technical report, 3.2.2: 20 of the H800's 132 SMs run the all-to-all
DEEPSEEK_COMM_SMS, DEEPSEEK_SMS = 20, 132
SCHEDULES: tuple[str, ...] = (*schedules.SCHEDULES, rules.CUSTOM)  # custom: from a file


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingConfig:
    micro_batch_size: int = key("samples per micro-batch", unit="samples", default=1)
    global_batch_size: int = key(
        "samples per iteration; divisible by `micro_batch_size x data_parallel_size`",
        unit="samples",
    )
    schedule: str = key(
        "pipeline schedule (see [docs/schedules.md](../docs/schedules.md)), or `custom` "
        "(from `schedule_file`)",
        default=schedules.ONE_F_ONE_B,
        choices=SCHEDULES,
    )
    microbatch_group_size_per_vp_stage: int | None = key(
        "interleaved schedules only (Megatron-LM's key): micro-batches per group going "
        "through one chunk; the micro-batch count must be a multiple of it, and it must be "
        ">= PP size or equal to the micro-batch count (smaller groups deadlock)",
        default=None,
        derived="PP size",
    )
    schedule_file: str | None = key(
        "`custom` only, required there: per-rank op orders, one line per rank "
        "(`F0 F1 B0 W0 ...`, `F3.1` for chunk 1) or torch.distributed.pipelining's action "
        "CSV (`0F0,0I0,0W0,...`), relative to the scenario file; checked "
        "for missing, repeated and misordered ops and for deadlock; its ranks, chunks and "
        "micro-batches must match the scenario",
        default=None,
    )
    schedule_placement: str | None = key(
        "`custom` only: chunk k of rank r holds stage k x PP + r (`looped`) or, with 2 "
        "chunks, stages r and 2 PP - 1 - r (`v`); named schedules fix theirs, and a torch "
        "CSV's stage numbers fix its own",
        default=None,
        # DualPipe's dual placement comes with `schedule = "dualpipe"` only, not custom orders
        choices=(schedules.LOOPED, schedules.V_SHAPE),
        derived=f'`"{schedules.LOOPED}"`',
    )
    # a custom schedule's per-rank orders, read from schedule_file (not a key)
    custom_orders: tuple[tuple[schedules.Step, ...], ...] | None = None
    recompute_granularity: RecomputeGranularity = key(
        "`selective` recomputes the attention core (or `recompute_modules`), `full` each "
        "layer's forward",
        default=RECOMPUTE_NONE,
        choices=RECOMPUTE_GRANULARITIES,
    )
    recompute_modules: str | None = key(
        "Megatron-Core's `--recompute-modules` under `selective`: the modules whose "
        "forward the backward repeats, comma-separated, of core_attn, moe_act, layernorm, "
        "mla_up_proj, mlp, moe, shared_experts (their activations are not kept)",
        default=None,
        derived='"core_attn" with `selective`',
    )
    # -- activation offloading (Megatron-Core's cpu_offloading keys; emit/offload.py,
    # scenario/offload_rules.py, docs/memory.md "Activation offloading")
    cpu_offloading: bool = key(
        "Megatron-Core's `cpu_offloading`: the activations of the first "
        "`cpu_offloading_num_layers` transformer layers are copied to host memory during "
        "the forward and back before their backward, on a stream of their own "
        "(Transformer Engine's offload scheduling); no pipeline parallelism, no "
        "recomputation",
        default=False,
    )
    cpu_offloading_num_layers: int = key(
        "Megatron-Core's `cpu_offloading_num_layers`: how many transformer layers (the "
        "first ones) offload their activations, 0 to `model.num_layers` - 1; more than 0 "
        "turns `cpu_offloading` on (Megatron-LM's arguments.py)",
        default=0,
        low=0,
        high=1_000_000,
        may_be_zero=True,
    )
    cpu_offloading_activations: bool = key(
        "Megatron-Core's `cpu_offloading_activations`: offload the activations (`false` "
        "with `cpu_offloading_weights = true` offloads nothing)",
        default=True,
    )
    cpu_offloading_weights: bool = key(
        "Megatron-Core's `cpu_offloading_weights`: accepted and without effect, as in "
        "Transformer Engine since v2.3 (weight offloading is deprecated there and does "
        "nothing)",
        default=False,
    )
    overlap_grad_reduce: bool = key(
        "all-reduce gradients per layer as soon as that layer's last backward is done, "
        "instead of once after the last backward (reduce-scatter under "
        '`data_parallel_sharding = "optimizer"`; no effect under `"full"` or with DP 1)',
        default=False,
    )
    overlap_param_gather: bool = key(
        "Megatron-Core's `--overlap-param-gather`: the distributed optimizer's parameter "
        "all-gather runs during the next iteration's first forward, one layer at a time on "
        "a communication stream, each layer's first forward waiting for its own, instead of "
        'blocking after the optimizer step; needs `data_parallel_sharding = "optimizer"` '
        'or `"gradients"`',
        default=False,
    )
    async_tensor_model_parallel_allreduce: bool | None = mechanism_key(
        "Megatron-LM's `--async-tensor-model-parallel-allreduce`: in each block's backward, "
        "the all-reduce (reduce-scatter under SP) of the input gradient runs while the "
        "weight gradient of the block's first GEMM (QKV, fc1) computes; not with schedules "
        "that split the backward",
    )
    tp_comm_overlap: bool = key(
        "Megatron-Core's `--tp-comm-overlap` (Transformer Engine userbuffers), with sequence "
        "parallelism: each SP all-gather runs pipelined with the GEMM it feeds (QKV, fc1; "
        "backward: projection and fc2 dX), each forward reduce-scatter with the GEMM "
        "producing it, which then runs on 16 fewer SMs; exposed only where longer than "
        "the GEMM. The backward reduce-scatter overlaps the weight gradient as with "
        "`async_tensor_model_parallel_allreduce`",
        default=False,
    )
    data_parallel_sharding: str = key(
        "`optimizer` is ZeRO-1, `gradients` ZeRO-2 (optimizer states and gradients: "
        "Megatron-FSDP's `optim_grads`, each micro-batch's gradients reduce-scattered per "
        "layer), `full` ZeRO-3 / FSDP; no effect with DP 1",
        default=NO_SHARDING,
        choices=DATA_PARALLEL_SHARDING,
    )
    use_distributed_optimizer: bool | None = key(
        "Megatron-Core's `--use-distributed-optimizer`: `true` shards the optimizer states "
        "(and the fp32 main weights) over data parallelism, i.e. `data_parallel_sharding = "
        '"optimizer"` unless `"full"` is given; `false` means no sharding (giving one that '
        "contradicts `data_parallel_sharding` is an error)",
        default=None,
        derived="from `data_parallel_sharding`",
    )
    # -- the gradient path (docs/frameworks.md §3-§6, §8) ---------------------------------
    params_dtype: str = key(
        "16-bit type of weights and activations (`--fp16` / `--bf16`); bf16 needs an A100 or newer",
        default="fp16",
        choices=PARAMS_DTYPES,
        derived="`bf16` under Megatron-Core 2025 on an A100 or newer, else `fp16`",
    )
    accumulate_allreduce_grads_in_fp32: bool | None = key(
        "Megatron-LM's flag: gradients accumulate (and, unless `communication_data_type` "
        "says otherwise, are reduced) in an fp32 buffer, 4 bytes per parameter, instead of "
        "the params dtype; bf16 requires it (Megatron forces it, DeepSpeed's BF16_Optimizer "
        "always accumulates in fp32)",
        default=None,
        derived="`true` with bf16, else `false`",
    )
    communication_data_type: str | None = key(
        "dtype of the data-parallel gradient collectives (DeepSpeed's key); bf16 "
        "DeepSpeed sends `bf16` although it accumulates in fp32",
        default=None,
        choices=COMMUNICATION_DTYPES,
        derived="the accumulation dtype (deepspeed: the params dtype)",
    )
    # -- Megatron-Core's precision-aware optimizer (TE FusedAdam; docs/memory.md) -------
    use_precision_aware_optimizer: bool = key(
        "Megatron-Core's `--use-precision-aware-optimizer`: Transformer Engine's FusedAdam "
        "keeps the master weights and Adam moments in the dtypes below (distributed "
        "optimizer only), and with bf16 weights and fp32 master weights stores only the "
        "master weights' low 16 bits (`store_param_remainders`)",
        default=False,
    )
    main_params_dtype: str = key(
        "`--main-params-dtype`: the master weights' dtype (precision-aware optimizer only)",
        default="fp32",
        choices=MAIN_PARAMS_DTYPES,
    )
    main_grads_dtype: str = key(
        "`--main-grads-dtype`: the gradient buffer's dtype (precision-aware optimizer "
        "only; `bf16` accumulates and reduces gradients in bf16)",
        default="fp32",
        choices=MAIN_GRADS_DTYPES,
    )
    exp_avg_dtype: str = key(
        "`--exp-avg-dtype`: Adam's first moment (precision-aware optimizer only; DeepSeek-V3 "
        "keeps it in bf16)",
        default="fp32",
        choices=ADAM_STATE_DTYPES,
    )
    exp_avg_sq_dtype: str = key(
        "`--exp-avg-sq-dtype`: Adam's second moment (precision-aware optimizer only)",
        default="fp32",
        choices=ADAM_STATE_DTYPES,
    )
    store_param_remainders: bool = key(
        "Megatron-Core's OptimizerConfig.store_param_remainders: with the precision-aware "
        "optimizer, bf16 weights and fp32 master weights, keep only each master weight's "
        "16 bits the bf16 weight lacks (2 bytes instead of 4)",
        default=True,
    )
    activation_func_fp8_input_store: bool = key(
        "Megatron-Core's `--activation-func-fp8-input-store`: the SwiGLU's input (fc1's "
        "output, dense and experts') kept for the backward in FP8, 1 byte instead of 2 "
        "(SwiGLU only; DeepSeek-V3 caches it so)",
        default=False,
    )
    zero_grad_collective: str | None = mechanism_key(
        '`data_parallel_sharding = "optimizer"` only: `reduce-scatter` (Megatron-LM\'s '
        "distributed optimizer) or `all-reduce` of every gradient, each replica then "
        "keeping its 1/DP (DeepSpeed ZeRO-1 and BF16_Optimizer with the pipeline engine)",
        choices=ZERO_GRAD_COLLECTIVES,
    )
    reduce_bucket_size: int | None = mechanism_key(
        "elements per data-parallel gradient collective after the flush (DeepSpeed's "
        "`reduce_bucket_size`, 5e8); 0: one call for the whole stage",
        unit="elements",
        may_be_zero=True,
        high=10**12,
    )
    allgather_bucket_size: int | None = mechanism_key(
        "elements per parameter all-gather after a ZeRO-1 step (DeepSpeed's "
        "`allgather_bucket_size`, 5e8); 0: one call",
        unit="elements",
        may_be_zero=True,
        high=10**12,
    )
    share_embeddings_and_output_weights: bool = key(
        "the output layer reuses the word embedding: with the two on different pipeline "
        "stages their gradients are all-reduced between the first and the last stage, "
        "V/TP x h elements per (TP rank, replica)",
        default=True,
    )
    tied_grad_reduce_order: str | None = mechanism_key(
        "when the tied embedding's all-reduce runs: `after-dp` every data-parallel gradient "
        "collective (Megatron-LM 2021, Megatron-Core), `before-reduce-scatter` after an "
        "all-reduce but before the distributed optimizer's blocking reduce-scatter "
        "(Megatron-LM 2022), `before-dp` every one (DeepSpeed's ReduceTiedGrads)",
        choices=TIED_GRAD_ORDERS,
    )
    gradient_accumulation_fusion: bool | None = mechanism_key(
        "Megatron-LM's fusion: each weight-gradient GEMM accumulates into the gradient "
        "buffer (reads and writes it); `false`: a separate add kernel per layer and "
        "micro-batch reads the 2-byte gradient and the buffer and writes the buffer",
    )
    attention_backend: str | None = key(
        "Megatron-Core's `--attention-backend`: `flash` (FlashAttention's kernel), `fused` "
        "(cuDNN fused attention through Transformer Engine, modelled as flash: one kernel, "
        "no s x s tensors) or `unfused` (Megatron's GEMMs, softmax and dropout); sets "
        "`attention_kernel`, its older name here (giving both contradicting is an error)",
        default=None,
        choices=ATTENTION_BACKENDS,
        derived="from `attention_kernel`",
    )
    attention_kernel: str | None = mechanism_key(
        "the attention core (the older name of `attention_backend`): `unfused` (Megatron-LM's "
        "GEMMs, softmax and dropout with the s x s scores through HBM) or `flash` (one fused "
        "kernel, FlashAttention-2 / cuDNN through Transformer Engine, as Megatron-Core runs "
        "it: no s x s tensors, the backward recomputes the scores; see docs/calibration.md)",
        choices=ATTENTION_KERNELS,
    )
    moe_probs_in_experts: bool | None = mechanism_key(
        "MoE layers: the router probabilities travel with the tokens and weight the "
        "experts' activation (Megatron-Core from core_r0.12.1), so the combine keeps no "
        "weighted rows for their gradient; `false`: weighted after the experts (r0.8.0)"
    )
    # -- FP8 through Transformer Engine (scenario/precision.py, cost/fp8.py) -----
    fp8_format: str | None = key(
        "Megatron-Core's `--fp8-format`: the transformer layers' linear GEMMs (QKV, "
        "projection, fc1, fc2; forward, dgrad, wgrad) run in FP8 at the GPU's FP8 peak, "
        "with their inputs cast to FP8; `hybrid` (E4M3 forward, E5M2 gradients) or `e4m3` "
        "(the same time here); attention, embedding and output layer stay 16-bit; needs "
        "a GPU with FP8 tensor cores",
        default=None,
        choices=FP8_FORMATS,
        derived="off",
    )
    fp8_recipe: str | None = key(
        "Megatron-Core's `--fp8-recipe`, with `fp8_format` only: `delayed` (scales from an "
        "amax history), `tensorwise` (current scaling: an amax pass before each cast), "
        "`blockwise` (1 x 128 / 128 x 128 blocks; compute capability 9.0+) or `mxfp8` "
        "(1 x 32 blocks; Blackwell only)",
        default=None,
        choices=FP8_RECIPES,
        derived="`delayed` (Megatron-Core's default)",
    )
    fp8_param_gather: bool | None = key(
        "Megatron-LM's `--fp8-param-gather`, with `fp8_format` and "
        '`data_parallel_sharding = "optimizer"`: the linear weights are kept in FP8 (1 byte '
        "instead of the 16-bit copy and its FP8 cache) and the distributed optimizer's "
        "parameter all-gather moves them in FP8",
        default=None,
        derived="`false`",
    )
    moe_token_dispatcher_type: str | None = key(
        "Megatron-Core's `--moe-token-dispatcher-type` for MoE layers: `alltoall` (tokens "
        "all-to-all'ed to their experts' EP ranks and back) or `allgather` (every token "
        "all-gathered over the EP x ETP group, the experts' outputs reduce-scattered) or "
        "`flex` (`--moe-enable-deepep`: DeepEP's kernels, a token sent once per destination "
        "node over RDMA and forwarded over NVLink inside it; docs/moe.md)",
        default=None,
        choices=MOE_DISPATCHERS,
        derived="`allgather` (Megatron-Core's default)",
    )
    moe_permute_fusion: bool | None = key(
        "Megatron-Core's `--moe-permute-fusion`: Transformer Engine's fused permute, "
        "unpermute and chunk-sort kernels; `false`: PyTorch's index_select, multiply and "
        "scatter_add (moe_utils.py), which move the routed rows more often (docs/moe.md)",
        default=None,
        derived="true (Megatron-Core's MoE guide turns it on; its own default is false)",
    )
    moe_grouped_gemm: bool | None = key(
        "Megatron-Core's `--moe-grouped-gemm`: a rank's local experts as one grouped GEMM "
        "(TEGroupedMLP), their tiles sharing the GPU's waves; `false`: SequentialMLP, one "
        "GEMM per expert after another, each with its own last wave (docs/moe.md)",
        default=None,
        derived="true (Megatron-Core's MoE guide turns it on; its own default is false)",
    )
    overlap_moe_expert_parallel_comm: bool | None = key(
        "Megatron-Core's `--overlap-moe-expert-parallel-comm`: an F&B pair (the forward of "
        "one micro-batch and the backward of another, Megatron's combined 1F1B under "
        "`interleaved`, DualPipe's under `dualpipe` and `dualpipev`) runs its MoE layers "
        "interleaved, each "
        "all-to-all on a communication stream behind the other micro-batch's compute",
        default=None,
        derived="false",
    )
    delay_wgrad_compute: bool | None = key(
        "Megatron-Core's `--delay-wgrad-compute` with `overlap_moe_expert_parallel_comm`: in "
        "an overlapped pair the experts' weight gradients run after the dispatch's dual "
        "all-to-all is launched, under it, rather than before it (Transformer Engine's "
        "`delay_wgrad_compute` stores them for `backward_dw`)",
        default=None,
        derived="false",
    )
    moe_comm_sm_fraction: float | None = key(
        "share of the GPU's SMs the expert all-to-all's kernels hold while overlapped pairs "
        "run (DeepSeek-V3: 20 of 132); the pairs' kernels run on the rest",
        default=None,
        low=0.0,
        high=0.9,
        may_be_zero=True,
        derived="20/132 with `overlap_moe_expert_parallel_comm`, else 0",
    )
    masked_softmax_fusion: bool = key(
        "`unfused` attention only: Megatron's fused scale-mask-softmax kernel where its "
        "shape rule allows (heads per TP rank x micro-batch divisible by 4, sequence "
        "length limits; docs/frameworks.md §9), else PyTorch's fp32 softmax; `false` is "
        "`--no-masked-softmax-fusion`",
        default=True,
    )

    framework: str = key(
        "the training framework whose pipeline engine the run used; each mechanism key "
        "below that the scenario leaves out takes this framework's default "
        "(simulator/scenario/frameworks.py, [docs/frameworks.md](../docs/frameworks.md))",
        default="megatron",
        choices=frameworks.FRAMEWORKS,
    )
    framework_version: str | None = key(
        "the framework's version: megatron `2021` (v2.5/v2.6), `2022` (e1c334b), `2024` "
        "(Megatron-Core r0.8.0), `2025` (Megatron-Core from core_r0.12.1); deepspeed "
        "`0.5.0` (v0.5.0-v0.5.3), `0.5.4` (v0.5.4-v0.7.7)",
        default=None,
        choices=frameworks.ALL_VERSIONS,
        derived="the newest modelled: megatron `2025`, deepspeed `0.5.4`",
        compare=False,
    )
    pipeline_p2p: str | None = mechanism_key(
        "`overlapped`: a non-blocking send when the pass ends; `batched-blocking` "
        "(Megatron): one blocking op per p2p call site holding its sends and receives, each "
        "transfer starting when both stages reach theirs; `sequential-blocking` "
        "(DeepSpeed): one per send or receive in TrainSchedule order, partitioned tensors "
        "after a meta message; blocking: 1f1b (both), gpipe and interleaved (batched)",
        choices=frameworks.PIPELINE_P2P_MODES,
        derived="the framework's (overlapped where its mode is not modelled)",
    )
    scatter_gather_tensors_in_pipeline: bool | None = mechanism_key(
        "TP > 1: each tensor rank sends 1/TP of a pipeline tensor, the receiver all-gathers "
        "it over TP (blocking); `false`: each sends all of it; no effect under sequence "
        "parallelism (the tensor already is 1/TP, no all-gather)"
    )
    pipeline_grads_partitioned: bool | None = mechanism_key(
        "gradients between stages go scattered like activations (with "
        "`scatter_gather_tensors_in_pipeline`); `false`: whole, from every tensor rank"
    )
    pipeline_regather_output: bool | None = mechanism_key(
        "DeepSpeed: a stage frees its partitioned output once sent and all-gathers it over "
        "TP again before the backward (before the gradient's receive if gradients go whole)"
    )
    # the framework's version and every mechanism key as resolved (not keys): set when
    # built, compared instead of the keys as given
    resolved: tuple[tuple[str, Any], ...] = field(init=False, default=())
    framework_note: str = field(init=False, default="", compare=False)

    def __post_init__(self) -> None:
        check_values(self, "training")
        given = {name: getattr(self, name) for name in frameworks.MECHANISMS}
        given["attention_kernel"] = rules.attention_kernel_of(
            self.attention_backend, self.attention_kernel
        )
        version = self.framework_version
        rules.check_framework(self.framework, version, given, self.schedule)
        split = self.split_backward if self.custom_orders is not None else None  # named: by name
        version, values, note = frameworks.resolve(
            self.framework, version, given, self.schedule, split
        )
        resolved = (("framework_version", version), *values.items())
        object.__setattr__(self, "resolved", resolved)
        object.__setattr__(self, "framework_note", note)
        rules.check_training_alone(self)
        rules.check_distributed_optimizer(
            self.use_distributed_optimizer, self.data_parallel_sharding
        )

    def mechanism(self, name: str) -> Any:
        """A mechanism key (or ``framework_version``) as resolved."""
        return dict(self.resolved)[name]

    @property
    def engine_label(self) -> str:
        """e.g. "megatron 2021" (reports name the engine by it)."""
        return frameworks.label(self.framework, self.mechanism("framework_version"))

    @property
    def split_backward(self) -> bool:
        """Whether the schedule runs B (input gradient) and W (weight gradient) apart."""
        if self.custom_orders is not None:
            return any(step.kind == "W" for order in self.custom_orders for step in order)
        return schedules.SCHEDULES[self.schedule].split_backward

    @property
    def accumulates_in_fp32(self) -> bool:
        """Whether gradients accumulate in an fp32 buffer (derived: with bf16)."""
        if self.accumulate_allreduce_grads_in_fp32 is None:
            # arguments.py: forced with --bf16 unless --main-grads-dtype bf16
            return self.params_dtype == "bf16" and self.main_grads_dtype == "fp32"
        return self.accumulate_allreduce_grads_in_fp32

    @property
    def gradient_bytes(self) -> int:
        """Bytes per parameter of the gradient buffer (g in docs/frameworks.md)."""
        return DTYPE_BYTES["fp32" if self.accumulates_in_fp32 else self.params_dtype]

    @property
    def communication_bytes(self) -> int:
        """Bytes per parameter of a data-parallel gradient collective (c)."""
        if self.communication_data_type is not None:
            return DTYPE_BYTES[self.communication_data_type]
        if self.framework == frameworks.DEEPSPEED:
            # DeepSpeed's engine.py `communication_data_type`: the params dtype unless
            # configured, although BF16_Optimizer accumulates in fp32 (frameworks.md §4)
            return DTYPE_BYTES[self.params_dtype]
        return self.gradient_bytes

    @property
    def placement(self) -> str:
        """Which virtual stages a rank's chunks hold (schedules.stage_of)."""
        if self.custom_orders is not None:
            return self.schedule_placement or schedules.LOOPED
        return schedules.SCHEDULES[self.schedule].placement

    @property
    def comm_sm_fraction(self) -> float:
        """`moe_comm_sm_fraction` in effect: as given, else DeepSeek-V3's 20 of 132 SMs
        when pairs overlap (DeepEP's kernels), 0 without overlap."""
        if self.moe_comm_sm_fraction is not None:
            return self.moe_comm_sm_fraction
        return DEEPSEEK_COMM_SMS / DEEPSEEK_SMS if self.moe_overlap else 0.0

    @property
    def moe_overlap(self) -> bool:
        """Whether F&B pairs run their MoE layers overlapped (the overlap key)."""
        return bool(self.overlap_moe_expert_parallel_comm)

    @property
    def offloading(self) -> bool:
        """Whether activation offloading is on: `cpu_offloading`, or a positive
        `cpu_offloading_num_layers` (Megatron-LM's arguments.py turns it on then)."""
        return self.cpu_offloading or self.cpu_offloading_num_layers > 0

    @property
    def offloaded_layers(self) -> int:
        """How many transformer layers (the first) offload their activations: none unless
        offloading is on and offloads activations (Transformer Engine ignores weights)."""
        if not (self.offloading and self.cpu_offloading_activations):
            return 0
        return self.cpu_offloading_num_layers

    @property
    def recomputed(self) -> frozenset[str]:
        """The modules the backward repeats: `recompute_modules` under `selective` (core
        attention alone when unset), none otherwise (`full` repeats every layer whole)."""
        if self.recompute_granularity != RECOMPUTE_SELECTIVE:
            return frozenset()
        if self.recompute_modules is None:
            return frozenset({"core_attn"})
        return frozenset(name.strip() for name in self.recompute_modules.split(","))

    @property
    def permute_fusion(self) -> bool:
        """`moe_permute_fusion` in effect: as given, or true."""
        return self.moe_permute_fusion is not False

    @property
    def grouped_gemm(self) -> bool:
        """`moe_grouped_gemm` in effect: as given, or true."""
        return self.moe_grouped_gemm is not False

    @property
    def moe_dispatcher(self) -> str:
        """`moe_token_dispatcher_type` in effect: as given, or `allgather`."""
        return self.moe_token_dispatcher_type or MOE_ALLGATHER
