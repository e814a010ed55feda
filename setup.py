"""setuptools entry: `pip install .` / `pip install -e .`.

The package ships kernel_src/ and build_tools/ inside liger_aot (liger_aot/kernel_src and
liger_aot/build_tools are links to the top-level folders). `liger-aot wheel` packs the same
files without setuptools; see build_tools/wheel.py.
"""
from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["liger_aot", "liger_aot.*"]),
    package_dir={"": "."},
    package_data={"liger_aot.kernel_src": ["*/*.py", "tuned/*.json"]},
)
