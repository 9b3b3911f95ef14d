"""The two fp4 weight formats of the W4A16 linear, as data: block size, scale dtypes, scale decode, e2m1 codes.

Both store e2m1 codes two to a byte, the even k in the low nibble, and one scale per block of K elements:
NVFP4 a float8 e4m3 scale per 16 elements times one fp32 tensor scale; MXFP4 (OCP microscaling) an e8m0 byte
`s` per 32 elements, meaning 2^(s-127), with 0xFF NaN and no tensor scale. Every other module reads these
definitions; none restates them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from layouts.constants import ATOM_K

# e2m1 code -> value: bit 3 is the sign, bits 2..1 the exponent, bit 0 the mantissa.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
E2M1_MAX = 6.0
E2M1_EMAX = 2  # exponent of e2m1's largest normal value: 6 = 1.5 * 2^2
E4M3_MAX = 448.0
E8M0_BIAS = 127
E8M0_NAN = 0xFF
K_ALIGN = ATOM_K  # K must be a multiple of 64 (the NVFP4 swizzled atom's K extent; every kernel's granularity)
WEIGHT_DTYPES = (torch.uint8, torch.float4_e2m1fn_x2)
ACTIVATION_DTYPES = (torch.bfloat16, torch.float16)
SCALE_LAYOUTS = ("plain", "swizzled")


@dataclass(frozen=True)
class Fp4Format:
    """One fp4 format: `block` K elements share a scale of one of `scale_dtypes`, which `scale_view` reinterprets
    the bytes as; `has_global` says whether a per-tensor fp32 scale multiplies in; `scale_layouts` lists the scale
    layouts a weight in this format may carry."""

    name: str
    block: int
    scale_dtypes: tuple[torch.dtype, ...]
    scale_view: torch.dtype
    has_global: bool
    scale_layouts: tuple[str, ...]

    def decode_scale(self, scale: torch.Tensor) -> torch.Tensor:
        """fp32 values of the scale bytes (any shape; uint8 or a scale dtype): e4m3, or 2^(s-127) with 0xFF NaN."""
        return scale.view(torch.uint8).view(self.scale_view).float()


NVFP4 = Fp4Format("nvfp4", 16, (torch.float8_e4m3fn,), torch.float8_e4m3fn, True, SCALE_LAYOUTS)
MXFP4 = Fp4Format("mxfp4", 32, (torch.uint8, torch.float8_e8m0fnu), torch.float8_e8m0fnu, False, ("plain",))
FORMATS = {f.name: f for f in (NVFP4, MXFP4)}


def e2m1_table(device) -> torch.Tensor:
    """The 16 e2m1 values as an fp32 tensor on `device`, indexed by code."""
    return torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)


def format_of(fmt) -> Fp4Format:
    """The Fp4Format named `fmt` ("nvfp4" or "mxfp4"); ValueError naming `fmt` otherwise."""
    found = FORMATS.get(fmt) if isinstance(fmt, str) else None
    if found is None:
        raise ValueError(f"fmt: expected one of {tuple(FORMATS)}, got {fmt!r}")
    return found
