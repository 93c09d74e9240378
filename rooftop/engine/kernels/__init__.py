"""Kernels behind one function each: torch references here, Triton versions beside them later."""
