"""`stepsim validate`: simulate the calibration set and compare with the published
measurements."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..scenario import ScenarioError, read_calibration, read_validation_set, shipped_dir
from ..scenario.presets import CALIBRATED_GPUS
from .common import progress_for, quiet_argument

QUICK_MAX_GPUS = 1_000  # --quick skips the Table 1 rows on more GPUs
QUICK_MAX_H100_GPUS = 100  # and the H100 rows on more


def add_command(sub) -> None:
    validate = sub.add_parser(
        "validate",
        help="simulate the calibration sets and compare with the published measurements",
        description="Simulate every row of each GPU's calibration set (A100: Narayanan et al. "
        "2021 Table 1 and Korthikanti et al. 2022 Table 4; V100: the Megatron-LM README's "
        "DGX-2 table; H100: Megatron-Core r0.8.0's weak scaling) and print measured, "
        "simulated and error, one table per set with its mean and worst; write "
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
    quiet_argument(validate, "no progress line on the terminal while it runs")
    validate.set_defaults(handler=command)


def command(args: argparse.Namespace) -> int:
    from ..calibration.validation import compare, summary
    from ..report.tables import validation_markdown, validation_text
    from ..run.iteration import run

    rows = read_validation_set(args.data or shipped_dir() / "validation")
    if args.quick:
        rows["megatron"] = [r for r in rows["megatron"] if _gpus(r) <= QUICK_MAX_GPUS]
        rows["h100"] = [r for r in rows["h100"] if _gpus(r) <= QUICK_MAX_H100_GPUS]
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
        by_set = compare(rows, lambda s: run(s, progress.update), calibrations, tell)
    except ScenarioError:
        raise
    except (KeyError, ValueError) as exc:  # a row's cell that is not a number, or empty
        raise ScenarioError(f"--data {args.data!r}: a row cannot be used: {exc!r}") from None
    finally:
        progress.clear()
    totals = {name: summary(comparisons) for name, comparisons in by_set.items()}
    print(validation_text(by_set, totals))
    if args.out:
        from ..report.figures import validation_figure

        out = Path(args.out)
        (out / "images").mkdir(parents=True, exist_ok=True)
        validation_figure(by_set).savefig(out / "images" / "validation.png", dpi=110)
        (out / "validation.md").write_text(
            validation_markdown(by_set, totals, calibrations), encoding="utf-8"
        )
        print(f"\n  wrote {args.out}/validation.md and {args.out}/images/validation.png")
    return 0


def _gpus(row: dict[str, str]) -> int:
    """A row's num_gpus (0 when empty), or a one-line error naming it."""
    text = row["num_gpus"] or "0"
    if not text.strip().isdigit():
        raise ScenarioError(f"--data: row {row.get('id')!r} has num_gpus={text!r}, not a count")
    return int(text)
