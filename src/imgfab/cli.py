"""Thin click layer: parse arguments, call one function, print.

Heavy modules (pydantic, jinja2, docker, requests) are imported inside the commands that need
them, so `imgfab --help` starts fast. Every :class:`~imgfab.errors.ImgfabError` is caught once,
in :func:`main`, and printed as one line with exit code 2 (user input) or 1 (environment).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from imgfab.errors import ImgfabError, RecipeError


class _Context:
    debug = False


_STATE = _Context()


def _fail(error: ImgfabError) -> None:
    click.echo(f"imgfab: {error.one_line()}", err=True)
    sys.exit(error.exit_code)


def _driver_option(value: str | None, flag: str = "--driver") -> str | None:
    if value is None:
        return None
    from imgfab.rules import parse_version

    try:
        parse_version(value)
    except ValueError:
        raise RecipeError(f"{value!r} is not a driver version", field=flag,
                          fix="give the version nvidia-smi prints, e.g. 535.104.05") from None
    return value


def _load(recipe_path: str, compat_dir: str | None, driver: str | None):
    from imgfab.compat import load_matrix
    from imgfab.recipe import load_recipe
    from imgfab.resolve import Host, resolve

    recipe = load_recipe(recipe_path)
    matrix = load_matrix(Path(compat_dir) if compat_dir else None)
    host = Host(driver=driver) if driver else None
    return recipe, matrix, resolve(recipe, matrix, host)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(package_name="imgfab")
def cli(debug: bool) -> None:
    """imgfab: recipe → resolved stack → pinned, tested, pushed inference image."""
    _STATE.debug = debug


compat_option = click.option("--compat-dir", type=click.Path(file_okay=False, exists=True),
                             help="Use this compat/ directory instead of the shipped matrix.")


@cli.command()
@click.argument("recipe", type=click.Path(dir_okay=False))
@click.option("--driver", help="Resolve for this exact host driver instead of the recipe's floor.")
@click.option("--json", "as_json", is_flag=True, help="Print the stack and rejections as JSON.")
@compat_option
def resolve(recipe: str, driver: str | None, as_json: bool, compat_dir: str | None) -> None:
    """Print the stack RECIPE resolves to and why each other candidate was rejected."""
    from imgfab.report import print_resolution

    _, matrix, resolution = _load(recipe, compat_dir, _driver_option(driver))
    if as_json:
        click.echo(json.dumps({"stack": resolution.stack.to_dict(),
                               "rejected": [r.__dict__ for r in resolution.rejections],
                               "dropped_at_load": [list(d) for d in matrix.dropped]},
                              indent=2, sort_keys=True))
    else:
        print_resolution(resolution)


@cli.command()
@click.argument("recipe", type=click.Path(dir_okay=False))
@click.option("--output", "-o", type=click.Path(file_okay=False),
              help="Directory for the build context (default: build/<recipe name>).")
@click.option("--driver", help="Resolve for this exact host driver instead of the recipe's floor.")
@compat_option
def render(recipe: str, output: str | None, driver: str | None, compat_dir: str | None) -> None:
    """Render RECIPE's build context: Dockerfile, lock file, run artifacts."""
    from imgfab.render import render_context, write_context

    parsed, matrix, resolution = _load(recipe, compat_dir, _driver_option(driver))
    files = render_context(parsed, resolution.stack, matrix)
    target = write_context(files, Path(output) if output else Path("build") / parsed.name)
    click.echo(f"rendered {len(files)} files into {target}")


@cli.command()
@click.option("--gpu", required=True, help="GPU name or alias, e.g. H100, L40S, A100-80GB.")
@click.option("--driver", required=True, help="Host driver version, e.g. 550.54.15.")
@click.option("--policy", type=click.Choice(["strict", "minor-compat"]), default="strict",
              show_default=True, help="Driver policy to evaluate under.")
@click.option("--precision", default="auto", show_default=True,
              help="Precision to check (fp8, int4_awq, nvfp4, ...).")
@click.option("--json", "as_json", is_flag=True)
@compat_option
def matrix(gpu: str, driver: str, policy: str, precision: str, as_json: bool,
           compat_dir: str | None) -> None:
    """Which stacks fit a host (GPU + driver), and why the others don't."""
    from imgfab.compat import load_matrix
    from imgfab.report import print_host_fit
    from imgfab.resolve import fits_host

    loaded = load_matrix(Path(compat_dir) if compat_dir else None)
    rows = fits_host(loaded, gpu, _driver_option(driver) or driver, policy, precision)
    if as_json:
        click.echo(json.dumps([{
            "backend": r.backend, "version": r.version,
            "fits": f is not None,
            "cuda": f["toolkit"].version if f else None,
            "os": f["os"].name if f else None,
            "driver_floor": f["floor"] if f else None,
            "rejected": [x.__dict__ for x in fails]} for r, f, fails in rows], indent=2))
    else:
        print_host_fit(loaded, gpu, driver, policy, rows)


@cli.command()
def schema() -> None:
    """Print the recipe JSON Schema (for editors)."""
    from imgfab.recipe import recipe_json_schema

    click.echo(json.dumps(recipe_json_schema(), indent=2, sort_keys=True))


@cli.command()
@click.argument("recipes", nargs=-1, type=click.Path(dir_okay=False))
@compat_option
def bases(recipes: tuple[str, ...], compat_dir: str | None) -> None:
    """Print the upstream base images RECIPES resolve to, one per line (for mirroring)."""
    refs: set[str] = set()
    for path in recipes:
        _, _, resolution = _load(path, compat_dir, None)
        refs.update((resolution.stack.builder_image, resolution.stack.runtime_image))
    for ref in sorted(refs):
        click.echo(ref)


@cli.group()
def compat() -> None:
    """Maintain the compatibility matrix."""


@compat.command("refresh")
@click.option("--compat-dir", type=click.Path(file_okay=False, exists=True), default="compat",
              show_default=True, help="The compat/ directory to regenerate in place.")
def compat_refresh(compat_dir: str) -> None:
    """Regenerate the vLLM / torch / TensorRT-LLM tables from PyPI metadata."""
    from imgfab.refresh import refresh

    for line in refresh(Path(compat_dir)):
        click.echo(line)


def main() -> None:
    """Console entry point: run the CLI, turning imgfab errors into one line and an exit code."""
    debug = "--debug" in sys.argv[1:]
    try:
        cli.main(standalone_mode=False)
    except ImgfabError as error:
        if debug:
            raise
        _fail(error)
    except click.exceptions.Abort:
        click.echo("imgfab: aborted", err=True)
        sys.exit(1)
    except click.ClickException as error:
        error.show()
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as error:  # a bug: still one line, the traceback behind --debug
        if debug:
            raise
        click.echo(f"imgfab: internal error: {error.__class__.__name__}: {error} "
                   "(run with --debug for the traceback)", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
