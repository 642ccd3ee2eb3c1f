"""The fair-share network's rate computation against the plain algorithm, bit for bit,
and against the definition of max-min fairness (the bottleneck certificate).

`engine.maxmin.max_min` handles flows of one shape as a group and links crossed alike
as one class, and updates only what is read again; `FairShareNetwork._component` visits
each link once. Both must give exactly what the textbook versions below give (the ones
the network used before the ZeRO-2 work): every output of stepsim depends on
these floats, so rates are compared bit for bit. Random flow sets are drawn with few
distinct capacities, multiplicities and shapes, so that ties (several links filling in
one round) and groups of several flows are common.
"""

from __future__ import annotations

import random

import pytest
import simpy

from stepsim.engine.maxmin import SHARE_RTOL, max_min
from stepsim.engine.network import FairShareNetwork, _Flow
from stepsim.ir.flows import Transfer


def _reference_max_min(flows: list[_Flow], capacities: list[float]) -> list[float]:
    """Progressive filling testing every unfrozen flow against the filled links."""
    remaining: dict[int, float] = {}
    load: dict[int, int] = {}
    for flow in flows:
        for link, mult in zip(flow.links, flow.mults, strict=True):
            remaining[link] = capacities[link]
            load[link] = load.get(link, 0) + mult
    rates: dict[_Flow, float] = {}
    unfrozen = list(flows)
    while unfrozen:
        share = min(remaining[link] / n for link, n in load.items() if n > 0)
        limit = share * (1 + SHARE_RTOL)
        full = {link for link, n in load.items() if n > 0 and remaining[link] / n <= limit}
        still = []
        for flow in unfrozen:
            if any(link in full for link in flow.links):
                rates[flow] = share
                for link, mult in zip(flow.links, flow.mults, strict=True):
                    remaining[link] = max(remaining[link] - mult * share, 0.0)
                    load[link] -= mult
            else:
                still.append(flow)
        unfrozen = still
    return [rates[flow] for flow in flows]


def _reference_component(on_link: dict[int, dict[_Flow, None]], links: list[int]) -> list[_Flow]:
    """Every flow reachable from these links through shared links, by flow-to-flow search."""
    seen: dict[_Flow, None] = {}
    stack = [f for link in links for f in on_link.get(link, ())]
    while stack:
        flow = stack.pop()
        if flow in seen:
            continue
        seen[flow] = None
        for link in flow.links:
            stack.extend(f for f in on_link.get(link, ()) if f not in seen)
    return sorted(seen, key=lambda f: f.seq)


def _random_flows(rng: random.Random, num_links: int, num_flows: int) -> list[_Flow]:
    """Flows of a few shapes (each shape one Transfer, as a workload reuses one), their
    start order mixing the shapes; sometimes a shape twice as equal but distinct tuples."""
    shapes = []
    for _ in range(rng.randint(1, max(num_flows, 1))):
        links = tuple(sorted(rng.sample(range(num_links), rng.randint(1, min(6, num_links)))))
        mults = tuple(rng.choice((1, 1, 1, 2, 3, 4, 8)) for _ in links)
        shapes.append(Transfer(links, mults, 1.0, 0.0))
        if rng.random() < 0.2:  # the same shape, other tuple objects
            shapes.append(Transfer(tuple(list(links)), tuple(list(mults)), 1.0, 0.0))
    flows = [_Flow(seq, rng.choice(shapes), lambda _event: None) for seq in range(1, num_flows + 1)]
    rng.shuffle(flows)  # start order is seq, whatever order they are found in
    return sorted(flows, key=lambda f: f.seq)


def _network(capacities: list[float]) -> FairShareNetwork:
    return FairShareNetwork(simpy.Environment(), capacities)


@pytest.mark.parametrize("seed", range(300))
def test_max_min_gives_the_plain_algorithms_rates_to_the_bit(seed):
    rng = random.Random(seed)
    num_links = rng.randint(1, 30)
    # few distinct capacities (some not representable exactly) make ties common
    kinds = [rng.choice((1.0, 3.0, 10.0, 12.5e9, 50e9 / 3, 0.1, 7.0)) for _ in range(3)]
    capacities = [rng.choice(kinds) for _ in range(num_links)]
    flows = _random_flows(rng, num_links, rng.randint(1, 40))
    want = [r.hex() for r in _reference_max_min(flows, capacities)]
    assert [r.hex() for r in max_min(flows, capacities)] == want
    # with the link classes kept, found again, and for a subset of the flows
    structures: dict = {}
    for _ in range(2):
        assert [r.hex() for r in max_min(flows, capacities, structures)] == want
    some = flows[::2]
    want = [r.hex() for r in _reference_max_min(some, capacities)]
    assert [r.hex() for r in max_min(some, capacities, structures)] == want


