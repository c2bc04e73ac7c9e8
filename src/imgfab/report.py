"""Human-readable output for `resolve` and `matrix` (plain text, stable for golden tests)."""

from __future__ import annotations

from typing import Any

import click

from imgfab.errors import printable
from imgfab.matrix.compat import BackendRelease, Matrix
from imgfab.stack.resolve import Rejection, Resolution


def _say(text: str) -> None:
    """One line for a person; the model id, notes and rejections quote the recipe and the
    weights directory, so no terminal control goes out raw."""
    click.echo(printable(text))


def print_resolution(resolution: Resolution) -> None:
    stack = resolution.stack
    rows = [
        ("backend", f"{stack.backend} {stack.backend_version}"
                    + (f" ({stack.backend_path} path)" if stack.backend != "vllm" else "")),
        ("torch", (stack.torch + (f" (from {stack.torch_index})" if stack.torch_index
                                  and "pypi.org" not in stack.torch_index else "")) if stack.torch else "-"),
        ("payload runtime", f"CUDA runtime {stack.payload_runtime} (CUDA {stack.payload_runtime_toolkit}, "
                            f"from {stack.payload_runtime_from})" if stack.payload_runtime_toolkit else "-"),
        ("tensorrt", stack.tensorrt or "-"),
        ("cuda", stack.cuda + (" (end-of-life tag)" if stack.image_eol else "")),
        ("os / python", f"{stack.os} / Python {stack.python}"),
        ("builder base", stack.builder_image),
        ("runtime base", f"{stack.runtime_image} ({stack.runtime_flavor})"),
        ("gpu", f"{stack.gpu} (compute capability {stack.compute_capability}, {stack.sm})"),
        ("kernels for", ", ".join(stack.archs) + (" (exact: TensorRT engine)" if stack.arch_exact else "")),
        ("precision", f"{stack.precision}, kv-cache {stack.kv_cache_dtype}"),
        ("parallelism", f"tp={stack.tensor_parallel} pp={stack.pipeline_parallel} "
                        f"({stack.tensor_parallel * stack.pipeline_parallel} GPUs per replica"
                        + (f", {stack.tensor_parallel * stack.pipeline_parallel // stack.nodes} on each of "
                           f"{stack.nodes} nodes, Ray" if stack.nodes > 1 else "") + ")"),
        ("fit", stack.fit or "-"),
        ("driver floor", f"{stack.driver_floor} ({stack.driver_policy}; strict {stack.strict_floor}, "
                         f"minor-compat {stack.compat_floor or '-'})"),
        ("NVIDIA_REQUIRE_CUDA", stack.nvidia_require_cuda),
        ("resolved for driver", stack.fleet_driver),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        _say(f"{key:<{width}}  {value}")
    for note in stack.notes:
        _say(f"note: {note}")
    for fact in stack.unconfirmed:
        _say(f"unconfirmed: {fact}")
    if resolution.rejections:
        _say(f"rejected ({len(resolution.rejections)}):")
        for rejection in resolution.rejections:
            _say(f"  {rejection.candidate}: {rejection.constraint}: {rejection.reason}")


def print_host_fit(matrix: Matrix, gpu: str, driver: str, policy: str,
                   rows: list[tuple[BackendRelease, dict[str, Any] | None, list[Rejection]]]) -> None:
    found = matrix.host_gpu(gpu)  # fits_host has already matched it
    _say(f"host: {found.name} (compute capability {found.compute_capability}), "
               f"driver {driver}, policy {policy}")
    fits = [(r, f) for r, f, _ in rows if f is not None]
    _say(f"fits ({len(fits)}):")
    for release, fields in fits:
        assert fields is not None
        _say(f"  {release.backend} {release.version}: CUDA {fields['toolkit'].version} on "
                   f"{fields['os'].name}, driver floor {fields['floor']}")
    _say(f"does not fit ({len(rows) - len(fits)}):")
    for release, fields, failures in rows:
        if fields is None:
            _say(f"  {release.backend} {release.version}: "
                       + "; ".join(f"{f.constraint}: {f.reason}" for f in failures))
    for label, why in matrix.dropped:
        _say(f"  {label}: dropped at load: {why}")
