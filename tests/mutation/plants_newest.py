"""Planted bugs for issue 32 (the newest stack must lock): each turns off the family bound, the
resolver's payload rejection, or the refusal's own fix."""

V = ("tests/stack/test_payload_verdicts.py",)
C = ("tests/payload/test_constraints.py",)

PLANTS = [
    dict(name="newest: constraints never reach uv", path="payload/lock.py",
         old="        if request.constraints:  # families bounded to the stack's CUDA major",
         new="        if False:  # families bounded to the stack's CUDA major", first=C),
    dict(name="newest: constraints of every CUDA major applied", path="payload/lock.py",
         old='''        constraints=tuple(sorted(requirement for row in data.get("constraints", [])
                                 if str(row["cuda_major"]) == cuda_major''',
         new='''        constraints=tuple(sorted(requirement for row in data.get("constraints", [])
                                 if True''', first=C),
    dict(name="newest: constraints left out of the fingerprint", path="payload/lockfile.py",
         old='            data["constraints"] = self.constraints\n', new="            pass\n", first=C),
    dict(name="newest: the recorded constraints line not compared", path="payload/lock.py",
         old='"installer", "exclude-newer", "constraints")', new='"installer", "exclude-newer")',
         first=("tests/payload/test_lock_strict.py", *C)),
    dict(name="newest: a family conflict's fix names no bound", path="payload/checks.py",
         old="        if major == cuda_major and set(names) <= set(family):",
         new="        if False:", first=C),
    dict(name="newest: the lock's refusal names the indexes again", path="payload/lock.py",
         old='            refused, refusal_fix = error.message, error.fix or "see compat/payload.yaml"',
         new='            refused, refusal_fix = error.message, "see compat/payload.yaml indexes"',
         first=C),
    dict(name="newest: the resolver ignores payloads.yaml", path="stack/candidates.py",
         old="        if check is not None and not check.installs:",
         new="        if False:", first=V),
    dict(name="newest: a payload rejection names no release to pin", path="stack/candidates.py",
         old="    if older:\n        newest = max(older, key=lambda c: Version(c.version))",
         new="    if False:\n        newest = max(older, key=lambda c: Version(c.version))", first=V),
    dict(name="newest: payloads.yaml accepts a refusal without a reason", path="matrix/payloads.py",
         old="        if not check.installs and not check.reason:",
         new="        if False:", first=V),
    dict(name="newest: a second row for one release accepted", path="matrix/payloads.py",
         old="        if key in seen:", new="        if False:", first=V),
]
