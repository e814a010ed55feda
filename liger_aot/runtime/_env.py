"""Environment variables read by the runtime (documented in README.md)."""
import os


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _switch(name: str) -> bool:
    """A switch that is on unless set to 0 / false / no / off."""
    return os.environ.get(name, "1").strip().lower() not in ("0", "false", "no", "off")


def strict() -> bool:
    """LIGER_AOT_STRICT=1: a missing variant is an error, never a JIT compile."""
    return _flag("LIGER_AOT_STRICT")


def jit_fallback_allowed() -> bool:
    """LIGER_AOT_DISABLE_JIT=1 forbids the JIT fallback without strict mode's other checks."""
    return not _flag("LIGER_AOT_DISABLE_JIT")


def artifact_dirs() -> list:
    """LIGER_AOT_ARTIFACT_DIR: os.pathsep-separated roots searched before installed wheels."""
    value = os.environ.get("LIGER_AOT_ARTIFACT_DIR", "")
    return [p for p in value.split(os.pathsep) if p]


def cache_dir() -> str:
    """Default output of `liger-aot build`, also searched last by the runtime."""
    return os.environ.get("LIGER_AOT_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "liger_aot")


def disabled_sources() -> set:
    """LIGER_AOT_IGNORE_CACHE=1 skips the local build cache (useful in tests)."""
    return {"cache"} if _flag("LIGER_AOT_IGNORE_CACHE") else set()


def staged_cross_entropy() -> bool:
    """LIGER_AOT_STAGED_CE=0 keeps cross entropy on its two-pass kernel everywhere (the
    staged one needs all of its grid's programs resident at once: see
    kernel_src/cross_entropy/kernels.py). Read once per device."""
    return _switch("LIGER_AOT_STAGED_CE")


def grouped_norm_backward() -> bool:
    """LIGER_AOT_GROUPED_NORM_BWD=0 keeps RMSNorm, fused add and LayerNorm backwards off the
    grouped kernels (which, like the staged cross-entropy, need all of their grid's programs
    resident at once: see kernel_src/rms_norm/kernels.py). Read once per device."""
    return _switch("LIGER_AOT_GROUPED_NORM_BWD")


def grouped_norm_forward() -> bool:
    """LIGER_AOT_GROUPED_NORM_FWD=0 keeps RMSNorm, fused add and LayerNorm forwards off the
    grouped kernels (whose grids, too, must be resident at once: see
    kernel_src/rms_norm/kernels.py). Read once per device."""
    return _switch("LIGER_AOT_GROUPED_NORM_FWD")
