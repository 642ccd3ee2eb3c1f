"""`stepsim validate`: simulate the calibration set and compare with the published
measurements; then the kernel section: every published kernel micro-benchmark row in
scenarios/validation/kernels/ against stepsim's time for that kernel
(stepsim.calibration.kernels), and every published collective row in
scenarios/validation/collectives/ against stepsim's network running that collective
alone (stepsim.calibration.collectives)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

from ..scenario import ScenarioError, read_calibration, read_validation_set, shipped_dir
from ..scenario.errors import shown
from ..scenario.files import VALIDATION_FILES, read_collective_tables, read_kernel_tables
from ..scenario.presets import CALIBRATED_GPUS, GPUS, NODES
from .common import check_out, out_errors, print_json, progress_for, quiet_argument
from .outfolder import out_folder

QUICK_MAX_GPUS = 1_000  # --quick skips the Table 1 rows on more GPUs
QUICK_MAX_H100_GPUS = 100  # and the H100 rows on more


def add_command(sub) -> None:
    validate = sub.add_parser(
        "validate",
        help="simulate the calibration sets and compare with the published measurements",
        description="Simulate every row of each GPU's calibration set (A100: Narayanan et al. "
        "2021 Table 1 and Korthikanti et al. 2022 Table 4; V100: the Megatron-LM README's "
        "DGX-2 table; H100: Megatron-Core r0.8.0's weak scaling) and print measured, "
        "simulated and error (iteration and layer times; the H100 rows in the model "
        "TFLOP/s per GPU its table publishes), one table per set with its mean, worst and "
        "verdict against the project's accuracy target; then the kernel "
        "section: each published kernel micro-benchmark (GEMMs, flash attention, norms; "
        "scenarios/validation/kernels/) against stepsim's time for that kernel, and each "
        "published NCCL collective (scenarios/validation/collectives/) against stepsim's "
        "network running it alone, with the mean and worst error per table; write "
        "validation.md and a plot.",
    )
    validate.add_argument(
        "--data",
        metavar="DIR",
        default=None,
        help="folder with the calibration CSV tables (default: the shipped sets, "
        "scenarios/validation in a checkout)",
    )
    validate.add_argument(
        "--calibration",
        metavar="FILE",
        help="kernel constants from FILE for the set that ran on its GPU",
    )
    validate.add_argument(
        "--out",
        metavar="DIR",
        help="write DIR/validation.md and DIR/images/validation.png (the project's is docs)",
    )
    validate.add_argument(
        "--quick",
        action="store_true",
        help="skip the A100 rows over 1,000 GPUs and the H100 rows over 100",
    )
    validate.add_argument(
        "--kernels",
        action="store_true",
        help="only the kernel section (seconds): the kernel micro-benchmark and collective tables",
    )
    validate.add_argument(
        "--kernel-rows",
        action="store_true",
        help="print the kernel section row by row (id, shape, published, simulated, error; "
        "collectives: bus bandwidths and the algorithm stepsim ran)",
    )
    validate.add_argument(
        "--kernel-data",
        metavar="DIR",
        default=None,
        help="folder with the kernel tables (default: the shipped ones, "
        "scenarios/validation/kernels in a checkout)",
    )
    validate.add_argument(
        "--collective-data",
        metavar="DIR",
        default=None,
        help="folder with the collective tables (default: the shipped ones, "
        "scenarios/validation/collectives in a checkout)",
    )
    validate.add_argument(
        "--network-fits",
        action="store_true",
        help="only fit the node presets' nvlink_efficiency and nic_efficiency on the "
        "collective tables and print each fit beside the preset's value (seconds)",
    )
    validate.add_argument(
        "--json",
        action="store_true",
        help="print one JSON document: the kernel section row by row (and each set's rows "
        "unless --kernels)",
    )
    quiet_argument(validate, "no progress line on the terminal while it runs")
    validate.set_defaults(handler=command)


def _kernels(args: argparse.Namespace) -> dict:
    """The kernel section: each table's rows compared, by section (a one-line error for
    a row the model cannot use)."""
    from ..calibration.kernels import compare_kernels, kernel_rows

    folder = args.kernel_data or shipped_dir() / "validation" / "kernels"
    tables = read_kernel_tables(folder)
    try:
        return compare_kernels(kernel_rows(tables), GPUS)
    except (KeyError, ValueError) as exc:
        raise ScenarioError(
            f"kernel tables in {str(folder)!r}: a row cannot be used: {_problem(exc)}"
        ) from None


def _collective_rows(args: argparse.Namespace) -> list:
    """The collective tables' rows (a one-line error for a row the model cannot use)."""
    from ..calibration.collectives import collective_rows

    folder = args.collective_data or shipped_dir() / "validation" / "collectives"
    tables, logs = read_collective_tables(folder)
    try:
        return collective_rows(tables, logs)
    except (KeyError, ValueError) as exc:
        raise ScenarioError(
            f"collective tables in {str(folder)!r}: a row cannot be used: {_problem(exc)}"
        ) from None


