"""Host side of the sm_100a tensor-core GEMV (cute_kernels.gemv_tc_sm100): its split-K workspace and one launch.

The kernel leaves fp32 partials of tiles split across CTAs in a workspace and counts arrivals per output tile in
int32 counters that it returns to zero. Calls on different CUDA streams must not share them, so the workspace is
kept per (device, stream); a new one is zeroed on the stream it serves before its first launch.
"""

from __future__ import annotations

from cute_kernels import tile_scheduler as ts
from cute_kernels.gemv_tc_sm100 import GemvTcSm100


class Workspace:
    """fp32 partials and int32 arrival counters of one (device, stream), grown on demand."""

    def __init__(self):
        self.partial = None
        self.arrival = None

    def get(self, device, num_ctas: int, num_tiles: int):
        import torch

        need_p = ts.workspace_elems(num_ctas)
        if self.partial is None or self.partial.numel() < need_p:
            self.partial = torch.empty(need_p, dtype=torch.float32, device=device)
        if self.arrival is None or self.arrival.numel() < num_tiles:
            self.arrival = torch.zeros(num_tiles, dtype=torch.int32, device=device)
        return self.partial, self.arrival


_SM_COUNTS: dict = {}
_CAPABILITIES: dict = {}


def capability(device) -> tuple[int, int]:
    """The compute capability of CUDA `device` (asked once per device; an index-less device is the current one)."""
    import torch

    idx = device.index if device.index is not None else torch.cuda.current_device()
    cap = _CAPABILITIES.get(idx)
    if cap is None:
        cap = _CAPABILITIES[idx] = torch.cuda.get_device_capability(idx)
    return cap


def sm_count(device_index: int) -> int:
    """The SM count of CUDA device `device_index` (asked once per device)."""
    count = _SM_COUNTS.get(device_index)
    if count is None:
        import torch

        count = _SM_COUNTS[device_index] = torch.cuda.get_device_properties(device_index).multi_processor_count
    return count


class TcLauncher:
    """`(a, b, sfa_permuted, sfb_permuted, c) -> None` for a compiled GemvTcSm100: picks num_ctas for the shape
    and the device's SM count, supplies the workspace, and makes one launch.

    `fn` is the compiled function, TVM-FFI (torch tensors) or the pointer path (`pointers=True`: the operands'
    addresses and M, K, L; the caller has validated the operands). `workspace_key()` names what the workspace is
    kept per besides the device (the CUDA stream of the launch)."""

    def __init__(self, fn, config, pointers: bool = False, workspace_key=lambda: None):
        self.fn = fn
        self.config = config
        self.pointers = pointers
        self.workspace_key = workspace_key
        self.workspaces: dict = {}

    def __call__(self, a, b, sfa_permuted, sfb_permuted, c):
        import torch

        m, k2, l = a.shape  # noqa: E741
        k = 2 * k2
        if not GemvTcSm100.can_implement(m, k, l):
            raise ValueError(f"gemv_tc_sm100: unsupported shape (M, K, L) = ({m}, {k}, {l}); K must be a multiple of 64")
        dev = a.device.index if a.device.index is not None else torch.cuda.current_device()
        num_ctas = ts.choose_num_ctas(m, k, l, sm_count(dev), self.config.tile_k)
        workspace = self.workspaces.setdefault((dev, self.workspace_key()), Workspace())
        partial, arrival = workspace.get(a.device, num_ctas, ts.num_output_tiles(m, l))
        if self.pointers:
            from cute_kernels.compile import operand_addresses

            addresses = operand_addresses(a, b, sfa_permuted, sfb_permuted, c)
            self.fn(*addresses, m, k, l, partial.data_ptr(), arrival.data_ptr(), num_ctas)
        else:
            self.fn(a, b, sfa_permuted, sfb_permuted, c, partial, arrival, num_ctas)
