"""The run summary: what `stepsim run` prints, from a result's typed metrics."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from stepsim.schedules import DUAL
from stepsim.topologies import PLANAR

from ..comm.choice import tp_choice
from ..comm.placement import placement_of
from ..cost.memory import offload_layer_bytes
from ..cost.optimizer import keeps_remainders, state_bytes_per_param
from ..cost.params import active_params, model_params
from ..cost.routing import rank_loads, skewed
from ..ir.results import Result, StageMetrics
from ..ir.units import bytes_to_gib
from ..ir.vocabulary import (
    ATTENTION_FLASH,
    AUTO,
    CP_COMM,
    EP_COMM,
    MOE_ALLGATHER,
    MOE_ALLTOALL,
    MOE_FLEX,
    NVLS,
    OFFLOAD,
    REDUCE_SCATTER,
    categories_of,
)
from ..scenario import Scenario
from ..scenario.hardware import NETWORK_SOURCES, NODES
from ..scenario.precision import fast_accumulation, fp8_enabled, fp8_param_gather, recipe_of
from ..scenario.softmax import SOURCE as SOFTMAX_SOURCE
from ..scenario.softmax import scenario_softmax_path
from ..scenario.stages import is_uneven
from .labels import assumptions, fabric_text
from .metrics import compute_lanes, spans_per_gpu


def layer_counts(scenario: Scenario) -> str:
    """Transformer layers per pipeline rank (multi-token prediction's included), runs of
    equal counts folded: ``5, 6 x10, 5`` for BLOOM's split."""
    counts = [
        scenario.rank_layers(r) for r in range(scenario.parallel.pipeline_model_parallel_size)
    ]
    runs = [(c, len(list(group))) for c, group in itertools.groupby(counts)]
    return ", ".join(f"{c} x{n}" if n > 1 else str(c) for c, n in runs)


def _grad_reduce_text(tr) -> str:
    """The header's word on the gradient reduce: under DualPipe the copies' sum comes
    first, after the flush, so an overlapped reduce waits for it (dataparallel.py)."""
    if not tr.overlap_grad_reduce:
        return ""
    if tr.placement == DUAL:
        return " · grad reduce after the copies' sum (overlap_grad_reduce has no effect)"
    return " · overlapped grad reduce"


def _collectives_text(result: Result) -> str:
    """`nvls` asked for; or under `auto` on a node whose NVSwitch reduces, what auto runs
    for a micro-batch's TP collective (comm/choice.py), NVLS or the ring by its size."""
    s = result.scenario
    if s.network.collective_algorithm == NVLS:
        return " · NVLS collectives"
    if s.network.collective_algorithm != AUTO or s.cluster.nvls_fraction == 0:
        return ""
    choice = tp_choice(s, result.cluster)
    if choice is None:
        return ""
    kind, name = choice
    what = "reduce-scatter/all-gather" if kind == REDUCE_SCATTER else "all-reduce"
    return f" · auto collectives: TP {what} by {name.upper() if 'nvls' in name else name}"


def _assumed(training) -> str:
    """Says so when the scenario named no framework version: the newest modelled ran."""
    return "" if training.framework_version is not None else "newest modelled, no version set; "


def _p2p_text(training) -> str:
    """How the run's pipeline p2p and scatter-gather were simulated, in a few words."""
    mode = training.mechanism("pipeline_p2p")
    text = f"{mode} p2p"
    for note in filter(None, training.framework_note.split("; ")):  # each change, its head
        text += f", {note.split(':')[0].replace(' p2p', '')}"
    if not training.mechanism("scatter_gather_tensors_in_pipeline"):
        text += ", whole tensors"
    return text


def fp8_text(scenario: Scenario) -> str:
    """The FP8 GEMMs' rate and where their constants came from (uncalibrated unless
    measured on the GPU's own kernels)."""
    gpu, training = scenario.cluster.gpu, scenario.training
    fp8 = gpu.fp8_kernels
    assert fp8 is not None  # a GPU FP8 is allowed on has FP8 tensor cores and constants
    rates = f"{fp8.gemm_efficiency:g}"
    if fast_accumulation(recipe_of(training)):
        rates += f" (fprop, fast accumulation: {fp8.fast_accum_gemm_efficiency:g})"
    gather = "; parameters kept and gathered in FP8" if fp8_param_gather(training) else ""
    return (
        f"linear layers at {rates} of {gpu.peak_tflops_fp8:,g} TFLOP/s x the shape's "
        f"efficiency{gather}; {fp8.source}"
    )


def _optimizer_text(tr) -> str:
    """The precision-aware optimizer's state dtypes, when it is on."""
    if not tr.use_precision_aware_optimizer:
        return ""
    master = "fp32 as 16-bit remainders" if keeps_remainders(tr) else tr.main_params_dtype
    return (
        f" · precision-aware Adam (master {master}, moments {tr.exp_avg_dtype}/"
        f"{tr.exp_avg_sq_dtype}, {state_bytes_per_param(tr):g} bytes per parameter)"
    )


def _fit_text(fit) -> str:
    """What a calibration file's fit rests on, and how well it predicted."""
    return f"{fit.evidence()}, {fit.errors()} ({fit.file})"


def _idle_causes_text(m) -> str:
    """The bubble's parts by cause (metrics.idle_by_cause_s), in % of the iteration."""
    causes = m.idle_by_cause_s
    if causes is None or m.iteration_time_s <= 0:
        return ""
    share = {k: 100 * v / m.iteration_time_s for k, v in causes.items()}
    return (
        f": the schedule's own {share['schedule']:.1f} %, stage imbalance "
        f"{share['imbalance']:.1f} %, waiting on communication {share['communication']:.1f} %"
    )


def summary_text(result: Result) -> str:
    s, m = result.scenario, result.metrics
    par, tr, cl = s.parallel, s.training, s.cluster
    plural = "s" if cl.num_nodes != 1 else ""
    node = f"{cl.node} node{plural}" if cl.node else f"node{plural} of {cl.gpus_per_node} GPUs"
    used = f"{m.num_gpus} GPUs"
    if m.num_gpus < cl.num_gpus:
        used += f" of {cl.num_gpus}"
    places = decimal_places(m.iteration_time_s)  # 4 digits, a trailing 0 kept (35.20 s)
    lines = [
        f"stepsim · {s.name}",
        f"  {used} ({cl.num_nodes} {node}, {cl.gpu.name}, {cl.nics_per_node} x "
        f"{cl.nic_gbps:g} Gb/s NICs per node; {fabric_text(cl)})",
        f"  TP {par.tensor_model_parallel_size} x "
        + (f"CP {par.cp_size} x " if par.cp_size > 1 else "")
        + f"PP {par.pipeline_model_parallel_size} x DP {par.data_parallel_size}"
        + (f" · EP {par.ep_size} x ETP {par.etp_size}" if s.model.moe else "")
        + (f" (layers per stage {layer_counts(s)})" if is_uneven(par) else "")
        + (f" · MTP {s.model.mtp_num_layers} (with the loss)" if s.model.mtp_num_layers else "")
        + (" + sequence parallel" if par.sequence_parallel else "")
        + f" · {m.num_microbatches} micro-batches of {tr.micro_batch_size} per pipeline"
        f" · {tr.schedule}"
        + (
            f" ({par.virtual_pipeline_model_parallel_size} chunks per stage)"
            if par.virtual_pipeline_model_parallel_size > 1
            else ""
        )
        + f" · recompute {tr.recompute_granularity}"
        + (
            f" · activations of {tr.offloaded_layers} layers offloaded to the host"
            if tr.offloaded_layers
            else ""
        )
        + (
            f" · {'fused (cuDNN, as flash)' if tr.attention_backend == 'fused' else 'flash'} "
            "attention"
            if tr.mechanism("attention_kernel") == ATTENTION_FLASH
            else ""
        )
        + (f" · FP8 {tr.fp8_format} ({recipe_of(tr)})" if fp8_enabled(tr) else "")
        + _optimizer_text(tr)
        + (" · TP comm overlapped with GEMMs" if tr.tp_comm_overlap else "")
        + _grad_reduce_text(tr)
        + (" · overlapped param gather" if tr.overlap_param_gather else "")
        + f" · {tr.engine_label} engine ({_assumed(tr)}{_p2p_text(tr)})"
        + f" · {s.network.model} network"
        + _collectives_text(result)
        + (
            f" · {cl.fabric} fabric (drawn whole: no pattern builder)"
            if cl.fabric in PLANAR and s.network.symmetry
            else f" · {cl.fabric} fabric"
            if cl.fabric in PLANAR
            else ""
        )
        + ("" if s.network.symmetry else " · exact mode (every GPU simulated)"),
        "",
        f"  iteration time            {m.iteration_time_s:.{places}f} s",
        f"  throughput                {m.tokens_per_s:,.0f} tokens/s",
        f"  hardware TFLOP/s per GPU  {m.hardware_tflops_per_gpu:.1f}  (recomputation included)",
        f"  model TFLOP/s per GPU     {m.model_tflops_per_gpu:.1f}",
        f"  MFU                       {100 * m.mfu:.1f} %"
        + (f"  (of the BF16 peak, {cl.gpu.peak_tflops:,g} TFLOP/s)" if fp8_enabled(tr) else ""),
        f"  pipeline bubble           {100 * m.bubble_fraction:.1f} % of the iteration"
        + _idle_causes_text(m),
        f"  memory per GPU            {m.memory_per_gpu_gib:.1f} GiB of "
        f"{m.gpu_memory_gib:g} GiB (peak on stage {m.memory_peak_stage})",
        f"  kernel constants          {m.calibration}",
        *(f"  assumes                   {a}" for a in assumptions(s)),
    ]
    if s.measured is not None:  # a calibration file's fit on measured iterations
        lines.append(f"  calibration fit           {_fit_text(s.measured)}")
    network, preset = NETWORK_SOURCES.get(cl.node or ""), NODES.get(cl.node or "", {})
    if network and all(
        getattr(cl, k) == preset[k] for k in ("nvlink_efficiency", "nic_efficiency")
    ):
        lines.append(f"  network constants         {network}")  # the preset's, not set
    if m.fast_forward is not None:
        lines += fast_forward_lines(m.fast_forward, m.num_microbatches)
    if fp8_enabled(tr):
        lines.append(f"  FP8 GEMMs                 {fp8_text(s)}")
    attention = cl.gpu.attention_kernels
    if attention is not None and tr.mechanism("attention_kernel") == "flash":
        lines.append(f"  flash attention           {attention.source}")
    softmax = scenario_softmax_path(s)
    if not softmax.fused:
        lines.append(f"  attention softmax unfused: {softmax.reason} ({SOFTMAX_SOURCE})")
    if tr.offloaded_layers:
        lines += offload_lines(result)
    if par.cp_size > 1:
        lines += context_parallel_lines(result)
    if s.model.moe:
        lines += expert_parallel_lines(result)
    if m.out_of_memory:
        lines.append(f"  WARNING: {m.out_of_memory}")
    iteration = m.iteration_time_s
    places = decimal_places(iteration)
    lines += ["", "  where the time goes, mean per GPU      seconds       %"]
    for category in categories_of(m.breakdown_s):
        value = m.breakdown_s[category.key]
        share = 100 * value / iteration if iteration else 0.0
        lines.append(f"    {category.label:<34}{value:>10.{places}f}{share:>8.1f}")
    lines += ["", _stage_table(m.stages, places)]
    if m.perturbations:
        lines += perturbation_lines(result)
    if m.busiest_links:
        lines += [
            "",
            "  busiest links of each kind     mean    peak  (utilization: over the iteration; "
            "in its busiest 1 %)",
        ]
        for link in m.busiest_links:
            lines.append(
                f"    {link.kind:<7}{link.gbytes:>10.3g} GB  {100 * link.utilization:5.1f} %  "
                f"{100 * link.peak_utilization:5.1f} %  {link.link}"
            )
    return "\n".join(lines)


def fast_forward_lines(ff, num_microbatches: int) -> list[str]:
    """Says that the steady state was fast-forwarded (simulator/run/fastforward.py)."""
    period = (
        "micro-batch"
        if ff.period_microbatches == 1
        else (f"{ff.period_microbatches} micro-batches")
    )
    return [
        f"  fast-forward              {ff.simulated_microbatches} of {num_microbatches:,} "
        f"micro-batches simulated; the state was proved to repeat every {period} "
        f"({ff.period_s:.4g} s, from {ff.proved_at_s:.4g} s) and {ff.periods_skipped:,} "
        f"periods were added (trace.json shows the {ff.simulated_microbatches} simulated; "
        "the timeline the whole iteration, the period repeated)",
    ]


# the causes of waiting a summary lists (metrics.json has them all)
WAIT_CAUSES_SHOWN = 5


def perturbation_lines(result: Result) -> list[str]:
    """What was perturbed, how it was simulated, and who waited for whom."""
    s, m = result.scenario, result.metrics
    lines = ["", "  perturbations"]
    lines += [f"    {i + 1}. {text}" for i, text in enumerate(m.perturbations)]
    if result.classes is not None:
        c = result.classes
        n = len(c.ranks) * len(c.replicas)
        lines.append(
            f"    symmetric mode, in classes: {n} class{'es' if n > 1 else ''} of GPUs "
            f"a stage ({len(c.ranks)} of tensor ranks x {len(c.replicas)} of replicas) ran "
            f"alike, found in {c.runs} run{'s' if c.runs > 1 else ''}: every class transfer's "
            f"members held at its rate (the max-min certificate): exact mode's result, to rounding"
        )
    elif s.network.symmetry:
        placement = placement_of(s)
        lanes = compute_lanes(result.workload.lanes)
        replicas = sorted({placement.replica_of(lane.gpu) for lane in lanes} - {0})
        per_gpu = sum(1 for lane in lanes if lane.stands_for == 1)
        shown = ", ".join(map(str, replicas[:8])) + (", ..." if len(replicas) > 8 else "")
        lines.append(
            f"    symmetric mode: replica{'s' if len(replicas) != 1 else ''} {shown} simulated "
            f"beside the representatives ({per_gpu} lanes of one GPU, "
            f"{len(lanes) - per_gpu - s.parallel.pipeline_model_parallel_size} of a TP group)"
        )
    total = sum(w.gpu_seconds for w in m.waits)
    gpu_s = m.iteration_time_s * m.num_gpus
    share = 100 * total / gpu_s if gpu_s else 0.0
    lines += [
        "",
        f"  waits at collectives for the last member: {total:.4g} GPU-s "
        f"({share:.2f} % of all GPU time), by cause",
    ]
    for w in m.waits[:WAIT_CAUSES_SHOWN]:
        lines.append(f"    {w.gpu_seconds:>10.4g} GPU-s  {w.cause}")
    if len(m.waits) > WAIT_CAUSES_SHOWN:
        rest = sum(w.gpu_seconds for w in m.waits[WAIT_CAUSES_SHOWN:])
        lines.append(f"    {rest:>10.4g} GPU-s  {len(m.waits) - WAIT_CAUSES_SHOWN} other causes")
    return lines


def offload_lines(result: Result) -> list[str]:
    """Activation offloading (emit/offload.py): how many layers, the bytes each GPU
    copies to the host and back per iteration, over which link, and what the compute
    stream waited for them."""
    s, m = result.scenario, result.metrics
    cl = s.cluster
    copied = 2 * math.fsum(offload_layer_bytes(s)) * s.num_microbatches
    host = cl.host_link_bytes_per_s
    link = (
        f"its own host link ({host / 1e9:g} GB/s per direction)"
        if host is not None
        else f"PCIe ({cl.pcie_gbytes_per_s:g} GB/s per direction, shared with its NIC)"
    )
    exposed_s = m.breakdown_s.get(OFFLOAD, 0.0)
    share = 100 * exposed_s / m.iteration_time_s if m.iteration_time_s else 0.0
    return [
        f"  activation offload        {s.training.offloaded_layers} of {s.model.num_layers} "
        f"layers (Transformer Engine's default scheduling): {copied / 1e9:.4g} GB per GPU "
        f"per iteration to the host and back over {link}, {exposed_s:.4g} s exposed "
        f"({share:.1f} % of the iteration)",
    ]


def context_parallel_lines(result: Result) -> list[str]:
    """What context parallelism does in this run: its size and exchange, where its
    groups sit, and its communication: on the wire (mean per simulated GPU, overlapped
    or not) against what the compute stream waited for."""
    s, m = result.scenario, result.metrics
    par = s.parallel
    wire_s = _wire_s(result, CP_COMM)
    exposed_s = m.breakdown_s.get(CP_COMM, 0.0)
    text = context_text(s)
    return [
        f"  context parallel          CP {par.cp_size}, {text}",
        f"  CP communication          {wire_s:.4g} s per GPU on the wire, {exposed_s:.4g} s "
        f"exposed ({100 * exposed_s / m.iteration_time_s if m.iteration_time_s else 0:.1f} % "
        "of the iteration)",
    ]


def _wire_s(result: Result, kind: str) -> float:
    """Seconds per simulated GPU that ``kind``'s transfers were in flight. A
    fast-forwarded run's trace is the short run's: the skipped periods are added as
    copies of its proved period (simulator/run/fastforward.py)."""
    wire_s, lanes = 0.0, compute_lanes(result.trace.lanes)
    gpus = {lane.gpu for lane in lanes}
    ff = result.metrics.fast_forward
    t0 = ff.proved_at_s if ff is not None else 0.0
    t1 = t0 + ff.period_s if ff is not None else 0.0
    window_s = 0.0
    for gpu, _stream, span_kind, _label, _mb, start_s, end_s, _op in spans_per_gpu(result.trace):
        if span_kind == kind and gpu in gpus:
            wire_s += end_s - start_s
            if end_s > t0 and start_s < t1:
                window_s += min(end_s, t1) - max(start_s, t0)
    if ff is not None:
        wire_s += ff.periods_skipped * window_s
    return wire_s / max(1, len(lanes))


def expert_parallel_lines(result: Result) -> list[str]:
    """What the MoE layers are and how their tokens travel: experts, top-k, the
    dispatcher and where its groups sit; the expert-parallel communication on the wire
    against its exposed part (docs/moe.md)."""
    s, m = result.scenario, result.metrics
    model, par, cl = s.model, s.parallel, s.cluster
    tied = s.training.share_embeddings_and_output_weights
    total, active = model_params(model, tied), active_params(model, tied)
    span = par.ep_size * par.etp_size
    where = (
        "inside a node" if span <= cl.gpus_per_node else f"across {span // cl.gpus_per_node} nodes"
    )
    how = {
        MOE_ALLTOALL: f"all-to-all over EP groups of {par.ep_size} GPUs {par.etp_size} apart",
        MOE_ALLGATHER: f"all-gather / reduce-scatter over EP x ETP groups of {span} GPUs",
        MOE_FLEX: f"DeepEP over EP groups of {par.ep_size} GPUs, once per node and GPU",
    }[s.training.moe_dispatcher]
    lines = [
        f"  mixture of experts        {model.num_experts} experts, top-{model.router_topk}, "
        f"{model.num_moe_layers} of {model.num_layers} layers; {total / 1e9:.1f}B parameters, "
        f"{active / 1e9:.1f}B active (MFU counts the active)",
        f"  expert parallel           {s.training.moe_dispatcher} dispatcher: {how}, {where}; "
        f"expert grads over {par.expert_data_parallel_size} "
        f"GPU{'s' if par.expert_data_parallel_size > 1 else ''}",
    ]
    if skewed(model):  # which routing, and how far the busiest EP rank is above the mean
        routing = model.moe_routing or "imbalanced"
        if routing == "zipf":
            x = model.moe_routing_zipf_exponent
            routing += f" (exponent {1.0 if x is None else x:g})"  # routing.expert_shares
        elif routing == "imbalanced":
            v = model.expert_load_violation
            given = model.moe_expert_load_max_violation is not None
            where = (
                "as given"
                if given
                else "Wang et al. 2024's "
                + ("loss-free" if model.moe_router_enable_expert_bias else "aux-loss")
                + " MaxVio"
            )
            routing += f" (busiest expert {1 + v:.3g} x the mean, {where})"
        loads = rank_loads(model, par.ep_size)
        lines.append(
            f"  routing                   {routing}: the busiest EP rank (rank "
            f"{loads.index(max(loads))}) gets {max(loads):.3g} x the balanced load"
        )
    if span > 1:
        exposed_s = m.breakdown_s.get(EP_COMM, 0.0)
        share = 100 * exposed_s / m.iteration_time_s if m.iteration_time_s else 0.0
        lines.append(
            f"  EP communication          {_wire_s(result, EP_COMM):.4g} s per GPU on the wire, "
            f"{exposed_s:.4g} s exposed ({share:.1f} % of the iteration)"
        )
    return lines


def context_text(scenario: Scenario) -> str:
    """The context-parallel exchange and where a CP group sits: CP peers are TP-adjacent
    (rank order tp-cp-dp-pp), so a group spans TP x CP consecutive GPUs."""
    par, cl = scenario.parallel, scenario.cluster
    span = par.tensor_model_parallel_size * par.cp_size
    where = (
        "inside a node" if span <= cl.gpus_per_node else f"across {span // cl.gpus_per_node} nodes"
    )
    how = {
        "p2p": "K/V ring (p2p), each step's send overlapped with a block of attention",
        "all_gather": "K/V all-gathered before attention (all_gather), dK/dV reduce-scattered",
        "a2a": "all-to-all of Q, K, V and the output (a2a, Ulysses)",
    }[par.cp_comm]
    return f"{how}; groups of {par.cp_size} GPUs {par.tensor_model_parallel_size} apart, {where}"


def decimal_places(total_s: float, digits: int = 4) -> int:
    """Decimals that show ``total_s`` to ``digits`` significant digits: every part of it
    in a table is then printed with the same places, so columns line up and a small part
    reads as small (0.07 next to 7.09, not 0.07314 next to 7)."""
    if total_s <= 0 or not math.isfinite(total_s):
        return digits
    return max(0, digits - 1 - math.floor(math.log10(total_s)))


def _stage_table(stages: Sequence[StageMetrics], places: int) -> str:
    keys = list(stages[0].breakdown_s) if stages else []
    head = "  per stage (seconds)  " + "".join(f"{k:>10}" for k in keys) + "   mem GiB"
    rows = [head]
    shown = list(stages) if len(stages) <= 12 else [*stages[:5], None, *stages[-5:]]
    for stage in shown:
        if stage is None:
            rows.append("    ...")
            continue
        values = "".join(f"{stage.breakdown_s[k]:>10.{places}f}" for k in keys)
        rows.append(
            f"    stage {stage.stage:<3} x{stage.stands_for_gpus:<5}  {values}"
            f"{bytes_to_gib(stage.memory.total_bytes):>10.1f}"
        )
    return "\n".join(rows)
