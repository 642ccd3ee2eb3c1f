"""Typed results: Metrics as metrics.json, MetricsRow as the CSV and journal row, and
the points of sweeps and scaling built from them."""

import json

import pytest
from helpers import load

from stepsim.ir.results import LinkLoad, MetricsRow, SweepPoint
from stepsim.ir.vocabulary import BREAKDOWN_KEYS, DP_SYNC, EXPOSED_COMM_KEYS, IDLE_TIME
from stepsim.plan.questions import scale_points, training_time
from stepsim.run.iteration import run

TWO_GPUS = {
    "cluster": {"num_nodes": 1, "gpus_per_node": 2, "nics_per_node": 1},
    "parallel": {"pipeline_model_parallel_size": 2},
}

JSON_KEYS = [
    "schema_version",
    "name",
    "iteration_time_s",
    "hardware_tflops_per_gpu",
    "model_tflops_per_gpu",
    "mfu",
    "bubble_fraction",
    "num_gpus",
    "num_microbatches",
    "tokens_per_s",
    "memory_per_gpu_gib",
    "memory_peak_stage",
    "gpu_memory_gib",
    "calibration",
    "framework",
    "framework_mechanisms",
    "breakdown_s",
    "stages",
    "simulated_transfers",
    "simulated_spans",
    "out_of_memory",
    "busiest_links",
    "idle_by_cause_s",  # with a pipeline (tiny-2gpu has two stages)
    "assumptions",  # report/labels.py; none on one node
]
ROW_KEYS = [
    "iteration_time_s",
    "hardware_tflops_per_gpu",
    "model_tflops_per_gpu",
    "mfu",
    "bubble_fraction",
    "num_gpus",
    "num_microbatches",
    "tokens_per_s",
    "memory_per_gpu_gib",
    *(f"breakdown_s.{key}" for key in BREAKDOWN_KEYS),
    "exposed_comm_fraction",
    "fits_in_memory",
    *(f"idle_by_cause_s.{k}" for k in ("schedule", "imbalance", "communication")),
]


@pytest.fixture(scope="module")
def result():
    return run(load(**TWO_GPUS))


def test_to_json_keeps_the_key_order_and_types_of_metrics_json(result):
    data = result.metrics.to_json()
    assert list(data) == JSON_KEYS
    assert list(data["breakdown_s"]) == list(BREAKDOWN_KEYS)
    assert [list(stage) for stage in data["stages"]] == [
        ["stage", "gpu", "stands_for_gpus", "breakdown_s", "memory_gib", "inflight_activations"]
    ] * 2
    assert data["out_of_memory"] is None
    assert data["framework"] == "megatron 2021"
    assert data["framework_mechanisms"]["pipeline_p2p"] == "batched-blocking"
    assert list(data["busiest_links"][0]) == [
        "link",
        "kind",
        "index",
        "utilization",
        "gbytes",
        "peak_utilization",
    ]
    # plain JSON types only: what json.dumps writes reads back equal
    assert json.loads(json.dumps(data)) == data


def test_stage_memory_in_json_is_the_memory_model_in_gib(result):
    for stage, memory in zip(result.metrics.to_json()["stages"], result.memory, strict=True):
        assert stage["memory_gib"]["total"] == memory.total_bytes / 2**30
        assert stage["inflight_activations"] == memory.inflight_activations


def test_busiest_links_carry_the_pipeline_sends_worked_out_by_hand(result):
    """Two stages on one NVSwitch, no tensor or data parallelism: the traffic is each
    micro-batch's activation (GPU 0 -> 1) and its gradient (GPU 1 -> 0), b s h 2-byte
    values each, plus the tied embedding's all-reduce between the two stages (a ring of
    two: V h 2 bytes each way). So only NVLink links are busy, the busiest of them one
    of the four directions those cross, with m b s h 2 + V h 2 bytes, at that over
    what the link could carry in the iteration."""
    s, m = result.scenario, result.metrics
    model = s.model
    sent_gbytes = (
        (
            m.num_microbatches * s.training.micro_batch_size * model.seq_length * model.hidden_size
            + model.vocab_size * model.hidden_size
        )
        * 2
        / 1e9
    )
    (link,) = m.busiest_links
    assert link.link in (
        "GPU 0 -> NVSwitch of node 0",
        "GPU 1 -> NVSwitch of node 0",
        "NVSwitch of node 0 -> GPU 0",
        "NVSwitch of node 0 -> GPU 1",
    )
    assert isinstance(link, LinkLoad) and link.kind == "nvlink"
    assert link.gbytes == pytest.approx(sent_gbytes, rel=1e-12)
    capacity = result.cluster.links[link.index].bandwidth_bytes_per_s
    expected = sent_gbytes * 1e9 / (capacity * m.iteration_time_s)
    assert link.utilization == pytest.approx(expected, rel=1e-12)


