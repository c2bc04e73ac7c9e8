"""``imgfab smoke``: start an image in every run shape its artifacts use, and smoke-test each.

Each shape (:mod:`imgfab.render.shapes`: run.sh, compose.yaml, k8s.yaml) is started with its own
container options, one after the other, and reported separately (:class:`ShapesReport`).
run.sh and compose share one JIT cache volume, as they do on a host (the same volume name):
the first start compiles, the second shows a restart loading what was compiled; k8s starts
with empty emptyDir-like volumes, so it compiles again. A cache volume smoke made is removed.

With ``--weights DIR``, the model in DIR is checked against the image before any container
starts (:mod:`imgfab.ops.smoke_fit`, the resolver's rule): one that cannot fit is refused with
the numbers, exit 2; the fit line (or what was not checked) is the report's first note.

``--synthetic-model`` serves a small random-weight model of the recipe's architecture
(``compat/models.yaml``), written by :mod:`imgfab.ops.synthetic_model` run inside the image
itself, so any GPU host can prove an image starts and serves without the real (possibly gated)
weights. The report says so: synthetic weights prove start-up and serving, not the model.
"""

from __future__ import annotations

import importlib
import json
import os
import secrets
import shutil
import tempfile
import uuid
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from imgfab.render import shapes
from imgfab.render.shapes import SHAPES
from imgfab.errors import EngineError, RecipeError
from imgfab.ops.smoke import RunSettings, SmokeReport, smoke_image
from imgfab.ops.smoke_fit import weights_fit
from imgfab.ops.smoke_routes import METRICS, OPEN_ROUTES

SYNTHETIC_NOTE = ("synthetic weights: a random-weight {architecture} with a generated tokenizer "
                  "(imgfab.ops.synthetic_model), made inside the image; this proves the image starts, "
                  "loads a checkpoint of its architecture and serves it, not the model's answers")
# A random-weight model may end an answer at once: run every answer to max_tokens instead
# (vLLM's and trtllm-serve's OpenAI servers take ignore_eos).
SYNTHETIC_BODY = {"ignore_eos": True}


@dataclass
class ShapesReport:
    """One image smoke-tested in one or more run shapes."""

    image: str
    weights: str
    synthetic: bool
    shapes: list[SmokeReport] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.shapes) and all(r.passed for r in self.shapes)

    def to_json(self) -> str:
        return json.dumps({"image": self.image, "passed": self.passed, "weights": self.weights,
                           "synthetic": self.synthetic, "notes": self.notes,
                           "shapes": [asdict(r) for r in self.shapes]}, indent=2)


def model_architecture(model_id: str, compat_dir: Path | None = None) -> str | None:
    """The architecture ``compat/models.yaml`` records for ``model_id`` (None: not recorded)."""
    from imgfab.matrix.compat import default_compat_dir  # noqa: PLC0415

    path = (compat_dir or default_compat_dir()) / "models.yaml"
    rows = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("models") or []
    return next((str(r["architecture"]) for r in rows if r.get("model") == model_id), None)


def make_synthetic_model(image: str, directory: Path, architecture: str, *,
                         mounts: list[tuple[str, str, bool]] = (), engine: Any = None) -> dict[str, Any]:
    """Write a synthetic model of ``architecture`` into ``directory`` (made by
    :func:`synthetic_directory`) with the image's own Python (numpy, safetensors, tokenizers),
    as the image's user; returns what the generator printed."""
    from imgfab.ops.synthetic_model import ARCHITECTURES  # noqa: PLC0415

    if architecture not in ARCHITECTURES:
        raise RecipeError(f"no synthetic model for architecture {architecture!r}",
                          field="--architecture", fix=f"one of: {', '.join(ARCHITECTURES)}")
    engine = engine or importlib.import_module("imgfab.docker.engine")
    script = (resources.files("imgfab.ops") / "synthetic_model.py").read_text(encoding="utf-8")
    out = engine.run_python(image, script, ["/synthetic", architecture],
                            mounts=[(str(directory), "/synthetic", False), *mounts])
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise EngineError(f"the synthetic model generator printed no result: {out[-200:]!r}",
                          field="--synthetic-model", fix="see the message") from None


def image_uid(config_user: str) -> int:
    """The uid of an image's ``USER`` (``10001:10001`` → 10001); EngineError for root/none."""
    head = (config_user or "").split(":", 1)[0]
    if not head.isdigit() or int(head) == 0:
        raise EngineError(f"the image's USER is {config_user!r}, not a numeric non-root uid",
                          field="IMAGE", fix="smoke an image built by imgfab")
    return int(head)


