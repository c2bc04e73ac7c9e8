"""Thin click layer: parse arguments, call one function, print.

Heavy modules (pydantic, jinja2, docker, requests) are imported inside the commands that need
them, so `imgfab --help` starts fast. Every :class:`~imgfab.errors.ImgfabError` is caught once,
in :func:`main`, and printed as one line with exit code 2 (user input) or 1 (environment).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import click

from imgfab import interrupts
from imgfab.errors import ImgfabError, RecipeError, printable
from imgfab.render.shapes import SHAPES


class _Context:
    json_command: str | None = None  # the command answering in JSON (imgfab.output's contract)
    emitted = False  # its one object has been printed


_STATE = _Context()


def _fail(error: ImgfabError) -> None:
    if _STATE.json_command and not _STATE.emitted:  # the failure is inside the one object too
        from imgfab.output import error_object

        _emit(_STATE.json_command, exit_code=error.exit_code, error=error_object(error))
    _say(f"imgfab: {error.one_line()}", err=True)
    sys.exit(error.exit_code)


def _say(text: str, *, err: bool = False, nl: bool = True) -> None:
    """Print ``text`` for a person (stdout, or stderr with ``err``) without a terminal control:
    file names, registry text and server answers are untrusted (:func:`imgfab.errors.printable`)."""
    click.echo(printable(text), err=err, nl=nl)


def _json(command: str, as_json: bool) -> bool:
    """Start ``command``'s JSON answer when ``as_json``: from here a failure prints its object."""
    if as_json:
        _STATE.json_command, _STATE.emitted = command, False
    return as_json


def _emit(command: str, *, exit_code: int = 0, error: dict | None = None, **fields) -> None:
    """Print ``command``'s one JSON object (:func:`imgfab.output.document`), once."""
    from imgfab.output import document, dumps

    click.echo(dumps(document(command, exit_code=exit_code, error=error, **fields)))
    _STATE.emitted = True


def _emit_failure(command: str, error: ImgfabError, **fields) -> None:
    """Print ``command``'s object for ``error`` with what the command knew (then re-raise it)."""
    from imgfab.output import error_object

    _emit(command, exit_code=error.exit_code, error=error_object(error), **fields)


def _exit_with(command: str, as_json: bool, code: int, message: str, field: str, fix: str,
               **fields) -> None:
    """A check that found the world wrong: its object (with ``fields``) or nothing, then
    ``message`` as the one stderr line, then exit ``code``."""
    error = ImgfabError(message, field=field, fix=fix)
    error.exit_code = code
    if as_json:
        _emit_failure(command, error, **fields)
    _say(f"imgfab: {error.one_line()}", err=True)
    sys.exit(code)


def _driver_option(value: str | None, matrix, flag: str = "--driver") -> str | None:
    """The driver version ``value`` names (imgfab.matrix.drivers.read_host_driver): R580 is
    the branch's newest release the matrix knows, said in a note on stderr."""
    if value is None:
        return None
    from imgfab.matrix.drivers import read_host_driver

    driver, note = read_host_driver(value, matrix, flag)
    if note:
        _say(f"imgfab: note: {note}", err=True)
    return driver


def _load(recipe_path: str, compat_dir: str | None, driver: str | None, weights: str | None = None):
    from imgfab.matrix.compat import load_matrix
    from imgfab.recipe import load_recipe
    from imgfab.stack.resolve import Host, resolve

    recipe = load_recipe(recipe_path)
    matrix = load_matrix(Path(compat_dir) if compat_dir else None)
    driver = _driver_option(driver, matrix)
    host = Host(driver=driver) if driver else None
    read = _weights_facts(weights) if weights else None
    return recipe, matrix, resolve(recipe, matrix, host, read, f"{weights}/config.json" if weights else "")


def _weights_facts(directory: str):
    """The model facts of a weights directory (config.json, safetensors headers); RecipeError
    (exit 2) naming --weights when they cannot be read."""
    from imgfab.in_image.fit import FactsError, read_model_dir

    if not Path(directory).is_dir():
        raise RecipeError(f"{directory} is not a directory", field="--weights",
                          fix="give the directory holding the model's config.json")
    try:
        return read_model_dir(directory)
    except FactsError as exc:
        raise RecipeError(str(exc), field="--weights",
                          fix="give the model's directory as downloaded (config.json, *.safetensors)") from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(package_name="imgfab")
def cli(debug: bool) -> None:
    """imgfab: recipe → resolved stack → pinned, tested, pushed inference image.

    Every command takes --json: one object with schema_version and command, the failure
    inside it too (`imgfab schema --of output` is its JSON Schema)."""
    # --debug is declared here for --help; main() reads it from argv, around the whole run.
    _STATE.json_command, _STATE.emitted = None, False


compat_option = click.option("--compat-dir", type=click.Path(file_okay=False, exists=True),
                             help="Use this compat/ directory instead of the shipped matrix.")
json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print one JSON object (schema_version, command, ok, error).")


@cli.command()
@click.argument("recipe", type=click.Path(dir_okay=False))
@click.option("--driver", help="Resolve for this exact host driver instead of the recipe's floor.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the stack and every rejection as one JSON object (a failure too).")
@click.option("--weights", type=click.Path(), default=None,
              help="The model's directory: its config.json and safetensors headers give the fit "
                   "check the facts the recipe does not declare (and must agree with those it does).")
@compat_option
def resolve(recipe: str, driver: str | None, as_json: bool, weights: str | None,
            compat_dir: str | None) -> None:
    """Print the stack RECIPE resolves to and why each other candidate was rejected."""
    from dataclasses import replace

    from imgfab.errors import CompatibilityError
    from imgfab.matrix.compat import load_matrix
    from imgfab.payload.lock import committed_lock, served_stack
    from imgfab.recipe import load_recipe
    from imgfab.report import print_resolution
    from imgfab.stack.resolve import Host, resolve as resolve_stack

    _json("resolve", as_json)
    parsed = load_recipe(recipe)
    matrix = load_matrix(Path(compat_dir) if compat_dir else None)
    host_driver = _driver_option(driver, matrix)
    read = _weights_facts(weights) if weights else None
    try:
        resolution = resolve_stack(parsed, matrix, Host(driver=host_driver) if host_driver else None,
                                   read, f"{weights}/config.json" if weights else "")
    except CompatibilityError as error:
        if as_json:  # every candidate and the constraint that eliminated it
            _emit_failure("resolve", error, stack=None, rejected=error.rejected,
                          dropped_at_load=[list(d) for d in matrix.dropped])
        raise
    # The image's arch label as its committed lock's cubin cut leaves it (what a build labels).
    lock = committed_lock(recipe, parsed, resolution.stack, Path(compat_dir) if compat_dir else None)
    served = served_stack(resolution.stack, lock)
    if served.archs != resolution.stack.archs:
        dropped = [a for a in resolution.stack.archs if a not in served.archs]
        note = (f"kernels for {', '.join(dropped)} dropped: the lock cuts the cubins built for "
                f"{' '.join(lock.cubins_cut)}, which {served.gpu} cannot run")  # type: ignore[union-attr]
        resolution = replace(resolution, stack=replace(served, notes=served.notes + (note,)))
    if as_json:
        _emit("resolve", stack=resolution.stack.to_dict(),
              rejected=[dict(r.__dict__) for r in resolution.rejections],
              dropped_at_load=[list(d) for d in matrix.dropped])
    else:
        print_resolution(resolution)


@cli.command()
@click.argument("recipe", type=click.Path(dir_okay=False))
@click.option("--output", "-o", type=click.Path(file_okay=False),
              help="Directory for the build context (default: build/<recipe name>).")
@click.option("--driver", help="Resolve for this exact host driver instead of the recipe's floor.")
@click.option("--force", is_flag=True,
              help="Replace --output even when it holds something other than a previous render.")
@click.option("--registry", "registry_host", envvar="IMGFAB_REGISTRY",
              help="Registry the run artifacts name (default: image.registry; env IMGFAB_REGISTRY).")
@click.option("--unlocked", is_flag=True,
              help="Render without a fresh, installable lock, to read the context: its "
                   "requirements.lock says `not locked` and the context does not build.")
