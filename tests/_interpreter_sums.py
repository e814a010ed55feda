"""Triton's interpreter runs a `tl.reduce` whose combine function is not one of Triton's own
element by element, one Python call each (interpreter.ReduceOps.generic_reduce). LayerNorm's
forward reduces its pair of sums (x and x squared) with such a function, `_add_pairs`, which
made its CPU tests the slowest in the suite: 16K Python calls for each 16K-column row.

For combine functions named here, which only add their arguments element-wise, the tests'
interpreter sums each input with NumPy instead, as it does for `tl.sum`. Only the order of
the fp32 additions changes (the GPU's reduction tree has its own order too).
test_interpreter_sums.py checks that each still exists and sums as the interpreter's own
element-by-element reduction does."""
# (module, function) of each combine function that returns the element-wise sums of its
# arguments' halves: f(a1, .., ak, b1, .., bk) = (a1 + b1, .., ak + bk)
ELEMENTWISE_SUMS = (("kernel_src.layer_norm.kernels", "_add_pairs"),)


def _key(fn):
    # kernel_src is importable twice (kernel_src and liger_aot.kernel_src, a link to it), as
    # two modules: match the function by where it is defined, not by identity.
    module = getattr(fn, "__module__", "") or ""
    return module.removeprefix("liger_aot."), getattr(fn, "__name__", None)


def install():
    """Sums the named combine functions' reductions with NumPy in this process's
    interpreter. Needs TRITON_INTERPRET=1 set before triton was imported."""
    from triton.runtime import interpreter

    if getattr(interpreter.ReduceOps.apply_impl, "_sums_installed", False):
        return
    names = set(ELEMENTWISE_SUMS)
    generic = interpreter.ReduceOps.apply_impl

    def apply_impl(self, input):
        if _key(getattr(self.combine_fn, "fn", None)) in names:
            return [self.sum(tensor) for tensor in input]
        return generic(self, input)

    apply_impl._sums_installed = True
    apply_impl.generic = generic  # for the test that compares the two
    interpreter.ReduceOps.apply_impl = apply_impl
