"""Planted bugs for issue 20, item 5 (era-correct locks): each turns off one part of the date
bound (uv's command line, the fingerprint, the header comparison, the recorded upload time) or
the check of the locked pins against the backend's declared ranges."""

ERA = ("tests/payload/test_era.py", "tests/payload/test_lock.py")

PLANTS = [
    dict(name="era: the bound left off uv's command line", path="payload/lock.py",
         old='            argv += ["--exclude-newer", request.exclude_newer]',
         new="            pass", first=ERA),
    dict(name="era: the bound left out of the fingerprint", path="payload/lockfile.py",
         old='                "exclude_newer": self.exclude_newer,\n', new="", first=ERA),
    dict(name="era: the recorded exclude-newer line not compared", path="payload/lock.py",
         old='_RECORDED = ("stack", "target", "requested", "index", "installer", "exclude-newer", "constraints")',
         new='_RECORDED = ("stack", "target", "requested", "index", "installer", "constraints")', first=ERA),
    dict(name="era: the release's first upload taken, not its last", path="matrix/pypi.py",
         old='    return max((f.uploaded for f in files if f.uploaded), default="")',
         new='    return min((f.uploaded for f in files if f.uploaded), default="")',
         first=("tests/payload/test_era.py", "tests/matrix/test_refresh.py")),
    dict(name="era: a lock resolved without a recorded upload time", path="payload/lock.py",
         old="    if not request.exclude_newer:\n        raise MatrixError(",
         new="    if False:\n        raise MatrixError(", first=ERA),
    dict(name="ranges: a pin outside the backend's declared range accepted", path="payload/checks.py",
         old="            if not inside:\n", new="            if False:\n", first=ERA),
    dict(name="ranges: the backend's METADATA not read", path="payload/lock.py",
         old='if package.name in ("torch", *BACKENDS)', new='if package.name == "torch"', first=ERA),
    dict(name="ranges: markers not evaluated for the image", path="payload/checks.py",
         old="            if name not in locked or (requirement.marker is not None\n"
             "                                      and not requirement.marker.evaluate(environment)):",
         new="            if name not in locked:", first=ERA),
]