@json_option
@compat_option
def render(recipe: str, output: str | None, driver: str | None, force: bool,
           registry_host: str | None, unlocked: bool, as_json: bool, compat_dir: str | None) -> None:
    """Render RECIPE's build context: Dockerfile, lock file, run artifacts.

    The context installs the recipe's committed lock, which must be fresh and installable (as
    `imgfab build` needs it): a missing, stale or refused lock is exit 2 unless --unlocked.
    An existing output directory is replaced only when it holds a previous render (or is
    empty); anything else needs --force."""
    from imgfab.payload.lock import committed_lock, load_for_build
    from imgfab.render.context import render_context, write_context
    from imgfab.render.source import source_of

    _json("render", as_json)
    parsed, matrix, resolution = _load(recipe, compat_dir, driver)
    compat_path = Path(compat_dir) if compat_dir else None
    lock = committed_lock(recipe, parsed, resolution.stack, compat_path)
    if lock is None and not unlocked:
        try:  # says why: missing, stale, refused, unhashed
            load_for_build(recipe, parsed, resolution.stack, None, compat_path)
        except ImgfabError as error:
            error.fix = f"{error.fix}; or pass --unlocked to render a context that does not build"
            raise
        raise RecipeError("the committed lock is not installable", field="lock",
                          fix=f"run `imgfab lock {recipe}` and commit the lock")
    files = render_context(parsed, resolution.stack, matrix, lock=lock,
                           registry=registry_host or parsed.image.registry, source=source_of(recipe))
    target = Path(output) if output else Path("build") / parsed.name
    try:
        write_context(files, target, force=force)
    except OSError as exc:
        raise ImgfabError(f"cannot write {target}: {exc.strerror or exc}", field="--output",
                          fix="check the path and the free space") from None
    if as_json:
        _emit("render", recipe=recipe, output=str(target), files=sorted(files), locked=lock is not None)
    else:
        _say(f"rendered {len(files)} files into {target}")
    if lock is None:
        _say(f"imgfab: note: {target}/requirements.lock is not locked (the committed lock is "
                   f"missing, stale or refused): this context does not build", err=True)
    if not (registry_host or parsed.image.registry):
        from imgfab.render.context import UNSET_REGISTRY

        click.echo(f"imgfab: note: no registry given: {target}/k8s.yaml names the image under "
                   f"{UNSET_REGISTRY} (it does not deploy until rendered with --registry), and "
                   f"run.sh and compose.yaml run the image built here only, never pulled", err=True)


@cli.command()
@click.option("--gpu", required=True, help="GPU name or alias, e.g. H100, L40S, A100-80GB, or the name "
                                           "nvidia-smi prints (NVIDIA H100 80GB HBM3).")
@click.option("--driver", required=True, help="Host driver version, e.g. 550.54.15.")
@click.option("--policy", type=click.Choice(["strict", "minor-compat", "forward-compat"]),
              default="strict", show_default=True,
              help="Driver policy to evaluate under (as target.driver_policy).")
@click.option("--precision", default="auto", show_default=True,
              help="Precision to check (fp8, int4_awq, nvfp4, ...).")
@json_option
@compat_option
def matrix(gpu: str, driver: str, policy: str, precision: str, as_json: bool,
           compat_dir: str | None) -> None:
    """Which stacks fit a host (GPU + driver), and why the others don't."""
    from imgfab.matrix.compat import load_matrix
    from imgfab.report import print_host_fit
    from imgfab.stack.resolve import fits_host

    _json("matrix", as_json)
    loaded = load_matrix(Path(compat_dir) if compat_dir else None)
    driver = _driver_option(driver, loaded) or driver
    rows = fits_host(loaded, gpu, driver, policy, precision)
    if as_json:
        _emit("matrix", host={"gpu": gpu, "driver": driver, "policy": policy, "precision": precision},
              stacks=[{"backend": r.backend, "version": r.version, "fits": f is not None,
                       "cuda": f["toolkit"].version if f else None,
                       "os": f["os"].name if f else None,
                       "driver_floor": f["floor"] if f else None,
                       "rejected": [dict(x.__dict__) for x in fails]} for r, f, fails in rows])
    else:
        print_host_fit(loaded, gpu, driver, policy, rows)


@cli.command()
@click.option("--of", "kind", type=click.Choice(["recipe", "output"]), default="recipe",
              show_default=True,
              help="recipe: the recipe files' schema (for editors); output: every command's --json object.")
@click.option("--output", "-o", type=click.Path(dir_okay=False),
              help="Write the schema to this file (atomically) instead of stdout.")
@json_option
def schema(kind: str, output: str | None, as_json: bool) -> None:
    """Print (or write) a JSON Schema: the recipe's, or the --json contract's."""
    _json("schema", as_json)
    if kind == "recipe":
        from imgfab.recipe import recipe_json_schema

        document = recipe_json_schema()
    else:
        from imgfab.output import output_schema

        document = output_schema()
    text = json.dumps(document, indent=2, sort_keys=True) + "\n"
    if output:
        from imgfab.output import write_atomically

        try:
            write_atomically(Path(output), text)
        except OSError as exc:
            raise ImgfabError(f"cannot write {output}: {exc.strerror or exc}", field="--output",
                              fix="name a file in a directory that exists and is writable") from None
    if as_json:
        _emit("schema", of=kind, output=output, schema=None if output else document)
    elif output:
        _say(f"wrote {output}")
    else:
        _say(text, nl=False)


@cli.command()
@click.argument("recipes", nargs=-1, type=click.Path(dir_okay=False))
@json_option
@compat_option
def bases(recipes: tuple[str, ...], as_json: bool, compat_dir: str | None) -> None:
    """Print the upstream base images RECIPES resolve to, one per line (for mirroring)."""
    _json("bases", as_json)
    refs: set[str] = set()
    for path in recipes:
        _, _, resolution = _load(path, compat_dir, None)
        refs.update((resolution.stack.builder_image, resolution.stack.runtime_image))
    if as_json:
        _emit("bases", images=sorted(refs))
        return
    for ref in sorted(refs):
        _say(ref)


def _ask(value: str | None, flag: str, prompt: str, *, default: str | None = None,
         fix: str) -> str:
    """``value``, else a prompt on a terminal, else ``default``; without any: exit 2 naming ``flag``."""
    if value:
        return value
    if sys.stdin.isatty() and sys.stdout.isatty():
        return click.prompt(prompt, default=default)
    if default is not None:
        return default
    raise RecipeError(f"{flag} is needed (no terminal to ask on)", field=flag, fix=fix)


@cli.command()
@click.option("--model", help="Hugging Face model id (org/name) or an absolute local path.")
@click.option("--revision", help="The model's pinned commit (40 hex digits; needed for a hub id).")
@click.option("--gpu", help="Target GPU: a compat/gpus.yaml name or alias (H100, L40S, ...).")
@click.option("--driver", help="The fleet's oldest driver version, e.g. 535.104.05.")
@click.option("--backend", type=click.Choice(["vllm", "tensorrt-llm"]), help="Inference server (default vllm).")
@click.option("--precision", type=click.Choice(["none", "bfloat16", "float16", "fp8", "int8_sq",
                                                 "int4_awq", "nvfp4"]),
              help="Quantization, or the dtype without one (default none: bfloat16).")
@click.option("--policy", type=click.Choice(["strict", "minor-compat", "forward-compat"]),
              help="Driver policy (target.driver_policy; default strict, or minor-compat when "
                   "only that fits the driver).")
@click.option("--name", help="Recipe name (default: from the model and the GPU).")
@click.option("--output", "-o", type=click.Path(dir_okay=False),
              help="Where to write it (default recipes/<name>.yaml).")
