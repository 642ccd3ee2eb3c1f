"""DualPipe and DualPipeV: orders, rules, F&B pairs, and the DualPipe README's closed forms."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepsim.run.bubble import OpTimes, run_schedule
from stepsim.schedules import (
    DUAL,
    V_SHAPE,
    Step,
    build,
    check,
    holder_of,
    order_labels,
    overlapped,
    peak_inflight,
    stage_of,
    upstream,
)
from stepsim.schedules.custom import check_orders, parse_orders

ROOT = Path(__file__).resolve().parents[1]

# rank 0 of the DualPipe README's DualPipeV figure (4 ranks, 10 micro-batches), read off it
DUALPIPEV_P4_M10_RANK0 = (
    "F0.0 F1.0 F2.0 F3.0 F4.0 F5.0 F6.0 F0.1 B0.1 W0.1 F1.1 B1.1 W1.1 F2.1 B2.1 W2.1 F3.1 "
    "F7.0&B3.1 F4.1&B0.0 F8.0&B4.1 F5.1&B1.0 F9.0&B5.1 F6.1&B2.0 B6.1 F7.1&B3.0 B7.1 "
    "F8.1&B4.0 B8.1 F9.1&B5.0 B9.1 B6.0 W6.0 B7.0 W7.0 B8.0 W8.0 B9.0 W9.0"
)


def test_dualpipev_rank0_is_the_readme_figure():
    orders = build("dualpipev", 4, 10, 2)
    assert " ".join(order_labels(orders[0], 2)) == DUALPIPEV_P4_M10_RANK0
    # the last rank's first steady pair runs unoverlapped (the sources' NOTE)
    assert " ".join(order_labels(orders[3], 2)).startswith(
        "F0.0 F0.1 F1.0 F1.1 F2.0 F2.1 F3.0 F3.1 F4.0 B0.1 F4.1&B0.0"
    )


@pytest.mark.parametrize(("name", "p", "m"), [("dualpipev", 4, 10), ("dualpipe", 4, 8)])
def test_orders_run_and_print_back(name, p, m):
    placement = V_SHAPE if name == "dualpipev" else DUAL
    orders = build(name, p, m, 2)
    check_orders(orders, placement)
    text = "\n".join(" ".join(order_labels(o, 2)) for o in orders)
    again = parse_orders(text)
    assert again == orders
    assert [[s.overlapped for s in o] for o in again] == [[s.overlapped for s in o] for o in orders]


def test_dual_placement_two_copies():
    p = 4
    for r in range(p):
        # chunk 0: stage r of copy 0 (stages 0..p-1); chunk 1: stage p-1-r of copy 1 (p..2p-1)
        assert stage_of(r, 0, p, DUAL) == r
        assert stage_of(r, 1, p, DUAL) - p == p - 1 - r
        assert holder_of(stage_of(r, 1, p, DUAL), p, DUAL) == (r, 1)
    # the copies are two pipelines: copy 1's first stage (rank p-1) takes no input
    assert upstream(p - 1, Step("F", 5, 1), p, 2, DUAL) is None
    assert upstream(p - 1, Step("F", 5, 1), p, 2, V_SHAPE) == (p - 1, Step("F", 5, 0))
    assert upstream(0, Step("B", 5, 1), p, 2, DUAL) is None
    orders = build("dualpipe", p, 8, 2)
    assert {s.microbatch for s in orders[0] if s.chunk == 0} == set(range(4))
    assert {s.microbatch for s in orders[0] if s.chunk == 1} == set(range(4, 8))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("dualpipe", 3, 6, 2), "even number of stages and of micro-batches"),
        (("dualpipe", 4, 9, 2), "even number of stages and of micro-batches"),
        (("dualpipe", 4, 6, 2), r"at least 2 micro-batches per stage \(6 < 2 x 4\)"),
        (("dualpipev", 4, 7, 2), r"at least 2 micro-batches per stage \(7 < 2 x 4\)"),
        (("dualpipev", 4, 8, 3), "exactly 2 chunks per rank"),
        (("dualpipe", 4, 8, 1), "runs 2 or more chunks per rank, got 1"),
    ],
)
def test_rules(args, message):
    with pytest.raises(ValueError, match=message):
        build(*args)
    assert check(*args) is not None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("F0&F1 B0 B1\nF0 B0 F1 B1", r"F0&F1 is not an F&B pair"),
        ("F0&B0 F1 B1\nF0 B0 F1 B1", r"F0&B0 is not an F&B pair"),
        # rank 0's F1&B0 starts with B0's input, which rank 1 sends after F1 (sequential
        # F1 then B0 would run)
        (
            "F0 F1&B0 B1\nF0 F1 B0 B1",
            "the orders deadlock: rank 0 at F1 waits for B0 on rank 1; rank 1 at F1 waits",
        ),
    ],
)
def test_pair_errors(text, message):
    with pytest.raises(ValueError, match=message):
        check_orders(parse_orders(text))


def test_full_backward_is_a_b_without_w():
    # a B whose W never comes holds its activations until the B
    order = [Step("F", 0), Step("F", 1), Step("B", 0), Step("B", 1), Step("W", 1)]
    assert peak_inflight(order, "W") == 2
    assert peak_inflight([*order[:3], Step("F", 2), *order[3:]], "W") == 2
    pair = overlapped(Step("B", 0))
    assert pair == Step("B", 0) and hash(pair) == hash(Step("B", 0)) and pair.overlapped


def _study(name, p, m, f, b, w, fb):
    """F, B (input gradient), W and F&B per chunk; the study takes them per stage."""
    share = 1 if name == "dualpipe" else 2
    times = OpTimes(forward=f * share, backward=b * share, weight=w * share, overlapped=fb * share)
    return run_schedule(name, p, m, times, 2)


@pytest.mark.parametrize(
    ("name", "p", "m"),
    [
        ("dualpipev", 2, 4),
        ("dualpipev", 4, 10),
        ("dualpipev", 4, 20),
        ("dualpipev", 6, 24),
        ("dualpipe", 4, 8),
        ("dualpipe", 8, 32),
        ("dualpipe", 6, 14),
    ],
)
@pytest.mark.parametrize(("f", "w", "fb"), [(1, 1, 2), (1, 1, 2.5), (1, 1, 3), (2, 1, 4)])
def test_readme_bubble_and_activations(name, p, m, f, w, fb):
    """The DualPipe README: bubble (PP/2 - 1)(F&B + B - 3W) with B the full backward,
    activations PP + 1 chunks per rank, PP the stages (2p for DualPipeV, p for DualPipe).
    The formula assumes a forward as long as the input-gradient backward (F = B - W, the
    figure's unit cells) and F + (B - W) <= F&B <= F + B (no more overlap than that)."""
    study = _study(name, p, m, f, f, w, fb)
    stages = 2 * p if name == "dualpipev" else p
    full_backward = f + w
    assert max(study.per_rank_bubble) == pytest.approx(
        (stages / 2 - 1) * (fb + full_backward - 3 * w)
    )
    assert study.peak_inflight("W") == [stages + 1] * p


def test_parameters_twice_activations_per_stage():
    """Parameters per device: DualPipeV's 2 chunks are half-size stages of one model (1x
    the PP-stage pipeline's 2 stages), DualPipe's are whole stages of two copies (2x)."""
    p = 4
    dual = [{stage_of(r, k, p, DUAL) % p for k in range(2)} for r in range(p)]
    assert all(len(stages) == 2 for stages in dual)  # two distinct stages' weights...
    assert [sorted(s) for s in dual] == [sorted({r, p - 1 - r}) for r in range(p)]
    # ...each held by two ranks: gradients of rank r's and rank p-1-r's copies add up
    assert all(dual[r] == dual[p - 1 - r] for r in range(p))


def _full(name, **training):
    from tests.helpers import load

    return load(
        model={"num_layers": 8, "vocab_size": 16, "seq_length": 512},
        parallel={"pipeline_model_parallel_size": 4, "virtual_pipeline_model_parallel_size": 2},
        training={
            "global_batch_size": 8,
            "schedule": name,
            "share_embeddings_and_output_weights": False,
            **training,
        },
    )


def test_full_simulator_runs_dualpipe_with_twice_the_parameters_and_p_plus_1_stages():
    """The same uniform layout (p = 4, 8 layers): DualPipeV holds 2p + 1 = 9 half-size
    chunks (1 layer) of one model, DualPipe p + 1 = 5 whole stages (2 layers) of two
    copies, with twice the parameters on the middle ranks (no embedding or output there);
    each token's FLOPs count once, so both give the same model FLOPs."""
    from stepsim.cost.memory import inflight_layers
    from stepsim.cost.params import stage_params_per_rank
    from stepsim.run.iteration import run

    v_shape, dual = _full("dualpipev"), _full("dualpipe")
    assert dual.chunk_layers == ((2, 2),) * 4 and v_shape.chunk_layers == ((1, 1),) * 4
    for rank in (1, 2):
        assert stage_params_per_rank(dual, rank) == 2 * stage_params_per_rank(v_shape, rank)
    # both end ranks hold an embedding and an output layer (of different copies)
    assert stage_params_per_rank(dual, 0) == stage_params_per_rank(dual, 3)
    assert [inflight_layers(v_shape, r) for r in range(4)] == [9] * 4  # (2p + 1) x 1
    assert [inflight_layers(dual, r) for r in range(4)] == [10] * 4  # (p + 1) x 2
    a, b = run(v_shape), run(dual)
    assert [m.inflight_activations for m in a.memory] == [9] * 4
    assert [m.inflight_activations for m in b.memory] == [5] * 4
    assert b.metrics.model_tflops_per_gpu * b.metrics.iteration_time_s == pytest.approx(
        a.metrics.model_tflops_per_gpu * a.metrics.iteration_time_s, rel=1e-12
    )


def test_dualpipe_sums_its_copies_gradients_between_mirrored_ranks():
    """With one replica there is no data-parallel sync: what DualPipe's dp_sync shows is
    the all-reduce of rank r's gradients with rank p - 1 - r's, once per iteration."""
    from stepsim.ir.vocabulary import DP_SYNC
    from stepsim.run.iteration import run

    a, b = run(_full("dualpipev")), run(_full("dualpipe"))
    assert a.metrics.breakdown_s[DP_SYNC] == 0
    assert b.metrics.breakdown_s[DP_SYNC] > 0
    sums = [s for s in b.trace.spans if "DualPipe copies" in s.label]
    assert sorted(s.gpu for s in sums) == [0, 1, 2, 3]


def test_dualpipe_exact_mode_agrees_with_symmetric_mode():
    from stepsim.run.iteration import run

    kwargs = {"data_parallel_size": 2, "tensor_model_parallel_size": 2}
    from tests.helpers import load

    def scenario(symmetry):
        return load(
            model={"num_layers": 8, "vocab_size": 16, "seq_length": 512},
            cluster={"node": "dgx-h100", "num_nodes": 2},
            parallel={
                "pipeline_model_parallel_size": 4,
                "virtual_pipeline_model_parallel_size": 2,
                **kwargs,
            },
            training={
                "global_batch_size": 16,
                "schedule": "dualpipe",
                "share_embeddings_and_output_weights": False,
                "use_distributed_optimizer": True,
            },
            network={"model": "fair-share", "symmetry": symmetry},
        )

    assert run(scenario(False)).metrics.iteration_time_s == pytest.approx(
        run(scenario(True)).metrics.iteration_time_s, rel=1e-9
    )


def test_dualpipe_splits_each_copy_over_p_stages():
    """61 layers over PP 16 with the last stage holding 1, and its one MTP layer (global
    index 61) with the loss (DeepSeek-V3's scenario): each copy splits as one chunk per
    rank would, rank r holding stage r and stage p - 1 - r."""
    from stepsim.cost.params import rank_global_layers
    from stepsim.scenario import load_scenario

    scenario = load_scenario(ROOT / "scenarios" / "deepseek-v3-2048-h800.toml")
    assert scenario.training.schedule == "dualpipe"
    assert scenario.chunk_layers[0] == (4, 2) and scenario.chunk_layers[15] == (2, 4)
    assert scenario.chunk_layers[7] == (4, 4)
    assert rank_global_layers(scenario, 0) == [0, 1, 2, 3, 60, 61]
    assert rank_global_layers(scenario, 15) == [60, 61, 0, 1, 2, 3]


@pytest.mark.parametrize(
    ("training", "match"),
    [
        ({"share_embeddings_and_output_weights": True}, "tied embeddings across its two"),
        (
            {"data_parallel_sharding": "gradients"},
            "must be `none` or `optimizer` with training.schedule='dualpipe'",
        ),
    ],
)
def test_dualpipe_rules(training, match):
    from stepsim.scenario import ScenarioError

    with pytest.raises(ScenarioError, match=match):
        _full("dualpipe", **training)


def test_the_schedule_command_draws_and_reads_dualpipe(tmp_path, capsys):
    """`stepsim schedule` runs the named schedules with an F&B time, prints the pairs as
    F&B labels, and a file of those labels under the dual placement runs the same."""
    import json

    from stepsim.cli import main

    times = ["--forward", "1", "--backward", "1", "--weight", "1", "--overlapped", "2.5"]
    args = ["schedule", "--schedule", "dualpipe", "--stages", "4", "--microbatches", "8"]
    assert main([*args, *times, "--json", "--out", str(tmp_path)]) == 0
    named = json.loads(capsys.readouterr().out)
    assert named["F&B"] == 2.5 and named["placement"] == DUAL
    assert "F3.0&B5.1" in named["rank_order"][0]
    assert (tmp_path / "schedule.png").is_file()
    path = tmp_path / "dualpipe.txt"
    path.write_text("\n".join(named["rank_order"]) + "\n")
    file_args = ["schedule", "--schedule-file", str(path), "--placement", "dual", "--json"]
    assert main([*file_args, *times]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["makespan"] == named["makespan"] and again["rank_order"] == named["rank_order"]
    assert main([*args, *times[:6], "--overlapped", "-1"]) == 2
    assert "--overlapped=-1.0 must be a finite number >= 0" in capsys.readouterr().err


def test_the_summary_says_dualpipes_grad_reduce_waits_for_the_copies_sum():
    from stepsim.report.summary import summary_text
    from stepsim.run.iteration import run

    text = summary_text(run(_full("dualpipe", overlap_grad_reduce=True)))
    assert "grad reduce after the copies' sum" in text and "overlapped grad reduce" not in text
    assert "overlapped grad reduce" in summary_text(
        run(_full("dualpipev", overlap_grad_reduce=True))
    )
