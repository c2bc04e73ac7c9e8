"""Planted bugs for issue 37's build caches and builders: each sends buildx something other
than what was asked, or lets a spec through that cannot work."""

T = ("tests/docker/test_buildcache.py",)

PLANTS = [
    dict(name="buildcache: a remote builder's image stays in its own cache", path="docker/engine.py",
         old="        output[-1] = buildcache.output_for_driver(output[-1], driver)\n",
         new="        pass\n", first=T),
    dict(name="buildcache: every bake target exports to the spec as typed", path="render/bake.py",
         old='            targets[name]["cache-to"] = for_recipe(cache_to, recipe.name)',
         new='            targets[name]["cache-to"] = list(cache_to)', first=T),
    dict(name="buildcache: one cache-to shared by a fleet", path="render/cachespec.py",
         old="        if recipes > 1 and PLACEHOLDER not in spec",
         new="        if False and PLACEHOLDER not in spec", first=T),
    dict(name="buildcache: a credential key passes", path="render/cachespec.py",
         old="        if key in SECRET_KEYS:", new="        if False:", first=T),
    dict(name="buildcache: --cache-to never reaches buildx", path="docker/engine.py",
         old='            argv += ["--cache-to", spec]', new="            pass", first=T),
    dict(name="buildcache: an unknown builder goes to the build", path="docker/buildcache.py",
         old="    if done.returncode != 0 or not driver:", new="    if False:", first=T),
]
PLANTS += [
    dict(name="buildcache: the cache scan counts layers but reports no secret", path="docker/cache_scan.py",
         old='    scan.secrets += [f"{hit} (layer {digest[:19]})" for hit in result["secrets"]]',
         new="    pass", first=T),
]
