"""Planted bugs for issue 23 (the CLI's JSON contract and first steps): each turns off one guard."""

JSON = ("tests/test_cli_json.py",)

PLANTS = [
    dict(name="cli: a failure in --json mode prints no object", path="cli.py",
         old="    if _STATE.json_command and not _STATE.emitted:  # the failure is inside the one object too\n",
         new="    if False:\n", first=JSON),
    dict(name="cli: resolve --json failure loses its rejections", path="cli.py",
         old="            _emit_failure(\"resolve\", error, stack=None, rejected=error.rejected,",
         new="            _emit_failure(\"resolve\", error, stack=None, rejected=[],", first=JSON),
    dict(name="cli: the resolver's refusal carries no structured rejections", path="stack/resolve.py",
         old="        rejected=[dict(r.__dict__) for r in rejections])",
         new="        rejected=[dict(r.__dict__) for r in rejections[:1]])", first=JSON),
    dict(name="cli: objects carry no schema_version", path="output.py",
         old='    head: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "command": command,',
         new='    head: dict[str, Any] = {"command": command,', first=JSON),
    dict(name="cli: ok does not follow the exit code", path="output.py",
         old='                            "ok": exit_code == 0, "exit_code": exit_code}',
         new='                            "ok": True, "exit_code": exit_code}', first=JSON),
    dict(name="cli: build --json on failure prints nothing", path="cli.py",
         old="                _emit_failure(\"build\", error, images=[*images, failed], bake=None,",
         new="                _STATE.emitted = True or dict(images=[*images, failed], bake=None,",
         first=JSON),
    dict(name="cli: build failures name no step", path="docker/build.py",
         old="        if error.step is None:\n            error.step = where[0]\n",
         new="        pass\n", first=JSON),
    dict(name="cli: build steps not advanced (lock reported as resolve)", path="docker/build.py",
         old='    where[0] = "lock"\n', new="", first=JSON),
    dict(name="cli: lock --check --json failure carries no entries", path="cli.py",
         old='            _exit_with("lock", as_json, 1, *missing, check=True, locks=checks)',
         new='            _exit_with("lock", as_json, 1, *missing, check=True, locks=[])', first=JSON),
    dict(name="cli: usage errors under --json print no object", path="cli.py",
         old='        if "--json" in sys.argv[1:]:\n            _json_usage_error(error, line)\n',
         new="", first=JSON),
    dict(name="cli: select candidates lack constraint", path="ops/select.py",
         old='        return {"constraint": _printable(failed.check, 60), "fix": _printable(failed.fix, REASON_MAX)}',
         new='        return {"constraint": "", "fix": _printable(failed.fix, REASON_MAX)}', first=JSON),
    dict(name="cli: matrix --policy refuses forward-compat", path="cli.py",
         old='@click.option("--policy", type=click.Choice(["strict", "minor-compat", "forward-compat"]),\n'
             '              default="strict", show_default=True,',
         new='@click.option("--policy", type=click.Choice(["strict", "minor-compat"]),\n'
             '              default="strict", show_default=True,', first=JSON),
    dict(name="cli: schema --output cannot replace an existing file", path="output.py",
         old="        if replace:\n            os.replace(tmp, path)\n",
         new="        if replace:\n            os.link(tmp, path)\n", first=JSON),
    dict(name="cli: the workflow reads the old build report shape", path="render/ci.py",
         old="staged=$(jq -r '.images[0].pushed' imgfab-report.json)",
         new="staged=$(jq -r .pushed imgfab-report.json)", first=("tests/render/test_bake_ci.py",)),

]

