"""The proxy HTTP API against Toxiproxy 2.12.0: the unmodified toxiproxy client, then raw HTTP."""

from __future__ import annotations

import random
import socket
from typing import Any

import pytest
import requests
from toxiproxy import Toxiproxy
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from chaos.proxy import BackgroundProxyServer
from chaos.proxy.collection import ProxyCollection
from chaos.proxy.proxy import loopback_listen
from chaos.proxy.toxics import ApiError
from kraft.netutil import free_port

TIMEOUT_S = 10.0


def _connect_refused(listen: str) -> bool:
    host, port = listen.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def _echo_once(listen: str, payload: bytes = b"ping") -> bytes:
    host, port = listen.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(payload)
        return sock.recv(len(payload))


class _Api:
    def __init__(self, server: BackgroundProxyServer) -> None:
        self.base = server.url

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> requests.Response:
        kwargs: dict[str, Any] = {"timeout": TIMEOUT_S, "headers": headers or {}}
        if raw is not None:
            kwargs["data"] = raw
        elif body is not None:
            kwargs["json"] = body
        return requests.request(method, self.base + path, **kwargs)


@pytest.fixture
def api(proxy_server: BackgroundProxyServer) -> _Api:
    return _Api(proxy_server)


# --- the unmodified toxiproxy-python client as a user ---


def test_client_version_is_the_raw_body(toxiproxy_client: Toxiproxy) -> None:
    assert toxiproxy_client.running()
    assert toxiproxy_client.version() == b'{"version": "2.12.0"}\n'


def test_client_create_reports_the_bound_port_and_forwards(
    toxiproxy_client: Toxiproxy, echo_address: str
) -> None:
    proxy = toxiproxy_client.create(upstream=echo_address, name="svc")
    assert proxy.listen.startswith("127.0.0.1:") and not proxy.listen.endswith(":0")
    assert proxy.enabled is True
    assert _echo_once(proxy.listen) == b"ping"
    assert set(toxiproxy_client.proxies()) == {"svc"}
    fetched = toxiproxy_client.get_proxy("svc")
    assert fetched is not None and fetched.upstream == echo_address and fetched.listen == proxy.listen
    with pytest.raises(ProxyExists):
        toxiproxy_client.create(upstream=echo_address, name="svc")


def test_client_toxic_lifecycle_and_error_mapping(toxiproxy_client: Toxiproxy, echo_address: str) -> None:
    proxy = toxiproxy_client.create(upstream=echo_address, name="svc")
    proxy.add_toxic(type="latency", attributes={"latency": 10})
    proxy.add_toxic(type="timeout", stream="upstream", name="cut", toxicity=0.5, attributes={"timeout": 0})
    toxics = proxy.toxics()
    assert set(toxics) == {"latency_downstream", "cut"}
    cut = toxics["cut"]
    assert (cut.type, cut.stream, cut.toxicity, cut.attributes) == (
        "timeout",
        "upstream",
        0.5,
        {"timeout": 0},
    )
    with pytest.raises(ProxyExists):  # a duplicate toxic is a 409, which the client maps to ProxyExists
        proxy.add_toxic(type="latency")
    with pytest.raises(InvalidToxic):
        proxy.add_toxic(type="no_such_toxic")
    assert proxy.destroy_toxic("cut") is True
    with pytest.raises(NotFound):
        proxy.destroy_toxic("cut")
    assert set(proxy.toxics()) == {"latency_downstream"}


def test_client_down_refuses_connections_until_enabled(
    toxiproxy_client: Toxiproxy, echo_address: str
) -> None:
    proxy = toxiproxy_client.create(upstream=echo_address, name="svc")
    with proxy.down():
        assert _connect_refused(proxy.listen)
        assert toxiproxy_client.proxies()["svc"].enabled is False
    assert _echo_once(proxy.listen) == b"ping"


def test_client_reset_reenables_and_removes_toxics(toxiproxy_client: Toxiproxy, echo_address: str) -> None:
    proxy = toxiproxy_client.create(upstream=echo_address, name="svc")
    proxy.add_toxic(type="latency", attributes={"latency": 10})
    proxy.disable()
    assert toxiproxy_client.reset() is True
    assert toxiproxy_client.proxies()["svc"].enabled is True
    assert proxy.toxics() == {}
    assert _echo_once(proxy.listen) == b"ping"


