"""Planted bugs for issue 20, part 2 (quantization floors and fallbacks per vLLM release): each
turns off one guard or puts back one wrong fact of compat/precisions.yaml."""

Q = ("tests/stack/test_quant_floors.py",)
P = "_data/compat/precisions.yaml"

PLANTS = [
    dict(name="compat4: fp8 floor before 0.14.0 taken as 7.5", path=P,
         old='backend_versions: "<0.14.0"\n    min_compute_capability: "8.0"',
         new='backend_versions: "<0.14.0"\n    min_compute_capability: "7.5"', first=Q),
    dict(name="compat4: fp8 floor from 0.14.0 back at native 8.9", path=P,
         old='backend_versions: ">=0.14.0,<0.22.0"\n    min_compute_capability: "7.5"',
         new='backend_versions: ">=0.14.0,<0.22.0"\n    min_compute_capability: "8.9"', first=Q),
    dict(name="compat4: nvfp4 in 0.8.x given the Marlin floor", path=P,
         old='backend_versions: "<0.9.0"\n    min_compute_capability: "10.0"',
         new='backend_versions: "<0.9.0"\n    min_compute_capability: "8.0"', first=Q),
    dict(name="compat4: 0.10.x V1 fp8 KV cache on Blackwell forgotten", path=P,
         old='native_compute_capabilities: ["9.0", "10.0"]', new='native_compute_capabilities: ["9.0"]',
         first=Q),
    dict(name="compat4: GPTQ under TensorRT-LLM accepted", path=P,
         old='precision: "gptq"\n    min_compute_capability: null\n    max_compute_capability: null\n'
             '    excluded_compute_capabilities: []\n    supported: false',
         new='precision: "gptq"\n    min_compute_capability: null\n    max_compute_capability: null\n'
             '    excluded_compute_capabilities: []\n    supported: true', first=Q),
    dict(name="compat4: GPTQ not offered", path="recipe.py",
         old='    GPTQ = "gptq"  # a GPTQ checkpoint (W4A16/W8A16): vLLM reads the method from its config\n',
         new='', first=Q),
    dict(name="compat4: refusal below the floor hides the fallback", path="stack/candidates.py",
         old="            if rule.fallback and rule.min_compute_capability and \\",
         new="            if False and \\", first=Q),
    dict(name="compat4: no weight-only note on the stack", path="stack/resolve.py",
         old="        if weight_rule is not None and weight_rule.fallback and not weight_rule.native_on(",
         new="        if weight_rule is not None and False and not weight_rule.native_on(", first=Q),
    dict(name="compat4: native threshold exclusive (8.9 taken as weight-only)", path="matrix/compat.py",
         old="return not native or compare_versions(compute_capability, native) >= 0",
         new="return not native or compare_versions(compute_capability, native) > 0", first=Q),
    dict(name="compat4: native_compute_capabilities not loaded", path="matrix/compat.py",
         old='native_compute_capabilities=(None if row.get("native_compute_capabilities") is None',
         new='native_compute_capabilities=(None if True', first=Q),
]
