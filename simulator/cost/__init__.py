"""What things cost, as pure functions of the scenario and the GPU record: how long a
kernel takes and how many FLOPs it does (kernels.py: Work, Kernel and the GEMM curve;
compute.py: a layer's and a stage's kernels; attention.py, mla.py, fp8.py, context.py:
the attention core, latent attention, FP8 GEMMs and casts, context parallelism's step
plan; moe.py, routing.py, deepep.py: an MoE block's work and its dispatch's bytes), how
much memory a GPU holds (params.py counts parameters, memory.py the bytes per stage),
and the schedule's pass orders and their times (orders.py, schedule_costs.py). No ops,
no simpy, no files: a new kernel model is a change here; a new GPU's constants are its
record in scenario/hardware.py, which this room reads."""
