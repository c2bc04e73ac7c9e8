"""Planted bugs for issue 19 (Docker Engine >= 23 with the containerd image store, layers that
are the same bytes from a cold cache, compression as a choice): each turns off one guard."""

DOCTOR = ("tests/ops/test_engine_doctor.py",)
RENDER = ("tests/render/test_render.py",)

PLANTS = [
    dict(name="engine: BuildKit's provenance attestation left on", path="docker/engine.py",
         old='    return ["--provenance=false", "--sbom=false", "--build-arg"',
         new='    return ["--sbom=false", "--build-arg"', first=DOCTOR),
    dict(name="engine: base layers keep their own compression", path="docker/engine.py",
         old='f"type=image,compression={compression},force-compression=true,"',
         new='f"type=image,compression={compression},"', first=DOCTOR),
    dict(name="engine: an engine older than the minimum builds", path="docker/engine.py",
         old="        return bool(self.release) and self.release < minimum\n",
         new="        return False\n", first=DOCTOR),
    dict(name="engine: zstd accepted on the classic image store", path="docker/engine.py",
         old='    if compression == "zstd" and not facts.containerd_store:\n',
         new='    if False:\n', first=DOCTOR),
    dict(name="engine: containerd store not recognised", path="docker/engine.py",
         old='containerd_store=status.get("driver-type") == "io.containerd.snapshotter.v1",',
         new='containerd_store=status.get("driver-type") == "overlayfs",', first=DOCTOR),
    dict(name="doctor: an image's zstd layers not checked against the engine", path="ops/doctor.py",
         old="        findings.extend(pull_findings(image_labels, view.docker_info))\n",
         new="", first=DOCTOR),
    dict(name="doctor: buildx missing not reported", path="ops/doctor.py",
         old="    if buildx:\n", new="    if True:\n", first=DOCTOR),
    dict(name="labels: zstd images claim any host pulls them", path="render/context.py",
         old='PULL_REQUIRES = {"gzip": "", "zstd": "docker>=23.0|containerd>=1.5"}',
         new='PULL_REQUIRES = {"gzip": "", "zstd": ""}', first=DOCTOR),
    dict(name="select: the pull requirement not said", path="ops/select.py",
         old="        if not self.pull_requires:\n            return \"\"\n        labels",
         new="        if True:\n            return \"\"\n        labels", first=DOCTOR),
    dict(name="runtime: the OS layer keeps the build's clock", path="_data/templates/runtime.j2",
         old="    && {{ layer_forget }} \\\n    && {{ layer_stamp }}\n",
         new="    && {{ layer_forget }}\n", first=RENDER),
    dict(name="runtime: a payload COPY depends on the layer below", path="_data/templates/runtime.j2",
         old='COPY --link --from={{ "payload" if engine.path else "builder" }}',
         new='COPY --from={{ "payload" if engine.path else "builder" }}', first=RENDER),
    dict(name="runtime: apt's logs stay in the OS layer", path="_data/templates/runtime.j2",
         old="    && {{ layer_forget }} \\\n", new="", first=RENDER),
    dict(name="runtime: useradd stamps today's day in /etc/shadow", path="_data/templates/runtime.j2",
         old="    && SOURCE_DATE_EPOCH=0 useradd ", new="    && useradd ", first=RENDER),
]
