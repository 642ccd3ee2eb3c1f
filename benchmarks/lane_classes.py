"""How many GPUs of an exact-mode run behave differently: a what-if on `dense-16k-h100`'s
layout cut to NODES servers (TP 8, PP 16, DP = NODES / 16, 16 micro-batches per replica
as at 16,384 GPUs), in exact mode (a lane per GPU), with the first uplink of leaf
``--leaf`` failed (leaf g x 8 + k is rail k of nodes 32 g to 32 g + 31) or, ``--slow-gpu``,
GPU 43 at 1.05x. The GPUs are grouped by their compute lanes' span sequences (kind,
start, end, to the bit), with ``--all-streams`` by every stream's: each group is one
behaviour that a simulation sharing lanes between identical GPUs would have to run.
Each is printed by stage, tensor ranks and replicas. Issue 34 part 3 measures with it
what exact sharing could save at 16,384 GPUs.

    .venv/bin/python benchmarks/lane_classes.py 128          # 1,024 GPUs, ~25 s
    .venv/bin/python benchmarks/lane_classes.py 512          # 4,096 GPUs, ~100 s, 3 GiB
    .venv/bin/python benchmarks/lane_classes.py 2048 --all-streams   # 16,384: ~8 min, 15 GiB
"""

from __future__ import annotations

import argparse
import resource
import time
from collections import Counter, defaultdict
from dataclasses import replace

from stepsim.run.iteration import build_cluster, run
from stepsim.run.perturb import runs_of
from stepsim.scenario import load_scenario
from stepsim.scenario.perturbation import PerturbationSpec

TP, PP = 8, 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("nodes", type=int, help="servers of 8 GPUs, a multiple of 16")
    parser.add_argument("--slow-gpu", action="store_true", help="GPU 43 at 1.05x instead")
    parser.add_argument("--leaf", type=int, default=0, help="whose first uplink fails (0)")
    parser.add_argument(
        "--all-streams", action="store_true", help="compare every stream, not only compute"
    )
    args = parser.parse_args()
    base = load_scenario("dense-16k-h100")
    dp = args.nodes * base.cluster.gpus_per_node // (TP * PP)
    scenario = replace(
        base,
        cluster=replace(base.cluster, num_nodes=args.nodes),
        parallel=replace(base.parallel, data_parallel_size=dp),
        training=replace(base.training, global_batch_size=16 * dp),
        network=replace(base.network, symmetry=False),
    )
    cluster = build_cluster(scenario.cluster, pattern=False)
    if args.slow_gpu:
        what = PerturbationSpec(kind="slow_gpu", gpu=43, factor=1.05)
    else:
        link = next(
            x.index
            for x in cluster.links
            if x.src == ("switch", 1, args.leaf) and x.dst[0] == "switch"
        )
        what = PerturbationSpec(kind="slow_link", link=link, down=True)
        ends = cluster.links[link]
        print(f"failed: link {link}, {ends.src} -> {ends.dst}, and the link back")
    scenario = replace(scenario, perturbations=(what,))
    start = time.process_time()
    result = run(scenario)
    seconds = time.process_time() - start
    lanes: defaultdict[int, list] = defaultdict(list)
    for span in result.trace.spans:
        if args.all_streams or span.stream == "compute":
            lanes[span.gpu].append((span.stream, span.kind, span.start_s, span.end_s))
    behaviours: defaultdict[tuple, list[int]] = defaultdict(list)
    for gpu, spans in sorted(lanes.items()):
        behaviours[tuple(sorted(spans))].append(gpu)
    stage_of = {lane.gpu: lane.stage for lane in result.workload.lanes}
    per_stage = Counter(stage_of[gpus[0]] for gpus in behaviours.values())
    sizes = sorted((len(gpus) for gpus in behaviours.values()), reverse=True)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{what.kind} on {args.nodes * 8:,} GPUs (DP {dp}), exact mode")
    print(f"  iteration {result.metrics.iteration_time_s:.4f} s; run {seconds:.1f} CPU-s")
    print(f"  peak memory {peak_mib:,.0f} MiB")
    print(f"  {len(lanes):,} GPUs, {len(behaviours)} distinct behaviours")
    print(f"  behaviours per stage: {dict(sorted(per_stage.items()))}")
    print(f"  GPUs per behaviour: {sizes}")
    for gpus in sorted(behaviours.values(), key=lambda g: (stage_of[g[0]], -len(g), g)):
        print(f"    {len(gpus):>5}  {members(gpus, dp)}")


def members(gpus: list[int], dp: int) -> str:
    """A behaviour's GPUs as stage, tensor ranks and replica ranges (rank order
    tp-dp-pp: GPU = rank + 8 x (replica + DP x stage))."""
    by_stage: defaultdict[int, defaultdict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for g in gpus:
        by_stage[g // (TP * dp)][(g // TP) % dp].append(g % TP)
    parts = []
    for stage, replicas in sorted(by_stage.items()):
        by_ranks: defaultdict[tuple[int, ...], list[int]] = defaultdict(list)
        for d, ranks in sorted(replicas.items()):
            by_ranks[tuple(sorted(ranks))].append(d)
        for ranks, ds in sorted(by_ranks.items()):
            parts.append(f"stage {stage}, ranks {runs_of(list(ranks))}, replicas {runs_of(ds)}")
    return "; ".join(parts)


if __name__ == "__main__":
    main()
