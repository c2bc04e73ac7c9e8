#!/usr/bin/env python3
"""Read the command-line flags of one TensorRT-LLM release out of its source, statically.

Writes ``compat/trtllm_flags/<version>.yaml``: every flag of ``trtllm-build``, ``trtllm-serve``
(per subcommand), ``trtllm-refit``, ``trtllm-prune`` and, from a checkout of the release tag,
``examples/quantization/quantize.py`` and the llama/qwen ``convert_checkpoint.py``.  Nothing is
imported or executed: the files are parsed with :mod:`ast` (argparse ``add_argument`` calls,
click ``@option`` decorators, the plugin flags generated from ``PluginConfig``), so no GPU,
no TensorRT and no torch are needed.  Running it twice on the same input gives the same bytes.

Inputs
  SOURCE          the wheel (``tensorrt_llm-<v>-cp312-cp312-linux_x86_64.whl``), an unpacked
                  wheel, or a source checkout of TensorRT-LLM (its root, holding setup.py)
  --examples X    a checkout of the release tag holding ``examples/`` (a directory, or
                  ``GITDIR@REV`` read with ``git show``); without it the example scripts are
                  left out and the file says so
  --label L       how SOURCE is named in ``source:`` when it is not a wheel
                  (e.g. ``NVIDIA/TensorRT-LLM@v1.2.1``); a wheel is named ``pypi:<file>``
  --examples-label  likewise for --examples (default: the ``@REV`` given)
  --unconfirmed   mark every command ``confirmed: false`` and say why (``--note``)

Example (the wheel is on pypi.nvidia.com; pypi.org only has a wheel-stub sdist):
  pip download --no-deps --index-url https://pypi.nvidia.com tensorrt-llm==1.2.1 -d /tmp/w
  git clone --depth 1 -b v1.2.1 https://github.com/NVIDIA/TensorRT-LLM /tmp/trtllm
  python scripts/extract_trtllm_flags.py /tmp/w/tensorrt_llm-1.2.1-*.whl \\
      --examples /tmp/trtllm --examples-label NVIDIA/TensorRT-LLM@v1.2.1

Exit status 0 on success, 2 when a source file has a shape this script does not know (it
never guesses: teach it the new shape instead).
"""

from __future__ import annotations

import argparse
import ast
import configparser
import hashlib
import re
import subprocess
import sys
import warnings
import zipfile
from email.parser import HeaderParser
from pathlib import Path
from typing import Any

import yaml

SCHEMA = 1
# Console scripts whose flags are extracted; the rest are only listed.
COMMANDS = ("trtllm-build", "trtllm-serve", "trtllm-refit", "trtllm-prune")
# Example scripts read from the release tag (not shipped in the wheel).
EXAMPLES = (
    "examples/quantization/quantize.py",
    "examples/models/core/llama/convert_checkpoint.py",
    "examples/models/core/qwen/convert_checkpoint.py",
)
# Requires-Dist entries worth recording next to the flags (what the engine path depends on).
PINNED = ("cuda-python", "nvidia-modelopt", "nvidia-nccl-cu12", "nvidia-nccl-cu13", "tensorrt",
          "torch", "transformers")
_UNRESOLVED = object()


class ExtractionError(Exception):
    """A source file has a shape the extractor does not understand."""


# ----------------------------------------------------------------------------- source trees
class Tree:
    """Read-only view of a release's files, keyed by repository-relative path."""

    label: str

    def read(self, path: str) -> str | None:
        raise NotImplementedError

    def identity(self) -> dict[str, str]:
        raise NotImplementedError


class WheelTree(Tree):
    def __init__(self, wheel: Path):
        self.path = wheel
        self.zip = zipfile.ZipFile(wheel)
        self.names = set(self.zip.namelist())
        self.label = f"pypi:{wheel.name}"

    def read(self, path: str) -> str | None:
        return self.zip.read(path).decode("utf-8") if path in self.names else None

    def dist_info(self) -> str:
        found = sorted({n.split("/")[0] for n in self.names if n.split("/")[0].endswith(".dist-info")})
        if len(found) != 1:
            raise ExtractionError(f"{self.path.name}: expected one .dist-info directory, found {found}")
        return found[0]

    def identity(self) -> dict[str, str]:
        digest = hashlib.sha256(self.path.read_bytes()).hexdigest()
        return {"kind": "wheel", "name": self.path.name, "sha256": digest}


