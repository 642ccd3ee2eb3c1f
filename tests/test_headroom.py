"""--memory-headroom: a layout counts as fitting only if it leaves that fraction of each
GPU's memory free; those within twice it are marked '!'. Closed forms on one layout."""

import csv
import json

import pytest

from stepsim.plan.search import OUT_OF_MEMORY, candidates
from stepsim.plan.space import DEFAULT_MEMORY_HEADROOM, SearchSpace
from stepsim.scenario import ScenarioError, load_scenario
from tests.helpers import main_in_process

# tiny-2gpu grown to about 67 of its GPUs' 80 GiB: long sequences, large micro-batches
GROWN = ("model.seq_length=8192", "training.micro_batch_size=32", "training.global_batch_size=256")
SETS = tuple(x for item in GROWN for x in ("--set", item))
ONE = {  # that layout and nothing else
    "tp": (1,),
    "pp": (2,),
    "micro_batch": (32,),
    "schedules": ("1f1b",),
    "recompute": ("none",),
    "sharding": ("none",),
    "sequence_parallel": (False,),
}
FLAGS = ("--tp", "1", "--pp", "2", "--micro-batch", "32", "--schedules", "1f1b", *SETS)
FLAGS += ("--recompute", "none", "--sharding", "none", "--sequence-parallel", "off")


def memory_and_status(headroom):
    base = load_scenario("tiny-2gpu", GROWN)
    (c,) = candidates(base, SearchSpace(**ONE, memory_headroom=headroom))[0]
    return c.memory_gib, c.status, base.cluster.gpu.memory_gib


def test_a_layout_fits_only_below_the_capacity_less_the_headroom():
    memory, status, capacity = memory_and_status(0.0)
    assert status != OUT_OF_MEMORY
    free = 1.0 - memory / capacity  # the largest headroom it meets
    assert 0.05 < free < 0.4  # the closed form below needs a layout this full
    assert memory_and_status(free - 1e-9)[1] != OUT_OF_MEMORY
    assert memory_and_status(free + 1e-9)[1] == OUT_OF_MEMORY
    assert SearchSpace().memory_headroom == DEFAULT_MEMORY_HEADROOM == 0.05


def test_a_layout_within_twice_the_headroom_is_marked_and_the_search_says_so(tmp_path):
    memory, _, capacity = memory_and_status(0.0)
    free = 1.0 - memory / capacity
    headroom = free * 0.75  # fits (free > h) but tight (free < 2h)
    args = ("search", "tiny-2gpu", *FLAGS, "--memory-headroom", str(headroom), "--quiet")
    code, stdout, stderr = main_in_process(*args)
    assert code == 0, stderr
    assert f"{memory:.1f} !" in stdout and "!: over" in stdout
    assert f"({100 * headroom:g} % of each GPU kept free)" in stdout
    code, stdout, _ = main_in_process(*args, "--json")
    document = json.loads(stdout)
    assert document["memory_headroom"] == headroom
    code, _, _ = main_in_process(*args, "--out", str(tmp_path))
    with (tmp_path / "search.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    assert float(row["memory_free_fraction"]) == pytest.approx(free)


@pytest.mark.parametrize("value", ["0.5", "-0.1", "nan", "x"])
def test_a_headroom_outside_zero_to_a_half_is_refused_in_one_line(value):
    code, _, stderr = main_in_process("search", "tiny-2gpu", "--memory-headroom", value)
    assert code == 2 and "--memory-headroom" in stderr and len(stderr.strip().splitlines()) == 1
    with pytest.raises(ScenarioError, match="memory_headroom"):
        SearchSpace(memory_headroom=0.6).check()
