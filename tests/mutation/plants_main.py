"""Planted bugs for guards added on main outside the per-area modules (see test_planted_bugs)."""

PLANTS = [
    dict(name="push: tag guard skipped", path="docker/registry.py",
         old="    if not retag:\n        refuse_moving_tag(local_id, f\"{target.name}:{tag}\", credentials)\n",
         new="    if False:\n        pass\n",
         first=("tests/docker/test_retag.py",)),
    dict(name="runtime: image.json copied before the entrypoint", path="_data/templates/runtime.j2",
         old="COPY --link --from=files /stage/serve/ /\n# image.json",
         new="COPY --link --from=files /stage/identity/ /\n# image.json",
         first=("tests/render/test_render.py",)),
    dict(name="netenv.sh: no shell directive for a sourced file", path="_data/templates/netenv.sh.j2",
         old="# shellcheck shell=sh\n", new="",
         first=("tests/render/test_artifacts.py",)),
]