class DirTree(Tree):
    """An unpacked wheel or a source checkout; identity is a digest of the files read."""

    def __init__(self, root: Path, label: str | None):
        self.root = root
        self.label = label or f"dir:{root.name}"
        self.seen: dict[str, str] = {}

    def read(self, path: str) -> str | None:
        file = self.root / path
        if not file.is_file():
            return None
        data = file.read_bytes()
        self.seen[path] = hashlib.sha256(data).hexdigest()
        return data.decode("utf-8")

    def identity(self) -> dict[str, str]:
        # sha256 over "<sha256>  <path>\n" of every file read, sorted by path (sha256sum format).
        listing = "".join(f"{digest}  {path}\n" for path, digest in sorted(self.seen.items()))
        return {"kind": "tree", "name": self.label,
                "sha256_of_files_read": hashlib.sha256(listing.encode()).hexdigest()}


class GitTree(DirTree):
    """``GITDIR@REV``: files read with ``git show REV:path`` (read-only)."""

    def __init__(self, gitdir: Path, rev: str, label: str | None):
        super().__init__(gitdir, label or f"git:{rev}")
        self.rev = rev
        self.commit = self._git("rev-parse", f"{rev}^{{commit}}").strip()

    def _git(self, *args: str) -> str:
        return subprocess.run(["git", "--git-dir", str(self.root), *args], check=True,
                              capture_output=True, text=True).stdout

    def read(self, path: str) -> str | None:
        try:
            text = self._git("show", f"{self.commit}:{path}")
        except subprocess.CalledProcessError:
            return None
        self.seen[path] = hashlib.sha256(text.encode()).hexdigest()
        return text

    def identity(self) -> dict[str, str]:
        return {**super().identity(), "commit": self.commit}


def _where(tree: Tree, path: str) -> str:
    """``<label>:<path>``, or ``<label><path>`` when the label already ends in a folder."""
    return f"{tree.label}{path}" if tree.label.endswith("/") else f"{tree.label}:{path}"


def open_tree(spec: str, label: str | None) -> Tree:
    if "@" in spec and not Path(spec).exists():
        gitdir, rev = spec.rsplit("@", 1)
        path = Path(gitdir)
        if (path / ".git").exists():
            path = path / ".git"
        return GitTree(path, rev, label)
    path = Path(spec)
    if path.is_file() and path.suffix == ".whl":
        if label:
            raise SystemExit("--label is for directories; a wheel is always named pypi:<file>")
        return WheelTree(path)
    if path.is_dir():
        return DirTree(path, label)
    raise SystemExit(f"{spec}: not a wheel, a directory or GITDIR@REV")


