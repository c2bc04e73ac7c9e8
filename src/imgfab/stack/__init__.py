"""Recipe × Matrix × Host → Stack: the resolver and the run-time toolchain rules (pure, no I/O)."""
