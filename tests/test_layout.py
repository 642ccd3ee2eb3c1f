"""`parallel.pipeline_model_parallel_layout` (Megatron-Core's layout string,
megatron/core/transformer/pipeline_parallel_layer_layout.py): parsing, the checks, the
layers per chunk, and runs against the even split they spell."""

import pytest

from stepsim.ir.vocabulary import FORWARD
from stepsim.run.iteration import run
from stepsim.scenario import ScenarioError
from stepsim.scenario.stages import parse_layout
from tests.helpers import load

H, S = 1024, 1024


def _scenario(layout=None, layers=8, pp=2, vp=2, mtp=None, **sections):
    model = {"num_layers": layers, "hidden_size": H, "seq_length": S}
    if mtp:
        model["mtp_num_layers"] = mtp
    parallel = {"pipeline_model_parallel_size": pp, **sections.pop("parallel", {})}
    if vp > 1:
        parallel["virtual_pipeline_model_parallel_size"] = vp
    if layout is not None:
        parallel["pipeline_model_parallel_layout"] = layout
    training = {"global_batch_size": 8, "schedule": "interleaved" if vp > 1 else "1f1b"}
    return load(
        model=model, parallel=parallel, training={**training, **sections.pop("training", {})}
    )


def test_the_layout_string_unrolls_as_megatron_core_reads_it():
    # the example in Megatron-Core's parse_str_to_list docstring
    stages = parse_layout("Et*3|(tt|)*29,m|L")
    assert stages == ["Ettt"] + ["tt"] * 29 + ["m", "L"]
    assert parse_layout("E,t|t,L") == ["Et", "tL"]


def test_virtual_stage_i_is_chunk_i_over_p_of_rank_i_mod_p():
    scenario = _scenario("Et|ttt|tt|ttL")
    assert scenario.chunk_layers == ((1, 2), (3, 2))
    # an MTP layer counts on its stage; an embedding- or loss-only end stage holds none
    mtp = _scenario("E|tttt|tttt|mL", mtp=1)
    assert mtp.chunk_layers == ((0, 4), (4, 1))


def test_a_layout_of_the_even_split_runs_as_the_even_split():
    even, spelled = _scenario(), _scenario("Ett|tt|tt|ttL")
    assert spelled.chunk_layers == even.chunk_layers
    assert run(spelled).metrics.iteration_time_s == run(even).metrics.iteration_time_s


@pytest.mark.parametrize("p2p", ["batched-blocking", "overlapped"])
def test_an_end_stage_without_layers_waits_for_its_input(p2p):
    """A loss-only last stage computes the logits of micro-batch 0 only after the stage
    before it has sent its forward, and an embedding-only first stage the embedding's
    gradient only after the gradient came back, blocking receives or not."""
    result = run(_scenario("E|tttt|tttt|L", training={"pipeline_p2p": p2p}))
    spans = [s for s in result.trace.spans if s.microbatch == 0 and s.kind == FORWARD]
    # virtual stage 2 (rank 0, chunk 1) then 3 (rank 1, chunk 1): labels name the chunk
    before = max(s.end_s for s in spans if s.gpu == 0 and s.label == "F0.1")
    loss = min(s.start_s for s in spans if s.gpu != 0 and s.label == "F0.1")
    assert loss > before
    backward = [s for s in result.trace.spans if s.microbatch == 0 and s.label == "B0.0"]
    returned = max(s.end_s for s in result.trace.spans if s.gpu != 0 and s.label == "B0.0")
    assert min(s.start_s for s in backward if s.gpu == 0 and s.kind != "pp_wait") >= returned
    assert result.metrics.iteration_time_s > 0


@pytest.mark.parametrize(
    "layout, sections, match",
    [
        ("Et|tt|tt|tx", {}, "has 'x' where a layer letter is expected"),
        ("Ett|tt|ttL", {}, "has 3 stages; it needs .* 2 x 2 = 4"),
        ("tEt|tt|tt|ttL", {}, "must begin the first stage with the one embedding E"),
        ("Ett|tt|tt|tLt", {}, "must end the last stage with the one loss L"),
        ("Ett|tt|tt|tL", {}, "has 7 t; model.num_layers=8"),
        ("Ett|tt|tt|ttmL", {}, "has 1 m; model.mtp_num_layers=0"),
        ("Ett||tttt|ttL", {}, "leaves virtual stage 1 empty"),
        # checked before the string is built: no gigabytes of letters, no hang
        ("E(tt|)*999999999|L", {}, "unrolls past 1,000,000 letters"),
        ("Et*" + "9" * 5000 + "|L", {}, "unrolls past 1,000,000 letters"),
        (
            "Ett|tt|tt|ttL",
            {"parallel": {"decoder_first_pipeline_num_layers": 4}},
            "cannot be set together with parallel.decoder_first_pipeline_num_layers",
        ),
    ],
)
def test_layout_errors_name_the_key_and_the_rule(layout, sections, match):
    with pytest.raises(ScenarioError, match=match) as error:
        _scenario(layout, **sections)
    assert "parallel.pipeline_model_parallel_layout" in str(error.value)


def test_mtp_must_follow_the_decoder_layers():
    with pytest.raises(ScenarioError, match="decoder layers t before the MTP layers m"):
        _scenario("Ett|tt|tm|tttL", mtp=1)


def test_a_layout_is_refused_under_dualpipe():
    with pytest.raises(ScenarioError, match="applies to the looped schedules"):
        _scenario(
            "Ett|tt|tt|ttL",
            pp=4,
            vp=1,
            training={"schedule": "dualpipe", "share_embeddings_and_output_weights": False},
        )


def test_a_split_schedule_keeps_an_embedding_only_stage_s_weight_gradient():
    """Under interleaved zero-bubble's split backward the embedding's weight gradient of
    an embedding-only first stage runs in its W. "E|tttt|tttt|L" puts 4 layers and one
    end on each rank, as the even split does: the same kernels, the same compute."""
    split = {"schedule": "interleaved_zb"}
    layout = run(_scenario("E|tttt|tttt|L", training=split)).metrics
    even = run(_scenario(training=split)).metrics
    assert layout.breakdown_s["compute"] == pytest.approx(even.breakdown_s["compute"], rel=1e-12)
    # and as the unsplit schedule's: the embedding's dropout backward stays in B
    plain = run(_scenario()).metrics
    assert even.breakdown_s["compute"] == pytest.approx(plain.breakdown_s["compute"], rel=1e-12)
