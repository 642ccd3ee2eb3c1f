"""What a person reads as text: the run summary, sweep and topology tables, and the
Chrome trace. Builds strings and dicts only; the CLI writes them to files. The
figures are in figures.py."""

from __future__ import annotations

from ..results import Result
from ..vocabulary import BACKWARD, BREAKDOWN_KEYS, CATEGORIES, FORWARD, STREAM_ORDER, WEIGHT
from .metrics import compute_lanes

# -- text ------------------------------------------------------------------------------


def summary_text(result: Result) -> str:
    s, m = result.scenario, result.metrics
    par, tr, cl = s.parallel, s.training, s.cluster
    node = f"{cl.node} nodes" if cl.node else f"nodes of {cl.gpus_per_node}"
    used = f"{m['num_gpus']} GPUs"
    if m["num_gpus"] < cl.num_gpus:
        used += f" of {cl.num_gpus}"
    lines = [
        f"stepsim · {s.name}",
        f"  {used} ({cl.num_nodes} {node}, {cl.gpu.name}, {cl.nics_per_node} x "
        f"{cl.nic_gbps:g} Gb/s NICs per node)",
        f"  TP {par.tensor_model_parallel_size} x PP {par.pipeline_model_parallel_size} x "
        f"DP {par.data_parallel_size}"
        + (" + sequence parallel" if par.sequence_parallel else "")
        + f" · {m['num_microbatches']} micro-batches of {tr.micro_batch_size} per pipeline"
        f" · {tr.schedule}"
        + (
            f" ({par.virtual_pipeline_model_parallel_size} chunks per stage)"
            if par.virtual_pipeline_model_parallel_size > 1
            else ""
        )
        + f" · recompute {tr.recompute_granularity}"
        + (" · overlapped grad reduce" if tr.overlap_grad_reduce else "")
        + f" · {s.network.model} network"
        + ("" if s.network.symmetry else " · exact mode (every GPU simulated)"),
        "",
        f"  iteration time            {m['iteration_time_s']:.4g} s",
        f"  throughput                {m['tokens_per_s']:,.0f} tokens/s",
        f"  hardware TFLOP/s per GPU  {m['hardware_tflops_per_gpu']:.1f}  (recomputation included)",
        f"  model TFLOP/s per GPU     {m['model_tflops_per_gpu']:.1f}",
        f"  MFU                       {100 * m['mfu']:.1f} %",
        f"  pipeline bubble           {100 * m['bubble_fraction']:.1f} % of the iteration",
        f"  memory per GPU            {m['memory_per_gpu_gib']:.1f} GiB of "
        f"{m['gpu_memory_gib']:g} GiB (peak on stage {m['memory_peak_stage']})",
    ]
    if m.get("out_of_memory"):
        lines.append(f"  WARNING: {m['out_of_memory']}")
    iteration = m["iteration_time_s"]
    lines += ["", "  where the time goes, mean per GPU      seconds       %"]
    for key in BREAKDOWN_KEYS:
        value = m["breakdown_s"][key]
        share = 100 * value / iteration if iteration else 0.0
        lines.append(f"    {BREAKDOWN_NAMES[key]:<34}{value:>10.4g}{share:>8.1f}")
    lines += ["", _stage_table(m["stages"])]
    if m.get("busiest_links"):
        lines += ["", "  busiest links (mean utilization over the iteration)"]
        for entry in m["busiest_links"]:
            lines.append(
                f"    {100 * entry['utilization']:5.1f} %  {entry['gbytes']:>10.3g} GB  "
                f"{entry['kind']:<7}{entry['link']}"
            )
    return "\n".join(lines)


BREAKDOWN_NAMES = {c.key: c.label for c in CATEGORIES}


def _stage_table(stages: list[dict]) -> str:
    head = "  per stage (seconds)  " + "".join(f"{k:>10}" for k in BREAKDOWN_KEYS) + "   mem GiB"
    rows = [head]
    shown = stages if len(stages) <= 12 else stages[:5] + [None] + stages[-5:]
    for stage in shown:
        if stage is None:
            rows.append("    ...")
            continue
        values = "".join(f"{stage['breakdown_s'][k]:>10.3g}" for k in BREAKDOWN_KEYS)
        rows.append(
            f"    stage {stage['stage']:<3} x{stage['stands_for_gpus']:<5}  {values}"
            f"{stage['memory_gib']['total']:>10.1f}"
        )
    return "\n".join(rows)


