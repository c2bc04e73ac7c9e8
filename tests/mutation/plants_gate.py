"""Planted bugs for issue 34's gate and fail-closed serving: each turns off one guard of the
in-image API-key gate, of the server command that loads it, of the entrypoint that refuses to
start without a key, of where the artifacts publish the port, of the pods' service-account
token, or of the smoke check that asks every listed route without the key."""

GATE = "in_image/gate.py"
GATE_TESTS = ("tests/in_image/test_gate.py",)
ENTRYPOINT = "_data/templates/entrypoint.sh.j2"
FAIL_CLOSED = ("tests/render/test_fail_closed.py",)
SMOKE = ("tests/ops/test_smoke.py", "tests/ops/test_smoke_routes.py")

PLANTS = [
    # --- the gate ------------------------------------------------------------------------------
    dict(name="gate: every request admitted", path=GATE,
         old="        if (method, scope.get(\"path\")) in self.open_routes:\n            return True\n",
         new="        if True:\n            return True\n", first=GATE_TESTS),
    dict(name="gate: /health taken as a prefix", path=GATE,
         old="        if (method, scope.get(\"path\")) in self.open_routes:\n",
         new="        if str(scope.get(\"path\")).startswith(\"/health\") or (method, scope.get(\"path\")) in self.open_routes:\n",
         first=GATE_TESTS),
    dict(name="gate: any Bearer token admitted", path=GATE,
         old="        return hmac.compare_digest(hashlib.sha256(sent[0]).digest(), self.expected)\n",
         new="        return sent[0].startswith(b\"Bearer \")\n", first=GATE_TESTS),
    dict(name="gate: the first of two Authorization headers decides", path=GATE,
         old="        if len(sent) != 1 or self.expected is None:\n",
         new="        if not sent or self.expected is None:\n", first=GATE_TESTS),
    dict(name="gate: a WebSocket passes without the key", path=GATE,
         old='        if self.expected is None or kind not in ("http", "websocket") or self.admits(scope):\n',
         new='        if self.expected is None or kind != "http" or self.admits(scope):\n', first=GATE_TESTS),
    dict(name="gate: no key file serves everyone without the opt-out", path=GATE,
         old='        if environ.get(ALLOW_ENV) == "1":\n            return None\n',
         new='        if True:\n            return None\n', first=GATE_TESTS),
    dict(name="gate: an empty key file turns the gate off", path=GATE,
         old="    if not key:\n        raise GateError",
         new="    if not key:\n        return None\n    if False:\n        raise GateError", first=GATE_TESTS),
    dict(name="gate: the key file's newline kept in the key", path=GATE,
         old='            key = handle.read().rstrip(b"\\n")\n', new="            key = handle.read()\n",
         first=GATE_TESTS),
    # --- the server command and the image --------------------------------------------------------
    dict(name="gate: vLLM serves without the gate", path="render/context.py",
         old='                    "--middleware", gate_middleware(recipe),\n', new="", first=FAIL_CLOSED),
    dict(name="gate: serve.metrics_unauthenticated ignored", path="render/context.py",
         old="    cls = gate.ApiKeyGateOpenMetrics if recipe.serve.metrics_unauthenticated else gate.ApiKeyGate\n",
         new="    cls = gate.ApiKeyGate\n", first=FAIL_CLOSED),
    dict(name="gate: the image carries no gate module", path="render/context.py",
         old='"probe.py", "cluster.py", "gate.py")', new='"probe.py", "cluster.py")',
         first=("tests/render/test_render.py",)),
    # --- fail closed -------------------------------------------------------------------------------
    dict(name="fail closed: the entrypoint serves without a key", path=ENTRYPOINT,
         old='    if [ "$IMGFAB_ALLOW_UNAUTHENTICATED" != 1 ]; then\n', new="    if false; then\n",
         first=FAIL_CLOSED),
    dict(name="fail closed: the recipe's opt-out not the image's default", path=ENTRYPOINT,
         old="{{ 1 if unauthenticated else 0 }}", new="0", first=FAIL_CLOSED),
    dict(name="fail closed: a multi-node worker asked for the key", path=ENTRYPOINT,
         old='{% if nodes > 1 %} && [ "${IMGFAB_ROLE:-leader}" != worker ]{% endif %}', new="",
         first=("tests/render/test_multinode.py",)),
    dict(name="fail closed: the gate not told the key file", path=ENTRYPOINT,
         old='{% else %}\nexport IMGFAB_API_KEY_FILE="$api_key_file"\n', new="{% else %}\n", first=FAIL_CLOSED),
    dict(name="fail closed: the opt-out label always false", path="render/context.py",
         old='"true" if recipe.serve.unauthenticated else "false"', new='"false"', first=FAIL_CLOSED),
    # --- where the port is published -----------------------------------------------------------
    dict(name="publish: compose publishes on every interface", path="_data/templates/compose.yaml.j2",
         old='("${HOST_ADDR:-" ~ publish_address ~ "}:${HOST_PORT:-" ~ port ~ "}:" ~ port)',
         new='("${HOST_PORT:-" ~ port ~ "}:" ~ port)', first=FAIL_CLOSED),
    dict(name="publish: serve.publish_address ignored", path="render/context.py",
         old='        "publish_address": recipe.serve.publish_address,\n',
         new='        "publish_address": "127.0.0.1",\n', first=FAIL_CLOSED),
    dict(name="publish: any publish_address accepted", path="recipe.py",
         old="            ipaddress.IPv4Address(value)\n", new="            str(value)\n", first=FAIL_CLOSED),
    # --- least privilege -----------------------------------------------------------------------
    dict(name="k8s: pods mount the service-account token", path="_data/templates/k8s.yaml.j2",
         old="automountServiceAccountToken: false\n", new="automountServiceAccountToken: true\n",
         first=FAIL_CLOSED),
    # --- smoke asks every route ------------------------------------------------------------------
    dict(name="smoke: only /v1 routes asked", path="ops/smoke_routes.py",
         old='        if not isinstance(path, str) or not path.startswith("/") or not isinstance(item, dict):\n',
         new='        if not isinstance(path, str) or not path.startswith("/v1") or not isinstance(item, dict):\n',
         first=SMOKE),
    dict(name="smoke: the unlisted routes not asked", path="ops/smoke_routes.py",
         old="    routes = listed + [route for route in UNLISTED if route not in listed]\n",
         new="    routes = listed\n", first=SMOKE),
    dict(name="smoke: a listed route's 404 taken as a refusal", path="ops/smoke_routes.py",
         old="        elif status in (401, 403):\n", new="        elif status in (401, 403, 404):\n",
         first=SMOKE),
    dict(name="smoke: the metrics label not read", path="ops/smoke_shapes.py",
         old='    if labels.get("org.imgfab.serve.metrics_unauthenticated") == "true":\n',
         new='    if False:\n', first=SMOKE),
    dict(name="smoke: a route table without the failures", path="ops/smoke.py",
         old="            if failures:\n                report.failures += failures\n",
         new="            if False:\n                report.failures += failures\n", first=SMOKE),
]
