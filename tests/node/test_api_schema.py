"""The control API fuzzed from its own OpenAPI document (Schemathesis), against a real node.

A real buyer node (``serve_peer`` on the in-memory network, SQLite, store) serves its real
control API (``serve_control``: FastAPI on hypercorn) in a thread of its own; Schemathesis
reads ``/openapi.json`` and sends every operation requests generated from it, valid and
invalid. Every answer must be no server error, carry a status the document lists, and
match its documented schema. This is the class of defect issue 17 D3 found by hand
(500s for overflowing integers, lone surrogates, odd destinations), made unable to recur.
"""

from __future__ import annotations

import http.client
import queue
import shutil
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import schemathesis
import trio
from executor_support import searchable_dir
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from node.api.common import read_api_info
from node.api.controller import serve_control
from node.market.request import build_request
from node.net.memnet import MemoryHub, serve_memory_network
from node.peer import serve_peer
from node.storage.home import NodeConfig, init_home

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def node_api(image_layout: Path) -> Iterator[tuple[str, str, str]]:
    """(URL, token, id of a job waiting for an offer) of a running node's control API."""
    root = searchable_dir("cx-api-schema-")
    home = init_home(root / "node", NodeConfig())
    Ready = tuple[str, str, trio.lowlevel.TrioToken, trio.CancelScope]
    ready: queue.Queue[Ready] = queue.Queue()

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            net = await nursery.start(serve_memory_network, MemoryHub(), home.key().peer_id)
            peer = await nursery.start(partial(serve_peer, home, network=net))
            url = await nursery.start(serve_control, peer)
            request = build_request(
                image=str(image_layout), command=("true",), max_prices={"cpu_core_hour": 1}
            )
            job = await peer.submit(request)
            ready.put((url, job.id, trio.lowlevel.current_trio_token(), nursery.cancel_scope))

    thread = threading.Thread(target=trio.run, args=(serve,), daemon=True)
    thread.start()
    url, job_id, token, scope = ready.get(timeout=60)
    try:
        yield url, read_api_info(home.root)[1], job_id
    finally:
        trio.from_thread.run_sync(scope.cancel, trio_token=token)
        thread.join(30)
        shutil.rmtree(root, ignore_errors=True)


OPERATIONS = [
    ("GET", "/v1/node"),
    ("GET", "/v1/peers"),
    ("POST", "/v1/jobs"),
    ("GET", "/v1/jobs"),
    ("GET", "/v1/jobs/{job_id}"),
    ("GET", "/v1/jobs/{job_id}/events"),
    ("GET", "/v1/jobs/{job_id}/why"),
    ("GET", "/v1/jobs/{job_id}/logs"),
    ("POST", "/v1/jobs/{job_id}/outputs"),
    ("POST", "/v1/jobs/{job_id}/cancel"),
    ("POST", "/v1/providers/{peer_id}/check-score"),
    ("GET", "/v1/offers"),
    ("GET", "/v1/market"),
    ("GET", "/v1/market/history"),
    ("GET", "/v1/market/trades"),
    ("GET", "/v1/ledger"),
    ("GET", "/metrics"),
    ("POST", "/v1/dashboard/link"),
    ("GET", "/v1/sold"),
    ("GET", "/v1/jobs/{job_id}/logs/live"),
    ("POST", "/v1/quotas/reload"),
]


@pytest.fixture(scope="module")
def api_schema(node_api: tuple[str, str, str]) -> schemathesis.BaseSchema:
    url, token, _ = node_api
    return schemathesis.openapi.from_url(
        f"{url}/openapi.json", headers={"Authorization": f"Bearer {token}"}
    )


def test_the_document_lists_exactly_the_operations_fuzzed(api_schema) -> None:
    found = {(op.ok().method.upper(), op.ok().path) for op in api_schema.get_all_operations()}
    assert found == set(OPERATIONS)


# Each operation with any job id; those of one job also with the id of a real job.
CASES = [(m, p, False) for m, p in OPERATIONS] + [(m, p, True) for m, p in OPERATIONS if "{" in p]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize(
    ("method", "path", "known_job"),
    CASES,
    ids=[f"{m}-{p}-{'real-job' if known else 'any-id'}" for m, p, known in CASES],
)
def test_every_answer_is_documented_and_none_is_a_server_error(
    api_schema,
    node_api: tuple[str, str, str],
    method: str,
    path: str,
    mode: GenerationMode,
    known_job: bool,
) -> None:
    """Valid requests (positive) and requests that break the schema (negative); for the
    routes of one job, with any id and with the id of a real job, so the requests reach the
    node's own code rather than stop at "unknown job"."""
    _, token, job_id = node_api
    operation = api_schema.find_operation_by_path(method.lower(), path)
    ids = {"job_id": job_id} if known_job else None
    # A real job's events would be long-polled for up to a minute each: ask without waiting
    # (the wait itself is tested in test_api.py). Any id too: a generated one may be a
    # prefix of the real job's id, which names that job.
    query = {"wait": 0} if path.endswith("/events") else None

    @given(case=operation.as_strategy(mode, path_parameters=ids, query=query))
    @settings(
        max_examples=25,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case: schemathesis.Case) -> None:
        case.call_and_validate(
            headers={"Authorization": f"Bearer {token}"},
            checks=[
                not_a_server_error,
                status_code_conformance,
                content_type_conformance,
                response_schema_conformance,
            ],
        )

    fuzz()


def test_the_document_is_served_only_with_the_token(node_api: tuple[str, str, str]) -> None:
    url, _, _ = node_api
    where = urlsplit(url)
    conn = http.client.HTTPConnection(where.hostname or "", where.port)
    conn.request("GET", "/openapi.json")
    assert conn.getresponse().status == 401
    conn.close()
