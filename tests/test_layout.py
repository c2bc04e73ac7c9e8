"""The layout's import rules (docs: README "How a recipe becomes an image").

1. Code in ``imgfab.in_image`` runs inside images (the probe, its rules, the stage script, the
   fat-binary reader the payload measurement runs): it imports the standard library and
   ``imgfab.in_image`` only.
2. Each station imports only stations at or below its own: errors and in_image, then recipe,
   matrix, stack, payload, render, docker, supply (SBOM, provenance, signatures, promotion),
   ops, and the command line on top.
3. No module imports itself through others: the import graph of ``imgfab`` has no cycle (the
   matrix's records and YAML helpers live in ``imgfab.matrix.records``, below the three loaders
   that share them, issue 31).

Every import counts: module level, inside functions, and ``importlib.import_module("imgfab.x")``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from conftest import REPO

PACKAGE = REPO / "src" / "imgfab"
# Rank of each station, bottom first; a module may import its own station and those below.
STATIONS = {"errors": 0, "interrupts": 0, "progress": 0, "cache": 0, "in_image": 0, "recipe": 1, "matrix": 2, "stack": 3, "payload": 4,
            "render": 5, "docker": 6, "supply": 7, "ops": 8, "cli": 9, "report": 9, "output": 9, "__init__": 9}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "_data" not in p.parts)


def _station(path: Path) -> str:
    relative = path.relative_to(PACKAGE)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` for every import in ``path``, relative ones resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = ".".join(("imgfab", *path.relative_to(PACKAGE).with_suffix("").parts[:-1]))
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            if module == "imgfab":  # from imgfab import x: x is a station or a module
                found += [(node.lineno, f"imgfab.{alias.name}") for alias in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            found.append((node.lineno, node.args[0].value))
    return found


def _target_station(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "imgfab" or len(parts) == 1:
        return None
    return parts[1]


# The image's own payload, which the probe imports guarded (a missing one is reported as a
# check it could not run): NVML for the driver and GPUs, torch for the CUDA matmul.
# The image's own payload, imported guarded where a check or role needs it: NVML, torch, and
# ray (vLLM's, on a multi-node leader only: in_image/cluster.py), and triton (the builder's
# kernels stage compiles its launchers with it: in_image/kernels.py --triton).
IMAGE_PAYLOAD = {"pynvml", "ray", "torch", "triton"}


@pytest.mark.parametrize("path", [p for p in _modules() if _station(p) == "in_image"],
                         ids=lambda p: p.name)
def test_in_image_code_imports_only_the_standard_library(path):
    bad = [f"line {line}: {module}" for line, module in _imports(path)
           if module.split(".")[0] not in sys.stdlib_module_names
           and module.split(".")[0] not in IMAGE_PAYLOAD
           and not (module == "imgfab.in_image" or module.startswith("imgfab.in_image."))
           and module != "__future__"]
    assert not bad, f"{path.relative_to(REPO)} imports outside the standard library and in_image: {bad}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_station_imports_one_above_it(path):
    station = _station(path)
    assert station in STATIONS, f"{path.relative_to(REPO)}: a module outside the known stations"
    above = []
    for line, module in _imports(path):
        target = _target_station(module)
        if target is None or target == "__version__":
            continue
        assert target in STATIONS, f"{path.relative_to(REPO)} line {line}: unknown module {module}"
        if STATIONS[target] > STATIONS[station]:
            above.append(f"line {line}: {module} ({target} is above {station})")
    assert not above, f"{path.relative_to(REPO)} imports a station above its own: {above}"


def test_the_rules_see_a_planted_violation(tmp_path):
    """The checker itself: an upward import and a third-party import inside in_image."""
    probe = tmp_path / "probe.py"
    probe.write_text("import yaml\nfrom imgfab.in_image import rules\n")
    assert [m for _, m in _imports(probe) if m.split(".")[0] not in sys.stdlib_module_names] \
        == ["yaml", "imgfab.in_image"]
    assert _target_station("imgfab.ops.smoke") == "ops" and STATIONS["ops"] > STATIONS["docker"]


def _module_name(path: Path, root: Path) -> str:
    relative = path.relative_to(root).with_suffix("")
    parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
    return ".".join(("imgfab", *parts))


def _import_graph(paths: list[Path], root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module → the modules of ``paths`` (the package at ``root``) it imports (anywhere in it, TYPE_CHECKING blocks too):
    ``from imgfab.matrix import compat`` is an edge to ``imgfab.matrix.compat``, ``from
    imgfab.matrix.compat import Gpu`` one to ``imgfab.matrix.compat``."""
    modules = {_module_name(p, root): p for p in paths}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for _, module in _imports(path):
            while module and module not in modules:
                module = module.rpartition(".")[0]
            targets.add(module)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                targets |= {f"{node.module}.{a.name}" for a in node.names} & modules.keys()
        graph[name] = targets - {name, ""}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one node (Tarjan), each
    sorted: every import cycle lies inside one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_no_import_cycle():
    """advisories ↔ compat ↔ gpus imported each other (issue 31); no module may import itself
    back through others."""
    cycles = _cycles(_import_graph(_modules()))
    assert not cycles, f"modules that import each other in a circle: {cycles}"


def test_the_cycle_check_sees_a_planted_cycle(tmp_path):
    """The checker itself: a TYPE_CHECKING import and a `from package import module` close circles."""
    package = tmp_path / "imgfab" / "matrix"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from imgfab.matrix import b\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                  "    from imgfab.matrix.a import Thing\n")
    (package / "c.py").write_text("from imgfab.matrix.a import Thing\n")
    graph = _import_graph(sorted((tmp_path / "imgfab").rglob("*.py")), tmp_path / "imgfab")
    assert graph["imgfab.matrix.c"] == {"imgfab.matrix.a"}
    assert _cycles(graph) == [["imgfab.matrix.a", "imgfab.matrix.b"]]
