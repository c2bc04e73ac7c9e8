"""``imgfab compat refresh``: regenerate the PyPI-derived compat files.

Writes ``compat/torch.yaml``, ``compat/vllm.yaml``, ``compat/tensorrt_llm.yaml`` and
``compat/tensorrt.yaml`` from package metadata on PyPI:

1. the project index ``https://pypi.org/pypi/<project>/json`` gives the releases and their files;
2. for each release, the core metadata (``Requires-Dist``, ``Requires-Python``) of one file:
   the Linux x86_64 wheel when PyPI has one (its PEP 658 ``.metadata`` file, else the
   wheel's ``*.dist-info/METADATA`` read by HTTP range requests), else the sdist's ``PKG-INFO``.

The per-version JSON API (``/pypi/<project>/<version>/json``) is not used: its ``info`` block
is the metadata of whichever file was uploaded first (for torch often a macOS wheel without
the ``nvidia-*`` pins), and some mirrors do not serve it at all.

Facts only an upstream source tree gives (kernel architectures, base image, the CUDA toolkit
a release was built with, OS packages) cannot come from PyPI metadata. They are carried over
from the existing file's record of the same version; a release seen for the first time gets
them empty, ``confirmed: false`` and a note saying what is missing. Nothing is guessed.

All fetching happens before anything is written, and each file is replaced atomically, so a
network failure leaves ``compat/`` untouched. Same inputs give byte-identical files.

>>> record = torch_record("2.8.0", parse_core_metadata(
...     "Name: torch\\nVersion: 2.8.0\\nRequires-Python: >=3.9.0\\n"
...     "Requires-Dist: nvidia-cuda-runtime-cu12==12.8.90; platform_system == \\"Linux\\"\\n"),
...     "torch-2.8.0-cp312-cp312-manylinux_2_28_x86_64.whl")
>>> record["cuda"], record["cuda_runtime"], record["confirmed"]
('12.8', '12.8.90', True)
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from imgfab.errors import NetworkError
from imgfab.matrix.pypi import (CoreMetadata, DistFile, PYPI_INDEX, PYPI_PROJECT_URL,
                                PYPI_RELEASE_PAGE, _HttpRangeFile, fetch_json, fetch_metadata,
                                metadata_file, parse_core_metadata, release_files, release_uploaded,
                                requirement, wheel_tags)


# Oldest release of each backend kept in the matrix.
VLLM_FLOOR = Version("0.8.0")
TENSORRT_LLM_FLOOR = Version("0.19.0")


# The CUDA runtime a torch release pins tells the CUDA of its default PyPI wheel: up to torch
# 2.10 an nvidia-cuda-runtime-cuXX wheel, from 2.11 the cuda-toolkit metapackage with the
# [cudart] extra (torch 2.11.0: cuda-toolkit[...,cudart,...]==13.0.2).
CUDA_RUNTIME_WHEELS = ("nvidia-cuda-runtime-cu11", "nvidia-cuda-runtime-cu12",
                       "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime")
CUDA_TOOLKIT_WHEEL = "cuda-toolkit"

# Field order of each kind of record, as written.
FIELDS = {
    "torch": ("version", "index", "cuda", "cuda_runtime", "python", "fatbin_sass", "fatbin_ptx",
              "source", "fatbin_source", "upstream_source", "confirmed", "note"),
    "vllm": ("version", "torch", "python", "cuda", "build_cuda", "cuda_archs", "ptx_archs",
             "fatbin_sass", "fatbin_ptx", "wheel_tags", "uploaded", "source", "fatbin_source",
             "upstream_source", "confirmed", "note"),
    "tensorrt-llm": ("version", "tensorrt", "torch", "torch_index", "python", "python_classifiers",
                     "cuda", "base_image", "cuda_archs", "wheel_tags", "system_packages", "uploaded", "source",
                     "upstream_source", "confirmed", "note"),
    "tensorrt": ("version", "cuda_major", "source", "confirmed", "note"),
}
# Fields read from upstream source trees, carried over from the existing record.
UPSTREAM_FIELDS = {
    "vllm": ("build_cuda", "cuda_archs", "ptx_archs", "upstream_source"),
    "tensorrt-llm": ("cuda", "torch_index", "base_image", "cuda_archs", "system_packages",
                     "upstream_source"),
}
# Fields measured in the wheel's own CUDA libraries (imgfab.matrix.wheels); carried over when a
# refresh runs without reading wheels.
FATBIN_FIELDS = ("fatbin_sass", "fatbin_ptx", "fatbin_source")
FILES = {"torch": "torch.yaml", "vllm": "vllm.yaml", "tensorrt-llm": "tensorrt_llm.yaml",
         "tensorrt": "tensorrt.yaml"}
HEADERS = {
    "torch": "torch release -> CUDA of its default PyPI wheel (Linux x86_64), read from the\n"
             "wheel's Requires-Dist pin on the CUDA runtime: nvidia-cuda-runtime-cuXX (<= 2.10)\n"
             "or cuda-toolkit[cudart] (>= 2.11). fatbin_sass/fatbin_ptx: the architectures\n"
             "compiled into torch/lib/libtorch_cuda.so, read from its ELF .nv_fatbin through HTTP\n"
             "range requests into the wheel (imgfab.matrix.wheels). Rows whose index is not\n"
             "PyPI (a local version such as 2.9.1+cu130) are kept by hand with their sources.",
    "vllm": "vLLM release -> torch pin, Requires-Python and wheel tags (PyPI metadata of the\n"
            "Linux x86_64 wheel); cuda = CUDA of the pinned torch's PyPI wheel. build_cuda,\n"
            "cuda_archs and ptx_archs come from the release's source tree (docker/Dockerfile,\n"
            ".buildkite/release-pipeline.yaml, setup.py MAIN_CUDA_VERSION) and are carried over.\n"
            "fatbin_sass/fatbin_ptx: architectures measured in vllm/_C.abi3.so of the wheel\n"
            "(ELF .nv_fatbin, HTTP range requests; the union over the fat binaries read).\n"
            "uploaded: the latest upload time of the release's files (PyPI JSON API), which\n"
            "bounds `imgfab lock` (uv --exclude-newer, imgfab.payload.era).",
    "tensorrt-llm": "TensorRT-LLM release -> tensorrt and torch pins, Requires-Python and Python\n"
                    "classifiers (PKG-INFO of the wheel-stub sdist on PyPI; the wheels live on\n"
                    "pypi.nvidia.com). cuda, base_image, cuda_archs and system_packages come from\n"
                    "upstream and are carried over. uploaded: the latest upload time of the\n"
                    "release's files on PyPI (JSON API), which bounds `imgfab lock`.",
    "tensorrt": "TensorRT release -> CUDA major it is built for, read from the Requires-Dist of\n"
                "the 'tensorrt' metapackage (tensorrt_cu12 / tensorrt_cu13).",
}

FetchJson = Callable[[str], dict]
FetchMetadata = Callable[[str, str], str]
ReadArchs = Callable[[str, str, str], Any]  # (project, url, filename) -> MemberArchs | None


# --- fetching: the only network I/O ---------------------------------------------------------


# --- pure: metadata → records ---------------------------------------------------------------


def _provenance(project: str, version: str, filename: str, facts: str) -> str:
    kind = "PKG-INFO" if not filename.endswith(".whl") else "METADATA"
    return f"{PYPI_RELEASE_PAGE.format(project=project, version=version)} {filename} {kind} ({facts})"


def torch_record(version: str, meta: CoreMetadata, filename: str) -> dict[str, Any]:
    """A torch.yaml row: the CUDA of the default PyPI wheel from its CUDA runtime pin."""
    runtime = requirement(meta, *CUDA_RUNTIME_WHEELS)
    if runtime is None:
        toolkit = requirement(meta, CUDA_TOOLKIT_WHEEL)
        runtime = toolkit if toolkit is not None and "cudart" in toolkit.extras else None
    pins = [s.version for s in runtime.specifier if s.operator == "=="] if runtime else []
    record: dict[str, Any] = {"version": version, "python": meta.requires_python}
    if pins:
        record.update(cuda=".".join(pins[0].split(".")[:2]), cuda_runtime=pins[0], confirmed=True,
                      source=_provenance("torch", version, filename, f"Requires-Dist {runtime}"))
    else:
        record.update(cuda="", cuda_runtime="", confirmed=False,
                      source=_provenance("torch", version, filename, "no CUDA runtime pin"),
                      note="the Linux x86_64 wheel pins neither nvidia-cuda-runtime* nor "
                           "cuda-toolkit[cudart]")
    return record


def torch_for(spec: str, torch_rows: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The newest torch row inside ``spec`` (what pip would install), or None."""
    if not spec:
        return None
    specifier = SpecifierSet(spec)
    fitting = [v for v in torch_rows if specifier.contains(Version(v), prereleases=True)]
    return torch_rows[max(fitting, key=Version)] if fitting else None


