"""Check TensorRT-LLM command lines against the flags the pinned release really defines.

The tables are ``compat/trtllm_flags/<version>.yaml``, written by
``scripts/extract_trtllm_flags.py`` from the release's own source (argparse and click
definitions read with ``ast``). This module only reads them: no TensorRT-LLM import, no I/O
besides the one YAML file.

Example::

    flags = load_flags("1.2.1")
    check_command(["--checkpoint_dir", "ckpt", "--quantization_type", "fp8"], flags, "trtllm-build")
    # -> ["trtllm-build --quantization_type: no such flag in TensorRT-LLM 1.2.1; quantization
    #      is chosen at the checkpoint step (quantize.py --qformat fp8)"]

A table with ``confirmed: false`` (see its ``note:``) was not read from the release's wheel;
:attr:`FlagSet.confirmed` and :attr:`FlagSet.stand_in` say so, and callers must say so too.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from imgfab.errors import MatrixError

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def flags_dir() -> Path:
    """``compat/trtllm_flags`` as shipped inside the package."""
    return Path(str(resources.files("imgfab") / "_data" / "compat" / "trtllm_flags"))


@dataclass(frozen=True)
class Flag:
    """One option of one command. ``names`` are all its option strings."""

    names: tuple[str, ...]
    takes_value: bool
    choices: tuple[str, ...] | None
    choice_aliases: tuple[str, ...] = ()
    enum_values: tuple[str, ...] | None = None  # an Enum ``type=``: matched case-insensitively
    many: bool = False  # nargs '+'/'*': every following non-option token is a value
    origin: str = ""


@dataclass(frozen=True)
class Command:
    """The options of one command (or one subcommand of a click group)."""

    name: str  # key in the table: "trtllm-build", "trtllm-serve serve", "examples/.../quantize.py"
    present: bool
    source: str
    confirmed: bool
    flags: dict[str, Flag] = field(default_factory=dict)  # option string -> Flag

    @property
    def display(self) -> str:
        """How errors name it: ``trtllm-build``, ``trtllm-serve``, ``quantize.py``."""
        if self.name.startswith("examples/"):
            parts = self.name.split("/")
            return parts[-1] if parts[1] == "quantization" else f"{parts[-2]}/{parts[-1]}"
        return self.name.removesuffix(" serve")


@dataclass(frozen=True)
class FlagSet:
    """Every extracted command of one TensorRT-LLM release."""

    version: str
    commands: dict[str, Command]
    default_subcommands: dict[str, str]  # group -> subcommand used when none is named
    subcommands: dict[str, tuple[str, ...]]
    console_scripts: dict[str, str]
    requires_dist: dict[str, str]
    confirmed: bool
    stand_in: str | None  # the release whose source stands in for this one, if any
    note: str | None
    path: Path

    def command(self, name: str, argv: list[str] | None = None) -> tuple[Command, list[str]]:
        """The table for ``name`` (a console script, a subcommand or an example script) and the
        arguments that follow it. A suffix such as ``quantize.py`` or ``llama/convert_checkpoint.py``
        names an example script; a click group picks its subcommand from ``argv``."""
        argv = list(argv or [])
        if name in self.subcommands:
            subs = self.subcommands[name]
            if argv and argv[0] in subs:
                return self.commands[f"{name} {argv[0]}"], argv[1:]
            default = self.default_subcommands.get(name)
            if default is None:
                raise MatrixError(f"{name} needs a subcommand, one of {', '.join(subs)}",
                                  field=f"trtllm_flags/{self.version}.yaml")
            return self.commands[f"{name} {default}"], argv
        if name in self.commands:
            return self.commands[name], argv
        matches = [key for key in self.commands if key.endswith("/" + name.lstrip("/"))]
        if len(matches) == 1:
            return self.commands[matches[0]], argv
        known = sorted(set(self.subcommands) | {k for k in self.commands if " " not in k})
        raise MatrixError(f"no command {name!r} in the TensorRT-LLM {self.version} flag table"
                          + (f" (ambiguous: {', '.join(matches)})" if matches else ""),
                          fix=f"use one of {', '.join(known)}")


@dataclass(frozen=True)
class KnownMistake:
    """A flag tutorials use that the release does not define, and where the setting really lives.

    ``instead`` names ``(command, flag)`` that must exist for the pointer to be true;
    :func:`verify_known_mistakes` checks every pointer against a :class:`FlagSet`.
    """

    command: str
    flag: str
    pointer: str
    instead: tuple[tuple[str, str], ...] = ()


# Each pointer is checked against the extracted tables by verify_known_mistakes() (tests run it
# for every committed table); "why" comes from TensorRT-LLM's release notes and source.
KNOWN_MISTAKES: tuple[KnownMistake, ...] = (
    KnownMistake("trtllm-build", "--quantization_type",
                 "quantization is chosen at the checkpoint step (quantize.py --qformat fp8)",
                 (("quantize.py", "--qformat"),)),
    KnownMistake("trtllm-build", "--qformat",
                 "quantization is chosen at the checkpoint step (quantize.py --qformat fp8)",
                 (("quantize.py", "--qformat"),)),
    KnownMistake("trtllm-build", "--kv_cache_dtype",
                 "KV-cache quantization is chosen at the checkpoint step "
                 "(quantize.py --kv_cache_dtype fp8)",
                 (("quantize.py", "--kv_cache_dtype"),)),
    KnownMistake("trtllm-build", "--use_weight_only",
                 "weight-only quantization is chosen at checkpoint conversion "
                 "(llama/convert_checkpoint.py --use_weight_only --weight_only_precision int8)",
                 (("llama/convert_checkpoint.py", "--use_weight_only"),
                  ("llama/convert_checkpoint.py", "--weight_only_precision"))),
    KnownMistake("trtllm-build", "--max_output_len",
                 "removed in 0.12; the engine limit is the whole request, prompt plus output "
                 "(trtllm-build --max_seq_len)",
                 (("trtllm-build", "--max_seq_len"),)),
    KnownMistake("trtllm-build", "--tp_size",
                 "parallelism is fixed when the checkpoint is written "
                 "(quantize.py --tp_size, llama/convert_checkpoint.py --tp_size)",
                 (("quantize.py", "--tp_size"), ("llama/convert_checkpoint.py", "--tp_size"))),
    KnownMistake("trtllm-build", "--pp_size",
                 "parallelism is fixed when the checkpoint is written "
                 "(quantize.py --pp_size, llama/convert_checkpoint.py --pp_size)",
                 (("quantize.py", "--pp_size"), ("llama/convert_checkpoint.py", "--pp_size"))),
    KnownMistake("trtllm-build", "--world_size",
                 "the world size is tp_size x pp_size of the checkpoint "
                 "(quantize.py --tp_size/--pp_size)",
                 (("quantize.py", "--tp_size"), ("quantize.py", "--pp_size"))),
    KnownMistake("trtllm-build", "--dtype",
                 "the dtype is fixed when the checkpoint is written "
                 "(quantize.py --dtype, llama/convert_checkpoint.py --dtype)",
                 (("quantize.py", "--dtype"), ("llama/convert_checkpoint.py", "--dtype"))),
    KnownMistake("trtllm-build", "--model_dir",
                 "trtllm-build reads a TensorRT-LLM checkpoint, not a Hugging Face model: write one "
                 "with quantize.py --model_dir or llama/convert_checkpoint.py --model_dir, then "
                 "trtllm-build --checkpoint_dir",
                 (("trtllm-build", "--checkpoint_dir"), ("quantize.py", "--model_dir"),
                  ("llama/convert_checkpoint.py", "--model_dir"))),
    KnownMistake("trtllm-build", "--use_gpt_attention_plugin",
                 "plugins take a dtype or enable/disable (trtllm-build --gpt_attention_plugin auto)",
                 (("trtllm-build", "--gpt_attention_plugin"),)),
    KnownMistake("trtllm-build", "--use_gemm_plugin",
                 "plugins take a dtype or enable/disable (trtllm-build --gemm_plugin auto)",
                 (("trtllm-build", "--gemm_plugin"),)),
    KnownMistake("trtllm-build", "--enable_context_fmha",
                 "context FMHA is a plugin switch (trtllm-build --context_fmha enable)",
                 (("trtllm-build", "--context_fmha"),)),
    KnownMistake("trtllm-build", "--use_custom_all_reduce",
                 "removed in 0.12; drop it (the all-reduce strategy is a runtime setting)"),
    KnownMistake("trtllm-build", "--multi_block_mode",
                 "moved from build to run time in 0.12; drop it from trtllm-build"),
    KnownMistake("trtllm-build", "--auto_parallel",
                 "auto parallelism was removed; set parallelism at the checkpoint step "
                 "(quantize.py --tp_size)",
                 (("quantize.py", "--tp_size"),)),
    KnownMistake("trtllm-serve", "--model",
                 "the model is the positional argument (trtllm-serve <hf_model_or_engine_dir>)"),
    KnownMistake("trtllm-serve", "--engine_dir",
                 "pass the engine directory as the positional MODEL with --backend tensorrt "
                 "and --tokenizer <hf_dir>",
                 (("trtllm-serve", "--backend"), ("trtllm-serve", "--tokenizer"))),
    KnownMistake("trtllm-serve", "--tensor-parallel-size",
                 "that is vLLM's spelling (trtllm-serve --tp_size)",
                 (("trtllm-serve", "--tp_size"),)),
    KnownMistake("trtllm-serve", "--max-model-len",
                 "that is vLLM's spelling (trtllm-serve --max_seq_len)",
                 (("trtllm-serve", "--max_seq_len"),)),
    KnownMistake("trtllm-serve", "--gpu-memory-utilization",
                 "that is vLLM's flag; TensorRT-LLM sizes the KV cache as a fraction of the memory "
                 "left after the weights (trtllm-serve --kv_cache_free_gpu_memory_fraction 0.9)",
                 (("trtllm-serve", "--kv_cache_free_gpu_memory_fraction"),)),
    KnownMistake("trtllm-serve", "--quantization",
                 "quantization is a property of the checkpoint or engine being served "
                 "(quantize.py --qformat fp8)",
                 (("quantize.py", "--qformat"),)),
    KnownMistake("trtllm-serve", "--dtype",
                 "the dtype comes from the checkpoint or engine being served; other LLM API "
                 "settings go in trtllm-serve --extra_llm_api_options <yaml>",
                 (("trtllm-serve", "--extra_llm_api_options"),)),
)


def load_flags(version: str, directory: Path | None = None) -> FlagSet:
    """Read ``trtllm_flags/<version>.yaml``.

    Raises :class:`MatrixError` when no table exists for ``version`` or the file is malformed.
    """
    directory = directory or flags_dir()
    path = directory / f"{version}.yaml"
    if not path.is_file():
        have = sorted(p.stem for p in directory.glob("*.yaml")) if directory.is_dir() else []
        raise MatrixError(f"no flag table for TensorRT-LLM {version} (have: {', '.join(have) or 'none'})",
                          field="compat/trtllm_flags",
                          fix="run scripts/extract_trtllm_flags.py on that release's wheel")
    with path.open(encoding="utf-8") as handle:
        doc = yaml.load(handle, Loader=_Loader)
    try:
        return _flagset(doc, path, version)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise MatrixError(f"malformed flag table: {err!r}", field=str(path)) from err


def _flagset(doc: dict[str, Any], path: Path, version: str) -> FlagSet:
    if doc.get("schema") != 1:
        raise ValueError(f"unknown schema {doc.get('schema')!r}")
    if str(doc["tensorrt_llm_version"]) != version:
        raise ValueError(f"file {path.name} holds version {doc['tensorrt_llm_version']}")
    commands: dict[str, Command] = {}
    defaults: dict[str, str] = {}
    subcommands: dict[str, tuple[str, ...]] = {}
    for name, body in doc["commands"].items():
        common = {"present": bool(body["present"]), "source": str(body["source"]),
                  "confirmed": bool(body["confirmed"])}
        if body.get("kind") == "click-group":
            subcommands[name] = tuple(sorted(body["subcommands"]))
            if body.get("default_subcommand"):
                defaults[name] = body["default_subcommand"]
            for sub, sub_body in body["subcommands"].items():
                commands[f"{name} {sub}"] = Command(f"{name} {sub}", flags=_flags(sub_body["flags"]), **common)
        else:
            commands[name] = Command(name, flags=_flags(body.get("flags", [])), **common)
    stand_in = doc.get("stand_in")
    return FlagSet(version=version, commands=commands, default_subcommands=defaults,
                   subcommands=subcommands, console_scripts=dict(doc["console_scripts"]),
                   requires_dist=dict(doc.get("requires_dist") or {}),
                   confirmed=all(c.confirmed for c in commands.values()),
                   stand_in=stand_in["extracted_version"] if stand_in else None,
                   note=doc.get("note"), path=path)


def _flags(records: list[dict[str, Any]]) -> dict[str, Flag]:
    out: dict[str, Flag] = {}
    for rec in records:
        choices = rec.get("choices")
        flag = Flag(
            names=tuple(rec["names"]),
            takes_value=rec["action"] in {"store", "append"} and rec.get("nargs") != 0,
            # argparse may list None as a choice; it can never be typed on a command line.
            choices=None if choices is None else tuple(str(c) for c in choices if c is not None),
            choice_aliases=tuple(sorted(rec.get("choice_aliases") or {})),
            enum_values=tuple(str(v) for v in rec["type_values"]) if rec.get("type_values") else None,
            many=rec.get("nargs") in ("+", "*"),
            origin=str(rec.get("origin", "")),
        )
        for name in flag.names:
            out[name] = flag
    return out


def check_command(argv: list[str], flagset: FlagSet, command: str) -> list[str]:
    """Problems with ``argv`` (the arguments after ``command``), one line each; empty if none.

    Reports every option the release does not define (with the pointer from
    :data:`KNOWN_MISTAKES`, else the nearest real flag) and every value outside a flag's
    ``choices``. A leading ``argv[0]`` equal to the command's own name is skipped. Positional
    arguments are not checked. Raises :class:`MatrixError` for a command not in the table.
    """
    args = list(argv)
    if args and Path(args[0]).name in {command, Path(command).name}:
        args = args[1:]
    table, args = flagset.command(command, args)
    prog = table.display
    where = f"TensorRT-LLM {flagset.version}"
    if not table.present:
        return [f"{prog}: no such command in {where}; see {table.source}"]
    problems: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if token == "--":
            break
        if not token.startswith("-") or _is_number(token):
            continue
        name, has_inline, inline = token.partition("=")
        flag = table.flags.get(name)
        if flag is None:
            problems.append(f"{prog} {name}: no such flag in {where}; {_pointer(table, name)}")
            continue
        if not flag.takes_value:
            if has_inline:
                problems.append(f"{prog} {name}: takes no value in {where}; drop '={inline}'")
            continue
        values: list[str] = []
        if has_inline:
            values.append(inline)
        elif i < len(args) and (not args[i].startswith("-") or _is_number(args[i])):
            values.append(args[i])
            i += 1
        else:
            problems.append(f"{prog} {name}: expects a value in {where}")
            continue
        while flag.many and i < len(args) and not args[i].startswith("-"):
            values.append(args[i])
            i += 1
        problems.extend(_check_value(prog, name, value, flag, where) for value in values
                        if not _value_ok(value, flag))
    return problems


def verify_known_mistakes(flagset: FlagSet) -> list[str]:
    """Pointers in :data:`KNOWN_MISTAKES` that this release contradicts: the "mistake" flag exists,
    or a flag it points to does not. Empty when every claim holds."""
    wrong = []
    for mistake in KNOWN_MISTAKES:
        table, _ = flagset.command(mistake.command, [])
        if table.present and mistake.flag in table.flags:
            wrong.append(f"{mistake.command} {mistake.flag}: defined in TensorRT-LLM {flagset.version} "
                         f"({table.flags[mistake.flag].origin}), yet listed as a mistake")
        for command, flag in mistake.instead:
            target, _ = flagset.command(command, [])
            if not target.present or flag not in target.flags:
                wrong.append(f"{mistake.command} {mistake.flag}: points to {command} {flag}, "
                             f"which TensorRT-LLM {flagset.version} does not define")
    return wrong


def _pointer(table: Command, name: str) -> str:
    base = table.name.split(" ")[0]
    for mistake in KNOWN_MISTAKES:
        if mistake.flag == name and mistake.command in {table.name, base, table.display}:
            return mistake.pointer
    near = difflib.get_close_matches(name, sorted(table.flags), n=1, cutoff=0.75)
    if near:
        return f"did you mean {near[0]}?"
    return f"see {table.display} --help ({table.source})"


def _value_ok(value: str, flag: Flag) -> bool:
    if flag.choices is not None and value not in flag.choices and value not in flag.choice_aliases:
        return False
    return flag.enum_values is None or value.lower() in {v.lower() for v in flag.enum_values}


def _check_value(prog: str, name: str, value: str, flag: Flag, where: str) -> str:
    allowed = flag.choices if flag.choices is not None else flag.enum_values or ()
    return (f"{prog} {name} {value}: not a valid value in {where}; "
            f"expected one of {', '.join(allowed)}")


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True
