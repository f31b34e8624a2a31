"""--api-key guards every route but /health (and /metrics unless --metrics-require-key);
CORS headers appear only for the origins --allowed-origins names."""

from __future__ import annotations

import httpx
import pytest

from tests.server_utils import FAST_ENGINE_ARGS, ServerProcess, stories_model

KEY = "sekret"
AUTH = {"Authorization": f"Bearer {KEY}"}
ORIGIN = "https://app.example"
PREFLIGHT = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization,content-type"}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("access_guarded")
    server = ServerProcess(stories_model(), [*FAST_ENGINE_ARGS, "--api-key", KEY,
                                             "--metrics-require-key",
                                             "--allowed-origins", ORIGIN],
                           tmp / "server.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("access_plain")
    server = ServerProcess(stories_model(), [*FAST_ENGINE_ARGS, "--api-key", KEY],
                           tmp / "server.log")
    yield server
    server.stop()


def every_route(server) -> list[tuple[str, str]]:
    """(method, path) of every route the app serves, from its own OpenAPI document."""
    spec = httpx.get(server.url + "/openapi.json", headers=AUTH).json()
    routes = [(method.upper(), path) for path, item in spec["paths"].items() for method in item]
    return routes + [("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/redoc")]


def test_key_guards_every_route_but_health(guarded):
    routes = every_route(guarded)
    assert ("POST", "/v1/completions") in routes and ("GET", "/metrics") in routes
    for method, path in routes:
        without = httpx.request(method, guarded.url + path, json={})
        wrong = httpx.request(method, guarded.url + path, json={},
                              headers={"Authorization": "Bearer guess"})
        right = httpx.request(method, guarded.url + path, json={}, headers=AUTH, timeout=30)
        if path == "/health":
            assert without.status_code == wrong.status_code == right.status_code == 200
            continue
        assert (without.status_code, wrong.status_code) == (401, 401), path
        error = without.json()["error"]  # Ollama's routes answer in its shape: a string
        assert (error if path.startswith("/api/") else error["message"]) == "missing API key"
        assert right.status_code != 401, path


def test_metrics_are_open_without_metrics_require_key(plain):
    assert httpx.get(plain.url + "/metrics").status_code == 200
    assert httpx.get(plain.url + "/v1/models").status_code == 401


def test_cors_only_for_the_allowed_origins(guarded, plain):
    preflight = httpx.options(guarded.url + "/v1/completions", headers=PREFLIGHT)
    assert preflight.status_code == 200  # a preflight carries no key
    assert preflight.headers["access-control-allow-origin"] == ORIGIN
    # Answers to the allowed origin carry the header, errors included, so a page can read them.
    denied = httpx.get(guarded.url + "/v1/models", headers={"Origin": ORIGIN})
    assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == ORIGIN
    allowed = httpx.get(guarded.url + "/v1/models", headers={"Origin": ORIGIN, **AUTH})
    assert allowed.headers["access-control-allow-origin"] == ORIGIN

    other = {**PREFLIGHT, "Origin": "https://evil.example"}
    assert "access-control-allow-origin" not in httpx.options(
        guarded.url + "/v1/completions", headers=other).headers
    assert "access-control-allow-origin" not in httpx.get(
        guarded.url + "/v1/models", headers={"Origin": "https://evil.example", **AUTH}).headers
    # Without --allowed-origins there is no CORS at all.
    for response in (httpx.options(plain.url + "/v1/completions", headers=PREFLIGHT),
                     httpx.get(plain.url + "/v1/models", headers={"Origin": ORIGIN, **AUTH})):
        assert not any(name.startswith("access-control-") for name in response.headers)
