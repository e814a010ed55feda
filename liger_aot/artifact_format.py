"""What an artifact set looks like: targets, manifest format, launch ABI. Pure Python, read
by the build and the runtime alike (imports neither torch nor triton)."""
from __future__ import annotations

# Build targets: arch name -> (backend, Triton target arch, warp size).
TARGETS = {
    "sm80": ("cuda", 80, 32),
    "sm90": ("cuda", 90, 32),
    "gfx90a": ("hip", "gfx90a", 64),
    "gfx942": ("hip", "gfx942", 64),
}
BINARY_EXT = {"cuda": "cubin", "hip": "hsaco"}
MANIFEST_FORMAT = 1
# Launch conventions this loader implements: Triton major.minor -> hidden trailing params.
SUPPORTED_LAUNCH_ABIS = {"triton-3.6": "PP"}
WHEEL_PACKAGE = "liger_aot_{arch}"  # import name of an arch wheel's artifact package
WHEEL_DIST = "liger-aot-{arch}"  # its distribution name


def launch_abi_of(triton_version: str) -> str:
    major_minor = ".".join(triton_version.split(".")[:2])
    return f"triton-{major_minor}"


def validate_manifest(manifest, arch: str) -> str | None:
    """None if the manifest is usable for `arch`, else the reason it is not."""
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        return f"unknown manifest format {found!r} (expected {MANIFEST_FORMAT})"
    if manifest.get("arch") != arch:
        return f"manifest is for arch {manifest.get('arch')!r}, not {arch!r}"
    abi = manifest.get("launch_abi")
    if abi not in SUPPORTED_LAUNCH_ABIS:
        return (f"manifest was built by Triton {manifest.get('triton_version')} (launch ABI "
                f"{abi!r}); this loader supports {', '.join(sorted(SUPPORTED_LAUNCH_ABIS))}")
    if not isinstance(manifest.get("variants"), dict):
        return "manifest has no variants table"
    for name, entry in manifest["variants"].items():
        if not isinstance(entry, dict):
            return f"manifest entry for {name} is not a table"
    return None