def _collectives(args: argparse.Namespace) -> dict:
    """The kernel section's collectives: each table's rows compared, by section."""
    from ..calibration.collectives import Network, compare_collectives
    from ..run.iteration import build_cluster

    rows = _collective_rows(args)
    try:
        return compare_collectives(rows, Network(build_cluster))
    except (KeyError, ValueError) as exc:
        raise ScenarioError(
            f"collective tables: a row cannot be simulated: {_problem(exc)}"
        ) from None


def command(args: argparse.Namespace) -> int:
    from ..calibration import collectives
    from ..calibration.kernels import comparison_json
    from ..ir.results import SCHEMA_VERSION

    check_out("--out", args.out)  # before anything is simulated: exit 2 on a bad path
    if args.network_fits:
        print(network_fits_text(_collective_rows(args)))
        return 0
    if args.kernels:
        kernels, comms = _kernels(args), _collectives(args)
        if args.json:
            print_json(
                {
                    "schema_version": SCHEMA_VERSION,
                    "kernels": comparison_json(kernels),
                    "collectives": collectives.comparison_json(comms),
                }
            )
        else:
            print(kernel_text(kernels, args.kernel_rows))
            print()
            print(collective_text(comms, args.kernel_rows))
        if args.out:
            with out_errors("--out", args.out):
                _write_kernels_only(Path(args.out), kernels, comms, quiet=args.json)
        return 0
    return _sets(args)


def _write_kernels_only(out: Path, kernels: dict, comms: dict, quiet: bool) -> None:
    """--kernels --out DIR: the kernel section's markdown alone, DIR/validation-kernels.md."""
    with out_folder(out, "validate --kernels") as folder:
        folder.text(
            "validation-kernels.md", kernel_markdown(kernels) + "\n" + collective_markdown(comms)
        )
    if not quiet:  # --json: stdout holds the document alone
        print(f"\n  wrote {out}/validation-kernels.md")


