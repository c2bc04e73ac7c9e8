"""Image size: runtime image vs its base + the venv it serves from, and vs a naive image.

    source .stack/env && python bench/image_size.py --payload light

Prints (runtime image − base image) ÷ installed size of /opt/venv (goal <= 1.05), and the
runtime image size ÷ a naive single-stage image built the way tutorials do (devel base,
everything as root, pip cache kept), same payload, same stand-in bases.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _payload import REPO, docker, options_for, stack_of

NAIVE = """FROM {builder}
RUN apt-get update && apt-get install -y python3 python3-venv python3-dev gcc
COPY requirements.txt /app/requirements.txt
RUN --mount=type=secret,id=pip-conf --mount=type=secret,id=ca-cert \\
    if [ -s /run/secrets/pip-conf ]; then export PIP_CONFIG_FILE=/run/secrets/pip-conf; fi; \\
    if [ -s /run/secrets/ca-cert ]; then export PIP_CERT=/run/secrets/ca-cert; fi; \\
    python3 -m venv /opt/venv && /opt/venv/bin/pip install -r /app/requirements.txt
CMD ["/opt/venv/bin/vllm", "serve", "/models"]
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--payload", choices=("light", "real"), default="light")
    parser.add_argument("--recipe", type=Path, default=REPO / "recipes" / "qwen2-7b-h100.yaml")
    args = parser.parse_args()
    from imgfab import engine
    from imgfab.build import _pip_conf, base_image_args, build_recipe

    with tempfile.TemporaryDirectory() as scratch, options_for(args.payload, args.recipe) as options:
        built = build_recipe(str(args.recipe), options, context_dir=Path(scratch) / "ctx")
        ref = built.tags[0]
        _, stack, files = stack_of(args.recipe)
        bases = base_image_args(stack, options)
        docker("pull", bases["RUNTIME_IMAGE"])
        base_size = int(engine.inspect_image(bases["RUNTIME_IMAGE"])["Size"])
        venv = int(docker("run", "--rm", "--entrypoint", "du", ref, "-sb", "/opt/venv").split()[0])
        naive_dir = Path(scratch) / "naive"
        naive_dir.mkdir()
        (naive_dir / "Dockerfile").write_text(NAIVE.format(builder=bases["BUILDER_IMAGE"]))
        (naive_dir / "requirements.txt").write_text(files["requirements.txt"])
        secrets = {"ca-cert": options.ca_cert} if options.ca_cert else {}
        if options.pip_index_url:
            secrets["pip-conf"] = _pip_conf(options.pip_index_url, Path(scratch))
        naive_ref = "imgfab-bench/naive:latest"
        engine.build(naive_dir, tags=[naive_ref], secrets=secrets, network="host")
        naive_size = int(engine.inspect_image(naive_ref)["Size"])
    size = built.size_bytes
    print(f"payload {args.payload}, recipe {args.recipe.name}")
    print(f"runtime image {size / 1e6:9.1f} MB   base {base_size / 1e6:9.1f} MB   "
          f"/opt/venv {venv / 1e6:9.1f} MB   naive single-stage {naive_size / 1e6:9.1f} MB")
    print(f"(runtime - base) / venv = {(size - base_size) / venv:.3f}   (goal <= 1.05)")
    print(f"runtime / naive         = {size / naive_size:.3f}   (stand-in bases are debootstrap "
          f"bookworm, ~150 MB: far smaller than real CUDA images, so real ratios differ)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
