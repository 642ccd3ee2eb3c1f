"""The files a scenario refers to besides its own TOML: calibration files, custom
schedule files, the validation tables (the calibration sets, the kernel and collective
tables, raw nccl-tests logs) and a search's journal. Each reader turns what
it cannot use into a one-line ScenarioError (this layer and the CLI alone touch files).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import os
import re
import stat
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from stepsim.schedules import LOOPED, V_SHAPE, Step
from stepsim.schedules.custom import check_orders, parse_orders
from stepsim.schedules.torch_csv import looks_like_torch, parse_torch_csv

from . import limits, presets
from .errors import ScenarioError
from .fitted import LATENCIES, NETWORK_PARAMETERS, OVERHEAD, PARAMETERS, MeasuredFit
from .gpu import KERNEL_CONSTANT_RANGES, KernelConstants
from .suggest import did_you_mean


def _known(keys: Iterable[str]) -> str:
    return ", ".join(sorted(keys))


def read_bytes(path: Path, what: str, limit_name: str = "input_bytes") -> bytes:
    """A regular file's bytes, refused before reading when over the size limit. A FIFO,
    device or folder is refused from ``os.stat`` without being opened (a FIFO with no
    writer would block, /dev/zero never ends); the file is then opened non-blocking
    and checked again, so one swapped in between is refused too. ``what`` names the
    file in the one-line ScenarioError."""
    cap = limits.limit(limit_name)
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise ScenarioError(f"{what} is not a regular file (a folder, FIFO or device)")
        limits.check(limit_name, info.st_size, f"{what} holds")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ScenarioError(f"{what} is not a regular file (a folder, FIFO or device)")
            data = f.read(cap + 1)  # a file growing (or /proc's size 0) stops here
    except OSError as exc:
        raise ScenarioError(f"cannot read {what}: {exc.strerror}") from None
    limits.check(limit_name, len(data), f"{what} holds")
    return data


def read_text(path: Path, what: str, limit_name: str = "input_bytes") -> str:
    """`read_bytes` as UTF-8 text; a leading byte-order mark (some editors write one)
    is dropped, as it is not text."""
    try:
        return read_bytes(path, what, limit_name).decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        raise ScenarioError(f"{what} is not UTF-8 text") from None


# A dotted key ``a.b.c`` or a bracket opening a nested array / inline table, outside
# strings and comments. tomllib's cost grows with the square of a dotted key's length
# (it re-walks the key for every prefix) and it recurses once per nesting level, so
# both are measured before it runs, in linear time.
_NOT_IN_A_KEY = re.compile(r"[^A-Za-z0-9_. \t-]+")  # what splits text into dotted-key runs
_BRACKET = re.compile(r"[\[\]{}]")
_STRING_OR_COMMENT = re.compile(
    r'"""(?:[^\\]|\\.)*?"""|\'\'\'.*?\'\'\'|"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'|#[^\n]*',
    re.DOTALL,
)


def toml_depth(text: str) -> int:
    """The deepest nesting of brackets, or the longest dotted key, in TOML text (an
    upper bound: a bracket inside an unterminated string counts too)."""
    bare = _STRING_OR_COMMENT.sub(lambda m: "x" if m.group().startswith(("'", '"')) else "", text)
    depth = deepest = 0
    for char in _BRACKET.findall(bare):
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth = max(depth - 1, 0)
    dots = max(run.count(".") for run in _NOT_IN_A_KEY.split(bare))
    return max(deepest, dots + 1)


def _loads(text: str, what: str) -> dict[str, Any]:
    """tomllib.loads with the depth refused before it runs and tomllib's other failures
    (an integer over Python's 4300 digits, a recursion the check missed) as one-line
    ScenarioErrors; TOMLDecodeError left to the caller."""
    limits.check("toml_depth", toml_depth(text), f"{what} nests")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        raise
    except (ValueError, RecursionError) as exc:
        reason = str(exc).split(";")[0] if isinstance(exc, ValueError) else "nested too deep"
        raise ScenarioError(f"{what}: not valid TOML: {reason}") from None


def parse_toml(text: str, what: str) -> dict[str, Any]:
    """TOML text parsed, or a one-line ScenarioError naming ``what``."""
    try:
        return _loads(text, what)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{what}: not valid TOML: {exc}") from None


def parse_value(text: str, what: str) -> Any:
    """One TOML value (a --set value), or ``text`` itself when it is not TOML (a bare
    word such as gpipe or fair-share)."""
    try:
        return _loads(f"v = {text}", what)["v"]
    except tomllib.TOMLDecodeError:
        return text


def read_toml(path: Path, what: str) -> dict[str, Any]:
    where = f"{what} {str(path)!r}"
    return parse_toml(read_text(path, where), where)


# Calibration files. Kernel constants (benchmarks/measure_kernels.py writes them): a
# [constants] table with KernelConstants' fields; [[gemm]] and [[memory]] rows keep the
# measurements. A fit on measured iterations (`stepsim calibrate --measured`): a [fit]
# table (scenario/fitted.py) and [[measured]] rows, the runs it was fitted on. One file
# may hold both (the fit was then made on top of the file's constants); other tables
# (a later [network] fit from nccl-tests logs, the rows) are evidence the reader skips.
_CALIBRATION_KEYS: dict[str, type] = {
    "gpu": str,
    "num_sms": int,
    "tile_m": int,
    "tile_n": int,
    "gemm_efficiency": float,
    "gemm_k_half": float,
    "memory_efficiency": float,
    "source": str,
}
# the [fit] table's keys besides the parameters (fitted.PARAMETERS' keys, floats)
_FIT_KEYS: dict[str, type] = {
    "gpu": str,
    "node": str,
    "measurements": int,
    "loo_error": float,
    "fit_error": float,
    "freed": list,
    "at_bound": list,
    "collective_logs": int,
    "collective_sizes": int,
    "collective_error": float,
    "collective_loo_error": float,
    "collective_freed": list,
    "collective_at_bound": list,
    "trace_iterations": int,
    "trace_freed": list,
    "trace_at_bound": list,
    "source": str,
}
_FIT_REQUIRED = ("gpu", "node", "measurements", "source")


class CalibrationFile(NamedTuple):
    """What a calibration file holds: kernel constants, a fit on measured iterations,
    or both (either may be None, not both)."""

    constants: KernelConstants | None
    fit: MeasuredFit | None


def _typed(value: Any, wanted: type) -> bool:
    ok = isinstance(value, wanted) or (wanted is float and type(value) is int)
    return ok and not isinstance(value, bool)


def _read_constants(table: Mapping[str, Any], path: Path) -> KernelConstants:
    values: dict[str, Any] = {}
    for key, wanted in _CALIBRATION_KEYS.items():
        if key not in table:
            raise ScenarioError(f"calibration file {str(path)!r}: constants.{key} is missing")
        value = table[key]
        if not _typed(value, wanted):
            raise ScenarioError(
                f"constants.{key}={value!r} must be {wanted.__name__} (in {str(path)!r})"
            )
        low, high = KERNEL_CONSTANT_RANGES.get(key, (None, None))
        if low is not None and not low <= value <= high:
            raise ScenarioError(
                f"constants.{key}={value!r} must be between {low:g} and {high:g} (in {str(path)!r})"
            )
        values[key] = float(value) if wanted is float else value
    unknown = sorted(set(table) - set(_CALIBRATION_KEYS))
    if unknown:
        raise ScenarioError(
            f"unknown key constants.{unknown[0]} in {str(path)!r}; "
            f"known: {_known(_CALIBRATION_KEYS)}"
        )
    if values["gpu"] not in presets.GPUS:
        raise ScenarioError(
            f"constants.gpu={values['gpu']!r} must be one of {_known(presets.GPUS)} "
            f"(in {str(path)!r})"
        )
    return KernelConstants(**values)


def _read_fit(table: Mapping[str, Any], path: Path) -> MeasuredFit:
    """A [fit] table, checked key by key (the parameters' bounds by MeasuredFit)."""
    where = f"(in {str(path)!r})"
    parameters = {p.key: name for name, p in PARAMETERS.items()}
    latencies = {la.key for la in LATENCIES.values()}
    known = {**_FIT_KEYS, **dict.fromkeys(parameters, float), **dict.fromkeys(latencies, float)}
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise ScenarioError(f"unknown key fit.{unknown[0]} {where}; known: {_known(known)}")
    for key in _FIT_REQUIRED:
        if key not in table:
            raise ScenarioError(f"calibration file {str(path)!r}: fit.{key} is missing")
    values: dict[str, Any] = {}
    for key, value in table.items():
        wanted = known[key]
        if not _typed(value, wanted):
            raise ScenarioError(f"fit.{key}={value!r} must be {wanted.__name__} {where}")
        if wanted is list:
            names = NETWORK_PARAMETERS if key.startswith("collective_") else PARAMETERS
            if not all(isinstance(v, str) and v in names for v in value):
                raise ScenarioError(
                    f"fit.{key}={value!r} must list parameters of {_known(names)} {where}"
                )
            value = tuple(value)
        elif wanted is float:
            value = float(value)
            errors = ("loo_error", "fit_error", "collective_error", "collective_loo_error")
            if not math.isfinite(value) or (key in errors and value < 0):
                raise ScenarioError(f"fit.{key}={value!r} must be a finite number >= 0 {where}")
        elif wanted is int and value < 0:
            raise ScenarioError(f"fit.{key}={value!r} must be >= 0 {where}")
        name = parameters.get(key)
        values["overhead_s" if name == OVERHEAD else name or key] = value
    evidence = values.get("collective_sizes", 0) + values.get("trace_iterations", 0)
    if values["measurements"] + evidence < 1:
        raise ScenarioError(
            f"fit.measurements={values['measurements']!r} and fit.collective_sizes="
            f"{values.get('collective_sizes', 0)!r}: a fit rests on one measurement at least "
            f"{where}"
        )
    if values["gpu"] not in presets.GPUS:
        raise ScenarioError(
            f"fit.gpu={values['gpu']!r} must be one of {_known(presets.GPUS)} {where}"
        )
    try:
        return MeasuredFit(**values, file=str(path))
    except ScenarioError as exc:
        raise ScenarioError(f"{exc} {where}", key=exc.key, value=exc.value, rule=exc.rule) from None


def read_calibration_file(path: str | Path) -> CalibrationFile:
    """A calibration file's kernel constants ([constants]) and fit on measured
    iterations ([fit]), each checked key by key; one of them at least."""
    path = Path(path)
    raw = read_toml(path, "calibration file")
    constants, fit = raw.get("constants"), raw.get("fit")
    for name, table in (("constants", constants), ("fit", fit)):
        if table is not None and not isinstance(table, Mapping):
            raise ScenarioError(f"calibration file {str(path)!r}: {name} must be a [{name}] table")
    if constants is None and fit is None:
        raise ScenarioError(
            f"calibration file {str(path)!r} needs a [constants] table (kernel constants: "
            "benchmarks/measure_kernels.py) or a [fit] table (stepsim calibrate --measured)"
        )
    return CalibrationFile(
        _read_constants(constants, path) if constants is not None else None,
        _read_fit(fit, path) if fit is not None else None,
    )


def read_calibration(path: str | Path) -> KernelConstants:
    """A calibration file's kernel constants, checked key by key."""
    path = Path(path)
    raw = read_toml(path, "calibration file")
    table = raw.get("constants")
    if not isinstance(table, Mapping):
        raise ScenarioError(f"calibration file {str(path)!r} needs a [constants] table")
    return _read_constants(table, path)


def _toml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_scalar(v) for v in value) + "]"
    return json.dumps(str(value), ensure_ascii=False).replace("\x7f", "\\u007f")


def dumps_calibration(
    fit: MeasuredFit,
    rows: Sequence[Mapping[str, Any]],
    constants: KernelConstants | None = None,
    notes: Sequence[str] = (),
    collective_rows: Sequence[Mapping[str, Any]] = (),
) -> str:
    """A calibration file's text: ``notes`` as comments, the kernel constants the fit was
    made on top of (if any), the [fit] table (each parameter with a comment saying what
    it scales and its bounds), one [[measured]] table per run and one [[collective]]
    table per nccl-tests size; what `read_calibration_file` reads back (it reads the
    [fit] and [constants]; the rows are the record)."""
    lines = [f"# {note}" if note else "#" for note in notes]
    if constants is not None:
        lines += ["", "[constants]"]
        lines += [f"{k} = {_toml_scalar(getattr(constants, k))}" for k in _CALIBRATION_KEYS]
    lines += ["", "[fit]"]
    head = {
        "gpu": fit.gpu,
        "node": fit.node,
        "measurements": fit.measurements,
        "loo_error": fit.loo_error,
        "fit_error": fit.fit_error,
        "freed": list(fit.freed),
        "at_bound": list(fit.at_bound),
        "collective_logs": fit.collective_logs,
        "collective_sizes": fit.collective_sizes,
        "collective_error": fit.collective_error,
        "collective_loo_error": fit.collective_loo_error,
        "collective_freed": list(fit.collective_freed),
        "collective_at_bound": list(fit.collective_at_bound),
        "trace_iterations": fit.trace_iterations,
        "trace_freed": list(fit.trace_freed),
        "trace_at_bound": list(fit.trace_at_bound),
        "source": fit.source,
    }
    lines += [f"{k} = {_toml_scalar(v)}" for k, v in head.items() if v is not None]
    if fit.measurements and fit.loo_error is None:
        lines.append("# loo_error: not available, one measured run (nothing to leave out)")
    if fit.collective_logs == 1:
        lines.append("# collective_loo_error: not available, one nccl-tests log")
    for name, p in PARAMETERS.items():
        unit = "seconds" if p.seconds else "multiplier, 1 = built-in"
        lines.append(f"# {p.mechanism}: {unit}, scales {p.scales}, bounds {p.low:g}..{p.high:g}")
        lines.append(f"{p.key} = {_toml_scalar(fit.value(name))}")
    for name, la in LATENCIES.items():
        value = fit.latency_us(name)
        bounds = f"bounds {la.low_us:g}..{la.high_us:g}"
        if value is None:
            lines.append(f"# {la.key}: not fitted ({la.replaces} as the scenario sets it)")
        else:
            lines.append(f"# {la.mechanism}: microseconds, replaces {la.replaces}, {bounds}")
            lines.append(f"{la.key} = {_toml_scalar(value)}")
    for table, items in (("measured", rows), ("collective", collective_rows)):
        for row in items:
            lines += ["", f"[[{table}]]"]
            lines += [f"{k} = {_toml_scalar(v)}" for k, v in row.items() if v is not None]
    return "\n".join(lines) + "\n"


# A CSV of measured iteration times (`stepsim calibrate --measured`): a header line, then
# one row per run; lines starting with # are comments.
MEASURED_COLUMNS = {
    "scenario": "a scenario file (relative to the CSV's folder, or the working folder) or a "
    "shipped scenario's name",
    "overrides": "optional: section.key=value items separated by ';' (as --set takes them)",
    "measured_iteration_s": "the measured time of one iteration in seconds (> 0)",
    "id": "optional: the run's name in the tables",
    "note": "optional: free text, not read",
}
_MEASURED_REQUIRED = ("scenario", "measured_iteration_s")
_OVERRIDE = re.compile(r"\s*[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*\s*=.+", re.DOTALL)
MAX_MEASURED_S = 1e6  # an iteration longer than 11 days is a unit mistake


class MeasuredRun(NamedTuple):
    """One row of a measured-iterations CSV, as written (its scenario not yet read)."""

    line: int
    id: str
    scenario: str
    overrides: tuple[str, ...]
    measured_iteration_s: float


def read_measured_runs(path: str | Path) -> list[MeasuredRun]:
    """The rows of a measured-iterations CSV (MEASURED_COLUMNS). What cannot be used is
    a one-line ScenarioError naming the file, the line, the column and the rule."""
    path = Path(path)
    name = str(path)
    text = read_text(path, f"measured runs {name!r}")
    reader = csv.reader(io.StringIO(text, newline=""))
    header: list[str] | None = None
    runs: list[MeasuredRun] = []
    line = 0
    try:
        for cells in reader:
            first = line + 1  # the line the record starts on
            line = reader.line_num
            if not any(c.strip() for c in cells) or cells[0].lstrip().startswith("#"):
                continue

            def bad(column: str, rule: str, at: int = first) -> ScenarioError:
                return ScenarioError(f"{name} line {at}, column {column!r}: {rule}")

            if header is None:
                header = [c.strip() for c in cells]
                for column in header:
                    if column not in MEASURED_COLUMNS:
                        raise bad(
                            column,
                            f"unknown column; known: {', '.join(MEASURED_COLUMNS)}"
                            + (
                                f" ({did_you_mean(column, MEASURED_COLUMNS)})"
                                if did_you_mean(column, MEASURED_COLUMNS)
                                else ""
                            ),
                        )
                    if header.count(column) > 1:
                        raise bad(column, "the column is named twice")
                for column in _MEASURED_REQUIRED:
                    if column not in header:
                        raise bad(
                            column,
                            f"missing column; the header needs {', '.join(_MEASURED_REQUIRED)}",
                        )
                continue
            if len(cells) > len(header):
                raise bad(
                    f"#{len(header) + 1}",
                    f"{len(cells)} cells where the header has {len(header)} columns "
                    "(quote a value holding a comma)",
                )
            row = {
                column: (cells[i].strip() if i < len(cells) else "")
                for i, column in enumerate(header)
            }
            for column in _MEASURED_REQUIRED:
                if not row[column]:
                    raise bad(column, "is empty")
            written = row["measured_iteration_s"]
            try:
                seconds = float(written)
            except ValueError:
                seconds = math.nan
            if not (math.isfinite(seconds) and 0 < seconds <= MAX_MEASURED_S):
                raise bad(
                    "measured_iteration_s",
                    f"{written!r} must be a number of seconds > 0 and at most {MAX_MEASURED_S:g}",
                )
            overrides = tuple(o.strip() for o in row.get("overrides", "").split(";") if o.strip())
            for item in overrides:
                if not _OVERRIDE.fullmatch(item):
                    raise bad(
                        "overrides",
                        f"{item[:60]!r} must be section.key=value (items separated by ';')",
                    )
            label = row.get("id") or f"line {first}"
            runs.append(MeasuredRun(first, label, row["scenario"], overrides, seconds))
    except csv.Error as exc:
        raise ScenarioError(f"{name} line {reader.line_num}: not valid CSV: {exc}") from None
    if header is None or not runs:
        raise ScenarioError(
            f"{name} holds no measurements: a header line ({', '.join(_MEASURED_REQUIRED)}, "
            "optionally overrides, id, note), then one row per measured run"
        )
    seen: dict[str, int] = {}
    for run in runs:
        if run.id in seen:
            raise ScenarioError(
                f"{name} line {run.line}, column 'id': {run.id!r} names line {seen[run.id]} too"
            )
        seen[run.id] = run.line
    return runs


def read_schedule_file(
    path: Path, name: str, placement: str | None
) -> tuple[list[list[Step]], str]:
    """Per-rank op orders from a file, checked (schedules.custom), and their placement;
    ``name`` is how the one-line ScenarioError refers to the file (the key or the CLI
    flag). The file is stepsim's labels (``F3 B3 W3``, placement as given, else looped)
    or torch.distributed.pipelining's action CSV (``0F3,0I3,0W3``; schedules.torch_csv),
    whose stage numbers fix the placement (a ``placement`` given must agree)."""
    text = read_text(path, name)
    try:
        if looks_like_torch(text):
            orders, found = parse_torch_csv(text)
            if placement is not None and placement != found:
                raise ValueError(
                    f"its stages sit in a {'V' if found == V_SHAPE else 'looped'} placement, "
                    f"not {placement!r} (leave the placement out or give {found!r})"
                )
            placement = found
        else:
            orders = parse_orders(text)
            placement = placement or LOOPED
        check_orders(orders, placement)
    except ValueError as exc:
        raise ScenarioError(f"{name}: {exc}") from None
    return orders, placement


def read_shares_file(path: Path, name: str) -> tuple[float, ...]:
    """The experts' token shares, one number per line in expert order (blank lines and
    # comments skipped), as they are written; the model's rules check and normalize them.
    ``name`` is how the one-line ScenarioError refers to the file."""
    shares = []
    for number, line in enumerate(read_text(path, name).splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            share = float(text)
        except ValueError:
            raise ScenarioError(
                f"{name}: line {number} is not a number (one share per line)"
            ) from None
        if not math.isfinite(share) or share < 0:
            raise ScenarioError(f"{name}: line {number} must be a share >= 0")
        shares.append(share)
    return tuple(shares)


# --- the validation set -----------------------------------------------------------------

VALIDATION_FILES = {
    "megatron": "megatron_2021_table1.csv",
    "layers": "korthikanti_2022_table4_layer.csv",
    "dgx2": "megatron_2020_dgx2_v100.csv",
    "h100": "megatron_core_2024_h100.csv",
}


# The columns each table needs (its free-text citation and notes may be left out).
_MODEL_COLUMNS = (
    "id",
    "model",
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "seq_length",
    "vocab_size",
    "ffn_hidden_size",
    "gpu",
)
_LAYOUT_COLUMNS = (
    "tensor_parallel",
    "pipeline_parallel",
    "data_parallel",
    "global_batch_size",
    "micro_batch_size",
)
VALIDATION_COLUMNS = {
    "megatron": (
        *_MODEL_COLUMNS,
        "num_gpus",
        "gpus_per_node",
        *_LAYOUT_COLUMNS,
        "schedule",
        "recompute",
        "measured_tflops_per_gpu",
    ),
    "layers": (
        "id",
        "model",
        "hidden_size",
        "num_attention_heads",
        "seq_length",
        "micro_batch_size",
        "gpu",
        "tensor_parallel",
        "sequence_parallel",
        "recompute",
        "forward_ms",
        "backward_ms",
        "total_ms",
    ),
    "dgx2": (
        *_MODEL_COLUMNS,
        "node",
        "num_gpus",
        *_LAYOUT_COLUMNS,
        "measured_iteration_ms",
        "measured_tflops_per_gpu",
    ),
    "h100": (
        *_MODEL_COLUMNS,
        "num_gpus",
        "gpus_per_node",
        *_LAYOUT_COLUMNS,
        "recompute",
        "measured_metric",
        "measured_value",
    ),
}


def read_validation_set(folder: str | Path) -> dict[str, list[dict[str, str]]]:
    """The calibration tables (scenarios/validation/) as rows of strings, by table."""
    folder = Path(folder)
    out = {}
    for table, name in VALIDATION_FILES.items():
        path = folder / name
        what = f"validation table {str(path)!r}"
        reader = csv.DictReader(io.StringIO(read_text(path, what), newline=""))
        try:
            out[table] = list(reader)
        except csv.Error as exc:
            raise ScenarioError(f"{what}: not a CSV table: {exc}") from None
        missing = [c for c in VALIDATION_COLUMNS[table] if c not in (reader.fieldnames or ())]
        if missing:
            raise ScenarioError(
                f"{what} has no column {missing[0]!r}; "
                f"it needs {', '.join(VALIDATION_COLUMNS[table])}"
            )
    return out


# --- the kernel tables (scenarios/validation/kernels/, README.md there cites each) ---------

# table -> (file, its columns that must hold a number > 0, those that may also be empty).
# Every table has an ``id`` column; the rest of a table's columns are text.
KERNEL_FILES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "xla_matmul": (
        "xla_matmul_sm90_b200.csv",
        ("b", "m", "n", "k", "tflops_bf16x_bf16_to_bf16"),
        ("tflops_f8e4m3fnx_f8e4m3fn_to_bf16",),
    ),
    "cudnn_sdpa": (
        "cudnn_sdpa_training.csv",
        (
            "batch",
            "q_seqlen",
            "kv_seqlen",
            "num_q_heads",
            "num_kv_heads",
            "head_dim_qk",
            "head_dim_vo",
            "time_ms",
            "tflops",
        ),
        (),
    ),
    "cudnn_sdpa_913": (
        "cudnn_sdpa_b200_gb300_cudnn913.csv",
        (
            "batch",
            "q_seqlen",
            "kv_seqlen",
            "num_q_heads",
            "num_kv_heads",
            "head_dim",
            "fwd_tflops",
            "bwd_tflops",
        ),
        (),
    ),
    "fa3_fig5": (
        "fa3_h100_fwd_fig5.csv",
        ("head_dim", "n_heads", "seqlen", "batch", "tflops"),
        (),
    ),
    "fa2_fwdbwd": (
        "fa2_h100_fwdbwd.csv",
        ("head_dim", "n_heads", "seqlen", "batch", "tflops"),
        (),
    ),
    "fa3_bwd_secondary": (
        "fa3_h100_bwd_SECONDARY.csv",
        ("head_dim", "seqlen_nominal", "tflops"),
        (),
    ),
    "cudnn_norms": (
        "cudnn_norms.csv",
        ("N_rows", "C_hidden", "fwd_GBps", "bwd_GBps"),
        (),
    ),
    "deepgemm_fp8": ("deepgemm_h800_fp8_dense.csv", ("M", "N", "K", "tflops"), ()),
    "azure_cublaslt_fp8": ("azure_cublaslt_fp8.csv", ("m", "n", "k", "tflops"), ()),
    "azure_hbm": ("azure_hbm_stream.csv", ("value",), ()),
}
# the text columns each table's comparison reads (stepsim.calibration.kernels)
KERNEL_TEXT_COLUMNS: dict[str, tuple[str, ...]] = {
    "xla_matmul": ("platform_key",),
    "cudnn_sdpa": ("gpu", "model", "mask", "pass", "deterministic_bwd"),
    "cudnn_sdpa_913": ("gpu", "impl", "is_causal"),
    "fa3_fig5": ("causal", "impl", "note"),
    "fa2_fwdbwd": ("causal", "impl"),
    "fa3_bwd_secondary": ("causal_inferred", "impl"),
    "cudnn_norms": ("gpu", "config", "norm_type", "has_bias"),
    "deepgemm_fp8": ("readme_version",),
    "azure_cublaslt_fp8": ("gpu", "dtype"),
    "azure_hbm": ("gpu", "metric", "unit"),
}


def _checked_rows(
    path: Path,
    what: str,
    numbers: Sequence[str],
    optional: Sequence[str],
    text_columns: Sequence[str],
) -> list[dict[str, str]]:
    """A CSV table's rows of strings, each numeric cell checked: a one-line ScenarioError
    names the file, the row (its line and id) and the column of the first that is not a
    number > 0 (or empty, where ``optional`` allows). Every table has an ``id`` column."""
    reader = csv.DictReader(io.StringIO(read_text(path, what), newline=""))
    try:
        rows = list(reader)
    except csv.Error as exc:
        raise ScenarioError(f"{what}: not a CSV table: {exc}") from None
    needed = ("id", *numbers, *optional, *text_columns)
    missing = [c for c in needed if c not in (reader.fieldnames or ())]
    if missing:
        raise ScenarioError(f"{what} has no column {missing[0]!r}; it needs {', '.join(needed)}")
    for line, row in enumerate(rows, 2):
        if None in row or any(v is None for v in row.values()):
            raise ScenarioError(
                f"{what}, line {line}: {len(reader.fieldnames or ())} columns expected"
            )
        for column in (*numbers, *optional):
            text = row[column].strip()
            if not text and column in optional:
                continue
            try:
                value = float(text)
            except ValueError:
                value = math.nan
            if not (math.isfinite(value) and value > 0):
                raise ScenarioError(
                    f"{what}, line {line} (id {row['id']!r}), column {column!r}: "
                    f"{row[column]!r} must be a number > 0"
                )
    return rows


def read_kernel_tables(folder: str | Path) -> dict[str, list[dict[str, str]]]:
    """The kernel micro-benchmark tables (scenarios/validation/kernels/) as rows of
    strings, by table, each numeric cell checked: a one-line ScenarioError names the
    file, the row (its line and id) and the column of the first that is not a number
    > 0 (or empty, where the table allows)."""
    folder = Path(folder)
    out = {}
    for table, (name, numbers, optional) in KERNEL_FILES.items():
        path = folder / name
        what = f"kernel table {str(path)!r}"
        out[table] = _checked_rows(path, what, numbers, optional, KERNEL_TEXT_COLUMNS[table])
    return out


# --- the collective tables (scenarios/validation/collectives/, README.md there cites each) --

# table -> (file, its columns that must hold a number > 0, those that may also be empty);
# as the kernel tables, every table has an ``id`` column and its other columns are text
COLLECTIVE_FILES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "xla_collectives": (
        "xla_collectives.csv",
        ("num_groups", "devices_per_group", "tensor_size_bytes", "algbw_GBps"),
        (),
    ),
    "azure_nccl": (
        "azure_nccl_allreduce_busbw.csv",
        ("size_bytes_inferred", "busbw_GBps_inplace"),
        (),
    ),
    "mlengineering": (
        "mlengineering_allreduce_busbw.csv",
        ("nodes", "gpus", "payload_bytes", "busbw_GBps"),
        ("algbw_GBps",),
    ),
}
# the text columns each table's comparison reads (stepsim.calibration.collectives)
COLLECTIVE_TEXT_COLUMNS: dict[str, tuple[str, ...]] = {
    "xla_collectives": ("platform_key", "opcode", "replica_groups_iota"),
    "azure_nccl": ("vm", "gpu", "nccl_algo"),
    "mlengineering": ("table", "system", "tool"),
}
# raw nccl-tests output, verbatim (nccl_logs/): log -> file
NCCL_LOGS: dict[str, str] = {
    "nccl_h100_a3mega": "nccl_logs/h100_2node_16gpu_all_reduce_a3mega.txt",
    "nccl_b200_gke_a4": "nccl_logs/b200_2node_16gpu_all_gather_gke_a4.txt",
}
# the columns of an nccl-tests data line: out-of-place, then in-place
NCCL_TESTS_COLUMNS = (
    "size",
    "count",
    "type",
    "redop",
    "root",
    "time",
    "algbw",
    "busbw",
    "#wrong",
    "time (in-place)",
    "algbw (in-place)",
    "busbw (in-place)",
    "#wrong (in-place)",
)
_NCCL_POSITIVE = ("size", "count", "time", "time (in-place)")
_NCCL_NOT_NEGATIVE = ("algbw", "busbw", "algbw (in-place)", "busbw (in-place)")
_NCCL_RANK = re.compile(
    r"#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)"
    r"(?:\s+\[[^\]]*\])?\s*(.*)"
)
# the nccl-tests binaries, as a log may name them (an echoed command line)
NCCL_TESTS_BINARIES = (
    "all_reduce_perf",
    "all_gather_perf",
    "reduce_scatter_perf",
    "alltoall_perf",
    "sendrecv_perf",
)
_NCCL_BINARY = re.compile(r"\b(" + "|".join(NCCL_TESTS_BINARIES) + r")\b")


