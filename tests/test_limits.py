"""The input gate (scenario/files.py) and the size limits (scenario/limits.py): exact
boundaries of each limit, the depth measure on hand-made TOML, files that are not
regular refused without blocking, and search workers that end with their parent."""

import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stepsim.run.iteration import build_cluster
from stepsim.scenario import ScenarioError, load_scenario
from stepsim.scenario.files import parse_toml, parse_value, read_text, toml_depth
from stepsim.scenario.limits import LIMITS, limit
from stepsim.topologies import FabricShape, cable_count

TINY = "scenarios/tiny-2gpu.toml"
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "text, depth",
    [
        ("a = 1", 1),
        ("a = [[1]]", 2),
        ("a = [{b = [1]}, [2]]", 3),
        ("a.b.c = 1", 3),
        ('a = "[[[[.a.b.c.d"', 1),  # inside a string: not structure
        ("a = '{{{{'  # [[[[ a.b.c.d.e", 1),  # nor in a literal string or a comment
        ('"q.r".b = """\n[[[[\n"""', 2),  # a quoted key is one part; multi-line string
        ("[[gemm]]\nm = 1.5", 2),
    ],
)
def test_depth_of_hand_made_toml(text, depth):
    assert toml_depth(text) == depth


def test_depth_limit_boundary_and_tomllib_failures():
    parse_toml("a = " + "[" * 32 + "]" * 32, "f")  # exactly the limit
    with pytest.raises(ScenarioError, match=r"^f nests about 33 levels, over the limit of 32"):
        parse_toml("a = " + "[" * 33 + "]" * 33, "f")
    with pytest.raises(ScenarioError, match=r"^f nests about 40 levels.*STEPSIM_MAX_TOML_DEPTH"):
        parse_toml(".".join("a" * 40) + " = 1", "f")
    with pytest.raises(ScenarioError, match=r"^f: not valid TOML: Exceeds the limit \(4300 digits"):
        parse_toml("a = 1" + "0" * 4300, "f")
    with pytest.raises(ScenarioError, match=r"^--set x: not valid TOML: Exceeds the limit"):
        parse_value("1" + "0" * 4300, "--set x")
    assert parse_value("0x1_0", "--set x") == 16  # TOML's hex and underscores: accepted
    assert parse_value("gpipe", "--set x") == "gpipe"  # a bare word is the word


def test_a_limit_is_raised_by_its_variable(monkeypatch):
    assert limit("gpus") == LIMITS["gpus"].value == 65_536
    monkeypatch.setenv("STEPSIM_MAX_GPUS", "16")
    assert limit("gpus") == 16
    monkeypatch.setenv("STEPSIM_MAX_GPUS", "lots")
    with pytest.raises(ScenarioError, match=r"^STEPSIM_MAX_GPUS='lots' must be a positive integer"):
        limit("gpus")


def test_gpu_and_op_limits_at_their_boundary(monkeypatch):
    two_nodes = ["cluster.num_nodes=2", "cluster.gpus_per_node=8", "cluster.nics_per_node=8"]
    exact = "network.symmetry=false"  # the whole graph is built
    monkeypatch.setenv("STEPSIM_MAX_GPUS", "16")
    load_scenario(TINY, [*two_nodes, "parallel.data_parallel_size=8", exact])  # at the limit
    with pytest.raises(
        ScenarioError,
        match=r"^cluster\.num_nodes=3 x cluster\.gpus_per_node=8 is about 24 GPUs, over the "
        r"limit of 16 GPUs .*raise the limit with STEPSIM_MAX_GPUS=N$",
    ):
        load_scenario(TINY, ["cluster.num_nodes=3", *two_nodes[1:], exact])
    # symmetric: two servers are built whatever the GPUs (and the switches counted), so
    # no GPU limit (the links still count); drawing the whole graph is refused
    tree = ["cluster.fabric='fat-tree'", "cluster.nodes_per_leaf=1"]
    for fabric in ([], tree):
        big = load_scenario(TINY, ["cluster.num_nodes=3", *two_nodes[1:], *fabric])
        with pytest.raises(ScenarioError, match=r"^cluster\.num_nodes=3 x .* 24 GPUs, over"):
            build_cluster(big.cluster)
        assert build_cluster(big.cluster, pattern=True).num_gpus == 24
    # tiny: 4 layers x 12 ops x (global batch / micro-batch 2) micro-batches
    monkeypatch.setenv("STEPSIM_MAX_SIMULATED_OPS", str(4 * 12 * 8))
    load_scenario(TINY, ["training.global_batch_size=16"])  # 8 micro-batches: at the limit
    with pytest.raises(
        ScenarioError,
        match=r"^training\.global_batch_size=18 with model\.num_layers=4 means about 432 ops",
    ):
        load_scenario(TINY, ["training.global_batch_size=18"])