@click.option("--force", is_flag=True, help="Replace an existing file.")
@json_option
@compat_option
def init(model: str | None, revision: str | None, gpu: str | None, driver: str | None,
         backend: str | None, precision: str | None, policy: str | None, name: str | None,
         output: str | None, force: bool, as_json: bool, compat_dir: str | None) -> None:
    """Write a commented starter recipe from flags (or prompts on a terminal), resolved as it is
    written: a recipe no stack fits is not written. Never replaces a file without --force."""
    from imgfab.matrix.compat import load_matrix
    from imgfab.output import write_atomically
    from imgfab.render.starter import StarterAnswers, starter_name, starter_recipe

    _json("init", as_json)
    model = _ask(model, "--model", "Model (Hugging Face id or absolute path)",
                 fix="e.g. --model Qwen/Qwen2-7B-Instruct")
    if not model.startswith("/"):
        revision = _ask(revision, "--revision", "Pinned revision (40-hex commit)",
                        fix="copy the 40-hex commit from the model's 'Files and versions' history")
    gpu = _ask(gpu, "--gpu", "Target GPU", fix="e.g. --gpu H100-SXM (imgfab explain target.gpu)")
    matrix = load_matrix(Path(compat_dir) if compat_dir else None)
    driver = _driver_option(_ask(driver, "--driver", "Fleet's oldest driver",
                                 fix="e.g. --driver 535.104.05 (what nvidia-smi prints)"), matrix)
    backend = _ask(backend, "--backend", "Backend", default="vllm", fix="vllm or tensorrt-llm")
    precision = _ask(precision, "--precision", "Precision", default="none",
                     fix="none, fp8, int8_sq, int4_awq or nvfp4")
    known = matrix.host_gpu(gpu, field="--gpu")  # a matrix name, alias or nvidia-smi's name
    answers = StarterAnswers(model=model, revision=revision, gpu=known.name,
                             driver=driver or "", backend=backend, precision=precision,
                             policy=policy, name=name)
    target = Path(output) if output else \
        Path("recipes") / f"{name or starter_name(model, answers.gpu)}.yaml"
    text, recipe, resolution = starter_recipe(answers, matrix, str(target))
    try:  # no-clobber in the write itself: a file that appears meanwhile is not replaced either
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(target, text, replace=force)
    except FileExistsError:
        raise RecipeError(f"{target} exists", field="--output",
                          fix="pass --force to replace it, or --output another file") from None
    except OSError as exc:
        raise ImgfabError(f"cannot write {target}: {exc.strerror or exc}", field="--output",
                          fix="check the path and the free space") from None
    stack = resolution.stack
    from imgfab.stack.advisories import stack_advisories

    advisories = stack_advisories(matrix, stack)
    if as_json:
        _emit("init", recipe=str(target), stack=stack.to_dict(), advisories=advisories)
        return
    _say(f"wrote {target}: {recipe.name} resolves to {stack.backend} {stack.backend_version}, "
               f"CUDA {stack.cuda} on {stack.os}, driver floor {stack.driver_floor} "
               f"({recipe.target.driver_policy})")
    for note in advisories:
        _say(f"advisory: {note}")
    _say(f"next: imgfab lock {target} && imgfab build {target}")


@cli.command()
@click.argument("recipes", nargs=-1, required=True, type=click.Path(dir_okay=False))
@json_option
@compat_option
def validate(recipes: tuple[str, ...], as_json: bool, compat_dir: str | None) -> None:
    """Check RECIPES without rendering: every failing field of each, then whether a stack fits.
    Exit 2 when any recipe fails."""
    from imgfab.matrix.compat import load_matrix
    from imgfab.output import error_object
    from imgfab.recipe import load_recipe
    from imgfab.stack.advisories import stack_advisories
    from imgfab.stack.resolve import resolve as resolve_stack

    _json("validate", as_json)
    matrix = load_matrix(Path(compat_dir) if compat_dir else None)
    checked = []
    for path in recipes:
        errors: list[dict] = []
        advisories: list[str] = []
        try:
            advisories = stack_advisories(matrix, resolve_stack(load_recipe(path), matrix).stack)
        except RecipeError as error:
            problems = error.problems or ((error.field or "recipe", error.message, error.fix),)
            errors = [error_object(RecipeError(m, field=f, fix=x)) for f, m, x in problems]
        except ImgfabError as error:
            errors = [error_object(error)]
        checked.append({"path": path, "ok": not errors, "errors": errors, "advisories": advisories})
        if not as_json:
            _say(f"{path}: ok" if not errors else f"{path}: {len(errors)} problem(s)")
            for error in errors:
                _say(f"  {error['line']}")
            for note in advisories:
                _say(f"  advisory: {note}")
    failed = [c["path"] for c in checked if not c["ok"]]
    if failed:
        _exit_with("validate", as_json, 2, f"{len(failed)} of {len(checked)} recipes fail: "
                   f"{', '.join(failed)}", "validate", "fix each field named above", recipes=checked)
    if as_json:
        _emit("validate", recipes=checked)


@cli.command("list")
@click.argument("directory", default="recipes", type=click.Path(file_okay=False))
@json_option
@compat_option
def list_recipes(directory: str, as_json: bool, compat_dir: str | None) -> None:
    """List the recipes in DIRECTORY (default recipes/): model, GPU, backend, precision and
    whether each one's committed lock is current."""
    from imgfab.output import error_object
    from imgfab.payload.lock import check_lock
    from imgfab.recipe import load_recipe

    _json("list", as_json)
    folder = Path(directory)
    if not folder.is_dir():
        raise RecipeError(f"{directory} is not a directory", field="DIRECTORY",
                          fix="name the folder that holds the recipes (default recipes/)")
    compat_path = Path(compat_dir) if compat_dir else None
    rows = []
    for path in sorted(folder.glob("*.yaml")) + sorted(folder.glob("*.yml")):
        row = {"path": str(path), "name": None, "model": None, "gpu": None, "backend": None,
               "precision": None, "lock": "invalid", "error": None}
        try:
            recipe = load_recipe(path)
            row.update(name=recipe.name, model=recipe.model.id, gpu=recipe.target.gpu,
                       backend=str(getattr(recipe.backend.name, "value", recipe.backend.name)),
                       precision=str(getattr(recipe.engine.quantization, "value",
                                             recipe.engine.quantization)))
            result = check_lock(str(path), compat_path)
            row["lock"] = ("missing" if result.problem == "missing" else "stale") \
                if result.problem else ("refused" if result.refused else "current")
        except ImgfabError as error:
            row["error"] = error_object(error)
        rows.append(row)
    if as_json:
        _emit("list", directory=directory, recipes=rows)
        return
    for row in rows:
        if row["error"]:
            _say(f"{row['path']}: {row['error']['line']}")
        else:
            _say(f"{row['path']}: {row['model']} on {row['gpu']}, {row['backend']}, "
                       f"{row['precision']}; lock {row['lock']}")


@cli.command()
@click.argument("field", required=False)
@json_option
def explain(field: str | None, as_json: bool) -> None:
    """Explain a recipe FIELD (e.g. engine.quantization): what it means, its type, default,
    choices and examples. Without FIELD: every field, one line each."""
    from imgfab.recipe import ALIASES, AMBIGUOUS_ALIASES, recipe_fields

    _json("explain", as_json)
    fields = recipe_fields()
    if field is None:
        if as_json:
            raise RecipeError("explain --json answers one field", field="FIELD",
                              fix="e.g. imgfab explain engine.quantization --json")
        for path, info in fields.items():
            _say(f"{path}: {info['description']}")
        return
    info = fields.get(field.strip())
    if info is None:
        close = [p for p in fields if p.rsplit(".", 1)[-1] == field.rsplit(".", 1)[-1]]
        raise RecipeError(f"{field!r} is not a recipe field", field="FIELD",
                          fix=f"did you mean {' or '.join(close)}?" if close else
                          "`imgfab explain` lists every field")
    if as_json:
        _emit("explain", field=field, **info)
        return
    _say(f"{field}: {info['description']}")
    for key in ("type", "choices", "default", "examples"):
        if info.get(key) not in (None, []):
            _say(f"  {key}: {json.dumps(info[key], ensure_ascii=False)}")
    for typed, (exact, meaning) in sorted(ALIASES.get(field, {}).items()):
        _say(f"  {typed!r} is written {exact} ({meaning})" if exact else f"  {typed!r}: {meaning}")
    for typed, choices in sorted(AMBIGUOUS_ALIASES.get(field, {}).items()):
        _say(f"  {typed!r} is ambiguous, refused: " + " or ".join(f"{exact} ({meaning})"
                                                                 for exact, meaning in choices))


def _host_gpu(driver: str | None, gpu: str | None):
    """--driver/--gpu, or this host's (NVML, else nvidia-smi) when either is omitted."""
    from imgfab.in_image.facts import load_nvml
    from imgfab.matrix.compat import load_matrix
    from imgfab.ops.host import read_this_host
    from imgfab.ops.select import host_gpu

    matrix = load_matrix()
    return host_gpu(matrix, lambda: read_this_host(load_nvml()),
                    driver=_driver_option(driver, matrix), gpu=gpu)


@cli.command("select")
@click.option("--registry", "repository", required=True, help="REGISTRY/REPOSITORY to choose from.")
@click.option("--driver", help="Host driver (default: this host's, via NVML or nvidia-smi).")
@click.option("--gpu", help="Host GPU: a compat/gpus.yaml name or alias, or the name nvidia-smi prints "
                            "(default: this host's first GPU, matched by its name and memory).")
@click.option("--model", help="Only images of this recipe name prefix or model id.")
@click.option("--backend", type=click.Choice(["vllm", "tensorrt-llm"]))
@click.option("--explain", is_flag=True, help="Every published tag and why it was or was not chosen.")
@json_option
@click.option("--verify-key", type=click.Path(dir_okay=False),
              help="Only images signed by this cosign public key, with their SBOM and provenance "
                   "attested (a key-signed image is checked without a transparency log unless --tlog).")
