"""Stack → build context: Dockerfile, lock file, run artifacts, the in-image probe.

:func:`render_context` is pure (recipe + stack in, ``{relative path: text}`` out) and
deterministic: the same recipe and matrix give byte-identical files. :func:`write_context`
writes them atomically: a failed write leaves no directory behind, a successful one replaces
the previous render whole.

Decisions live here; the templates under ``templates/`` only lay them out.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2

from imgfab import __version__
from imgfab.errors import RecipeError
from imgfab.in_image import gate
from imgfab.in_image.stage import BASE_GROUP
from imgfab.matrix.compat import Matrix
from imgfab.matrix.triton import launchers_for
from imgfab.payload.lock import Lock, requirement_pins, served_stack
from imgfab.recipe import Recipe, recipe_hash
from imgfab.in_image.fit import WEIGHT_BYTES
from imgfab.stack.fit import declared_facts, per_gpu_need_mib, serving_of
from imgfab.render import shapes
from imgfab.render.templating import environment
from imgfab.stack.resolve import Stack
from imgfab.stack.toolchain import PAYLOAD_CUDA_HOME
from imgfab.stack.verdicts import IMAGE_PLATFORM

if TYPE_CHECKING:
    from imgfab.render import trtllm


def _trtllm() -> Any:
    """:mod:`imgfab.render.trtllm` (its flag tables), imported on first use: a vLLM render
    never loads it (issue 23: start-up)."""
    from imgfab.render import trtllm  # noqa: PLC0415

    return trtllm


LABEL_PREFIX = "org.imgfab"
# Files of the imgfab package copied into every image (of imgfab.in_image): the probe and the
# resolver's rules it runs, the multi-node leader's cluster wait, and the API-key gate vLLM loads.
PROBE_MODULES = ("__init__.py", "rules.py", "facts.py", "fit.py", "probe.py", "cluster.py", "gate.py")
# The labels LeaderWorkerSet puts on each pod: its index in the group (the leader's "0"), the
# group's index among the replicas, and the LeaderWorkerSet's name
# (kubernetes-sigs/lws@v0.10.0:api/leaderworkerset/v1/leaderworkerset_types.go:
# WorkerIndexLabelKey, GroupIndexLabelKey, SetNameLabelKey).
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
# The Ray head's GCS port on a multi-node leader (Ray's default).
RAY_PORT = 6379
# The registry k8s.yaml names when the render was given none (issue 34): `.invalid` is reserved
# (RFC 6761: never resolves), so a pod of it fails to pull instead of pulling the bare name from
# Docker Hub; docker and Kubernetes accept the reference (a domain may hold capitals, a
# repository may not), so only the pull fails, naming it.
UNSET_REGISTRY = "REGISTRY.invalid"
# Where every node of a multi-node replica finds Ray's cluster token (issue 34): a Docker secret,
# a read-only bind mount, a Kubernetes Secret's subPath; the entrypoint points Ray at it.
RAY_TOKEN_FILE = "/run/secrets/imgfab-ray-token"
DEFAULT_INDEX = "https://pypi.org/simple"
_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def templates_dir() -> Path:
    return Path(str(resources.files("imgfab") / "_data" / "templates"))


def _no_newline(text: str) -> str:
    if any(ch in text for ch in "\n\r\x00"):
        raise RecipeError("a value contains a newline", field="recipe",
                          fix="remove line breaks from recipe values")
    return text


def _scalar(value: Any, filter_name: str) -> str:
    """A str or int as text; any other type is a template bug, refused loudly."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TypeError(f"the {filter_name!r} filter takes one str or int, got "
                        f"{type(value).__name__}: {value!r:.60}")
    return _no_newline(str(value))


