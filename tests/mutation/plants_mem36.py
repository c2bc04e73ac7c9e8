"""Planted bugs for issue 36, item 2 (memory as reported): each puts the marketed capacity back
in the fit, or lets an unsourced or garbled reported total through the loader."""

FIT = ("tests/stack/test_fit.py",)
GPUS = ("tests/matrix/test_gpus.py",)

PLANTS = [
    dict(name="mem36: the fit counts the marketed memory_gib again", path="stack/fit.py",
         old="    return budget_mib(gpu) * 2**20", new="    return gpu.memory_gib * 2**30", first=FIT),
    dict(name="mem36: the budget ignores reported_mib", path="matrix/gpus.py",
         old="    return gpu.reported_mib or int(gpu.memory_gib * 1024 * FALLBACK_FRACTION)",
         new="    return int(gpu.memory_gib * 1024 * FALLBACK_FRACTION)", first=FIT),
    dict(name="mem36: a GPU without a reported total counts its whole nominal memory",
         path="matrix/gpus.py", old="FALLBACK_FRACTION = 0.93\n", new="FALLBACK_FRACTION = 1.0\n",
         first=FIT),
    dict(name="mem36: the loader drops reported_mib", path="matrix/compat.py",
         old="                **parse_reported_mib(row, f\"gpu {row.get('name')}\"),\n", new="",
         first=GPUS),
    dict(name="mem36: a reported total without a source is taken", path="matrix/gpus.py",
         old="    if not source:\n        raise MatrixError(f\"{where}: reported_mib {value} has no reported_mib_source\",",
         new="    if False:\n        raise MatrixError(f\"{where}: reported_mib {value} has no reported_mib_source\",",
         first=GPUS),
    dict(name="mem36: a reported total of another size is taken", path="matrix/gpus.py",
         old="    if not nominal * low <= value <= nominal * high:",
         new="    if not 0 < value:", first=GPUS),
]