class NcclTestsLog(NamedTuple):
    """An nccl-tests run as it printed itself: its ranks (``hosts``: each rank's host, in
    rank order), the NCCL version where printed ("" if not) and its data lines, each a
    dict of `NCCL_TESTS_COLUMNS` to the printed strings plus ``line`` (its line number)."""

    hosts: tuple[str, ...]
    nccl_version: str
    rows: list[dict[str, str]]
    devices: tuple[int, ...] = ()  # each rank's device index on its host
    device_names: tuple[str, ...] = ()  # each rank's GPU as printed ("NVIDIA H100 80GB HBM3")
    binaries: tuple[str, ...] = ()  # the nccl-tests binaries the log names (NCCL_TESTS_BINARIES)


def parse_nccl_tests(text: str, what: str) -> NcclTestsLog:
    """nccl-tests output (`all_reduce_perf`, `all_gather_perf`, ...): the "# Rank ..."
    lines and the data lines; comment lines and others are skipped. A data line (it
    starts with a number) that is not 13 fields with a size, count and time > 0 and
    bandwidths >= 0 is a one-line ScenarioError naming the file, line and column. A log
    without rank lines has no hosts (the caller says where its ranks ran); rank lines
    that do not number 0 to N-1 are an error."""
    hosts: dict[int, tuple[str, int, str]] = {}
    version = ""
    rows = []
    binaries: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        rank = _NCCL_RANK.match(stripped)
        if rank:
            hosts[int(rank.group(1))] = (rank.group(2), int(rank.group(3)), rank.group(4).strip())
            continue
        binaries += _NCCL_BINARY.findall(stripped)
        if stripped.startswith("NCCL version"):
            version = stripped.removeprefix("NCCL version").strip()
            continue
        fields = stripped.split()
        if not fields or not fields[0].isdigit():
            continue
        if len(fields) != len(NCCL_TESTS_COLUMNS):
            raise ScenarioError(
                f"{what}, line {number}: {len(NCCL_TESTS_COLUMNS)} fields expected "
                f"({' '.join(NCCL_TESTS_COLUMNS[:9])} ...), found {len(fields)}"
            )
        row = dict(zip(NCCL_TESTS_COLUMNS, fields, strict=True))
        for column in (*_NCCL_POSITIVE, *_NCCL_NOT_NEGATIVE):
            try:
                value = float(row[column])
            except ValueError:
                value = math.nan
            positive = column in _NCCL_POSITIVE
            if not (math.isfinite(value) and (value > 0 if positive else value >= 0)):
                raise ScenarioError(
                    f"{what}, line {number}, column {column!r}: {row[column]!r} must be a "
                    f"number {'> 0' if positive else '>= 0'}"
                )
        rows.append({**row, "line": str(number)})
    if not rows:
        raise ScenarioError(f"{what} holds no nccl-tests data line")
    if sorted(hosts) != list(range(len(hosts))):
        raise ScenarioError(f"{what}: its '# Rank N ... on HOST' lines do not number 0 to N-1")
    ranks = [hosts[r] for r in sorted(hosts)]
    return NcclTestsLog(
        tuple(h for h, _, _ in ranks),
        version,
        rows,
        tuple(d for _, d, _ in ranks),
        tuple(n for _, _, n in ranks),
        tuple(dict.fromkeys(binaries)),
    )


