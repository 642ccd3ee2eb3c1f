"""`stepsim list`: the scenarios stepsim ships and the presets a scenario can name."""

from __future__ import annotations

import argparse
import re

from stepsim.schedules import SCHEDULES

from ..ir.results import SCHEMA_VERSION
from ..scenario import shipped_scenarios
from ..scenario.presets import GPUS, MODELS, NODES
from .common import json_argument, print_json, quiet_argument


def add_command(sub) -> None:
    listing = sub.add_parser(
        "list",
        help="the shipped scenarios (run one by name) and the GPU, node and model presets",
        description="List the scenarios stepsim ships (`stepsim run NAME` runs one), the GPU, "
        "node and model presets a scenario can name, and the pipeline schedules.",
    )
    json_argument(listing)
    quiet_argument(listing, "accepted as every command takes it (list shows no progress line)")
    listing.set_defaults(handler=command)


def first_comment(text: str, width: int | None = 90) -> str:
    """What a scenario file is: the first sentence of its leading comment, shortened to
    ``width`` characters (None: whole)."""
    words = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        words += line.lstrip("#").split()
    text = " ".join(words)
    ends = [m.start() for m in re.finditer(r"(?<!\bal)\. [A-Z]", text)]
    sentence = (text[: ends[0]] if ends else text).rstrip(".")
    if width is None or len(sentence) <= width:
        return sentence
    return sentence[: width - 3].rstrip() + "..."


def _gpu_text(gpu) -> str:
    """Dense peak per precision (TFLOP/s), memory, and where the constants came from."""
    peaks = [f"{gpu.peak_tflops:g} TFLOP/s BF16/FP16"]
    for precision, peak in (("FP8", gpu.peak_tflops_fp8), ("FP4", gpu.peak_tflops_fp4)):
        if peak is not None:
            peaks.append(f"{peak:g} {precision}")
    return f"{', '.join(peaks)}, {gpu.memory_gib:g} GiB; {gpu.kernels.source}"


def command(args: argparse.Namespace) -> int:
    scenarios = {
        name: first_comment(path.read_text(encoding="utf-8"))
        for name, path in shipped_scenarios().items()
    }
    gpus = {name: _gpu_text(gpu) for name, gpu in GPUS.items()}
    nodes = {
        name: f"{node['gpus_per_node']} x {node['gpu']}, {node['nics_per_node']} x "
        f"{node['nic_gbps']:g} Gb/s"
        for name, node in NODES.items()
    }
    models = {
        name: f"{m['num_layers']} layers, hidden {m['hidden_size']}, "
        f"{m['num_attention_heads']} heads"
        + (f" in {m['num_query_groups']} K/V groups" if "num_query_groups" in m else "")
        + (", SwiGLU" if m.get("swiglu") else "")
        + f", seq {m['seq_length']}"
        for name, m in MODELS.items()
    }
    sections = {
        "scenarios": scenarios,
        "gpus": gpus,
        "nodes": nodes,
        "models": models,
        "schedules": {name: "" for name in SCHEDULES},
    }
    if args.json:
        print_json({"schema_version": SCHEMA_VERSION, "command": "list", **sections})
        return 0
    heads = {
        "scenarios": "shipped scenarios (stepsim run NAME)",
        "gpus": "GPU presets ([cluster] gpu)",
        "nodes": "node presets ([cluster] node)",
        "models": "model presets ([model] preset)",
        "schedules": "pipeline schedules ([training] schedule)",
    }
    lines: list[str | None] = []
    for key, entries in sections.items():
        lines += ["" if lines else None, f"{heads[key]}:"]
        width = max(map(len, entries), default=0)
        lines += [f"  {name:<{width}}  {what}".rstrip() for name, what in entries.items()]
    print("\n".join(line for line in lines if line is not None))
    return 0
