"""Planted bugs for issue 23 (a tool people like to use): each turns off one guard of the
honest exit codes or the safe serving defaults."""

EXITS = ("tests/test_cli_exits.py",)
CI = ("tests/render/test_bake_ci.py",)

PLANTS = [
    dict(name="ux: render writes an unlocked context without --unlocked", path="cli.py",
         old="    if lock is None and not unlocked:\n", new="    if False:\n", first=EXITS),
    dict(name="ux: lock --check passes a recorded refusal", path="cli.py",
         old="            if result.refused and not allow_refused:",
         new="            if False:", first=EXITS),
    dict(name="ux: lock --check --allow-refused still fails refusals", path="cli.py",
         old="            if result.refused and not allow_refused:",
         new="            if result.refused:", first=EXITS),
    dict(name="ux: ci github builds recipes whose lock records a refusal", path="render/ci.py",
         old="        if result.refused:\n",
         new="        if False:\n", first=CI),
    dict(name="ux: ci github leaves out named recipes silently", path="render/ci.py",
         old="    if refused and (recipes or len(refused) == len(planned)):",
         new="    if refused and len(refused) == len(planned):", first=CI),
    dict(name="ux: ci github header does not name what it left out", path="render/ci.py",
         old="               for path in sorted(left_out)]\n", new="               for path in ()]\n",
         first=CI),
]

SERVING = ("tests/render/test_artifacts.py",)
SMOKE = ("tests/ops/test_smoke.py",)
PLANTS += [
    dict(name="ux: vLLM artifacts mount no API key", path="render/context.py",
         old='    if stack.backend != "vllm":\n        return None\n    return {"file"',
         new='    if True:\n        return None\n    return {"file"', first=SERVING),
    dict(name="ux: entrypoint serves with an empty API key file", path="_data/templates/entrypoint.sh.j2",
         old='    if [ -z "$VLLM_API_KEY" ]; then', new='    if false; then', first=SERVING),
    dict(name="ux: run.sh starts with an empty API key file", path="_data/templates/run.sh.j2",
         old='(Authorization: Bearer KEY)}"\nif [ ! -s "$API_KEY_FILE" ]; then',  # the single-node one
         new='(Authorization: Bearer KEY)}"\nif [ ! -e /nonexistent-never ] && false; then', first=SERVING),
    dict(name="ux: compose has no restart policy", path="_data/templates/compose.yaml.j2",
         old='    restart: "unless-stopped"\n', new='', first=SERVING),
    dict(name="ux: k8s has no PodDisruptionBudget", path="_data/templates/k8s.yaml.j2",
         old='kind: "PodDisruptionBudget"', new='kind: "PodDisruptionBudgetX"', first=SERVING),
    dict(name="ux: run.sh ports published on every address", path="_data/templates/run.sh.j2",
         old='    --publish "${HOST_ADDR:-{{ publish_address }}}:${HOST_PORT:-{{ port }}}:{{ port }}"',
         new='    --publish "${HOST_PORT:-{{ port }}}:{{ port }}"', first=SERVING),
    dict(name="ux: smoke does not check the key is enforced", path="ops/smoke.py",
         old="        if api_key:\n            table, failures = check_routes(",
         new="        if False:\n            table, failures = check_routes(", first=SMOKE),
    dict(name="ux: smoke mounts no key file", path="ops/smoke_shapes.py",
         old="                           mounts=(*settings.mounts, (str(key_path), shapes.API_KEY_FILE, True)))",
         new="                           mounts=settings.mounts)", first=SMOKE),
    dict(name="ux: smoke leaves the key file behind", path="ops/smoke_shapes.py",
         old="        if key_dir is not None:\n            remove_directory(key_dir)\n", new="", first=SMOKE),
    dict(name="ux: vLLM serves the recipe name by default", path="render/context.py",
         old="    return recipe.serve.served_model_name or recipe.model.id",
         new="    return recipe.serve.served_model_name or recipe.name",
         first=("tests/test_serving_defaults.py",)),
]

TEMPLATING = ("tests/render/test_templating.py",)
PLANTS += [
    dict(name="ux: the template cache is shared across environment options", path="render/templating.py",
         old='    directory = cache_root() / f"jinja-{_options_key()}"',
         new='    directory = cache_root() / "jinja"', first=TEMPLATING),
    dict(name="ux: an unwritable template cache is an error", path="render/templating.py",
         old="    except OSError:\n        return None\n", new="    except OSError:\n        raise\n",
         first=TEMPLATING),
]

PROGRESS = ("tests/test_progress.py",)
PUSHPULL = ("tests/docker/test_engine_push.py",)
PLANTS += [
    dict(name="ux: a layer the daemon calls done keeps its partial count", path="docker/engine.py",
         old="        elif status.startswith(self.DONE):\n            current = total\n",
         new="        elif status.startswith(self.DONE):\n            pass\n", first=PROGRESS),
    dict(name="ux: unpacking counts are taken for bytes read", path="docker/engine.py",
         old='        if status in ("Pushing", "Downloading") and detail.get("total"):',
         new='        if detail.get("total"):', first=PROGRESS),
    dict(name="ux: bake renders without progress", path="render/bake.py",
         old='            progress.item("bake: rendered", index, len(recipe_paths), Path(path).name)',
         new='            pass', first=PROGRESS),
    dict(name="ux: push progress never reaches the daemon stream", path="docker/registry.py",
         old="                        on_line=on_line, progress=progress)",
         new="                        on_line=on_line)", first=PUSHPULL),
    dict(name="ux: pull reports no bytes", path="docker/engine.py",
         old='                progress.bytes(f"pull {ref}", read.done, read.total)',
         new='                pass', first=PUSHPULL),
    dict(name="ux: smoke never pulls what the engine lacks", path="ops/smoke_shapes.py",
         old="        engine.pull_image(image, auth_config=_pull_auth(image), progress=progress)\n",
         new="        pass\n", first=("tests/ops/test_smoke.py",)),
    dict(name="ux: smoke pulls anonymously", path="ops/smoke_shapes.py",
         old="    return Credentials.load(ImageRef.parse(image).host).auth_config()",
         new="    return None", first=("tests/ops/test_smoke.py",)),
]