@click.option("--certificate-identity", help="Keyless: the signer's certificate identity.")
@click.option("--certificate-oidc-issuer", help="Keyless: the signer's OIDC issuer.")
@click.option("--tlog", is_flag=True, help="--verify-key: also require a transparency-log entry.")
def select_image(repository: str, driver: str | None, gpu: str | None, model: str | None,
                 backend: str | None, explain: bool, as_json: bool, verify_key: str | None,
                 certificate_identity: str | None, certificate_oidc_issuer: str | None,
                 tlog: bool) -> None:
    """Print the digest reference of the newest published image that fits a host."""
    from imgfab.docker import registry
    from imgfab.errors import CompatibilityError, RegistryError
    from imgfab.matrix.compat import load_matrix
    from imgfab.ops.select import Published, advisory_lines, choose, choose_verified, what_host_needs

    _json("select", as_json)
    trust = None
    if verify_key or certificate_identity or certificate_oidc_issuer:
        from imgfab.supply.cosign import Trust, cosign_binary

        if verify_key and not Path(verify_key).is_file():
            raise RecipeError(f"{verify_key} is not a file", field="--verify-key",
                              fix="give the cosign public key (cosign.pub)")
        trust = Trust(key=Path(verify_key) if verify_key else None,
                      identity=certificate_identity, issuer=certificate_oidc_issuer,
                      tlog=tlog or not verify_key)
        cosign_binary()  # a missing cosign is an environment failure before any registry call
    host = _host_gpu(driver, gpu)
    registry_host = repository.split("/", 1)[0]
    credentials = registry.Credentials.load(registry_host)
    images = []
    for tag in registry.list_tags(repository, credentials):
        ref = f"{repository}:{tag}"
        try:  # one tag the registry cannot describe is one rejected candidate
            # The digest printed is the sha256 of the very manifest bytes the labels came from.
            # An index is resolved to the host's platform, as the daemon pulling it would.
            digest, labels, platform = registry.published_image(ref, credentials, platform=host.platform)
            images.append(Published(repository, tag, digest, labels, config_platform=platform))
        except RegistryError as error:
            images.append(Published(repository, tag, "", {}, error=error.one_line()))
    if trust is None:
        best, candidates = choose(images, host, model=model, backend=backend)
    else:
        from imgfab.supply.cosign import verify

        def problems(image: Published) -> list[str]:
            return verify(image.reference, trust, credentials).problems

        best, candidates = choose_verified(images, host, problems, model=model, backend=backend)
    advisories = advisory_lines(load_matrix(), best, candidates) if best else []
    error = None
    if best is None:
        nearest = ", ".join(c.tag for c in candidates[:3]) or "none"
        error = CompatibilityError(
            f"no image in {repository} fits {host.gpu} (cc {host.compute_capability}, "
            f"{host.platform}) with driver {host.driver}; nearest: {nearest}", field="select",
            fix=f"the host would need {what_host_needs(candidates, host)}")
        error.exit_code = 1
    if as_json:
        from imgfab.output import error_object

        _emit("select", exit_code=error.exit_code if error else 0,
              error=error_object(error) if error else None, host=dict(host.__dict__),
              selected=best.image.reference if best else None, advisories=advisories,
              candidates=[{"tag": c.image.tag, "reference": c.image.reference, "fits": c.fits,
                           "reason": c.reason(), "pull_requires": c.pull_requires,
                           "toolchain": c.toolchain,
                           "platform": c.platform,
                           **c.rejection()} for c in candidates])
    elif explain:
        if host.seen:
            _say(f"host: {host.gpu} (cc {host.compute_capability}), driver {host.driver}; "
                       f"read from {host.seen}")
        _say(f"host platform: {host.platform} ({host.platform_seen})")
        for candidate in candidates:
            mark = "*" if best is candidate else ("+" if candidate.fits else "-")
            pull = f" (pull needs {candidate.pull_requires})" if candidate.pull_requires else ""
            cc = f" (runtime C compiler: {candidate.toolchain})" if candidate.toolchain else ""
            _say(f"{mark} {candidate.tag}: {candidate.reason()}{pull}{cc}")
    if error is not None:
        raise error
    if not as_json:
        if best.pull_note():  # stderr: stdout stays the one reference scripts read
            _say(f"note: {best.pull_note()}", err=True)
        if best.toolchain_note():
            _say(f"note: {best.toolchain_note()}", err=True)
        for line in advisories:
            _say(f"advisory: {line}", err=True)
        _say(best.image.reference)


def _mount_option(value: str) -> tuple[str, str, bool]:
    """``SRC:DST[:ro]`` → a bind mount (absolute paths, no commas: they reach --mount)."""
    parts = value.split(":")
    read_only = len(parts) == 3 and parts[2] == "ro"
    if len(parts) not in (2, 3) or (len(parts) == 3 and not read_only) or not all(
            p.startswith("/") and "," not in p for p in parts[:2]):
        raise RecipeError(f"{value!r} is not SRC:DST[:ro] with absolute paths and no commas",
                          field="--mount", fix="e.g. --mount /usr/local/nvidia:/usr/local/nvidia:ro")
    return parts[0], parts[1], read_only


def _build_smoke():
    from imgfab.ops.smoke_shapes import build_smoke

    return build_smoke


def _publish():
    from imgfab.supply.publish import publish

    return publish


@cli.command()
@click.argument("image")
@click.option("--weights", type=click.Path(file_okay=False, exists=True),
              help="Host directory with the weights, mounted read-only at the image's mount path.")
@click.option("--synthetic-model", is_flag=True,
              help="Serve a small random-weight model of the recipe's architecture, made inside "
                   "the image (no weights needed; the report says the weights were synthetic).")
@click.option("--architecture", help="Architecture of the synthetic model (default: compat/models.yaml "
                                     "for the image's model id).")
@click.option("--shape", "shape_names", multiple=True, type=click.Choice([*SHAPES, "all"]),
              default=("all",), show_default=True,
              help="Run shape(s): as run.sh, as compose.yaml, as k8s.yaml would start it.")
@click.option("--gpus", default="all", show_default=True, help="GPUs for the container ('none' for none).")
@click.option("--device", "devices", multiple=True,
              help="A host device to pass through (e.g. /dev/nvidia0), for engines without the NVIDIA runtime.")
@click.option("--mount", "extra_mounts", multiple=True,
              help="An extra bind mount SRC:DST[:ro] (e.g. the host's driver libraries).")
@click.option("--env", "extra_env", multiple=True, help="An extra variable KEY=VALUE for the container.")
@click.option("--network", type=click.Choice(["bridge", "host"]), default="bridge", show_default=True,
              help="host: no port publishing (engines without a bridge network).")
@click.option("--cache-volume", help="JIT cache volume run.sh and compose share (default: a fresh one, removed after).")
@click.option("--timeout", "timeout_s", default=900.0, show_default=True, help="Seconds to wait for health, per shape.")
@click.option("--log-dir", type=click.Path(file_okay=False),
              help="Write each shape's whole container log there (SHAPE.log), passed or not.")
@click.option("--no-memlock", is_flag=True,
              help="Keep the engine's memlock ulimit (for engines that cannot raise it, e.g. nested in a container).")
