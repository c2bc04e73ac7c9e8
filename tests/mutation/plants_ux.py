"""Planted bugs for issue 23 (a tool people like to use): each turns off one guard of the
honest exit codes or the safe serving defaults."""

EXITS = ("tests/test_cli_exits.py",)
CI = ("tests/render/test_bake_ci.py",)

PLANTS = [
    dict(name="ux: render writes an unlocked context without --unlocked", path="cli.py",
         old="    if lock is None and not unlocked:\n", new="    if False:\n", first=EXITS),
    dict(name="ux: lock --check passes a recorded refusal", path="cli.py",
         old="            if result.lock is not None and result.lock.refused and not allow_refused:",
         new="            if False:", first=EXITS),
    dict(name="ux: lock --check --allow-refused still fails refusals", path="cli.py",
         old="            if result.lock is not None and result.lock.refused and not allow_refused:",
         new="            if result.lock is not None and result.lock.refused:", first=EXITS),
    dict(name="ux: ci github builds recipes whose lock records a refusal", path="render/ci.py",
         old="        if not result.problem and result.lock is not None and result.lock.refused:",
         new="        if False:", first=CI),
    dict(name="ux: ci github leaves out named recipes silently", path="render/ci.py",
         old="    if refused and (recipes or len(refused) == len(rows)):",
         new="    if refused and len(refused) == len(rows):", first=CI),
    dict(name="ux: ci github header does not name what it left out", path="render/ci.py",
         old="               for path in sorted(left_out)]\n", new="               for path in ()]\n",
         first=CI),
]