# -- figures ---------------------------------------------------------------------------


# -- Chrome trace ----------------------------------------------------------------------


def chrome_trace(result: Result) -> dict:
    """Chrome trace event format: a process per simulated GPU, a thread per stream.
    Opens in Perfetto (ui.perfetto.dev) and chrome://tracing."""
    events: list[dict] = []
    streams = sorted({sp.stream for sp in result.trace.spans}, key=lambda s: STREAM_ORDER.get(s, 9))
    tids = {stream: i for i, stream in enumerate(streams)}
    for lane in compute_lanes(result.trace.lanes):
        name = f"GPU {lane.gpu} (stage {lane.stage}"
        name += f", stands for {lane.stands_for} GPUs)" if lane.stands_for > 1 else ")"
        events.append(
            {"ph": "M", "name": "process_name", "pid": lane.gpu, "tid": 0, "args": {"name": name}}
        )
        events.append(
            {
                "ph": "M",
                "name": "process_sort_index",
                "pid": lane.gpu,
                "tid": 0,
                "args": {"sort_index": lane.stage},
            }
        )
        for stream, tid in tids.items():
            events.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": lane.gpu,
                    "tid": tid,
                    "args": {"name": stream},
                }
            )
    for sp in result.trace.spans:
        events.append(
            {
                "ph": "X",
                "name": f"{sp.label} {sp.kind}",
                "cat": sp.kind,
                "pid": sp.gpu,
                "tid": tids[sp.stream],
                "ts": sp.start_s * 1e6,
                "dur": (sp.end_s - sp.start_s) * 1e6,
                "args": {"microbatch": sp.microbatch},
            }
        )
    events += _link_counters(result)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"scenario": result.scenario.name},
    }


NETWORK_PID = 1_000_000_000  # a process of its own for the link counters


def _link_counters(result: Result, top: int = 8, bins: int = 400) -> list[dict]:
    """Utilization of the busiest links over time, as Chrome trace counter tracks."""
    from .linkstats import utilization_over_time

    busiest = result.metrics.get("busiest_links", [])[:top]
    if not busiest:
        return []
    chosen = [entry["index"] for entry in busiest]
    capacities = [link.bandwidth_bytes_per_s for link in result.cluster.links]
    edges, series = utilization_over_time(
        result.trace.link_intervals, capacities, chosen, result.trace.end_s, bins
    )
    events: list[dict] = [
        {
            "ph": "M",
            "name": "process_name",
            "pid": NETWORK_PID,
            "tid": 0,
            "args": {"name": "network: busiest links (utilization %)"},
        }
    ]
    for entry in busiest:
        for start, value in zip(edges[:-1], series[entry["index"]], strict=True):
            events.append(
                {
                    "ph": "C",
                    "name": entry["link"],
                    "pid": NETWORK_PID,
                    "ts": start * 1e6,
                    "args": {"utilization %": round(100 * float(value), 3)},
                }
            )
    return events


# -- sweeps ----------------------------------------------------------------------------


def sweep_table_text(keys: list[str], rows: list[dict]) -> str:
    head = [*keys, "iteration s", "HW TFLOP/s", "MFU %", "bubble %", "exposed comm %", "mem GiB"]
    body = [
        [
            *(str(row[k]) for k in keys),
            f"{row['iteration_time_s']:.4g}",
            f"{row['hardware_tflops_per_gpu']:.1f}",
            f"{100 * row['mfu']:.1f}",
            f"{100 * row['bubble_fraction']:.1f}",
            f"{100 * row['exposed_comm_fraction']:.1f}",
            f"{row['memory_per_gpu_gib']:.1f}" + ("" if row["fits_in_memory"] else " OOM"),
        ]
        for row in rows
    ]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    lines = [
        "  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)) for r in [head, *body]
    ]
    if not all(row["fits_in_memory"] for row in rows):
        lines.append("  OOM: does not fit in GPU memory (simulated all the same)")
    return "\n".join(lines)


# -- topology --------------------------------------------------------------------------

_LEVEL_NAMES = {1: "leaf", 2: "spine/aggregation", 3: "core"}
MAX_DRAWN_GPUS = 128


