"""Tables a person reads in a terminal: the sweep table, the cluster description, the
bubble study and the validation table (and its markdown page). Strings only; the
run summary is in summary.py, the traces in trace.py, the figures in timeline.py and
figures.py."""

from __future__ import annotations

from collections.abc import Sequence

from ..ir.results import IDLE_CAUSES, SweepPoint
from ..scenario.presets import CALIBRATED_GPUS, GPUS
from .summary import decimal_places


def sweep_table_text(keys: list[str], points: Sequence[SweepPoint]) -> str:
    """The sweep's table; the bubble split by cause (the schedule's own, stage imbalance,
    communication waits: run/bubble.py) where the points have a pipeline."""
    split = any(p.metrics.idle_by_cause_s for p in points)
    head = [*keys, "iteration s", "HW TFLOP/s", "MFU %", "bubble %"]
    if split:
        head += ["own %", "imbal %", "comm %"]
    head += ["exposed comm %", "mem GiB"]
    body = []
    # one number of places for the column, so 97.70 stands under 99.88 (not 97.7)
    places = decimal_places(max((p.metrics.iteration_time_s for p in points), default=0.0))
    for p in points:
        m = p.metrics
        row = [
            *(str(p.settings[k]) for k in keys),
            f"{m.iteration_time_s:.{places}f}",
            f"{m.hardware_tflops_per_gpu:.1f}",
            f"{100 * m.mfu:.1f}",
            f"{100 * m.bubble_fraction:.1f}",
        ]
        if split:
            causes = m.idle_by_cause_s or {}
            row += [
                f"{100 * causes[k] / m.iteration_time_s:.1f}" if k in causes else "-"
                for k in IDLE_CAUSES
            ]
        row += [
            f"{100 * m.exposed_comm_fraction:.1f}",
            f"{m.memory_per_gpu_gib:.1f}" + ("" if m.fits_in_memory else " OOM"),
        ]
        body.append(row)
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    lines = [
        "  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)) for r in [head, *body]
    ]
    if split:
        lines.append(
            "  bubble % = own % (the schedule's, with equal stages and free communication) "
            "+ imbal % (unequal stages) + comm % (waits on transfers)"
        )
    if not all(point.metrics.fits_in_memory for point in points):
        lines.append("  OOM: does not fit in GPU memory (simulated all the same)")
    return "\n".join(lines)


# -- topology --------------------------------------------------------------------------

_LEVEL_NAMES = {1: "leaf", 2: "spine/aggregation", 3: "core"}


def _fabric_text(cl) -> str:
    """The fabric line of `stepsim topology`."""
    if cl.fabric == "switch":
        return "  fabric: switch"
    if cl.fabric == "rail-only":
        return (
            f"  fabric: rail-only, one switch per rail ({cl.nics_per_node} rails, no spines);\n"
            "    traffic to another rail crosses NVLink to the GPU on that rail first"
        )
    oversubscription = f"oversubscription {cl.oversubscription:g}:1"
    if cl.fabric == "multi-plane":
        planes = cl.fabric_planes or cl.nics_per_node
        return (
            f"  fabric: multi-plane, {planes} planes (NIC k on plane k mod {planes}), each a "
            f"2-level fat tree:\n    {cl.nodes_per_leaf} nodes per leaf, {cl.spine_switches} "
            f"spines per plane, {oversubscription};\n"
            "    traffic to another plane crosses NVLink first"
        )
    three_levels = cl.fabric == "fat-tree" and cl.fabric_levels == 3
    return (
        f"  fabric: {cl.fabric}, {cl.nodes_per_leaf} nodes per leaf, {cl.spine_switches} "
        f"switches above each leaf{' and pod' if three_levels else ''}, {oversubscription}"
        + (f", 3 levels ({cl.leaves_per_pod} leaves per pod)" if three_levels else "")
    )