def test_row_is_flat_in_csv_order_and_reads_back_equal(result):
    metrics = result.metrics
    row = metrics.row()
    assert list(row) == ROW_KEYS
    summary = metrics.summary_row()
    exposed = sum(metrics.breakdown_s[key] for key in EXPOSED_COMM_KEYS)
    assert summary.exposed_comm_fraction == exposed / metrics.iteration_time_s
    assert row[f"breakdown_s.{DP_SYNC}"] == metrics.breakdown_s[DP_SYNC]
    assert summary.fits_in_memory is True
    # the search journal: JSON out and back
    assert MetricsRow.from_row(json.loads(json.dumps(row))) == summary
    # the idle split is in the row (tiny-2gpu has two stages) and adds up to the idle
    causes = [row[f"idle_by_cause_s.{k}"] for k in ("schedule", "imbalance", "communication")]
    assert sum(causes) == pytest.approx(row["breakdown_s.idle"])
    # a journal written before the split: its rows read back with none
    older = {k: v for k, v in row.items() if not k.startswith("idle_by_cause_s.")}
    assert MetricsRow.from_row(older).idle_by_cause_s is None


def test_an_out_of_memory_run_does_not_fit_in_its_row(result):
    from dataclasses import replace

    oom = replace(result.metrics, out_of_memory="stage 0 needs more")
    assert oom.row()["fits_in_memory"] is False
    assert oom.to_json()["out_of_memory"] == "stage 0 needs more"


def test_a_sweep_point_row_puts_the_swept_keys_first(result):
    point = SweepPoint({"cluster.nic_gbps": 135.0}, result.metrics.summary_row())
    assert list(point.row()) == [
        "cluster.nic_gbps",
        *ROW_KEYS,
        "calibration",
        "assumptions",
    ]


def _row(tokens_per_s: float, num_gpus: int) -> MetricsRow:
    breakdown = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    breakdown[IDLE_TIME] = 1.0
    return MetricsRow(
        iteration_time_s=1.0,
        hardware_tflops_per_gpu=100.0,
        model_tflops_per_gpu=80.0,
        mfu=0.25,
        bubble_fraction=1.0,
        num_gpus=num_gpus,
        num_microbatches=8,
        tokens_per_s=tokens_per_s,
        memory_per_gpu_gib=10.0,
        breakdown_s=breakdown,
        exposed_comm_fraction=0.0,
        fits_in_memory=True,
    )


def test_training_time_is_tokens_over_throughput():
    times = training_time(_row(tokens_per_s=1000.0, num_gpus=8), tokens=86_400_000.0)
    assert times.days == 1.0 and times.gpu_hours == 24.0 * 8


def test_scale_points_against_the_fewest_nodes():
    base = load(**TWO_GPUS)
    entries = [(1, base, ""), (2, base, ""), (3, None, "3 GPUs do not divide")]
    points = scale_points(entries, [_row(1000.0, 2), _row(1500.0, 4), None], tokens=None)
    assert [p.scaled.speedup for p in points[:2]] == [1.0, 1.5]
    assert points[1].scaled.efficiency == 0.75
    assert points[2].metrics is None and points[2].why == "3 GPUs do not divide"
    row = points[1].row()
    assert list(row)[:3] == ["nodes", "data_parallel_size", "global_batch_size"]
    assert list(row)[-2:] == ["speedup", "scaling_efficiency"]
    timed = scale_points(entries[:1], [_row(1000.0, 2)], tokens=86_400_000.0)
    assert list(timed[0].row())[-2:] == ["days", "gpu_hours"]
    assert timed[0].row()["days"] == 1.0


def test_the_stage_table_elides_the_middle_of_a_long_pipeline(result):
    from dataclasses import replace

    from stepsim.report.summary import summary_text

    stage = result.metrics.stages[0]
    many = tuple(replace(stage, stage=i) for i in range(13))
    lines = summary_text(result._replace(metrics=replace(result.metrics, stages=many)))
    table = lines.split("per stage (seconds)")[1].split("\n\n")[0].splitlines()[1:]
    shown = [line.split()[1] if line.strip() != "..." else "..." for line in table]
    assert shown == ["0", "1", "2", "3", "4", "...", "8", "9", "10", "11", "12"]


def test_metrics_json_and_schedule_json_carry_the_schema_version(result):
    from stepsim.ir.results import SCHEMA_VERSION
    from stepsim.run.bubble import op_times, run_schedule

    assert result.metrics.to_json()["schema_version"] == SCHEMA_VERSION >= 2
    studied = run_schedule("1f1b", 2, 2, op_times(1.0, 2.0, None, 0.0)).as_dict()
    assert studied["schema_version"] == SCHEMA_VERSION
    # 1f1b, p 2, m 2: makespan (m + p - 1)(F + B) = 9, ideal m(F + B) = 6
    assert studied["bubble_fraction"] == 3 / 9 and studied["bubble_over_ideal"] == 3 / 6
