"""Rules of the expert all-to-all overlap (docs/moe.md): what
`training.overlap_moe_expert_parallel_comm` needs, as Megatron-Core's
TransformerConfig.__post_init__ asserts it (expert parallelism, the alltoall
or flex dispatcher, no full recomputation, a virtual pipeline when PP > 1) or as stepsim
models it (pairs of an `interleaved`, `dualpipev` or single-stage `1f1b` schedule)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ir.vocabulary import MOE_ALLTOALL, MOE_FLEX, RECOMPUTE_FULL
from .errors import ScenarioError
from .frameworks import OVERLAPPED

if TYPE_CHECKING:
    from .spec import Scenario

KEY = "training.overlap_moe_expert_parallel_comm"
# schedules whose orders hold F&B pairs once the overlap is on
OVERLAP_SCHEDULES = ("interleaved", "dualpipev", "dualpipe")


def check_overlap(scenario: Scenario) -> None:
    model, par, training = scenario.model, scenario.parallel, scenario.training
    if not training.moe_overlap:
        if training.delay_wgrad_compute:
            raise ScenarioError(
                key="training.delay_wgrad_compute",
                value=True,
                rule=f"applies only with {KEY} = true (Megatron-Core delays the weight "
                "gradients of the overlapped pairs)",
            )
        if training.moe_comm_sm_fraction:
            raise ScenarioError(
                key="training.moe_comm_sm_fraction",
                value=training.moe_comm_sm_fraction,
                rule=f"applies only with {KEY} = true (SMs held while pairs overlap)",
            )
        return
    problem = None
    if not model.moe or par.ep_size < 2:
        problem = "needs an MoE model with parallel.expert_model_parallel_size > 1"
    elif training.moe_dispatcher not in (MOE_ALLTOALL, MOE_FLEX):
        problem = 'needs training.moe_token_dispatcher_type = "alltoall" or "flex"'
    elif training.recompute_granularity == RECOMPUTE_FULL:
        problem = "cannot go with full recomputation (Megatron-Core refuses it)"
    elif par.cp_size > 1:
        problem = "is not modelled with context parallelism"
    elif par.pipeline_model_parallel_size > 1 and training.mechanism("pipeline_p2p") != OVERLAPPED:
        problem = (
            'needs training.pipeline_p2p = "overlapped" (pairs start when both inputs are '
            "in, not at the framework's blocking calls)"
        )
    elif par.pipeline_model_parallel_size > 1 and training.schedule not in OVERLAP_SCHEDULES:
        problem = (
            f"needs training.schedule in {', '.join(OVERLAP_SCHEDULES)} when PP > 1 "
            f"(Megatron-Core: a virtual pipeline), not {training.schedule!r}"
        )
    if problem:
        raise ScenarioError(key=KEY, value=True, rule=problem)
