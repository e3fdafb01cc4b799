"""The dashboard's rules over real loopback sockets, with a fake Controller: who may see
what (token, session cookie, public pages), one-time links, and the live stream."""

from __future__ import annotations

from functools import partial

import pytest
import trio
from api_support import TOKEN, FakeController
from test_api import Server

from node.api.server import serve_api
from node.api.sessions import LINK_TTL_S, Sessions, cookie_name


@pytest.fixture
async def server(nursery):
    fake = FakeController()
    fake.add_job("aaaa0001", name="first")
    port = await nursery.start(partial(serve_api, fake, token=TOKEN, read_timeout_s=2.0))
    return Server(fake, port)


async def get(server: Server, target: str, *headers: str, method: str = "GET", body: str = ""):
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1", *headers]
    if body:
        lines += ["Content-Type: application/x-www-form-urlencoded", f"Content-Length: {len(body)}"]
    return await server.raw(("\r\n".join(lines) + "\r\n\r\n" + body).encode())


async def session_cookie(server: Server) -> str:
    status, headers, _ = await get(server, "/dashboard/login", method="POST", body=f"token={TOKEN}")
    assert status == 303
    assert headers["location"] == "/dashboard"
    cookie = headers["set-cookie"]
    assert cookie.startswith(cookie_name(server.port) + "=")
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie
    return cookie.split(";")[0]


async def test_the_page_sends_a_stranger_to_the_login_and_the_assets_are_public(server) -> None:
    status, headers, _ = await get(server, "/dashboard")
    assert (status, headers["location"]) == (303, "/dashboard/login")
    status, headers, _ = await get(server, "/dashboard/api")
    assert (status, headers["location"]) == (303, "/dashboard/login")
    status, headers, body = await get(server, "/dashboard/login")
    assert status == 200
    assert b'name="token"' in body
    assert "default-src 'self'" in headers["content-security-policy"]
    status, headers, _ = await get(server, "/dashboard/static/dashboard.js")
    assert (status, headers["content-type"]) == (200, "text/javascript; charset=utf-8")
    assert (await get(server, "/dashboard/static/..%2Fserver.py"))[0] == 404
    # Nothing else is public.
    for target in ("/v1/jobs", "/v1/stream", "/metrics", "/openapi.json"):
        assert (await get(server, target))[0] == 401, target


async def test_a_wrong_token_gets_no_session(server) -> None:
    status, headers, body = await get(server, "/dashboard/login", method="POST", body="token=nope")
    assert status == 401
    assert "set-cookie" not in headers
    assert b"not this node&#x27;s token" in body or b"not this node's token" in body


async def test_a_session_may_read_but_not_act(server) -> None:
    cookie = f"Cookie: {await session_cookie(server)}"
    assert (await get(server, "/dashboard", cookie))[0] == 200
    assert (await get(server, "/v1/jobs", cookie))[0] == 200
    assert (await get(server, "/v1/jobs/aaaa0001/cancel", cookie, method="POST"))[0] == 401
    assert (await get(server, "/v1/dashboard/link", cookie, method="POST"))[0] == 401
    assert server.fake.views["aaaa0001"]["state"] == "waiting"
    # Another node's cookie (another port) or a made-up one is no session here.
    other = cookie.replace(cookie_name(server.port), cookie_name(server.port + 1))
    assert (await get(server, "/v1/jobs", other))[0] == 401
    assert (await get(server, "/v1/jobs", f"Cookie: {cookie_name(server.port)}=guess"))[0] == 401


async def test_a_one_time_link_logs_in_once(server) -> None:
    status, link = await server.request("POST", "/v1/dashboard/link")
    assert status == 200
    assert isinstance(link, dict)
    assert link["expires_s"] == LINK_TTL_S
    target = link["url"].split(str(server.port), 1)[1]
    status, headers, _ = await get(server, target)
    assert status == 303
    assert headers["set-cookie"].startswith(cookie_name(server.port))
    status, headers, body = await get(server, target)
    assert status == 401
    assert b"used already" in body


def test_links_expire_and_old_sessions_make_room() -> None:
    now = [100.0]
    sessions = Sessions(now=lambda: now[0])
    code = sessions.link_code()
    now[0] += LINK_TTL_S + 1
    assert sessions.redeem(code) is None
    first = sessions.open()
    for _ in range(300):
        sessions.open()
    assert not sessions.valid(f"{cookie_name(1)}={first}".encode(), 1)  # the oldest went


async def test_the_stream_sends_a_snapshot_at_each_change_and_ends_before_the_timeout(
    server,
) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    request = f"GET /v1/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
    received = bytearray()
    async with stream:
        await stream.send_all(request.encode())
        with trio.fail_after(10):
            while received.count(b"data: {") < 1:
                received += await stream.receive_some(65536)
            server.fake.advance("aaaa0001", "running")
            while received.count(b"data: {") < 2:
                received += await stream.receive_some(65536)
            while chunk := await stream.receive_some(65536):  # the server ends it
                received += chunk
    text = bytes(received).decode()
    assert "text/event-stream" in text
    assert '"state":"waiting"' in text.split("data: {", 2)[1]
    assert '"state":"running"' in text.split("data: {", 2)[2]
    assert "event: bye" in text
