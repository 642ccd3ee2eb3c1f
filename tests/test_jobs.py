"""Several jobs on one fabric: placement policies, the jobs file's
errors, and closed forms: disjoint jobs on one switch run as alone to the bit; two
data-parallel jobs whose rings share an oversubscribed uplink pair double its
bandwidth term."""

import json

import pytest

from stepsim.ir.vocabulary import DP_SYNC
from stepsim.run.iteration import build_cluster
from stepsim.run.multijob import JobCluster, link_bytes, lower_job, run_jobs
from stepsim.scenario import ScenarioError, dumps_toml
from stepsim.scenario.jobfile import jobs_from_dict, load_jobs, markdown_table, parse_nodes, place
from tests.helpers import ROOT, load, main_in_process, scenario

# a pure data-parallel job: one GPU (and one NIC) per node, DP over two nodes
DP2 = {
    "model": {"num_layers": 2, "hidden_size": 512, "num_attention_heads": 8, "seq_length": 512},
    "cluster": {"node": "dgx-a100", "num_nodes": 2, "gpus_per_node": 1, "nics_per_node": 1},
    "parallel": {"data_parallel_size": 2},
    "training": {"micro_batch_size": 1, "global_batch_size": 2},
}
NODE = {"node": "dgx-a100", "gpus_per_node": 1, "nics_per_node": 1}
# 2 nodes a leaf, one spine; each leaf's uplink carries 2 NICs' bandwidth / 4
OVERSUBSCRIBED = {
    **NODE,
    "num_nodes": 4,
    "fabric": "fat-tree",
    "nodes_per_leaf": 2,
    "spine_switches": 1,
    "oversubscription": 4,
}


def jobs_doc(tmp_path, cluster, *jobs, job_scenario=DP2):
    (tmp_path / "job.toml").write_text(dumps_toml(scenario(**job_scenario)))
    return {"cluster": cluster, "job": [{"scenario": "job.toml", **job} for job in jobs]}


def jobs(tmp_path, cluster, *jobs, **kw):
    return jobs_from_dict(jobs_doc(tmp_path, cluster, *jobs, **kw), tmp_path)


# -- placement --------------------------------------------------------------------------


def test_policies_take_the_documented_nodes():
    fat = load(cluster={"num_nodes": 16, "fabric": "fat-tree", "nodes_per_leaf": 4}).cluster
    free = [n for n in range(16) if n not in (1, 6)]
    assert place("packed", 5, free, fat) == (0, 2, 3, 4, 5)
    # round robin over the leaves {0..3} {4..7} {8..11} {12..15}: each leaf's first free
    # node, then each one's second
    assert place("spread", 6, free, fat) == (0, 4, 8, 12, 2, 5)
    three = load(
        cluster={
            "num_nodes": 16,
            "fabric": "fat-tree",
            "fabric_levels": 3,
            "nodes_per_leaf": 2,
            "leaves_per_pod": 2,
        }
    ).cluster
    # pods {0..3} {4..7} ... first: leaf 0 of every pod, then leaf 1 of every pod
    assert place("spread", 8, list(range(16)), three) == (0, 4, 8, 12, 2, 6, 10, 14)
    one = load(cluster={"num_nodes": 8}).cluster
    assert place("spread", 3, list(range(8)), one) == (0, 1, 2)  # one switch: packed
    import numpy as np

    order = np.random.default_rng(7).permutation(len(free))
    assert place("random", 4, free, fat, seed=7) == tuple(free[i] for i in order[:4])
    assert place("random", 4, free, fat, seed=7) == place("random", 4, free, fat, seed=7)


def test_nodes_ranges_keep_their_order():
    assert parse_nodes("a", "8-9, 0,3-4") == (8, 9, 0, 3, 4)
    with pytest.raises(ScenarioError, match=r"job 'a': nodes='0-x' must be ranges"):
        parse_nodes("a", "0-x")
    with pytest.raises(ScenarioError, match=r"job 'a': nodes='3-1' must be ranges"):
        parse_nodes("a", "3-1")


def test_explicit_nodes_first_then_policies_in_file_order(tmp_path):
    spec = jobs(
        tmp_path,
        OVERSUBSCRIBED,
        {"name": "p", "placement": "packed"},
        {"name": "n", "nodes": "0,3"},
    )
    assert [(j.name, j.nodes) for j in spec.jobs] == [("p", (1, 2)), ("n", (0, 3))]
    spec = jobs(
        tmp_path,
        OVERSUBSCRIBED,
        {"name": "a", "placement": "spread"},
        {"name": "b", "placement": "spread"},
    )
    assert [j.nodes for j in spec.jobs] == [(0, 2), (1, 3)]


