"""The integration tests use their own repositories (issue 12): they build and push copies of
the example recipes whose image.repository is imgfab-test/..., never an example recipe's
repository and tag (which the demo pushes). Read from the test sources, since the integration
modules only import on the local stack."""

from __future__ import annotations

import re

from conftest import REPO

INTEGRATION = sorted((REPO / "tests" / "integration").glob("test_*.py"))


def test_example_recipes_are_built_only_through_own_repository_copies():
    for path in INTEGRATION:
        text = path.read_text()
        for match in re.finditer(r'^(\w+) = (.*REPO / "recipes" / .*)$', text, re.M):
            name, value = match.groups()
            builds = re.search(rf"imgfab_build\(\s*{name}\b|\"build\", str\({name}\)", text)
            if builds:
                assert value.startswith("_own_repository("), (path.name, name)


def test_no_integration_test_names_an_example_repository():
    examples = set(re.findall(r"(?m)^\s*repository:\s*(\S+)",
                              "".join(p.read_text() for p in (REPO / "recipes").glob("*.yaml"))))
    assert examples
    for path in INTEGRATION:
        text = path.read_text()
        for repository in examples:
            assert f"/{repository}@" not in text and f"/{repository}:" not in text, \
                (path.name, repository)
