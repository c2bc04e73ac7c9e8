"""The in-image probe (``imgfab-probe``): does this host run this image?

Shipped into every image as ``/opt/imgfab/imgfab/{__init__,rules,probe}.py`` and run as
``/opt/venv/bin/python -m imgfab.in_image.probe`` (``PYTHONPATH=/opt/imgfab``) first thing at container
start, and on demand (``docker exec CONTAINER python -m imgfab.in_image.probe --json``).

Standard library only at import time: NVML is reached through ``pynvml`` (package
``nvidia-ml-py``) and CUDA through ``torch``, each imported only when a check runs and only if
importable. The rules are :mod:`imgfab.in_image.rules`, the same code that resolved the image's stack.

Input: the image's facts, a JSON object whose keys are the image's labels (``org.imgfab.*``),
default ``/opt/imgfab/image.json``, flag ``--image-json PATH``.

Checks, each printed as one line (``PASS``/``FAIL``/``NOT RUN``/``SKIP``) with the fix:

``driver``     host driver (NVML ``nvmlSystemGetDriverVersion``) vs ``driver.floor`` and policy,
               and vs ``driver.ceilings``: NVIDIA's last driver branch for a visible GPU's
               architecture (Volta ``7.0:580``)
``mode``       which compatibility mode the container really runs in: the kernel driver
               (``/proc/driver/nvidia/version``) vs the libcuda actually loaded (its path in
               ``/proc/self/maps`` and ``cuDriverGetVersion``): ``native``, ``minor-compat``,
               or ``forward-compat`` (a libcuda from ``/usr/local/cuda*/compat``); a strict or
               minor-compat image found in forward-compat fails. SKIP when no libcuda loads
``arch``       each visible GPU's compute capability vs ``archs`` (exactly, when
               ``arch.exact`` is ``true``: a TensorRT engine; else CUDA binary compatibility).
               The probe never looks a GPU up by its name (it carries no compat/gpus.yaml):
               NVML's compute capability is compared with the labels, so a GPU is judged
               whether the matrix names it or not
``precision``  each visible GPU vs the precision's ``min_cc`` / ``max_cc``
``cuda``       a 256×256 float32 matmul on every GPU torch sees, compared with the CPU result;
               without torch the check is NOT RUN, which is not a pass
``shm``        ``/dev/shm`` size vs ``shm.min_bytes``, taken as the whole container's need
               (the recipe's ``image.shm_size``, which the recipe sizes for its tp×pp). The
               probe does not scale it by tp again: one owner for the number, and the line
               prints tp and pp beside it
``fit``        the model (its ``config.json`` and safetensors headers under ``model.mount``, else
               the facts the recipe declared, label ``fit.facts``) on the GPUs NVML sees, served
               as label ``fit.serving`` says (:mod:`imgfab.in_image.fit`): at least tp × pp GPUs,
               heads that tp splits, a max length within the model's positions, and weights plus
               one full-length sequence's KV cache within ``gpu_memory_utilization`` × the
               smallest of those GPUs' memory × tp × pp. SKIP when the facts are unknown
``weights``    the ``model.mount`` directory exists, is readable, and holds a file matching
               each entry of ``weights.required`` (comma-separated; ``a|b`` = either)

Exit codes (the first that applies, in this order):

====  ==========================================================================================
4     image is wrong: image.json missing or garbled, torch import broken, CUDA matmul wrong or
      failing while driver and arch are fine
3     host is wrong: driver below the floor, GPU arch not covered, precision not supported by
      the GPU, ``/dev/shm`` too small, a model that cannot fit the GPUs seen, weights mount missing/unreadable/incomplete (a matmul
      failure counts here when the driver or arch check already failed)
5     cannot check: no NVML (``pynvml`` missing, or no driver library: container started
      without ``--gpus``), no GPU visible, or a check NOT RUN (torch absent)
0     every check that was not skipped with ``--skip`` passed
2     bad command line (argparse)
====  ==========================================================================================

Example::

    $ python -m imgfab.in_image.probe --skip weights
    PASS driver: driver 580.95.05 ≥ 570.124.06 (CUDA 12.8.1, strict)
    PASS arch: GPU0 NVIDIA H100 80GB HBM3 (compute capability 9.0) is covered by kernels for ...
    ...
    probe: exit 0 (all checks passed)
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from imgfab.in_image import fit, rules
from imgfab.in_image.facts import (CudaMode, CudaRunner, HostFacts, ImageFacts, ImageFactsError,
                                   Nvml, load_cuda_runner, load_image_facts, load_nvml,
                                   read_cuda_mode, read_host)

DEFAULT_IMAGE_JSON = "/opt/imgfab/image.json"
DEFAULT_SHM_PATH = "/dev/shm"

EXIT_OK = 0
EXIT_HOST_WRONG = 3
EXIT_IMAGE_WRONG = 4
EXIT_CANNOT_CHECK = 5
EXIT_MEANING = {
    EXIT_OK: "all checks passed",
    EXIT_HOST_WRONG: "host is wrong",
    EXIT_IMAGE_WRONG: "image is wrong",
    EXIT_CANNOT_CHECK: "cannot check",
}

CHECKS = ("driver", "mode", "arch", "precision", "cuda", "shm", "fit", "weights")

PASS, FAIL, NOT_RUN, SKIP = "PASS", "FAIL", "NOT RUN", "SKIP"
HOST, IMAGE = "host", "image"

_GPU_FLAG_FIX = "start the container with --gpus all (NVIDIA Container Toolkit)"


@dataclass(frozen=True)
class Finding:
    """One printed line: a :class:`rules.Verdict` plus whose fault a failure is.

    ``status`` is PASS, FAIL, NOT RUN or SKIP; ``blame`` is ``"host"`` or ``"image"`` for a
    FAIL, empty otherwise.
    """

    verdict: rules.Verdict
    status: str
    blame: str = ""

    def line(self) -> str:
        return f"{self.status} {self.verdict.line()}"

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.verdict.check, "status": self.status, "blame": self.blame,
                "reason": self.verdict.reason, "fix": self.verdict.fix, "line": self.line()}


def _judged(verdict: rules.Verdict, blame: str) -> Finding:
    return Finding(verdict, PASS if verdict.ok else FAIL, "" if verdict.ok else blame)


def _not_run(check: str, reason: str, fix: str = "") -> Finding:
    return Finding(rules.Verdict(False, check, reason, fix), NOT_RUN)


# TF32 or a different summation order moves a float32 256×256 product by ~1e-3 relative at
# most; a wrong kernel or a broken device gives O(1). 1e-2 separates the two with room.
MATMUL_TOLERANCE = 1e-2


def check_driver(facts: ImageFacts, host: HostFacts) -> list[Finding]:
    if host.driver is None:
        return [_not_run("driver", host.error or "no driver version", _GPU_FLAG_FIX)]
    # The floor comes from the payload's newest CUDA runtime (label cuda.runtime), not from
    # the base image's patch release (label cuda): name the one that sets it.
    verdict = rules.check_driver(host.driver, floor=facts.driver_floor,
                                 policy=facts.driver_policy, cuda=facts.cuda_runtime or facts.cuda,
                                 strict_floor=facts.strict_floor,
                                 compat_floor=facts.compat_floor)
    findings = [_judged(verdict, HOST)]
    # NVIDIA's last driver branch for a GPU's architecture (label driver.ceilings): a newer
    # driver does not support that GPU, whatever the floor says.
    ceilings = dict(facts.driver_ceilings)
    for gpu in host.gpus:
        if rules.major_minor(gpu.compute_capability) in ceilings:
            findings.append(_judged(rules.check_driver_ceiling(
                host.driver, gpu.compute_capability, ceilings=ceilings,
                gpu=f"GPU{gpu.index} {gpu.name}"), HOST))
    return findings


def check_mode(facts: ImageFacts, mode: CudaMode | None) -> list[Finding]:
    """Which compatibility mode the container runs in, judged against the image's policy."""
    if mode is None:
        return [Finding(rules.Verdict(True, "mode", "no libcuda.so.1 could be loaded: mode not "
                                                    "determined"), SKIP)]
    runtime = facts.cuda_runtime or facts.cuda
    seen = (f"kernel driver {mode.kernel_driver or 'unknown'}, libcuda {mode.libcuda_version or '?'} "
            f"({mode.libcuda_path or 'path unknown'}) supports CUDA {mode.libcuda_cuda or '?'}")
    actual = mode.mode
    if actual == "native" and mode.libcuda_cuda and runtime and \
            rules.compare_versions(mode.libcuda_cuda, rules.major_minor(runtime)) < 0:
        actual = rules.MINOR_COMPAT
    if actual == rules.FORWARD_COMPAT and facts.driver_policy != rules.FORWARD_COMPAT:
        return [Finding(rules.Verdict(False, "mode", f"runs in forward-compat ({seen}), but the image "
                                      f"was resolved {facts.driver_policy}",
                                      "rebuild the image with imgfab (its runtime stage removes "
                                      "/usr/local/cuda/compat), or resolve with forward-compat"), FAIL, IMAGE)]
    if actual == rules.MINOR_COMPAT and facts.driver_policy == rules.STRICT:
        return [Finding(rules.Verdict(False, "mode", f"runs in minor-compat ({seen}; the payload needs "
                                      f"CUDA {runtime}), but the image was resolved strict",
                                      "upgrade the host driver, or resolve with minor-compat"), FAIL, HOST)]
    return [Finding(rules.Verdict(True, "mode", f"runs {actual} ({seen}; payload CUDA {runtime}, "
                                                f"{facts.driver_policy} image)"), PASS)]


