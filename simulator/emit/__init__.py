"""Op emission: the scenario lowered into ops on lanes, in schedule order. lowering.py
walks each pipeline stage's passes (forward, backward, weight, recompute) and asks the
cost model for each kernel's work and comm/ for each transfer; gpuops.py is one
simulated GPU's builder; p2pcalls.py places the framework's blocking pipeline p2p calls;
dataparallel.py, fsdp.py and strategy.py the gradient synchronisation modes; overlap.py
the F&B pairs run overlapped; moe_ops.py and cp_ops.py an MoE block and a
context-parallel attention core as ops; abstract.py a pipeline in abstract time. It
computes no kernel's time itself (the message sizes of the collectives it emits are
counted where it emits them): a new MoE dispatcher is its transfers here (moe_ops.py,
and overlap.py's exchange for overlapped pairs) and its bytes in cost/."""