def test_client_populate_and_destroy_all(toxiproxy_client: Toxiproxy, echo_address: str) -> None:
    listen = f"127.0.0.1:{free_port()}"
    created = toxiproxy_client.populate([{"name": "a", "upstream": echo_address, "listen": listen}])
    assert [p.listen for p in created] == [listen]
    # Same listen and upstream: nothing to do.
    assert toxiproxy_client.populate([{"name": "a", "upstream": echo_address, "listen": listen}]) == []
    toxiproxy_client.destroy_all()
    assert toxiproxy_client.proxies() == {}
    assert _connect_refused(listen)


# --- raw HTTP for what the client does not call, and for exact shapes ---


def test_create_proxy_shape_and_status(api: _Api, echo_address: str) -> None:
    response = api.call("POST", "/proxies", {"name": "p", "upstream": echo_address, "listen": "127.0.0.1:0"})
    assert response.status_code == 201
    body = response.json()
    assert list(body) == ["name", "listen", "upstream", "enabled", "Logger", "toxics"]
    assert body["Logger"] == {} and body["toxics"] == [] and body["enabled"] is True
    assert response.headers["X-Toxiproxy-Request-Id"]
    listing = api.call("GET", "/proxies")
    assert listing.status_code == 200 and list(listing.json()) == ["p"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"upstream": "127.0.0.1:1"}, "missing required field: name"),
        ({"name": "x"}, "missing required field: upstream"),
        ({"name": "x", "upstream": "127.0.0.1:1", "enabled": "yes"}, "bad request body"),
    ],
)
def test_create_proxy_validation_errors(api: _Api, body: dict[str, Any], message: str) -> None:
    response = api.call("POST", "/proxies", body)
    assert response.status_code == 400
    assert response.json()["error"].startswith(message)
    assert response.json()["status"] == 400
    assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert response.text.endswith("\n")


def test_bad_json_is_a_400(api: _Api) -> None:
    response = api.call("POST", "/proxies", raw=b"{bad")
    assert response.status_code == 400
    assert response.json()["error"].startswith("bad request body: ")


def test_duplicate_proxy_is_409_and_port_conflict_is_500(api: _Api, echo_address: str) -> None:
    first = api.call(
        "POST", "/proxies", {"name": "p", "upstream": echo_address, "listen": "127.0.0.1:0"}
    ).json()
    again = api.call("POST", "/proxies", {"name": "p", "upstream": echo_address})
    assert again.status_code == 409 and again.json()["error"] == "proxy already exists"
    conflict = api.call(
        "POST", "/proxies", {"name": "q", "upstream": echo_address, "listen": first["listen"]}
    )
    assert conflict.status_code == 500
    assert conflict.json()["error"] == f"listen tcp {first['listen']}: bind: address already in use"
    assert api.call("GET", "/proxies/q").status_code == 404


def test_listen_forms_are_rewritten_to_the_bound_address(api: _Api, echo_address: str) -> None:
    local = api.call(
        "POST", "/proxies", {"name": "l", "upstream": echo_address, "listen": "localhost:0"}
    ).json()
    assert local["listen"].startswith("127.0.0.1:")
    # All interfaces is loopback unless the server allows remote listeners (issue #15).
    anywhere = api.call("POST", "/proxies", {"name": "a", "upstream": echo_address, "listen": ""}).json()
    assert anywhere["listen"].startswith("127.0.0.1:")
    wildcard = api.call(
        "POST", "/proxies", {"name": "w", "upstream": echo_address, "listen": "0.0.0.0:0"}
    ).json()
    assert wildcard["listen"].startswith("127.0.0.1:")
    remote = api.call("POST", "/proxies", {"name": "r", "upstream": echo_address, "listen": "192.0.2.1:0"})
    assert remote.status_code == 403 and "--allow-remote-listen" in remote.json()["error"]
    assert api.call("GET", "/proxies/r").status_code == 404
    disabled = api.call(
        "POST", "/proxies", {"name": "d", "upstream": echo_address, "listen": "127.0.0.1:0", "enabled": False}
    ).json()
    assert disabled["listen"] == "127.0.0.1:0" and disabled["enabled"] is False


def test_loopback_listen_rewrites_wildcards_and_refuses_remote_hosts() -> None:
    assert loopback_listen("") == "127.0.0.1:0"
    assert loopback_listen(":8080") == "127.0.0.1:8080"
    assert loopback_listen("0.0.0.0:8080") == "127.0.0.1:8080"
    assert loopback_listen("[::]:8080") == "127.0.0.1:8080"
    assert loopback_listen("localhost:1") == "localhost:1"
    assert loopback_listen("127.0.0.2:1") == "127.0.0.2:1"
    assert loopback_listen("[::1]:1") == "[::1]:1"
    with pytest.raises(ApiError) as refused:
        loopback_listen("10.0.0.1:1")
    assert refused.value.status == 403


