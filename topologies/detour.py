"""Routes after a NIC's cable failed and the job restarted without that NIC.

NCCL fails the job when a port goes down; on the restart its IB transport leaves out
ports that are not active and its topology search gives each GPU the nearest NIC that
is left (docs/what-if.md, "A failed NIC cable"). Here a GPU that used the failed NIC is
*detoured*: its traffic to other servers goes up its own PCIe link (to its PCIe
switch) and then down the PCIe link of the NIC it now uses, which in the node model is
the PCIe cable of that NIC's first GPU (the ``via`` GPU), and leaves through that NIC's
cable; traffic to it comes back the same way. Inside an NVLink domain nothing changes.

Every cluster (``Cluster``, the pattern clusters) routes through `Detours.route`, which
finds the route as its cabling gives it (``_find_route``) between the detoured GPUs'
``via`` GPUs and adds their own PCIe links at the ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple


class Detour(NamedTuple):
    via: int  # the GPU whose NIC (and its PCIe link) the detoured GPU now uses
    up: int  # the detoured GPU's own PCIe link, towards its NIC's side
    down: int  # and back
    nic: tuple  # the NIC it now uses, ("nic", server, k)


class Detours:
    """Routes, cached, with the detoured GPUs' (none unless `detour` was called). The
    class using it sets ``_routes`` (a dict) and has ``_find_route`` and
    ``nvlink_domain_of``."""

    detours: Mapping[int, Detour] = MappingProxyType({})
    _routes: dict[tuple[int, int], tuple[int, ...]]  # set by the class using it

    if TYPE_CHECKING:  # what the class using it has (declared for the type checker only)

        def _find_route(self, src_gpu: int, dst_gpu: int) -> tuple[int, ...]: ...

        def nvlink_domain_of(self, gpu: int) -> int: ...

    def route(self, src_gpu: int, dst_gpu: int) -> tuple[int, ...]:
        """Link indices from one GPU to another (empty for a GPU to itself)."""
        key = (src_gpu, dst_gpu)
        route = self._routes.get(key)
        if route is None:
            route = self._routes[key] = self._detoured(src_gpu, dst_gpu)
        return route

    def route_once(self, src_gpu: int, dst_gpu: int) -> tuple[int, ...]:
        """`route`'s answer without keeping it: for routes asked once (the congruent
        copies of a collective, whose links only count toward the representative's)."""
        if not self.detours:  # what the cache would hold: the cabling's route
            return self._find_route(src_gpu, dst_gpu)
        route = self._routes.get((src_gpu, dst_gpu))
        return self._detoured(src_gpu, dst_gpu) if route is None else route

    def own_route(self, src_gpu: int, dst_gpu: int) -> tuple[int, ...]:
        """The route as the cabling gives it, no GPU detoured (not cached)."""
        return self._find_route(src_gpu, dst_gpu)

    def detour(self, detours: Mapping[int, Detour]) -> None:
        """Route GPU ``g``'s traffic to other NVLink domains through ``detours[g]``."""
        self.detours = MappingProxyType({**self.detours, **detours})
        self._routes.clear()

    def _detoured(self, src_gpu: int, dst_gpu: int) -> tuple[int, ...]:
        if not self.detours:
            return self._find_route(src_gpu, dst_gpu)
        a, b = self.detours.get(src_gpu), self.detours.get(dst_gpu)
        if (a is None and b is None) or (
            self.nvlink_domain_of(src_gpu) == self.nvlink_domain_of(dst_gpu)
        ):
            return self._find_route(src_gpu, dst_gpu)
        middle = self._find_route(src_gpu if a is None else a.via, dst_gpu if b is None else b.via)
        return (() if a is None else (a.up,)) + middle + (() if b is None else (b.down,))
