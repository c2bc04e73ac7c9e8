"""Planted bugs for issue 37 (the workflow `imgfab ci github` writes for a user's repository):
each turns off one of its new guards."""

REPO_CI = ("tests/render/test_ci_repository.py",)
POLICY = ("tests/supply/test_workflow_policy.py",)

PLANTS = [
    dict(name="ci37: ci github skips a recipe whose lock is missing", path="render/ci.py",
         old='        if result.problem or result.lock is None:\n            raise RecipeError(',
         new='        if result.problem or result.lock is None:\n            continue\n            raise RecipeError(',
         first=REPO_CI),
    dict(name="ci37: multi-line scripts dumped as quoted one-liners", path="render/ci.py",
         old='    if "\\n" in value:\n        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")',
         new='    if False:\n        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")',
         first=REPO_CI),
    dict(name="ci37: the policy admits the workflow at any ref (a branch too)", path="render/ci.py",
         old='{re.escape(WORKFLOW_PATH)}@refs/tags/v.+$"', new='{re.escape(WORKFLOW_PATH)}@refs/.+$"',
         first=POLICY),
    dict(name="ci37: release does not wait for the GPU smoke", path="render/ci.py",
         old='["candidate", "smoke"] if "smoke" in jobs else "candidate"', new='"candidate"',
         first=REPO_CI),
    dict(name="ci37: the install's hash never checked", path="render/ci.py",
         old='echo "$IMGFAB_SHA256  $1" | sha256sum -c -\n', new='', first=REPO_CI),
]