async def test_remote_listen_allowed_when_told(echo_address: str) -> None:
    collection = ProxyCollection(random.Random(1), allow_remote_listen=True)
    proxy = await collection.create({"name": "any", "upstream": echo_address, "listen": ""})
    try:
        assert proxy.listen.startswith("[::]:")
    finally:
        await proxy.stop()


def test_get_and_delete_proxy(api: _Api, echo_address: str) -> None:
    api.call("POST", "/proxies", {"name": "p", "upstream": echo_address, "listen": "127.0.0.1:0"})
    assert api.call("GET", "/proxies/p").json()["name"] == "p"
    deleted = api.call("DELETE", "/proxies/p")
    assert deleted.status_code == 204 and deleted.content == b""
    missing = api.call("DELETE", "/proxies/p")
    assert missing.status_code == 404 and missing.json() == {"error": "proxy not found", "status": 404}


def test_update_proxy_with_patch_and_post(api: _Api, echo_address: str) -> None:
    created = api.call(
        "POST", "/proxies", {"name": "p", "upstream": echo_address, "listen": "127.0.0.1:0"}
    ).json()
    down = api.call("PATCH", "/proxies/p", {"enabled": False})
    assert down.status_code == 200 and down.json()["enabled"] is False
    assert down.json()["listen"] == created["listen"] and down.json()["upstream"] == echo_address
    assert _connect_refused(created["listen"])
    up = api.call("POST", "/proxies/p", {"enabled": True})
    assert up.json()["enabled"] is True and up.json()["listen"] == created["listen"]
    assert _echo_once(created["listen"]) == b"ping"
    moved_to = f"127.0.0.1:{free_port()}"
    moved = api.call("PATCH", "/proxies/p", {"listen": moved_to})
    assert moved.json()["listen"] == moved_to
    assert _echo_once(moved_to) == b"ping"
    assert api.call("PATCH", "/proxies/nope", {"enabled": True}).status_code == 404


def test_toxic_create_defaults_and_listing_order(api: _Api, echo_address: str) -> None:
    api.call("POST", "/proxies", {"name": "p", "upstream": echo_address, "listen": "127.0.0.1:0"})
    created = api.call("POST", "/proxies/p/toxics", {"type": "latency", "attributes": {"latency": 5, "x": 1}})
    assert created.status_code == 200
    assert created.json() == {
        "attributes": {"latency": 5, "jitter": 0},
        "name": "latency_downstream",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 1,
    }
    assert b'"toxicity":1}' in created.content
    up = api.call("POST", "/proxies/p/toxics", {"type": "noop", "stream": "UpStream"}).json()
    assert up["name"] == "noop_UpStream" and up["stream"] == "UpStream"
    listing = api.call("GET", "/proxies/p/toxics").json()
    assert [t["name"] for t in listing] == ["noop_UpStream", "latency_downstream"]
    assert api.call("GET", "/proxies/p").json()["toxics"] == listing


def test_toxic_validation_order_and_conflicts(api: _Api, echo_address: str) -> None:
    api.call("POST", "/proxies", {"name": "p", "upstream": echo_address, "listen": "127.0.0.1:0"})
    both_bad = api.call("POST", "/proxies/p/toxics", {"type": "nope", "stream": "sideways"})
    assert both_bad.status_code == 400
    assert both_bad.json()["error"] == "stream was invalid, can be either upstream or downstream"
    empty_stream = api.call("POST", "/proxies/p/toxics", {"type": "noop", "stream": ""})
    assert empty_stream.json()["error"] == "stream was invalid, can be either upstream or downstream"
    bad_type = api.call("POST", "/proxies/p/toxics", {"type": "nope"})
    assert bad_type.json() == {"error": "invalid toxic type", "status": 400}
    bad_attr = api.call("POST", "/proxies/p/toxics", {"type": "latency", "attributes": {"latency": "1s"}})
    assert bad_attr.status_code == 400
    api.call("POST", "/proxies/p/toxics", {"type": "timeout", "name": "t", "stream": "upstream"})
    clash = api.call("POST", "/proxies/p/toxics", {"type": "noop", "name": "t", "stream": "downstream"})
    assert clash.status_code == 409 and clash.json()["error"] == "toxic already exists"
    assert api.call("POST", "/proxies/zz/toxics", {"type": "noop"}).json()["error"] == "proxy not found"
    assert api.call("GET", "/proxies/p/toxics/none").json()["error"] == "toxic not found"


