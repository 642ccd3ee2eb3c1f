"""The op times a timed schedule is built from (ZB-V as its authors build it).

The authors' runtime profiles the first iterations and hands their scheduler, for
every chunk of every rank, the mean forward, backward and weight-gradient time in
whole microseconds (zerobubble/timer.py, `ScheduleTimers.conclusion`); it averages
each rank's chunks and takes the median over ranks (the upper one for an even
count, at least 1 us: runtime.py `avg_then_mid`), benchmarks one hand-over between
stages and takes the slowest rank's (`comm_time`), and approximates the memory of
the passes from the model's shape: forward 34h + 5as, weight gradient -32h, backward
the rest (runtime.py, `f_mem_approx`). stepsim has no profile to take, so it hands
the same construction what its own models say those would measure, contention-free:

- F, B, W of each chunk: the compute model's kernel times (cost.compute) for the
  chunk's own layers (an MoE layer's from cost.moe), the embedding on the first
  stage and the output layer on the last; recomputation inside B, as in the
  simulation. Unlike the authors' wall-clock timers they leave out the
  communication the passes wait for (TP, CP, EP collectives).
- the hop: one micro-batch's activations (1/T of them under sequence parallelism)
  alone on the slowest link a hand-over crosses: the GPU's share of its server's NICs
  when some pair of neighbouring stages sits on two servers, else NVLink, at the
  cluster's link efficiencies, plus the links' latencies.
"""

from __future__ import annotations

from stepsim.schedules import SCHEDULES, ZbvTimes, default_memory

from ..ir.units import gbps_to_bytes_per_s, gbytes_per_s_to_bytes_per_s, us_to_s
from ..scenario import Scenario
from .compute import ComputeModel
from .kernels import BYTES_PER_ELEMENT
from .moe import moe_block_work, moe_recompute_s
from .params import rank_moe_flags


def _us(seconds: float) -> int:
    return int(seconds * 1_000_000)  # the authors' timers: whole microseconds


def _avg_then_mid(per_rank: list[list[int]]) -> float:
    """Each rank's chunks averaged, then the median over ranks, at least 1."""
    means = sorted(sum(chunks) / len(chunks) for chunks in per_rank)
    return max(means[len(means) // 2], 1)


def schedule_times(scenario: Scenario) -> ZbvTimes | None:
    """What a timed schedule is built from (in microseconds, as the authors' profile
    gives them), or None when the scenario's schedule does not depend on op times (or
    is a custom order)."""
    tr = scenario.training
    if tr.custom_orders is not None or not SCHEDULES[tr.schedule].timed:
        return None
    model = ComputeModel(scenario)
    layer, extras = model.layer(), model.extras()
    dense_f = (layer.attention_forward + layer.mlp_forward).duration_s
    dense_w = (layer.attention_weight + layer.mlp_weight).duration_s
    dense_b = (layer.attention_backward + layer.mlp_backward).duration_s - dense_w
    recompute, modules = tr.recompute_granularity, tr.recomputed
    dense_r = layer.recompute_s(recompute, dense_f, modules)
    per_layer = {False: (dense_f, dense_b + dense_r, dense_w)}
    if scenario.model.moe:
        moe = moe_block_work(model)
        moe_f = (layer.attention_forward + moe.forward).duration_s
        moe_w = (layer.attention_weight + moe.weight).duration_s
        moe_b = (layer.attention_backward + moe.backward).duration_s - moe_w
        moe_r = layer.recompute_s(recompute, moe_f, modules - {"mlp"})
        moe_r += moe_recompute_s(moe, modules)
        per_layer[True] = (moe_f, moe_b + moe_r, moe_w)
    p = scenario.parallel.pipeline_model_parallel_size
    last = 2 * p - 1  # V placement: rank 0 holds the first stage and the last
    embedding = (
        extras.embedding_forward.duration_s,
        (extras.embedding_backward - extras.embedding_weight).duration_s,
        extras.embedding_weight.duration_s,
    )
    output = (
        extras.output_forward.duration_s,
        (extras.output_backward - extras.output_weight).duration_s,
        extras.output_weight.duration_s,
    )
    times: list[list[list[int]]] = [[], [], []]  # [F, B, W][rank][chunk], microseconds
    for rank in range(p):
        flags = rank_moe_flags(scenario, rank) if scenario.model.moe else None
        counts = scenario.chunk_layers[rank]
        sums = []
        for chunk, count in enumerate(counts):
            start = sum(counts[:chunk])
            total = [0.0, 0.0, 0.0]
            for index in range(start, start + count):
                for n, value in enumerate(per_layer[bool(flags and flags[index])]):
                    total[n] += value
            stage = rank if chunk == 0 else last - rank
            for edge, at in ((embedding, 0), (output, last)):
                if stage == at:
                    total = [t + e for t, e in zip(total, edge, strict=True)]
            sums.append(total)
        for n in range(3):
            times[n].append([_us(chunk[n]) for chunk in sums])
    f_mem, b_mem, w_mem = default_memory(
        scenario.model.hidden_size, scenario.model.num_attention_heads, scenario.model.seq_length
    )
    return ZbvTimes(
        forward=_avg_then_mid(times[0]),
        backward=_avg_then_mid(times[1]),
        weight=_avg_then_mid(times[2]),
        hop=_us(hop_s(scenario)),
        f_mem=f_mem,
        b_mem=b_mem,
        w_mem=w_mem,
    )


def hop_s(scenario: Scenario) -> float:
    """One micro-batch's hand-over between neighbouring stages, alone on the slowest
    links one crosses (GPU (j, d) of stage s is GPU s x T x CP x D + ... in Megatron's
    rank order, so stages pack the servers in order)."""
    par, cl, m = scenario.parallel, scenario.cluster, scenario.model
    tokens = scenario.training.micro_batch_size * m.seq_length // par.cp_size
    nbytes: float = tokens * m.hidden_size * BYTES_PER_ELEMENT
    if par.sequence_parallel:
        nbytes /= par.tensor_model_parallel_size
    gpus_per_stage = par.tensor_model_parallel_size * par.cp_size * par.data_parallel_size
    stages = par.pipeline_model_parallel_size
    if gpus_per_stage * stages <= cl.gpus_per_node:  # every hand-over within one server
        rate = gbytes_per_s_to_bytes_per_s(cl.nvlink_gbytes_per_s) * cl.nvlink_efficiency
        return us_to_s(cl.nvlink_latency_us) + nbytes / rate
    nics_per_gpu = min(1.0, cl.nics_per_node / cl.gpus_per_node)
    rate = gbps_to_bytes_per_s(cl.nic_gbps) * nics_per_gpu * cl.nic_efficiency
    latency = us_to_s(2 * cl.pcie_latency_us + cl.ib_latency_us)
    return latency + nbytes / rate
