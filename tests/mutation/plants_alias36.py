"""Planted bugs for issue 36, item 7 (aliases that mislead): each answers an ambiguous
quantization alias with one value, drops its choices, or lets `imgfab matrix --precision` check
nothing for a name it does not know."""

ALIASES = ("tests/test_recipe_aliases.py",)
FIRST_STEPS = ("tests/test_cli_first_steps.py",)

PLANTS = [
    dict(name="alias36: w8a8 means int8_sq again (fp8 is W8A8 too)", path="recipe.py",
         old='        "w8a8": (_W8A8_FP8, _W8A8_INT8),\n',
         new='        "w8a8": (_W8A8_INT8,),\n', first=ALIASES),
    dict(name="alias36: w4a16 means int4_awq again (GPTQ is W4A16 too)", path="recipe.py",
         old='        "w4a16": (_GPTQ, _AWQ),\n',
         new='        "w4a16": (_AWQ,),\n', first=ALIASES),
    dict(name="alias36: fp4 means nvfp4 again (MXFP4 is FP4 too)", path="recipe.py",
         old='        "fp4": (("mxfp4", "OCP MX FP4, as gpt-oss ships: not an engine.quantization imgfab "\n'
             '                          "serves yet"),\n'
             '                ("nvfp4", "NVIDIA FP4, Blackwell")),\n',
         new='        "fp4": (("nvfp4", "NVIDIA FP4, Blackwell"),),\n', first=ALIASES),
    dict(name="alias36: an ambiguous alias answered with its first choice only", path="recipe.py",
         old="        return tuple(exact for exact, _ in ambiguous)\n",
         new="        return tuple(exact for exact, _ in ambiguous[:1])\n", first=ALIASES),
    dict(name="alias36: the refusal keeps pydantic's message, not the choices", path="recipe.py",
         old='            message = ambiguous_alias(field, err.get("input")) or message\n',
         new="", first=ALIASES),
    dict(name="alias36: the fix names one choice as if it were the answer", path="recipe.py",
         old='        return "write the one the checkpoint is: " + "; ".join(\n'
             '            f"{short}: {exact} ({meaning})" for exact, meaning in ambiguous)\n',
         new='        return f"write {short}: {ambiguous[0][0]} ({ambiguous[0][1]})"\n', first=ALIASES),
    dict(name="alias36: alias_fix fails on a field without a dot (name)", path="recipe.py",
         old='    short = field.rsplit(".", 1)[-1]\n',
         new='    short = field.rsplit(".", 1)[1]\n', first=FIRST_STEPS),
    dict(name="alias36: explain leaves the refused aliases out", path="cli.py",
         old="    for typed, choices in sorted(AMBIGUOUS_ALIASES.get(field, {}).items()):\n",
         new="    for typed, choices in sorted({}.items()):\n", first=ALIASES),
    dict(name="alias36: matrix --precision checks nothing for a name it does not know",
         path="stack/resolve.py",
         old="    _refuse_unknown_precision(matrix, precision)\n", new="", first=ALIASES),
    dict(name="alias36: matrix --precision calls an ambiguous alias unknown", path="stack/resolve.py",
         old="    if ambiguous:\n        choices =",
         new="    if ambiguous and False:\n        choices =", first=ALIASES),
]