@click.option("--pull/--no-pull", default=True, show_default=True,
              help="Pull IMAGE first when the engine does not hold it.")
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object (for CI).")
def smoke(image: str, weights: str | None, synthetic_model: bool, architecture: str | None,
          shape_names: tuple[str, ...], gpus: str, devices: tuple[str, ...],
          extra_mounts: tuple[str, ...], extra_env: tuple[str, ...], network: str,
          cache_volume: str | None, timeout_s: float, log_dir: str | None, no_memlock: bool, pull: bool,
          quiet: bool, as_json: bool) -> None:
    """Start IMAGE in each run shape with its recipe's settings, wait for health, check that every
    route it lists refuses a request without the API key (but GET /health), ask /v1/models,
    /v1/completions and /v1/chat/completions (streamed), and report each shape."""
    from imgfab.ops.smoke_shapes import smoke_command
    from imgfab.progress import for_command

    _json("smoke", as_json)
    if bool(weights) == synthetic_model:
        raise RecipeError("give either --weights DIR or --synthetic-model", field="--weights",
                          fix="--synthetic-model proves start-up and serving without the weights")
    env = {}
    for item in extra_env:
        key, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise RecipeError(f"{item!r} is not KEY=VALUE", field="--env",
                              fix="e.g. --env LD_LIBRARY_PATH=/usr/local/nvidia/lib64")
        env[key] = value
    with for_command(quiet=quiet) as progress:
        report = smoke_command(
            image, weights=Path(weights) if weights else None, architecture=architecture,
            shapes=SHAPES if "all" in shape_names else tuple(dict.fromkeys(shape_names)),
            gpus=None if gpus == "none" else gpus, devices=devices,
            mounts=[_mount_option(m) for m in extra_mounts], env=env,
            network=None if network == "bridge" else network, cache_volume=cache_volume,
            timeout_s=timeout_s, memlock=not no_memlock, pull=pull, progress=progress,
            log_dir=Path(log_dir) if log_dir else None)
    if as_json:
        fields = json.loads(report.to_json())
        if not report.passed:
            failed = [s.shape for s in report.shapes if not s.passed]
            _exit_with("smoke", True, 1, f"smoke of {image} failed in {', '.join(failed) or 'every shape'}",
                       "smoke", "see each shape's failures and the container log", **fields)
        _emit("smoke", **fields)
    else:
        if report.synthetic:
            _say(f"weights: {report.weights}")
        for shape in report.shapes:
            state = "passed" if shape.passed else "FAILED"
            started = f"{shape.healthy_after_s:.1f} s" if shape.healthy_after_s is not None else "-"
            _say(f"smoke {shape.shape} {state}: healthy after {started}, ttft {shape.ttft_ms} ms, "
                       f"{shape.tokens_per_s} tokens/s, models {', '.join(shape.model_ids) or '-'}")
            if shape.routes:  # the route table: what each listed route answered without the key
                click.echo(f"  routes without the key ({len(shape.routes)}):")
                for route in shape.routes:
                    click.echo(f"    {route['status'] or '-'} {route['verdict']:<8} {route['method']} {route['path']}")
            for failure in shape.failures:
                _say(f"  {failure}")
        for line in report.notes:
            _say(f"note: {line}")
    sys.exit(0 if report.passed else 1)


@cli.command()
@click.option("--image", help="Also check whether IMAGE (registry reference) will run here, without pulling it.")
@json_option
def doctor(image: str | None, as_json: bool) -> None:
    """Check this host for what GPU inference images need; each finding with its fix."""
    from imgfab.ops import doctor as checks
    from imgfab.docker import engine

    _json("doctor", as_json)
    labels = None
    if image:
        from imgfab.docker import registry

        credentials = registry.Credentials.load(image.split("/", 1)[0])
        labels = registry.image_labels(image, credentials)
    from imgfab.matrix.compat import load_matrix

    findings = checks.diagnose(checks.live_view(engine.docker_info, engine.buildx_version), image_labels=labels,
                               matrix=load_matrix())
    code = checks.exit_code(findings)
    if as_json:
        fields = {"findings": json.loads(checks.to_json(findings))}
        if code:
            failing = [f.check for f in findings if f.severity == "error"]
            _exit_with("doctor", True, code, f"{len(failing)} finding(s) failed: {', '.join(failing)}",
                       "doctor", "each failing finding says its fix", **fields)
        _emit("doctor", **fields)
    else:
        for finding in findings:
            _say(finding.line())
    sys.exit(code)


@cli.command()
@click.argument("recipes", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--output", "-o", type=click.Path(file_okay=False),
              help="Build context directory (default build/<name>; with several recipes, "
                   "DIR/<name>).")
@click.option("--mirror", envvar="IMGFAB_MIRROR", help="HOST/PREFIX base images are pulled through.")
@click.option("--ca-cert", envvar="IMGFAB_CA_CERT", type=click.Path(dir_okay=False),
              help="CA bundle for build steps (a BuildKit secret, never in a layer).")
@click.option("--pip-index-url", envvar="IMGFAB_PIP_INDEX_URL", help="pip index for the payload.")
@click.option("--network", type=click.Choice(["host"]), help="Build-step network (host: reach 127.0.0.1).")
@click.option("--pin-digests", is_flag=True, help="Pin base images to the registry's current digests.")
@click.option("--push", is_flag=True, help="Push to --registry after verify (and --smoke) pass.")
@click.option("--registry", envvar="IMGFAB_REGISTRY", help="Registry HOST[:PORT] to tag and push to.")
@click.option("--registry-user", help="Registry user (default IMGFAB_REGISTRY_USER or docker login).")
@click.option("--password-stdin", is_flag=True, help="Read the registry password from stdin.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object at the end, a failure too: images[] holds each recipe "
                   "(one or several), a failed one with its step and error.")
@click.option("--bake", "bake_file", type=click.Path(dir_okay=False),
              help="Write a docker buildx bake file for RECIPES instead of building.")
@click.option("--smoke", is_flag=True, help="Smoke-test the image (needs --weights); failure blocks --push.")
@click.option("--weights", type=click.Path(file_okay=False, exists=True),
              help="Weights directory for --smoke.")
@click.option("--smoke-gpus", default="all", show_default=True, help="GPUs for --smoke ('none' for none).")
@click.option("--no-memlock", is_flag=True,
              help="--smoke: keep the engine's memlock ulimit (engines that cannot raise it).")
@click.option("--engine-at-start", is_flag=True,
              help="TensorRT engine path: compile on first start on the target host, into a cache volume.")
@click.option("--engine-out", type=click.Path(file_okay=False),
              help="TensorRT engine path, two-phase: directory for the compiled checkpoint (holds weights).")
@click.option("--no-cache", is_flag=True, help="Run every build step again (cache mounts are kept).")
@click.option("--compression", type=click.Choice(["gzip", "zstd"]), default=None,
              help="Layer compression as built and pushed [default: the recipe's image.compression, "
                   "zstd]; zstd needs Docker >= 23.0 or containerd >= 1.5 on the pulling host and "
                   "the containerd image store on the builder.")
@click.option("--lock", "lock_file", type=click.Path(dir_okay=False),
              help="Install this lock instead of the recipe's committed recipes/<name>.lock (one recipe).")
@click.option("--retag", is_flag=True,
              help="--push: move a tag that already names another image (refused otherwise).")
@click.option("--sign-key", type=click.Path(dir_okay=False), envvar="IMGFAB_SIGN_KEY",
              show_envvar=True,
              help="--push: sign the pushed digest with this cosign key and attest its SBOM and "
                   "provenance (password: IMGFAB_COSIGN_PASSWORD[_FILE]).")
@click.option("--cache-from", "cache_from", multiple=True, metavar="SPEC",
              help="Import a BuildKit cache (repeatable), e.g. "
                   "type=registry,ref=REG/cache:{recipe} ({recipe}: the recipe's name).")
@click.option("--cache-to", "cache_to", multiple=True, metavar="SPEC",
              help="Export the build cache (repeatable), e.g. "
                   "type=registry,ref=REG/cache:{recipe},mode=max.")
@click.option("--builder", help="Build on this buildx builder (docker buildx ls) instead of the "
                                "engine's own.")