def _no_gpu(check: str, host: HostFacts) -> list[Finding]:
    reason = host.error or "NVML sees no GPU"
    return [_not_run(check, reason, _GPU_FLAG_FIX)]


def check_arch(facts: ImageFacts, host: HostFacts) -> list[Finding]:
    if not host.gpus:
        return _no_gpu("arch", host)
    if not facts.archs:
        return [Finding(rules.Verdict(True, "arch", "the image's kernel architectures are unknown "
                                      "(unconfirmed matrix row): not checked"), SKIP)]
    return [_judged(rules.check_arch(gpu.compute_capability, list(facts.archs),
                                     exact=facts.arch_exact,
                                     gpu=f"GPU{gpu.index} {gpu.name}"), HOST)
            for gpu in host.gpus]


def check_precision(facts: ImageFacts, host: HostFacts) -> list[Finding]:
    if not host.gpus:
        return _no_gpu("precision", host)
    return [_judged(rules.check_precision(facts.precision, gpu.compute_capability,
                                          min_cc=facts.precision_min_cc,
                                          max_cc=facts.precision_max_cc,
                                          backend=facts.backend,
                                          gpu=f"GPU{gpu.index} {gpu.name}"), HOST)
            for gpu in host.gpus]


def check_cuda(host: HostFacts, runner: CudaRunner | None, torch_error: str | None,
               *, host_at_fault: bool) -> list[Finding]:
    """The matmul check. ``host_at_fault``: driver or arch already failed, so blame the host."""
    blame = HOST if host_at_fault else IMAGE
    fix = ("fix the driver or arch failure above first" if host_at_fault else
           "rebuild the image with a torch built for this CUDA and GPU")
    if torch_error:
        return [Finding(rules.Verdict(False, "cuda", torch_error,
                                      "rebuild the image: its torch does not import"), FAIL,
                        IMAGE)]
    if runner is None:
        return [_not_run("cuda", "torch is not installed in this image, so no CUDA matmul "
                                 "was run", "skip with --skip cuda if the backend has no torch")]
    if not host.gpus:
        return _no_gpu("cuda", host)
    try:
        count, error = runner.device_count(), ""
    except Exception as exc:
        count, error = 0, f": {type(exc).__name__}: {' '.join(str(exc).split())}"
    if count < len(host.gpus):
        return [Finding(rules.Verdict(False, "cuda", f"torch sees {count} CUDA device(s) where "
                                                     f"NVML sees {len(host.gpus)}{error}", fix),
                        FAIL, blame)]
    findings = []
    for index in range(count):
        device = f"cuda:{index}"
        try:
            err = runner.matmul_error(device)
        except Exception as exc:
            reason = f"matmul on {device} failed: {type(exc).__name__}: " \
                     f"{' '.join(str(exc).split())}"
            findings.append(Finding(rules.Verdict(False, "cuda", reason, fix), FAIL, blame))
            continue
        if err <= MATMUL_TOLERANCE:
            reason = f"matmul on {device} matches the CPU (relative error {err:.1e})"
            findings.append(Finding(rules.Verdict(True, "cuda", reason), PASS))
        else:
            reason = (f"matmul on {device} differs from the CPU by {err:.1e} (relative; "
                      f"tolerance {MATMUL_TOLERANCE:.0e})")
            findings.append(Finding(rules.Verdict(False, "cuda", reason, fix), FAIL, blame))
    return findings


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def check_shm(facts: ImageFacts, shm_path: str) -> list[Finding]:
    try:
        stat = os.statvfs(shm_path)
    except OSError as exc:
        return [Finding(rules.Verdict(False, "shm", f"{shm_path} cannot be read: {exc}",
                                      f"start the container with --shm-size="
                                      f"{-(-facts.shm_min_bytes // 2**30)}g"), FAIL, HOST)]
    size = stat.f_frsize * stat.f_blocks
    need = facts.shm_min_bytes
    where = f"tp={facts.tp} pp={facts.pp}"
    if size >= need:
        return [Finding(rules.Verdict(True, "shm", f"{shm_path} is {_size(size)} ≥ "
                                                   f"{_size(need)} ({where})"), PASS)]
    return [Finding(rules.Verdict(False, "shm",
                                  f"{shm_path} is {_size(size)}, below the {_size(need)} this "
                                  f"image needs ({where})",
                                  f"start the container with --shm-size="
                                  f"{-(-need // 2**30)}g or --ipc=host"), FAIL, HOST)]