def api_key_file() -> tuple[str, Path]:
    """A fresh random API key and a file holding it, in a directory of its own (remove it with
    :func:`remove_directory` of the parent). The file is world-readable: the image's user, not
    this one, reads it through the bind mount."""
    key = secrets.token_urlsafe(32)
    directory = Path(tempfile.mkdtemp(prefix="imgfab-smoke-key-"))
    directory.chmod(0o755)
    path = directory / "api-key"
    path.write_text(key, encoding="utf-8")
    path.chmod(0o644)
    return key, path


def smoke_shapes(image: str, settings: RunSettings, names: list[str] | tuple[str, ...], *,
                 uid: int, cache_volume: str | None = None, engine: Any = None,
                 weights: str = "", synthetic_note: str = "", api_key: bool = False) -> ShapesReport:
    """Smoke-test ``image`` in each shape of ``names`` (:data:`imgfab.render.shapes.SHAPES`), in that
    order. ``cache_volume``: the JIT cache volume run.sh and compose share (None: a fresh one,
    removed afterwards). ``api_key`` (a vLLM image): each shape gets a fresh key file where the
    run artifacts mount it, the client sends it, and a server with a listed route that answers
    without it fails; without one, the routes are not checked (the report says so)."""
    engine = engine or importlib.import_module("imgfab.docker.engine")
    report = ShapesReport(image=image, weights=synthetic_note or weights, synthetic=bool(synthetic_note))
    volume = cache_volume or f"imgfab-smoke-{uuid.uuid4().hex[:8]}-cache"
    key_dir = None
    if api_key:
        key, key_path = api_key_file()
        key_dir = key_path.parent
        settings = replace(settings, api_key=key,
                           mounts=(*settings.mounts, (str(key_path), shapes.API_KEY_FILE, True)))
    else:
        report.notes.append(f"routes not checked without a key: {image} is given no API key "
                            f"(trtllm-serve checks none)")
    try:
        for name in names:
            shape = shapes.shape(name, uid=uid, cache=volume)
            report.shapes.append(smoke_image(image, replace(settings, shape=shape), engine))
    finally:
        if key_dir is not None:
            remove_directory(key_dir)
        if cache_volume is None:
            try:
                engine.remove_volume(volume)
            except EngineError as exc:
                report.notes.append(f"cache volume {volume} not removed: {exc.one_line()}")
    return report


def open_routes(labels: dict[str, str]) -> frozenset[tuple[str, str]]:
    """The routes an image answers without its key: GET /health, and GET /metrics where the
    recipe opted in (``org.imgfab.serve.metrics_unauthenticated``)."""
    if labels.get("org.imgfab.serve.metrics_unauthenticated") == "true":
        return OPEN_ROUTES | {METRICS}
    return OPEN_ROUTES


def synthetic_directory(uid: int) -> Path:
    """A fresh directory for the synthetic model that the image's user ``uid`` writes and
    serves through a bind mount, and that no other user of this host can reach: ``model`` in a
    parent of this process's own, mode 0700 (remove the parent, :func:`remove_directory`).

    The directory is mode 0700 and owned by ``uid`` when this process runs as root (it gives
    the directory away) or as ``uid``. Otherwise it cannot be given away, so it is mode 0777
    behind its 0700 parent: the engine resolves a bind mount's source itself, so the container
    needs no way through the parent, and no other user of the host has one."""
    parent = Path(tempfile.mkdtemp(prefix="imgfab-synthetic-"))
    directory = parent / "model"
    directory.mkdir()
    if os.geteuid() == 0:
        os.chown(directory, uid, -1)
    directory.chmod(0o700 if os.geteuid() in (0, uid) else 0o777)
    return directory