def _sets(args: argparse.Namespace) -> int:
    from ..calibration import collectives
    from ..calibration.kernels import comparison_json
    from ..calibration.validation import CONVERSIONS, TARGET, compare, summary
    from ..ir.results import SCHEMA_VERSION
    from ..report.tables import validation_markdown, validation_text
    from ..run.iteration import run

    folder = args.data or shipped_dir() / "validation"
    rows = read_validation_set(folder)
    if args.quick:
        quick = {"megatron": QUICK_MAX_GPUS, "h100": QUICK_MAX_H100_GPUS}
        for table, most in quick.items():
            path = Path(folder) / VALIDATION_FILES[table]
            rows[table] = [r for r in rows[table] if _gpus(r, path) <= most]
    if not any(rows.values()):  # before the kernel section: nothing to score at all
        _nothing_to_score(folder, {name: _no_rows(name, folder, args.quick) for name in SET_TABLES})
    kernels = _kernels(args)  # read first: a bad kernel table fails before minutes of sets
    comms = _collectives(args)
    calibrations = {}
    if args.calibration:
        constants = read_calibration(args.calibration)
        sets = [name for name, gpu in CALIBRATED_GPUS.items() if gpu == constants.gpu]
        if not sets:
            raise ScenarioError(
                f"--calibration {args.calibration!r} is for gpu={constants.gpu!r}; the "
                f"calibration sets ran on {', '.join(CALIBRATED_GPUS.values())}"
            )
        calibrations[sets[0]] = constants
    progress = progress_for(args)

    def tell(name: str) -> None:
        progress.begin(f"simulating {name}")

    try:
        by_set = compare(
            rows, lambda s, spans: run(s, progress.update, spans=spans), calibrations, tell
        )
    except ScenarioError:
        raise
    except (KeyError, ValueError) as exc:  # a row's cell that is not a number, or empty
        raise ScenarioError(
            f"--data {args.data!r}: a row cannot be used: {_problem(exc)}"
        ) from None
    finally:
        progress.clear()
    totals = {name: summary(comparisons) for name, comparisons in by_set.items()}
    empty = {
        name: _no_rows(name, folder, args.quick) for name in by_set if not totals[name]["rows"]
    }
    if len(empty) == len(by_set):
        _nothing_to_score(folder, empty)
    by_set = {name: c for name, c in by_set.items() if name not in empty}
    totals = {name: t for name, t in totals.items() if name not in empty}
    if args.json:
        print_json(
            {
                "schema_version": SCHEMA_VERSION,
                # the target every set is held to (calibration.validation.TARGET)
                "target": TARGET._asdict(),
                "sets": {
                    name: {
                        **totals[name],
                        "conversion": CONVERSIONS.get(name),
                        "detail": [c.as_json() for c in comparisons],
                    }
                    for name, comparisons in by_set.items()
                }
                | {
                    name: {
                        "rows": 0,
                        "mean_abs_error": None,
                        "worst_abs_error": None,
                        "target": None,
                        "why": why,
                    }
                    for name, why in empty.items()
                },
                "kernels": comparison_json(kernels),
                "collectives": collectives.comparison_json(comms),
            }
        )
    else:
        print(validation_text(by_set, totals))
        if empty:
            print("\n" + "\n".join(f"  not scored: {why}" for why in empty.values()))
        print()
        print(kernel_text(kernels, args.kernel_rows))
        print()
        print(collective_text(comms, args.kernel_rows))
    if args.out:
        from ..report.figures import validation_figure

        out = Path(args.out)
        with out_errors("--out", args.out), out_folder(out, "validate") as folder:
            figure = validation_figure(by_set, TARGET.row_abs_error)
            folder.figure("images/validation.png", figure, dpi=110)
            folder.text(
                "validation.md",
                validation_markdown(by_set, totals, calibrations)
                + "\n"
                + kernel_markdown(kernels)
                + "\n"
                + collective_markdown(comms),
            )
        if not args.json:  # stdout holds the document alone
            print(f"\n  wrote {args.out}/validation.md and {args.out}/images/validation.png")
    return 0


# the tables (files.VALIDATION_FILES) each calibration set's rows come from
SET_TABLES = {"a100": ("megatron", "layers"), "v100": ("dgx2",), "h100": ("h100",)}


def _nothing_to_score(folder: str | Path, empty: dict[str, str]) -> NoReturn:
    """The one-line error of a validation with no row in any set (exit 2)."""
    raise ScenarioError(
        f"--data {str(folder)!r}: no calibration set has a row to score ("
        + "; ".join(empty.values())
        + "); give tables with rows"
    )


def _no_rows(name: str, folder: str | Path, quick: bool) -> str:
    """Why a set has nothing to score, naming its tables: no rows in them (or none
    left by --quick)."""
    from ..calibration.validation import SETS

    files = " and ".join(str(Path(folder) / VALIDATION_FILES[t]) for t in SET_TABLES[name])
    left = " left by --quick" if quick else ""
    return f"{SETS[name].split(' · ')[0]} set: no rows{left} in {files}"


def _problem(exc: Exception) -> str:
    """What a KeyError or ValueError from a table's row says, as words (not a repr)."""
    if isinstance(exc, KeyError):
        return f"it has no value for {shown(exc.args[0]) if exc.args else 'a column'}"
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _gpus(row: dict[str, str], path: Path) -> int:
    """A row's num_gpus (0 when empty), or a one-line error naming the file and the row."""
    text = row["num_gpus"] or "0"
    if not text.strip().isdigit():
        raise ScenarioError(
            f"--data {str(path)!r}: row {row.get('id')!r} has num_gpus={text!r}, not a count"
        )
    return int(text)


# -- the kernel section's text and markdown ---------------------------------------------------


def _percent(x: float) -> str:
    return f"{100 * x:+.1f} %"


