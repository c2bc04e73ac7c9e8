"""imgfab: a container-image factory for LLM inference.

Kept import-free on purpose: `imgfab --help` and `imgfab render` must start fast, and the
in-image probe imports `imgfab.in_image.rules` / `imgfab.in_image.probe` without the host's dependencies.
"""

__version__ = "0.1.0"
