"""Per-rank action lists in torch.distributed.pipelining's CSV, read and written.

PyTorch's pipeline schedules keep, per rank, a list of actions and dump or load it
as a CSV with one row per rank (`PipelineScheduleMulti._dump_csv` / `_load_csv`,
torch/distributed/pipelining/schedules.py). An action is written
``{stage}{type}{micro-batch}``: ``2F0`` a forward of micro-batch 0 on (global) stage
2, ``I`` the input-gradient half of a split backward, ``W`` its weight gradient,
``B`` a full backward; ``SEND_F``, ``RECV_F``, ``SEND_B``, ``RECV_B``, ``UNSHARD``,
``RESHARD`` and ``REDUCE_GRAD`` are communication and sharding actions (the
``compute_comms`` format); ``(0F3;5B1)OVERLAP_F_B`` runs a forward and a backward of
two micro-batches overlapped. An empty cell is an idle step.

stepsim's orders map onto them one to one: its F, B and W are torch's F, I and W; a B
whose W the order does not hold is a full backward, torch's B (every B of an order
without W's, and DualPipeV's full backwards among split ones); an F followed by a B
marked overlapped (`pipeline.overlapped`, the ``F3.0&B1.1`` label) is torch's
``(sF3;s'B1)OVERLAP_F_B``. Its (rank, chunk) is torch's stage through the placement
(looped: stage k p + r; V: stages r and 2p-1-r), read back from which stages each rank
holds. The communication and sharding actions are skipped on reading, as stepsim
derives its sends, receives and gathers from the order itself. DualPipe's two model
copies (the `dual` placement) have no torch schedule and are not written.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence

from .pipeline import DUAL, LOOPED, V_SHAPE, Step, holder_of, overlapped, stage_of

_ACTION = re.compile(
    r"^(\d+)(F|I|B|W|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*)$"
)
_OVERLAP = re.compile(r"^\((.*)\)OVERLAP_F_B$")
COMPUTE = ("F", "I", "B", "W")


def looks_like_torch(text: str) -> bool:
    """Whether the text's first cell is a torch action (``0F0``) rather than an
    stepsim label (``F0``)."""
    for row in csv.reader(io.StringIO(text)):
        for cell in row:
            cell = cell.strip()
            if cell and not cell.startswith("#"):
                return cell[0].isdigit() or cell.startswith("(")
    return False


def _actions(cell: str, where: str) -> list[tuple[int, str, int, bool]]:
    """The compute actions in one cell, as (stage, type, micro-batch, overlapped with
    the one before)."""
    cell = cell.strip().strip('"')
    if not cell:
        return []
    overlap = _OVERLAP.match(cell)
    if overlap:
        parts = [a for part in overlap.group(1).split(";") for a in _actions(part, where)]
        kinds = [kind for _, kind, _, _ in parts]
        if len(parts) != 2 or kinds[0] != "F" or kinds[1] not in ("B", "I"):
            raise ValueError(f"{where}: an overlap of other than one forward and one backward")
        (stage_a, kind_a, mb_a, _), (stage_b, kind_b, mb_b, _) = parts
        return [(stage_a, kind_a, mb_a, False), (stage_b, kind_b, mb_b, True)]
    match = _ACTION.match(cell)
    if not match:
        raise ValueError(
            f"{where}: not a torch.distributed.pipelining action like 2F0, "
            "1I3, 0W1, 3SEND_F2 or (0F3;5B1)OVERLAP_F_B"
        )
    stage, kind, mb = match.groups()
    if kind not in COMPUTE:
        return []
    if not mb:
        raise ValueError(f"{where}: an action that names no micro-batch")
    return [(int(stage), kind, int(mb), False)]


def parse_torch_csv(text: str) -> tuple[list[list[Step]], str]:
    """Per-rank orders and their placement from a torch pipeline-order CSV; ValueError
    (one line) when a cell is not an action or the stages fit no placement."""
    rows: list[list[tuple[int, str, int, bool]]] = []
    for number, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if row and row[0].strip().startswith("#"):
            continue
        actions = [
            a for i, cell in enumerate(row) for a in _actions(cell, f"row {number}, cell {i + 1}")
        ]
        if actions:
            rows.append(actions)
    if not rows:
        raise ValueError("no actions found: write one row per rank, e.g. '0F0,0F1,0I0,0W0'")
    p = len(rows)
    stages = {rank: sorted({action[0] for action in row}) for rank, row in enumerate(rows)}
    every = set().union(*stages.values())
    num_stages = 1 + max(every)
    if len(every) < num_stages:  # also bounds the placement's search below
        missing = min(set(range(min(num_stages, len(every) + 1))) - every)
        raise ValueError(f"stage {missing} has no action, though stage {num_stages - 1} has")
    if num_stages % p:
        raise ValueError(
            f"stages 0 to {num_stages - 1} do not divide over {p} ranks (one row per rank)"
        )
    v = num_stages // p
    placement = _placement_of(stages, p, v)
    orders = []
    for actions in rows:
        order = []
        for stage, kind, mb, paired in actions:
            step = Step(
                "F" if kind == "F" else "W" if kind == "W" else "B",
                mb,
                holder_of(stage, p, placement)[1],
            )
            order.append(overlapped(step) if paired else step)
        orders.append(order)
    return orders, placement


def _placement_of(stages: dict[int, list[int]], p: int, v: int) -> str:
    for placement in (LOOPED, V_SHAPE) if v == 2 else (LOOPED,):
        if all(
            set(held) <= {stage_of(rank, k, p, placement) for k in range(v)}
            for rank, held in stages.items()
        ):
            return placement
    rank, held = next(
        (r, h) for r, h in stages.items() if not set(h) <= {stage_of(r, k, p) for k in range(v)}
    )
    raise ValueError(
        f"rank {rank} holds stages {held}: with {p} ranks and {v} stages each, rank r must "
        f"hold stages r, r+{p}, ... (looped) or, with 2, stages r and {2 * p - 1}-r (a V)"
    )


def to_torch_csv(orders: Sequence[Sequence[Step]], placement: str = LOOPED) -> str:
    """The orders as torch's compute-only pipeline-order CSV (one row per rank):
    ValueError for DualPipe's two model copies, which no torch schedule runs."""
    if placement == DUAL:
        raise ValueError("DualPipe's two model copies (dual placement) have no torch schedule")
    p = len(orders)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for rank, order in enumerate(orders):
        weights = {(s.microbatch, s.chunk) for s in order if s.kind == "W"}
        row: list[str] = []
        for step in order:
            stage = stage_of(rank, step.chunk, p, placement)
            kind = step.kind
            if kind == "B":
                kind = "I" if (step.microbatch, step.chunk) in weights else "B"
            action = f"{stage}{kind}{step.microbatch}"
            if step.overlapped and row:
                row[-1] = f"({row[-1]};{action})OVERLAP_F_B"
            else:
                row.append(action)
        writer.writerow(row)
    return out.getvalue()
