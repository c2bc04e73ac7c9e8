"""Planted bugs for issue 34's Ray, secrets, trust and advisory guards: each turns one off.

Ray (class 1): token authentication on every node from a file, the head's dashboard off, the
node's address, the NetworkPolicies. Secrets (class 4): the API key in no VLLM_* variable and on
no worker, each tool's allow-listed environment. Trust (class 5): promote verifies before it
signs; no artifact names an image a runtime would look up on Docker Hub. Advisories (class 9):
a critical advisory refuses unless accepted by name, and the acceptance is shown.
"""

MULTINODE = ("tests/render/test_multinode.py",)
NAMES = ("tests/render/test_image_names.py",)
TOOL_ENV = ("tests/docker/test_tool_env.py",)
PROMOTE = ("tests/supply/test_promote_verify.py",)
ADVISORIES = ("tests/stack/test_advisories.py",)
ENTRYPOINT = "_data/templates/entrypoint.sh.j2"
RUN_SH = "_data/templates/run.sh.j2"
COMPOSE = "_data/templates/compose.yaml.j2"
K8S = "_data/templates/k8s.yaml.j2"

PLANTS = [
    # --- Ray: the token, the dashboard, the node's address ---------------------------------------
    dict(name="ray: nodes run without token authentication", path=ENTRYPOINT,
         old='export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$ray_token_file"\n',
         new='export RAY_AUTH_TOKEN_PATH="$ray_token_file"\n', first=MULTINODE),
    dict(name="ray: a node starts without a token file", path=ENTRYPOINT,
         old='if [ -z "${ray_token//[[:space:]]/}" ]; then\n', new="if false; then\n", first=MULTINODE),
    dict(name="ray: a token from the environment wins over the file", path=ENTRYPOINT,
         old="unset ray_token RAY_AUTH_TOKEN\n", new="unset ray_token\n", first=MULTINODE),
    dict(name="ray: the head's dashboard is on", path=ENTRYPOINT,
         old='--disable-usage-stats --include-dashboard=false "${node_args[@]}"',
         new='--disable-usage-stats "${node_args[@]}"', first=MULTINODE),
    dict(name="ray: the node's address is ignored", path=ENTRYPOINT,
         old='    node_args=(--node-ip-address="$IMGFAB_NODE_ADDRESS")\n', new="    node_args=()\n",
         first=MULTINODE),
    dict(name="ray: the multinode payload takes a ray without token authentication",
         path="_data/compat/backends.yaml",
         old='multinode_requires: ["ray[cgraph]>=2.52.0"]', new='multinode_requires: ["ray[cgraph]"]',
         first=MULTINODE),
    dict(name="ray: run.sh mounts no token", path=RUN_SH,
         old='args+=(--mount "type=bind,source=${RAY_TOKEN_FILE},target={{ ray_token_file }},readonly")\n',
         new="", first=MULTINODE),
    dict(name="ray: run.sh takes an empty token file", path=RUN_SH,
         old='if [ ! -s "$RAY_TOKEN_FILE" ]; then\n', new="if false; then\n", first=MULTINODE),
    dict(name="ray: compose gives no node the token", path=COMPOSE,
         old='      - source: "ray_token"\n        target: {{ ray_token_name | yaml }}\n', new="",
         first=MULTINODE),
    # --- k8s: the NetworkPolicies, the secrets each pod mounts ----------------------------------
    dict(name="k8s: the group policy admits every pod", path=K8S,
         old="    - from:\n        - podSelector:\n            matchLabels: {{ k8s.group_pods | yaml }}\n",
         new="    - {}\n", first=MULTINODE),
    dict(name="k8s: the serving port open on the workers too", path=K8S,
         old="    matchLabels: {{ k8s.leader_pods | yaml }}\n", new="    matchLabels: {{ k8s.lws_pods | yaml }}\n",
         first=MULTINODE),
    dict(name="k8s: a scaled-up group is left open", path=K8S,
         old='    matchLabels: {{ k8s.lws_pods | yaml }}\n  policyTypes: ["Ingress"]\n---\n',
         new='    matchLabels: {{ k8s.group_pods | yaml }}\n  policyTypes: ["Ingress"]\n---\n', first=MULTINODE),
    dict(name="k8s: the worker pods mount the API key", path=K8S,
         old='{% if api_key and role != "worker" %}\n      {# issue 34',
         new="{% if api_key %}\n      {# issue 34", first=MULTINODE),
    dict(name="k8s: a worker pod has no Ray token", path=K8S,
         old='{% if role != "single" %}\n      # Ray\'s cluster token',
         new='{% if role == "leader" %}\n      # Ray\'s cluster token', first=MULTINODE),
    # --- secrets: the API key stays with the API server ------------------------------------------
    dict(name="secrets: an outside VLLM_API_KEY reaches Ray across nodes", path=ENTRYPOINT,
         old="unset VLLM_API_KEY\n", new="", first=MULTINODE),
    dict(name="secrets: the key read into VLLM_API_KEY across nodes", path=ENTRYPOINT,
         old='    export IMGFAB_API_KEY_FILE="$api_key_file"\n',
         new='    VLLM_API_KEY="$(cat -- "$api_key_file")"\n    export VLLM_API_KEY IMGFAB_API_KEY_FILE="$api_key_file"\n',
         first=MULTINODE),
    # --- secrets: each tool's environment ----------------------------------------------------------
    dict(name="tool env: every variable inherited", path="docker/toolenv.py",
         old="    env = {name: os.environ[name] for name in allowed if name in os.environ}\n",
         new="    env = dict(os.environ)\n", first=TOOL_ENV),
    dict(name="tool env: cosign gets the key password to verify too", path="supply/cosign.py",
         old='    extra = {"COSIGN_PASSWORD": password} if password is not None else {}\n',
         new='    extra = {"COSIGN_PASSWORD": key_password()}\n', first=TOOL_ENV),
    dict(name="tool env: oras inherits everything", path="supply/promote.py",
         old='check=False, env=tool_env("oras"))', new="check=False)", first=TOOL_ENV),
    dict(name="tool env: docker run of a script inherits everything", path="docker/containers.py",
         old='check=False, env=tool_env("docker"))', new="check=False)", first=TOOL_ENV),
    # --- trust: verify before signing; no name Docker Hub would serve ------------------------------
    dict(name="promote: the source is not verified", path="supply/promote.py",
         old="    if trust is not None:  # before anything moves", new="    if False:  # before anything moves",
         first=PROMOTE),
    dict(name="promote: a key signs with nothing to verify against", path="supply/promote.py",
         old="    if sign_key is not None and trust is None and verify_source:\n", new="    if False:\n",
         first=PROMOTE),
    dict(name="names: k8s names the bare local image", path="render/context.py",
         old='    context["k8s_image"] = (f"{UNSET_REGISTRY}/{repository}:{tag}" if context["image_local"]',
         new='    context["k8s_image"] = (f"{repository}:{tag}" if context["image_local"]', first=NAMES),
    dict(name="names: run.sh pulls the local image when missing", path=RUN_SH,
         old="    pull=never\n", new="    pull=missing\n", first=NAMES),
    dict(name="names: compose pulls the local image when missing", path=COMPOSE,
         old='    pull_policy: "never"\n', new="", first=NAMES),
    dict(name="names: render says nothing of a missing registry", path="cli.py",
         old="    if not (registry_host or parsed.image.registry):\n", new="    if False:\n", first=NAMES),
    # --- advisories: a decision, not a default ----------------------------------------------------
    dict(name="advisories: a critical stack resolves unaccepted", path="stack/resolve.py",
         old="            critical = refused_hits(matrix, stack, recipe.backend.accept_advisories) if advisories else []\n",
         new="            critical = []\n", first=ADVISORIES),
    dict(name="advisories: an acceptance accepts nothing", path="stack/advisories.py",
         old="if not hit[2].named_in(accepted)]", new="]", first=ADVISORIES),
    dict(name="advisories: an alias does not name the advisory", path="matrix/advisories.py",
         old="        return self.id in ids or any(alias in ids for alias in self.aliases)\n",
         new="        return self.id in ids\n", first=ADVISORIES),
    dict(name="advisories: an unknown acceptance passes silently", path="stack/resolve.py",
         old="    if unknown:\n        raise RecipeError(", new="    if False:\n        raise RecipeError(",
         first=ADVISORIES),
    dict(name="advisories: the refusal hides forward compatibility", path="stack/advisories.py",
         old='                + (_FORWARD_COMPAT_NOTE if f"driver_policy: {FORWARD_COMPAT}" in text else ""))\n',
         new=")\n", first=ADVISORIES),
    dict(name="advisories: the label does not show the acceptance", path="render/context.py",
         old='        f"{p}.advisories.accepted": ",".join(sorted(recipe.backend.accept_advisories)),\n',
         new='        f"{p}.advisories.accepted": "",\n', first=ADVISORIES),
    dict(name="advisories: select does not say an advisory is accepted", path="ops/select.py",
         old='            taken = " (accepted by its recipe: backend.accept_advisories)" if advisory.named_in(accepted) else ""\n',
         new='            taken = ""\n', first=ADVISORIES),
    dict(name="advisories: validate prints no advisory", path="cli.py",
         old='            for note in advisories:\n                _say(f"  advisory: {note}")\n',
         new="", first=ADVISORIES),
    dict(name="advisories: init names the driver, not the advisory", path="render/starter.py",
         old='            raise (minor if minor.field == "backend.accept_advisories" else strict) from None\n',
         new="            raise strict from None\n", first=ADVISORIES),
    dict(name="advisories: a lock's accepted critical advisory still blocks", path="stack/advisories.py",
         old='        if advisory.severity == "critical" and not taken:\n',
         new='        if advisory.severity == "critical":\n', first=ADVISORIES),
]
