"""Link utilization: means and timelines from the network's constant-rate stretches."""

import numpy as np
import pytest
import simpy

from stepsim.engine.network import AnalyticalNetwork, FairShareNetwork
from stepsim.ir.flows import Interval, Transfer
from stepsim.report.linkstats import link_utilization, utilization_over_time
from stepsim.run.iteration import run
from tests.helpers import load


def test_mean_and_binned_utilization_of_a_step():
    # link 0 (10 B/s) full for the first half of 4 s; link 1 (20 B/s) carries 2 x 5 B/s
    intervals = [Interval((0,), (1,), 10.0, 0.0, 2.0), Interval((1,), (2,), 5.0, 1.0, 3.0)]
    mean = link_utilization(intervals, [10.0, 20.0], 4.0)
    assert [mean[0], mean[1]] == pytest.approx([0.5, 10.0 * 2 / (20.0 * 4)])
    edges, series = utilization_over_time(intervals, [10.0, 20.0], [0, 1], 4.0, 4)
    assert edges == pytest.approx([0, 1, 2, 3, 4])
    assert series[0] == pytest.approx([1, 1, 0, 0])
    assert series[1] == pytest.approx([0, 0.5, 0.5, 0])


@pytest.mark.parametrize("network", [FairShareNetwork, AnalyticalNetwork])
def test_intervals_account_for_every_byte(network):
    env = simpy.Environment()
    net = network(env, [10.0, 4.0])

    def go(start, transfer):
        yield env.timeout(start)
        yield net.transfer(transfer)

    env.process(go(0.0, Transfer((0,), (1,), 100.0, 0.0)))
    env.process(go(3.0, Transfer((0, 1), (1, 2), 20.0, 0.0)))
    env.run()
    carried = np.zeros(2)
    for iv in net.intervals:
        for link, mult in zip(iv.links, iv.mults, strict=True):
            carried[link] += mult * iv.rate_bytes_per_s * (iv.end_s - iv.start_s)
    assert carried == pytest.approx([100.0 + 20.0, 2 * 20.0])


def test_busiest_links_reach_the_summary_and_the_trace():
    from stepsim.report.summary import summary_text
    from stepsim.report.trace import chrome_trace

    result = run(
        load(
            cluster={"num_nodes": 2},
            parallel={"tensor_model_parallel_size": 8, "data_parallel_size": 2},
            training={"global_batch_size": 4},
        )
    )
    busiest = result.metrics.busiest_links
    # TP 8 inside each node, DP 2 across the two: NVLink, PCIe and NIC links all carry
    # bytes; one switch, so no uplink
    assert [b.kind for b in busiest] == ["nvlink", "pcie", "nic"]
    assert all(0 < b.utilization <= b.peak_utilization <= 1 + 1e-9 for b in busiest)
    assert "busiest links" in summary_text(result)
    counters = [e for e in chrome_trace(result)["traceEvents"] if e["ph"] == "C"]
    assert {e["name"] for e in counters} == {b.link for b in busiest}
    assert max(e["args"]["utilization %"] for e in counters) <= 100.0 + 1e-9


def test_busiest_links_give_each_kind_its_mean_and_its_peak():
    from types import SimpleNamespace

    from stepsim.ir.results import Trace
    from stepsim.run.iteration import PEAK_BINS, busiest_links
    from stepsim.topologies.describe import link_role

    gpu, nic, sw = ("gpu", 0), ("nic", 0, 0), ("switch", 1, 0)
    spine = ("switch", 2, 0)
    links = [  # capacities 10, 10, 10, 20 B/s
        SimpleNamespace(kind="nvlink", src=gpu, dst=("nvswitch", 0), bandwidth_bytes_per_s=10.0),
        SimpleNamespace(kind="ib", src=nic, dst=sw, bandwidth_bytes_per_s=10.0),
        SimpleNamespace(kind="ib", src=nic, dst=sw, bandwidth_bytes_per_s=10.0),
        SimpleNamespace(kind="ib", src=sw, dst=spine, bandwidth_bytes_per_s=20.0),
    ]
    # over 100 s: the NVLink half full all along (mean 0.5, peak 0.5); NIC link 1 full for
    # the first second only (mean 0.01, peak 1 in the busiest 1 s); NIC link 2 idle; the
    # uplink at 5 B/s for 10 s (mean 0.025, peak 0.25)
    intervals = [
        Interval((0,), (1,), 5.0, 0.0, 100.0),
        Interval((1,), (1,), 10.0, 0.0, 1.0),
        Interval((3,), (1,), 5.0, 20.0, 30.0),
    ]
    trace = Trace(spans=[], lanes=(), end_s=100.0, num_transfers=3, link_intervals=intervals)
    cluster = SimpleNamespace(  # what busiest_links reads of a Cluster or PatternCluster
        links=links,
        capacities=[link.bandwidth_bytes_per_s for link in links],
        link_role=lambda i: link_role(links[i].kind, links[i].src, links[i].dst),
    )
    got = busiest_links(cluster, trace)
    assert PEAK_BINS == 100
    assert [(b.kind, b.index) for b in got] == [("nvlink", 0), ("nic", 1), ("uplink", 3)]
    assert [b.utilization for b in got] == pytest.approx([0.5, 0.01, 0.025])
    assert [b.peak_utilization for b in got] == pytest.approx([0.5, 1.0, 0.25])
    assert [b.gbytes for b in got] == pytest.approx([500e-9, 10e-9, 50e-9])


def test_utilization_is_kept_for_the_links_crossed_and_zero_elsewhere():
    """`link_utilization` keeps only the links a run crossed (a dense array is 6 MB at
    131,072 GPUs): each link's bytes moved over what it could carry in the iteration,
    summed here interval by interval, and 0.0 for every other link."""
    result = run(load(cluster={"num_nodes": 4}, parallel={"data_parallel_size": 4}))
    intervals, capacities = result.trace.link_intervals, result.cluster.capacities
    end_s = result.trace.end_s
    moved = dict.fromkeys(range(len(capacities)), 0.0)
    for iv in intervals:
        for link, mult in zip(iv.links, iv.mults, strict=True):
            moved[link] += mult * iv.rate_bytes_per_s * (iv.end_s - iv.start_s)
    expected = [moved[i] / (capacities[i] * end_s) for i in range(len(capacities))]
    kept = link_utilization(intervals, capacities, end_s)
    assert kept.links.tolist() == sorted({link for iv in intervals for link in iv.links})
    assert [kept[i] for i in range(len(capacities))] == pytest.approx(expected, rel=1e-12)
    assert all(kept[i] == 0.0 for i in range(len(capacities)) if i not in kept.links)
    wider = np.arange(len(capacities))  # asked for every link: the same, zeros included
    assert link_utilization(intervals, capacities, end_s, wider).values.tolist() == [
        kept[i] for i in range(len(capacities))
    ]
