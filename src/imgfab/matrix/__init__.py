"""The matrix: compat data loaded and validated, refreshed from PyPI, and the GPU code read from wheels."""
