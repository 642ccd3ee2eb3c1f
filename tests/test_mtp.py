"""Multi-token prediction (`model.mtp_num_layers`, Megatron-Core's
multi_token_prediction.py): its layers on the last virtual stage, its extras with the
output layer's, by closed form."""

import dataclasses

import pytest

from stepsim.cost.compute import ComputeModel
from stepsim.cost.params import rank_moe_flags
from stepsim.run.iteration import run
from stepsim.scenario import ScenarioError
from tests.helpers import load

H, S, V = 1024, 1024, 32000


def _scenario(mtp=None, pp=2, vp=1, **training):
    model = {"num_layers": 4, "hidden_size": H, "seq_length": S, "vocab_size": V}
    if mtp is not None:
        model["mtp_num_layers"] = mtp
    parallel = {"pipeline_model_parallel_size": pp}
    if vp > 1:
        parallel["virtual_pipeline_model_parallel_size"] = vp
    return load(
        model=model,
        parallel=parallel,
        training={"global_batch_size": 8, **training},
    )


def test_mtp_layers_join_the_last_virtual_stage():
    assert _scenario().chunk_layers == ((2,), (2,))
    assert _scenario(mtp=1).chunk_layers == ((2,), (3,))
    interleaved = _scenario(mtp=2, pp=2, vp=2, schedule="interleaved")
    assert interleaved.chunk_layers == ((1, 1), (1, 3))


def test_mtp_extras_are_an_embedding_two_norms_a_projection_and_the_output_again():
    base, mtp = ComputeModel(_scenario()), ComputeModel(_scenario(mtp=1))
    e, tokens = 2, S  # micro-batch 1, no CP
    b, m = base.extras(), mtp.extras()
    expected = (
        b.embedding_forward.duration_s
        + base.memory_bound(2 * 2 * e * tokens * H).duration_s
        + base.gemm(tokens, H, 2 * H).duration_s
        + b.output_forward.duration_s
    )
    assert m.output_forward.duration_s - b.output_forward.duration_s == pytest.approx(expected)
    # FLOPs: the projection's and the logits' again, forward
    extra_flops = 2 * tokens * H * 2 * H + 2 * tokens * V * H
    assert m.output_forward.flops - b.output_forward.flops == pytest.approx(extra_flops)
    assert m.embedding_forward == b.embedding_forward


def test_mtp_runs_one_more_layer_on_the_last_stage_and_counts_its_flops():
    """The run's model FLOPs grow, per micro-batch, by one layer's forward and backward
    and the MTP extras' (the projection, the logits and loss again)."""

    def model_flops(scenario):
        m = run(scenario).metrics
        return m.model_tflops_per_gpu * 1e12 * m.iteration_time_s * scenario.parallel.num_gpus

    base, mtp = _scenario(), _scenario(mtp=1)
    layer = ComputeModel(mtp).layer()
    b, m = ComputeModel(base).extras(), ComputeModel(mtp).extras()
    per_microbatch = (
        (
            layer.attention_forward
            + layer.mlp_forward
            + layer.attention_backward
            + layer.mlp_backward
        ).flops
        + (m.output_forward.flops + m.output_backward.flops)
        - (b.output_forward.flops + b.output_backward.flops)
    )
    assert model_flops(mtp) - model_flops(base) == pytest.approx(
        base.num_microbatches * per_microbatch, rel=1e-9
    )
    assert run(mtp).metrics.iteration_time_s > run(base).metrics.iteration_time_s


def test_an_moe_model_predicts_with_an_moe_layer():
    scenario = load(
        model={
            "num_layers": 2,
            "hidden_size": H,
            "seq_length": S,
            "num_experts": 8,
            "mtp_num_layers": 1,
        },
        training={"global_batch_size": 8},
    )
    assert rank_moe_flags(scenario, 0) == [True, True, True]


def test_mtp_depths_are_checked():
    with pytest.raises(ScenarioError, match="model.mtp_num_layers=0 must be"):
        dataclasses.replace(_scenario().model, mtp_num_layers=0)
    with pytest.raises(ScenarioError, match="model.mtp_num_layers=17 must be"):
        dataclasses.replace(_scenario().model, mtp_num_layers=17)
