"""The kernel section of `stepsim validate`: published kernel micro-benchmarks against
stepsim's kernel models, and the fits of the Hopper / Blackwell constants on them.
Closed forms only: rows synthesized from stepsim's own models compare with error 0 and
fit back to the constants they were made with; no published number is asserted."""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from stepsim.calibration.kernels import (
    KERNEL_FITS,
    SECTIONS,
    compare_kernels,
    fit_attention,
    fit_fp8_gemm,
    fit_gemm,
    fit_memory,
    kernel_rows,
    norm_bytes,
    summary,
)
from stepsim.cli import main
from stepsim.cost.attention import causal_fraction, flash_seconds
from stepsim.cost.fp8 import fp8_gemm_seconds
from stepsim.cost.kernels import gemm_seconds, stream_seconds
from stepsim.scenario import ScenarioError
from stepsim.scenario.files import KERNEL_FILES, read_kernel_tables
from stepsim.scenario.gpu import AttentionKernelConstants
from stepsim.scenario.presets import GPUS

KERNELS = Path(__file__).resolve().parents[1] / "scenarios" / "validation" / "kernels"
TABLES = read_kernel_tables(KERNELS)
B200, GB200, H100 = GPUS["b200-sxm-180gb"], GPUS["gb200"], GPUS["h100-sxm5-80gb"]


def test_every_shipped_table_is_read_and_every_section_has_rows():
    assert set(TABLES) == set(KERNEL_FILES) and all(TABLES.values())
    rows = kernel_rows(TABLES)
    assert {r.section for r in rows} == set(SECTIONS)
    assert all(r.measured_s > 0 for r in rows)
    # ids are unique per file (a norm or SDPA row gives a forward and a backward)
    for name, table in TABLES.items():
        assert len({r["id"] for r in table}) == len(table), name
    # the sm_90 FP8 cells, suspect, were left out: no H100 FP8 row from the XLA table
    assert not [
        r
        for r in TABLES["xla_matmul"]
        if r["platform_key"] == "sm_90" and r["tflops_f8e4m3fnx_f8e4m3fn_to_bf16"].strip()
    ]
    # every fit has rows, and a fit section's fitted rows are in it
    for fit in KERNEL_FITS:
        assert any(r.fitted for r in rows if r.section in fit.sections)
        assert all(SECTIONS[s].gpu == fit.gpu for s in fit.sections)


# -- rows synthesized from stepsim's own models ----------------------------------------------


