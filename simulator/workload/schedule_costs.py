"""The op times a timed schedule is built from (ZB-V as its authors build it).

The authors' runtime profiles one iteration and hands their scheduler the mean
forward, backward and weight-gradient time of a pipeline chunk and the time of one
hand-over between ranks (zero-bubble-pipeline-parallelism, runtime.py: ``f_mid``,
``b_mid``, ``w_mid``, ``c``). stepsim has no profile to take, so it gives the
scheduler what its own models say those would measure, contention-free:

- F, B, W: the compute model's kernel times (workload.compute) for the model's
  layers, the embedding and the output layer, each summed over the whole model and
  divided by the 2p chunks (the mean chunk, as the authors average over stages).
  Recomputation runs inside B, as it does in the simulation. For an MoE model the
  MoE layers use the MoE block's kernels (workload.moe); the expert dispatch's time
  is communication and is not in these times.
- the hop: one micro-batch's activations (1/T of them under sequence parallelism)
  over the link between two neighbouring stages' GPUs alone: NVLink when the stages
  share a server, else the GPU's share of its server's NICs, at the cluster's link
  efficiencies, plus the links' latencies.

Memory per op takes the ZbvTimes defaults (in units of one forward).
"""

from __future__ import annotations

from stepsim.schedules import SCHEDULES, ZbvTimes

from ..scenario import Scenario
from ..units import us_to_s
from ..vocabulary import RECOMPUTE_FULL, RECOMPUTE_NONE, RECOMPUTE_SELECTIVE
from .compute import ComputeModel
from .moe import moe_block_work

BYTES_PER_ELEMENT = 2


def schedule_times(scenario: Scenario) -> ZbvTimes | None:
    """What a timed schedule is built from, or None when the scenario's schedule does
    not depend on op times (or is a custom order)."""
    tr = scenario.training
    if tr.custom_orders is not None or not SCHEDULES[tr.schedule].timed:
        return None
    model = ComputeModel(scenario)
    layer, extras = model.layer(), model.extras()
    dense_f = (layer.attention_forward + layer.mlp_forward).duration_s
    dense_b = (layer.attention_backward + layer.mlp_backward).duration_s
    dense_w = (layer.attention_weight + layer.mlp_weight).duration_s
    recompute = {
        RECOMPUTE_NONE: 0.0,
        RECOMPUTE_SELECTIVE: layer.attention_core_forward.duration_s,
        RECOMPUTE_FULL: dense_f,
    }[tr.recompute_granularity]
    spec = scenario.model
    num_moe = spec.num_moe_layers if spec.moe else 0
    forward = (spec.num_layers - num_moe) * dense_f
    backward = (spec.num_layers - num_moe) * (dense_b - dense_w + recompute)
    weight = (spec.num_layers - num_moe) * dense_w
    if num_moe:
        moe = moe_block_work(model)
        moe_f = layer.attention_forward + moe.pre + moe.experts + moe.post + moe.shared + moe.tail
        moe_f = moe_f.duration_s
        moe_b = (
            layer.attention_backward
            + moe.tail_b
            + moe.shared_b
            + moe.post_b
            + moe.experts_b
            + moe.pre_b
        ).duration_s
        moe_w = (layer.attention_weight + moe.pre_w + moe.experts_w + moe.shared_w).duration_s
        moe_recompute = moe_f if tr.recompute_granularity == RECOMPUTE_FULL else recompute
        forward += num_moe * moe_f
        backward += num_moe * (moe_b - moe_w + moe_recompute)
        weight += num_moe * moe_w
    forward += (extras.embedding_forward + extras.output_forward).duration_s
    edge_w = (extras.embedding_weight + extras.output_weight).duration_s
    backward += (extras.embedding_backward + extras.output_backward).duration_s - edge_w
    weight += edge_w
    chunks = scenario.parallel.pipeline_model_parallel_size * 2
    return ZbvTimes(
        forward=forward / chunks,
        backward=backward / chunks,
        weight=weight / chunks,
        hop=hop_s(scenario),
    )


def hop_s(scenario: Scenario) -> float:
    """One micro-batch's hand-over between neighbouring stages, alone on its links."""
    par, cl, m = scenario.parallel, scenario.cluster, scenario.model
    tokens = scenario.training.micro_batch_size * m.seq_length // par.cp_size
    nbytes = tokens * m.hidden_size * BYTES_PER_ELEMENT
    if par.sequence_parallel:
        nbytes /= par.tensor_model_parallel_size
    gpus_per_stage = par.tensor_model_parallel_size * par.cp_size * par.data_parallel_size
    if gpus_per_stage < cl.gpus_per_node:  # the next stage's GPU shares the server
        rate = cl.nvlink_gbytes_per_s * 1e9 * cl.nvlink_efficiency
        return us_to_s(cl.nvlink_latency_us) + nbytes / rate
    nics_per_gpu = min(1.0, cl.nics_per_node / cl.gpus_per_node)
    rate = cl.nic_gbps * 1e9 / 8 * nics_per_gpu * cl.nic_efficiency
    latency = us_to_s(2 * cl.pcie_latency_us + cl.ib_latency_us)
    return latency + nbytes / rate
