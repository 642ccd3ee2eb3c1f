"""Communication: where ranks sit and what their collectives cross. placement.py maps
tensor, data, context, pipeline and expert ranks to GPUs as Megatron orders them (the
replica of a GPU: `Placement.replica_of`) and caches each stage's transfers;
collectives.py turns a p2p send or an NCCL-like collective (ring, tree, NVLS, all-to-all)
into the coupled flows of ir/flows.py on the cluster's real links; congruent.py decides
when one lane stands for a congruent tensor-parallel group in exact mode. A new
collective algorithm lands here; routes, and the detours around a failed link, are
topologies/' (run/perturb.py applies them)."""