def check_fit(facts: ImageFacts, host: HostFacts) -> list[Finding]:
    """The model on the GPUs this container sees (see the module docstring, ``fit``)."""
    if not facts.fit_serving:
        return [Finding(rules.Verdict(True, "fit", "the image declares no serving shape "
                                                   "(built before the fit check): not checked"), SKIP)]
    try:
        serving = fit.Serving.from_label(facts.fit_serving)
        declared = fit.ModelFacts.from_label(facts.fit_facts)
    except fit.FactsError as exc:
        return [Finding(rules.Verdict(False, "fit", f"label fit.*: {exc}",
                                      "rebuild the image with imgfab"), FAIL, IMAGE)]
    model, where = declared, "the recipe's model.facts"
    if facts.model_mount and os.path.isfile(os.path.join(facts.model_mount, "config.json")):
        try:
            model = fit.ModelFacts(**(declared.as_dict() | fit.read_model_dir(facts.model_mount).as_dict()))
            where = f"{facts.model_mount}/config.json"
        except fit.FactsError as exc:
            return [Finding(rules.Verdict(False, "fit", str(exc), f"mount the model's own files at "
                                                                  f"{facts.model_mount}"), FAIL, HOST)]
    if not host.gpus:
        return _no_gpu("fit", host)
    shape = f"tp={serving.tp} pp={serving.pp}" + (f" over {serving.nodes} nodes" if serving.nodes > 1 else "")
    if len(host.gpus) < serving.gpus_per_node:
        return [Finding(rules.Verdict(False, "fit", f"sees {len(host.gpus)} GPU(s); the image serves "
                                                    f"on {serving.gpus_per_node} per node ({shape})",
                                      f"start the container with {serving.gpus_per_node} GPUs "
                                      f"(--gpus all on a host that has them)"), FAIL, HOST)]
    problem = fit.positions_problem(model, serving.max_len) or fit.heads_problem(model, serving.tp)
    if problem:
        return [Finding(rules.Verdict(False, "fit", f"{problem} (from {where})",
                                      "mount the model the image was built for, or rebuild with "
                                      "a recipe that fits it"), FAIL, HOST)]
    need = fit.need_of(model, serving)
    if need is None:
        return [Finding(rules.Verdict(True, "fit", f"fit not checked: {where} lacks "
                                      f"{', '.join(model.missing(('parameters', 'layers', 'kv_heads', 'head_size')))}"),
                        SKIP)]
    used = host.gpus[:serving.gpus_per_node]  # every node alike: the smallest GPU here decides
    sizes = [g.memory_bytes for g in used]
    if any(size is None for size in sizes):
        return [Finding(rules.Verdict(True, "fit", "NVML does not report the GPUs' memory: "
                                                   "fit not checked"), SKIP)]
    smallest = min(sizes)  # type: ignore[type-var]
    text = f"{serving.gpus}× {used[sizes.index(smallest)].name} ({smallest / 2**30:.1f} GiB)"
    problem = fit.memory_problem(need, memory_bytes=smallest, serving=serving, gpus_text=text)
    if problem:
        return [Finding(rules.Verdict(False, "fit", f"the model ({where}) {problem}",
                                      "run on GPUs with more memory, or rebuild with more GPUs "
                                      "(target.count) or a shorter max length"), FAIL, HOST)]
    return [Finding(rules.Verdict(True, "fit", fit.fit_line(need, memory_bytes=smallest, serving=serving,
                                                            gpus_text=text)), PASS)]


