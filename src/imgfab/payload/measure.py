"""Measure the payload inside a built image and hold it against what the resolver predicted.

After every build (:func:`imgfab.docker.build.build_recipe`), :func:`check_image` runs a stdlib-only
script inside the image (``docker run --network none``, the image's own ``/opt/venv`` Python,
no GPU needed) that reports:

- every installed ``nvidia-*`` / ``cuda-toolkit`` distribution and its version, hence the CUDA
  runtime the payload really brings (``nvidia-cuda-runtime(-cuXX)``);
- the SASS and PTX architectures of the CUDA libraries the matrix describes
  (``torch/lib/libtorch_cuda.so``, the backend's ``_C`` libraries), read whole from their ELF
  ``.nv_fatbin`` with :mod:`imgfab.in_image.fatbin` (shipped in the script's text, not in the image).

:func:`compare` turns a disagreement into a :class:`Mismatch` naming the compat row to fix:
a different CUDA runtime, or a predicted architecture the library does not carry. A library
that carries *more* than the row (the row was read from the first fat binaries only) is a note.
The measured values become labels (``org.imgfab.measured.*``) on the image.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from imgfab.in_image.rules import compare_versions

LABEL = "org.imgfab.measured"

# Libraries measured in the image, by site-packages-relative path; the first present per key.
LIBRARIES = {
    "torch": ("torch/lib/libtorch_cuda.so",),
    "vllm": ("vllm/_C.abi3.so", "vllm/_C_stable_libtorch.abi3.so"),
    "tensorrt-llm": ("tensorrt_llm/libs/libtensorrt_llm.so",),
}
RUNTIME_DISTS = ("nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime")

# Runs inside the image after fatbin.py's text: argv[1] is the JSON list of (key, paths).
_MEASURE = r'''
import importlib.metadata, json, mmap, os, sys, sysconfig

def _measure(wanted):
    site = os.environ.get("IMGFAB_SITE") or sysconfig.get_paths()["purelib"]
    dists = {}
    for dist in importlib.metadata.distributions(path=[site]):
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name.startswith("nvidia-") or name == "cuda-toolkit":
            dists[name] = dist.version
    libraries = {}
    for key, paths in wanted:
        for rel in paths:
            path = os.path.join(site, rel)
            if not os.path.exists(path):
                continue
            with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
                found = archs_in_elf(data)
                libraries[key] = {"path": rel, "sass": sorted_archs(found.sass),
                                  "ptx": sorted_archs(found.ptx), "blobs": found.blobs}
            break
    return {"site": site, "dists": dict(sorted(dists.items())), "libraries": libraries,
            "torch_lib": os.path.isdir(os.path.join(site, "torch", "lib"))}

print(json.dumps(_measure(json.loads(sys.argv[1]))))
'''


def measure_script() -> str:
    """The self-contained Python program run inside the image (fatbin.py + the measurement)."""
    source = (resources.files("imgfab.in_image") / "fatbin.py").read_text(encoding="utf-8")
    source = source.replace("from __future__ import annotations\n", "")
    return "from __future__ import annotations\n" + source + _MEASURE


@dataclass(frozen=True)
class Measured:
    dists: dict[str, str]
    libraries: dict[str, dict[str, Any]]
    torch_lib: bool = True  # site-packages/torch/lib exists (any real torch build, CPU or CUDA)

    @property
    def stand_in(self) -> bool:
        """No torch/lib and no nvidia-* distribution: a stand-in payload (the test index's empty
        torch), not a torch build. A CPU-only torch still has torch/lib and is measured (and fails)."""
        return not self.torch_lib and not self.dists and not self.libraries

    @property
    def cuda_runtime(self) -> str:
        """The nvidia-cuda-runtime(-cuXX) version installed, without a build suffix ('' if none)."""
        for name in RUNTIME_DISTS:
            if name in self.dists:
                return ".".join(self.dists[name].split(".")[:3])
        return ""


@dataclass
class Comparison:
    mismatches: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)


def _runtime_of(stack: dict[str, Any], matrix: Any) -> str:
    """The cudart version the stack predicts (torch's pin through the runtimes table)."""
    torch = matrix.torch.get(stack["torch"]) if stack.get("torch") else None
    if torch is None or not torch.cuda_runtime:
        return ""
    if torch.cuda_runtime in matrix.runtimes:
        return torch.cuda_runtime
    # torch ≥ 2.11 pins the cuda-toolkit metapackage: the cudart its row records it pins (13.0.3
    # pins 13.0.96, first shipped by 13.0.2), else the runtimes row of that toolkit.
    toolkit = matrix.toolkits.get(torch.cuda_runtime)
    if toolkit is not None and toolkit.cudart:
        return toolkit.cudart
    return next((r.cudart for r in matrix.runtimes.values() if r.toolkit == torch.cuda_runtime),
                torch.cuda_runtime)


def compare(stack: dict[str, Any], matrix: Any, measured: Measured) -> Comparison:
    """Predicted (the resolved stack and its matrix rows) vs measured (inside the image)."""
    result = Comparison()
    if measured.stand_in:
        result.notes.append("payload not measured: no torch/lib, no nvidia-* distribution and no CUDA "
                            "library in the image (a stand-in payload, not a torch build)")
        return result
    torch_row = f"compat/torch.yaml torch {stack.get('torch')}"
    backend_file = {"vllm": "vllm.yaml", "tensorrt-llm": "tensorrt_llm.yaml"}[stack["backend"]]
    backend_row = f"compat/{backend_file} {stack['backend']} {stack['backend_version']}"

    predicted = _runtime_of(stack, matrix)
    actual = measured.cuda_runtime
    result.labels[f"{LABEL}.cuda_runtime"] = actual
    if predicted and actual and compare_versions(predicted, actual) != 0:
        result.mismatches.append(f"the image brings CUDA runtime {actual} (nvidia-cuda-runtime), the "
                                 f"matrix predicted {predicted}: fix cuda_runtime of {torch_row}")
    elif predicted and not actual:
        result.mismatches.append(f"no nvidia-cuda-runtime distribution in the image (a CPU-only torch?), "
                                 f"the matrix predicted {predicted}: check that the pip index serves "
                                 f"torch's CUDA build, or fix cuda_runtime of {torch_row}")

    torch = matrix.torch.get(stack["torch"]) if stack.get("torch") else None
    release = next((r for r in matrix.releases if r.backend == stack["backend"]
                    and r.version == stack["backend_version"]), None)
    expectations = [("torch", torch_row, list(torch.sass) if torch else [], list(torch.ptx) if torch else []),
                    (stack["backend"], backend_row, list(release.fatbin_sass) if release else [],
                     list(release.fatbin_ptx) if release else [])]
    for key, row, sass, ptx in expectations:
        found = measured.libraries.get(key)
        if found is None:
            if sass or ptx:
                result.notes.append(f"{key}: none of {', '.join(LIBRARIES.get(key, ()))} in the image; "
                                    f"{row} fatbin_* not checked")
            continue
        result.labels[f"{LABEL}.{key}.sass"] = ",".join(found["sass"])
        result.labels[f"{LABEL}.{key}.ptx"] = ",".join(found["ptx"])
        if not sass and not ptx:
            result.notes.append(f"{key}: {row} has no fatbin_sass; measured {found['path']}: SASS "
                                f"{', '.join(found['sass']) or 'none'} (record it there)")
            continue
        missing = sorted(set(sass) - set(found["sass"])) + [f"{a}+PTX" for a in sorted(set(ptx) - set(found["ptx"]))]
        extra = sorted(set(found["sass"]) - set(sass))
        if missing:
            result.mismatches.append(f"{found['path']} has no code for {', '.join(missing)} that {row} "
                                     f"fatbin_sass/fatbin_ptx list: fix that row (measured SASS "
                                     f"{', '.join(found['sass']) or 'none'}; PTX {', '.join(found['ptx']) or 'none'})")
        if extra:
            result.notes.append(f"{found['path']} also carries SASS {', '.join(extra)} beyond {row} "
                                f"(read from its first fat binaries only)")
    return result


def measure_image(ref: str, backend: str, *, engine: Any) -> Measured:
    """Run the measurement inside ``ref`` with ``engine.run_python`` (the caller's engine:
    :mod:`imgfab.docker.engine` in a build). Raises EngineError when the container cannot run."""
    wanted = [("torch", LIBRARIES["torch"]), (backend, LIBRARIES.get(backend, ()))]
    output = engine.run_python(ref, measure_script(), [json.dumps(wanted)])
    data = json.loads(output.strip().splitlines()[-1])
    return Measured(dists=data["dists"], libraries=data["libraries"], torch_lib=data.get("torch_lib", True))


def check_image(ref: str, stack: dict[str, Any], matrix: Any, *, engine: Any) -> Comparison:
    """Measure ``ref`` and compare; raises ValidationFailed naming the row to fix on a mismatch."""
    from imgfab.errors import ValidationFailed  # noqa: PLC0415

    result = compare(stack, matrix, measure_image(ref, stack["backend"], engine=engine))
    if result.mismatches:
        raise ValidationFailed(f"{ref}: the payload disagrees with the matrix: {result.mismatches[0]}"
                               + (f" (+{len(result.mismatches) - 1} more)" if len(result.mismatches) > 1 else ""),
                               field="compat", fix="correct the named row (or run `imgfab compat refresh`) "
                                                   "and build again")
    return result


__all__ = ["Measured", "Comparison", "compare", "measure_image", "measure_script", "check_image"]