@compat_option
def build(recipes: tuple[str, ...], output: str | None, mirror: str | None, ca_cert: str | None,
          pip_index_url: str | None, network: str | None, pin_digests: bool, push: bool,
          registry: str | None, registry_user: str | None, password_stdin: bool, as_json: bool,
          bake_file: str | None, smoke: bool, weights: str | None, smoke_gpus: str,
          no_memlock: bool, engine_at_start: bool, engine_out: str | None, no_cache: bool,
          compression: str | None, lock_file: str | None, retag: bool, sign_key: str | None,
          cache_from: tuple[str, ...], cache_to: tuple[str, ...], builder: str | None,
          compat_dir: str | None) -> None:
    """Build, verify (and optionally smoke-test and push) the image of each RECIPE."""
    _json("build", as_json)
    from imgfab.docker.buildcache import check_builder_name, check_cache_specs

    check_cache_specs(cache_from, cache_to, len(recipes))  # before anything is built
    if builder is not None:
        check_builder_name(builder)
    if sign_key and push:  # before the first step: a key that is not its owner's alone is refused
        from imgfab.supply.cosign import private_key

        private_key(Path(sign_key))
    if lock_file and len(recipes) != 1:
        raise RecipeError("--lock names the lock of one recipe", field="--lock",
                          fix="build one recipe per --lock")
    if bake_file:
        if builder is not None:
            raise RecipeError("--bake writes the file; --builder runs it", field="--builder",
                              fix="imgfab bake RECIPES --build --builder NAME")
        written = _write_bake(recipes, bake_file, mirror=mirror, registry=registry, compat_dir=compat_dir,
                              lock_file=lock_file, quiet=False, cache_from=cache_from,
                              cache_to=cache_to)
        if as_json:
            _emit("build", images=[], bake=str(written), not_built=[])
        else:
            _say(f"wrote {written}")
        return
    from imgfab.docker.build import BuildOptions, BuildProgress, build_recipe

    password = sys.stdin.read().rstrip("\r\n") if password_stdin else None
    options = BuildOptions(mirror=mirror, ca_cert=Path(ca_cert) if ca_cert else None,
                           pip_index_url=pip_index_url, network=network, pin_digests=pin_digests,
                           push=push, registry=registry, registry_user=registry_user,
                           registry_password=password, smoke=smoke,
                           smoke_hook=_build_smoke() if smoke else None,
                           weights=Path(weights) if weights else None, smoke_gpus=smoke_gpus,
                           smoke_memlock=not no_memlock,
                           compat_dir=Path(compat_dir) if compat_dir else None,
                           compile="at-start" if engine_at_start else "auto",
                           engine_out=Path(engine_out) if engine_out else None,
                           lock=Path(lock_file) if lock_file else None, no_cache=no_cache,
                           compression=compression, retag=retag, sign_key=Path(sign_key) if sign_key and push else None,
                           publish_hook=_publish() if push else None, cache_from=cache_from,
                           cache_to=cache_to, builder=builder)
    images: list[dict] = []
    for index, path in enumerate(recipes):
        context = None
        if output:
            context = Path(output) if len(recipes) == 1 else Path(output) / Path(path).stem
        try:
            with BuildProgress(Path(path).name, rich_ui=not as_json) as progress:
                built = build_recipe(path, options, on_line=progress.line, context_dir=context)
        except ImgfabError as error:
            if as_json:  # what was built, this recipe's failing step, what was not reached
                from imgfab.output import error_object

                failed = {"path": path, "ok": False, "error": error_object(error)}
                _emit_failure("build", error, images=[*images, failed], bake=None,
                              not_built=list(recipes[index + 1:]))
            raise
        images.append({"path": path, "ok": True, **built.to_dict()})
        if not as_json:
            cached = ", ".join(f"{stage} {c}/{n}" for stage, (c, n) in built.cached_by_stage.items())
            _say(f"built {built.tags[0]} ({built.image_id[:19]}, "
                       f"{built.size_bytes / 1e6:.0f} MB, {built.duration_s:.1f}s; cached: {cached})")
            if built.pushed:
                _say(f"pushed {built.pushed}")
            if built.publish:
                _say(f"deploy bundle {built.publish['bundle']} "
                           f"({'signed, SBOM and provenance attested' if built.publish['signed'] else 'unsigned'})")
                for note in built.publish.get("notes", []):
                    _say(f"note: {note}", err=True)
    if as_json:
        _emit("build", images=images, bake=None, not_built=[])


def _lock_advisories(path: str, lock, compat_path: Path | None,
                     loaded: dict) -> tuple[list[str], list[str]]:
    """(notes, blocking) of compat/advisories.yaml for every package ``lock`` pins; blocking:
    the critical advisories the recipe's ``backend.accept_advisories`` does not name. ``loaded``
    keeps the matrix across the recipes of one command, read once."""
    from imgfab.matrix.compat import load_matrix
    from imgfab.recipe import load_recipe
    from imgfab.stack.advisories import lock_findings

    if lock is None or not lock.packages:
        return [], []
    accepted = load_recipe(path).backend.accept_advisories
    pins = {name: version for name, (version, _) in lock.packages.items()}
    if "matrix" not in loaded:
        loaded["matrix"] = load_matrix(compat_path)
    return lock_findings(loaded["matrix"], pins, accepted=accepted)


def _refuse_advisories(as_json: bool, blocked: list[str], **fields) -> None:
    if blocked:
        _exit_with("lock", as_json, 2, f"locked packages inside critical advisories: {'; '.join(blocked)}",
                   "backend.accept_advisories", "lock a backend release whose payload resolves the "
                   "fixed releases (backend.version), or name each advisory in "
                   "backend.accept_advisories to accept it", **fields)


@cli.command()
@click.argument("recipes", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--check", is_flag=True,
              help="Offline: exit 1 naming each recipe whose lock is missing or stale.")
@click.option("--online", is_flag=True,
              help="With --check: also compare every pinned hash with the index's own (network).")
@click.option("--allow-refused", is_flag=True,
              help="With --check: a current lock that records a refusal (the recipe cannot build) "
                   "is reported, not exit 2.")
@click.option("--upgrade", is_flag=True, help="Re-resolve even a fresh lock; print what changed.")
@click.option("--index-url", help="Resolve from this index only (a mirror; the tests' fake index).")
@click.option("--output", "-o", type=click.Path(dir_okay=False),
              help="Write the lock here instead of recipes/<name>.lock (one recipe).")
@click.option("--python-version", help="Lock for this Python instead of the stack's (with --output).")
@click.option("--python-platform", help="Lock for this uv platform, e.g. x86_64-manylinux_2_36 (with --output).")
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
@json_option
@compat_option
def lock(recipes: tuple[str, ...], check: bool, online: bool, allow_refused: bool, upgrade: bool,
         index_url: str | None, output: str | None, python_version: str | None,
         python_platform: str | None, quiet: bool, as_json: bool, compat_dir: str | None) -> None:
    """Pin each RECIPE's whole payload with hashes into recipes/<name>.lock.

    --check exits 1 naming each lock that is missing or stale, and 2 naming each current lock
    that records a refusal (that recipe cannot build) unless --allow-refused."""
    from imgfab.payload.lock import check_lock, lock_recipe

    _json("lock", as_json)
    compat_path = Path(compat_dir) if compat_dir else None
    if online and not check:
        raise RecipeError("--online is a kind of --check", field="--online", fix="imgfab lock --check --online RECIPE")
    if allow_refused and not check:
        raise RecipeError("--allow-refused is a kind of --check", field="--allow-refused",
                          fix="imgfab lock --check --allow-refused RECIPE")
    if check:
        from imgfab.payload.online import check_online

        failed = []
        refused = []
        checks = []
        blocked: list[str] = []
        loaded: dict = {}
        for path in recipes:
            result = check_lock(path, compat_path)
            entry = {"path": path, "recipe": result.recipe, "lock": str(result.path),
                     "current": not result.problem, "problem": result.problem or None,
                     "refused": result.refused or None, "note": result.note or None,
                     "online_hashes": None, "advisories": []}
            checks.append(entry)
            if result.problem:
                failed.append(f"{result.recipe} ({result.path.name} {result.problem})")
                continue
            notes, blocking = _lock_advisories(path, result.lock, compat_path, loaded)
            entry["advisories"] = notes
            blocked += [f"{result.recipe}: {b}" for b in blocking]
            if result.refused and not allow_refused:
                refused.append(result.recipe)
            compared = ""
            if online and result.lock is not None and result.lock.packages:
                count = check_online(result.lock, index_url=index_url, source=result.path.name)
                entry["online_hashes"] = count
                compared = f"; {count} hashes match the index"
            if as_json:
                continue
            if result.note:
                _say(f"{result.recipe}: lock current{compared}; {result.note}")
            else:
                _say(f"{result.recipe}: lock current{compared}")
            for note in notes:
                _say(f"  advisory: {note}")
        missing = (f"missing or stale: {'; '.join(failed)}", "lock",
                   "run `imgfab lock RECIPE` and commit the lock")
        if refused:  # exit 2 wins; a missing or stale lock beside it still gets its line
            if failed:
                _say(f"imgfab: {ImgfabError(*missing[:1], field='lock', fix=missing[2]).one_line()}",
                           err=True)
            _exit_with("lock", as_json, 2, f"refused, cannot build: {', '.join(refused)}", "lock",
                       "lock them where their indexes answer, or pass --allow-refused to accept "
                       "the recorded refusals", check=True, locks=checks)
        _refuse_advisories(as_json, blocked, check=True, locks=checks)
        if failed:
            _exit_with("lock", as_json, 1, *missing, check=True, locks=checks)
        if as_json:
            _emit("lock", check=True, locks=checks)
        return
    if output and len(recipes) != 1:
        raise RecipeError("--output names the lock of one recipe", field="--output",
                          fix="lock one recipe per --output")
    from imgfab.errors import CompatibilityError

    from imgfab.progress import for_command

    refused = []
    blocked: list[str] = []
    loaded: dict = {}
    locks: list[dict] = []
    progress = for_command(quiet=quiet)
    for path in recipes:
        try:
            with progress:
                result = lock_recipe(path, upgrade=upgrade, index_url=index_url,
                                     output=Path(output) if output else None,
                                     compat_dir=compat_path, python=python_version,
                                     platform=python_platform, progress=progress)
        except CompatibilityError as error:  # recorded in the lock; the other recipes go on
            from imgfab.output import error_object

            _say(f"imgfab: {error.one_line()}", err=True)
            refused.append(error)
            locks.append({"path": path, "lock": None, "written": None, "packages": None,
                          "diff": [], "error": error_object(error), "advisories": []})
            continue
        notes, blocking = _lock_advisories(path, result.lock, compat_path, loaded)
        blocked += [f"{Path(result.path).stem}: {b}" for b in blocking]
        locks.append({"path": path, "lock": str(result.path), "written": result.written,
                      "packages": len(result.lock.packages), "diff": list(result.diff), "error": None,
                      "advisories": notes})
        if as_json:
            continue
        if not result.written:
            _say(f"{result.path}: current ({len(result.lock.packages)} packages)")
        else:
            _say(f"wrote {result.path} ({len(result.lock.packages)} packages)")
            for line in result.diff:
                _say(f"  {line}")
            if not result.diff:
                _say("  no package changed")
        for note in notes:
            _say(f"  advisory: {note}")
    _refuse_advisories(as_json, blocked, check=False, locks=locks)
    if refused:
        if as_json:
            _emit_failure("lock", refused[0], check=False, locks=locks)
        sys.exit(refused[0].exit_code)
    if as_json:
        _emit("lock", check=False, locks=locks)