def _regular_file(path: str) -> bool:
    """Whether ``path`` is a regular file, after symbolic links (a Hugging Face cache links
    each file to its blob). ``stat`` never opens it, so a FIFO cannot block the probe."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def check_weights(facts: ImageFacts) -> list[Finding]:
    mount = facts.model_mount
    if not mount:
        return [Finding(rules.Verdict(True, "weights",
                                      "the image declares no weights mount"), PASS)]
    fix_mount = f"mount the model directory at {mount} (-v /path/to/model:{mount}:ro)"
    if not os.path.isdir(mount):
        return [Finding(rules.Verdict(False, "weights", f"{mount} does not exist or is not "
                                                        f"a directory", fix_mount), FAIL, HOST)]
    try:
        names = os.listdir(mount)
    except OSError as exc:
        return [Finding(rules.Verdict(False, "weights", f"{mount} cannot be listed: "
                                                        f"{exc.strerror}",
                                      f"make {mount} readable by uid {os.getuid()}"),
                        FAIL, HOST)]
    missing, unreadable, irregular = [], [], []
    for alternatives in facts.weights_required:
        matches = [n for n in sorted(names) if any(fnmatch.fnmatch(n, p) for p in alternatives)]
        if not matches:
            missing.append("|".join(alternatives))
        irregular += [n for n in matches if not _regular_file(os.path.join(mount, n))]
        unreadable += [n for n in matches if not os.access(os.path.join(mount, n), os.R_OK)]
    if missing:
        return [Finding(rules.Verdict(False, "weights", f"{mount} has no {', no '.join(missing)}",
                                      f"{fix_mount}, holding the full model"), FAIL, HOST)]
    if irregular:  # a directory or a FIFO named config.json would hang or fail the server later
        return [Finding(rules.Verdict(False, "weights", f"{mount}: "
                                                        f"{', '.join(irregular[:3])} is not a "
                                                        f"regular file",
                                      f"{fix_mount}, holding the model's files as they were "
                                      f"downloaded"), FAIL, HOST)]
    if unreadable:
        return [Finding(rules.Verdict(False, "weights", f"{mount}: cannot read "
                                                        f"{', '.join(unreadable[:3])}",
                                      f"make the files readable by uid {os.getuid()}"),
                        FAIL, HOST)]
    wanted = ", ".join("|".join(a) for a in facts.weights_required) or "no required files"
    return [Finding(rules.Verdict(True, "weights", f"{mount} is readable and has {wanted}"),
                    PASS)]


@dataclass
class ProbeReport:
    """Everything the probe found; ``exit_code`` follows the table in the module docstring."""

    image_json: str
    exit_code: int
    findings: list[Finding]
    host: HostFacts
    facts: ImageFacts | None

    @property
    def meaning(self) -> str:
        return EXIT_MEANING[self.exit_code]

    def lines(self) -> list[str]:
        return [f.line() for f in self.findings] + [f"probe: exit {self.exit_code} "
                                                    f"({self.meaning})"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "image_json": self.image_json,
            "exit_code": self.exit_code,
            "meaning": self.meaning,
            "host": {"driver": self.host.driver, "nvml_error": self.host.error,
                     "gpus": [{"index": g.index, "name": g.name,
                               "compute_capability": g.compute_capability}
                              for g in self.host.gpus]},
            "checks": [f.to_dict() for f in self.findings],
        }


def exit_code_for(findings: list[Finding]) -> int:
    """Image wrong beats host wrong beats cannot-check (see the module docstring)."""
    if any(f.status == FAIL and f.blame == IMAGE for f in findings):
        return EXIT_IMAGE_WRONG
    if any(f.status == FAIL for f in findings):
        return EXIT_HOST_WRONG
    if any(f.status == NOT_RUN for f in findings):
        return EXIT_CANNOT_CHECK
    return EXIT_OK


_UNSET: Any = object()


def run_probe(image_json: str = DEFAULT_IMAGE_JSON, *, skip: frozenset[str] = frozenset(),
              nvml: Nvml | None = _UNSET,
              cuda: CudaRunner | None = _UNSET, torch_error: str | None = None,
              shm_path: str = DEFAULT_SHM_PATH, cuda_mode: "CudaMode | None" = _UNSET) -> ProbeReport:
    """Run every check not in ``skip``; never raises for a failed check.

    ``nvml`` defaults to ``pynvml`` if importable; pass ``None`` for "no NVML" or an object
    with the :class:`Nvml` methods. ``cuda`` defaults to torch if importable; pass ``None``
    for "torch absent" (with ``torch_error`` for "torch import broken") or a
    :class:`CudaRunner`.
    """
    try:
        facts = load_image_facts(image_json)
    except ImageFactsError as exc:
        finding = Finding(rules.Verdict(False, "image", str(exc),
                                        "run an image built by imgfab; rebuild it if "
                                        "/opt/imgfab was changed"), FAIL, IMAGE)
        return ProbeReport(image_json, EXIT_IMAGE_WRONG, [finding], HostFacts(), None)

    host = HostFacts()
    if {"driver", "arch", "precision", "cuda", "fit"} - skip:
        host = read_host(load_nvml() if nvml is _UNSET else nvml)

    findings: list[Finding] = []

    def cuda_step() -> list[Finding]:
        if not host.gpus:  # nothing to run on: do not pay for importing torch
            return _no_gpu("cuda", host)
        runner, error = load_cuda_runner() if cuda is _UNSET else (cuda, torch_error)
        host_at_fault = any(f.status == FAIL and f.verdict.check in ("driver", "arch")
                            for f in findings)
        return check_cuda(host, runner, error, host_at_fault=host_at_fault)

    steps: dict[str, Callable[[], list[Finding]]] = {
        "driver": lambda: check_driver(facts, host),
        "mode": lambda: check_mode(facts, read_cuda_mode() if cuda_mode is _UNSET else cuda_mode),
        "arch": lambda: check_arch(facts, host),
        "precision": lambda: check_precision(facts, host),
        "cuda": cuda_step,
        "shm": lambda: check_shm(facts, shm_path),
        "fit": lambda: check_fit(facts, host),
        "weights": lambda: check_weights(facts),
    }
    for name in CHECKS:
        if name in skip:
            findings.append(Finding(rules.Verdict(True, name, "skipped by --skip"), SKIP))
        else:
            findings.extend(steps[name]())
    return ProbeReport(image_json, exit_code_for(findings), findings, host, facts)


def _skip_list(text: str) -> frozenset[str]:
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    unknown = sorted(names - set(CHECKS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown check(s) {', '.join(unknown)}; "
                                         f"choose from {', '.join(CHECKS)}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="imgfab-probe",
        description="Check that this host can run this image. Exit 0 pass, 3 host is wrong, "
                    "4 image is wrong, 5 cannot check.")
    parser.add_argument("--image-json", default=DEFAULT_IMAGE_JSON,
                        help=f"the image's labels as JSON (default {DEFAULT_IMAGE_JSON})")
    parser.add_argument("--json", action="store_true", help="print a JSON report")
    parser.add_argument("--skip", type=_skip_list, default=frozenset(),
                        help=f"comma-separated checks to skip: {','.join(CHECKS)}")
    parser.add_argument("--shm-path", default=DEFAULT_SHM_PATH, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    report = run_probe(args.image_json, skip=args.skip, shm_path=args.shm_path)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print("\n".join(report.lines()))
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