def read_nccl_tests_log(path: str | Path) -> NcclTestsLog:
    """A user's nccl-tests log (`stepsim calibrate --nccl-tests`), parsed."""
    what = f"nccl-tests log {str(path)!r}"
    return parse_nccl_tests(read_text(Path(path), what), what)


def read_profiler_trace(path: str | Path) -> dict[str, Any]:
    """A PyTorch profiler (Kineto / Chrome) trace, ``.json`` or ``.json.gz``, parsed: a
    JSON object with a ``traceEvents`` list. Over the trace_bytes limit (decompressed,
    counted as it is read), not gzip or JSON, or not such an object is a one-line
    ScenarioError (a JSON error names its line and column)."""
    path = Path(path)
    what = f"profiler trace {str(path)!r}"
    cap = limits.limit("trace_bytes")
    raw = read_bytes(path, what, "trace_bytes")
    if raw[:2] == b"\x1f\x8b":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as stream:
                raw = stream.read(cap + 1)
        except (OSError, EOFError) as exc:
            raise ScenarioError(f"{what} is not a readable gzip file ({exc})") from None
        limits.check("trace_bytes", len(raw), f"{what} holds, decompressed,")
    try:
        document = json.loads(raw.decode("utf-8").removeprefix("\ufeff"))
    except UnicodeDecodeError:
        raise ScenarioError(f"{what} is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ScenarioError(
            f"{what}, line {exc.lineno}, column {exc.colno}: not JSON ({exc.msg})"
        ) from None
    except RecursionError:
        raise ScenarioError(f"{what}: JSON nested too deep") from None
    if not isinstance(document, dict) or not isinstance(document.get("traceEvents"), list):
        raise ScenarioError(
            f"{what} is not a profiler trace: a JSON object with a traceEvents list "
            "(torch.profiler's export_chrome_trace writes one)"
        )
    return document


