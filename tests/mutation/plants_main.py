"""Planted bugs for guards added on main outside the per-area modules (see test_planted_bugs)."""

PLANTS = [
    dict(name="render: context mtimes left at the wall clock", path="render/context.py",
         old="        _normalise_mtimes(staging, files)\n", new="",
         first=("tests/render/test_render_output.py",)),
    dict(name="push: tag guard skipped", path="docker/registry.py",
         old="    if not retag:\n        refuse_moving_tag(local_id, f\"{target.name}:{tag}\", credentials)\n",
         new="    if False:\n        pass\n",
         first=("tests/docker/test_retag.py",)),
]