def kernel_text(kernels: dict, rows: bool = False) -> str:
    """One line per table (section): rows, mean |error| (over its fitted rows too, where a
    constant was fitted on them) and the worst row; with ``rows`` each row below it."""
    from ..calibration.kernels import SECTIONS, summary

    lines = [
        "stepsim validate · kernels: stepsim's time for each published kernel against the "
        "published time (error = simulated / published - 1)",
        "  role: fit = a constant of that GPU was fitted on its rows marked * (their mean "
        "under 'fitted'); check = none was; other kernel = a kernel stepsim does not model "
        "as such, for scale. source: vendor, third party or secondary; plot = read from a plot",
        "",
        f"  {'table':40} {'gpu':15} {'source':17} {'role':12} {'rows':>4} {'mean |err|':>10} "
        f"{'fitted':>8}  worst",
    ]
    for key, comparisons in kernels.items():
        s, t = SECTIONS[key], summary(comparisons)
        fitted = "" if t.fitted_mean_abs_error is None else f"{100 * t.fitted_mean_abs_error:.1f} %"
        lines.append(
            f"  {s.title:40} {s.gpu:15} {s.label:17} {s.role:12} {t.rows:4d} "
            f"{100 * t.mean_abs_error:8.1f} % {fitted:>8}  {_percent(t.worst.error)} "
            f"({t.worst.id}: {t.worst.shape})"
        )
        if rows:
            lines.append(f"      {s.source}: {s.kind}; {s.what}")
            for c in comparisons:
                note = f"  [{c.note}]" if c.note else ""
                lines.append(
                    f"      {c.id:5} {'*' if c.fitted else ' '} {c.shape:58} "
                    f"{1e6 * c.measured_s:11.1f} us {1e6 * c.simulated_s:11.1f} us "
                    f"{_percent(c.error):>9}{note}"
                )
    return "\n".join(lines)


def kernel_markdown(kernels: dict) -> str:
    """validation.md's kernel section: one row per table (section)."""
    from ..calibration.kernels import SECTIONS, summary

    out = [
        "## Kernels: stepsim against published kernel micro-benchmarks",
        "",
        "Each row of the tables in `scenarios/validation/kernels/` (their README.md cites "
        "every file, its source commit and caveats) against stepsim's time for that exact "
        "kernel on that GPU's record: GEMMs by `cost.kernels.gemm_seconds` (FP8: "
        "`cost.fp8.fp8_gemm_seconds`), flash attention by `cost.attention.flash_seconds`, "
        "norms and STREAM at the HBM bandwidth x `memory_efficiency`. Error = simulated / "
        "published - 1. Role: **fit**, a constant of that GPU was fitted on the rows the "
        'last-but-one column counts (docs/calibration.md, "Kernel tables"); **check**, '
        "no constant was fitted on them; **other kernel**, a kernel stepsim does not model "
        "as such (FlashAttention-2 and -3 where the H100's attention is cuDNN's), shown for "
        "scale. Every row: `stepsim validate --kernels --kernel-rows`.",
        "",
        "| table | GPU | source | role | rows | mean abs error | fitted rows: mean | worst (row) |",
        "|---|---|---|---|---:|---:|---:|---|",
    ]
    for key, comparisons in kernels.items():
        s, t = SECTIONS[key], summary(comparisons)
        fitted = (
            "—"
            if t.fitted_mean_abs_error is None
            else f"{t.fitted_rows}: {100 * t.fitted_mean_abs_error:.1f} %"
        )
        out.append(
            f"| {s.title} | `{s.gpu}` | {s.kind} | {s.role} | {t.rows} | "
            f"{100 * t.mean_abs_error:.1f} % | {fitted} | {_percent(t.worst.error)} "
            f"({t.worst.id}: {t.worst.shape}) |"
        )
    return "\n".join(out) + "\n"


# -- the collectives: text, markdown and the fits -----------------------------------------


def collective_text(comms: dict, rows: bool = False) -> str:
    """The kernel section's collectives, one line per table (section) as `kernel_text`
    gives the kernels; with ``rows`` each row's bus bandwidths below it."""
    from ..calibration.collectives import SECTIONS
    from ..calibration.kernels import summary

    lines = [
        "  collectives: each published NCCL collective run alone through stepsim's network on "
        "the node preset, the algorithm NCCL would pick ('auto') unless the table names it "
        "(error = simulated / published time - 1)",
        "  role: fit = the node's nvlink_efficiency or nic_efficiency was fitted on its rows "
        "marked * (their mean under 'fitted'); check = none was. source: vendor or third "
        "party; assumed = the measured machine's network is not the preset's",
        "",
        f"  {'table':44} {'node':12} {'source':19} {'role':6} {'rows':>4} {'mean |err|':>10} "
        f"{'fitted':>8}  worst",
    ]
    for key, comparisons in comms.items():
        s, t = SECTIONS[key], summary(comparisons)
        fitted = "" if t.fitted_mean_abs_error is None else f"{100 * t.fitted_mean_abs_error:.1f} %"
        lines.append(
            f"  {s.title:44} {s.node:12} {s.label:19} {s.role:6} {t.rows:4d} "
            f"{100 * t.mean_abs_error:8.1f} % {fitted:>8}  {_percent(t.worst.error)} "
            f"({t.worst.id}: {t.worst.shape})"
        )
        if rows:
            lines.append(f"      {s.source}: {s.kind}; {s.what}")
            lines.append(
                f"      {'id':6}   {'collective':42} {'busbw GB/s: published':>22} "
                f"{'stepsim':>8} {'time error':>10}  runs"
            )
            for c in comparisons:
                note = f"  [{c.note}]" if c.note else ""
                lines.append(
                    f"      {c.id:6} {'*' if c.fitted else ' '} {c.shape:42} "
                    f"{c.measured_busbw_gbytes_per_s:22.1f} {c.simulated_busbw_gbytes_per_s:8.1f} "
                    f"{_percent(c.error):>10}  {c.runs}{note}"
                )
    return "\n".join(lines)