def vllm_record(version: str, meta: CoreMetadata, filename: str, files: list[DistFile],
                torch_rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A vllm.yaml row from PyPI metadata; upstream fields are left to :func:`carry_over`."""
    torch = requirement(meta, "torch")
    spec = str(torch.specifier) if torch else ""
    pinned = torch_for(spec, torch_rows)
    facts = f"Requires-Dist {torch}; Requires-Python {meta.requires_python}" if torch else \
        f"no torch requirement; Requires-Python {meta.requires_python}"
    return {"version": version, "torch": spec, "python": meta.requires_python,
            "cuda": pinned["cuda"] if pinned else "", "wheel_tags": wheel_tags(files),
            "uploaded": release_uploaded(files), "source": _provenance("vllm", version, filename, facts)}


def tensorrt_llm_record(version: str, meta: CoreMetadata, filename: str,
                        files: list[DistFile]) -> dict[str, Any]:
    """A tensorrt_llm.yaml row from PyPI metadata; upstream fields come from :func:`carry_over`."""
    tensorrt, torch = requirement(meta, "tensorrt"), requirement(meta, "torch")
    prefix = "Programming Language :: Python :: "
    classifiers = sorted((c[len(prefix):] for c in meta.classifiers
                          if c.startswith(prefix) and re.fullmatch(r"\d+\.\d+", c[len(prefix):])),
                         key=Version)
    facts = "; ".join(str(r) for r in (tensorrt, torch) if r) or "no tensorrt/torch requirement"
    return {"version": version, "tensorrt": str(tensorrt.specifier) if tensorrt else "",
            "torch": str(torch.specifier) if torch else "", "python": meta.requires_python,
            "python_classifiers": classifiers, "wheel_tags": wheel_tags(files),
            "uploaded": release_uploaded(files), "source": _provenance("tensorrt-llm", version, filename, facts)}


def tensorrt_record(version: str, meta: CoreMetadata, filename: str) -> dict[str, Any]:
    """A tensorrt.yaml row: the metapackage's tensorrt_cuXX pin names the CUDA major."""
    for line in meta.requires_dist:
        match = re.match(r"^\s*tensorrt[-_]cu(\d+)\b", line, re.IGNORECASE)
        if match:
            req = Requirement(line)
            return {"version": version, "cuda_major": match.group(1),
                    "source": _provenance("tensorrt", version, filename, f"Requires-Dist {req}"),
                    "confirmed": True}
    return {"version": version, "cuda_major": "", "confirmed": False,
            "source": _provenance("tensorrt", version, filename, "no tensorrt_cuXX requirement"),
            "note": "the metapackage names no tensorrt_cuXX package"}


def carry_over(kind: str, record: dict[str, Any], previous: dict[str, Any] | None) -> dict[str, Any]:
    """Fill the upstream-only fields of ``record`` from ``previous`` (same version), if any.

    A release without a previous record gets them empty, ``confirmed: false`` and a note.
    """
    fields = UPSTREAM_FIELDS[kind]
    merged = dict(record)
    if previous is None:
        for name in fields:
            merged[name] = [] if name in ("cuda_archs", "ptx_archs", "system_packages") else ""
        missing = ", ".join(f for f in fields if f != "upstream_source")
        merged.update(confirmed=False,
                      note=f"new release: {missing} not yet read from the upstream source tree")
        return merged
    for name in fields + ("confirmed", "note"):
        if name in previous:
            merged[name] = previous[name]
    merged.setdefault("confirmed", False)
    return merged


# --- writing ---------------------------------------------------------------------------------

def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    return json.dumps(str(value), ensure_ascii=False)  # a JSON string is a YAML double-quoted scalar


def render(kind: str, records: Iterable[dict[str, Any]]) -> str:
    """The YAML text of one compat file: records sorted by version, fields in FIELDS order.

    Empty ``note`` fields are left out; unknown fields raise KeyError (a bug, not data).
    """
    lines = [f"# {line}".rstrip() for line in HEADERS[kind].splitlines()]
    lines += ["# Generated by `imgfab compat refresh`; upstream-only fields are carried over from",
              "# this file, so edit those (with their upstream_source) and nothing else.",
              "releases:"]
    for record in sorted(records, key=lambda r: Version(r["version"])):
        extra = set(record) - set(FIELDS[kind])
        if extra:
            raise KeyError(f"{kind} record {record['version']} has unknown fields {sorted(extra)}")
        first = True
        for name in FIELDS[kind]:
            if name not in record or (name == "note" and not record[name]):
                continue
            lines.append(f"  {'- ' if first else '  '}{name}: {_scalar(record[name])}")
            first = False
    return "\n".join(lines) + "\n"


def read_records(path: Path) -> dict[str, dict[str, Any]]:
    """Existing records of a compat file by version; {} if the file does not exist yet."""
    import yaml

    if not path.exists():
        return {}
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return {str(row["version"]): row for row in data.get("releases") or []}


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one rename; a failure leaves the old file whole."""
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="\n") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# --- the command -----------------------------------------------------------------------------

def refresh(compat_dir: Path, fetch_json: FetchJson = fetch_json,
            fetch_metadata: FetchMetadata = fetch_metadata,
            packages: Iterable[str] = ("vllm", "torch", "tensorrt-llm", "tensorrt"),
            read_archs: ReadArchs | None = None, progress: Any = None) -> list[str]:
    """Regenerate the PyPI-derived compat files in ``compat_dir``; return what changed.

    ``packages`` picks the files: ``vllm``, ``torch``, ``tensorrt-llm``, ``tensorrt``. Torch rows
    cover every torch release that a vLLM or TensorRT-LLM pin admits; TensorRT rows every
    ``tensorrt`` release a TensorRT-LLM pin admits (pins read from the refreshed records, or
    from the files on disk for a backend not being refreshed).

    ``read_archs(project, url, filename)`` measures the GPU code of a torch or vLLM wheel
    (:meth:`imgfab.matrix.wheels.PayloadCache.archs`); without it the ``fatbin_*`` fields are
    carried over from the files on disk.

    ``progress`` (:class:`imgfab.progress.Progress`) hears of each project and release read.

    Returns one line per added, changed or removed release (empty: nothing changed).
    Raises NetworkError if PyPI cannot be read; then no file has been touched.
    """
    from imgfab.progress import QUIET  # noqa: PLC0415

    progress = progress or QUIET
    compat_dir = Path(compat_dir)
    wanted = tuple(packages)
    unknown = set(wanted) - set(FILES)
    if unknown:
        raise ValueError(f"unknown packages {sorted(unknown)}; known: {sorted(FILES)}")
    old = {kind: read_records(compat_dir / name) for kind, name in FILES.items()}
    fetch = _Guarded(fetch_json, fetch_metadata)

    progress.step("reading the torch releases from PyPI")
    torch_all = fetch.versions("torch") if {"vllm", "torch"} & set(wanted) else {}
    torch_rows: dict[str, dict[str, Any]] = {}

    def torch_row(version: str) -> dict[str, Any]:
        if version not in torch_rows:
            progress.step(f"torch {version}: metadata")
            row = torch_record(version, *fetch.metadata("torch", version))
            row["index"] = PYPI_INDEX
            torch_rows[version] = _with_fatbin(row, "torch", version, fetch, read_archs,
                                               old["torch"].get(version))
        return torch_rows[version]

    new: dict[str, dict[str, dict[str, Any]]] = {}
    if "vllm" in wanted:
        rows = {}
        progress.step("reading the vllm releases from PyPI")
        releases = fetch.final_versions("vllm", VLLM_FLOOR)
        for index, version in enumerate(releases, 1):
            progress.item("vllm releases", index, len(releases), version)
            meta, filename = fetch.metadata("vllm", version)
            spec = str(r.specifier) if (r := requirement(meta, "torch")) else ""
            for candidate in _admitted(spec, torch_all):
                torch_row(candidate)
            record = vllm_record(version, meta, filename, fetch.files("vllm", version), torch_rows)
            record = _with_fatbin(record, "vllm", version, fetch, read_archs, old["vllm"].get(version))
            rows[version] = carry_over("vllm", record, old["vllm"].get(version))
        new["vllm"] = rows
    if "tensorrt-llm" in wanted:
        rows = {}
        progress.step("reading the tensorrt-llm releases from PyPI")
        releases = fetch.final_versions("tensorrt-llm", TENSORRT_LLM_FLOOR)
        for index, version in enumerate(releases, 1):
            progress.item("tensorrt-llm releases", index, len(releases), version)
            meta, filename = fetch.metadata("tensorrt-llm", version)
            record = tensorrt_llm_record(version, meta, filename, fetch.files("tensorrt-llm", version))
            rows[version] = carry_over("tensorrt-llm", record, old["tensorrt-llm"].get(version))
        new["tensorrt-llm"] = rows
    if "torch" in wanted:
        for kind in ("vllm", "tensorrt-llm"):
            for row in (new.get(kind) or old[kind]).values():
                if (row.get("torch_index") or PYPI_INDEX) != PYPI_INDEX:
                    continue  # its torch comes from another index: a hand-kept row
                for candidate in _admitted(str(row.get("torch") or ""), torch_all):
                    torch_row(candidate)
        kept = {v: r for v, r in old["torch"].items() if (r.get("index") or PYPI_INDEX) != PYPI_INDEX}
        new["torch"] = {**dict(torch_rows), **kept}
    if "tensorrt" in wanted:
        progress.step("reading the tensorrt releases from PyPI")
        tensorrt_all = fetch.versions("tensorrt")
        rows = {}
        for row in (new.get("tensorrt-llm") or old["tensorrt-llm"]).values():
            for candidate in _admitted(str(row.get("tensorrt") or ""), tensorrt_all):
                if candidate not in rows:
                    rows[candidate] = tensorrt_record(candidate, *fetch.metadata("tensorrt", candidate))
        new["tensorrt"] = rows

    summary: list[str] = []
    outputs: dict[Path, str] = {}
    for kind, rows in new.items():
        path = compat_dir / FILES[kind]
        text = render(kind, rows.values())
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            outputs[path] = text
        summary += _changes(kind, old[kind], rows)
    for path, text in outputs.items():
        write_atomically(path, text)
    return summary


def _with_fatbin(record: dict[str, Any], project: str, version: str, fetch: "_Guarded",
                 read_archs: "ReadArchs | None", previous: dict[str, Any] | None) -> dict[str, Any]:
    """``record`` plus the architectures measured in its wheel (or carried over from ``previous``)."""
    record = dict(record)
    if read_archs is None:
        for name in FATBIN_FIELDS:
            if previous and name in previous:
                record[name] = previous[name]
        return record
    chosen = metadata_file(fetch.files(project, version))
    # Index mirrors serve files under their own host; the record names PyPI's file host.
    url = re.sub(r"^https://pypi\.org/packages/packages/", "https://files.pythonhosted.org/packages/",
                 chosen.url) if chosen else ""
    found = read_archs(project, url, chosen.filename) if chosen and chosen.filename.endswith(".whl") \
        else None
    if found is None:
        record.update(fatbin_sass=[], fatbin_ptx=[],
                      fatbin_source=f"{chosen.filename if chosen else project}: no CUDA library with "
                                    "a .nv_fatbin section was found")
    else:
        record.update(fatbin_sass=list(found.sass), fatbin_ptx=list(found.ptx),
                      fatbin_source=found.describe())
    if previous and _measured(previous) == _measured(record):
        # The same wheel, member, extent and architectures read again (on another day, or
        # from an empty cache): keep the row's date, so a refresh that changed nothing is no diff.
        record["fatbin_source"] = previous["fatbin_source"]
    return record


_READ_DATE = re.compile(r", read [0-9]{4}-[0-9]{2}-[0-9]{2}$")


def _measured(row: dict[str, Any]) -> tuple[Any, ...]:
    """What a ``fatbin_*`` measurement says, without the date it was read on."""
    return (list(row.get("fatbin_sass") or []), list(row.get("fatbin_ptx") or []),
            _READ_DATE.sub("", str(row.get("fatbin_source") or "")))


def _admitted(spec: str, releases: dict[str, list[DistFile]]) -> list[str]:
    """Final releases inside ``spec`` that have files, oldest first."""
    if not spec:
        return []
    specifier = SpecifierSet(spec)
    found = [v for v in releases if releases[v] and specifier.contains(Version(v), prereleases=True)
             and not Version(v).is_prerelease and not Version(v).is_devrelease]
    return sorted(found, key=Version)


def _changes(kind: str, old: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]) -> list[str]:
    name = FILES[kind]
    lines = []
    for version in sorted(set(old) | set(new), key=Version):
        if version not in old:
            state = "" if new[version].get("confirmed") else " (confirmed: false)"
            lines.append(f"{name}: added {version}{state}")
        elif version not in new:
            lines.append(f"{name}: removed {version}")
        else:
            changed = [f"{k} {old[version].get(k)!r} -> {new[version].get(k)!r}"
                       for k in FIELDS[kind] if _norm(old[version].get(k)) != _norm(new[version].get(k))]
            if changed:
                lines.append(f"{name}: {version}: " + "; ".join(changed))
    return lines


def _norm(value: Any) -> Any:
    if value is None or value == "":
        return None
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else str(value)


class _Guarded:
    """The injected fetchers, memoised, with every failure turned into NetworkError."""

    def __init__(self, fetch_json: FetchJson, fetch_metadata: FetchMetadata):
        self._json, self._metadata = fetch_json, fetch_metadata
        self._indexes: dict[str, dict[str, list[DistFile]]] = {}

    def _call(self, what: str, function: Callable[..., Any], *args: Any) -> Any:
        try:
            return function(*args)
        except NetworkError:
            raise
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise NetworkError(f"could not read {what}: {exc!r}", field="pypi",
                               fix="check the network and run `imgfab compat refresh` again") from None

    def versions(self, project: str) -> dict[str, list[DistFile]]:
        """Every parseable release of ``project`` → its non-yanked files."""
        if project not in self._indexes:
            url = PYPI_PROJECT_URL.format(project=project)
            index = self._call(url, self._json, url)
            releases = index.get("releases") if isinstance(index, dict) else None
            if not isinstance(releases, dict):
                raise NetworkError(f"{url} has no 'releases' mapping", field="pypi",
                                   fix="check that the index URL serves the PyPI JSON API")
            found = {}
            for version in releases:
                try:
                    Version(version)
                except InvalidVersion:
                    continue
                found[version] = self._call(url, release_files, index, version, url)
            self._indexes[project] = found
        return self._indexes[project]

    def files(self, project: str, version: str) -> list[DistFile]:
        return self.versions(project)[version]

    def final_versions(self, project: str, floor: Version) -> list[str]:
        """Releases ≥ floor that are not pre/dev releases and have files, oldest first."""
        return sorted((v for v, files in self.versions(project).items() if files
                       and Version(v) >= floor and not Version(v).is_prerelease
                       and not Version(v).is_devrelease), key=Version)

    def metadata(self, project: str, version: str) -> tuple[CoreMetadata, str]:
        chosen = metadata_file(self.files(project, version))
        if chosen is None:
            raise NetworkError(f"{project} {version} has no wheel or sdist on the index",
                               field="pypi", fix=f"exclude {project} {version} or wait for its upload")
        text = self._call(chosen.url, self._metadata, chosen.url, chosen.filename)
        meta = parse_core_metadata(text)
        if meta.version and Version(meta.version) != Version(version):
            raise NetworkError(f"{chosen.filename} says version {meta.version}, not {version}",
                               field="pypi", fix="report the broken upload; nothing was written")
        return meta, chosen.filename


__all__ = ["refresh", "fetch_json", "fetch_metadata", "parse_core_metadata", "torch_record",
           "vllm_record", "tensorrt_llm_record", "tensorrt_record", "carry_over", "render",
           "metadata_file", "wheel_tags", "NetworkError", "DistFile", "PYPI_INDEX", "requirement",
           "read_records", "write_atomically", "FILES", "_HttpRangeFile"]
