"""The planted-bug harness's rules (issue 31): what a plant is, whether it still applies to the
tree, and what a pytest run on a planted copy proves.

A plant is *killed* only when a named test fails on an assertion or on an exception the product
raised. Anything else that turns pytest red is a *harness error*: the plant's text is not found
exactly once, the patched module no longer compiles or imports, a test module fails to collect,
pytest stops on a usage error, or the only failures are ImportError or SyntaxError. A harness
error fails the harness run; it never counts as a kill.

``check_plants`` applies every plant in memory, without running a test, and says which no longer
apply (``python tests/mutation/test_planted_bugs.py --check-plants``).
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# Exceptions that say the code under test did not load: a plant that raises them broke the tree,
# it did not change what the product does.
BROKEN_CODE = frozenset({"ImportError", "ModuleNotFoundError", "SyntaxError", "IndentationError",
                         "TabError"})
# pytest's exit codes other than 0 (all passed) and 1 (some tests failed).
PYTEST_EXITS = {2: "interrupted (a collection error?)", 3: "internal error", 4: "usage error",
                5: "no tests collected"}
KILLED, SURVIVED, HARNESS_ERROR = "killed", "survived", "harness-error"


@dataclass(frozen=True)
class Plant:
    name: str
    path: str  # relative to src/imgfab (templates and compat through its _data links)
    old: str
    new: str
    first: tuple[str, ...] = ()  # test files to run first (the rest of the suite follows)


@dataclass(frozen=True)
class Verdict:
    """What one pytest run on a planted copy proves: ``kind`` is KILLED, SURVIVED or
    HARNESS_ERROR; ``test`` names the test that killed the plant (or went wrong); ``why`` is one
    line for a person."""

    kind: str
    test: str = ""
    why: str = ""


def grouped_plants(directory: Path) -> list[Plant]:
    """Plants kept in ``directory`` one module per area (``plants_*.py``, each a ``PLANTS`` list
    of dicts with Plant's fields), so that areas worked on in parallel never edit one list."""
    found: list[Plant] = []
    for path in sorted(directory.glob("plants_*.py")):
        spec = importlib.util.spec_from_file_location(f"_imgfab_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        found += [Plant(**{**fields, "first": tuple(fields.get("first", ()))})
                  for fields in module.PLANTS]
    return found


def apply(plant: Plant, text: str) -> str:
    """``text`` with the plant's ``old`` replaced by its ``new``. Raises ValueError when ``old``
    does not occur exactly once."""
    count = text.count(plant.old)
    if count != 1:
        raise ValueError(f"its old text occurs {count} times in {plant.path}, not once")
    return text.replace(plant.old, plant.new)


# --- what a pytest run proves -------------------------------------------------------------------

_LOCATION = re.compile(r"^(?P<path>\S.*?):(?P<line>\d+): (?P<type>[\w.]+)$")


def _raised(element: ET.Element) -> tuple[str, str]:
    """(exception type name, file it was raised in) of a junit failure or error element. pytest
    ends the traceback with ``path:line: Type``; the message starts ``Type: ...`` otherwise."""
    lines = (element.text or "").rstrip().splitlines()
    found = _LOCATION.match(lines[-1]) if lines else None
    if found:
        return found["type"].rpartition(".")[2], found["path"]
    message = element.get("message") or ""
    head = re.match(r"(?:failed on \w+ with \")?([\w.]+): ", message)
    return (head[1].rpartition(".")[2] if head else ""), ""


def _in_product(path: str) -> bool:
    return re.search(r"(^|/)src/imgfab/", path) is not None


def _one_line(text: str | None, limit: int = 200) -> str:
    return " ".join((text or "").split())[:limit]


def classify(returncode: int, junit_xml: str | None) -> Verdict:
    """The verdict of one pytest run (``--junitxml``) on a planted copy.

    KILLED: a test's call failed on an assertion or on any exception but ImportError and
    SyntaxError (and their kin), or a test's fixture failed on an exception raised inside
    ``src/imgfab``. SURVIVED: pytest exited 0. HARNESS_ERROR: everything else (exit codes 2 to 5,
    a collection error, a fixture error outside the product, a failure that is an ImportError or
    SyntaxError, a run that left no readable report)."""
    if returncode in PYTEST_EXITS:
        return Verdict(HARNESS_ERROR, why=f"pytest exit {returncode}: {PYTEST_EXITS[returncode]}")
    try:
        cases = list(ET.fromstring(junit_xml or "").iter("testcase"))
    except ET.ParseError as error:
        return Verdict(HARNESS_ERROR, why=f"pytest left no readable junit report ({error})")
    if returncode == 0:
        return Verdict(SURVIVED)
    first_problem: Verdict | None = None
    for case in cases:
        test = "::".join(part for part in (case.get("classname"), case.get("name")) if part)
        for element in case:
            if element.tag not in ("failure", "error"):
                continue
            kind, where = _raised(element)
            message = _one_line(element.get("message"))
            collection = element.tag == "error" and message == "collection failure"
            product = element.tag == "failure" or _in_product(where)
            if kind not in BROKEN_CODE and product and not collection:
                return Verdict(KILLED, test=test, why=message)
            first_problem = first_problem or Verdict(
                HARNESS_ERROR, test=test, why=f"{element.tag}, not a kill: {kind or '?'}: {message}")
    return first_problem or Verdict(HARNESS_ERROR, why=f"pytest exit {returncode} with no failed test")


# --- --check-plants: every plant applied in memory ----------------------------------------------

def _module_name(relative: str) -> str:
    parts = ["imgfab", *Path(relative).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The imgfab modules ``name`` (the file ``path``) imports when it is imported: its
    module-level import statements and its parent packages."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    pending = list(ast.parse(path.read_text(encoding="utf-8")).body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            pending += [child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt)]
    return found & known


def _dependents(source: Path) -> dict[str, set[str]]:
    """For each imgfab module under ``source``: itself and every module whose import imports it."""
    files = {_module_name(str(p.relative_to(source))): p for p in source.rglob("*.py")}
    closure = {name: _imports(path, name, set(files)) for name, path in files.items()}
    changed = True
    while changed:
        changed = False
        for deps in closure.values():
            grown = deps.union(*(closure[d] for d in deps))
            changed |= grown != deps
            deps |= grown
    return {name: {name} | {m for m, deps in closure.items() if name in deps} for name in files}


class _PatchedModule(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves one module from patched source; every other module is found as usual."""

    def __init__(self, name: str, source: str, origin: str) -> None:
        self.name, self.code = name, compile(source, origin, "exec", dont_inherit=True)

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        spec.loader = self
        return spec

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        exec(self.code, module.__dict__)  # noqa: S102 - the planted module's own code


def _import_in_child(job: dict, source: Path, modules: set[str]) -> tuple[int, int]:
    """Fork; the child imports ``modules`` again, the job's module from its patched text.
    Returns (pid, read end of a pipe carrying the child's one-line problem, if any)."""
    read, write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        os.close(write)
        return pid, read
    os.close(read)
    name = _module_name(job["path"])
    status, doing = 0, f"importing {name}"
    try:
        for loaded in modules:
            sys.modules.pop(loaded, None)
        sys.meta_path.insert(0, _PatchedModule(name, job["patched"], str(source / job["path"])))
        for loaded in sorted(modules):
            doing = f"importing {loaded}"
            importlib.import_module(loaded)
    except BaseException as error:  # noqa: BLE001 - whatever the import raised is the report
        os.write(write, f"{doing}: {type(error).__name__}: {_one_line(str(error))}".encode())
        status = 1
    os._exit(status)


def _import_checks(jobs: list[dict], source: Path) -> dict[str, str]:
    """Each job's module, and every module that imports it, imported again in a forked child
    with the plant applied, as many at once as there are CPUs. A problem per plant name."""
    modules = _dependents(source)
    for name in modules:
        importlib.import_module(name)  # the parent holds every module unplanted
    workers = max(1, len(os.sched_getaffinity(0)))
    running: dict[int, tuple[str, int]] = {}
    problems: dict[str, str] = {}
    pending = list(jobs)
    while pending or running:
        while pending and len(running) < workers:
            job = pending.pop()
            pid, pipe = _import_in_child(job, source, modules[_module_name(job["path"])])
            running[pid] = (job["plant"], pipe)
        pid = next(iter(running))  # the oldest child; never another's (os.wait could reap one)
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        plant, pipe = running.pop(pid)
        with os.fdopen(pipe, "rb") as stream:
            said = stream.read().decode(errors="replace")
        if status:
            problems[plant] = said or f"the import child ended with status {status}"
    return problems


# Plant paths are relative to src/imgfab: the shipped matrix through its _data link, the frozen
# one the resolver, matrix and fit tests read from the tests' fixtures.
SHIPPED_COMPAT = "_data/compat/"
FROZEN_COMPAT = "../../tests/fixtures/compat_frozen/"


def _check_matrix(job: dict, compat_copy: Path) -> str:
    """The matrix loads from ``compat_copy`` with the job's file patched, or refuses the data
    with imgfab's own error (a plant may well make the data invalid); any other exception, a
    YAML error included, is a problem."""
    import yaml  # noqa: PLC0415 - imgfab's dependency, on the worker's path

    from imgfab.errors import ImgfabError  # noqa: PLC0415
    from imgfab.matrix.compat import load_matrix  # noqa: PLC0415

    yaml.safe_load(job["patched"])
    path = compat_copy / Path(job["path"]).name
    original = path.read_text(encoding="utf-8")
    path.write_text(job["patched"], encoding="utf-8")
    try:
        load_matrix(compat_copy)
    except ImgfabError:
        return ""
    except Exception as error:  # noqa: BLE001 - the plant broke the loader, not the data's rules
        return f"load_matrix raised {type(error).__name__}: {_one_line(str(error))}"
    finally:
        path.write_text(original, encoding="utf-8")
    return ""


def _check_template(job: dict) -> str:
    import jinja2  # noqa: PLC0415 - imgfab's dependency, on the worker's path

    from imgfab.render.templating import OPTIONS  # noqa: PLC0415
    jinja2.Environment(**OPTIONS).parse(job["patched"])
    return ""


def worker() -> None:
    """The checks that import imgfab, in a process whose imgfab is the checked tree's: reads
    ``{"repo": ..., "jobs": [{"plant", "path", "patched"}]}`` on stdin, writes ``{plant: problem}``
    as the last line of stdout."""
    request = json.load(sys.stdin)
    repo = Path(request["repo"])
    problems: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="imgfab-plants-") as scratch:
        # the shipped matrix and the logic tests' frozen one (tests/fixtures/compat_frozen)
        copies = {}
        for prefix, source in ((SHIPPED_COMPAT, repo / "compat"), (FROZEN_COMPAT, repo / "tests/fixtures/compat_frozen")):
            if source.is_dir():
                copies[prefix] = Path(scratch) / source.name
                shutil.copytree(source, copies[prefix])
        for job in request["jobs"]:
            try:
                prefix = next((p for p in copies if job["path"].startswith(p)), None)
                if job["path"].endswith(".j2"):
                    problems[job["plant"]] = _check_template(job)
                elif prefix is not None and job["path"].endswith(".yaml"):
                    problems[job["plant"]] = _check_matrix(job, copies[prefix])
            except Exception as error:  # noqa: BLE001 - any failure to parse is the report
                problems[job["plant"]] = f"{type(error).__name__}: {_one_line(str(error))}"
    python = [job for job in request["jobs"] if job["path"].endswith(".py")]
    problems.update(_import_checks(python, repo / "src" / "imgfab"))
    print(json.dumps({plant: problem for plant, problem in problems.items() if problem}))


def check_plants(plants: Iterable[Plant], repo: Path) -> list[tuple[Plant, str]]:
    """Every plant applied in memory to ``repo``'s files, without running a test: its ``old``
    text occurs exactly once and differs from ``new``, its ``first`` test files exist, and the
    patched file still compiles and imports (Python: the module and every module importing it),
    parses (a template) or loads (compat data: the matrix loads, or refuses the data with
    imgfab's own error). The checks that import imgfab run in one subprocess with ``repo``'s
    ``src`` first on its path. Returns each broken plant with one line saying why, in order;
    raises RuntimeError when that subprocess fails."""
    source = repo / "src" / "imgfab"
    plants = list(plants)
    problems: dict[str, str] = {}
    jobs = []
    for plant in plants:
        target = source / plant.path
        missing = [name for name in plant.first if not (repo / name).is_file()]
        try:
            if plant.old == plant.new:
                raise ValueError("its old and new text are the same")
            if missing:
                raise ValueError(f"its first test files do not exist: {', '.join(missing)}")
            patched = apply(plant, target.read_text(encoding="utf-8"))
            if target.suffix == ".py":
                compile(patched, str(target), "exec", dont_inherit=True)
            jobs.append({"plant": plant.name, "path": plant.path, "patched": patched})
        except Exception as error:  # noqa: BLE001 - any failure to apply is the report
            problems[plant.name] = f"{type(error).__name__}: {_one_line(str(error))}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(repo / "src"), str(Path(__file__).parent)]))
    done = subprocess.run([sys.executable, "-c", "import plant_harness; plant_harness.worker()"],
                          input=json.dumps({"repo": str(repo), "jobs": jobs}), cwd=repo, env=env,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"the check worker failed: {_one_line(done.stderr[-600:], 600)}")
    problems.update(json.loads(done.stdout.strip().splitlines()[-1]))
    return [(plant, problems[plant.name]) for plant in plants if plant.name in problems]


# --- a pytest run on a planted copy -------------------------------------------------------------

SUITE_MARKERS = "not gpu and not integration and not mutation and not fuzz"


def suite_env(root: Path) -> dict[str, str]:
    """The environment of a run on the copy at ``root``: its ``src`` first on the path."""
    env = dict(os.environ, PYTHONPATH=str(root / "src"), XDG_CACHE_HOME=str(root / "cache"))
    env.pop("DOCKER_HOST", None)  # the suite here is the non-integration one
    return env


def run_suite(root: Path, selection: list[str], *options: str) -> tuple[subprocess.CompletedProcess, str]:
    """pytest on the copy at ``root`` (the non-integration suite, ``-rfE``, a junit report);
    returns the run and its junit XML ("" if pytest wrote none)."""
    report = root / "harness" / "junit.xml"
    report.unlink(missing_ok=True)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *options, "-q", "-rfE", "-p", "no:cacheprovider",
         f"--junitxml={report}", "-m", SUITE_MARKERS, *selection], cwd=root, env=suite_env(root),
        capture_output=True, text=True, timeout=900)
    return result, report.read_text(encoding="utf-8") if report.is_file() else ""


def main(plants: list[Plant], repo: Path, argv: list[str]) -> int:
    """``--check-plants``: one line per broken plant and a count; exit 1 if any is broken."""
    if argv != ["--check-plants"]:
        print(f"usage: {Path(sys.argv[0]).name} --check-plants (got {' '.join(argv) or 'nothing'})",
              file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        broken = check_plants(plants, repo)
    except RuntimeError as error:
        print(f"check-plants: {error}", file=sys.stderr)
        return 1
    for plant, problem in broken:
        print(f"broken plant: {plant.name!r} ({plant.path}): {problem}")
    print(f"check-plants: {len(plants)} plants, {len(broken)} broken, "
          f"{time.monotonic() - started:.1f} s")
    return 1 if broken else 0