def _model_tables() -> dict[str, list[dict[str, str]]]:
    """One or two rows per table, their published numbers written from stepsim's own
    time on the section's GPU, each by the table's own convention."""
    b, m, n, k = 4, 2048, 4096, 1024
    bf16 = gemm_seconds(B200, B200.kernels, m, n, k, b)
    fp8 = fp8_gemm_seconds(B200, B200.kernels, m, n, k, fast=False, batch=b)
    flops = 2.0 * b * m * n * k
    xla = {
        "id": "X1",
        "platform_key": "sm_100_B200",
        "b": str(b),
        "m": str(m),
        "n": str(n),
        "k": str(k),
        "tflops_bf16x_bf16_to_bf16": repr(flops / bf16 / 1e12),
        "tflops_f8e4m3fnx_f8e4m3fn_to_bf16": repr(flops / fp8 / 1e12),
    }

    def flash(gpu, heads, kv, s, d_qk, d_v, causal, backward):
        done = causal_fraction(s) if causal else 1.0
        return flash_seconds(
            gpu,
            gpu.kernels,
            heads=heads,
            kv_heads=kv,
            q=s,
            k=s,
            d_qk=d_qk,
            d_v=d_v,
            done=done,
            backward=backward,
        )

    sdpa = [
        {
            "id": f"S{i}",
            "gpu": "NVIDIA GB200",
            "model": "dsv3",
            "mask": "top_left",
            "pass": p,
            "deterministic_bwd": "False",
            "batch": "2",
            "q_seqlen": "4096",
            "kv_seqlen": "4096",
            "num_q_heads": "128",
            "num_kv_heads": "128",
            "head_dim_qk": "192",
            "head_dim_vo": "128",
            "time_ms": repr(1e3 * flash(GB200, 256, 256, 4096, 192, 128, True, p == "bwd")),
            "tflops": "1",
        }
        for i, p in ((1, "fwd"), (2, "bwd"))
    ]
    s, d, heads = 2048, 128, 128
    causal_flops = 4.0 * s * s * heads * d / 2
    sdpa913 = {
        "id": "C1",
        "gpu": "NVIDIA B200",
        "impl": "cudnn_bf16",
        "is_causal": "True",
        "batch": "1",
        "q_seqlen": str(s),
        "kv_seqlen": str(s),
        "num_q_heads": str(heads),
        "num_kv_heads": "8",
        "head_dim": str(d),
        "fwd_tflops": repr(causal_flops / flash(B200, heads, 8, s, d, d, True, False) / 1e12),
        "bwd_tflops": repr(2.5 * causal_flops / flash(B200, heads, 8, s, d, d, True, True) / 1e12),
    }
    # FA3 Fig. 5 (hidden 2048, 16k tokens): hd 128, s 4096 -> 16 heads x batch 4, causal
    fa_flops = 4.0 * 4096 * 4096 * 128 * 16 * 4 / 2
    fa3 = {
        "id": "F1",
        "causal": "1",
        "head_dim": "128",
        "n_heads": "16",
        "seqlen": "4096",
        "batch": "4",
        "impl": "cudnn",
        "tflops": repr(fa_flops / flash(H100, 64, 64, 4096, 128, 128, True, False) / 1e12),
        "note": "",
    }
    both = flash(H100, 64, 64, 4096, 128, 128, True, False) + flash(
        H100, 64, 64, 4096, 128, 128, True, True
    )
    fa2 = {**fa3, "id": "G1", "impl": "fa2", "tflops": repr(3.5 * fa_flops / both / 1e12)}
    norm = {
        "id": "N1",
        "gpu": "NVIDIA GB200",
        "config": "test",
        "norm_type": "layer_norm",
        "has_bias": "True",
        "N_rows": "8192",
        "C_hidden": "8192",
    }
    for backward, column in ((False, "fwd_GBps"), (True, "bwd_GBps")):
        num_bytes = norm_bytes("layer_norm", 8192, 8192, True, backward)
        norm[column] = repr(num_bytes / stream_seconds(GB200, GB200.kernels, num_bytes) / 1e9)
    return {
        "xla_matmul": [xla],
        "cudnn_sdpa": sdpa,
        "cudnn_sdpa_913": [sdpa913],
        "fa3_fig5": [fa3],
        "fa2_fwdbwd": [fa2],
        "cudnn_norms": [norm],
    }


def test_rows_synthesized_from_the_model_compare_with_error_zero():
    compared = compare_kernels(kernel_rows(_model_tables()), GPUS)
    assert set(compared) == {
        "xla-b200-bf16",
        "xla-b200-fp8",
        "sdpa-gb200",
        "sdpa913-b200",
        "fa3-h100-cudnn-fwd",
        "fa2-h100-fwdbwd",
        "norms-gb200",
    }
    for comparisons in compared.values():
        totals = summary(comparisons)
        assert totals.mean_abs_error == pytest.approx(0, abs=1e-9)
        assert abs(totals.worst.error) == pytest.approx(0, abs=1e-9)


def test_the_norm_bytes_are_the_benchmarks():
    """cuDNN's compute_bandwidth_bytes: RMSNorm forward reads N C + C, writes N C and an
    fp32 per row; LayerNorm backward reads 2 N C + C and two fp32 per row, writes N C + 2 C."""
    n, c = 1024, 4096
    assert norm_bytes("rms_norm", n, c, False, False) == 2 * (2 * n * c + c) + 4 * n
    assert norm_bytes("layer_norm", n, c, True, True) == 2 * (3 * n * c + 3 * c) + 8 * n


# -- fits recover the constants rows were made with -----------------------------------------


def _made_by(gpu, rows):
    """The rows with their published time replaced by ``gpu``'s model time."""
    return [r._replace(measured_s=r.simulate(gpu), fitted=True) for r in rows]


def test_the_gemm_fits_recover_the_constants_of_synthesized_rows():
    rows = [r for r in kernel_rows(TABLES) if r.section == "xla-b200-bf16"][::9]
    truth = dataclasses.replace(
        B200, kernels=dataclasses.replace(B200.kernels, gemm_efficiency=0.63, gemm_k_half=96.0)
    )
    fitted = fit_gemm(B200, _made_by(truth, rows), (0.55, 0.63, 0.7), (0.0, 96.0, 288.0))
    assert (fitted.kernels.gemm_efficiency, fitted.kernels.gemm_k_half) == (0.63, 96.0)

    fp8_rows = [r for r in kernel_rows(TABLES) if r.section == "xla-b200-fp8"][::9]
    assert B200.fp8_kernels is not None
    truth = dataclasses.replace(
        B200,
        fp8_kernels=dataclasses.replace(
            B200.fp8_kernels, gemm_efficiency=0.7, fast_accum_gemm_efficiency=0.7, gemm_k_half=384.0
        ),
    )
    fitted = fit_fp8_gemm(B200, _made_by(truth, fp8_rows), (0.6, 0.7, 0.8), (256.0, 384.0))
    assert fitted.fp8_kernels == truth.fp8_kernels