def topology_text(scenario, summary: dict) -> str:
    cl = scenario.cluster
    three_levels = cl.fabric == "fat-tree" and cl.fabric_levels == 3
    lines = [
        f"stepsim topology · {scenario.name}",
        f"  {summary['num_nodes']} nodes x {cl.gpus_per_node} GPUs"
        + (f" ({cl.node})" if cl.node else "")
        + f" = {summary['num_gpus']} GPUs, {summary['num_nics']} NICs of {cl.nic_gbps:g} Gb/s",
        f"  inside a node: {cl.nvlink_topology}, {cl.nvlink_gbytes_per_s:g} GB/s NVLink per GPU "
        f"per direction; GPU-NIC over PCIe at {cl.pcie_gbytes_per_s:g} GB/s",
        f"  links run at what NCCL reaches of the line rate: NVLink "
        f"{cl.nvlink_efficiency:.0%}, NICs {cl.nic_efficiency:.0%} (the figures below)",
        f"  fabric: {cl.fabric}"
        + (
            ""
            if cl.fabric == "switch"
            else f", {cl.nodes_per_leaf} nodes per leaf, {cl.spine_switches} switches above each "
            f"leaf{' and pod' if three_levels else ''}, oversubscription "
            f"{cl.oversubscription:g}:1"
            + (
                f", 3 levels ({cl.leaves_per_pod} leaves per pod)"
                if cl.fabric == "fat-tree" and cl.fabric_levels == 3
                else ""
            )
        ),
        "  switches: "
        + ", ".join(
            f"{n} {_LEVEL_NAMES.get(level, f'level {level}')}"
            for level, n in summary["switches_by_level"].items()
        ),
        "",
        "  directed links   count   GB/s each (min-max)   total GB/s",
    ]
    for kind, entry in summary["links"].items():
        lo, hi = entry["min_bytes_per_s"] / 1e9, entry["max_bytes_per_s"] / 1e9
        each = f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"
        lines.append(
            f"    {kind:<12}{entry['count']:>8}   {each:>19}   "
            f"{entry['total_bytes_per_s'] / 1e9:>10,.0f}"
        )
    bisection = summary["bisection_bytes_per_s"]
    half = summary["num_nodes"] // 2
    if bisection:
        lines += [
            "",
            f"  bisection bandwidth: {bisection / 1e9:,.0f} GB/s one way "
            f"({bisection * 8 / 1e12:,.1f} Tb/s) from nodes 0-{half - 1} to "
            f"{half}-{summary['num_nodes'] - 1}",
        ]
    return "\n".join(lines)


# -- the bubble study (stepsim schedule) --------------------------------------------------


def study_text(studies: list) -> str:
    """One block per schedule: makespan, bubble, per-rank bubble and peak in-flight."""
    first = studies[0]
    t = first.times
    weight = f" W {t.weight:g}" if t.weight else ""
    lines = [
        f"stepsim schedule · {first.num_ranks} stages x {first.num_microbatches} micro-batches "
        f"· F {t.forward:g} B {t.backward:g}{weight} c {t.p2p_latency:g} (per micro-batch "
        "and stage)",
        "",
        f"  {'schedule':<16}{'chunks':>7}{'makespan':>11}{'ideal':>9}{'bubble':>9}"
        f"{'of span':>9}{'peak act.':>11}",
    ]
    for study in studies:
        d = study.as_dict()
        peak = max(d["per_rank_peak_inflight_w"]) / study.num_chunks
        lines.append(
            f"  {study.name:<16}{study.num_chunks:>7}{d['makespan']:>11.4g}{d['ideal']:>9.4g}"
            f"{d['bubble_ratio']:>8.1%} {d['bubble_rate']:>8.1%}{peak:>11.3g}"
        )
    lines += [
        "",
        "  bubble: (makespan - ideal) / ideal, ideal = m(F + B + W); of span: the same over the "
        "makespan;",
        "  peak act.: most micro-batch activations a rank holds at once, in whole stages "
        "(chunk activations / chunks)",
    ]
    for study in studies:
        d = study.as_dict()
        lines += ["", f"  {study.name}: per rank    busy  bubble  peak in-flight (chunks)"]
        shown = list(range(study.num_ranks))
        if len(shown) > 16:
            shown = shown[:8] + [-1] + shown[-8:]
        for r in shown:
            if r < 0:
                lines.append("      ...")
                continue
            lines.append(
                f"    rank {r:<4}{d['per_rank_busy'][r]:>13.4g}{d['per_rank_bubble'][r]:>8.4g}"
                f"{d['per_rank_peak_inflight_w'][r]:>8d}"
            )
    return "\n".join(lines)