@pytest.mark.parametrize(
    ("job", "other", "match"),
    [
        ({"nodes": "0-1"}, {"nodes": "1-2"}, r"job 'b': node 1 is held by job 'a' too"),
        ({"nodes": "3-4"}, None, r"job 'a': node 4 is not a node of the cluster \(0 to 3\)"),
        ({"nodes": "0-2"}, None, r"job 'a': 3 nodes given but its 2 GPUs need 2"),
        ({"nodes": "0,0"}, None, r"job 'a': nodes names a node twice"),
        ({"nodes": "0-1", "placement": "packed"}, None, r"job 'a': give either nodes or"),
        ({"placement": "random"}, None, r"job 'a': seed goes with placement = 'random'"),
        ({"placement": "packed", "seed": 1}, None, r"job 'a': seed goes with placement"),
        ({"placement": "close"}, None, r"job.placement='close' must be one of"),
        ({"nodes": "0-1", "gpus": 2}, None, r"job 1: unknown key 'job.gpus'"),
        ({"nodes": "0-1"}, {"nodes": "2-3", "name": "a"}, r"job 'a': two jobs share the name"),
    ],
)
def test_bad_jobs_are_one_line_errors_naming_the_job(tmp_path, job, other, match):
    tables = [{"name": "a", **job}]
    if other is not None:
        tables.append({"name": "b", **other})
    with pytest.raises(ScenarioError, match=match):
        jobs(tmp_path, OVERSUBSCRIBED, *tables)


def test_a_policy_without_room_and_a_foreign_node_kind_are_refused(tmp_path):
    with pytest.raises(ScenarioError, match=r"job 'c': placement 'packed' needs 2 nodes but 0"):
        jobs(
            tmp_path,
            OVERSUBSCRIBED,
            {"name": "a", "placement": "packed"},
            {"name": "b", "placement": "spread"},
            {"name": "c", "placement": "packed"},
        )
    other = {**DP2, "cluster": {**DP2["cluster"], "node": "dgx-h100"}}
    with pytest.raises(ScenarioError, match=r"job 'a': its scenario's cluster.gpu='h100"):
        jobs(tmp_path, OVERSUBSCRIBED, {"name": "a", "nodes": "0-1"}, job_scenario=other)
    broken = {**DP2, "parallel": {"data_parallel_size": 3}}
    with pytest.raises(ScenarioError, match=r"job 'a': parallel.data_parallel_size"):
        jobs(tmp_path, OVERSUBSCRIBED, {"name": "a", "nodes": "0-1"}, job_scenario=broken)


# -- closed forms ------------------------------------------------------------------------


def test_disjoint_jobs_on_one_switch_run_as_alone_to_the_bit(tmp_path):
    switch = {**NODE, "num_nodes": 4}
    spec = jobs(
        tmp_path, switch, {"name": "a", "placement": "packed"}, {"name": "b", "nodes": "3,2"}
    )
    result = run_jobs(spec)
    for job in result.jobs:
        assert job.iterations == 1
        assert job.together_iterations_s == (job.alone_s,)
        assert job.slowdown == 1.0
        assert job.together_breakdown_s == job.alone.breakdown_s
        assert result.shared_links[job.name] == ()


def test_a_longer_job_is_covered_by_repeated_iterations_of_a_shorter_one(tmp_path):
    long = {**DP2, "training": {"micro_batch_size": 1, "global_batch_size": 6}}
    (tmp_path / "long.toml").write_text(dumps_toml(scenario(**long)))
    doc = jobs_doc(tmp_path, {**NODE, "num_nodes": 4}, {"name": "short", "nodes": "0-1"})
    doc["job"].append({"name": "long", "nodes": "2-3", "scenario": "long.toml"})
    result = run_jobs(jobs_from_dict(doc, tmp_path))
    short, long_job = result.jobs
    assert long_job.iterations == 1
    assert short.iterations >= 2
    assert short.iterations * short.alone_s >= long_job.alone_s
    # disjoint on one switch: every iteration as long as alone (up to the clock's rounding)
    for t in short.together_iterations_s:
        assert t == pytest.approx(short.alone_s, rel=1e-12)
    assert long_job.together_s == long_job.alone_s


