"""Errors raised by the runtime."""
from liger_aot.artifact_format import TARGETS


class LigerAOTError(RuntimeError):
    pass


class MissingVariantError(LigerAOTError):
    """No usable ahead-of-time binary for a variant, and the JIT fallback is off."""

    def __init__(self, variant_name: str, arch: str, reasons=(), why="LIGER_AOT_STRICT=1"):
        self.variant_name = variant_name
        self.arch = arch
        detail = "; ".join(reasons) if reasons else "no artifact set holds it"
        if arch in TARGETS:
            fix = (f"Build it with `liger-aot build --arch {arch}` and point "
                   f"LIGER_AOT_ARTIFACT_DIR at the output, or install the liger-aot-{arch} wheel.")
        else:
            fix = "Unset it to let Triton JIT-compile the kernel on this device."
        super().__init__(
            f"liger_aot: no ahead-of-time binary for variant {variant_name} on {arch} "
            f"({detail}), and {why} forbids the Triton JIT fallback. {fix}")


class LaunchError(LigerAOTError):
    pass