def _uncertified(flows: list[_Flow], rates: list[float], capacities: list[float]) -> list[int]:
    """The flows whose rate the max-min certificate does not back: rates are max-min
    fair if and only if they are feasible and every flow has a bottleneck, a saturated
    link on which no flow is faster (Bertsekas and Gallager, Data Networks, 2nd ed.,
    Sec. 6.5.2). A coupled flow is ``mult`` real flows at its rate on each link; all of
    them have its bottleneck. Saturation and "no faster" within 1e-9 relative."""
    load: dict[int, float] = {}
    fastest: dict[int, float] = {}
    for flow, rate in zip(flows, rates, strict=True):
        for link, mult in zip(flow.links, flow.mults, strict=True):
            load[link] = load.get(link, 0.0) + mult * rate
            fastest[link] = max(fastest.get(link, 0.0), rate)
    assert all(load[link] <= capacities[link] * (1 + 1e-9) for link in load)  # feasible
    saturated = {link for link in load if load[link] >= capacities[link] * (1 - 1e-9)}
    return [
        i
        for i, (flow, rate) in enumerate(zip(flows, rates, strict=True))
        if not any(link in saturated and rate >= fastest[link] * (1 - 1e-9) for link in flow.links)
    ]


@pytest.mark.parametrize("seed", range(200))
def test_max_min_rates_carry_the_bottleneck_certificate(seed):
    """Independent of how the rates are computed: each flow is held by a full link on
    which nothing runs faster, and no link is over its capacity."""
    rng = random.Random(1000 + seed)
    num_links = rng.randint(1, 30)
    capacities = [
        rng.choice((1.0, 3.0, 10.0, 12.5e9, 50e9 / 3, 0.1, 7.0)) for _ in range(num_links)
    ]
    flows = _random_flows(rng, num_links, rng.randint(1, 40))
    rates = max_min(flows, capacities)
    assert all(rate > 0 for rate in rates)
    assert _uncertified(flows, rates, capacities) == []
    # and the certificate can fail: a flow slowed below its share has no bottleneck
    slower = list(rates)
    slower[0] *= 0.5
    assert 0 in _uncertified(flows, slower, capacities)


def test_max_min_closed_form_two_bottlenecks():
    # A crosses links 0 (cap 10) and 1 (cap 2); B crosses 0 twice-counted (mult 2).
    # A is held to 2 by link 1; B then gets (10 - 2) / 2 = 4 per real flow.
    a = _Flow(1, Transfer((0, 1), (1, 1), 1.0, 0.0), lambda _event: None)
    b = _Flow(2, Transfer((0,), (2,), 1.0, 0.0), lambda _event: None)
    assert max_min([a, b], [10.0, 2.0]) == [2.0, 4.0]


@pytest.mark.parametrize("seed", range(100))
def test_component_finds_the_flows_a_flow_to_flow_search_finds(seed):
    rng = random.Random(1000 + seed)
    num_links = rng.randint(1, 60)
    net = _network([1.0] * num_links)
    flows = _random_flows(rng, num_links, rng.randint(0, 30))
    on_link: dict[int, dict[_Flow, None]] = {}
    for flow in flows:
        flow.link_set = frozenset(flow.links)  # as the network sets it, per transfer
        net._add(flow)
        for link in flow.links:
            on_link.setdefault(link, {})[flow] = None
    start = sorted(rng.sample(range(num_links), rng.randint(1, min(3, num_links))))
    assert net._component(start) == _reference_component(on_link, start)
    for flow in flows[::3]:  # and after some have ended
        net._remove(flow)
        for link in flow.links:
            del on_link[link][flow]
    assert net._component(start) == _reference_component(on_link, start)


def test_a_runs_fair_shares_carry_the_certificate(monkeypatch):
    """Every recompute of a run whose transfers contend (Mixtral's expert all-to-alls,
    tensor- and data-parallel traffic on shared links) gives certified rates; a component
    holds every flow crossing its links, so the check on it alone is the whole one."""
    import stepsim.engine.network as network
    from stepsim.run.iteration import run
    from stepsim.scenario import load_scenario

    checked = []

    def certified(flows, capacities, structures=None):
        rates = max_min(flows, capacities, structures)
        checked.append(_uncertified(list(flows), rates, capacities))
        return rates

    monkeypatch.setattr(network, "max_min", certified)
    run(load_scenario("mixtral-8x7b-16-h100"))
    assert len(checked) > 10 and not any(checked)