def test_two_rings_on_one_oversubscribed_uplink_pair_double_its_bandwidth_term(tmp_path):
    """Each job's ring all-reduce over two nodes on different leaves sends one flow up
    each leaf's uplink and down the other's. Alone it has the uplink U (the bottleneck:
    2 NICs / 4), together the two jobs' flows share it: U / 2. The jobs are identical,
    so their all-reduces start together and the iteration grows by exactly
    sum(bytes per flow) x (2/U - 1/U)."""
    spec = jobs(
        tmp_path,
        OVERSUBSCRIBED,
        {"name": "a", "placement": "spread"},
        {"name": "b", "placement": "spread"},
    )
    assert [j.nodes for j in spec.jobs] == [(0, 2), (1, 3)]
    cluster = build_cluster(spec.cluster)
    workload = lower_job(spec.jobs[0], cluster)
    syncs = [  # each collective once: its first member's op (exact mode)
        op.transfer
        for op in workload.ops
        if op.kind == DP_SYNC and op.transfer and op.rendezvous in (-1, op.index)
    ]
    assert syncs
    phases = [p for t in syncs for p in ((t,) if hasattr(t, "links") else t)]
    uplink = min(cluster.capacities[i] for p in phases for i in p.links)
    nic = spec.cluster.nic_gbps * 1e9 / 8 * spec.cluster.nic_efficiency
    assert uplink == pytest.approx(2 * nic / 4)
    flow_bytes = sum(p.bytes_per_flow for p in phases)
    result = run_jobs(spec)
    for job in result.jobs:
        extra = flow_bytes * (2 / uplink - 1 / uplink)
        assert job.together_s - job.alone_s == pytest.approx(extra, rel=1e-9)
        alone_dp, together_dp = (
            b[DP_SYNC] for b in (job.alone.breakdown_s, job.together_breakdown_s)
        )
        # the all-reduce's bandwidth term doubles: its latency stays
        latency = alone_dp - flow_bytes / uplink
        assert together_dp - latency == pytest.approx(2 * (alone_dp - latency), rel=1e-9)
        (link, *_rest) = result.shared_links[job.name]
        assert link.kind == "uplink"
        assert link.gbytes_own == link.gbytes_others == pytest.approx(flow_bytes / 1e9)


def test_a_job_view_routes_on_its_nodes(tmp_path):
    spec = jobs(tmp_path, OVERSUBSCRIBED, {"name": "a", "nodes": "3,1"})
    cluster = build_cluster(spec.cluster)
    view = JobCluster(cluster, spec.jobs[0].nodes)
    assert view.gpus == [3, 1]
    assert view.route(0, 1) == cluster.route(3, 1)
    assert view.node_of(1) == 1
    carried = link_bytes(lower_job(spec.jobs[0], cluster))
    assert all(i in cluster.route(3, 1) or i in cluster.route(1, 3) for i in carried)


# -- the command -------------------------------------------------------------------------


def test_command_prints_the_slowdown_and_writes_json_and_a_trace(tmp_path):
    doc = jobs_doc(
        tmp_path,
        OVERSUBSCRIBED,
        {"name": "a", "placement": "spread"},
        {"name": "b", "placement": "spread"},
    )
    path = tmp_path / "two.toml"
    path.write_text(dumps_toml(doc))
    out = tmp_path / "out"
    # main in this process: python -m stepsim is sys.exit(main()) (tests/test_cli.py runs it)
    code, stdout, _ = main_in_process("jobs", str(path), "--out", str(out), "--quiet", cwd=ROOT)
    assert code == 0
    assert "slowdown" in stdout and "busiest shared links" in stdout
    document = json.loads((out / "jobs.json").read_text())
    assert [j["name"] for j in document["jobs"]] == ["a", "b"]
    assert document["jobs"][0]["slowdown"] > 1
    trace = json.loads((out / "trace.json").read_text())
    names = {
        e["args"]["name"]
        for e in trace["traceEvents"]
        if e.get("ph") == "M" and e["name"] == "process_name"
    }
    assert "job a · GPU 0 (stage 0)" in names and "job b · GPU 3 (stage 0)" in names
    bad = tmp_path / "bad.toml"
    bad.write_text(dumps_toml({**doc, "job": [{**doc["job"][0], "nodes": "9"}]}))
    code, stdout, stderr = main_in_process("jobs", str(bad), cwd=ROOT)
    assert code == 2 and stdout == ""
    assert stderr.strip().splitlines() == [
        f"stepsim: error: jobs file {str(bad)!r}: job 'a': give either nodes or placement "
        "(packed, spread, random), not both"
    ]


def test_the_readme_shows_the_job_keys():
    text = (ROOT / "scenarios" / "README.md").read_text(encoding="utf-8")
    assert markdown_table() in text


def test_shipped_jobs_files_load():
    for name in ("two-jobs-packed", "two-jobs-spread"):
        spec = load_jobs(name)
        assert [len(j.nodes) for j in spec.jobs] == [8, 8]
