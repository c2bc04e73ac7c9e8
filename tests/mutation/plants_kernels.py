"""Planted bugs for issue 33 (the builder compiles the engine): each puts a compile back at the
first start, compiles for the wrong GPU, or ships the compiler to the runtime."""

K = ("tests/stack/test_kernels_aot.py",)
F = ("tests/render/test_golden_fragments.py",)

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
         old="            return 1\n", new="            continue\n", first=K),
    dict(name="kernels: no target architecture accepted", path="in_image/kernels.py",
         old='    if not os.environ.get("FLASHINFER_CUDA_ARCH_LIST"):', new="    if False:", first=K),
]