def remove_directory(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def build_smoke(image: str, recipe: Any, options: Any) -> dict[str, Any]:
    """``imgfab build --smoke``: the image in every run shape (run.sh, compose, k8s), as
    ``imgfab smoke`` starts it, with the build's weights (``options``: its BuildOptions)."""
    gpus: Any = None if options.smoke_gpus == "none" else options.smoke_gpus
    ulimits = {"memlock": -1, "stack": 67108864} if options.smoke_memlock else {"stack": 67108864}
    settings = RunSettings(gpus=gpus, shm_size=recipe.image.shm_size, ulimits=ulimits,
                           mounts=((str(Path(options.weights).resolve()),
                                    recipe.model.mount_path, True),),
                           container_port=recipe.serve.port, completions=True,
                           open_routes=OPEN_ROUTES | ({METRICS} if recipe.serve.metrics_unauthenticated
                                                      else set()))
    report = smoke_shapes(image, settings, SHAPES, uid=recipe.image.uid,
                          weights=str(options.weights), api_key=recipe.backend.name == "vllm")
    return {"passed": report.passed,
            "failures": [f"{r.shape}: {f}" for r in report.shapes for f in r.failures],
            "shapes": {r.shape: {"passed": r.passed, "healthy_after_s": r.healthy_after_s,
                                 "ttft_ms": r.ttft_ms, "tokens_per_s": r.tokens_per_s}
                       for r in report.shapes}}


def _pull_auth(image: str) -> dict[str, str] | None:
    """The credentials ``imgfab push`` would use for ``image``'s registry (None: anonymous)."""
    from imgfab.docker.credentials import Credentials  # noqa: PLC0415
    from imgfab.docker.registry_http import ImageRef  # noqa: PLC0415

    return Credentials.load(ImageRef.parse(image).host).auth_config()


def smoke_command(image: str, *, weights: Path | None, architecture: str | None = None,
                  shapes: tuple[str, ...] = SHAPES, gpus: Any = "all", devices: tuple[str, ...] = (),
                  mounts: list[tuple[str, str, bool]] = (), env: dict[str, str] | None = None,
                  network: str | None = None, cache_volume: str | None = None,
                  timeout_s: float = 900.0, memlock: bool = True, engine: Any = None,
                  pull: bool = True, progress: Any = None, log_dir: Path | None = None) -> ShapesReport:
    """``imgfab smoke``: ``image`` (built by imgfab: its labels give the mount, port and shm)
    in each of ``shapes``, serving ``weights`` or, when None, a synthetic model of
    ``architecture`` (default: compat/models.yaml for the image's model id) made inside the
    image. ``log_dir``: each shape's whole container log is written there (``<shape>.log``).
    ``mounts``, ``devices``, ``env`` and ``network`` reach every container (GPU access
    without the NVIDIA runtime, a host without a bridge network). RecipeError for an image
    imgfab did not build, an architecture it cannot make, or weights of another model;
    CompatibilityError for weights that cannot fit (before any container starts); EngineError
    from the engine.

    An image the engine does not hold is pulled first (unless not ``pull``), with the registry's
    credentials as ``imgfab push`` finds them and the bytes read reported to ``progress``: a GPU
    host smokes ``REGISTRY/REPO@sha256:…`` as CI pushed it, and a multi-GB pull is not silent."""
    engine = engine or importlib.import_module("imgfab.docker.engine")
    if not engine.has_image(image):
        if not pull:
            raise EngineError(f"image {image} is not on the engine", field="IMAGE",
                              fix="pull it (drop --no-pull) or build it (imgfab build)")
        engine.pull_image(image, auth_config=_pull_auth(image), progress=progress)
    config = engine.inspect_image(image).get("Config") or {}
    labels = config.get("Labels") or {}
    if "org.imgfab.model.mount" not in labels:
        raise RecipeError(f"{image} has no org.imgfab labels", field="IMAGE",
                          fix="smoke an image built by imgfab")
    uid = image_uid(str(config.get("User") or ""))
    directory, note = None, ""
    # Real weights at hand: refuse a model that cannot fit before any container starts.
    fit = weights_fit(labels, weights) if weights is not None else ""
    if weights is None:
        model_id = labels.get("org.imgfab.model.id", "")
        architecture = architecture or model_architecture(model_id)
        if architecture is None:
            raise RecipeError(f"compat/models.yaml has no architecture for {model_id}",
                              field="--architecture", fix="name it, e.g. --architecture LlamaForCausalLM")
        directory = synthetic_directory(uid)
        weights = directory
        note = SYNTHETIC_NOTE.format(architecture=architecture)
    if progress is not None:  # after every refusal: a bad input stays one line
        progress.step(f"smoke {image}: {', '.join(shapes)}")
    try:
        if directory is not None:
            make_synthetic_model(image, directory, architecture, mounts=list(mounts), engine=engine)
        ulimits = {"memlock": -1, "stack": 67108864} if memlock else {"stack": 67108864}
        settings = RunSettings(
            gpus=gpus, shm_size=int(labels["org.imgfab.shm.min_bytes"]), ulimits=ulimits,
            mounts=((str(Path(weights).resolve()), labels["org.imgfab.model.mount"], True), *mounts),
            env=dict(env or {}), devices=tuple(devices), network=network,
            container_port=int(labels["org.imgfab.serve.port"]), health_timeout_s=timeout_s,
            completions=True, extra_body=dict(SYNTHETIC_BODY) if directory is not None else {},
            open_routes=open_routes(labels), log_dir=str(log_dir) if log_dir else None)
        report = smoke_shapes(image, settings, shapes, uid=uid, cache_volume=cache_volume,
                              engine=engine, weights=str(weights), synthetic_note=note,
                              api_key=labels.get("org.imgfab.backend") == "vllm")
        if fit:
            report.notes.insert(0, fit)
        return report
    finally:
        if directory is not None:
            remove_directory(directory.parent)