def collective_markdown(comms: dict) -> str:
    """validation.md's collectives: one row per table (section)."""
    from ..calibration.collectives import SECTIONS
    from ..calibration.kernels import summary

    out = [
        "## Collectives: stepsim's network against published NCCL measurements",
        "",
        "Each row of the tables in `scenarios/validation/collectives/` (their README.md cites "
        "every file, its source commit and caveats) run alone through stepsim's network on "
        "the node preset it was measured on (`stepsim.calibration.collectives`): the same "
        "collective over the same groups of GPUs, by the algorithm NCCL would run (`auto`) "
        "or the one the table states. Error = simulated / published time - 1. Role: "
        "**fit**, the node's `nvlink_efficiency` or `nic_efficiency` was fitted on the rows "
        'the last-but-one column counts (docs/calibration.md, "Network constants"); '
        "**check**, no constant was fitted on them. Every row, with both bus bandwidths "
        "and the algorithm stepsim ran: `stepsim validate --kernels --kernel-rows`.",
        "",
        "| table | node | source | role | rows | mean abs error | fitted rows: mean | "
        "worst (row) |",
        "|---|---|---|---|---:|---:|---:|---|",
    ]
    for key, comparisons in comms.items():
        s, t = SECTIONS[key], summary(comparisons)
        fitted = (
            "—"
            if t.fitted_mean_abs_error is None
            else f"{t.fitted_rows}: {100 * t.fitted_mean_abs_error:.1f} %"
        )
        out.append(
            f"| {s.title} | `{s.node}` | {s.kind} | {s.role} | {t.rows} | "
            f"{100 * t.mean_abs_error:.1f} % | {fitted} | {_percent(t.worst.error)} "
            f"({t.worst.id}: {t.worst.shape}) |"
        )
    return "\n".join(out) + "\n"


def network_fits_text(rows: list) -> str:
    """--network-fits: each fit of COLLECTIVE_FITS, what it gives beside the preset's."""
    from ..calibration.collectives import COLLECTIVE_FITS, Network, fit_rows, run_fit
    from ..run.iteration import build_cluster

    network = Network(build_cluster)
    lines = [
        "stepsim validate · network fits: each node constant fitted on the large rows of its "
        "collective tables (least squared relative time error, grid 0.30-1.00 by 0.01)",
        "",
        f"  {'node':12} {'constant':18} {'fitted':>6} {'rms':>7} {'preset':>7} {'rms':>7}  "
        "rows (tables)",
    ]
    for fit in COLLECTIVE_FITS:
        if not [r for r in rows if r.section in fit.sections and r.large]:
            lines.append(f"  {fit.node:12} {fit.constant:18} no large rows in these tables")
            continue
        value, rms, preset_rms, count = run_fit(fit, rows, network)
        preset = float(NODES[fit.node][fit.constant])  # type: ignore[arg-type]  # a float preset
        chosen = fit_rows(rows, fit.sections)
        kept = "" if fit.shipped else "  (not applied: the preset keeps its measured value)"
        lines.append(
            f"  {fit.node:12} {fit.constant:18} {value:6.2f} {100 * rms:5.1f} % {preset:7.3f} "
            f"{100 * preset_rms:5.1f} %  {count}: {chosen[0].id}..{chosen[-1].id} "
            f"({', '.join(fit.sections)}){kept}"
        )
    return "\n".join(lines)
