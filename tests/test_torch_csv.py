"""torch.distributed.pipelining's per-rank action CSV read and written
(schedules/torch_csv.py), in `stepsim schedule` and as a scenario's schedule file."""

import re

import pytest

from stepsim.cli import main
from stepsim.run.iteration import run
from stepsim.scenario import ScenarioError
from stepsim.schedules import SCHEDULES, build, order_labels
from stepsim.schedules.torch_csv import looks_like_torch, parse_torch_csv, to_torch_csv
from tests.helpers import load


@pytest.mark.parametrize("name", [n for n in SCHEDULES if SCHEDULES[n].placement != "dual"])
def test_every_schedule_round_trips_through_the_torch_csv(name):
    info = SCHEDULES[name]
    v = 2 if info.chunked else 1
    m = 8
    orders = build(name, 4, m, v)
    text = to_torch_csv(orders, info.placement)
    assert looks_like_torch(text)
    assert parse_torch_csv(text) == (orders, info.placement)


def test_the_written_actions_name_global_stages_and_torchs_action_types():
    orders = build("zbv", 2, 2, 2)  # rank 0 holds stages 0 and 3, rank 1 stages 1 and 2
    rows = to_torch_csv(orders, "v").splitlines()
    assert rows[0].split(",")[:2] == ["0F0", "0F1"]
    assert {cell[0] for cell in rows[0].split(",")} == {"0", "3"}
    assert {cell[0] for cell in rows[1].split(",")} == {"1", "2"}
    assert "I" in rows[0] and "W" in rows[0]  # split backward: I and W
    assert "I" not in to_torch_csv(build("1f1b", 2, 2), "looped")  # fused: B


def test_communication_sharding_and_idle_cells_are_skipped():
    compute_only = "0F0,0F1,,0B0,0B1\n1F0,1B0,1F1,1B1\n"
    with_comms = (
        "0UNSHARD,0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1,0RESHARD,0REDUCE_GRAD\n"
        "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n"
    )
    assert parse_torch_csv(with_comms) == parse_torch_csv(compute_only)
    orders, placement = parse_torch_csv(compute_only)
    assert placement == "looped"
    assert [s.kind for s in orders[0]] == ["F", "F", "B", "B"]  # no W: a fused backward


def test_a_full_backward_among_split_ones_is_a_b_without_its_w():
    text = "0F0,0F1,0I0,0W0,0B1\n1F0,1B0,1F1,1I1,1W1\n"
    orders, _ = parse_torch_csv(text)
    assert [f"{s.kind}{s.microbatch}" for s in orders[0]] == ["F0", "F1", "B0", "W0", "B1"]
    assert [f"{s.kind}{s.microbatch}" for s in orders[1]] == ["F0", "B0", "F1", "B1", "W1"]
    assert to_torch_csv(orders) == text  # I where the W follows, B where it does not


def test_an_overlapped_forward_and_backward_is_an_f_and_b_pair():
    text = "0F0,0F1,0B0,(0F2;0B1)OVERLAP_F_B,0B2\n1F0,1B0,1F1,1B1,1F2,1B2\n"
    orders, _ = parse_torch_csv(text)
    assert order_labels(orders[0]) == ["F0", "F1", "B0", "F2&B1", "B2"]
    assert to_torch_csv(orders) == text
    with pytest.raises(ValueError, match=r"an overlap of other than one forward and one backward"):
        parse_torch_csv("(0F0;0F1)OVERLAP_F_B\n")


def test_dualpipev_round_trips_with_its_pairs_and_full_backwards():
    orders = build("dualpipev", 4, 10, 2)
    text = to_torch_csv(orders, "v")
    assert "OVERLAP_F_B" in text and re.search(r"\dB\d", text) and re.search(r"\dI\d", text)
    assert parse_torch_csv(text) == (orders, "v")
    assert [order_labels(o) for o in parse_torch_csv(text)[0]] == [order_labels(o) for o in orders]
    with pytest.raises(ValueError, match=r"two model copies"):
        to_torch_csv(build("dualpipe", 4, 8, 2), "dual")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0F0,0X1\n", r"row 1, cell 2: not a torch.distributed.pipelining action"),
        ("0F\n", r"row 1, cell 1: an action that names no micro-batch"),
        ("0F0,1F0\n1F0\n2F0\n", r"rank 0 holds stages \[0, 1\]"),
        ("0F0\n0F1\n", r"stages 0 to 0 do not divide over 2 ranks"),
        ("", r"no actions found"),
        # a stage number far past the rest: refused before the placement search
        ("0F0\n99999999999999999999F0\n", r"stage 1 has no action, though stage 9+ has"),
    ],
)
def test_bad_files_are_one_line_errors(text, message):
    with pytest.raises(ValueError, match=message):
        parse_torch_csv(text)


def test_a_torch_csv_schedule_runs_like_the_named_schedule(tmp_path):
    common = {
        "model": {"num_layers": 8, "vocab_size": 16, "seq_length": 512},
    }
    named = load(
        **common,
        parallel={"pipeline_model_parallel_size": 4, "virtual_pipeline_model_parallel_size": 2},
        training={"global_batch_size": 8, "schedule": "zbv_unit"},
    )
    path = tmp_path / "zbv.csv"
    path.write_text(to_torch_csv(build("zbv_unit", 4, 8, 2), "v"))
    custom = load(
        **common,
        parallel={"pipeline_model_parallel_size": 4},
        training={"global_batch_size": 8, "schedule": "custom", "schedule_file": str(path)},
    )
    assert custom.training.placement == "v"  # from the file's stage numbers
    assert run(custom).trace.spans == run(named).trace.spans
    with pytest.raises(ScenarioError, match=r"sit in a V placement, not 'looped'"):
        load(
            **common,
            parallel={"pipeline_model_parallel_size": 4},
            training={
                "global_batch_size": 8,
                "schedule": "custom",
                "schedule_file": str(path),
                "schedule_placement": "looped",
            },
        )


def test_stepsim_schedule_writes_and_reads_torch_csvs(tmp_path, capsys):
    times = ["--forward", "1", "--backward", "2", "--weight", "1"]
    args = ["schedule", "--compare", "zbh1,zbv", "--stages", "4", "--microbatches", "8"]
    assert main([*args, *times, "--out", str(tmp_path)]) == 0
    assert "zbv.torch.csv" in capsys.readouterr().out
    assert main(["schedule", "--schedule-file", str(tmp_path / "zbv.torch.csv"), *times]) == 0
    from_file = capsys.readouterr().out.splitlines()[3].split()[1:]
    assert (
        main(["schedule", "--schedule", "zbv", "--stages", "4", "--microbatches", "8", *times]) == 0
    )
    assert capsys.readouterr().out.splitlines()[3].split()[1:] == from_file