FIRST = ("tests/test_cli_first_steps.py",)
PLANTS += [
    dict(name="cli: an error names one field and '(and N more)'", path="recipe.py",
         old='        also = "; ".join(f"{f}: {m}" + (f" ({x})" if x else "") for f, m, x in problems[1:])',
         new='        also = ""', first=FIRST),
    dict(name="cli: aliases answered without the exact value", path="recipe.py",
         old='    return f"write {short}: {exact} ({meaning})" if exact else meaning',
         new='    return None', first=FIRST),
    dict(name="cli: gptq answered with nothing", path="recipe.py",
         old='        "gptq": ("gptq",', new='        "gptq-x": ("gptq",', first=FIRST),
    dict(name="cli: init replaces an existing file", path="cli.py",
         old="        write_atomically(target, text, replace=force)",
         new="        write_atomically(target, text, replace=True)", first=FIRST),
    dict(name="cli: init writes a recipe no stack fits (falls back silently)", path="render/starter.py",
         old="    return text, recipe, resolve(recipe, matrix)",
         new="    try:\n        return text, recipe, resolve(recipe, matrix)\n"
             "    except CompatibilityError:\n"
             "        return text, recipe, resolve(recipe.model_copy(update={'engine': "
             "recipe.engine.model_copy(update={'quantization': 'none'})}), matrix)",
         first=FIRST),
    dict(name="cli: init never takes minor-compat when strict cannot fit", path="render/starter.py",
         old='            return _checked(replace(answers, policy="minor-compat"), matrix, recipe_path,',
         new='            return _checked(replace(answers, policy="strict"), matrix, recipe_path,',
         first=FIRST),
    dict(name="cli: init errors name the recipe field, not the flag", path="render/starter.py",
         old='        error.field = f"{flag} ({field})" if flag else field\n',
         new="", first=FIRST),
    dict(name="cli: validate stops at the first field", path="cli.py",
         old="            problems = error.problems or ((error.field or \"recipe\", error.message, error.fix),)",
         new="            problems = ((error.field or \"recipe\", error.message, error.fix),)",
         first=FIRST),
    dict(name="cli: validate does not resolve", path="cli.py",
         old="            advisories = stack_advisories(matrix, resolve_stack(load_recipe(path), matrix).stack)",
         new="            load_recipe(path)",
         first=FIRST),
    dict(name="cli: explain suggests nothing for a bare field name", path="cli.py",
         old='        close = [p for p in fields if p.rsplit(".", 1)[-1] == field.rsplit(".", 1)[-1]]',
         new="        close = []", first=FIRST),
    dict(name="cli: explain leaves out mapping values' fields", path="recipe.py",
         old='                    walk(f"{path}.<key>.", target(option["additionalProperties"]))\n',
         new="", first=FIRST),
    dict(name="cli: list calls a refused lock current", path="cli.py",
         old='("refused" if result.refused else "current")', new='"current"', first=FIRST),
    dict(name="cli: pipeline_parallel has no description", path="recipe.py",
         old='        1, description="Pipeline-parallel stages per replica',
         new='        1, title="Pipeline-parallel stages per replica', first=FIRST),
    dict(name="cli: a schema example the schema refuses", path="recipe.py",
         old='        examples=["strict", "minor-compat"])', new='        examples=["strict", "minor_compat"])',
         first=FIRST),

]

PROGRESS = ("tests/test_progress.py",)
PLANTS += [
    dict(name="cli: plain progress drops a phase's last item", path="progress.py",
         old="        edge = done <= 1 or done >= total\n", new="        edge = done <= 1\n", first=PROGRESS),
    dict(name="cli: quiet progress still prints", path="progress.py",
         old='        if self.mode == "quiet":\n            return\n', new="", first=PROGRESS),
    dict(name="cli: a pipe gets rich progress", path="progress.py",
         old="    watched = sys.stdout.isatty() and getattr(stream, \"isatty\", lambda: False)()",
         new="    watched = True", first=PROGRESS),
    dict(name="cli: lock -q still shows progress", path="cli.py",
         old="    progress = for_command(quiet=quiet)\n", new="    progress = for_command(quiet=False)\n",
         first=PROGRESS),
    dict(name="cli: lock reports no RECORD reads", path="payload/lock.py",
         old="        one(package)\n        report(package)\n", new="        one(package)\n", first=PROGRESS),
    dict(name="cli: refresh reports no vllm release", path="matrix/refresh.py",
         old='            progress.item("vllm releases", index, len(releases), version)\n', new="",
         first=PROGRESS),

]

STARTUP = ("tests/test_startup.py",)
PLANTS += [
    dict(name="cli: render loads the TensorRT-LLM flag tables for every recipe", path="render/context.py",
         old="from imgfab.render import shapes\n", new="from imgfab.render import shapes, trtllm  # noqa: F401\n",
         first=STARTUP),
    dict(name="cli: --help loads the recipe schema", path="cli.py",
         old="from imgfab.render.shapes import SHAPES\n",
         new="from imgfab.render.shapes import SHAPES\nfrom imgfab.recipe import Recipe  # noqa: F401\n",
         first=STARTUP),
]
