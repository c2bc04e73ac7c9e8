"""Recipe × Matrix × Host → Stack. Pure: no I/O, deterministic.

:func:`resolve` returns the newest :class:`Stack` that satisfies every constraint, or raises
:class:`~imgfab.errors.CompatibilityError` listing every candidate with the constraint that
eliminated it and the nearest recipe change that would work.

Constraints, checked in this order for each candidate (backend release × OS × CUDA patch):
backend version pin, GPU architecture vs the code of every CUDA library in the payload (torch
and the backend: the intersection), the GPU's own driver minimum, precision vs compute
capability (per backend version range), Python of the OS vs the wheels, the ``nvidia/cuda``
images (supported tags before end-of-life ones), the host driver floor.

The strict driver floor is the driver of the newest CUDA runtime in the payload: the cudart
that torch's wheel pins (``compat/torch.yaml`` ``cuda_runtime`` → ``compat/cuda.yaml``
``runtimes``), plus the image's toolkit when the backend runs on a ``devel`` image (it links
the system CUDA). The ``nvidia/cuda`` base patch of a ``base`` image is not in the payload.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from imgfab.matrix.compat import BackendRelease, CudaToolkit, Gpu, Matrix
from imgfab.errors import CompatibilityError, RecipeError
from imgfab.recipe import Recipe, alias_choices, ambiguous_alias
from imgfab.in_image.rules import (FORWARD_COMPAT, MINOR_COMPAT, MINOR_COMPAT_LIMITS, STRICT,
                                   compare_versions, nvidia_require_cuda, parse_version)
from imgfab.matrix.triton import launchers_for
from imgfab.stack.toolchain import PayloadToolchainUnavailable, runtime_plan
from imgfab.stack.candidates import (_OS_ORDER, _PRIORITY, Payload, Rejection, _torch_pin, covered_archs,
                                     evaluate, payload_floors, payload_of, precision_of,
                                     precisions_to_check)
from imgfab.stack.advisories import advisory_notes, refusal_fix, refused_hits, unknown_acceptances
from imgfab.stack.fit import check_fit
from imgfab.stack.verdicts import IMAGE_PLATFORM
from imgfab.stack.fixes import _field_for, _nearest_fix
from imgfab.in_image.fit import ModelFacts

# The names other stations and the tests use, wherever they live in this station.
__all__ = ["Host", "Rejection", "Resolution", "Stack", "covered_archs", "evaluate", "fits_host",
           "payload_floors", "payload_of", "precision_of", "precisions_to_check", "refuse_cpu_arch",
           "resolve", "_torch_pin"]



@dataclass(frozen=True)
class Host:
    """What is known of the hosts: the oldest driver in the fleet (or one host's exact driver)."""

    driver: str
    gpu: str | None = None


@dataclass(frozen=True)
class Stack:
    """One fully pinned stack. Field values go into the lock file, labels and templates."""

    backend: str
    backend_version: str
    backend_path: str  # vllm | pytorch | engine
    cuda: str
    cuda_minor: str
    os: str
    python: str
    builder_image: str
    runtime_image: str
    runtime_flavor: str
    runtime_packages: tuple[str, ...]
    runtime_toolchain: tuple[str, ...]  # build tools serving needs at run time (verify allows them)
    jit: tuple[str, ...]  # run-time compilers the kernels need here (compat/backends.yaml)
    jit_compiles: tuple[str, ...]  # what serving compiles at start, "name: what" per toolchain
    cuda_home: str  # where the run-time nvcc lives ("" when nothing needs one)
    payload_toolchain: tuple[str, ...]  # payload pins the run-time toolchain adds to the lock
    torch: str
    tensorrt: str
    gpu: str
    compute_capability: str
    sm: str
    archs: tuple[str, ...]
    arch_exact: bool
    precision: str
    precision_min_cc: str
    precision_max_cc: str
    kv_cache_dtype: str
    tensor_parallel: int
    pipeline_parallel: int
    driver_policy: str
    driver_floor: str
    strict_floor: str
    compat_floor: str
    nvidia_require_cuda: str
    fleet_driver: str
    driver_ceilings: tuple[str, ...]  # "7.0:580": NVIDIA's last driver branch per capability the archs run
    payload_runtime: str  # the newest CUDA runtime the payload brings, e.g. "12.8.90"
    payload_runtime_toolkit: str  # the toolkit release that first ships it, e.g. "12.8.1"
    payload_runtime_from: str  # which component brings it, e.g. "torch 2.10.0 (nvidia-cuda-runtime)"
    torch_index: str
    torch_archs: tuple[str, ...]  # SASS (and "+PTX" entries) measured in torch's CUDA library
    backend_archs: tuple[str, ...]  # SASS measured in the backend's own CUDA library
    image_eol: bool
    cuda_compat: str  # "drop": the runtime stage removes /usr/local/cuda/compat; "keep": forward-compat
    notes: tuple[str, ...]
    sources: tuple[str, ...]
    unconfirmed: tuple[str, ...]
    nodes: int = 1  # target.nodes: vLLM on a Ray cluster of this many nodes (tp within, pp across)
    payload_multinode: tuple[str, ...] = ()  # what the payload adds across nodes (backends.yaml)
    fit: str = ""  # the fit check's verdict: "fits: …" with the numbers, or "not checked: …" (stack/fit.py)
    # FlashInfer JIT specs the builder compiles for this GPU alone ("module:generator"), and
    # "name: what" per toolchain so compiled (compat/backends.yaml aot_specs)
    aot_specs: tuple[str, ...] = ()
    aot: tuple[str, ...] = ()
    # Triton's launchers the builder compiles (compat/triton_launchers.yaml): the Triton version
    # they were measured with ("" when none: the runtime keeps its C compiler), and how many.
    triton: str = ""
    triton_launchers: int = 0
    jit_monitor: str = ""  # vLLM's --jit-monitor-mode ("error"; "" leaves the release's default)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key, value in data.items():
            if isinstance(value, tuple):
                data[key] = list(value)
        return data


@dataclass
class Resolution:
    stack: Stack
    rejections: list[Rejection] = field(default_factory=list)


def resolve(recipe: Recipe, matrix: Matrix, host: Host | None = None,
            weights: ModelFacts | None = None, weights_from: str = "", *,
            advisories: bool = True) -> Resolution:
    """Pick the newest stack that fits; raise CompatibilityError naming every rejected candidate.

    The stack found, the fit check (:func:`imgfab.stack.fit.check_fit`): the model facts the
    recipe declares, completed by ``weights`` (read from the weights at ``weights_from``),
    against the GPU's memory × tp × pp; a model that cannot fit is refused (CompatibilityError).
    With ``advisories`` (compat/advisories.yaml consulted) a candidate inside a critical
    advisory that ``backend.accept_advisories`` does not name is rejected (constraint
    ``advisory``), so an older release outside it is preferred where the recipe's driver policy
    allows one, and the stack's notes name each advisory holding its backend or torch release
    and the nearest recipe change giving a fixed one. Without, no advisory is looked at."""
    gpu = matrix.gpu(recipe.target.gpu)
    if gpu is None:
        known = ", ".join(g.name for g in matrix.gpus)
        raise RecipeError(f"unknown GPU {recipe.target.gpu!r}", field="target.gpu",
                          fix=f"one of: {known}")
    refuse_cpu_arch(gpu, "target.gpu")
    unknown = unknown_acceptances(matrix, recipe.backend.accept_advisories) if advisories else []
    if unknown:
        raise RecipeError(f"{', '.join(unknown)}: no advisory of compat/advisories.yaml has this "
                          "id or alias, so it accepts nothing", field="backend.accept_advisories",
                          fix="name the advisory as compat/advisories.yaml does (its id or an alias)")
    driver = host.driver if host else recipe.target.driver_floor
    policy = recipe.target.driver_policy
    spec = SpecifierSet(recipe.backend.version or "")
    precision = precision_of(recipe)
    os_names = (recipe.image.os,) if recipe.image.os else _OS_ORDER

    rejections: list[Rejection] = []
    refused: list[str] = []  # the critical advisories, unaccepted, of the candidates rejected for them
    failures_by_release: list[tuple[BackendRelease, list[Rejection]]] = []
    for release in matrix.backend_releases(recipe.backend.name):
        if Version(release.version) not in spec:
            rejections.append(Rejection(f"{release.backend} {release.version}", "version",
                                        f"outside backend.version {recipe.backend.version}"))
            failures_by_release.append((release, [rejections[-1]]))
            continue
        fields, failures = evaluate(matrix, release, gpu=gpu, precisions=precisions_to_check(recipe),
                                    driver=driver, policy=policy, os_names=os_names)
        if fields is not None:
            stack = _stack(recipe, matrix, release, gpu, precision, driver, policy, fields)
            # The model on the GPUs: after the stack, so a recipe no image fits is named first.
            critical = refused_hits(matrix, stack, recipe.backend.accept_advisories) if advisories else []
            if critical:
                refused += [advisory.id for _, _, advisory in critical]
                package, version, advisory = critical[0]
                rejections.append(Rejection(
                    f"{release.backend} {release.version}", "advisory",
                    f"{package} {version} is inside {advisory.label()}, fixed in {advisory.fixed}; "
                    "a critical advisory the recipe does not name in backend.accept_advisories"))
                failures_by_release.append((release, [rejections[-1]]))
                continue
            stack = replace(stack, fit=check_fit(recipe, matrix, gpu, precision, weights, weights_from),
                            nodes=recipe.target.nodes,
                            payload_multinode=matrix.profiles[release.backend].multinode_requires
                            if recipe.target.nodes > 1 else ())
            stack = _with_triton_launchers(matrix, stack)
            if advisories:
                stack = _with_advisories(recipe, matrix, stack, host)
            return Resolution(stack=stack, rejections=rejections)
        rejections.append(failures[0])
        failures_by_release.append((release, failures))

    if not failures_by_release:
        raise CompatibilityError(f"the matrix has no {recipe.backend.name} release",
                                 field="backend.name")
    if refused:
        # A stack fits but only inside a critical advisory: that decides, whatever refused the
        # newer releases. Every other fix would be searched without the advisories: name one
        # that passes them.
        fix = refusal_fix(recipe, matrix, lambda changed, on_driver: _quiet_stack(changed, matrix, host, on_driver),
                          tuple(dict.fromkeys(refused)))
        first = next(r for r in rejections if r.constraint == "advisory")
        headline = (f"no {recipe.backend.name} stack outside the critical advisories fits {gpu.name} "
                    f"with driver {driver} ({policy}); {len(rejections)} candidates rejected, "
                    f"the newest that fits: {first.candidate}: {first.reason}")
    else:
        fix = _nearest_fix(recipe, matrix, gpu, failures_by_release, driver)
        first, deciding = deciding_rejection(failures_by_release)
        which = (f"every candidate the recipe admits fails {first.constraint}; newest"
                 if deciding else "newest")
        headline = (f"no {recipe.backend.name} stack fits {gpu.name} with driver {driver} ({policy}); "
                    f"{len(rejections)} candidates rejected, {which}: {first.candidate}: {first.reason}")
    raise CompatibilityError(
        headline,
        field=_field_for(first.constraint), fix=fix,
        rejections=[(r.candidate, f"{r.constraint}: {r.reason}") for r in rejections],
        rejected=[dict(r.__dict__) for r in rejections])


def _quiet_stack(recipe: Recipe, matrix: Matrix, host: Host | None, driver: str | None) -> Stack:
    """The stack ``recipe`` resolves to with no advisory looked at (on ``driver`` when given)."""
    on = Host(driver=driver, gpu=host.gpu if host else None) if driver else host
    return resolve(recipe, matrix, on, advisories=False).stack


def _with_advisories(recipe: Recipe, matrix: Matrix, stack: Stack, host: Host | None) -> Stack:
    def resolve_quietly(changed: Recipe, driver: str | None) -> Stack:
        on = Host(driver=driver, gpu=host.gpu if host else None) if driver else host
        return resolve(changed, matrix, on, advisories=False).stack

    notes, unconfirmed = advisory_notes(recipe, matrix, stack, resolve_quietly)
    if not notes:
        return stack
    return replace(stack, notes=stack.notes + tuple(notes), unconfirmed=stack.unconfirmed + tuple(unconfirmed))


def deciding_rejection(failures_by_release: list[tuple[BackendRelease, list[Rejection]]]
                       ) -> tuple[Rejection, bool]:
    """The rejection a refusal's headline names, and whether it decides.

    Among the candidates the recipe admits (its version pin; all when it admits none), a
    constraint that every one of them fails decides: no other change lets one through. The
    headline names the highest-priority such constraint, from the newest candidate failing it
    (bf16 on a V100: the newest vLLM fails on architecture and dtype, older ones on dtype only,
    so dtype decides). With no common constraint, the newest admitted candidate's first failure.
    """
    admitted = [(r, f) for r, f in failures_by_release if f and f[0].constraint != "version"]
    pool = admitted or failures_by_release
    common = set.intersection(*({f.constraint for f in failures} for _, failures in pool))
    decisive = next((c for c in _PRIORITY if c in common and c != "version"), None)
    if decisive is not None and len(pool) > 1:
        return next(f for _, failures in pool for f in failures if f.constraint == decisive), True
    _, failures = pool[0]
    return failures[0], False


def refuse_cpu_arch(gpu: Gpu, where: str) -> None:
    """One line for a GPU whose hosts are not x86_64: every image row in the matrix is
    :data:`~imgfab.stack.verdicts.IMAGE_PLATFORM`."""
    if gpu.cpu_arch != "x86_64":
        raise RecipeError(
            f"{gpu.name} hosts are {gpu.cpu_arch} (Grace superchip) and imgfab builds {IMAGE_PLATFORM} "
            f"images only: the matrix records x86_64 wheels (torch, vLLM, TensorRT-LLM) and amd64 "
            f"nvidia/cuda tags, whose kernel lists and CUDA runtimes differ on aarch64",
            field=where, fix="target an x86_64 GPU host (e.g. H100-SXM, B200)")


def _stack(recipe: Recipe, matrix: Matrix, release: BackendRelease, gpu: Gpu, precision: str,
           driver: str, policy: str, fields: dict[str, Any]) -> Stack:
    toolkit: CudaToolkit = fields["toolkit"]
    image = fields["image"]
    profile = matrix.profiles[release.backend]
    engine = recipe.backend.trtllm_path == "engine"
    rule = matrix.precision_rule(release.backend, precision, release.version)
    payload: Payload = fields["payload"]
    floors = fields["floors"]
    torch_row = matrix.torch.get(fields["torch"]) if fields["torch"] else None
    try:
        plan = runtime_plan(profile, backend_version=release.version,
                            compute_capability=gpu.compute_capability,
                            kv_cache_dtype=recipe.engine.kv_cache_dtype, precision=precision,
                            cuda_major=toolkit.version.split(".")[0])
    except PayloadToolchainUnavailable as exc:
        raise CompatibilityError(f"{release.backend} {release.version} on {gpu.name}: {exc}",
                                 field="backend.version",
                                 fix="add a toolchain: image row for this release to "
                                     "compat/backends.yaml, or pin another backend.version") from None
    payload_toolchain = _payload_toolchain(plan, torch_row, release)
    if plan.flavor not in image.flavors:
        raise CompatibilityError(
            f"{release.backend} {release.version} on {gpu.name} needs a run-time JIT toolchain "
            f"({', '.join(plan.jit)}: {'; '.join(plan.reasons)}) that only the nvidia/cuda "
            f"{plan.flavor} flavor carries, and nvidia/cuda {toolkit.version} {image.os} has no "
            f"{plan.flavor} tag in the matrix",
            field="engine.kv_cache_dtype" if recipe.engine.kv_cache_dtype != "auto" else "target.gpu",
            fix="engine.kv_cache_dtype: auto" if recipe.engine.kv_cache_dtype != "auto"
            else f"add the {toolkit.version}-{plan.flavor}-{image.os} tag to compat/cuda_images.yaml")
    notes = []
    if floors.get("runtime") and floors["from"].startswith("the image's"):
        notes.append(f"strict driver floor {floors[STRICT]}: {release.backend} links the image's CUDA "
                     f"{toolkit.version} ({plan.flavor} image), the newest runtime in the payload")
    elif floors.get("runtime"):
        notes.append(f"strict driver floor {floors[STRICT]} comes from {floors['from']} → CUDA "
                     f"{floors['runtime']}, not from the base image's CUDA {toolkit.version}")
    for missing in payload.unknown:
        notes.append(f"{missing} maps to no CUDA release in compat/cuda.yaml runtimes; floor from the image")
    if policy == MINOR_COMPAT:
        notes.append(f"driver floor {fields['floor']} relies on CUDA {floors['cuda'].split('.')[0]}.x "
                     f"{MINOR_COMPAT_LIMITS}; strict floor would be {floors[STRICT]}")
    if policy == FORWARD_COMPAT:
        notes.append(f"forward-compat: runs on driver {driver} through the image's cuda-compat package "
                     f"(/usr/local/cuda/compat kept); datacenter GPUs only; strict floor would be {floors[STRICT]}")
        branch = next((b for b in matrix.driver_branches if b.branch == driver.split(".")[0]), None)
        if branch is not None and branch.end_of_life:
            notes.append(f"driver branch R{branch.branch} ({branch.kind}) reaches end of life {branch.end_of_life}")
    if fields.get("eol_only"):
        notes.append(f"only an end-of-life tag fits: {image.ref(plan.flavor)} (NVIDIA deletes "
                     "end-of-life tags six months after end of life; mirror it)")
    for name in precisions_to_check(recipe):
        weight_rule = matrix.precision_rule(release.backend, name, release.version)
        if weight_rule is not None and weight_rule.fallback and not weight_rule.native_on(gpu.compute_capability):
            notes.append(f"{name} on {gpu.sm.replace('sm', 'sm_')} runs {weight_rule.fallback}; native "
                         f"{name.upper() if name == 'nvfp4' else name} {weight_rule.native_text()}")
    if engine:
        notes.append(f"TensorRT engine is compiled for sm_{gpu.sm[2:]} only and runs on no other GPU")
    runtime = floors.get("runtime", "")
    unconfirmed = [u for u in matrix.unconfirmed
                   if u.startswith((f"{release.backend} {release.version}:", f"cuda {toolkit.version}:",
                                    f"gpu {gpu.name}:", f"torch {fields['torch']}:"))
                   or (runtime and u.startswith(f"cuda {runtime}:"))
                   or (torch_row is not None and u.startswith(f"cudart {torch_row.cuda_runtime}:"))]
    if not profile.confirmed:
        unconfirmed.append(f"backends {release.backend}: {profile.reason}")
    unconfirmed += plan.unconfirmed
    notes += [f"runtime carries {name} ({origin}): {reason}"
              for name, origin, reason in zip(plan.jit, plan.origins, plan.reasons)]
    notes += [f"builder compiles {line} ahead of time, for compute capability {gpu.compute_capability} "
              "alone (no GPU needed); the runtime compiles none of it (FLASHINFER_DISABLE_JIT=1)"
              for line in plan.aot]
    sources = sorted({release.source, toolkit.source, image.source, gpu.source, profile.source}
                     | ({rule.source} if rule else set()) | set(plan.sources)
                     | ({torch_row.source} | ({torch_row.fatbin_source} if torch_row.fatbin_source else set())
                        if torch_row else set())
                     | ({matrix.toolkits[runtime].source} if runtime in matrix.toolkits else set())
                     | ({matrix.runtimes[torch_row.cuda_runtime].source}
                        if torch_row and torch_row.cuda_runtime in matrix.runtimes else set()))
    torch = fields["torch"]
    archs = (gpu.compute_capability,) if engine else covered_archs(payload)
    ceilings = matrix.driver_ceilings(archs, exact=engine)
    if ceilings:
        sources = sorted(set(sources) | {a.source for a in matrix.architectures.values() if a.last_driver_branch
                                         and any(cc in ceilings for cc in a.compute_capabilities)})
    return Stack(
        backend=release.backend, backend_version=release.version,
        backend_path=recipe.backend.trtllm_path or "vllm",
        cuda=toolkit.version, cuda_minor=release.cuda, os=image.os, python=fields["os"].python,
        builder_image=image.ref("devel"), runtime_image=image.ref(plan.flavor),
        runtime_flavor=plan.flavor, runtime_packages=plan.packages,
        runtime_toolchain=plan.toolchain, jit=plan.jit, jit_compiles=plan.compiles,
        cuda_home=plan.cuda_home, payload_toolchain=payload_toolchain,
        torch=torch, tensorrt=release.tensorrt,
        gpu=gpu.name, compute_capability=gpu.compute_capability, sm=gpu.sm,
        archs=archs, arch_exact=engine,
        precision=precision,
        precision_min_cc=(rule.min_compute_capability or "") if rule else "",
        precision_max_cc=(rule.max_compute_capability or "") if rule else "",
        kv_cache_dtype=recipe.engine.kv_cache_dtype,
        tensor_parallel=recipe.target.count, pipeline_parallel=recipe.target.pipeline_parallel,
        driver_policy=policy, driver_floor=fields["floor"], strict_floor=floors[STRICT],
        compat_floor=floors[MINOR_COMPAT],
        nvidia_require_cuda=nvidia_require_cuda(floors["cuda"], policy), fleet_driver=driver,
        driver_ceilings=tuple(f"{cc}:{branch}" for cc, branch in
                              sorted(matrix.driver_ceilings(archs, exact=engine).items(),
                                     key=lambda item: parse_version(item[0]))),
        payload_runtime=floors.get("pin", ""),
        payload_runtime_toolkit=runtime, payload_runtime_from=floors.get("from", "") if runtime else "",
        torch_index=torch_row.index if torch_row else "",
        torch_archs=(tuple(torch_row.sass) + tuple(f"{a}+PTX" for a in torch_row.ptx)) if torch_row else (),
        backend_archs=release.fatbin_sass, image_eol=image.eol,
        cuda_compat="keep" if policy == FORWARD_COMPAT else "drop",
        notes=tuple(notes), sources=tuple(sources), unconfirmed=tuple(unconfirmed),
        aot_specs=plan.aot_specs, aot=plan.aot)


def _with_triton_launchers(matrix: Matrix, stack: Stack) -> Stack:
    """``stack`` with its Triton launcher plan (issue 33), and vLLM's JIT monitor set to fail.

    Where the builder compiles kernels (a kernels stage) and compat/triton_launchers.yaml has a
    confirmed row measured for this stack's release and serving settings, the builder also
    compiles Triton's driver helper and those launchers, and the runtime leaves the backend's
    ``triton_toolchain`` (the C compiler and headers) out. Elsewhere they stay, declared, as
    the fallback Triton compiles with at start; the note says so."""
    profile = matrix.profiles[stack.backend]
    monitor = bool(profile.jit_monitor_versions) and Version(stack.backend_version) in SpecifierSet(
        profile.jit_monitor_versions)
    stack = replace(stack, jit_monitor="error" if monitor else "")
    if not profile.triton_toolchain:
        return stack
    row = launchers_for(matrix.triton_launchers, stack) if stack.aot_specs else None
    dropped = set(profile.triton_toolchain)
    if row is None:
        why = ("no kernels stage compiles ahead for this stack" if not stack.aot_specs else
               f"compat/triton_launchers.yaml has no confirmed row measured for {stack.backend} "
               f"{stack.backend_version} on compute capability {stack.compute_capability} with "
               f"{stack.precision}, KV {stack.kv_cache_dtype}, tp {stack.tensor_parallel}, pp "
               f"{stack.pipeline_parallel}, {stack.nodes} node(s)")
        return replace(stack, notes=stack.notes + (
            f"runtime carries a C compiler ({', '.join(sorted(dropped & set(stack.runtime_toolchain)))}), "
            f"declared as the fallback Triton builds its launcher stubs with at start: {why}",))
    return replace(
        stack, runtime_packages=tuple(p for p in stack.runtime_packages if p not in dropped),
        runtime_toolchain=tuple(t for t in stack.runtime_toolchain if t not in dropped),
        triton=row.triton, triton_launchers=len(row.signatures),
        sources=tuple(sorted(set(stack.sources) | {row.source})),
        notes=stack.notes + (f"builder compiles Triton {row.triton}'s driver helper and "
                             f"{len(row.signatures)} launcher stubs (compat/triton_launchers.yaml, measured "
                             f"{row.measured}); the runtime carries no C compiler",))


def _payload_toolchain(plan: Any, torch_row: Any, release: BackendRelease) -> tuple[str, ...]:
    """The plan's payload requirements pinned to the CUDA toolkit torch pins: its
    ``cuda_runtime`` is the ``cuda-toolkit[...]==X`` release of its METADATA (torch >= 2.11)."""
    if not plan.payload_requirements:
        return ()
    if torch_row is None or "cuda-toolkit[" not in torch_row.source:
        raise CompatibilityError(
            f"{release.backend} {release.version}: its run-time toolchain comes from the payload's "
            f"cuda-toolkit wheels, but its torch {torch_row.version if torch_row else '(none)'} "
            "pins no cuda-toolkit release to match", field="backend.version",
            fix="use a torch that pins cuda-toolkit (2.11+), or a toolchain: image row")
    return tuple(sorted(f"{req}=={torch_row.cuda_runtime}" for req in plan.payload_requirements))


def _refuse_unknown_precision(matrix: Matrix, precision: str) -> None:
    """RecipeError (field ``--precision``) unless ``precision`` is auto, none or a precision
    compat/precisions.yaml rules on: an unknown one would check nothing, and an ambiguous
    alias (``w8a8``) is refused with its choices, as engine.quantization refuses it."""
    known = {rule.precision for rule in matrix.precisions} | {"auto", "none"}
    if precision in known:
        return
    ambiguous = ambiguous_alias("engine.quantization", precision)
    if ambiguous:
        choices = [f"--precision {c}" if c in known else f"{c} (not a precision imgfab checks yet)"
                   for c in alias_choices("engine.quantization", precision)]
        raise RecipeError(ambiguous, field="--precision",
                          fix=f"name the one the checkpoint is: {' or '.join(choices)}")
    exact = alias_choices("engine.quantization", precision)
    raise RecipeError(f"unknown precision {precision!r}", field="--precision",
                      fix=f"write --precision {exact[0]}" if exact else
                      f"one of {', '.join(sorted(known))}")


def fits_host(matrix: Matrix, gpu_name: str, driver: str, policy: str = STRICT,
              precision: str = "auto") -> list[tuple[BackendRelease, dict[str, Any] | None, list[Rejection]]]:
    """For `imgfab matrix`: every release of every backend evaluated on one host. ``gpu_name``
    is a matrix name or alias, or the name nvidia-smi prints (:meth:`Matrix.host_gpu`)."""
    gpu = matrix.host_gpu(gpu_name, field="--gpu")
    refuse_cpu_arch(gpu, "--gpu")
    _refuse_unknown_precision(matrix, precision)
    out = []
    for backend in sorted(matrix.profiles):
        for release in matrix.backend_releases(backend):
            fields, failures = evaluate(matrix, release, gpu=gpu,
                                        precisions=(precision,) if precision != "auto" else (),
                                        driver=driver, policy=policy, os_names=_OS_ORDER)
            out.append((release, fields, failures))
    return out
