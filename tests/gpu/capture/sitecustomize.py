"""GPU runs only (bench/startup.py): record every Triton launcher stub a serving run builds.

Mounted into the stand-in container with ``PYTHONPATH=<this dir>:/opt/imgfab`` and
``IMGFAB_CAPTURE_LAUNCHERS=<file>``: every Python process of the server (the API server, the
engine core, Inductor's compile workers) wraps Triton's ``make_launcher`` and appends one JSON
line per launcher: the signature as make_launcher took it (tuples as lists), the tensor
descriptor metadata when there is any, and the cache key Triton files it under (sha256 of the
generated source and ``platform_key()``, as ``compile_module_from_src`` computes it). The lines
become a row of compat/triton_launchers.yaml, which the builder's kernels stage compiles
(imgfab-kernels --triton) and checks key by key. Standard library only; silent without the
variable or without Triton.
"""

import hashlib
import json
import os

_OUT = os.environ.get("IMGFAB_CAPTURE_LAUNCHERS")
if _OUT:
    try:
        from triton.backends.nvidia import driver as _driver
        from triton.runtime import build as _build
    except Exception:  # noqa: BLE001 - a process without Triton records nothing
        _driver = None
    if _driver is not None:
        _make = _driver.make_launcher

        def make_launcher(constants, signature, tensordesc_meta):
            src = _make(constants, signature, tensordesc_meta)
            record = {"signature": list(signature.values()),
                      "key": hashlib.sha256((src + _build.platform_key()).encode("utf-8")).hexdigest()}
            if tensordesc_meta:
                record["tensordesc_meta"] = tensordesc_meta
            fd = os.open(_OUT, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            try:
                os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode("utf-8"))
            finally:
                os.close(fd)
            return src

        _driver.make_launcher = make_launcher