def test_toxic_update_merges_into_the_existing_toxic(api: _Api, echo_address: str) -> None:
    api.call("POST", "/proxies", {"name": "p", "upstream": echo_address, "listen": "127.0.0.1:0"})
    api.call(
        "POST",
        "/proxies/p/toxics",
        {"type": "latency", "name": "lat", "toxicity": 0.5, "attributes": {"latency": 5, "jitter": 2}},
    )
    updated = api.call("PATCH", "/proxies/p/toxics/lat", {"type": "timeout", "attributes": {"latency": 9}})
    assert updated.status_code == 200
    assert updated.json() == {
        "attributes": {"latency": 9, "jitter": 2},
        "name": "lat",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 0.5,
    }
    again = api.call("POST", "/proxies/p/toxics/lat", {"toxicity": 1.0})
    assert again.json()["toxicity"] == 1 and again.json()["attributes"] == {"latency": 9, "jitter": 2}
    assert api.call("GET", "/proxies/p/toxics/lat").json() == again.json()
    assert api.call("DELETE", "/proxies/p/toxics/lat").status_code == 204
    assert api.call("DELETE", "/proxies/p/toxics/lat").status_code == 404


def test_populate_creates_validates_first_and_keeps_unchanged(api: _Api, echo_address: str) -> None:
    empty = api.call("POST", "/populate", [])
    assert empty.status_code == 201 and empty.json() == {"proxies": None}
    listen = f"127.0.0.1:{free_port()}"
    created = api.call("POST", "/populate", [{"name": "a", "upstream": echo_address, "listen": listen}])
    assert created.status_code == 201 and [p["listen"] for p in created.json()["proxies"]] == [listen]
    api.call("POST", "/proxies/a/toxics", {"type": "noop"})
    api.call("PATCH", "/proxies/a", {"enabled": False})
    unchanged = api.call("POST", "/populate", [{"name": "a", "upstream": echo_address, "listen": listen}])
    kept = unchanged.json()["proxies"][0]
    assert kept["enabled"] is False and len(kept["toxics"]) == 1
    invalid = api.call("POST", "/populate", [{"name": "b", "upstream": echo_address}, {"upstream": "x:1"}])
    assert invalid.status_code == 400
    assert invalid.json() == {
        "error": "missing required field: name at proxy 2",
        "status": 400,
        "proxies": None,
    }
    assert api.call("GET", "/proxies/b").status_code == 404


def test_populate_reports_proxies_created_before_a_failure(api: _Api, echo_address: str) -> None:
    taken = api.call("POST", "/proxies", {"name": "t", "upstream": echo_address, "listen": "127.0.0.1:0"})
    body = [
        {"name": "ok", "upstream": echo_address, "listen": "127.0.0.1:0"},
        {"name": "clash", "upstream": echo_address, "listen": taken.json()["listen"]},
    ]
    failed = api.call("POST", "/populate", body)
    assert failed.status_code == 500
    assert [p["name"] for p in failed.json()["proxies"]] == ["ok"]


def test_version_routing_and_middleware(api: _Api) -> None:
    version = api.call("GET", "/version")
    assert version.content == b'{"version": "2.12.0"}\n'
    assert version.headers["Content-Type"] == "application/json;charset=utf-8"
    missing = api.call("GET", "/nothing/here")
    assert missing.status_code == 404 and missing.text == "404 page not found\n"
    assert api.call("GET", "/metrics").status_code == 404
    assert api.call("DELETE", "/version").status_code == 405
    assert api.call("PUT", "/proxies").status_code == 405
    browser = api.call("GET", "/proxies", headers={"User-Agent": "Mozilla/5.0"})
    assert browser.status_code == 403 and browser.text.strip() == "User agent not allowed"
    reset = api.call("POST", "/reset")
    assert reset.status_code == 204 and reset.content == b""


def test_keep_alive_serves_several_requests_on_one_connection(api: _Api) -> None:
    with requests.Session() as session:
        for _ in range(3):
            assert session.get(api.base + "/version", timeout=TIMEOUT_S).status_code == 200