@cli.group()
def compat() -> None:
    """Maintain the compatibility matrix."""


@compat.command("refresh")
@click.option("--compat-dir", type=click.Path(file_okay=False, exists=True), default="compat",
              show_default=True, help="The compat/ directory to regenerate in place.")
@click.option("--payload-cache", type=click.Path(file_okay=False), default=".cache/imgfab/payload",
              show_default=True, help="Where the architectures read from wheels are cached.")
@click.option("--no-fatbin", is_flag=True,
              help="Do not read GPU code from wheels; carry fatbin_* fields over.")
@click.option("--payloads", is_flag=True,
              help="Then lock each vLLM release as `imgfab lock` would and record in payloads.yaml "
                   "whether its payload installs cleanly (the resolver rejects one that does not).")
@click.option("--payload-version", "payload_versions", multiple=True, metavar="VERSION",
              help="--payloads: check only this release (repeatable); default every vLLM release "
                   "whose lock inputs changed since its row was written.")
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
@json_option
def compat_refresh(compat_dir: str, payload_cache: str, no_fatbin: bool, payloads: bool,
                   payload_versions: tuple[str, ...], quiet: bool, as_json: bool) -> None:
    """Regenerate the vLLM / torch / TensorRT-LLM tables from PyPI metadata and wheel GPU code
    (and, with --payloads, whether each vLLM release's payload installs cleanly)."""
    from imgfab.matrix.refresh import refresh
    from imgfab.matrix.wheels import PayloadCache
    from imgfab.progress import for_command

    _json("compat refresh", as_json)
    if payload_versions and not payloads:
        raise RecipeError("--payload-version checks payloads", field="--payload-version",
                          fix="add --payloads")
    with for_command(quiet=quiet) as progress:
        read_archs = None if no_fatbin else PayloadCache(Path(payload_cache), progress=progress).archs
        changes = refresh(Path(compat_dir), read_archs=read_archs, progress=progress)
        if payloads:
            from imgfab.payload.verdicts import refresh_payloads

            changes = [*changes, *refresh_payloads(Path(compat_dir), versions=payload_versions,
                                                   progress=progress)]
    if as_json:
        _emit("compat refresh", compat_dir=compat_dir, changes=list(changes))
        return
    for line in changes:
        _say(line)
    if not changes:
        _say(f"{compat_dir}: already matches PyPI's metadata; nothing changed")


@cli.command()
@click.argument("image")
@click.option("--registry", "registry_host", required=True, help="Registry host[:port].")
@click.option("--registry-user", help="User (default: the Docker config's, or IMGFAB_REGISTRY_USER).")
@click.option("--password-stdin", is_flag=True, help="Read the password from stdin.")
@click.option("--attempts", type=click.IntRange(1, 20), default=5, show_default=True,
              help="Tries for transient failures (never for refused credentials).")
@click.option("--retag", is_flag=True,
              help="Move the tag when the registry's tag already names another image.")
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
@json_option
def push(image: str, registry_host: str, registry_user: str | None, password_stdin: bool,
         attempts: int, retag: bool, quiet: bool, as_json: bool) -> None:
    """Push local IMAGE to REGISTRY (same repository and tag); print the digest reference."""
    from imgfab.docker.registry import Credentials, push as push_to_registry, retarget
    from imgfab.progress import for_command

    _json("push", as_json)
    password = sys.stdin.read().rstrip("\r\n") if password_stdin else None
    target = retarget(image, registry_host)
    credentials = Credentials.load(registry_host, registry_user, password)
    with for_command(quiet=quiet) as progress:
        pushed = push_to_registry(image, target, credentials=credentials, attempts=attempts,
                                  retag=retag, progress=progress,
                                  on_line=lambda line: _say(line, err=True)
                                  if line.startswith(("retrying", "--retag")) else None)
    if as_json:
        _emit("push", image=image, target=target, pushed=pushed)
    else:
        _say(pushed)


@cli.command()
@click.argument("image")
@click.option("--to", "target", required=True, help="REGISTRY/REPOSITORY:TAG to promote to.")
@click.option("--sign-key", type=click.Path(dir_okay=False),
              help="Sign the promoted reference with this cosign key (the source must verify first).")
@click.option("--verify-key", type=click.Path(dir_okay=False),
              help="The public key that signed staging: IMAGE's signature, SBOM and provenance must "
                   "verify with it before anything is copied (without a transparency log unless --tlog).")
@click.option("--certificate-identity", help="Keyless: the identity that signed staging.")
@click.option("--certificate-oidc-issuer", help="Keyless: its OIDC issuer.")
@click.option("--tlog", is_flag=True, help="--verify-key: also require a transparency-log entry.")
@click.option("--no-verify-source", is_flag=True,
              help="Sign with --sign-key without verifying IMAGE first (the output says so).")
@click.option("--retag", is_flag=True, help="Move --to's tag when it already names another image.")
@json_option
def promote(image: str, target: str, sign_key: str | None, verify_key: str | None,
            certificate_identity: str | None, certificate_oidc_issuer: str | None, tlog: bool,
            no_verify_source: bool, retag: bool, as_json: bool) -> None:
    """Copy IMAGE (REG/REPO@sha256:…, what passed) to --to by digest, with its attestations:
    oras cp, never a rebuild. With --sign-key, IMAGE must verify first against --verify-key (or
    the keyless identity) that signed staging. Prints the promoted digest reference."""
    from imgfab.supply.promote import promote as promote_image

    _json("promote", as_json)
    if sign_key:  # before anything is copied: a key that is not its owner's alone is refused
        from imgfab.supply.cosign import private_key

        private_key(Path(sign_key))
    trust = None
    if verify_key or certificate_identity or certificate_oidc_issuer:
        from imgfab.supply.cosign import Trust

        if verify_key and not Path(verify_key).is_file():
            raise RecipeError(f"{verify_key} is not a file", field="--verify-key",
                              fix="give the cosign public key that signed staging (cosign.pub)")
        trust = Trust(key=Path(verify_key) if verify_key else None, identity=certificate_identity,
                      issuer=certificate_oidc_issuer, tlog=tlog or not verify_key)
    done = promote_image(image, target, sign_key=Path(sign_key) if sign_key else None, retag=retag,
                         trust=trust, verify_source=not no_verify_source)
    if as_json:
        _emit("promote", **done.to_dict())
    else:
        if not done.source_verified:  # stderr: stdout stays the one reference scripts read
            _say(f"imgfab: note: {done.source} was {done.verification}"
                 + (f"; {done.promoted} is signed with your key all the same" if done.signed else ""),
                 err=True)
        _say(done.promoted)


def _write_bake(recipes: tuple[str, ...], output: str, *, mirror: str | None, registry: str | None,
                compat_dir: str | None, quiet: bool, lock_dir: str | None = None,
                lock_file: str | None = None, cache_from: tuple[str, ...] = (),
                cache_to: tuple[str, ...] = ()) -> Path:
    """The bake file of `imgfab bake` and `imgfab build --bake`, from the same options."""
    from imgfab.progress import for_command
    from imgfab.render.bake import write_bake

    with for_command(quiet=quiet) as progress:
        return write_bake(list(recipes), Path(output), mirror=mirror or None, registry=registry or None,
                          compat_dir=Path(compat_dir) if compat_dir else None,
                          lock_dir=Path(lock_dir) if lock_dir else None,
                          lock=Path(lock_file) if lock_file else None, progress=progress,
                          cache_from=cache_from, cache_to=cache_to)


