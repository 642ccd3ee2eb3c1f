"""The flow models against closed forms: one flow, fair sharing, bottlenecks elsewhere."""

import numpy as np
import pytest
import simpy

from stepsim.engine.network import AnalyticalNetwork, FairShareNetwork
from stepsim.ir.flows import Transfer


def _finish_times(network_cls, capacities, transfers):
    """transfers: (start_s, Transfer) pairs; returns each one's finish time."""
    env = simpy.Environment()
    net = network_cls(env, capacities)
    finished = {}

    def launch(i, start_s, transfer):
        yield env.timeout(start_s)
        yield net.transfer(transfer)
        finished[i] = env.now

    for i, (start_s, transfer) in enumerate(transfers):
        env.process(launch(i, start_s, transfer))
    env.run()
    return [finished[i] for i in range(len(transfers))]


def flow(links, num_bytes, latency_s=0.0, mults=None):
    return Transfer(tuple(links), tuple(mults or [1] * len(links)), num_bytes, latency_s)


@pytest.mark.parametrize("network", [FairShareNetwork, AnalyticalNetwork])
def test_single_transfer_takes_latency_plus_bytes_over_bottleneck(network):
    (t,) = _finish_times(network, [10.0, 5.0, 20.0], [(0.0, flow([0, 1, 2], 100.0, 0.5))])
    assert t == pytest.approx(0.5 + 100.0 / 5.0)


def test_two_equal_flows_on_one_link_finish_together_at_twice_the_solo_time():
    times = _finish_times(FairShareNetwork, [10.0], [(0, flow([0], 100.0)), (0, flow([0], 100.0))])
    assert times == pytest.approx([20.0, 20.0])


def test_analytical_model_ignores_other_transfers():
    times = _finish_times(AnalyticalNetwork, [10.0], [(0, flow([0], 100.0)), (0, flow([0], 100.0))])
    assert times == pytest.approx([10.0, 10.0])


def test_flow_limited_elsewhere_leaves_its_share_to_others():
    # A crosses a 2 B/s link, so on the shared 10 B/s link B gets 8, not 5.
    a = flow([0, 1], 20.0)
    b = flow([0], 160.0)
    t_a, t_b = _finish_times(FairShareNetwork, [10.0, 2.0], [(0, a), (0, b)])
    assert t_a == pytest.approx(10.0)
    # B: 8 B/s for 10 s (80 B), then the whole link for the last 80 B
    assert t_b == pytest.approx(10.0 + 80.0 / 10.0)


def test_late_arrival_halves_the_rate_from_then_on():
    t_a, t_b = _finish_times(
        FairShareNetwork, [10.0], [(0.0, flow([0], 100.0)), (5.0, flow([0], 100.0))]
    )
    assert t_a == pytest.approx(15.0)  # 50 B alone, then 50 B at 5 B/s
    assert t_b == pytest.approx(20.0)  # 50 B at 5 B/s, then 50 B alone


def test_latency_is_paid_before_bandwidth_is_shared():
    # B waits 4 s of latency, so A runs alone for those 4 s.
    t_a, t_b = _finish_times(
        FairShareNetwork, [10.0], [(0.0, flow([0], 100.0)), (0.0, flow([0], 100.0, 4.0))]
    )
    assert t_a == pytest.approx(4.0 + 60.0 / 5.0)
    assert t_b == pytest.approx(t_a + 40.0 / 10.0)


def test_multiplicity_charges_a_coupled_flow_once_per_real_flow():
    # Four real flows of one coupled transfer cross link 0: each gets a quarter.
    (t,) = _finish_times(FairShareNetwork, [8.0, 100.0], [(0, flow([0, 1], 10.0, mults=[4, 1]))])
    assert t == pytest.approx(10.0 / 2.0)
    # and against an ordinary flow the link splits 4:1 by real flows
    t_c, t_o = _finish_times(
        FairShareNetwork, [10.0], [(0, flow([0], 10.0, mults=[4])), (0, flow([0], 10.0))]
    )
    assert t_c == pytest.approx(5.0)  # 2 B/s each for all five real flows
    assert t_o == pytest.approx(5.0)


def test_no_link_is_ever_over_capacity_and_every_flow_finishes():
    rng = np.random.default_rng(7)
    capacities = list(rng.uniform(1.0, 10.0, size=12))
    env = simpy.Environment()
    net = FairShareNetwork(env, capacities)
    done = []
    transfers = []
    for _ in range(40):
        links = sorted(rng.choice(12, size=int(rng.integers(1, 5)), replace=False).tolist())
        transfers.append((float(rng.uniform(0, 20)), flow(links, float(rng.uniform(1, 50)))))

    def launch(start_s, transfer):
        yield env.timeout(start_s)
        yield net.transfer(transfer)
        done.append(env.now)

    for start_s, transfer in transfers:
        env.process(launch(start_s, transfer))
    max_ratio = 0.0
    for t in np.linspace(0.0, 200.0, 801)[1:]:
        env.run(until=float(t))
        load = net.link_load_bytes_per_s()
        max_ratio = max(max_ratio, *(x / c for x, c in zip(load, capacities, strict=True)))
    env.run()
    assert len(done) == len(transfers)
    assert max_ratio <= 1.0 + 1e-9
    assert max_ratio > 0.99  # and max-min fills the bottleneck links


def test_zero_byte_transfer_takes_its_latency():
    (t,) = _finish_times(FairShareNetwork, [1.0], [(1.0, flow([0], 0.0, 0.25))])
    assert t == pytest.approx(1.25)


def test_flow_starting_during_anothers_latency_shares_only_from_its_start():
    # A (latency 1 s) is launched alone, B (no latency) at 0.5 s on the same 10 B/s
    # link: B runs alone until A's bytes start at 1 s (5 B moved), then both get 5 B/s;
    # B's last 95 B take 19 s (ends at 20 s), A has 5 B left and ends 0.5 s later.
    t_a, t_b = _finish_times(
        FairShareNetwork, [10.0], [(0.0, flow([0], 100.0, 1.0)), (0.5, flow([0], 100.0))]
    )
    assert t_b == pytest.approx(20.0)
    assert t_a == pytest.approx(20.5)


def test_flow_joining_a_running_one_takes_its_share_from_then_on():
    # A alone from 0 on links 0 and 1; B joins on link 1 only at 4 s
    t_a, t_b = _finish_times(
        FairShareNetwork, [10.0, 10.0], [(0.0, flow([0, 1], 100.0)), (4.0, flow([1], 30.0))]
    )
    # A: 40 B by 4 s, then 5 B/s; B: 30 B at 5 B/s ends at 10 s; A has 30 B left at 10 B/s
    assert t_b == pytest.approx(10.0)
    assert t_a == pytest.approx(13.0)


def test_calls_run_in_time_order_and_ties_in_scheduling_order_among_simpy_timeouts():
    from stepsim.engine.events import after

    env, seen = simpy.Environment(), []
    call = after(env)
    for name, delay in (("a", 2.0), ("b", 1.0), ("c", 2.0), ("d", 0.0)):
        call(delay, lambda _event, name=name: seen.append((name, env.now)))
        # a Timeout scheduled just after each call runs just after it at the same time
        env.timeout(delay).callbacks.append(lambda _event, name=name: seen.append(name.upper()))
    call(1.0, lambda _event: call(1.0, lambda _event: seen.append(("e", env.now))))
    env.run()
    assert seen == [("d", 0.0), "D", ("b", 1.0), "B", ("a", 2.0), "A", ("c", 2.0), "C", ("e", 2.0)]
    with pytest.raises(ValueError, match="negative delay"):
        call(-1.0, lambda _event: None)