def topology_text(scenario, summary: dict) -> str:
    cl = scenario.cluster
    nvls = cl.nvls_fraction
    lines = [
        f"stepsim topology · {scenario.name}",
        f"  {summary['num_nodes']} nodes x {cl.gpus_per_node} GPUs"
        + (f" ({cl.node})" if cl.node else "")
        + f" = {summary['num_gpus']} GPUs, {summary['num_nics']} NICs of {cl.nic_gbps:g} Gb/s",
        f"  inside a node: {cl.nvlink_topology}, {cl.nvlink_gbytes_per_s:g} GB/s NVLink per GPU "
        f"per direction; GPU-NIC over PCIe at {cl.pcie_gbytes_per_s:g} GB/s",
        f"  links run at what NCCL reaches of the line rate: NVLink "
        f"{cl.nvlink_efficiency:.0%}, NICs {cl.nic_efficiency:.0%} (the figures below)",
        *(
            [
                f"  the NVSwitch reduces (NVLink SHARP, NVLS) at {nvls:.0%} of NVLink "
                '(collective_algorithm = "nvls")'
            ]
            if nvls
            else []
        ),
        _fabric_text(cl),
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
    pair = "" if t.overlapped is None else f" F&B {t.overlapped:g}"
    lines = [
        f"stepsim schedule · {first.num_ranks} stages x {first.num_microbatches} micro-batches "
        f"· F {t.forward:g} B {t.backward:g}{weight}{pair} c {t.p2p_latency:g} (per micro-batch "
        "and stage)",
        "",
        f"  {'schedule':<16}{'chunks':>7}{'makespan':>11}{'ideal':>9}{'bubble':>9}"
        f"{'/ ideal':>9}{'peak act.':>11}",
    ]
    for study in studies:
        d = study.as_dict()
        peak = max(d["per_rank_peak_inflight_w"]) / study.chunks_per_stage
        lines.append(
            f"  {study.name:<16}{study.num_chunks:>7}{d['makespan']:>11.4g}{d['ideal']:>9.4g}"
            f"{d['bubble_fraction']:>8.1%} {d['bubble_over_ideal']:>8.1%}{peak:>11.3g}"
        )
    lines += [
        "",
        "  bubble: idle share of the makespan (as `stepsim run`'s bubble), (makespan - ideal) / "
        "makespan with ideal = m(F + B + W); / ideal: (makespan - ideal) / ideal;",
        "  peak act.: most micro-batch activations a rank holds at once, in whole stages "
        "(chunk activations / chunks)",
    ]
    if any(study.overlaps for study in studies):
        lines.append(
            "  with overlapped F&B pairs timed apart (--overlapped) the ideal is the ranks' mean "
            "busy time instead"
        )
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


# -- validation ------------------------------------------------------------------------


def _validation_rows(comparisons) -> list[list[str]]:
    return [
        [
            c.id,
            c.what,
            c.model,
            c.setting,
            _figure(c.measured, c.unit),
            _figure(c.simulated, c.unit),
            f"{100 * c.error:+.1f} %",
        ]
        for c in comparisons
    ]


def _figure(value: float, unit: str) -> str:
    """A row's measured or simulated figure in the row's unit (Comparison.unit)."""
    return _seconds(value) if unit == "s" else f"{value:.1f} {unit}"


def _seconds(value_s: float) -> str:
    return f"{value_s:.3f} s" if value_s >= 1 else f"{1e3 * value_s:.2f} ms"


_VALIDATION_HEAD = ["id", "what", "model", "layout", "measured", "simulated", "error"]


def _validation_table_text(comparisons) -> list[str]:
    body = _validation_rows(comparisons)
    widths = [max(len(r[i]) for r in [_VALIDATION_HEAD, *body]) for i in range(7)]
    return [
        "  "
        + "  ".join(
            cell.ljust(w) if i < 4 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in [_VALIDATION_HEAD, *body]
    ]


def _totals_line(totals: dict) -> str:
    return (
        f"over {totals['rows']} scored rows: mean |error| "
        f"{100 * totals['mean_abs_error']:.1f} %, worst {100 * totals['worst_abs_error']:.1f} %"
    )


def _target_line(totals: dict) -> str:
    """A set against the target (calibration.validation.verdict): "target (every row
    within 8 %, mean at most 4 %): met", or missed and why."""
    from ..calibration.validation import Target, target_text

    v = totals["target"]
    limits = Target(v["row_abs_error"], v["mean_abs_error"])
    head = f"target ({target_text(limits)}): "
    if v["met"]:
        return head + "met"
    why = []
    if not totals["rows"]:
        why.append("no scored rows")
    if not v["mean_met"]:
        why.append(
            f"mean {100 * totals['mean_abs_error']:.1f} % over {100 * limits.mean_abs_error:g} %"
        )
    if v["rows_over"]:
        why.append(
            f"{len(v['rows_over'])} of {totals['rows']} rows over "
            f"{100 * limits.row_abs_error:g} % ({', '.join(v['rows_over'])})"
        )
    return head + "missed: " + "; ".join(why)


def validation_text(by_set: dict, totals: dict) -> str:
    """One table per calibration set, each with how its published figures were
    converted, its mean and worst error and its verdict against the target."""
    from ..calibration.validation import CONVERSIONS, ERROR_CONVENTION, SETS

    lines = ["stepsim validate · the calibration sets", f"  {ERROR_CONVENTION}"]
    for name, comparisons in by_set.items():
        lines += ["", f"  {SETS[name]}", *_validation_table_text(comparisons), ""]
        if name in CONVERSIONS:
            lines.append(f"  {CONVERSIONS[name]}")
        lines += [f"  {_totals_line(totals[name])}", f"  {_target_line(totals[name])}"]
    return "\n".join(lines)


_SET_NOTES = {
    "a100": [
        "- Table 1 rows (Narayanan et al. 2021, arXiv 2104.04473): full recomputation; "
        "the schedule of NVIDIA's reproduction script "
        "(examples/sc21/run_table_1.sh): 39B and 1T without interleaving, the others "
        "with the chunks per stage shown as v; no gradient-accumulation fusion "
        "(Megatron-LM 2021).",
        "- Table 4 rows (Korthikanti et al. 2022, arXiv 2205.05198): one 22B layer, "
        "TP 8 on one DGX A100; forward and backward shown, their total scored.",
    ],
    "v100": [
        "- The Megatron-LM README's DGX-2 table (2020): one DGX-2 (16 × V100 SXM3 32 GB "
        "on NVSwitch), batch 8, full recomputation, no gradient-accumulation fusion; "
        "measured iteration time as printed.",
    ],
    "h100": [
        "- Megatron-Core r0.8.0 weak scaling (NVIDIA/Megatron-LM README, 2024). As "
        "Megatron-Core r0.8.0 runs (its source and the table's notes): Transformer "
        'Engine\'s fused attention (`attention_kernel = "flash"`), --tp-comm-overlap, '
        "overlapped gradient reduce, distributed optimizer. Assumed (unpublished): "
        "micro-batch 1, no recomputation, sequence parallelism, no interleaving "
        "(calibration.md).",
    ],
}


def validation_markdown(by_set: dict, totals: dict, calibrations=None) -> str:
    """docs/validation.md: one table per calibration set and the plot; how the constants
    were chosen is in docs/calibration.md (written by hand)."""
    from ..calibration.validation import CONVERSIONS, ERROR_CONVENTION, SETS, target_text

    calibrations = calibrations or {}
    out = [
        "# Validation: stepsim against the calibration sets",
        "",
        "Written by `stepsim validate --out docs` (do not edit by hand). How each GPU's "
        "constants were chosen, what the rows assume and why the worst rows are off: "
        f"[calibration.md](calibration.md). Target per set: {target_text()}. "
        f"{ERROR_CONVENTION[0].upper()}{ERROR_CONVENTION[1:]}.",
        "",
        "| set | scored rows | mean abs error | worst abs error | target |",
        "|---|---:|---:|---:|---|",
    ]
    for name in by_set:
        t = totals[name]
        out.append(
            f"| {SETS[name]} | {t['rows']} | {100 * t['mean_abs_error']:.1f} % | "
            f"{100 * t['worst_abs_error']:.1f} % | {'met' if t['target']['met'] else 'missed'} |"
        )
    for name, comparisons in by_set.items():
        c = calibrations.get(name) or GPUS[CALIBRATED_GPUS[name]].kernels
        t = totals[name]
        rows = _validation_rows(comparisons)
        conversion = [f"- {CONVERSIONS[name]}"] if name in CONVERSIONS else []
        out += [
            "",
            f"## {SETS[name]}",
            "",
            f"Kernel constants ({c.gpu}): gemm_efficiency {c.gemm_efficiency:g}, "
            f"gemm_k_half {c.gemm_k_half:g}, memory_efficiency {c.memory_efficiency:g}, "
            f"tile {c.tile_m} x {c.tile_n}, {c.num_sms} SMs ({c.source}).",
            "",
            f"**{_totals_line(t).capitalize()}.**",
            "",
            f"T{_target_line(t)[1:]}.",  # "target ..." as a sentence (ids keep their case)
            "",
            *_SET_NOTES[name],
            *conversion,
            "",
            "| " + " | ".join(_VALIDATION_HEAD) + " |",
            "|" + "---|" * 7,
            *("| " + " | ".join(r) + " |" for r in rows),
        ]
    out += ["", "![simulated vs measured](images/validation.png)", ""]
    return "\n".join(out)
