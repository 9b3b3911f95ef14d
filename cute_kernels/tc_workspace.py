"""Host side of the GEMVs on a K-balanced split schedule (the sm_100a tensor-core kernel, cute_kernels.gemv_tc_sm100,
and the sm_90 CUDA-core one, gemv_simt.GemvSimtBalanced): their split-K workspace and one launch.

Each kernel leaves fp32 partials of tiles split across CTAs in a workspace. The tensor-core kernel counts arrivals
per output tile in int32 counters that it returns to zero; the CUDA-core one needs none, and puts every partial
word it reads back to the kernel's PARTIAL_FILL. Calls on different CUDA streams must not share a workspace, so it
is kept per (device, stream); a new one is initialized on the stream it serves before its first launch.
"""

from __future__ import annotations

from cute_kernels import tile_scheduler as ts
from cute_kernels.gemv_tc_sm100 import GemvTcSm100


class Workspace:
    """fp32 partials and int32 arrival counters of one (device, stream), grown on demand."""

    def __init__(self):
        self.partial = None
        self.arrival = None

    def get(self, device, partial_elems: int, counters: int, fill: int | None = None):
        """The partials (uninitialized, or every word `fill` as int32 bits) and the zeroed counters, at least this
        large; a kernel that fills partials leaves them as it found them."""
        import torch

        if self.partial is None or self.partial.numel() < partial_elems:
            if fill is None:
                self.partial = torch.empty(partial_elems, dtype=torch.float32, device=device)
            else:
                self.partial = torch.full((partial_elems,), fill, dtype=torch.int32, device=device).view(torch.float32)
        if self.arrival is None or self.arrival.numel() < counters:
            self.arrival = torch.zeros(counters, dtype=torch.int32, device=device)
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


class SplitLauncher:
    """`(a, b, sf_a, sf_b, c) -> None` for a compiled kernel on a K-balanced split schedule (`tile_scheduler`):
    picks num_ctas for the shape and the device's SM count (`num_ctas_for(m, k, l, sms)`), supplies the workspace
    that `kernel_cls.workspace_shape(config, num_ctas, m, k, l)` asks for, and makes one launch.

    `fn` is the compiled function, TVM-FFI (torch tensors) or the pointer path (`pointers=True`: the operands'
    addresses and M, K, L; the caller has validated the operands). `workspace_key()` names what the workspace is
    kept per besides the device (the CUDA stream of the launch). The CTA count and the workspace views are worked
    out once per (device, workspace key, M, K, L): a later call is one dictionary lookup and the launch."""

    def __init__(self, fn, kernel_cls, config, num_ctas_for, pointers: bool = False, workspace_key=lambda: None):
        self.fn = fn
        self.kernel_cls = kernel_cls
        self.config = config
        self.num_ctas_for = num_ctas_for
        self.pointers = pointers
        self.workspace_key = workspace_key
        self.workspaces: dict = {}
        self.plans: dict = {}

    def plan(self, a, m: int, k: int, l: int):  # noqa: E741
        """(num_ctas, partial, arrival) of a launch on a's device and the current workspace key."""
        import torch

        dev = a.device.index if a.device.index is not None else torch.cuda.current_device()
        wkey = (dev, self.workspace_key())
        plan = self.plans.get((wkey, m, k, l))
        if plan is None:
            if not self.kernel_cls.can_implement(m, k, l):
                raise ValueError(f"{self.kernel_cls.__name__}: unsupported shape (M, K, L) = ({m}, {k}, {l}); K must "
                                 "be a multiple of 64")
            num_ctas = self.num_ctas_for(m, k, l, sm_count(dev))
            workspace = self.workspaces.setdefault(wkey, Workspace())
            need = self.kernel_cls.workspace_shape(self.config, num_ctas, m, k, l)
            fill = getattr(self.kernel_cls, "PARTIAL_FILL", None)
            plan = self.plans[(wkey, m, k, l)] = (num_ctas, *workspace.get(a.device, *need, fill=fill))
        return plan

    def __call__(self, a, b, sf_a, sf_b, c):
        m, k2, l = a.shape  # noqa: E741
        k = 2 * k2
        num_ctas, partial, arrival = self.plan(a, m, k, l)
        if self.pointers:
            from cute_kernels.compile import operand_addresses

            addresses = operand_addresses(a, b, sf_a, sf_b, c)
            self.fn(*addresses, m, k, l, partial.data_ptr(), arrival.data_ptr(), num_ctas)
        else:
            self.fn(a, b, sf_a, sf_b, c, partial, arrival, num_ctas)


class TcLauncher(SplitLauncher):
    """The SplitLauncher of GemvTcSm100: one CTA per SM, each with at least ts.MIN_K_TILES_PER_CTA K tiles."""

    def __init__(self, fn, config, pointers: bool = False, workspace_key=lambda: None):
        def num_ctas_for(m, k, l, sms):  # noqa: E741
            return ts.choose_num_ctas(m, k, l, sms, config.tile_k)

        super().__init__(fn, GemvTcSm100, config, num_ctas_for, pointers, workspace_key)
