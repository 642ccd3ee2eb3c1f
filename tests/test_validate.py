"""`stepsim validate`: the calibration set simulated and compared (not asserted to
three digits: the accuracy itself is reported in docs/validation.md)."""

import pytest

from simulator.calibration.validation import chunks_for, megatron_measured_s, megatron_scenario
from simulator.cli import main

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
    assert [chunks_for(n) for n in (24, 15, 10, 3, 2, 1)] == [2, 3, 2, 3, 2, 1]


def test_validate_prints_every_row_and_writes_the_write_up(tmp_path, capsys):
    assert main(["validate", "--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for row in ("A1", "A5", "D13", "D17"):
        assert f"  {row} " in out
    assert "A9" not in out  # --quick leaves out the rows over 1,000 GPUs
    assert "mean |error|" in out
    errors = [
        float(line.rsplit(None, 2)[-2])
        for line in out.splitlines()
        if line.endswith(" %") and "error" not in line
    ]
    assert len(errors) == 5 + 15
    assert all(abs(e) < 25 for e in errors)  # wiring (units, rows), not accuracy
    text = (tmp_path / "validation.md").read_text()
    assert "| A5 | iteration |" in text and "images/validation.png" in text
    assert (tmp_path / "images" / "validation.png").read_bytes().startswith(b"\x89PNG")


def test_validate_with_a_missing_folder_is_a_one_line_error(tmp_path, capsys):
    assert main(["validate", "--data", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "validation table" in err and err.count("\n") == 1
