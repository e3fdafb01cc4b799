"""The control API server over real loopback sockets, with a fake Controller."""

from __future__ import annotations

import json
import logging
import stat
from functools import partial

import pytest
import trio
from api_support import NOW_MS, TOKEN, FakeController

from node.api.common import MAX_WAIT_S, clear_api_info, read_api_info, write_api_info
from node.api.server import build_app, serve_api
from node.market.request import Input, MaxPrices, RequestError, parse_request

DIGEST = "sha256:" + "ab" * 32
SUBMIT = {"image": DIGEST, "command": ["echo", "hi"], "max_prices": {"cpu_core_hour": 2_000_000}}


class Server:
    def __init__(self, fake: FakeController, port: int) -> None:
        self.fake = fake
        self.port = port

    async def raw(self, data: bytes) -> tuple[int, dict[str, str], bytes]:
        """Send ``data`` as is; the status, headers and body of the answer."""
        stream = await trio.open_tcp_stream("127.0.0.1", self.port)
        async with stream:
            await stream.send_all(data)
            received = bytearray()
            while chunk := await stream.receive_some(65536):
                received += chunk
        head, _, body = bytes(received).partition(b"\r\n\r\n")
        status_line, *lines = head.decode().split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return int(status_line.split()[1]), headers, body

    async def request(
        self, method: str, target: str, body: object = None, *, token: str | None = TOKEN
    ) -> tuple[int, object]:
        payload = b"" if body is None else body if isinstance(body, bytes) else json.dumps(body)
        if isinstance(payload, str):
            payload = payload.encode()
        lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1"]
        if token is not None:
            lines.append(f"Authorization: Bearer {token}")
        if payload:
            lines += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
        status, headers, data = await self.raw(("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
        assert headers["content-type"] == "application/json"
        assert headers["connection"] == "close"
        return status, json.loads(data)


@pytest.fixture
async def server(nursery):
    fake = FakeController()
    fake.add_job("aaaa0001", name="first", created_ms=NOW_MS - 5000)
    fake.add_job(
        "bbbb0002",
        state="succeeded",
        provider="12D3KooWProvider",
        attempts=1,
        exit_reason="success",
        exit_code=0,
        outputs=[{"path": "/out/result.txt", "digest": DIGEST, "size": 3}],
    )
    port = await nursery.start(partial(serve_api, fake, token=TOKEN))
    return Server(fake, port)


def error_code(body: object) -> str:
    assert isinstance(body, dict)
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message"}
    return body["error"]["code"]


async def test_every_request_needs_the_token(server):
    for token in (None, "wrong", TOKEN + "x", ""):
        status, body = await server.request("GET", "/v1/node", token=token)
        assert status == 401
        assert error_code(body) == "unauthorized"
    status, headers, _ = await server.raw(
        b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Basic " + TOKEN.encode() + b"\r\n\r\n"
    )
    assert (status, headers["www-authenticate"]) == (401, "Bearer")
    # Unknown routes are not revealed to the unauthenticated either.
    assert (await server.request("GET", "/v1/nothing", token="wrong"))[0] == 401
    assert (await server.request("GET", "/v1/node"))[0] == 200


async def test_each_route_answers_with_its_shape(server, tmp_path):
    status, node = await server.request("GET", "/v1/node")
    assert status == 200
    assert set(node) == {"peer_id", "addrs", "provider", "offer", "version", "quotas"}
    status, body = await server.request("POST", "/v1/quotas/reload")  # a buyer has none
    assert (status, error_code(body)) == (409, "not-provider")

    status, peers = await server.request("GET", "/v1/peers")
    assert status == 200
    assert [p["peer_id"][:8] for p in peers] == ["12D3KooW", "12D3KooW"]

    status, jobs = await server.request("GET", "/v1/jobs")
    assert status == 200
    assert [j["id"] for j in jobs] == ["bbbb0002", "aaaa0001"]  # newest first

    status, job = await server.request("GET", "/v1/jobs/bbbb")  # a prefix will do
    assert (status, job["id"], job["state"]) == (200, "bbbb0002", "succeeded")

    status, events = await server.request("GET", "/v1/jobs/aaaa0001/events?after=0&wait=0")
    assert status == 200
    assert [(e["seq"], e["state"]) for e in events] == [(1, "waiting")]
    assert set(events[0]) == {"seq", "at_ms", "state", "detail"}

    status, why = await server.request("GET", "/v1/jobs/aaaa0001/why")
    assert status == 200
    assert why["ruled_out"]["price"] == 3
    assert {"bid_id", "offers_seen", "best_price", "limit", "explanation"} <= set(why)

    status, logs = await server.request("GET", "/v1/jobs/bbbb0002/logs")
    assert (status, set(logs)) == (200, {"stdout", "stderr"})

    status, files = await server.request(
        "POST", "/v1/jobs/bbbb0002/outputs", {"dest": str(tmp_path)}
    )
    assert status == 200
    assert files == [
        {"path": "/out/result.txt", "file": str(tmp_path / "out/result.txt"), "size": 3}
    ]
    assert (tmp_path / "out/result.txt").read_bytes() == b"xxx"

    status, market = await server.request("GET", "/v1/market")
    assert status == 200
    assert set(market) == {"offers", "bids", "classes", "recent_trades", "rejected_gossip"}

    status, ledger = await server.request("GET", "/v1/ledger")
    assert (status, ledger["balance"]) == (200, -1_500_000)

    status, cancelled = await server.request("POST", "/v1/jobs/aaaa0001/cancel")
    assert (status, cancelled["state"]) == (200, "cancelled")
    status, body = await server.request("POST", "/v1/jobs/aaaa0001/cancel")
    assert (status, error_code(body)) == (409, "job-ended")


async def test_submit_validates_and_fills_defaults(server):
    status, job = await server.request("POST", "/v1/jobs", {**SUBMIT, "name": "n1"})
    assert (status, job["name"], job["state"]) == (201, "n1", "waiting")
    (seen,) = server.fake.submitted
    assert seen == parse_request(json.dumps({**SUBMIT, "name": "n1"}))
    assert seen.cpu_milli == 1000
    assert seen.max_prices == MaxPrices(cpu_core_hour=2_000_000)
    for bad, field in [
        ({**SUBMIT, "command": []}, "command"),
        ({**SUBMIT, "image": "busybox"}, "image"),
        ({**SUBMIT, "cpu_milli": True}, "cpu_milli"),
        ({**SUBMIT, "cpu_milli": "2"}, "cpu_milli"),
        ({**SUBMIT, "memory_bytes": -1}, "memory_bytes"),
        ({**SUBMIT, "trust": "sgx"}, "trust"),
        ({**SUBMIT, "colour": "red"}, "colour"),
        ({**SUBMIT, "inputs": [{"path": "in/x", "file": "/tmp/x"}]}, "inputs[0].path"),
        ({**SUBMIT, "inputs": [{"path": "/in/x", "digest": "md5:1", "size": 1}]}, "digest"),
        ({**SUBMIT, "inputs": [{"path": "/in/x"}]}, "inputs[0]"),
        ({**SUBMIT, "max_prices": {"memory_gib_hour": 1}}, "cpu_core_hour"),
        ({**SUBMIT, "env": {"A=B": "1"}}, "env"),
        # issue 17 D3: integers past what a message holds were 500s
        ({**SUBMIT, "memory_bytes": 2**70}, "memory_bytes"),
        ({**SUBMIT, "disk_bytes": 2**64}, "disk_bytes"),
        ({**SUBMIT, "wall_ms": 10**30}, "wall_ms"),
        ({**SUBMIT, "max_prices": {"cpu_core_hour": 2**64}}, "cpu_core_hour"),
        ({"image": DIGEST}, "command"),
        ([SUBMIT], "object"),
    ]:
        status, body = await server.request("POST", "/v1/jobs", bad)
        assert (status, error_code(body)) == (400, "bad-request"), bad
        assert field in body["error"]["message"]
    # issue 17 D3: lone surrogates were 500s; the strict parser refuses such text as JSON
    for bad in ({**SUBMIT, "name": "\ud800"}, {**SUBMIT, "command": ["\udfff"]}):
        status, body = await server.request("POST", "/v1/jobs", bad)
        assert (status, error_code(body)) == (400, "bad-json"), bad
        assert body["error"]["message"].startswith("the request is not JSON: ")
    assert len(server.fake.submitted) == 1


async def test_unknown_job_route_and_method(server):
    status, body = await server.request("GET", "/v1/jobs/ffff")
    assert (status, error_code(body)) == (404, "unknown-job")
    status, body = await server.request("GET", "/v1/jobs/ffff/why")
    assert status == 404
    status, body = await server.request("GET", "/v2/jobs")
    assert (status, error_code(body)) == (404, "not-found")
    status, body = await server.request("GET", "/v1/jobs/aaaa0001/nothing")
    assert status == 404
    status, body = await server.request("DELETE", "/v1/jobs/aaaa0001")
    assert (status, error_code(body)) == (405, "method-not-allowed")
    status, headers, _ = await server.raw(
        f"GET /v1/jobs/aaaa0001/cancel HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}"
        "\r\n\r\n".encode()
    )
    assert (status, headers["allow"]) == (405, "POST")


async def test_malformed_json_and_queries_are_400(server):
    for body in (b"{not json", b"NaN", b"[" * 100_000, b"\xff\xfe"):
        status, answer = await server.request("POST", "/v1/jobs", body)
        assert (status, error_code(answer)) == (400, "bad-json")
    status, answer = await server.request("POST", "/v1/jobs/bbbb0002/outputs", {"dest": "rel"})
    assert (status, error_code(answer)) == (400, "bad-request")
    for query in ("after=x", "after=1.5", "wait=-1", "wait=inf"):
        status, answer = await server.request("GET", f"/v1/jobs/aaaa0001/events?{query}")
        assert (status, error_code(answer)) == (400, "bad-request"), query
    status, _, _ = await server.raw(b"NOT HTTP AT ALL\r\n\r\n")
    assert status == 400
    assert (await server.request("GET", "/v1/node"))[0] == 200


async def test_oversized_bodies_are_413(server):
    head = (
        f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Length: {2 << 20}\r\n\r\n"
    ).encode()
    status, _, body = await server.raw(head + b"{" * 65536)
    assert (status, error_code(json.loads(body))) == (413, "too-large")
    # Without a length the limit applies as the chunks arrive.
    chunk = b"x" * 65536
    chunked = (
        f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode() + (b"10000\r\n" + chunk + b"\r\n") * 17
    status, _, body = await server.raw(chunked + b"0\r\n\r\n")
    assert status == 413
    assert (await server.request("GET", "/v1/node"))[0] == 200


async def test_a_controller_bug_is_500_logged_and_the_server_goes_on(server, caplog):
    server.fake.broken = True
    with caplog.at_level(logging.ERROR, logger="node.api.server"):
        status, body = await server.request("GET", "/v1/peers")
    assert (status, error_code(body)) == (500, "internal")
    assert "RuntimeError" in body["error"]["message"]
    assert "corrupted" not in body["error"]["message"]  # details stay in the node's log
    (record,) = caplog.records
    assert record.exc_info is not None
    assert "GET /v1/peers" in record.getMessage()
    server.fake.broken = False
    assert (await server.request("GET", "/v1/peers"))[0] == 200


async def test_events_long_poll_returns_when_an_event_arrives(server, nursery):
    got: list[object] = []
    answered = trio.Event()

    async def poll() -> None:
        got.append(await server.request("GET", "/v1/jobs/aaaa0001/events?after=1&wait=30"))
        answered.set()

    nursery.start_soon(poll)
    await server.fake.polling.wait()
    assert got == []
    server.fake.advance("aaaa0001", "negotiating", "offer from 12D3KooWProvider")
    with trio.fail_after(5):  # far below the 30 s the poll would wait without the event
        await answered.wait()
    ((status, events),) = got
    assert status == 200
    assert [(e["seq"], e["state"]) for e in events] == [(2, "negotiating")]


async def test_events_wait_is_capped(server):
    status, _ = await server.request("GET", "/v1/jobs/aaaa0001/events?after=0&wait=3600")
    assert status == 200
    assert server.fake.last_wait_s == MAX_WAIT_S


async def test_a_silent_client_is_disconnected_and_others_are_served(nursery, autojump_clock):
    fake = FakeController()
    port = await nursery.start(partial(serve_api, fake, token=TOKEN, read_timeout_s=5))
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(b"GET /v1/node HTTP/1.1\r\nHost: x\r\n")  # and never the rest
    received = bytearray()
    while chunk := await stream.receive_some(65536):
        received += chunk
    await stream.aclose()
    assert received == b""  # closed without an answer: it never asked a whole question
    assert (await Server(fake, port).request("GET", "/v1/node"))[0] == 200


async def test_idle_unauthenticated_connections_do_not_delay_a_client_with_the_token(nursery):
    """Issue 17 D7: 100 connections that never finish their headers once held every slot
    of the server, and a valid request waited for their 10 s read timeout."""
    fake = FakeController()
    port = await nursery.start(partial(serve_api, fake, token=TOKEN, read_timeout_s=60))
    idle = []
    for _ in range(150):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /v1/node HTTP/1.1\r\nHost: x\r\n")
        idle.append(stream)
    with trio.fail_after(20):  # far below their 60 s: nothing waits for them to time out
        for _ in range(5):
            assert (await Server(fake, port).request("GET", "/v1/jobs"))[0] == 200
    for stream in idle:
        await stream.aclose()


async def test_an_event_index_beyond_any_integer_is_400(server):
    """Issue 17 D3: ``after`` beyond SQLite's integers was a 500 (OverflowError)."""
    for after in ("99999999999999999999", str(2**63)):
        status, body = await server.request("GET", f"/v1/jobs/aaaa0001/events?after={after}")
        assert (status, error_code(body)) == (400, "bad-request")
        assert "after" in body["error"]["message"]


async def test_the_openapi_document_describes_every_route(server):
    status, document = await server.request("GET", "/openapi.json")
    assert status == 200
    assert document["openapi"].startswith("3.")
    paths = document["paths"]
    assert set(paths) == {
        "/v1/node",
        "/v1/peers",
        "/v1/jobs",
        "/v1/jobs/{job_id}",
        "/v1/jobs/{job_id}/events",
        "/v1/jobs/{job_id}/why",
        "/v1/jobs/{job_id}/logs",
        "/v1/jobs/{job_id}/outputs",
        "/v1/jobs/{job_id}/cancel",
        "/v1/providers/{peer_id}/check-score",
        "/v1/offers",
        "/v1/market",
        "/v1/market/history",
        "/v1/market/trades",
        "/v1/ledger",
        "/metrics",
        "/v1/dashboard/link",
        "/v1/sold",
        "/v1/jobs/{job_id}/logs/live",
        "/v1/quotas/reload",
    }
    body = paths["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    request = document["components"]["schemas"][body["$ref"].rsplit("/", 1)[1]]
    assert {"image", "command", "max_prices"} <= set(request["required"])
    assert request["additionalProperties"] is False
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


def test_api_info_round_trip(tmp_path):
    home = tmp_path / "home"
    write_api_info(home, "http://127.0.0.1:4321", "s3cret")
    assert stat.S_IMODE((home / "api.token").stat().st_mode) == 0o600
    assert json.loads((home / "api.json").read_text()) == {
        "url": "http://127.0.0.1:4321",
        "token_file": str(home / "api.token"),
    }
    assert read_api_info(home) == ("http://127.0.0.1:4321", "s3cret")
    write_api_info(home, "http://127.0.0.1:4322", "n3w")
    assert read_api_info(home) == ("http://127.0.0.1:4322", "n3w")
    assert sorted(p.name for p in home.iterdir()) == ["api.json", "api.token"]
    clear_api_info(home)
    with pytest.raises(FileNotFoundError):
        read_api_info(home)


def test_a_complete_request_round_trips_through_json():
    full = {
        **SUBMIT,
        "env": {"A": "1"},
        "cpu_milli": 500,
        "memory_bytes": 1 << 28,
        "disk_bytes": 1 << 30,
        "gpus": 1,
        "elastic_memory_bytes": 1 << 30,
        "elastic_cpu_milli": 2000,
        "cpu_model": "EPYC",
        "cpu_flags": ["avx2", "avx512f"],
        "min_kernel": "6.1",
        "wall_ms": 60_000,
        "max_prices": {
            "cpu_core_hour": 1,
            "memory_gib_hour": 2,
            "disk_gib_hour": 3,
            "gpu_hour": 4,
        },
        "arch": "arm64",
        "regions": ["eu"],
        "trust": "sev-snp",
        "min_reputation": 250_000,
        "inputs": [
            {"path": "/in/a", "file": "/tmp/a"},
            {"path": "/in/b", "digest": DIGEST, "size": 7},
            {"path": "/in/c", "url": "s3://bucket/prefix/"},
        ],
        "preemptible": True,
        "checkpoint_path": "/ckpt",
        "name": "x",
        "output_to": "s3://bucket/out/",
        "credentials": {"s3": {"access_key": "AK", "secret_key": "SK"}},
        "data_region": "eu",
        "data_bytes": 50 << 30,
        "data_egress_gib": 90_000,
        "output_bytes": 1 << 30,
        "egress_budget": 2_000_000,
    }
    request = parse_request(json.dumps(full))
    assert request.inputs[1] == Input(path="/in/b", digest=DIGEST, size=7)
    assert json.loads(request.wire_json()) == full
    assert parse_request(request.wire_json()) == request
    # What is stored and shown never holds the credentials.
    stored = {k: v for k, v in full.items() if k != "credentials"}
    assert json.loads(request.to_json()) == stored
    assert "SK" not in repr(request)
    with pytest.raises(RequestError, match="env"):
        parse_request(json.dumps({**full, "env": {"A=B": "1"}}))


async def test_expect_100_continue_is_answered(server):
    body = json.dumps(SUBMIT).encode()
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    async with stream:
        await stream.send_all(
            f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n".encode()
        )
        received = bytearray()
        while b"\r\n\r\n" not in received:
            received += await stream.receive_some(65536)
        assert received.startswith(b"HTTP/1.1 100 ")
        await stream.send_all(body)
        while chunk := await stream.receive_some(65536):
            received += chunk
    assert b"HTTP/1.1 201 " in received


def _integers(node: object, where: str = "") -> list[tuple[str, dict]]:
    """Every integer schema in an OpenAPI document, with where it is."""
    found = []
    if isinstance(node, dict):
        if node.get("type") == "integer":
            found.append((where, node))
        for key, value in node.items():
            found += _integers(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _integers(value, f"{where}/{i}")
    return found


def test_every_integer_the_api_accepts_states_bounds_storage_can_hold():
    """Issue 17 D3's overflows, as a class: an integer parameter or field without bounds
    reached SQLite or the canonical encoding and failed there (500). Every integer the
    API accepts must say its range, within a signed 64-bit integer."""
    document = build_app(FakeController(), token=TOKEN).openapi()
    accepted = {
        "parameters": [
            p for path in document["paths"].values() for op in path.values()
            for p in op.get("parameters", [])
        ],
        "requests": {
            name: schema for name, schema in document["components"]["schemas"].items()
            if name in {"JobRequest", "MaxPrices", "Input", "OutputsRequest"}
        },
    }  # fmt: skip
    integers = _integers(accepted)
    assert integers, "the walk found no integers at all"
    for where, schema in integers:
        assert schema.get("minimum", -(2**64)) >= -(2**63), where
        assert "maximum" in schema, f"{where} has no maximum"
        assert schema["maximum"] <= 2**63 - 1, where
