"""Errors raised by the runtime."""


class LigerAOTError(RuntimeError):
    pass


class MissingVariantError(LigerAOTError):
    """No usable ahead-of-time binary for a variant, and the JIT fallback is off."""

    def __init__(self, variant_name: str, arch: str, reasons=()):
        self.variant_name = variant_name
        self.arch = arch
        detail = "; ".join(reasons) if reasons else "no artifact set holds it"
        super().__init__(
            f"liger_aot: no ahead-of-time binary for variant {variant_name} on {arch} "
            f"({detail}). Strict mode (LIGER_AOT_STRICT=1) forbids the Triton JIT fallback. "
            f"Build it with `liger-aot build --arch {arch}` and point LIGER_AOT_ARTIFACT_DIR at "
            f"the output, or install the liger-aot-{arch} wheel.")


class LaunchError(LigerAOTError):
    pass
