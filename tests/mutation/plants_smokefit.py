"""Planted bugs for issue 22's host-side fit check in `imgfab smoke --weights DIR`
(ops/smoke_fit.py): each turns off one of its guards."""

SMOKE_FIT = ("tests/ops/test_smoke_fit.py",)

PLANTS = [
    dict(name="smoke fit: smoke never checks the weights", path="ops/smoke_shapes.py",
         old='    fit = weights_fit(labels, weights) if weights is not None else ""\n',
         new='    fit = ""\n', first=SMOKE_FIT),
    dict(name="smoke fit: a model that cannot fit is served", path="ops/smoke_fit.py",
         old='    if problem:\n        raise CompatibilityError(f"{model} does not fit',
         new='    if False:\n        raise CompatibilityError(f"{model} does not fit', first=SMOKE_FIT),
    dict(name="smoke fit: weights of another model accepted", path="ops/smoke_fit.py",
         old="        if name in merged and merged[name] != value:\n", new="        if False:\n",
         first=SMOKE_FIT),
    dict(name="smoke fit: heads and positions not checked", path="ops/smoke_fit.py",
         old="    problem = positions_problem(facts, serving.max_len) or heads_problem(facts, serving.tp)\n",
         new='    problem = ""\n', first=SMOKE_FIT),
    dict(name="smoke fit: unknown facts said as a fit", path="ops/smoke_fit.py",
         old='        return (f"fit not checked: {weights} and', new='        return (f"fits: {weights} and',
         first=SMOKE_FIT),
]