def dockerfile_value(value: Any) -> str:
    """The one escaping filter for values that reach a Dockerfile (``dq``).

    Takes one str or int (anything else is a template bug: ``TypeError``), rejects newlines
    and NULs outright (a newline would start a new instruction) and quotes the value for a
    double-quoted Dockerfile/shell context.
    """
    text = _scalar(value, "dq")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`") + '"'


def shell_words(argv: list[str]) -> str:
    """Quote an argv for a POSIX shell, one word per argument (``sh``).

    Takes a list or tuple of str only: a plain string would be iterated character by
    character (``--name q w e n 2``), so it is refused with ``TypeError``; use ``shq``.
    """
    if not isinstance(argv, (list, tuple)):
        raise TypeError(f"the 'sh' filter takes an argv list, got {type(argv).__name__}: "
                        f"{argv!r:.60}; quote one word with 'shq'")
    words = []
    for arg in argv:
        if not isinstance(arg, str):
            raise TypeError(f"the 'sh' filter takes str arguments, got {type(arg).__name__}: {arg!r:.60}")
        words.append(shlex.quote(_no_newline(arg)))
    return " ".join(words)


def shell_word(value: Any) -> str:
    """One str or int quoted as a single POSIX shell word (``shq``)."""
    return shlex.quote(_scalar(value, "shq"))


def yaml_value(value: Any) -> str:
    """A value for a YAML document (``yaml``), written by a serializer, never by hand.

    Strings are always double-quoted (JSON is YAML): a name like ``123``, ``on`` or ``0x1f``
    stays a string. Numbers, booleans and lists/mappings of them are JSON-encoded; ``None``
    and other types are refused with ``TypeError``.
    """
    def check(item: Any) -> None:
        if item is None or not isinstance(item, (str, int, float, bool, list, tuple, dict)):
            raise TypeError(f"the 'yaml' filter cannot write {type(item).__name__}: {item!r:.60}")
        if isinstance(item, (list, tuple)):
            for element in item:
                check(element)
        elif isinstance(item, dict):
            for key, element in item.items():
                if not isinstance(key, str):
                    raise TypeError(f"the 'yaml' filter takes str keys, got {key!r:.60}")
                check(element)

    check(value)
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _environment() -> jinja2.Environment:
    return environment(templates_dir(), {"dq": dockerfile_value, "sh": shell_words, "shq": shell_word,
                                         "yaml": yaml_value, "json": yaml_value})


def size_bytes(size: str) -> int:
    match = re.match(r"^([0-9]+)([kmg]?)$", size.lower())
    if not match:
        raise RecipeError(f"bad size {size!r}", field="image.shm_size", fix="e.g. 16g")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2)]


def _k8s_quantity(size: str) -> str:
    """Docker size (16g) → Kubernetes quantity (16Gi)."""
    number, unit = re.match(r"^([0-9]+)([kmg]?)$", size.lower()).groups()  # type: ignore[union-attr]
    return number + {"": "", "k": "Ki", "m": "Mi", "g": "Gi"}[unit]


def stack_tag(stack: Stack) -> str:
    """The readable part of a tag, what an ops team picks by: backend+version, CUDA, GPU arch,
    precision. Not unique on its own: :func:`image_tag` adds the build's fingerprint.

    >>> # e.g. vllm0.11.0-cu12.8.1-sm90-fp8
    """
    tag = f"{stack.backend.replace('-', '')}{stack.backend_version}-cu{stack.cuda}-{stack.sm}"
    if stack.precision not in ("auto", "bf16", "fp16"):
        tag += f"-{stack.precision.replace('_', '')}"
    if stack.backend_path == "engine":
        tag += "-engine"
    return tag


# Files of a context that name the image (its tag or digest): rendered after the identity, and
# left out of it. Everything else is what the image is built from.
NAMING_FILES = ("run.sh", "compose.yaml", "k8s.yaml", "imgfab.lock.json")


def image_identity(files: dict[str, str], bases: dict[str, str] | None = None) -> str:
    """The fingerprint of a build: sha256 over every file the image is built from (all of a
    context but :data:`NAMING_FILES`: the Dockerfile with its labels, the lock, the in-image
    code, the entrypoint with the serving settings) and the base images it is built on
    (``bases``: BUILDER_IMAGE / RUNTIME_IMAGE as the build uses them, mirrored or pinned),
    first 12 hex digits. Two builds that differ in anything get different fingerprints."""
    digest = hashlib.sha256()
    for name in sorted(files):
        if name not in NAMING_FILES:
            digest.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    for key, ref in sorted((bases or {}).items()):
        digest.update(f"{key}={ref}\0".encode())
    return digest.hexdigest()[:12]


def image_tag(stack: Stack, identity: str) -> str:
    """The tag: readable stack part and the build's fingerprint, e.g.
    ``vllm0.19.1-cu12.8.2-sm90-fp8-3f9c2a1b7d40``. A tag never names two different builds."""
    return f"{stack_tag(stack)}-{identity}"


@dataclass(frozen=True)
class Source:
    """Where a build comes from (``org.opencontainers.image.source/revision/created``): the
    repository URL (no credentials), the commit, and an ISO time from a fixed input
    (``SOURCE_DATE_EPOCH``, else the commit's time). Empty fields are left out."""

    url: str = ""
    revision: str = ""
    created: str = ""


# The end of a RUN whose layer must be the same bytes in every cold build (it starts with
# t0=$(date +%s)): every file it wrote or changed is stamped with the epoch, as imgfab-stage
# stamps the payload. Mount points are left alone (the run-time /etc files, cache and secret
# mounts, the kernel's file systems).
LAYER_STAMP = ("find / -xdev \\( -path /proc -o -path /sys -o -path /dev -o -path /run/secrets "
               "-o -path /etc/hosts -o -path /etc/hostname -o -path /etc/resolv.conf "
               "-o -path /var/cache/apt -o -path /var/lib/apt/lists \\) -prune "
               "-o -newermt \"@$t0\" -exec touch --no-dereference --date=@0 {} +")
# What apt, dpkg and ldconfig leave that records the clock of the build, not its content.
LAYER_FORGET = ("rm -rf /var/log/apt/* /var/log/dpkg.log /var/log/alternatives.log "
                "/var/cache/ldconfig/aux-cache /var/lib/dpkg/*-old /var/cache/debconf/*-old")

def image_output(compression: str) -> str:
    """The BuildKit image exporter's settings for an image with ``compression`` layers: every
    layer compressed so, base layers included (``force-compression``), with OCI media types.
    ``imgfab build`` and the bake file use the same."""
    return f"type=image,compression={compression},force-compression=true,oci-mediatypes=true"


# The pulling host a layer compression needs ('' for gzip: every engine pulls it).
PULL_REQUIRES = {"gzip": "", "zstd": "docker>=23.0|containerd>=1.5"}


def image_labels(recipe: Recipe, stack: Stack, digest: str, weights_required: str,
                 source: Source | None = None, tag: str = "",
                 bases: dict[str, str] | None = None) -> dict[str, str]:
    """Labels written on the image; the probe reads the same set from /opt/imgfab/image.json.
    ``bases``: the base refs the build uses (base.name is the runtime's, mirrored when a mirror
    is used; base.digest is set when it is pinned by digest)."""
    p = LABEL_PREFIX
    source = source or Source()
    runtime_base = (bases or {}).get("RUNTIME_IMAGE", stack.runtime_image)
    base_name, _, base_digest = runtime_base.partition("@")
    oci = {"org.opencontainers.image.source": source.url,
           "org.opencontainers.image.base.digest": base_digest,
           "org.opencontainers.image.revision": source.revision,
           "org.opencontainers.image.created": source.created,
           "org.opencontainers.image.licenses": recipe.model.license or "",
           "org.opencontainers.image.ref.name": tag}
    return {k: v for k, v in oci.items() if v} | {
        "org.opencontainers.image.title": recipe.name,
        "org.opencontainers.image.description":
            f"{recipe.model.id} served by {stack.backend} {stack.backend_version} for {stack.gpu}",
        "org.opencontainers.image.vendor": "imgfab",
        "org.opencontainers.image.version": stack_tag(stack),
        "org.opencontainers.image.base.name": base_name,
        f"{p}.version": __version__,
        f"{p}.recipe.name": recipe.name,
        f"{p}.recipe.hash": digest,
        # The platform the image runs on (os/architecture): select refuses it on a host of
        # another CPU, and k8s.yaml places its pods on nodes of this kubernetes.io/arch only.
        f"{p}.platform": IMAGE_PLATFORM,
        f"{p}.model.id": recipe.model.id,
        f"{p}.model.revision": recipe.model.revision or "",
        f"{p}.model.mount": recipe.model.mount_path,
        f"{p}.weights.required": weights_required,
        f"{p}.backend": stack.backend,
        f"{p}.backend.version": stack.backend_version,
        f"{p}.backend.path": stack.backend_path,
        # The critical advisories the recipe accepted by name (backend.accept_advisories, issue
        # 34): `imgfab select` says so beside each advisory the image is inside.
        f"{p}.advisories.accepted": ",".join(sorted(recipe.backend.accept_advisories)),
        f"{p}.cuda": stack.cuda,
        f"{p}.cuda.runtime": stack.payload_runtime_toolkit,  # the payload's newest CUDA runtime (issue 10)
        f"{p}.os": stack.os,
        f"{p}.python": stack.python,
        f"{p}.torch": stack.torch,
        f"{p}.tensorrt": stack.tensorrt,
        f"{p}.driver.floor": stack.driver_floor,
        f"{p}.driver.policy": stack.driver_policy,
        f"{p}.driver.strict_floor": stack.strict_floor,
        f"{p}.driver.compat_floor": stack.compat_floor,
        # NVIDIA's last driver branch per compute capability the image runs ("7.0:580"): the
        # probe, select and k8s placement refuse a newer driver on such a GPU.
        f"{p}.driver.ceilings": ",".join(stack.driver_ceilings),
        f"{p}.gpu": stack.gpu,
        f"{p}.gpu.cc": stack.compute_capability,
        f"{p}.archs": ",".join(stack.archs),
        f"{p}.arch.exact": "true" if stack.arch_exact else "false",
        f"{p}.precision": stack.precision,
        f"{p}.precision.min_cc": stack.precision_min_cc,
        f"{p}.precision.max_cc": stack.precision_max_cc,
        f"{p}.kv_cache_dtype": stack.kv_cache_dtype,
        f"{p}.tp": str(stack.tensor_parallel),
        f"{p}.pp": str(stack.pipeline_parallel),
        f"{p}.nodes": str(stack.nodes),
        f"{p}.shm.min_bytes": str(size_bytes(recipe.image.shm_size)),
        # What a host needs to pull the layers (imgfab select and doctor read it).
        f"{p}.layers.compression": recipe.image.compression,
        f"{p}.pull.requires": PULL_REQUIRES[recipe.image.compression],
        # What the probe's fit check needs: how the model is served, and the facts the recipe
        # declared (the probe prefers the mounted weights' config.json; in_image/fit.py).
        f"{p}.fit.serving": serving_of(recipe, stack.precision).label(),
        f"{p}.fit.facts": declared_facts(recipe).label(),
        f"{p}.serve.port": str(recipe.serve.port),
        # The recipe's opt-outs of the API key (issue 34): serving without one when none is
        # mounted, and vLLM's GET /metrics without it (smoke reads the second).
        f"{p}.serve.unauthenticated": "true" if recipe.serve.unauthenticated else "false",
        f"{p}.serve.metrics_unauthenticated": "true" if recipe.serve.metrics_unauthenticated else "false",
        # What serving compiles on its first start, and where it keeps it (compat/backends.yaml).
        f"{p}.jit": ",".join(sorted(set(stack.jit))),
        f"{p}.jit.compiles": "; ".join(stack.jit_compiles),
        f"{p}.jit.cache": shapes.JIT_CACHE,
        # What the builder compiled ahead of time for this GPU (FlashInfer's JIT is disabled at
        # run time, so a kernel missing here fails the start, naming its module).
        f"{p}.kernels": "; ".join(stack.aot),
        f"{p}.kernels.arch": stack.compute_capability if stack.aot_specs else "",
        # The build tools the runtime carries (none: nothing compiles at start), and the Triton
        # launchers the builder compiled instead (compat/triton_launchers.yaml).
        f"{p}.toolchain": ",".join(sorted(stack.runtime_toolchain)),
        f"{p}.kernels.triton": f"{stack.triton_launchers} launchers, Triton {stack.triton}" if stack.triton else "",
    }


def served_name(recipe: Recipe) -> str:
    """The model name vLLM's /v1/models answers with: ``serve.served_model_name``, else the
    model id, which is what OpenAI clients send as ``model`` (vLLM's own default is the path it
    serves, here the mount path). trtllm-serve names it after its directory instead
    (:func:`imgfab.render.trtllm.served_model_name`)."""
    return recipe.serve.served_model_name or recipe.model.id


def _api_key_context(recipe: Recipe, stack: Stack) -> dict[str, str] | None:
    """The API key secret the run artifacts mount (vLLM), or None: trtllm-serve checks no key,
    so its image starts only where the recipe or the run opts out (serve.unauthenticated,
    IMGFAB_ALLOW_UNAUTHENTICATED=1), with an authenticating proxy in front."""
    if stack.backend != "vllm":
        return None
    return {"file": shapes.API_KEY_FILE, "name": shapes.API_KEY_FILE.rsplit("/", 1)[1],
            "k8s_secret": f"{recipe.name}-api-key", "k8s_key": "api-key"}


def gate_middleware(recipe: Recipe) -> str:
    """The ASGI middleware vLLM loads with ``--middleware`` (:mod:`imgfab.in_image.gate`): every
    route but GET /health needs the key, GET /metrics too unless serve.metrics_unauthenticated."""
    cls = gate.ApiKeyGateOpenMetrics if recipe.serve.metrics_unauthenticated else gate.ApiKeyGate
    return f"{gate.__name__}.{cls.__name__}"


def serve_commands(recipe: Recipe, stack: Stack) -> dict[str, list[str]]:
    """Per workload preset, the server argv the entrypoint execs (model path first)."""
    mount = recipe.model.mount_path
    name = served_name(recipe)
    max_len = recipe.serve.max_model_len or recipe.engine.max_seq_len
    commands: dict[str, list[str]] = {}
    for preset, limits in recipe.limits().items():
        if stack.backend == "vllm":
            argv = ["vllm", "serve", mount, "--served-model-name", name, "--host", "0.0.0.0",
                    "--port", str(recipe.serve.port),
                    # vLLM's --api-key guards /v1 only: the gate guards every route
                    "--middleware", gate_middleware(recipe),
                    "--tensor-parallel-size", str(stack.tensor_parallel),
                    "--pipeline-parallel-size", str(stack.pipeline_parallel),
                    "--max-model-len", str(max_len),
                    "--gpu-memory-utilization", str(recipe.serve.gpu_memory_utilization),
                    "--max-num-seqs", str(limits["max_num_seqs"]),
                    "--max-num-batched-tokens", str(limits["max_num_batched_tokens"])]
            if stack.nodes > 1:  # the leader drives the workers' GPUs through Ray
                argv += ["--distributed-executor-backend", "ray"]
            argv.append("--enable-chunked-prefill" if limits["enable_chunked_prefill"]
                        else "--no-enable-chunked-prefill")
            argv.append("--enable-prefix-caching" if limits["enable_prefix_caching"]
                        else "--no-enable-prefix-caching")
            if recipe.engine.dtype != "auto":
                argv += ["--dtype", recipe.engine.dtype]
            if stack.precision == "fp8":
                argv += ["--quantization", "fp8"]  # online FP8 (W8A8) from a 16-bit checkpoint
            if stack.kv_cache_dtype == "fp8":
                argv += ["--kv-cache-dtype", "fp8"]
            if stack.jit_monitor:  # a JIT compile after the warm-up fails loudly (compat/backends.yaml)
                argv += ["--jit-monitor-mode", stack.jit_monitor]
        else:  # TensorRT-LLM: built and checked against the release's flag table in trtllm.py
            served = _trtllm().engine_plan(recipe, stack).served_engine \
                if stack.backend_path == "engine" else None
            argv = _trtllm().serve_argv(recipe, stack, limits, served=served)
        commands[preset] = argv
    return commands


def _payload(stack: Stack, lock: Lock | None) -> dict[str, Any]:
    """The lock the builder installs and the layer groups the runtime copies.

    Without a lock (``imgfab render`` of a recipe not locked yet) the context carries the
    unhashed pins, which ``--require-hashes`` refuses at build time, and one payload layer."""
    if lock is None:
        text = ("# not locked: run `imgfab lock RECIPE`; uv --require-hashes refuses this file\n"
                + "\n".join(requirement_pins(stack)) + "\n")
        return {"lock_text": text, "installer": "", "layers": [BASE_GROUP], "index": DEFAULT_INDEX}
    # Written from the parsed pins, never copied: no line of the lock file reaches uv as it is,
    # and the installer and the index are compat/payload.yaml's (Lock.bind), not the header's.
    layers = lock.layers()
    if stack.aot_specs and not stack.cuda_home:
        # the builder compiled what the compiler wheels were locked for: the runtime leaves them
        layers = [layer for layer in layers if not layer.startswith(f"{TOOLKIT_GROUP}-")]
    return {"lock_text": lock.requirements(), "installer": lock.builder_installer(),
            "layers": layers, "index": lock.builder_index()}


# The lock's layer group of the CUDA compiler and headers (imgfab.payload.lockfile GROUPS).
TOOLKIT_GROUP = "toolkit"


def render_context(recipe: Recipe, stack: Stack, matrix: Matrix, *,
                   engine_strategy: str = "two-phase",
                   lock: Lock | None = None, registry: str | None = None,
                   bases: dict[str, str] | None = None, source: Source | None = None,
                   image_ref: str | None = None) -> dict[str, str]:
    """Render every file of the build context. Pure and deterministic.

    The image's tag is :func:`image_tag` over the files the image is built from and ``bases``
    (the base refs the build uses, when they are not the Dockerfile's defaults). The run
    artifacts name ``registry/repository:tag`` (``registry``: ``--registry`` or
    ``image.registry``; bare ``repository:tag``, a local image, without one), or ``image_ref``
    when given (the deploy bundle: ``registry/repository@sha256:…``, the pushed digest).
    ``source`` fills the OCI source/revision/created labels (part of the identity).

    ``engine_strategy`` (TensorRT engine path only): ``two-phase`` ships the weight-stripped
    engine compiled by :func:`imgfab.render.trtllm.two_phase` (``engine/`` in the context), ``at-start``
    ships none and compiles on first start. See :func:`imgfab.render.trtllm.choose_compile_strategy`.
    ``lock`` is the payload lock (:mod:`imgfab.payload.lock`) the builder installs and the runtime
    layers; ``None`` renders the unlocked pins (see :func:`_payload`). With a lock, ``stack`` is
    rendered as the image serves it (:func:`imgfab.payload.lock.served_stack`: its arch label without
    the GPUs whose cubins the lock cuts).
    """
    stack = served_stack(stack, lock)
    digest = recipe_hash(recipe)
    profile = matrix.profiles[stack.backend]
    bases = bases or {"BUILDER_IMAGE": stack.builder_image, "RUNTIME_IMAGE": stack.runtime_image}
    labels = image_labels(recipe, stack, digest, profile.weights_required, source, bases=bases)
    plan = None
    if stack.backend == "tensorrt-llm":
        _trtllm().flag_table(stack)  # both paths: refuse a release whose flags cannot be checked
    if stack.backend_path == "engine":
        if engine_strategy not in ("two-phase", "at-start"):
            raise RecipeError(f"engine strategy {engine_strategy!r} is not rendered by this imgfab",
                              field="--compile", fix="two-phase or --engine-at-start")
        plan = _trtllm().engine_plan(recipe, stack, strategy=engine_strategy)
        labels.update(plan.labels)
    repository = recipe.image.repository
    commands = serve_commands(recipe, stack)
    runtime_packages = sorted(stack.runtime_packages)
    context: dict[str, Any] = {
        "imgfab_version": __version__,
        "recipe": recipe.model_dump(mode="json"),
        "recipe_hash": digest,
        "stack": stack.to_dict(),
        "labels": labels,
        # g++ for the kernels the builder compiles (nvcc compiles host code with it)
        "builder_packages": sorted(set(profile.builder_packages) | ({"g++"} if stack.aot_specs else set())),
        "runtime_packages": runtime_packages,
        "layer_stamp": LAYER_STAMP,
        "layer_forget": LAYER_FORGET,
        "runtime_toolchain": sorted(stack.runtime_toolchain),
        "requirements": requirement_pins(stack),
        "payload": _payload(stack, lock),
        "serve_commands": commands,
        "default_preset": recipe.serve.preset,
        "uid": recipe.image.uid,
        "mount_path": recipe.model.mount_path,
        "port": recipe.serve.port,
        "shm_size": recipe.image.shm_size,
        "shm_bytes": size_bytes(recipe.image.shm_size),
        "shm_k8s": _k8s_quantity(recipe.image.shm_size),
        "gpu_count": stack.tensor_parallel * stack.pipeline_parallel // stack.nodes,
        "nodes": stack.nodes,
        # the services compose.yaml renders: one, or a leader and a worker (target.nodes > 1)
        "node_roles": ("leader", "worker") if stack.nodes > 1 else ("",),
        "ray_port": RAY_PORT,
        "ray_token_file": RAY_TOKEN_FILE,
        "ray_token_name": RAY_TOKEN_FILE.rsplit("/", 1)[1],
        "health_path": "/health",
        "engine": _engine_context(plan, recipe),
        "engine_volume": f"imgfab-{recipe.name}-engines",
        # --engine-at-start quantizes on first start: the prompts are mounted at run time too.
        "calibration_mount": _trtllm().CALIBRATION_FILE if plan is not None and plan.strategy == "at-start"
        and recipe.engine.calibration is not None else "",
        # read only beside calibration_mount, which only the engine path sets
        "calibration_dir": _trtllm().CALIBRATION_DIR if plan is not None else "",
        "jit_cache": shapes.JIT_CACHE,
        "triton_cache": shapes.TRITON_CACHE,
        "cache_volume": shapes.cache_volume(recipe.name),
        "compose_tmpfs": shapes.compose_tmpfs(recipe.image.uid),
        "cuda_view": _cuda_view(stack),
        "kernels": _kernels(stack, lock, matrix),
        # stack.triton: a confirmed launchers row covers it, which only a kernels stage applies
        "triton_seed": TRITON_SEED if stack.triton else "",
        "api_key": _api_key_context(recipe, stack),
        # Fail closed (issue 34): the entrypoint's default for IMGFAB_ALLOW_UNAUTHENTICATED, and
        # where run.sh and compose.yaml publish the port (HOST_ADDR overrides it).
        "unauthenticated": recipe.serve.unauthenticated,
        "metrics_unauthenticated": recipe.serve.metrics_unauthenticated,
        "publish_address": recipe.serve.publish_address,
        "served_name": served_name(recipe) if stack.backend == "vllm"
        else _trtllm().served_model_name(recipe),
    }
    context["k8s"] = _k8s_context(recipe, stack, labels, matrix, plan)
    env = _environment()
    # The identity is taken over the build files with an empty ref.name label; the image then
    # carries its own tag there (the files differ from the fingerprinted ones only in it).
    identity = image_identity(_build_files(env, context, plan), bases)
    tag = image_tag(stack, identity)
    labels = image_labels(recipe, stack, digest, profile.weights_required, source, tag=tag,
                          bases=bases)
    if plan is not None:
        labels.update(plan.labels)
    context["labels"] = labels
    files = _build_files(env, context, plan)
    context["tag"] = tag
    context["identity"] = identity
    context["image_ref"] = image_ref or (f"{registry.rstrip('/')}/{repository}:{tag}" if registry
                                         else f"{repository}:{tag}")
    # No registry given (issue 34): `llm/qwen2-7b:…` is the image built on this engine, which
    # run.sh and compose.yaml run from there only (never pulled: a runtime would look the bare
    # name up on Docker Hub, where anyone can publish it). A cluster pulls every image, so
    # k8s.yaml names it under UNSET_REGISTRY, which never resolves, until a registry is given.
    context["image_local"] = not image_ref and not registry
    context["k8s_image"] = (f"{UNSET_REGISTRY}/{repository}:{tag}" if context["image_local"]
                            else context["image_ref"])
    files |= {
        "run.sh": env.get_template("run.sh.j2").render(context),
        "compose.yaml": env.get_template("compose.yaml.j2").render(context),
        "k8s.yaml": env.get_template("k8s.yaml.j2").render(context),
        "imgfab.lock.json": json.dumps(_lock(recipe, stack, digest, tag, context), indent=2,
                                       sort_keys=True) + "\n",
    }
    return files


def _build_files(env: jinja2.Environment, context: dict[str, Any], plan: Any) -> dict[str, str]:
    """The files the image is built from (everything but :data:`NAMING_FILES`)."""
    files: dict[str, str] = {
        "Dockerfile": env.get_template("Dockerfile.j2").render(context),
        "requirements.lock": context["payload"]["lock_text"],
        "installer.lock": (context["payload"]["installer"] or "# no installer pinned: not locked") + "\n",
        "imgfab-stage.py": (resources.files("imgfab.in_image") / "stage.py").read_text(encoding="utf-8"),
        "netenv.sh": env.get_template("netenv.sh.j2").render(context),
        "entrypoint.sh": env.get_template("entrypoint.sh.j2").render(context),
        "imgfab-probe.sh": env.get_template("imgfab-probe.sh.j2").render(context),
        "image.json": json.dumps(context["labels"], indent=2, sort_keys=True) + "\n",
    }
    if context["kernels"]:
        files["imgfab-kernels.py"] = (resources.files("imgfab.in_image") / "kernels.py").read_text(encoding="utf-8")
        if context["kernels"]["triton"]:
            files["imgfab-triton-launchers.json"] = context["kernels"]["triton"]["json"]
    if plan is not None:
        files["imgfab-compile.sh"] = env.get_template("imgfab-compile.sh.j2").render(context)
        files["imgfab-quantize.py"] = env.get_template("imgfab-quantize.py.j2").render(context)
    files.update(in_image_files())
    return files


def context_image(files: dict[str, str]) -> dict[str, str]:
    """``{"repository", "tag", "identity", "ref"}`` of a rendered context (its imgfab.lock.json)."""
    image = json.loads(files["imgfab.lock.json"])["image"]
    return {k: image[k] for k in ("repository", "tag", "identity", "ref")}


def in_image_files() -> dict[str, str]:
    """What every image carries of imgfab (``COPY imgfab/ /opt/imgfab/imgfab/``): the
    ``imgfab.in_image`` modules the probe needs, byte for byte as in this package, under a
    stub ``imgfab/__init__.py`` (the host package's own would import nothing it needs)."""
    package = resources.files("imgfab.in_image")
    files = {"imgfab/__init__.py": '"""imgfab in-image code (copied from the imgfab package that '
                                   'rendered this image)."""\n'}
    for module in PROBE_MODULES:
        files[f"imgfab/in_image/{module}"] = (package / module).read_text(encoding="utf-8")
    return files


# Where the kernels stage puts Triton's compiled helpers (a Triton cache the entrypoint copies
# into TRITON_CACHE_DIR at start).
TRITON_SEED = "/opt/imgfab/triton-seed"


def _kernels(stack: Stack, lock: Lock | None, matrix: Matrix) -> dict[str, Any] | None:
    """The kernels stage (the builder compiles FlashInfer's JIT modules for this GPU, and
    Triton's driver helper and the launchers compat/triton_launchers.yaml records), or None."""
    if not stack.aot_specs:
        return None
    row = launchers_for(matrix.triton_launchers, stack) if stack.triton else None
    locked = lock.packages.get("triton", ("",))[0] if lock is not None else None
    if row is not None and locked is not None and locked != row.triton:
        # the launchers' cache keys (their generated source) belong to the Triton they were measured with
        raise RecipeError(
            f"the lock pins triton {locked or '(none)'}, but compat/triton_launchers.yaml measured "
            f"{stack.backend} {stack.backend_version}'s launchers with Triton {row.triton}",
            field="backend.version", fix="re-lock the recipe (imgfab lock), or measure a launchers row for "
                                         f"Triton {locked} (bench/startup.py --phase capture)")
    # None where no confirmed row covers the stack: the runtime keeps its declared C compiler
    triton = None if row is None else {
        "seed": TRITON_SEED, "count": len(row.signatures),
        "source": f"measured with Triton {row.triton} ({row.measured})",
        "json": json.dumps(row.launchers_json(), indent=1, sort_keys=True) + "\n"}
    return {"specs": list(stack.aot_specs), "arch": stack.compute_capability,
            "home": PAYLOAD_CUDA_HOME, "major": stack.cuda.split(".")[0], "what": "; ".join(stack.aot),
            "triton": triton}


def _cuda_view(stack: Stack) -> dict[str, str] | None:
    """The payload toolkit view the runtime stage makes (toolchain: payload rows), or None."""
    if stack.cuda_home != PAYLOAD_CUDA_HOME:
        return None
    return {"home": PAYLOAD_CUDA_HOME, "major": stack.cuda.split(".")[0]}


# Host resources a serving pod requests per GPU: tokenizer and scheduler threads, and host
# memory to stage the weights while loading them onto the GPU.
K8S_CPU_PER_GPU = 4
K8S_MEMORY_PER_GPU_GI = 16
K8S_ENGINE_STORAGE = "64Gi"


# The startup probe's budget. Model loading takes minutes and an engine compiled on first start
# up to an hour; large weights take longer still: read at LOAD_BYTES_PER_S, about the baseline
# throughput of an AWS gp3 volume (125 MiB/s, its documented default), after LOAD_SETUP_S of
# start-up. serve.startup_timeout_s overrides it.
STARTUP_PERIOD_S = 10
STARTUP_BASE_S = 900
STARTUP_COMPILE_S = 3600
LOAD_BYTES_PER_S = 125e6
LOAD_SETUP_S = 300


def startup_budget_s(recipe: Recipe, stack: Stack, at_start: bool) -> int:
    """Seconds Kubernetes waits for the server to answer /health the first time."""
    if recipe.serve.startup_timeout_s is not None:
        return recipe.serve.startup_timeout_s
    base = STARTUP_COMPILE_S if at_start else STARTUP_BASE_S
    facts = declared_facts(recipe)
    if facts.parameters is None:
        return base
    weights = facts.parameters * WEIGHT_BYTES.get(stack.precision, 2.0)
    return max(base, int(LOAD_SETUP_S + weights / LOAD_BYTES_PER_S))


def _k8s_context(recipe: Recipe, stack: Stack, labels: dict[str, str], matrix: Matrix,
                 plan: trtllm.EnginePlan | None) -> dict[str, Any]:
    """What k8s.yaml lays out: placement from the image's own rules, requests, claims."""
    from imgfab.render.placement import (allowed_compute_capabilities, capacity_terms,
                                         node_affinity_terms, platform_terms, product_label)

    terms = node_affinity_terms(labels, matrix)
    if not terms:
        raise RecipeError("no GPU in compat/gpus.yaml passes this image's own rules, so a "
                          "Kubernetes pod of it could be placed nowhere", field="target.gpu")
    gpus = stack.tensor_parallel * stack.pipeline_parallel // stack.nodes  # one pod per node
    per_gpu_mib = per_gpu_need_mib(recipe, stack.precision)
    products: tuple[str, ...] = ()
    if stack.arch_exact:  # a TensorRT engine runs on the GPU it was built for
        record = matrix.gpu(stack.gpu)
        products = tuple(n.name for n in record.nvml_names) if record is not None else ()
        if not products:
            raise RecipeError(f"compat/gpus.yaml names no NVML product name for {stack.gpu}, so "
                              "the engine's pods cannot be pinned to it (nvidia.com/gpu.product)",
                              field="target.gpu", fix=f"add {stack.gpu}'s nvml_names to compat/gpus.yaml")
    fit = capacity_terms(per_gpu_mib=per_gpu_mib, gpus_per_pod=gpus, products=products)
    try:
        arch = platform_terms(labels)
    except ValueError as error:
        raise RecipeError(str(error), field="org.imgfab.platform",
                          fix="render with imgfab's own image labels") from None
    # Kubernetes ORs the terms: each one carries the architecture, or a term without it
    # would admit a node of another CPU (a GH200 passes the H100 rules).
    terms = [arch + term + fit for term in terms]
    memory_gi = K8S_MEMORY_PER_GPU_GI * gpus + -(-size_bytes(recipe.image.shm_size) // 1024**3)
    selector = {"app.kubernetes.io/name": recipe.name}
    at_start = plan is not None and plan.strategy == "at-start"
    return {
        "labels": selector | {"app.kubernetes.io/managed-by": "imgfab"},
        "selector": selector,
        # A LeaderWorkerSet's Service reaches the leader only: LWS labels each pod with its
        # index in the group, the leader's is 0.
        "service_selector": selector | ({LWS_WORKER_INDEX: "0"} if stack.nodes > 1 else {}),
        # Across nodes (issue 34): Ray's cluster token, a Secret every pod of the group mounts,
        # and the NetworkPolicies' pod selectors: every pod of the LeaderWorkerSet, those of its
        # one group (replicas: 1, group-index 0), and the leaders.
        "ray_token_secret": f"{recipe.name}-ray-token",
        "ray_token_key": "ray-token",
        "lws_pods": {LWS_NAME: recipe.name},
        "group_pods": {LWS_NAME: recipe.name, LWS_GROUP_INDEX: "0"},
        "leader_pods": {LWS_NAME: recipe.name, LWS_WORKER_INDEX: "0"},
        "compute_capabilities": allowed_compute_capabilities(labels, matrix),
        "arch": arch[0]["values"][0],
        "affinity_terms": terms,
        "gpu_memory_mib": per_gpu_mib,
        "gpus_per_pod": gpus,
        "products": sorted({product_label(p) for p in products}),
        "cpu_per_gpu": K8S_CPU_PER_GPU,
        "memory_per_gpu": f"{K8S_MEMORY_PER_GPU_GI}Gi",
        "requests": {"cpu": str(K8S_CPU_PER_GPU * gpus), "memory": f"{memory_gi}Gi"},
        "limits": {"memory": f"{memory_gi}Gi", "nvidia.com/gpu": str(gpus)},
        "weights_claim": f"{recipe.name}-weights",
        "engine_claim": f"{recipe.name}-engines",
        "engine_storage": K8S_ENGINE_STORAGE,
        "calibration_configmap": f"{recipe.name}-calibration",
        "startup_budget_s": startup_budget_s(recipe, stack, at_start),
        "startup_failures": -(-startup_budget_s(recipe, stack, at_start) // STARTUP_PERIOD_S),
    }


def _engine_context(plan: trtllm.EnginePlan | None, recipe: Recipe) -> dict[str, Any]:
    """What the TensorRT engine templates lay out; ``{"path": False}`` off the engine path."""
    if plan is None:
        return {"path": False}
    trtllm = _trtllm()
    return {"path": True, "strategy": plan.strategy, "cache_key": plan.cache_key,
            "cache_root": trtllm.ENGINE_CACHE, "cache_dir": plan.cache_dir,
            "served": plan.served_engine, "in_image": trtllm.ENGINE_IN_IMAGE,
            "out": trtllm.COMPILE_OUT, "checkpoint_argv": plan.checkpoint_argv,
            "build_argv": plan.build_argv, "start_checkpoint_argv": plan.start_checkpoint_argv,
            "start_build_argv": plan.start_build_argv, "refit_argv": plan.refit_argv,
            "runtime_checkpoint": plan.runtime_checkpoint, "tensorrt": plan.tensorrt,
            "calibration": recipe.engine.calibration is not None,
            "calibration_file": trtllm.CALIBRATION_FILE, "flags_note": plan.flags_note,
            "quantize_script": trtllm.QUANTIZE_SCRIPT, "compile_script": trtllm.COMPILE_SCRIPT}


def _lock(recipe: Recipe, stack: Stack, digest: str, tag: str, context: dict[str, Any]) -> dict[str, Any]:
    return {
        "imgfab": __version__,
        "recipe": {"name": recipe.name, "hash": digest},
        "image": {"repository": recipe.image.repository, "tag": tag,
                  "identity": context["identity"], "ref": context["image_ref"],
                  "builder_base": stack.builder_image, "runtime_base": stack.runtime_image},
        "stack": stack.to_dict(),
        "requirements": context["requirements"],
        "serve": context["serve_commands"],
    } | ({"engine": {k: v for k, v in context["engine"].items() if k.endswith("argv")}
          | {"cache_key": context["engine"]["cache_key"], "strategy": context["engine"]["strategy"]}}
         if context["engine"]["path"] else {})


# The file every render directory carries: a directory with it may be replaced by the next
# render; any other non-empty directory is the user's and is only replaced with force=True.
RENDER_MARKER = ".imgfab-render"
_MARKER_TEXT = "rendered by imgfab; `imgfab render -o` replaces this directory whole\n"
_RENAME_EXCHANGE = 2  # renameat2(2) flag


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap the directories ``a`` and ``b`` (Linux ``renameat2`` with
    ``RENAME_EXCHANGE``); False where the system or filesystem cannot."""
    import ctypes  # noqa: PLC0415

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    result = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE)
    if result == 0:
        return True
    error = ctypes.get_errno()
    if error in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: fall back to two renames
        return False
    raise OSError(error, os.strerror(error), str(b))


def _replaceable(output: Path, force: bool) -> bool:
    """Whether ``output`` exists; RecipeError when it must not be replaced."""
    resolved = output.resolve()
    if resolved == Path(resolved.anchor) or Path.cwd().resolve().is_relative_to(resolved):
        raise RecipeError(f"{output} is the root or holds the working directory; imgfab does "
                          "not replace it", field="--output", fix="give a directory of its own")
    if output.is_symlink():
        raise RecipeError(f"{output} is a symbolic link; imgfab does not write through it",
                          field="--output", fix="give a directory path")
    if not output.exists():
        return False
    if not output.is_dir():
        raise RecipeError(f"{output} exists and is not a directory", field="--output",
                          fix="give a directory path")
    if force or (output / RENDER_MARKER).is_file() or not any(output.iterdir()):
        return True
    raise RecipeError(f"{output} is not empty and holds no previous imgfab render; "
                      "refusing to replace it", field="--output",
                      fix="pick another directory, or pass --force to replace it whole")


# Directories of a context that a new render keeps: ``deploy/``, the bundle of the last push
# (imgfab.supply.bundle), pinned by the digest the registry returned.
KEPT_DIRS = ("deploy",)


def write_context(files: dict[str, str], output: Path, *, force: bool = False) -> Path:
    """Write ``files`` into ``output`` atomically; returns ``output``.

    Files go to a temporary sibling directory first; only a complete render is swapped in, with
    one atomic exchange (readers see the old render or the new one, never neither), and nothing
    is left behind. ``output`` may be replaced only when it is absent, empty, or carries
    :data:`RENDER_MARKER` from a previous render; anything else raises RecipeError unless
    ``force``. A :data:`KEPT_DIRS` directory of a previous render is carried over.
    Directories are 0755 and files 0644 (``*.sh`` 0755), whatever the umask.
    """
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    _replaceable(output, force)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        for kept in KEPT_DIRS:  # the last push's deploy bundle outlives a new render
            if (output / RENDER_MARKER).is_file() and (output / kept).is_dir() \
                    and not (output / kept).is_symlink() \
                    and not any(name.startswith(f"{kept}/") for name in files):
                shutil.copytree(output / kept, staging / kept, symlinks=True)
        for relative, text in sorted({**files, RENDER_MARKER: _MARKER_TEXT}.items()):
            path = staging / relative
            for directory in reversed(path.relative_to(staging).parents[:-1]):
                (staging / directory).mkdir(exist_ok=True)
                os.chmod(staging / directory, 0o755)
            path.write_text(text, encoding="utf-8")
            os.chmod(path, 0o755 if relative.endswith(".sh") else 0o644)
        os.chmod(staging, 0o755)
        for _ in range(8):  # another writer may create or swap `output` in between
            if not _replaceable(output, force):
                try:
                    os.rename(staging, output)
                    return output
                except OSError as exc:
                    if exc.errno not in (17, 39):  # EEXIST, ENOTEMPTY: lost a race
                        raise
                    continue
            if _exchange(staging, output):
                shutil.rmtree(staging, ignore_errors=True)  # now the previous render
                return output
            retired = Path(tempfile.mkdtemp(prefix=f".{output.name}.old.", dir=output.parent))
            try:
                os.rename(output, retired / "x")
                os.rename(staging, output)
            finally:
                shutil.rmtree(retired, ignore_errors=True)
            return output
        raise OSError(f"{output} kept changing under concurrent renders")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