def test_the_memory_fit_is_the_median_fraction_of_the_bandwidth():
    rows = [r for r in kernel_rows(TABLES) if r.section == "norms-gb200"]
    truth = dataclasses.replace(
        GB200, kernels=dataclasses.replace(GB200.kernels, memory_efficiency=0.64)
    )
    made = _made_by(truth, rows)
    assert fit_memory(GB200, made).kernels.memory_efficiency == 0.64
    # one row twice as slow (a reduction-bound kernel) moves a median by nothing
    slow = [made[0]._replace(measured_s=2 * made[0].measured_s), *made[1:]]
    assert fit_memory(GB200, slow).kernels.memory_efficiency == 0.64


def test_the_attention_fit_recovers_its_constants_from_synthesized_rows():
    rows = [r for r in kernel_rows(TABLES) if r.section == "sdpa-gb200" and r.fitted]
    truth = dataclasses.replace(
        GB200,
        attention_kernels=AttentionKernelConstants(
            forward_efficiency=0.6,
            backward_efficiency=0.45,
            kv_half=256.0,
            exp_exposed=0.5,
            source="test",
        ),
    )
    fitted = fit_attention(
        GB200,
        _made_by(truth, rows),
        "test",
        efficiencies=(0.45, 0.5, 0.6, 0.7),
        kv_halves=(0.0, 256.0, 512.0),
        exp_exposed=(0.0, 0.5, 1.0),
    )
    assert fitted.attention_kernels == truth.attention_kernels


# -- the file layer's one-line errors --------------------------------------------------------


def _copy(tmp_path: Path) -> Path:
    folder = tmp_path / "kernels"
    shutil.copytree(KERNELS, folder)
    return folder


def test_a_cell_that_is_not_a_number_names_file_row_and_column(tmp_path):
    folder = _copy(tmp_path)
    path = folder / "cudnn_norms.csv"
    lines = path.read_text(encoding="utf-8").splitlines()
    head = lines[0].split(",")
    cells = lines[2].split(",")
    cells[head.index("bwd_GBps")] = "fast"
    lines[2] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ScenarioError) as info:
        read_kernel_tables(folder)
    message = str(info.value)
    assert "cudnn_norms.csv" in message and "line 3" in message and "'N2'" in message
    assert "'bwd_GBps'" in message and "'fast'" in message and "\n" not in message


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda text: text.replace("tflops_bf16x_bf16_to_bf16", "tflops_bf16", 1), "no column"),
        (lambda text: text.replace(",1,256,256,256,", ",1,256,256,-256,", 1), "'k'"),
        (lambda text: text + "X999,sm_90,1\n", "columns expected"),
    ],
)
def test_other_bad_tables_are_one_line_errors(tmp_path, edit, expected):
    folder = _copy(tmp_path)
    path = folder / "xla_matmul_sm90_b200.csv"
    path.write_text(edit(path.read_text(encoding="utf-8")), encoding="utf-8")
    with pytest.raises(ScenarioError) as info:
        read_kernel_tables(folder)
    assert expected in str(info.value) and "xla_matmul_sm90_b200.csv" in str(info.value)
    assert "\n" not in str(info.value)


# -- the command -------------------------------------------------------------------------------


def test_validate_kernels_prints_one_line_per_table_and_json(capsys):
    assert main(["validate", "--kernels"]) == 0
    out = capsys.readouterr().out
    for section in SECTIONS.values():
        assert f"  {section.title}" in out
    assert "E1" not in out  # the calibration sets are not simulated
    assert main(["validate", "--kernels", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert set(document["kernels"]) == set(SECTIONS)
    norms = document["kernels"]["norms-h200"]
    assert norms["role"] == "fit" and norms["rows"] == len(norms["detail"]) > norms["fitted_rows"]


def test_validate_kernels_with_a_missing_folder_is_a_one_line_error(tmp_path, capsys):
    assert main(["validate", "--kernels", "--kernel-data", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "kernel table" in err and err.count("\n") == 1
