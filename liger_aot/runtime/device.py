"""Device probe: which artifact arch serves a torch device."""
from __future__ import annotations

import functools

import torch

from liger_aot.artifact_format import TARGETS


def arch_for_capability(major: int, minor: int) -> str | None:
    """sm_80 cubins run on every 8.x device; Triton builds 9.0 as sm_90a, which runs on 9.0
    only. Anything else (Blackwell, Turing) has no AOT set and uses the JIT fallback."""
    if major == 8:
        return "sm80"
    if (major, minor) == (9, 0):
        return "sm90"
    return None


def arch_for_gcn_name(name: str) -> str | None:
    base = name.split(":")[0]  # "gfx942:sramecc+:xnack-" -> "gfx942"
    return base if TARGETS.get(base, ("",))[0] == "hip" else None


@functools.lru_cache(maxsize=None)
def device_arch(device_index: int) -> tuple:
    """(arch or None, human description) of a visible GPU."""
    props = torch.cuda.get_device_properties(device_index)
    if torch.version.hip:
        name = getattr(props, "gcnArchName", "")
        return arch_for_gcn_name(name), f"{props.name} ({name})"
    arch = arch_for_capability(props.major, props.minor)
    return arch, f"{props.name} (sm_{props.major}{props.minor})"


def backend() -> str:
    return "hip" if torch.version.hip else "cuda"
