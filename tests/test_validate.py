"""`stepsim validate`: the calibration set simulated and compared (not asserted to
three digits: the accuracy itself is reported in docs/validation.md)."""

from pathlib import Path

import pytest

from stepsim.calibration.validation import (
    dgx2_scenario,
    h100_rows,
    h100_scenario,
    h100_table_flops,
    megatron_measured_s,
    megatron_scenario,
)
from stepsim.cli import main
from stepsim.run.iteration import run
from stepsim.scenario import read_validation_set
from tests.helpers import load

ROWS = read_validation_set(Path(__file__).resolve().parents[1] / "scenarios" / "validation")

A5 = {
    "id": "A5",
    "model": "GPT 39.1B",
    "num_layers": "48",
    "hidden_size": "8192",
    "num_attention_heads": "64",
    "seq_length": "2048",
    "vocab_size": "51200",
    "ffn_hidden_size": "32768",
    "gpu": "A100-SXM4-80GB",
    "num_gpus": "512",
    "gpus_per_node": "8",
    "tensor_parallel": "8",
    "pipeline_parallel": "2",
    "data_parallel": "32",
    "global_batch_size": "1536",
    "micro_batch_size": "4",
    "schedule": "interleaved, 12 layers per virtual stage (v=2); a test row",
    "recompute": "full",
    "measured_tflops_per_gpu": "138",
}


def test_measured_time_is_the_papers_flops_over_the_throughput():
    b, s, layers, h, v = 1536, 2048, 48, 8192, 51200
    flops = 96 * b * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
    assert megatron_measured_s(A5) == pytest.approx(flops / (512 * 138e12))


def test_a_row_becomes_its_layout_with_the_stated_chunks():
    s = megatron_scenario(A5)
    par = s.parallel
    assert (par.tensor_model_parallel_size, par.pipeline_model_parallel_size) == (8, 2)
    assert par.data_parallel_size == 32 and s.cluster.num_gpus == 512
    assert s.training.schedule == "interleaved" and par.virtual_pipeline_model_parallel_size == 2
    assert s.num_microbatches == 12 and s.training.recompute_granularity == "full"


def test_the_table_1_rows_follow_nvidias_script_39b_and_1t_not_interleaved():
    chunks = {}
    for row in ROWS["megatron"]:
        s = megatron_scenario(row)
        chunks[row["id"]] = s.parallel.virtual_pipeline_model_parallel_size
        assert s.training.schedule == ("interleaved" if chunks[row["id"]] > 1 else "1f1b")
        assert s.parallel.num_gpus == int(row["num_gpus"])
    assert chunks == {
        **{f"A{i}": 1 for i in (1, 2, 3, 4, 5, 10)},
        **{"A6": 3, "A7": 2, "A8": 2, "A9": 3},
    }


def test_the_dgx2_rows_are_one_dgx2_at_the_rows_tp():
    for row in ROWS["dgx2"]:
        s = dgx2_scenario(row)
        assert s.cluster.node == "dgx-2" and s.cluster.gpu.name == "v100-sxm3-32gb"
        assert s.parallel.tensor_model_parallel_size == s.parallel.num_gpus == int(row["num_gpus"])
        assert s.training.global_batch_size == s.training.micro_batch_size == 8


def test_the_h100_rows_use_the_stated_layout_and_the_assumed_choices():
    rows = h100_rows(ROWS["h100"])
    assert [r["id"] for r in rows] == [f"E{i}" for i in range(1, 10)]  # E10/E11: no layout
    s = h100_scenario(rows[4])  # E5: 70B, TP 8 PP 2 DP 48
    par, tr = s.parallel, s.training
    assert (par.tensor_model_parallel_size, par.pipeline_model_parallel_size) == (8, 2)
    assert par.data_parallel_size == 48 and par.sequence_parallel
    assert s.cluster.gpu.name == "h100-sxm5-80gb" and s.model.ffn_hidden_size == 4 * 8192
    assert tr.micro_batch_size == 1 and tr.recompute_granularity == "none"
    assert tr.overlap_grad_reduce and tr.data_parallel_sharding == "optimizer"


def test_stepsims_model_flops_are_the_h100_tables_count():
    """72 B s l h^2 (1 + s/6h + V/12lh): forward + backward of the layers and the output
    layer, no recomputation; stepsim's model FLOPs count the same on a small model."""
    s = load(model={"vocab_size": 8192}, training={"recompute_granularity": "full"})
    m = run(s).metrics
    row = {
        "global_batch_size": 8,
        "seq_length": 1024,
        "num_layers": 4,
        "hidden_size": 1024,
        "vocab_size": 8192,
    }
    simulated = m.model_tflops_per_gpu * 1e12 * m.num_gpus * m.iteration_time_s
    assert simulated == pytest.approx(h100_table_flops(row), rel=1e-9)


def test_validate_prints_every_row_and_writes_the_write_up(tmp_path, capsys):
    assert main(["validate", "--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for row in ("A1", "A5", "D13", "D17", "V1", "V4", "E1", "E2"):
        assert f"  {row} " in out
    assert "A9" not in out and "E3" not in out  # --quick leaves out the large rows
    assert out.count("mean |error|") == 3  # one per set
    errors = [
        float(line.rsplit(None, 2)[-2])
        for line in out.splitlines()
        if line.endswith(" %") and "error" not in line
    ]
    assert len(errors) == 5 + 15 + 4 + 2
    assert all(abs(e) < 40 for e in errors)  # wiring (units, rows), not accuracy
    text = (tmp_path / "validation.md").read_text()
    assert "| A5 | iteration |" in text and "images/validation.png" in text
    assert "| V4 | iteration |" in text and "| E2 | model TFLOP/s |" in text
    assert (tmp_path / "images" / "validation.png").read_bytes().startswith(b"\x89PNG")
    # the kernel section after the sets, in the output and the write-up
    from stepsim.calibration.kernels import SECTIONS

    kernels = out.split("stepsim validate · kernels")[1]
    assert all(f"  {s.title}" in kernels for s in SECTIONS.values())
    assert "## Kernels" in text and all(f"| {s.title} |" in text for s in SECTIONS.values())


def test_validate_with_a_missing_folder_is_a_one_line_error(tmp_path, capsys):
    assert main(["validate", "--data", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "validation table" in err and err.count("\n") == 1


def test_validate_refuses_a_calibration_file_for_a_gpu_without_a_set(tmp_path, capsys):
    from stepsim.calibration.fit import calibration_toml
    from stepsim.scenario.presets import GPUS

    path = tmp_path / "h200.toml"
    path.write_text(calibration_toml(GPUS["h200-sxm-141gb"].kernels, [], []), encoding="utf-8")
    assert main(["validate", "--quick", "--calibration", str(path)]) == 2
    err = capsys.readouterr().err
    assert "gpu='h200-sxm-141gb'" in err and err.count("\n") == 1