def study_trace(studies: list, time_unit_us: float = 1000.0) -> dict:
    """A Chrome/Perfetto trace: a process per schedule, a thread per rank; abstract time
    units are written as milliseconds."""
    events: list[dict] = []
    for pid, study in enumerate(studies):
        events.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": study.name}})
        for rank in range(study.num_ranks):
            events.append(
                {
                    "ph": "M",
                    "pid": pid,
                    "tid": rank,
                    "name": "thread_name",
                    "args": {"name": f"rank {rank}"},
                }
            )
        for span in study.trace.spans:
            if span.kind not in (FORWARD, BACKWARD, WEIGHT):
                continue  # the gaps are the bubble
            events.append(
                {
                    "ph": "X",
                    "pid": pid,
                    "tid": span.gpu,
                    "name": span.label,
                    "cat": span.kind,
                    "ts": span.start_s * time_unit_us,
                    "dur": (span.end_s - span.start_s) * time_unit_us,
                    "args": {"microbatch": span.microbatch},
                }
            )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


# -- validation ------------------------------------------------------------------------


def _validation_rows(comparisons) -> list[list[str]]:
    return [
        [
            c.id,
            c.what,
            c.model,
            c.setting,
            _seconds(c.measured_s),
            _seconds(c.simulated_s),
            f"{100 * c.error:+.1f} %",
        ]
        for c in comparisons
    ]


def _seconds(value_s: float) -> str:
    return f"{value_s:.3f} s" if value_s >= 1 else f"{1e3 * value_s:.2f} ms"


_VALIDATION_HEAD = ["id", "what", "model", "layout", "measured", "simulated", "error"]


def validation_text(comparisons, totals: dict) -> str:
    body = _validation_rows(comparisons)
    widths = [max(len(r[i]) for r in [_VALIDATION_HEAD, *body]) for i in range(7)]
    lines = ["stepsim validate · the calibration set", ""]
    for r in [_VALIDATION_HEAD, *body]:
        lines.append(
            "  "
            + "  ".join(
                cell.ljust(w) if i < 4 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    lines += [
        "",
        f"  over {totals['rows']} scored rows (iterations and layer totals): mean |error| "
        f"{100 * totals['mean_abs_error']:.1f} %, worst {100 * totals['worst_abs_error']:.1f} %",
    ]
    return "\n".join(lines)


def validation_markdown(comparisons, totals: dict, calibration=None) -> str:
    """docs/validation.md: the table and the plot; how the constants were chosen is in
    docs/calibration.md (written by hand)."""
    from ..scenario.presets import CALIBRATED_GPU, GPUS

    c = calibration or GPUS[CALIBRATED_GPU].kernels
    rows = _validation_rows(comparisons)
    table = ["| " + " | ".join(_VALIDATION_HEAD) + " |", "|" + "---|" * 7]
    table += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(
        [
            "# Validation: stepsim against the calibration set",
            "",
            "Written by `stepsim validate --out docs` (do not edit by hand). How the "
            "constants were chosen, what the rows assume and why the worst rows are off: "
            "[calibration.md](calibration.md).",
            "",
            f"Kernel constants ({c.gpu}): gemm_efficiency {c.gemm_efficiency:g}, "
            f"gemm_k_half {c.gemm_k_half:g}, memory_efficiency {c.memory_efficiency:g}, "
            f"tile {c.tile_m} x {c.tile_n}, {c.num_sms} SMs ({c.source}).",
            "",
            f"**Over {totals['rows']} scored rows (Table 1 iterations and Table 4 layer "
            f"totals): mean absolute error {100 * totals['mean_abs_error']:.1f} %, worst "
            f"{100 * totals['worst_abs_error']:.1f} %.** Target: every row within 8 %, mean "
            "at most 4 %.",
            "",
            "- Table 1 rows (Narayanan et al. 2021, arXiv 2104.04473): measured time = "
            "96 B s l h² (1 + s/6h + V/16lh) / (GPUs × measured TFLOP/s); full "
            "recomputation; interleaved schedule on pipelined rows with the chunks shown "
            "as v (the paper does not give them; see calibration.md).",
            "- Table 4 rows (Korthikanti et al. 2022, arXiv 2205.05198): one 22B layer, "
            "TP 8 on one DGX A100; forward and backward shown, their total scored.",
            "",
            *table,
            "",
            "![simulated vs measured](images/validation.png)",
            "",
        ]
    )
