"""The collectives of `stepsim validate`'s kernel section: published NCCL collective
timings against stepsim's network running the same collective alone, and the fits of the
node presets' network efficiencies on them. Closed forms only: rows synthesized from
stepsim's own simulation compare with error 0 and fit back to the efficiency they were
made with; no published number is asserted."""

import shutil
from pathlib import Path

import pytest

from stepsim.calibration.collectives import (
    COLLECTIVE_FITS,
    NIC,
    NVLINK,
    SECTIONS,
    CollectiveRow,
    Network,
    collective_rows,
    compare_collectives,
    fit_efficiency,
    fit_rows,
)
from stepsim.calibration.kernels import summary
from stepsim.cli import main
from stepsim.ir.vocabulary import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, AUTO, NVLS
from stepsim.run.iteration import build_cluster
from stepsim.scenario import ScenarioError
from stepsim.scenario.files import (
    COLLECTIVE_FILES,
    NCCL_LOGS,
    parse_nccl_tests,
    read_collective_tables,
)
from stepsim.scenario.presets import NODES

COLLECTIVES = Path(__file__).resolve().parents[1] / "scenarios" / "validation" / "collectives"
TABLES, LOGS = read_collective_tables(COLLECTIVES)
GIB = 2.0**30


def test_every_shipped_table_is_read_and_every_section_has_rows():
    assert set(TABLES) == set(COLLECTIVE_FILES) and set(LOGS) == set(NCCL_LOGS)
    rows = collective_rows(TABLES, LOGS)
    assert {r.section for r in rows} == set(SECTIONS)
    assert all(r.measured_s > 0 and r.size_bytes >= 2**24 for r in rows)
    for name, table in TABLES.items():  # ids are unique per file
        assert len({r["id"] for r in table}) == len(table), name
    assert len({r.id for r in rows}) == len(rows)
    # both logs: 16 ranks on 2 hosts; every fit has large rows in sections of its node
    assert all(len(log.hosts) == 16 and len(set(log.hosts)) == 2 for log in LOGS.values())
    for fit in COLLECTIVE_FITS:
        assert fit_rows(rows, fit.sections)
        assert all(SECTIONS[s].node == fit.node for s in fit.sections)
    # a fitted row is a large row of a fit section, and nothing else is
    assert all(r.fitted == (r.large and SECTIONS[r.section].role == "fit") for r in rows)


# -- rows synthesized from stepsim's own simulation ---------------------------------------


def _row(section, kind, groups, size, nodes=1, algorithm=AUTO, measured=1.0):
    return CollectiveRow(
        section, "T1", "test", kind, nodes, groups[0], groups[1], size, measured, algorithm
    )


CASES = [
    _row("xla-b200-all-reduce", ALL_REDUCE, (1, 8), GIB),  # auto: NVLS
    _row("xla-gb200-all-to-all", ALL_TO_ALL, (9, 8), 2 * GIB),
    _row("xla-gb200-all-gather", ALL_GATHER, (2, 36), 4 * GIB),
    _row("azure-h200", ALL_REDUCE, (1, 8), GIB, algorithm=NVLS),
    _row("nccl-b200-2nodes", ALL_GATHER, (1, 16), GIB, nodes=2),  # a ring across nodes
]


def test_a_row_made_by_stepsim_itself_has_error_zero():
    network = Network(build_cluster)
    made = [r._replace(measured_s=network.seconds(r)) for r in CASES]
    comparisons = compare_collectives(made, network)
    errors = [c.error for rows in comparisons.values() for c in rows]
    assert len(errors) == len(CASES) and max(map(abs, errors)) < 1e-12
    assert comparisons["azure-h200"][0].runs == NVLS  # as the table states it
    assert comparisons["xla-b200-all-reduce"][0].runs == NVLS  # NCCL's choice there
    assert summary(comparisons["xla-gb200-all-to-all"]).mean_abs_error < 1e-12


def test_large_messages_reach_the_links_rate_and_all_to_all_is_all_gather():
    """At 4 GiB on 8 GPUs of one node, an all-gather's ring and an all-to-all each put
    (n-1)/n S on every GPU's NVLink: bus bandwidth = NVLink x efficiency, to the latency's
    part (under 1 %); so one efficiency serves both."""
    network = Network(build_cluster)
    rate = NODES["dgx-b200"]["nvlink_gbytes_per_s"] * NODES["dgx-b200"]["nvlink_efficiency"]
    for section, kind in (("xla-b200-all-gather", ALL_GATHER), ("xla-b200-all-to-all", ALL_TO_ALL)):
        row = _row(section, kind, (1, 8), 4 * GIB)
        busbw = row.size_bytes / network.seconds(row) * 7 / 8 / 1e9
        assert busbw == pytest.approx(rate, rel=0.01) and busbw < rate


@pytest.mark.parametrize(
    ("constant", "truth", "rows"),
    [
        (
            NVLINK,
            0.63,
            [
                _row("xla-b200-all-gather", ALL_GATHER, (1, 8), GIB),
                _row("xla-b200-all-to-all", ALL_TO_ALL, (2, 4), 2 * GIB),
                _row("xla-b200-all-reduce", ALL_REDUCE, (1, 8), 2 * GIB),  # NVLS
            ],
        ),
        (NIC, 0.71, [_row("nccl-b200-2nodes", ALL_GATHER, (1, 16), s * GIB, 2) for s in (2, 4)]),
    ],
)
def test_the_fit_recovers_the_efficiency_the_rows_were_made_with(constant, truth, rows):
    network = Network(build_cluster)
    made = [r._replace(measured_s=network.seconds(r, {constant: truth})) for r in rows]
    value, rms = fit_efficiency(made, constant, network)
    assert value == pytest.approx(truth) and rms < 1e-9


