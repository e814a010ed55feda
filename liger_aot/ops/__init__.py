"""Ops: one module per op family (autograd Functions over the AOT kernels). The functional
forms are collected in liger_aot.transformers.functional."""
