"""Recipe → built, verified (optionally smoke-tested and pushed) image.

:func:`build_recipe` is the whole flow for one recipe:

1. load, resolve, take the recipe's fresh lock (``recipes/<name>.lock``, or ``--lock``) and
   render the build context into ``build/<name>`` (or ``--output``);
2. map the Dockerfile's base-image arguments through the mirror (``ref`` →
   ``{mirror}/{ref}``), optionally pinned to the digest the registry serves now;
3. ``docker build`` through :mod:`imgfab.docker.engine` with the CA bundle and a pip configuration as
   BuildKit secrets (the pip.conf is a temporary file outside the context, gone afterwards);
4. :mod:`imgfab.docker.verify` of the image ID the build wrote (``--iidfile``), never of a
   tag another build could move meanwhile; a rejected image is removed, nothing half-written
   remains;
5. tag ``<registry>/<repository>:<tag>`` (with a registry) and ``<repository>:<tag>``: the
   verified ID, relabelled with the measured payload (an interrupt or a failure before the
   end takes back every tag that moved, :mod:`imgfab.docker.unverified`);
6. optionally the smoke test the caller passes (``BuildOptions.smoke_hook``: imgfab smoke's
   run shapes; a failed smoke blocks the push);
7. optionally push through :mod:`imgfab.docker.registry`.

Errors are the typed ones of :mod:`imgfab.errors`: bad options are :class:`RecipeError`
(exit 2), Docker / registry / a failed check exit 1.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets as random_secrets
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from imgfab.cache import cache_root
from imgfab.docker import engine
from imgfab.docker.buildcache import for_recipe as cache_for
from imgfab.docker.unverified import UnverifiedTags
from imgfab.errors import (HostError, ImgfabError, RecipeError, ValidationFailed, printable, redact,
                           redact_values, shown)

# Extra pip.conf settings from the environment (the secret never reaches a layer, and a
# secret is not part of BuildKit's cache key, so changing these rebuilds nothing).
# IMGFAB_PIP_TIMEOUT / IMGFAB_PIP_RETRIES make an unreachable extra index fail fast.
_PIP_ENV_SETTINGS = {"IMGFAB_PIP_TIMEOUT": "timeout", "IMGFAB_PIP_RETRIES": "retries"}


@dataclass
class BuildOptions:
    """The ``imgfab build`` options (see the CLI help for each)."""

    mirror: str | None = None
    ca_cert: Path | None = None
    pip_index_url: str | None = None
    network: str | None = None
    pin_digests: bool = False
    push: bool = False
    registry: str | None = None
    registry_user: str | None = None
    registry_password: str | None = None
    smoke: bool = False
    weights: Path | None = None
    smoke_gpus: str = "all"
    smoke_memlock: bool = True  # False keeps the engine's memlock ulimit (nested engines)
    # The smoke test (image, recipe, options) → report dict: imgfab.ops.smoke_shapes.build_smoke,
    # passed in by the command line (ops sits above this station, so build never imports it).
    smoke_hook: Any = None
    compat_dir: Path | None = None
    compile: str = "auto"  # TensorRT engine path: auto | two-phase | at-start
    engine_out: Path | None = None  # two-phase: where the checkpoint (with weights) goes
    lock: Path | None = None  # the payload lock (default: the recipe's committed, fresh lock)
    no_cache: bool = False  # build every step again (BuildKit cache mounts are kept)
    compression: str | None = None  # gzip | zstd; None: the recipe's image.compression
    retag: bool = False  # --push may move a tag that already names another image
    sign_key: Path | None = None  # --push: sign the digest and attach SBOM + provenance
    # After a push: (BuiltImage, BuildRecord) → report dict: imgfab.supply.publish.publish,
    # passed in by the command line (supply sits above this station). It writes the deploy
    # bundle, the SBOM and the provenance, and signs with sign_key.
    publish_hook: Any = None
    # BuildKit cache specs ({recipe}: the recipe's name) and a buildx builder by name (issue 37)
    cache_from: tuple[str, ...] = ()
    cache_to: tuple[str, ...] = ()
    builder: str | None = None


@dataclass(frozen=True)
class BuildRecord:
    """What a pushed build was made from, for its supply chain (:mod:`imgfab.supply`)."""

    recipe_path: str
    recipe: Any
    stack: Any  # as served (the lock's measured runtime)
    matrix: Any
    lock: Any  # imgfab.payload.lockfile.Lock, or None
    lock_path: Path | None
    bases: dict[str, str]  # BUILDER_IMAGE / RUNTIME_IMAGE as built (mirrored, by digest)
    source: Any  # imgfab.render.context.Source
    secrets: tuple[str, ...]  # names of the build secrets (never their contents)
    options: BuildOptions
    started: str  # ISO times of the build
    finished: str
    rerender: Callable[[str], dict[str, str]]  # the context again, naming this image ref


@dataclass
class BuiltImage:
    """What one recipe's build produced (the ``--json`` object, one per recipe)."""

    recipe: str
    context: str
    image_id: str
    tags: list[str]
    size_bytes: int
    duration_s: float
    steps: int
    cached_steps: int
    cached_by_stage: dict[str, list[int]]
    base_images: dict[str, str]
    verify: dict[str, Any]
    smoke: dict[str, Any] | None = None
    pushed: str | None = None
    notes: list[str] = field(default_factory=list)
    publish: dict[str, Any] | None = None  # the deploy bundle, SBOM, provenance, signature
    builder: str | None = None  # the buildx builder by name (None: the engine's own)
    cache_from: list[str] = field(default_factory=list)  # the cache specs as passed to buildx
    cache_to: list[str] = field(default_factory=list)
    # each exported cache's secrets scan (imgfab.docker.cache_scan): spec, layers, bytes, secrets
    cache_scans: list[dict[str, Any]] = field(default_factory=list)
    # the steps BuildKit ran rather than took from a cache: "stage index/total instruction"
    ran: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` object, every secret-shaped value redacted."""
        return redact_values(asdict(self))


def _check_options(options: BuildOptions) -> None:
    if options.ca_cert is not None and not Path(options.ca_cert).is_file():
        raise RecipeError(f"{options.ca_cert} is not a file", field="--ca-cert",
                          fix="give a PEM CA bundle, e.g. /etc/ssl/certs/ca-certificates.crt")
    if options.pip_index_url is not None:
        check_pip_index_url(options.pip_index_url)
    if options.push and not options.registry:
        raise RecipeError("--push needs a registry", field="--registry",
                          fix="pass --registry HOST or set IMGFAB_REGISTRY")
    if options.sign_key is not None and not options.push:
        raise RecipeError("--sign-key signs a pushed digest", field="--sign-key",
                          fix="add --push (or sign later: cosign sign --key KEY REG/REPO@sha256:…)")
    if options.sign_key is not None and not Path(options.sign_key).is_file():
        raise RecipeError(f"{options.sign_key} is not a file", field="--sign-key",
                          fix="give a cosign private key (cosign generate-key-pair)")
    if options.smoke and options.weights is None:
        raise RecipeError("--smoke needs the weights to serve", field="--weights",
                          fix="pass --weights DIR (mounted read-only at the mount path)")
    from imgfab.docker import buildcache  # noqa: PLC0415

    buildcache.check_cache_specs(options.cache_from, options.cache_to, 1)
    if options.builder is not None:
        buildcache.check_builder_name(options.builder)
    if options.network not in (None, "host", "default", "none"):
        raise RecipeError(f"unsupported build network {options.network!r}", field="--network",
                          fix="use --network host (to reach an index on 127.0.0.1)")


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def check_pip_index_url(url: str) -> str:
    """``url`` when it is an http(s) URL with a host and no control characters or spaces;
    RecipeError otherwise (the message never shows its password)."""
    parts = urllib.parse.urlsplit(url) if not _CONTROL.search(url) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname \
            or " " in url or len(url) > 2048:
        raise RecipeError(f"{shown(url)} is not an http(s) URL", field="--pip-index-url",
                          fix="e.g. https://pypi.example.com/simple (no spaces or line breaks)")
    return url


def pip_conf_text(settings: dict[str, str]) -> str:
    """A pip.conf ``[global]`` section of ``settings``, refusing any key or value that could
    start another line or section (control characters, ``[``/``=`` in keys)."""
    lines = ["[global]"]
    for key, value in settings.items():
        if not re.fullmatch(r"[a-z][a-z0-9-]*", key) or _CONTROL.search(value) \
                or value != value.strip():
            raise RecipeError(f"pip setting {key} has a value pip.conf cannot hold",
                              field="--pip-index-url",
                              fix="remove line breaks and control characters")
        lines.append(f"{key} = {value}")
    return "\n".join(lines) + "\n"


def _pip_conf(index_url: str, directory: Path) -> Path:
    settings = {"index-url": check_pip_index_url(index_url)}
    for variable, key in sorted(_PIP_ENV_SETTINGS.items()):
        value = os.environ.get(variable)
        if value:
            if not re.fullmatch(r"[0-9]{1,4}", value):
                raise RecipeError(f"{variable}={value[:20]!r} is not a whole number of at most "
                                  "4 digits", field=variable, fix="e.g. 15")
            settings[key] = value
    path = directory / "pip.conf"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(pip_conf_text(settings))
    os.chmod(path, 0o600)
    return path


# The key's length in bytes; a shorter file (empty after a kill or a full disk between create and
# write, before issue 21) is refused, never used as an HMAC key.
PIP_SOURCE_KEY_BYTES = 32


def pip_source_key(cache: Path | None = None) -> bytes:
    """The random key of this build cache (``pip-source.key`` under ``cache``, by default
    :func:`imgfab.cache.cache_root`; made on first use, mode 0600) that keys the pip-source
    fingerprint: a build arg that changes when the index changes, and from which no password
    can be guessed without the key.

    The key is written whole to a temporary file, synced, then linked into place (a concurrent
    build's key wins, never a half-written one). A key file shorter than
    :data:`PIP_SOURCE_KEY_BYTES` raises :class:`HostError` naming it."""
    root = cache or cache_root()
    path = root / "pip-source.key"
    try:
        if not path.exists():
            root.mkdir(parents=True, exist_ok=True)
            _write_key(path)
        key = path.read_bytes()
    except OSError as exc:
        raise HostError(f"cannot make or read {path}: {exc.strerror or exc}",
                        field="pip-source key",
                        fix="make the cache directory writable, or point IMGFAB_CACHE_DIR at "
                            "one that is") from None
    if len(key) < PIP_SOURCE_KEY_BYTES:
        raise HostError(f"{path} holds {len(key)} bytes, not a {PIP_SOURCE_KEY_BYTES}-byte key "
                        "(a write cut short)", field="pip-source key",
                        fix=f"delete {path}; the next build makes a new one")
    return key


def _write_key(path: Path) -> None:
    fd, staging = tempfile.mkstemp(prefix=".pip-source.key.", dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(random_secrets.token_bytes(PIP_SOURCE_KEY_BYTES))
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(staging, path)  # never replaces a key another build made first
        except FileExistsError:
            pass
        except OSError:  # a filesystem without hard links
            os.replace(staging, path)
    finally:
        try:
            os.unlink(staging)
        except FileNotFoundError:
            pass


def pip_source_fingerprint(pip_conf: bytes, key: bytes) -> str:
    """HMAC-SHA256 of the pip configuration under this cache's ``key`` (16 hex digits)."""
    return hmac.new(key, pip_conf, hashlib.sha256).hexdigest()[:16]


def _compile_strategy(stack: Any, options: BuildOptions,
                      on_line: Callable[[str], None] | None) -> str | None:
    """For the TensorRT engine path: how the engine gets compiled (None for other paths)."""
    if stack.backend_path != "engine":
        if options.compile != "auto":
            raise RecipeError(f"{options.compile} applies to the TensorRT engine path only",
                              field="--engine-at-start/--compile",
                              fix="drop it, or set backend.trtllm_path: engine")
        return None
    from imgfab.render.trtllm import EngineCaps, choose_compile_strategy  # noqa: PLC0415

    caps = EngineCaps() if options.compile == "at-start" else EngineCaps(*engine.compile_caps())
    strategy, reason = choose_compile_strategy(caps, options.compile)
    if on_line:
        on_line(f"imgfab: engine compile strategy {strategy}: {reason}")
    return strategy


def _compile_two_phase(recipe_path: str, recipe: Any, stack: Any, context: Path, options: BuildOptions,
                       build_args: dict[str, str], secrets: dict[str, Path],
                       on_line: Callable[[str], None] | None) -> None:
    """Compile the weight-stripped engine on the engine's GPU and place it in the context."""
    from imgfab.render.trtllm import two_phase  # noqa: PLC0415

    if options.weights is None:
        raise RecipeError("compiling a TensorRT engine needs the weights", field="--weights",
                          fix="pass --weights DIR (bind-mounted read-only, never copied)")
    from imgfab.recipe import calibration_file  # noqa: PLC0415

    calibration = calibration_file(recipe, recipe_path)
    out = options.engine_out or Path("build") / f"{recipe.name}-compile"
    result = two_phase(context, recipe, stack, engine=engine, weights_dir=Path(options.weights),
                       calibration_file=calibration, out_dir=out, build_args=build_args,
                       secrets={k: str(v) for k, v in secrets.items()}, network=options.network,
                       on_line=on_line)
    if on_line:
        on_line(f"imgfab: engine compiled; copy its checkpoint {result.checkpoint_dir} next to the "
                f"weights as {result.runtime_checkpoint} for the refit at start")


def base_image_args(stack: Any, options: BuildOptions) -> dict[str, str]:
    """``BUILDER_IMAGE`` / ``RUNTIME_IMAGE`` build args: mirrored, digest-pinned with
    ``--pin-digests`` and always for ``--push`` (the pushed tag's identity then covers the
    bases' digests, not a name upstream may move)."""
    refs = {"BUILDER_IMAGE": stack.builder_image, "RUNTIME_IMAGE": stack.runtime_image}
    if options.mirror:
        refs = {k: f"{options.mirror.rstrip('/')}/{v}" for k, v in refs.items()}
    if options.pin_digests or options.push:  # a pushed tag covers its bases by digest
        from imgfab.docker import registry  # noqa: PLC0415

        pinned: dict[str, str] = {}
        for key, ref in refs.items():
            host = registry.ImageRef.parse(ref).host
            credentials = registry.Credentials.load(host)
            pinned[key] = registry.resolve_digest(ref, credentials)
        refs = pinned
    return refs


# The steps of one build, in order; a failure's ``ImgfabError.step`` names the one it stopped in.
STEPS = ("recipe", "resolve", "lock", "render", "build", "cache", "verify", "payload", "smoke", "push",
         "publish")


def build_recipe(recipe_path: str, options: BuildOptions, *,
                 on_line: Callable[[str], None] | None = None,
                 context_dir: Path | None = None) -> BuiltImage:
    """Build, verify (and optionally smoke-test and push) the image of one recipe.

    Raises the typed errors of :mod:`imgfab.errors`, each with ``step`` set to the one of
    :data:`STEPS` it failed in (``build --json`` reports it)."""
    where = [STEPS[0]]
    try:
        return _build_recipe(recipe_path, options, on_line, context_dir, where)
    except ImgfabError as error:
        if error.step is None:
            error.step = where[0]
        raise


def _build_recipe(recipe_path: str, options: BuildOptions, on_line: Callable[[str], None] | None,
                  context_dir: Path | None, where: list[str]) -> BuiltImage:
    from imgfab.matrix.compat import load_matrix  # noqa: PLC0415
    from imgfab.payload.lock import load_for_build, served_stack  # noqa: PLC0415
    from imgfab.recipe import load_recipe  # noqa: PLC0415
    from imgfab.render.context import context_image, render_context, write_context  # noqa: PLC0415
    from imgfab.render.source import source_epoch, source_of  # noqa: PLC0415
    from imgfab.stack.resolve import resolve  # noqa: PLC0415
    from imgfab.docker.verify import policy_for, verify_image  # noqa: PLC0415

    recipe = load_recipe(recipe_path)
    if options.registry is None and recipe.image.registry:  # --registry / IMGFAB_REGISTRY win
        options = replace(options, registry=recipe.image.registry)
    if options.compression is not None:  # --compression wins; the labels say what was built
        recipe = recipe.model_copy(update={"image": recipe.image.model_copy(
            update={"compression": options.compression})})
    compression = recipe.image.compression
    _check_options(options)
    where[0] = "resolve"
    matrix = load_matrix(options.compat_dir)
    stack = resolve(recipe, matrix).stack
    strategy = _compile_strategy(stack, options, on_line)
    where[0] = "lock"
    lock = load_for_build(recipe_path, recipe, stack, options.lock, options.compat_dir)
    stack = served_stack(stack, lock)  # as render_context labels it: verify checks the same labels
    # The bases as this build uses them (mirrored, pinned) are part of the image's identity.
    build_args = base_image_args(stack, options)
    bases = dict(build_args)
    source = source_of(recipe_path)
    # SOURCE_DATE_EPOCH: the image config's and history's times are the source's (the commit's,
    # or CI's SOURCE_DATE_EPOCH); every layer's files are stamped with the epoch itself (0) by
    # the Dockerfile, so a layer depends only on what is in it.
    epoch = source_epoch(source)

    def rerender(image_ref: str | None = None) -> dict[str, str]:
        return render_context(recipe, stack, matrix, engine_strategy=strategy or "two-phase",
                              lock=lock, registry=options.registry, bases=bases, source=source,
                              image_ref=image_ref)

    started = _now()
    where[0] = "render"
    files = rerender()
    context = write_context(files, context_dir or Path("build") / recipe.name)
    tag_name = context_image(files)["tag"]
    local_ref = f"{recipe.image.repository}:{tag_name}"
    tags = [local_ref]
    remote_ref = f"{options.registry.rstrip('/')}/{local_ref}" if options.registry else None
    if remote_ref:
        tags.append(remote_ref)
    # Until verify and the payload check pass and the names are given, an interrupt or a
    # failure takes back every tag that moved (the build itself names nothing).
    with UnverifiedTags(tags) as hold:
        with tempfile.TemporaryDirectory(prefix="imgfab-secrets-") as scratch:
            secrets: dict[str, Path] = {}
            if options.ca_cert is not None:
                secrets["ca-cert"] = Path(options.ca_cert)
            if options.pip_index_url:
                secrets["pip-conf"] = _pip_conf(options.pip_index_url, Path(scratch))
                build_args["IMGFAB_PIP_SOURCE"] = pip_source_fingerprint(
                    secrets["pip-conf"].read_bytes(), pip_source_key())
            where[0] = "build"
            if strategy == "two-phase":
                _compile_two_phase(recipe_path, recipe, stack, context, options, build_args, secrets, on_line)
            # No tag yet: what is judged is the ID this build wrote, and only it gets the names.
            result = engine.build(context, tags=[], build_args=build_args, secrets=secrets,
                                  network=options.network, on_line=on_line, no_cache=options.no_cache,
                                  compression=compression, epoch=epoch,
                                  cache_from=tuple(cache_for(options.cache_from, recipe.name)),
                                  cache_to=tuple(cache_for(options.cache_to, recipe.name)),
                                  builder=options.builder)
            policy = policy_for(recipe, stack, matrix, secrets)
            secret_names = list(secrets)
            # issue 37: the exported cache holds every stage's layers; no build secret in any
            where[0] = "cache"
            from imgfab.docker.cache_scan import scan_cache  # noqa: PLC0415
            from imgfab.render.cachespec import spec_settings  # noqa: PLC0415
            try:
                cache_scans = [scan_cache(spec, policy).to_dict()
                               for spec in cache_for(options.cache_to, recipe.name)
                               if spec_settings(spec).get("type") != "inline"]
            except ImgfabError:  # the image goes with its verdict, as a rejected one does
                _reject(result.image_id, tags, result.hold_ref)
                raise
        policy.base_diff_ids = _base_diff_ids(build_args["RUNTIME_IMAGE"])
        image_id = result.image_id
        # The build's private name keeps the image until it has its real names (the containerd
        # image store keeps no image without a name); it goes whatever happens below.
        try:
            where[0] = "verify"
            try:
                report = verify_image(image_id, policy)
            except ValidationFailed:
                _reject(image_id, tags, result.hold_ref)
                raise
            # issue 10: measure the payload inside the image (CUDA runtime, SASS/PTX) against the
            # matrix; a disagreement rejects the image like verify does, and the measured values
            # become labels.
            from imgfab.payload import measure as payload  # noqa: PLC0415
            where[0] = "payload"
            try:
                measured = payload.check_image(image_id, stack.to_dict(), matrix, engine=engine)
            except ValidationFailed:
                _reject(image_id, tags, result.hold_ref)
                raise
            relabelled = engine.add_labels(image_id, measured.labels, tags, compression=compression,
                                           epoch=epoch)
        finally:
            _drop(result.hold_ref)
        hold.verified()
    report.notes.extend(measured.notes)
    size = int(engine.inspect_image(local_ref).get("Size") or 0)
    built = BuiltImage(
        recipe=recipe.name, context=str(context), image_id=relabelled or result.image_id, tags=tags,
        size_bytes=size, duration_s=round(result.duration_s, 2), steps=len(result.steps),
        cached_steps=result.cached_steps,
        cached_by_stage={k: list(v) for k, v in sorted(result.cached_by_stage().items())},
        base_images={k: build_args[k] for k in ("BUILDER_IMAGE", "RUNTIME_IMAGE")}, verify=report.to_dict(), notes=list(report.notes),
        builder=options.builder, cache_from=cache_for(options.cache_from, recipe.name),
        cache_to=cache_for(options.cache_to, recipe.name), cache_scans=cache_scans,
        ran=[f"{step.stage} {step.index}/{step.total} {printable(step.instruction)[:120]}"
             for step in result.steps if not step.cached])
    if options.smoke:
        where[0] = "smoke"
        if options.smoke_hook is None:
            raise RecipeError("--smoke needs a smoke test to run", field="--smoke",
                              fix="build through `imgfab build --smoke`, which passes it")
        built.smoke = options.smoke_hook(local_ref, recipe, options)
        if not built.smoke["passed"]:
            raise ValidationFailed(
                f"smoke test of {local_ref} failed: {'; '.join(built.smoke['failures'][:3])}",
                field="smoke", fix="see the container log (imgfab smoke IMAGE --weights DIR)")
    if options.push:
        from imgfab.docker import registry  # noqa: PLC0415

        assert remote_ref is not None and options.registry
        where[0] = "push"
        # --registry may carry a namespace (ghcr.io/<owner>): credentials are the host's.
        credentials = registry.Credentials.load(options.registry.split("/", 1)[0],
                                                options.registry_user, options.registry_password)
        built.pushed = registry.push(built.image_id, remote_ref, credentials=credentials,
                                     on_line=on_line, retag=options.retag)
        if options.publish_hook is not None:
            from imgfab.payload.lock import lock_path  # noqa: PLC0415

            where[0] = "publish"

            record = BuildRecord(
                recipe_path=recipe_path, recipe=recipe, stack=stack, matrix=matrix, lock=lock,
                lock_path=Path(options.lock) if options.lock else
                (lock_path(recipe_path, recipe.name) if lock is not None else None),
                bases=bases, source=source, secrets=tuple(sorted(secret_names)), options=options,
                started=started, finished=_now(), rerender=rerender)
            built.publish = options.publish_hook(built, record)
    return built


def _drop(hold_ref: str) -> None:
    """Remove the build's private name; best effort."""
    from imgfab.errors import EngineError  # noqa: PLC0415

    if hold_ref:
        try:
            engine.remove_image(hold_ref)
        except EngineError:
            pass


def _reject(image_id: str, tags: list[str], hold_ref: str = "") -> None:
    """A rejected image keeps no name that could be pushed or run: each of ``tags`` that names
    it is removed (a tag another build holds stays), its private name, then the image; best
    effort."""
    from imgfab.errors import EngineError  # noqa: PLC0415

    _drop(hold_ref)
    for ref in tags:
        try:
            if engine.inspect_image(ref).get("Id") == image_id:
                engine.remove_image(ref)
        except EngineError:
            pass
    try:
        engine.remove_image(image_id)
    except EngineError:
        pass


def _now() -> str:
    import time  # noqa: PLC0415

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _base_diff_ids(ref: str) -> tuple[str, ...]:
    """The runtime base's layer diff ids, from its registry config (for verify's notes)."""
    from imgfab.docker import registry  # noqa: PLC0415

    host = registry.ImageRef.parse(ref).host
    config = registry.image_config(ref, registry.Credentials.load(host))
    return tuple((config.get("rootfs") or {}).get("diff_ids") or ())


class BuildProgress:
    """Shows a build's BuildKit log: on a terminal a ``rich`` status line (the current step)
    over the last lines of the log; otherwise (CI, pipes, ``--json``) plain lines on stderr.
    """

    TAIL = 12

    def __init__(self, title: str, *, rich_ui: bool = True):
        import sys  # noqa: PLC0415

        self.title = title
        self.stream = sys.stderr
        self.rich = rich_ui and self.stream.isatty()
        self.tail: list[str] = []
        self.step = "starting"
        self._live: Any = None

    def __enter__(self) -> BuildProgress:
        if self.rich:
            from rich.console import Console  # noqa: PLC0415
            from rich.live import Live  # noqa: PLC0415

            self._live = Live(self._render(), console=Console(stderr=True),
                              refresh_per_second=8, transient=True)
            self._live.__enter__()
        return self

    def _render(self) -> Any:
        from rich.console import Group  # noqa: PLC0415
        from rich.text import Text  # noqa: PLC0415

        status = Text.assemble(("building ", "bold"), (self.title, "bold cyan"),
                               f"  {self.step}")
        return Group(status, *(Text(line, style="dim", overflow="ellipsis", no_wrap=True)
                               for line in self.tail))

    def line(self, text: str) -> None:
        text = printable(redact(text))
        if not self.rich:
            print(text, file=self.stream, flush=True)
            return
        if engine._STEP_LINE.match(text):
            self.step = text.split(" ", 1)[1][:100]
        self.tail = (self.tail + [text])[-self.TAIL:]
        self._live.update(self._render())

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