@cli.command()
@click.argument("recipes", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--output", "-o", type=click.Path(dir_okay=False), default="build/docker-bake.json",
              show_default=True, help="Where to write the bake file.")
@click.option("--mirror", default=lambda: os.environ.get("IMGFAB_MIRROR"),
              help="Registry prefix for base images (default: $IMGFAB_MIRROR).")
@click.option("--registry", "registry_host", default=lambda: os.environ.get("IMGFAB_REGISTRY"),
              help="Registry the tags point at (default: $IMGFAB_REGISTRY).")
@click.option("--lock-dir", type=click.Path(file_okay=False, exists=True),
              help="Take each recipe's lock as DIR/<name>.lock (default: its committed, fresh lock).")
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
@click.option("--cache-from", "cache_from", multiple=True, metavar="SPEC",
              help="Each target imports this BuildKit cache (repeatable; {recipe}: its recipe's name).")
@click.option("--cache-to", "cache_to", multiple=True, metavar="SPEC",
              help="Each target exports its cache here (repeatable), e.g. "
                   "type=registry,ref=REG/cache:{recipe},mode=max.")
@click.option("--build", "run_it", is_flag=True,
              help="Then run `docker buildx bake` on the file (from this directory).")
@click.option("--builder", help="--build: on this buildx builder (docker buildx ls).")
@json_option
@compat_option
def bake(recipes: tuple[str, ...], output: str, mirror: str | None, registry_host: str | None,
         lock_dir: str | None, quiet: bool, cache_from: tuple[str, ...], cache_to: tuple[str, ...],
         run_it: bool, builder: str | None, as_json: bool, compat_dir: str | None) -> None:
    """Render RECIPES and write a docker-bake.json for `docker buildx bake` (--build runs it)."""
    _json("bake", as_json)
    from imgfab.docker.buildcache import check_builder_name, check_cache_specs

    check_cache_specs(cache_from, cache_to, len(recipes))
    if builder is not None:
        if not run_it:
            raise RecipeError("--builder runs the bake", field="--builder",
                              fix="add --build, or pass --builder to docker buildx bake yourself")
        check_builder_name(builder)
    written = _write_bake(recipes, output, mirror=mirror, registry=registry_host, compat_dir=compat_dir,
                          lock_dir=lock_dir, quiet=quiet, cache_from=cache_from, cache_to=cache_to)
    if run_it:
        from imgfab.docker.bakerun import run_bake

        run_bake(written, builder=builder)
    if as_json:
        _emit("bake", output=str(written), recipes=list(recipes), built=run_it, builder=builder)
    else:
        _say(f"wrote {written}" + (f" and built it{f' on {builder}' if builder else ''}" if run_it else ""))


@cli.group()
def ci() -> None:
    """Print CI pipeline definitions."""


@ci.command("github")
@click.argument("recipes", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--registry", "registry_host", default="ghcr.io", show_default=True,
              help="Registry HOST[:PORT][/PATH] the tag builds push to (ghcr.io: under the "
                   "repository owner).")
@click.option("--gpu-runner", help="Self-hosted GPU runner label: TensorRT engine recipes build "
                                   "there (default: --engine-at-start), and each vLLM candidate is "
                                   "smoked there before release.")
@click.option("--imgfab-version", help="Install this imgfab release (with --imgfab-sha256).")
@click.option("--imgfab-sha256", help="The sha256 of the --imgfab-version wheel.")
@click.option("--imgfab-path", help="Install imgfab from this path in the repository (a wheel or "
                                    "a source directory; '.' when the repository is imgfab).")
@click.option("--compat-dir", help="The repository's compat/ directory the jobs build with.")
@click.option("--repository", help="The GitHub repository OWNER/NAME the workflow runs in "
                                   "(for --policy).")
@click.option("--policy", type=click.Path(dir_okay=False),
              help="Write the ClusterImagePolicy admitting only what the release job signs.")
@json_option
def ci_github(recipes: tuple[str, ...], registry_host: str, gpu_runner: str | None,
              imgfab_version: str | None, imgfab_sha256: str | None, imgfab_path: str | None,
              compat_dir: str | None, repository: str | None, policy: str | None,
              as_json: bool) -> None:
    """Print a GitHub Actions workflow: one job per recipe, push on v* tags."""
    from imgfab.output import write_atomically
    from imgfab.render.ci import Install, plan_workflow, workflow_text
    from imgfab.render.ci_values import check_repository

    _json("ci github", as_json)
    if policy is not None and repository is None:
        raise RecipeError("--policy needs the repository whose release job signs",
                          field="--repository", fix="add --repository OWNER/NAME")
    if repository is not None:
        check_repository(repository)
    plan = plan_workflow(list(recipes) or None, registry=registry_host, gpu_runner=gpu_runner,
                         install=Install(imgfab_version, imgfab_sha256, imgfab_path),
                         compat_dir=compat_dir)
    text = workflow_text(plan.workflow, plan.left_out)
    if policy is not None:
        from imgfab.supply.workflow_policy import workflow_policies

        policies = workflow_policies(repository, registry_host, [r.repository for r in plan.released])
        try:
            write_atomically(Path(policy), policies)
        except OSError as exc:
            raise ImgfabError(f"cannot write {policy}: {exc.strerror or exc}", field="--policy",
                              fix="name a file in a directory that exists and is writable") from None
    left_out = plan.left_out
    if as_json:
        _emit("ci github", workflow=text, policy=policy,
              left_out=[{"path": str(p), "refused": str(left_out[p])} for p in sorted(left_out)])
    else:
        _say(text, nl=False)
    for path in sorted(left_out):
        _say(f"imgfab: note: ci github: left out {path}: its lock records a refusal, it "
                   f"cannot build; fix: lock it where its indexes answer", err=True)
    if policy is not None and not as_json:
        _say(f"imgfab: note: ci github: wrote {policy}", err=True)


def _usage_line(error: click.ClickException) -> str:
    """A click error as one line: the command, what was wrong, where to read more."""
    context = getattr(error, "ctx", None)
    words = context.command_path.split()[1:] if context is not None else []
    return RecipeError(error.format_message().rstrip("."), field=" ".join(words) or None,
                       fix=f"see `{' '.join(['imgfab', *words])} --help`").one_line()


def _interrupted(interrupt: KeyboardInterrupt) -> None:
    """Exit ``128 + signum`` after a signal, once its clean-up has run on the way out."""
    code = interrupts.exit_code(interrupt)
    if _STATE.json_command and not _STATE.emitted:
        _emit_failure(_STATE.json_command, _coded(ImgfabError(
            f"stopped by {interrupts.signal_name(interrupt)}", fix="run the command again"), code))
    _say(f"imgfab: stopped by {interrupts.signal_name(interrupt)}", err=True)
    sys.exit(code)


def _coded(error: ImgfabError, code: int) -> ImgfabError:
    error.exit_code = code
    return error


def _json_usage_error(error: click.ClickException, line: str) -> None:
    """A usage error of a command given --json: its object too (the command as typed)."""
    words = []
    context = getattr(error, "ctx", None)
    while context is not None and context.parent is not None:  # the root's name is the program's
        words.insert(0, context.info_name)
        context = context.parent
    if words and not _STATE.emitted:
        from imgfab.output import error_object

        failure = _coded(RecipeError(error.format_message().rstrip(".")), 2)
        _emit(" ".join(words), exit_code=2, error={**error_object(failure), "line": line})


def main() -> None:
    """Console entry point: run the CLI, turning imgfab errors into one line and an exit code."""
    debug = "--debug" in sys.argv[1:]
    interrupts.install()  # SIGTERM / SIGHUP clean up as SIGINT does
    try:
        cli.main(standalone_mode=False)
    except ImgfabError as error:
        if debug:
            raise
        _fail(error)
    except click.exceptions.Abort as error:
        if isinstance(error.__cause__, KeyboardInterrupt):  # click's wrapping of a signal
            _interrupted(error.__cause__)
        _say("imgfab: aborted", err=True)
        sys.exit(1)
    except click.ClickException as error:  # usage errors: one line, exit 2, like ours
        line = _usage_line(error)
        if "--json" in sys.argv[1:]:
            _json_usage_error(error, line)
        _say(f"imgfab: {line}", err=True)
        sys.exit(2)
    except KeyboardInterrupt as interrupt:
        _interrupted(interrupt)
    except Exception as error:  # a bug: still one line, the traceback behind --debug
        if debug:
            raise
        line = (f"internal error: {error.__class__.__name__}: {error} "
                "(run with --debug for the traceback)")
        if _STATE.json_command and not _STATE.emitted:
            _emit_failure(_STATE.json_command, _coded(ImgfabError(line), 1))
        _say(f"imgfab: {line}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