# -- the file layer's one-line errors -------------------------------------------------------


def _copy(tmp_path: Path) -> Path:
    folder = tmp_path / "collectives"
    shutil.copytree(COLLECTIVES, folder)
    return folder


def _one_line(tmp_path, name, edit) -> str:
    folder = _copy(tmp_path)
    path = folder / name
    path.write_text(edit(path.read_text(encoding="utf-8")), encoding="utf-8")
    with pytest.raises(ScenarioError) as info:
        read_collective_tables(folder)
    message = str(info.value)
    assert name.rsplit("/", 1)[-1] in message and "\n" not in message
    return message


def test_a_cell_that_is_not_a_number_names_file_line_and_column(tmp_path):
    def edit(text):
        lines = text.splitlines()
        head, cells = lines[0].split(","), lines[3].split(",")
        cells[head.index("busbw_GBps_inplace")] = "fast"
        lines[3] = ",".join(cells)
        return "\n".join(lines) + "\n"

    message = _one_line(tmp_path, "azure_nccl_allreduce_busbw.csv", edit)
    assert "line 4" in message and "'AZ3'" in message and "'busbw_GBps_inplace'" in message


@pytest.mark.parametrize(
    ("name", "edit", "expected"),
    [
        ("xla_collectives.csv", lambda t: t.replace("algbw_GBps", "algbw", 1), "no column"),
        ("xla_collectives.csv", lambda t: t + "XC999,sm_90,all-reduce\n", "columns expected"),
        (
            "nccl_logs/h100_2node_16gpu_all_reduce_a3mega.txt",
            lambda t: t.replace("47535", "slow", 1),
            "column 'time'",
        ),
        (
            "nccl_logs/b200_2node_16gpu_all_gather_gke_a4.txt",
            lambda t: t.replace("30970", "30970 12", 1),
            "13 fields expected",
        ),
    ],
)
def test_other_bad_files_are_one_line_errors(tmp_path, name, edit, expected):
    assert expected in _one_line(tmp_path, name, edit)


def test_an_nccl_tests_log_names_its_line():
    text = "#  Rank  0 Group  0 Pid  1 on a device  0 [0] GPU\n  1024 256 float sum -1 x"
    with pytest.raises(ScenarioError) as info:
        parse_nccl_tests(text + " 0.1 0.1 0 9 0.1 0.1 0\n", "log 'x.txt'")
    assert "line 2" in str(info.value) and "'time'" in str(info.value)


def test_a_row_the_model_cannot_use_is_a_one_line_cli_error(tmp_path, capsys):
    folder = _copy(tmp_path)
    path = folder / "xla_collectives.csv"
    path.write_text(
        path.read_text(encoding="utf-8").replace('"[4,2]<=[8]T(0)"', '"[4,2]<=[8]T(1,0)"', 1),
        encoding="utf-8",
    )
    assert main(["validate", "--network-fits", "--collective-data", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "XC1" in err and "consecutive" in err and err.count("\n") == 1


def test_the_section_prints_one_line_per_table_and_its_rows():
    from stepsim.calibration.collectives import comparison_json
    from stepsim.cli.cmd_validate import collective_markdown, collective_text

    network = Network(build_cluster)
    made = compare_collectives(
        [r._replace(measured_s=network.seconds(r) * 1.1) for r in CASES], network
    )
    text = collective_text(made, rows=True)
    for key in made:
        assert f"  {SECTIONS[key].title}" in text
    assert text.count("-9.1 %") == 2 * len(CASES)  # each row, and each table's worst
    assert not [line for line in text.splitlines() if line.endswith(" %")]
    markdown = collective_markdown(made)
    assert all(f"| {SECTIONS[key].title} |" in markdown for key in made)
    document = comparison_json(made)
    assert document["azure-h200"]["detail"][0]["runs"] == NVLS
    assert document["azure-h200"]["role"] == "fit" and document["azure-h200"]["fitted_rows"] == 0


@pytest.mark.parametrize(
    ("sets", "line"),
    [
        (("cluster.node=dgx-b200",), "network constants         NVLink fit on OpenXLA's B200"),
        (("cluster.node=hgx-h800",), "network constants         uncalibrated: the DGX H100's"),
        (("cluster.node=dgx-b200", "cluster.nvlink_efficiency=0.5"), None),  # set: no label
        ((), None),  # the DGX A100: NVIDIA's measured fractions, no line
    ],
)
def test_the_run_summary_says_where_a_nodes_network_constants_came_from(sets, line):
    from stepsim.report.summary import summary_text
    from stepsim.run.iteration import run
    from stepsim.scenario import load_scenario

    path = COLLECTIVES.parents[1] / "tiny-2gpu.toml"
    text = summary_text(run(load_scenario(path, sets)))
    if line is None:
        assert "network constants" not in text
    else:
        assert line in text
