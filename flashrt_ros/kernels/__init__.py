"""Triton kernels, one op per module, each with a plain-torch reference beside it."""