def test_cable_count_is_what_build_graph_draws():
    """Every cable is two directed edges, over node layouts and fabrics (the 3-level
    fat tree with several pods included)."""
    shapes = [("nvswitch", 8, 8), ("nvswitch", 8, 2), ("all-to-all", 4, 1)]
    fabrics = [
        ("switch", 2, 16, 8, 4),
        ("fat-tree", 2, 2, 8, 4),
        ("fat-tree", 3, 1, 2, 4),
        ("rail-optimized", 2, 2, 8, 2),
        ("rail-only", 2, 4, 8, 4),
        ("multi-plane", 2, 2, 8, 2),
    ]
    for (topology, gpus, nics), (
        kind,
        levels,
        per_leaf,
        per_pod,
        spines,
    ), nodes in itertools.product(shapes, fabrics, (1, 4)):
        sets = [
            f"cluster.nvlink_topology='{topology}'",
            f"cluster.gpus_per_node={gpus}",
            f"cluster.nics_per_node={nics}",
            f"cluster.num_nodes={nodes}",
            f"cluster.fabric='{kind}'",
            f"cluster.fabric_levels={levels}",
            f"cluster.nodes_per_leaf={per_leaf}",
            f"cluster.leaves_per_pod={per_pod}",
            f"cluster.spine_switches={spines}",
            f"parallel.data_parallel_size={nodes * gpus // 2}",
            f"training.global_batch_size={nodes * gpus}",
        ]
        c = load_scenario(TINY, sets).cluster
        fabric = FabricShape(
            kind=kind, levels=levels, nodes_per_leaf=per_leaf, leaves_per_pod=per_pod, spines=spines
        )
        edges = build_cluster(c).graph.number_of_edges()
        assert edges == 2 * cable_count(nodes, gpus, nics, topology, fabric), sets
    # by hand: 10 DGX A100 on one switch: 8 PCIe + 8 NVSwitch + 8 InfiniBand cables each
    assert cable_count(10, 8, 8, "nvswitch", FabricShape()) == 240


def test_link_limit_refuses_a_fabric_too_large_to_draw():
    sets = [
        "cluster.num_nodes=20000",
        "cluster.gpus_per_node=1",
        "cluster.nics_per_node=1",
        "cluster.fabric='fat-tree'",
        "cluster.fabric_levels=3",
        "cluster.nodes_per_leaf=1024",
        "cluster.leaves_per_pod=1",
        "cluster.spine_switches=1024",
    ]
    # 20 leaves x 1024 spines + 20 pods x 1024^2 cables above them, + 3 per node
    cables = 20_000 * 3 + 20 * 1024 + 20 * 1024 * 1024
    with pytest.raises(ScenarioError, match=f"draws about {2 * cables:,} links, over the limit"):
        load_scenario(TINY, sets)


def test_files_that_are_not_regular_are_refused_without_blocking(tmp_path, monkeypatch):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)  # nobody writes to it: opening it for reading would wait for ever
    with pytest.raises(ScenarioError, match=r"^x is not a regular file"):
        read_text(fifo, "x")
    with pytest.raises(ScenarioError, match=r"^x is not a regular file"):
        read_text(Path("/dev/zero"), "x")
    with pytest.raises(ScenarioError, match=r"^x is not a regular file"):
        read_text(tmp_path, "x")
    small = tmp_path / "s"
    small.write_bytes(b"1234567890")
    monkeypatch.setenv("STEPSIM_MAX_INPUT_BYTES", "10")
    assert read_text(small, "x") == "1234567890"  # exactly the limit
    small.write_bytes(b"12345678901")
    with pytest.raises(ScenarioError, match=r"^x holds about 11 bytes, over the limit of 10"):
        read_text(small, "x")
    small.write_bytes("\ufeffname".encode())
    assert read_text(small, "x") == "name"  # a byte-order mark is not text
    small.write_bytes(b"\xff\xfe")
    with pytest.raises(ScenarioError, match=r"^x is not UTF-8 text$"):
        read_text(small, "x")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_search_workers_end_when_the_search_is_killed():
    argv = [sys.executable, "-m", "stepsim", "search", "scenarios/gpt3-175b-128nodes.toml"]
    search = subprocess.Popen(
        [*argv, "--jobs", "2", "--quiet"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while len(_children(search.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # both workers (and multiprocessing's resource tracker) started
        workers = _children(search.pid)
        assert len(workers) >= 2, "the search did not start its workers"
    finally:
        search.send_signal(signal.SIGKILL)
        search.wait()
    deadline = time.monotonic() + 5
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [w for w in workers if _alive(w)]
    for w in left:
        os.kill(w, signal.SIGKILL)
    assert left == []


def test_the_readme_lists_every_limit_with_its_variable():
    text = (ROOT / "scenarios" / "README.md").read_text(encoding="utf-8")
    table = text[text.index("## Limits") :]
    for spec in LIMITS.values():
        row = next(line for line in table.splitlines() if f"`{spec.env}`" in line)
        shown = f"{spec.value // 2**20} MiB" if spec.unit == "bytes" else f"{spec.value:,}"
        assert f"| {shown}" in row, (spec.name, row)
