"""The benchmark scripts (benchmarks/<name>.py) as modules for the tests, loaded by path
(benchmarks/ is not a package the tests import) once per session."""
import importlib.util
import os
import sys

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "benchmarks")


def load_benchmark(name: str):
    """benchmarks/<name>.py as module bench_<name>; a second call returns the same module."""
    module_name = f"bench_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name,
                                                  os.path.join(BENCHMARKS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module
