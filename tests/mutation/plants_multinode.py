"""Planted bugs for issue 22's multi-node serving: each turns off one guard of the entrypoint's
roles, or of the leader and worker roles run.sh and compose.yaml give plain hosts."""

MULTINODE = ("tests/render/test_multinode.py",)
ENTRYPOINT = "_data/templates/entrypoint.sh.j2"
RUN_SH = "_data/templates/run.sh.j2"
COMPOSE = "_data/templates/compose.yaml.j2"

PLANTS = [
    dict(name="multinode: the leader serves without waiting for the workers", path=ENTRYPOINT,
         old='        step python3 -m imgfab.in_image.cluster --nodes {{ nodes }} --gpus {{ gpu_count * nodes }} --timeout "${IMGFAB_RAY_WAIT_S:-600}"\n',
         new="", first=MULTINODE),
    dict(name="multinode: IMGFAB_RAY_ARGS not passed to a worker's ray start", path=ENTRYPOINT,
         old='--num-gpus={{ gpu_count }} --block --disable-usage-stats "${node_args[@]}" "${ray_args[@]}"\n',
         new='--num-gpus={{ gpu_count }} --block --disable-usage-stats "${node_args[@]}"\n', first=MULTINODE),
    dict(name="multinode: run.sh worker does not pass the leader address", path=RUN_SH,
         old='    args+=(--env IMGFAB_ROLE=worker --env "IMGFAB_LEADER_ADDRESS=$leader")\n',
         new="    args+=(--env IMGFAB_ROLE=worker)\n", first=MULTINODE),
    dict(name="multinode: run.sh takes any leader address", path=RUN_SH,
         old="            -*|*[!A-Za-z0-9.-]*)\n", new="            __never__)\n",
         first=MULTINODE),
    dict(name="multinode: run.sh worker asks for the API key", path=RUN_SH,
         old='{# only the leader serves: a worker never sees the key #}\nif [ "$role" = leader ]; then\n',
         new='if true; then\n', first=MULTINODE),
    dict(name="multinode: run.sh runs without a role", path=RUN_SH,
         old='    *)\n        echo "run.sh: {{ recipe.name }} spans',
         new='    "")\n        role=leader; leader=""; max_args=0\n        ;;\n    *)\n        echo "run.sh: {{ recipe.name }} spans',
         first=MULTINODE),
    dict(name="multinode: compose worker started without its profile", path=COMPOSE,
         old='    profiles: ["worker"]\n', new="", first=MULTINODE),
    dict(name="multinode: compose worker gets no leader address", path=COMPOSE,
         old='      IMGFAB_LEADER_ADDRESS: "${IMGFAB_LEADER_ADDRESS:-}"\n', new="", first=MULTINODE),
    dict(name="multinode: compose mounts the API key on the worker", path=COMPOSE,
         old='{% if api_key and role == "leader" %}\n', new="{% if api_key %}\n", first=MULTINODE),
]

PLANTS += [
    dict(name="multinode: the payload leaves ray out across nodes", path="payload/lock.py",
         old='    pins.extend(getattr(stack, "payload_multinode", ()))\n', new="",
         first=("tests/render/test_multinode.py",)),
]
