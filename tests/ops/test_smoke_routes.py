"""How smoke reads a server's OpenAPI document into the routes it asks without the key
(imgfab.ops.smoke_routes); the asking itself runs against the test server in test_smoke.py."""

from __future__ import annotations

import pytest

from imgfab.ops.smoke_routes import concrete, listed_routes


def test_every_operation_of_every_path_is_a_route():
    document = {"openapi": "3.1.0", "paths": {
        "/v1/models": {"get": {}},
        "/invocations": {"post": {}, "parameters": [], "summary": "SageMaker"},
        "/v1/responses/{response_id}": {"get": {}, "delete": {}},
        "/ping": {"get": {}, "post": {}},
    }}
    assert listed_routes(document) == [
        ("POST", "/invocations"), ("GET", "/ping"), ("POST", "/ping"), ("GET", "/v1/models"),
        ("DELETE", "/v1/responses/{response_id}"), ("GET", "/v1/responses/{response_id}")]


def test_what_is_not_a_route_is_left_out():
    document = {"paths": {"relative": {"get": {}}, "/x": ["get"], "/y": {"x-extension": {}},
                          "/z": {"get": {}}}}
    assert listed_routes(document) == [("GET", "/z")]


@pytest.mark.parametrize("document", [{}, {"paths": []}, [], "paths"])
def test_a_document_without_paths_is_refused(document):
    with pytest.raises(ValueError, match="no 'paths' mapping"):
        listed_routes(document)


def test_a_listed_path_reaches_the_table_as_printable_ascii():
    """What a server lists is printed in the smoke report: an escape sequence or a space is
    percent-encoded, as it is requested."""
    document = {"paths": {"/a\x1b[31mb c": {"get": {}}, "/é": {"post": {}}}}
    assert listed_routes(document) == [("POST", "/%C3%A9"), ("GET", "/a%1B%5B31mb%20c")]


def test_path_parameters_are_filled_in():
    assert concrete("/v1/responses/{response_id}/cancel") == "/v1/responses/imgfab-smoke/cancel"
    assert concrete("/a/{x}/{y}") == "/a/imgfab-smoke/imgfab-smoke"
    assert concrete("/health") == "/health"