# ----------------------------------------------------------------------------- static values
class Module:
    """One parsed source file plus the names bound at its top level."""

    def __init__(self, tree: Tree, path: str, name: str):
        text = tree.read(path)
        if text is None:
            raise ExtractionError(f"{path}: not found in {tree.label}")
        self.tree, self.path, self.name = tree, path, name
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)  # e.g. '\d' in a non-raw string
            self.ast = ast.parse(text, filename=path)
        self.bindings: dict[str, ast.AST] = {}
        self.imports: dict[str, tuple[str, str | None]] = {}
        for node in self.ast.body:
            self._bind(node)

    def _bind(self, node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.bindings[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    self.bindings[target.id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            self.bindings[node.target.id] = node.value
        elif isinstance(node, ast.ImportFrom):
            base = self._absolute(node.module or "", node.level)
            for alias in node.names:
                self.imports[alias.asname or alias.name] = (base, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                self.imports[alias.asname or alias.name.split(".")[0]] = (alias.name, None)
        elif isinstance(node, (ast.If, ast.Try)):
            for child in node.body:
                self._bind(child)

    def _absolute(self, module: str, level: int) -> str:
        if not level:
            return module
        package = self.name.split(".")
        is_package = self.path.endswith("__init__.py")
        base = package[: len(package) - level + (1 if is_package else 0)]
        return ".".join(base + ([module] if module else []))


class Resolver:
    """Evaluates constant-ish expressions across the modules of one tree, never executing code."""

    def __init__(self, tree: Tree):
        self.tree = tree
        self.modules: dict[str, Module | None] = {}

    def module(self, name: str) -> Module | None:
        if name not in self.modules:
            base = name.replace(".", "/")
            found = None
            for path in (f"{base}.py", f"{base}/__init__.py"):
                if self.tree.read(path) is not None:
                    found = Module(self.tree, path, name)
                    break
            self.modules[name] = found
        return self.modules[name]

    def lookup(self, mod: Module, name: str, depth: int = 0) -> tuple[Module, ast.AST] | None:
        """Where ``name`` (as seen from ``mod``) is bound: a module-level node, following imports."""
        if depth > 8:
            return None
        if name in mod.bindings:
            return mod, mod.bindings[name]
        if name in mod.imports:
            source, attr = mod.imports[name]
            if attr is None:
                return None
            target = self.module(source)
            if target is None:
                target = self.module(f"{source}.{attr}")
                return None if target is None else (target, target.ast)
            return self.lookup(target, attr, depth + 1)
        return None

    def value(self, mod: Module, node: ast.AST | None) -> Any:
        """A Python value for ``node`` or ``_UNRESOLVED``."""
        if node is None:
            return None
        try:
            return ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            pass
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.value(mod, node.left), self.value(mod, node.right)
            if isinstance(left, str) and isinstance(right, str):
                return left + right
        if isinstance(node, (ast.List, ast.Tuple)):
            items = [self.value(mod, e) for e in node.elts]
            return _UNRESOLVED if any(i is _UNRESOLVED for i in items) else items
        if isinstance(node, ast.Attribute) and node.attr == "SUPPRESS":
            return "==SUPPRESS=="
        if isinstance(node, ast.Name):
            if node.id in {"str", "int", "float", "bool"}:
                return _UNRESOLVED
            found = self.lookup(mod, node.id)
            if found and not isinstance(found[1], (ast.FunctionDef, ast.ClassDef, ast.Module)):
                return self.value(*found)
        if isinstance(node, ast.Call):
            func = node.func
            # X.keys() on a dict literal, list(X), sorted(X), tuple(X)
            if isinstance(func, ast.Attribute) and func.attr == "keys" and not node.args:
                inner = self.value(mod, func.value)
                return list(inner) if isinstance(inner, dict) else _UNRESOLVED
            if isinstance(func, ast.Name) and func.id in {"list", "sorted", "tuple"} and len(node.args) == 1:
                inner = self.value(mod, node.args[0])
                return _UNRESOLVED if inner is _UNRESOLVED else list(inner)
        if isinstance(node, ast.Dict):
            keys = [self.value(mod, k) for k in node.keys]
            return _UNRESOLVED if any(k is _UNRESOLVED for k in keys) else dict.fromkeys(keys)
        field_default = self.class_field_default(mod, node)
        if field_default is not _UNRESOLVED:
            return field_default
        return _UNRESOLVED

    def enum_values(self, mod: Module, node: ast.AST) -> list[Any] | None:
        """Member values of ``node`` when it names an Enum class with literal members."""
        if not isinstance(node, ast.Name):
            return None
        found = self.lookup(mod, node.id)
        if not found or not isinstance(found[1], ast.ClassDef):
            return None
        cls = found[1]
        if not any(ast.unparse(b).split(".")[-1] in {"Enum", "StrEnum", "IntEnum"} for b in cls.bases):
            return None
        values = []
        for stmt in cls.body:
            if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                    and isinstance(stmt.targets[0], ast.Name) and isinstance(stmt.value, ast.Constant)):
                values.append(stmt.value.value)
        return values or None

    def class_field_default(self, mod: Module, node: ast.AST) -> Any:
        """``Cls.field`` or ``Cls.model_fields["field"].default`` → the field's declared default."""
        cls_name = attr = None
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
            cls_name, attr = node.value.id, node.attr
        elif (isinstance(node, ast.Attribute) and node.attr == "default"
              and isinstance(node.value, ast.Subscript)
              and isinstance(node.value.value, ast.Attribute) and node.value.value.attr == "model_fields"
              and isinstance(node.value.value.value, ast.Name)
              and isinstance(node.value.slice, ast.Constant)):
            cls_name, attr = node.value.value.value.id, node.value.slice.value
        if cls_name is None:
            return _UNRESOLVED
        found = self.lookup(mod, cls_name)
        if not found or not isinstance(found[1], ast.ClassDef):
            return _UNRESOLVED
        cls_mod, cls = found
        for stmt in cls.body:
            target = stmt.target if isinstance(stmt, ast.AnnAssign) else (
                stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else None)
            if isinstance(target, ast.Name) and target.id == attr and stmt.value is not None:
                return self.field_default(cls_mod, stmt.value)
        return _UNRESOLVED

    def field_default(self, mod: Module, value: ast.AST) -> Any:
        if isinstance(value, ast.Call) and _call_name(value) in {"Field", "field"}:
            for kw in value.keywords:
                if kw.arg == "default":
                    return self.value(mod, kw.value)
            if value.args:
                return self.value(mod, value.args[0])
            return _UNRESOLVED
        return self.value(mod, value)

    def text(self, mod: Module, node: ast.AST | None) -> str | None:
        """Help text: a string expression, or the first string argument of a wrapping call."""
        if node is None:
            return None
        got = self.value(mod, node)
        if isinstance(got, str):
            return got
        if isinstance(node, ast.Call):
            for arg in node.args:
                got = self.text(mod, arg)
                if got is not None:
                    return got
        if isinstance(node, ast.JoinedStr):
            return ast.unparse(node)
        return None


def _call_name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def _first_line(text: str | None) -> str | None:
    if text is None:
        return None
    lines = [line.strip() for line in text.strip().splitlines()]
    return " ".join(lines[0].split()) if lines else ""


def _plain(value: Any) -> Any:
    """A YAML-safe rendering of a resolved value (tuples → lists, sets sorted)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(_plain(v) for v in value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _dedupe(items: list[Any]) -> list[Any]:
    out: list[Any] = []
    for item in items:
        if item not in out:
            out.append(item)
    return out


# ----------------------------------------------------------------------------- argparse
def _flag_record(resolver: Resolver, mod: Module, call: ast.Call, origin: str) -> dict[str, Any]:
    names = [resolver.value(mod, a) for a in call.args]
    if any(not isinstance(n, str) for n in names):
        raise ExtractionError(f"{origin}: option names are not string literals: {ast.unparse(call)}")
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    if any(k.arg is None for k in call.keywords):
        raise ExtractionError(f"{origin}: **kwargs in add_argument are not supported")
    rec: dict[str, Any] = {"names": names, "origin": origin}
    action = resolver.value(mod, kw.get("action")) if "action" in kw else "store"
    rec["action"] = action if isinstance(action, str) else ast.unparse(kw["action"])
    if "type" in kw:
        rec["type"] = ast.unparse(kw["type"])
        values = resolver.enum_values(mod, kw["type"])
        if values is not None:
            rec["type_values"] = values  # an Enum used as type= (matched case-insensitively)
    elif rec["action"] in {"store_true", "store_false"}:
        rec["type"] = "bool"
    else:
        rec["type"] = "str"
    _put_value(rec, "default", resolver, mod, kw.get("default"),
               implicit=False if rec["action"] == "store_true" else (
                   True if rec["action"] == "store_false" else None))
    if "choices" in kw:
        choices = resolver.value(mod, kw["choices"])
        if choices is _UNRESOLVED:
            rec["choices"] = None
            rec["choices_expr"] = ast.unparse(kw["choices"])
        else:
            rec["choices"] = _plain(list(choices))
    else:
        rec["choices"] = None
    rec["help"] = _first_line(resolver.text(mod, kw.get("help")))
    required = resolver.value(mod, kw.get("required")) if "required" in kw else False
    rec["required"] = bool(required) if required is not _UNRESOLVED else ast.unparse(kw["required"])
    for key in ("nargs", "dest", "metavar"):
        if key in kw:
            got = resolver.value(mod, kw[key])
            rec[key] = got if got is not _UNRESOLVED else ast.unparse(kw[key])
    return rec


def _put_value(rec: dict[str, Any], key: str, resolver: Resolver, mod: Module,
               node: ast.AST | None, implicit: Any) -> None:
    if node is None:
        rec[key] = implicit
        return
    got = resolver.value(mod, node)
    if got is _UNRESOLVED:
        rec[key] = None
        rec[f"{key}_expr"] = ast.unparse(node)
    else:
        rec[key] = _plain(got)


def argparse_flags(resolver: Resolver, mod: Module) -> list[dict[str, Any]]:
    """Every ``add_argument`` call in the file plus those of helpers it calls from other files."""
    flags: list[dict[str, Any]] = []
    for node in ast.walk(mod.ast):
        if not isinstance(node, ast.Call):
            continue
        name = _call_name(node)
        if name == "add_subparsers":
            raise ExtractionError(f"{mod.path}:{node.lineno}: subparsers are not supported")
        if name == "add_argument" and isinstance(node.func, ast.Attribute):
            flags.append(_flag_record(resolver, mod, node, f"{mod.path}:{node.lineno}"))
        elif isinstance(node.func, ast.Name) and node.func.id in mod.imports:
            found = resolver.lookup(mod, node.func.id)
            if found and isinstance(found[1], ast.FunctionDef) and _adds_arguments(found[1]):
                helper_mod, helper = found
                if helper.name == "add_plugin_argument":
                    flags.extend(plugin_flags(resolver, helper_mod, helper))
                else:
                    for call in ast.walk(helper):
                        if isinstance(call, ast.Call) and _call_name(call) == "add_argument":
                            flags.append(_flag_record(resolver, helper_mod, call,
                                                      f"{helper_mod.path}:{call.lineno}"))
    return flags


def _adds_arguments(func: ast.FunctionDef) -> bool:
    return any(isinstance(n, ast.Call) and _call_name(n) == "add_argument" for n in ast.walk(func))


def plugin_flags(resolver: Resolver, mod: Module, func: ast.FunctionDef) -> list[dict[str, Any]]:
    """The flags ``add_plugin_argument`` generates from the fields of ``PluginConfig``.

    The function builds flags in a loop, so its rules are restated here and the function is
    checked for the markers of the shape those rules were read from (TensorRT-LLM 1.x,
    pydantic ``PluginConfig``). A different shape raises instead of guessing.
    """
    src = ast.unparse(func)
    markers = ("PluginConfig.model_fields.items()", "cli_plugin_args", "Literal",
               "'enable' if field_info.default else 'disable'", "field_name == 'gemm_plugin'",
               "x if x else 'disable'")
    missing = [m for m in markers if m not in src]
    if missing:
        raise ExtractionError(f"{mod.path}:{func.lineno}: add_plugin_argument has an unknown shape "
                              f"(missing {missing}); teach plugin_flags() the new rules")
    cli_args = resolver.value(mod, mod.bindings.get("cli_plugin_args"))
    cls = mod.bindings.get("PluginConfig")
    if cli_args is _UNRESOLVED or not isinstance(cls, ast.ClassDef):
        raise ExtractionError(f"{mod.path}: cli_plugin_args or PluginConfig not found")
    flags = []
    for stmt in cls.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        name = stmt.target.id
        if name not in cli_args:
            continue
        kw = {k.arg: k.value for k in stmt.value.keywords} if isinstance(stmt.value, ast.Call) else {}
        default = resolver.field_default(mod, stmt.value) if stmt.value is not None else None
        if default is _UNRESOLVED:
            raise ExtractionError(f"{mod.path}:{stmt.lineno}: default of {name} is not a literal")
        options = _literal_options(resolver, mod, stmt.annotation)
        rec: dict[str, Any] = {"names": [f"--{name}"], "origin": f"{mod.path}:{stmt.lineno}",
                               "action": "store", "required": False,
                               "help": _first_line(resolver.text(mod, kw.get("description")))}
        if options is not None:
            rec["type"] = "str"
            rec["default"] = default if name == "gemm_plugin" else (default if default else "disable")
            rec["choices"] = _dedupe([o if o else "disable" for o in options])
        elif ast.unparse(stmt.annotation) == "bool":
            rec["type"] = "str"
            rec["default"] = "enable" if default else "disable"
            rec["choices"] = ["enable", "disable"]
        else:
            rec["type"] = ast.unparse(stmt.annotation)
            rec["default"] = _plain(default)
            rec["choices"] = None
        flags.append(rec)
    unknown = sorted(set(cli_args) - {f["names"][0][2:] for f in flags})
    if unknown:
        raise ExtractionError(f"{mod.path}: cli_plugin_args names without a PluginConfig field: {unknown}")
    return flags


def _literal_options(resolver: Resolver, mod: Module, annotation: ast.AST) -> list[Any] | None:
    """Choices of ``Optional[Literal[...]]`` / ``Optional[Alias]`` (None kept), else None."""
    node = annotation
    optional = False
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) in {"Optional", "typing.Optional"}:
        node, optional = node.slice, True
    elif isinstance(node, ast.Subscript) and ast.unparse(node.value) in {"Union", "typing.Union"}:
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        optional = any(ast.unparse(p) == "None" for p in parts)
        literal = [p for p in parts if ast.unparse(p) != "None"]
        if len(literal) != 1:
            return None
        node = literal[0]
    else:
        return None
    if isinstance(node, ast.Name):
        found = resolver.lookup(mod, node.id)
        if not found:
            return None
        node = found[1]
    if not (isinstance(node, ast.Subscript) and ast.unparse(node.value) in {"Literal", "typing.Literal"}):
        return None
    elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    options = [ast.literal_eval(e) for e in elts]
    return options + [None] if optional else options


# ----------------------------------------------------------------------------- click
def click_command(resolver: Resolver, mod: Module, func: ast.FunctionDef) -> dict[str, Any]:
    arguments, flags = [], []
    for deco in func.decorator_list:
        if not isinstance(deco, ast.Call):
            raise ExtractionError(f"{mod.path}:{deco.lineno}: unknown decorator {ast.unparse(deco)}")
        name = _call_name(deco)
        origin = f"{mod.path}:{deco.lineno}"
        if name in {"command", "group"}:
            continue
        if name == "argument":
            kw = {k.arg: k.value for k in deco.keywords}
            arguments.append({"name": resolver.value(mod, deco.args[0]), "origin": origin,
                              "type": ast.unparse(kw["type"]) if "type" in kw else "str",
                              "required": resolver.value(mod, kw["required"]) if "required" in kw
                              else "default" not in kw,
                              "nargs": resolver.value(mod, kw["nargs"]) if "nargs" in kw else 1})
        elif name == "option":
            flags.append(_click_option(resolver, mod, deco, origin))
        else:
            raise ExtractionError(f"{origin}: unknown decorator {ast.unparse(deco)}")
    return {"arguments": arguments, "flags": flags}


def _click_option(resolver: Resolver, mod: Module, deco: ast.Call, origin: str) -> dict[str, Any]:
    decls = [resolver.value(mod, a) for a in deco.args]
    if any(not isinstance(d, str) for d in decls):
        raise ExtractionError(f"{origin}: option names are not string literals")
    names, secondary = [], []
    for decl in decls:
        if "/" in decl:
            first, second = decl.split("/", 1)
            names.append(first.strip())
            secondary.append(second.strip())
        elif decl.startswith("-"):
            names.append(decl)
    kw = {k.arg: k.value for k in deco.keywords}
    is_flag = resolver.value(mod, kw["is_flag"]) if "is_flag" in kw else bool(secondary)
    rec: dict[str, Any] = {"names": names + secondary, "origin": origin,
                           "action": "store_true" if is_flag else "store"}
    if secondary:
        rec["secondary_names"] = secondary
    rec["choices"] = None
    type_node = kw.get("type")
    if type_node is None:
        rec["type"] = "bool" if is_flag else "str"
    elif isinstance(type_node, ast.Call) and "Choice" in _call_name(type_node):
        rec["type"] = "choice"
        choices = resolver.value(mod, type_node.args[0]) if type_node.args else _UNRESOLVED
        if choices is _UNRESOLVED:
            rec["choices_expr"] = ast.unparse(type_node.args[0]) if type_node.args else ""
        else:
            rec["choices"] = _plain(list(choices))
            if len(type_node.args) > 1:
                aliases = resolver.value(mod, type_node.args[1])
                if isinstance(aliases, dict):
                    # ChoiceWithAlias: an alias is accepted and mapped onto a choice.
                    rec["choice_aliases"] = {str(k): str(v) for k, v in aliases.items()}
    else:
        rec["type"] = ast.unparse(type_node)
    _put_value(rec, "default", resolver, mod, kw.get("default"), implicit=False if is_flag else None)
    rec["help"] = _first_line(resolver.text(mod, kw.get("help")))
    rec["required"] = bool(resolver.value(mod, kw["required"])) if "required" in kw else False
    if "multiple" in kw:
        rec["multiple"] = bool(resolver.value(mod, kw["multiple"]))
    return rec


def click_entry(resolver: Resolver, mod: Module, obj: str) -> dict[str, Any]:
    """The click object ``obj`` of ``mod``: a command, or a group with its subcommands."""
    node = mod.bindings.get(obj)
    if isinstance(node, ast.FunctionDef):
        names = {_call_name(d) for d in node.decorator_list if isinstance(d, ast.Call)}
        if "command" in names:
            return {"kind": "click", **click_command(resolver, mod, node)}
        if "group" in names:
            raise ExtractionError(f"{mod.path}: decorator-built click groups are not supported yet")
    if isinstance(node, ast.Call):
        commands = next((k.value for k in node.keywords if k.arg == "commands"), None)
        if not isinstance(commands, ast.Dict):
            raise ExtractionError(f"{mod.path}: {obj} is not a click group with commands={{...}}")
        subs = {}
        for key, value in zip(commands.keys, commands.values):
            sub_name = resolver.value(mod, key)
            target = mod.bindings.get(value.id) if isinstance(value, ast.Name) else None
            if not isinstance(target, ast.FunctionDef):
                raise ExtractionError(f"{mod.path}: subcommand {sub_name} is not a function here")
            subs[sub_name] = click_command(resolver, mod, target)
        group_cls = mod.bindings.get(_call_name(node))
        return {"kind": "click-group", "default_subcommand": _default_subcommand(group_cls),
                "subcommands": subs}
    raise ExtractionError(f"{mod.path}: {obj} is neither a click command nor a group")


def _default_subcommand(cls: ast.AST | None) -> str | None:
    """A ``click.Group`` subclass whose ``resolve_command`` falls back to a fixed name."""
    if not isinstance(cls, ast.ClassDef):
        return None
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "resolve_command":
            for ret in ast.walk(stmt):
                if (isinstance(ret, ast.Return) and isinstance(ret.value, ast.Tuple)
                        and isinstance(ret.value.elts[0], ast.Constant)):
                    return ret.value.elts[0].value
    return None


# ----------------------------------------------------------------------------- metadata
def console_scripts(tree: Tree) -> tuple[dict[str, str], list[str], str]:
    """(console scripts, plain scripts, where they were read) from entry_points.txt or setup.py."""
    if isinstance(tree, WheelTree):
        where = f"{tree.dist_info()}/entry_points.txt"
        parser = configparser.ConfigParser()
        parser.optionxform = str  # keep case
        parser.read_string(tree.read(where) or "")
        scripts = dict(parser["console_scripts"]) if parser.has_section("console_scripts") else {}
        data = sorted(n.split("/")[-1] for n in tree.names if ".data/scripts/" in n)
        return scripts, data, where
    text = tree.read("setup.py")
    if text is None:
        raise ExtractionError(f"{tree.label}: neither a wheel nor a checkout with setup.py")
    scripts: dict[str, str] = {}
    plain: list[str] = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.keyword) and node.arg == "entry_points" and isinstance(node.value, ast.Dict):
            for key, value in zip(node.value.keys, node.value.values):
                if ast.literal_eval(key) == "console_scripts":
                    for entry in ast.literal_eval(value):
                        name, target = (s.strip() for s in entry.split("=", 1))
                        scripts[name] = target
        if isinstance(node, ast.keyword) and node.arg == "scripts":
            plain = sorted(Path(p).name for p in ast.literal_eval(node.value))
    return scripts, plain, "setup.py"


def release_metadata(tree: Tree) -> tuple[str, dict[str, str], str]:
    """(version, pinned Requires-Dist, where read)."""
    if isinstance(tree, WheelTree):
        where = f"{tree.dist_info()}/METADATA"
        meta = HeaderParser().parsestr(tree.read(where) or "")
        requires = meta.get_all("Requires-Dist") or []
        return meta["Version"], _pins(r for r in requires if "extra ==" not in r), where
    text = tree.read("tensorrt_llm/version.py") or ""
    match = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", text)
    if not match:
        raise ExtractionError(f"{tree.label}: tensorrt_llm/version.py has no __version__")
    reqs = tree.read("requirements.txt") or ""
    lines = (line.split("#")[0].strip() for line in reqs.splitlines())
    return match.group(1), _pins(line for line in lines if line and not line.startswith("-")), "requirements.txt"


def metadata_file(path: Path, label: str) -> tuple[str, dict[str, str], str]:
    """(version, pins, where) from a METADATA / PKG-INFO file, e.g. the release's sdist."""
    meta = HeaderParser().parsestr(path.read_text(encoding="utf-8"))
    requires = meta.get_all("Requires-Dist") or []
    return meta["Version"], _pins(r for r in requires if "extra ==" not in r), label


def _pins(requirements) -> dict[str, str]:
    pins = {}
    for req in requirements:
        name = re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0].lower().replace("_", "-")
        if name in PINNED:
            pins[name] = req.strip()
    return pins


# ----------------------------------------------------------------------------- assembly
def extract(tree: Tree, examples: Tree | None, *, confirmed: bool, note: str | None,
            metadata: tuple[Path, str] | None = None) -> dict[str, Any]:
    version, pins, meta_where = release_metadata(tree)
    meta_source = _where(tree, meta_where)
    if metadata is not None:
        meta_version, pins, meta_source = metadata_file(*metadata)
        if meta_version != version:
            # A stand-in: the pins are the metadata file's release, the flags are SOURCE's.
            note = f"{note or ''} requires_dist is {meta_version}'s ({meta_source}).".strip()
    scripts, plain_scripts, scripts_where = console_scripts(tree)
    resolver = Resolver(tree)
    commands: dict[str, Any] = {}
    for command in COMMANDS:
        if command not in scripts:
            commands[command] = {"present": False, "source": _where(tree, scripts_where),
                                 "confirmed": confirmed}
            continue
        module_name, obj = scripts[command].split(":")
        mod = resolver.module(module_name)
        if mod is None:
            raise ExtractionError(f"{command}: module {module_name} not in {tree.label}")
        text = tree.read(mod.path) or ""
        if "import click" in text and "click." in text:
            body = click_entry(resolver, mod, obj)
        else:
            body = {"kind": "argparse", "flags": argparse_flags(resolver, mod)}
        commands[command] = {"present": True, "entry_point": scripts[command],
                             "source": _where(tree, mod.path), "confirmed": confirmed, **body}
    if examples is not None:
        ex_resolver = ExampleResolver(examples, resolver)
        for path in EXAMPLES:
            if examples.read(path) is None:
                commands[path] = {"present": False, "source": _where(examples, path),
                                  "confirmed": confirmed}
                continue
            mod = Module(examples, path, path[:-3].replace("/", "."))
            commands[path] = {"present": True, "kind": "argparse", "source": _where(examples, path),
                              "confirmed": confirmed, "flags": argparse_flags(ex_resolver, mod)}
    for body in commands.values():
        _sort_flags(body)
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "tensorrt_llm_version": version,
        "artifact": tree.identity(),
        "metadata_source": meta_source,
        "requires_dist": dict(sorted(pins.items())),
        "console_scripts": dict(sorted(scripts.items())),
        "console_scripts_source": _where(tree, scripts_where),
        "scripts": plain_scripts,
        "commands": commands,
    }
    if examples is not None:
        doc["examples_artifact"] = examples.identity()
    else:
        doc["examples_artifact"] = None
    if note:
        doc["note"] = note
    return doc


class ExampleResolver(Resolver):
    """Resolves an example script's own names in the checkout, ``tensorrt_llm.*`` in the release."""

    def __init__(self, examples: Tree, release: Resolver):
        super().__init__(examples)
        self.release = release

    def module(self, name: str) -> Module | None:
        if name == "tensorrt_llm" or name.startswith("tensorrt_llm."):
            return self.release.module(name)
        return super().module(name)


def _sort_flags(body: dict[str, Any]) -> None:
    def key(flag: dict[str, Any]) -> str:
        names = flag["names"]
        return (names[0] if names[0].startswith("--") else names[-1]).lstrip("-")

    if "flags" in body:
        body["flags"].sort(key=key)
    for sub in body.get("subcommands", {}).values():
        sub["flags"].sort(key=key)


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:  # never emit &anchors
        return True


def render(doc: dict[str, Any], regenerate: str) -> str:
    header = ("# Generated by scripts/extract_trtllm_flags.py from the release's source (ast, no import).\n"
              "# Do not edit by hand; regenerate with:\n"
              f"#   {regenerate}\n")
    return header + yaml.dump(doc, Dumper=_Dumper, sort_keys=True, default_flow_style=False,
                              allow_unicode=True, width=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="wheel, unpacked wheel, source checkout, or GITDIR@REV")
    parser.add_argument("--label", help="name of SOURCE in source: fields (directories only)")
    parser.add_argument("--examples", help="checkout of the release tag (dir or GITDIR@REV)")
    parser.add_argument("--examples-label", help="name of --examples in source: fields")
    parser.add_argument("--unconfirmed", action="store_true",
                        help="mark every command confirmed: false (say why in --note)")
    parser.add_argument("--note", help="free text recorded in the file (why unconfirmed, etc.)")
    parser.add_argument("--metadata", metavar="FILE",
                        help="take requires_dist from this METADATA/PKG-INFO (e.g. the sdist's)")
    parser.add_argument("--metadata-label", help="name of --metadata in metadata_source")
    parser.add_argument("--as-version", metavar="V",
                        help="write the table as <V>.yaml although SOURCE is another release (a "
                             "stand-in while V's own source cannot be read; needs --unconfirmed)")
    parser.add_argument("--out-dir", default=str(Path(__file__).resolve().parent.parent / "compat" / "trtllm_flags"))
    parser.add_argument("--stdout", action="store_true", help="print instead of writing the file")
    args = parser.parse_args(argv)
    if args.unconfirmed and not args.note:
        parser.error("--unconfirmed needs --note saying why")
    if args.as_version and not args.unconfirmed:
        parser.error("--as-version needs --unconfirmed: a stand-in is never a confirmed table")
    try:
        tree = open_tree(args.source, args.label)
        examples = open_tree(args.examples, args.examples_label) if args.examples else None
        metadata = (Path(args.metadata), args.metadata_label or args.metadata) if args.metadata else None
        doc = extract(tree, examples, confirmed=not args.unconfirmed, note=args.note, metadata=metadata)
        if args.as_version and args.as_version != doc["tensorrt_llm_version"]:
            doc["stand_in"] = {"for_version": args.as_version,
                               "extracted_version": doc["tensorrt_llm_version"]}
            doc["tensorrt_llm_version"] = args.as_version
    except ExtractionError as err:
        print(f"extract_trtllm_flags: {err}", file=sys.stderr)
        return 2
    regenerate = " ".join(["python scripts/extract_trtllm_flags.py",
                           Path(args.source).name if isinstance(tree, WheelTree) else "<SOURCE>"]
                          + (["--label", repr(args.label)] if args.label else [])
                          + (["--examples", "<CHECKOUT>"] if args.examples else [])
                          + (["--examples-label", repr(args.examples_label)] if args.examples_label else [])
                          + (["--unconfirmed --note ..."] if args.unconfirmed else [])
                          + (["--metadata", "<PKG-INFO>"] if args.metadata else [])
                          + (["--metadata-label", repr(args.metadata_label)] if args.metadata_label else [])
                          + (["--as-version", args.as_version] if args.as_version else []))
    text = render(doc, regenerate)
    if args.stdout:
        sys.stdout.write(text)
    else:
        out = Path(args.out_dir) / f"{doc['tensorrt_llm_version']}.yaml"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
