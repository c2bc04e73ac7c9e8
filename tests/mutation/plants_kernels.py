"""Planted bugs for issue 33 (the builder compiles the engine): each puts a compile back at the
first start, compiles for the wrong GPU, or ships the compiler to the runtime."""

K = ("tests/stack/test_kernels_aot.py",)
F = ("tests/render/test_golden_fragments.py",)
T = ("tests/stack/test_triton_launchers.py",)
SELECT = ("tests/ops/test_engine_doctor.py",)
SPANS = ("tests/ops/test_startup_spans.py",)

PLANTS = [
    dict(name="kernels: aot rows compile at start again", path="stack/toolchain.py",
         old="    ahead = [j for j in applying if j.aot_specs]", new="    ahead = []", first=K),
    dict(name="kernels: the runtime leaves FlashInfer's JIT on", path="_data/templates/runtime.j2",
         old="{% if kernels %}\n    FLASHINFER_DISABLE_JIT=1 \\\n{% endif %}", new="", first=K),
    dict(name="kernels: compiled for every architecture, not the recipe's GPU", path="render/context.py",
         old='    return {"specs": list(stack.aot_specs), "arch": stack.compute_capability,',
         new='    return {"specs": list(stack.aot_specs), "arch": "8.0 9.0 10.0 12.0",', first=K),
    dict(name="kernels: the runtime copies the compiler wheels' layer", path="render/context.py",
         old="    if stack.aot_specs and not stack.cuda_home:", new="    if False:", first=F),
    dict(name="kernels: the builder's kernels never reach the runtime", path="_data/templates/runtime.j2",
         old="COPY --link --from=kernels /opt/imgfab/layers/kernels/ /\n", new="", first=K),
    dict(name="kernels: a failed compile still stages", path="in_image/kernels.py",
         old="                  file=sys.stderr)\n            return 1\n        print(f\"imgfab-kernels: {spec} ->",
         new="                  file=sys.stderr)\n            continue\n        print(f\"imgfab-kernels: {spec} ->", first=K),
    dict(name="kernels: no target architecture accepted", path="in_image/kernels.py",
         old='    if len(argv) > 1 and not os.environ.get("FLASHINFER_CUDA_ARCH_LIST"):', new="    if False:", first=K),
    dict(name="triton: a measured stack keeps its C compiler", path="stack/resolve.py",
         old="    row = launchers_for(matrix.triton_launchers, stack) if stack.aot_specs else None",
         new="    row = None", first=T),
    dict(name="triton: a row measured at another precision is used", path="matrix/triton.py",
         old="and compute_capability in self.compute_capabilities and precision in self.precisions",
         new="and compute_capability in self.compute_capabilities", first=T),
    dict(name="triton: a launcher that regenerates under another key is built anyway", path="in_image/kernels.py",
         old="        if recorded is not None and recorded not in keys.values():", new="        if False:", first=T),
    dict(name="triton: the seed holds only the key of the builder's own platform", path="in_image/kernels.py",
         old='    platform_keys = (bare + "ELF", bare)', new="    platform_keys = (here,)", first=T),
    dict(name="triton: the seed overwrites what the cache volume holds", path="_data/templates/entrypoint.sh.j2",
         old='        if [ ! -e "$TRITON_CACHE_DIR/$key" ]; then', new="        if true; then", first=T),
    dict(name="triton: a lock of another Triton renders the measured launchers", path="render/context.py",
         old="    if row is not None and locked is not None and locked != row.triton:", new="    if False:", first=T),
    dict(name="select: a runtime's C compiler not said", path="ops/select.py",
         old="        if not self.toolchain:\n            return \"\"", new="        if True:\n            return \"\"",
         first=SELECT),
    dict(name="startup: the log does not say when the container started", path="ops/smoke.py",
         old="        if started:\n            text = f\"{started} {STARTED_LINE}\\n{text}\"", new="", first=SPANS),
    dict(name="jit monitor: a checked release is left at warn", path="stack/resolve.py",
         old='    stack = replace(stack, jit_monitor="error" if monitor else "")',
         new='    stack = replace(stack, jit_monitor="")', first=T),
]
