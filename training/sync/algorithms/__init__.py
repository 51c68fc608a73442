"""Pure sync algorithms: tensors and numbers in, tensors and numbers out (no I/O, no threads)."""
