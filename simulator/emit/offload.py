"""Activation offloading as ops: copies to host memory and back on an offload stream.

Megatron-Core's `cpu_offloading` (`training.cpu_offloading`) runs each transformer layer
of its TransformerBlock inside Transformer Engine's offload context
(megatron/core/transformer/transformer_block.py, `get_cpu_offload_context` and
`group_prefetch_offload_commit_async` after each layer, NVIDIA/Megatron-LM d98e8a6);
what moves and when is Transformer Engine's default scheduling
(transformer_engine/pytorch/cpu_offload.py `DefaultOffloadSynchronizer`, NVIDIA/
TransformerEngine d0067d0, the code path since v2.10). With L layers, N of them
offloaded (layers 0 to N - 1):

- **forward**: when layer i + 1's forward begins (`fwd_step`), layer i's saved tensors
  are copied to pinned host memory on one offload stream (`start_offload`: each copy
  waits for the event recorded when its tensor was saved, so none starts before the
  layer made it); layer L - N + i's forward first waits for that copy to finish
  (`finish_offload_map`, `release_activation_forward_gpu_memory`: the compute stream
  waits on the offload stream's event), then the GPU copy is freed;
- **backward**: when layer L - 1 - N + i's backward begins (`bwd_step`, a hook on the
  layer's output gradient), the offload stream waits for the compute stream
  (`start_reload`: `offload_stream.wait_stream(current_stream)`) and copies layer i back;
  layer i's backward waits for its copies (`pop_tensor`).

Here each layer's copy is one transfer of the layer's activations (cost/memory.py
`offload_layer_bytes`) on the GPU's own offload lane, whose blocking ops run one at a
time in order as the CUDA stream does: device to host when the layer's forward ends,
host to device when layer L - N + i's backward ends; the compute lane's waits for them
are the `offload` breakdown category. The copies cross the GPU's PCIe link (its GPU ->
NIC link outwards, NIC -> GPU back), shared with the NIC's traffic, or, where the GPU
has a host link of its own (`cluster.host_link_gbytes_per_s`: NVLink-C2C on Grace
superchips), take bytes / its bandwidth. Not modelled: copies starting tensor by tensor
inside the layer's forward (here at its end), parts of a layer's backward starting before
all its tensors are back, the tensors Transformer Engine leaves on the GPU (fewer than
256 Ki elements), and the copies' use of HBM bandwidth (docs/memory.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..cost.memory import offload_layer_bytes
from ..ir.flows import Collective, Transfer, delay
from ..ir.units import us_to_s
from ..ir.vocabulary import OFFLOAD, OFFLOAD_STREAM
from ..scenario import Scenario
from .gpuops import GpuOps

# the two directions, and which end of the GPU's PCIe link each leaves from
TO_HOST, FROM_HOST = "D2H", "H2D"


class Offload:
    """One simulated GPU's offload stream: `after_forward` and `before_forward` around
    each layer's forward, `before_backward` before each layer's backward (rank-local
    layer indices, which are the model's: offloading runs with PP 1)."""

    def __init__(self, gpu: GpuOps, scenario: Scenario) -> None:
        self.gpu = gpu
        self.layer_bytes = offload_layer_bytes(scenario)
        self.n = len(self.layer_bytes)
        self.layers = scenario.model.num_layers
        self.lane = gpu.new_lane(OFFLOAD_STREAM)
        self.host_bytes_per_s = scenario.cluster.host_link_bytes_per_s
        self.latency_s = us_to_s(scenario.cluster.pcie_latency_us)
        self._transfers: dict[tuple[str, float], Collective] = {}
        # the copy op of each offloaded layer, the current pass's (by layer index)
        self.copies: dict[tuple[str, int], int] = {}

    # -- the forward --------------------------------------------------------------------

    def before_forward(self, index: int) -> list[object]:
        """Layer ``index``'s forward waits for layer index - (L - N)'s copy to the host."""
        i = index - (self.layers - self.n)
        if 0 <= i < self.n:
            return [self.copies[(TO_HOST, i)]]
        return []

    def after_forward(self, label: str, mb: int, index: int) -> None:
        """Layer ``index``'s activations leave for the host once its forward is done."""
        if index < self.n:
            self.copy(TO_HOST, label, mb, index)

    # -- the backward -------------------------------------------------------------------

    def before_backward(self, label: str, mb: int, index: int) -> list[object]:
        """At layer ``index``'s backward: layer index - (L - 1 - N)'s reload starts after
        everything the compute stream has run so far; layer ``index`` waits for its own."""
        i = index - (self.layers - 1 - self.n)
        if 0 <= i < self.n:
            self.copy(FROM_HOST, label, mb, i)
        if index < self.n:
            return [self.copies[(FROM_HOST, index)]]
        return []

    # -- the copies ---------------------------------------------------------------------

    def copy(self, direction: str, label: str, mb: int, layer: int) -> None:
        """One layer's copy on the offload lane, after the compute lane's last op."""
        gpu = self.gpu
        after = gpu.last_key(gpu.lane)
        self.copies[(direction, layer)] = gpu.builder.add(
            self.lane,
            OFFLOAD,
            f"{label} {direction} layer {layer}",
            microbatch=mb,
            transfer=self.transfer(direction, self.layer_bytes[layer]),
            deps=[after],
        )

    def transfer(self, direction: str, nbytes: float) -> Collective:
        """A copy of ``nbytes`` each of the lane's GPUs makes, one phase (a lane of a
        whole TP group copies on each of its GPUs' links at once)."""
        key = (direction, nbytes)
        found = self._transfers.get(key)
        if found is None:
            found = self._transfers[key] = (self._build(direction, nbytes),)
        return found

    def _build(self, direction: str, nbytes: float) -> Transfer:
        if self.host_bytes_per_s is not None:  # a link of the GPU's own: nothing shares it
            return delay(self.latency_s + nbytes / self.host_bytes_per_s)
        comm = self.gpu.comm
        fabric = comm.fabric
        if fabric.pcie_links is None:
            raise ValueError("this cluster cannot say where a GPU's PCIe link is")
        end = 0 if direction == TO_HOST else 1
        parts = [
            Transfer((fabric.pcie_links(gpu)[end],), (1.0,), nbytes, self.latency_s)
            for gpu in self._gpus()
        ]
        if comm.ranks is not None:  # exact mode's congruent groups: each rank its own link
            comm.ranks.check(parts)
        links = tuple(sorted(part.links[0] for part in parts))
        return Transfer(links, (1.0,) * len(links), nbytes, self.latency_s)

    def _gpus(self) -> Sequence[int]:
        """The GPUs whose copies the lane's transfer carries: the lane's own (symmetric
        mode's copies each cross their own GPU's link, which no copy of the
        representative's shares, so they change no rate: comm/collectives.py `_coupled`
        keeps the representative's links alone), or a whole TP group's."""
        gpu, comm = self.gpu, self.gpu.comm
        if comm.group:
            placement = comm.placement
            return [placement.gpu(t, gpu.d, gpu.stage) for t in range(placement.tensor)]
        return [gpu.gpu]