def read_collective_tables(
    folder: str | Path,
) -> tuple[dict[str, list[dict[str, str]]], dict[str, NcclTestsLog]]:
    """The collective measurements (scenarios/validation/collectives/): the CSV tables as
    rows of strings by table, checked as `read_kernel_tables` checks its own, and the
    nccl-tests logs parsed (`parse_nccl_tests`); a one-line ScenarioError names the file,
    the line and the column of the first cell that cannot be used."""
    folder = Path(folder)
    tables = {}
    for table, (name, numbers, optional) in COLLECTIVE_FILES.items():
        path = folder / name
        what = f"collective table {str(path)!r}"
        tables[table] = _checked_rows(path, what, numbers, optional, COLLECTIVE_TEXT_COLUMNS[table])
    logs = {}
    for log, name in NCCL_LOGS.items():
        path = folder / name
        logs[log] = parse_nccl_tests(
            read_text(path, f"nccl-tests log {str(path)!r}"), f"nccl-tests log {str(path)!r}"
        )
    return tables, logs


def shipped_dir() -> Path:
    """Where the shipped scenarios and calibration sets lie: the checkout's scenarios/
    in an editable install, the installed package's data from a wheel."""
    from importlib.resources import files

    return Path(str(files("stepsim.scenarios")))


def shipped_scenarios() -> dict[str, Path]:
    """Shipped scenario files by name (the file name without .toml), sorted."""
    return {p.stem: p for p in sorted(shipped_dir().glob("*.toml"))}


def scenario_path(text: str | Path) -> Path:
    """The scenario file SCENARIO names: a path, or else the name of a shipped scenario
    (`stepsim run tiny-2gpu`); a one-line error naming both when it is neither."""
    path = Path(text)
    if path.exists():
        return path
    shipped = shipped_scenarios()
    if str(text) in shipped:  # before the suffix test: "llama3.1-405b-..." has a dot
        return shipped[str(text)]
    if path.stem in shipped and path.suffix in ("", ".toml"):
        # a README's path-style example run outside the checkout
        raise ScenarioError(
            f"no scenario file {str(text)!r}; a shipped scenario has that name: give it "
            f"without the path ({path.stem!r}, e.g. `stepsim run {path.stem}`) from anywhere"
        )
    if path.suffix or len(path.parts) > 1:
        return path
    raise ScenarioError(
        f"no scenario file {str(text)!r} and no shipped scenario of that name (shipped: "
        f"{', '.join(shipped)}; `stepsim list` shows them)"
    )
