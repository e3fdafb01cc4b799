"""Jobs whose data lives outside the buyer: the image in a private registry (docker-registry
on loopback), inputs in and outputs to an S3 prefix (moto's server, signatures and IAM
policies on), the registry login and S3 keys sealed to the provider after the agreement.
Whole nodes over memnet with real containers (tests/node/market_support.py)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import pytest
import trio
from executor_support import searchable_dir
from market_support import (
    MEM_PRICE,
    PRICE,
    Cluster,
    MiB,
    Node,
    cluster,
    events,
    finished,
    market,
    state,
    until,
)
from registry_support import running_registry
from s3_support import running_s3

from node.api import views
from node.api.controller import serve_control
from node.cli import main
from node.market.request import RequestError, build_request
from node.storage.home import Home, NodeConfig, ProviderConfig, S3Config, init_home
from node.storage.image import build_rootfs
from protocol.messages import Arch, Prices, Resources

pytestmark = pytest.mark.integration

LOGIN = ("buyer", "registry-pass-7f3a")
INPUT = b"alpha\nbeta\n"
BUCKET = "arn:aws:s3:::data"
INPUT_URL = "s3://data/in/words.txt"


@pytest.fixture(scope="module")
def pushed():
    """A busybox layout and its digest, pushed to the registry below."""
    root = searchable_dir("cx-data-image-")
    digest = build_rootfs(root / "layout")
    return root / "layout", digest


@pytest.fixture(scope="module")
def registry(pushed, tmp_path_factory):
    with running_registry(tmp_path_factory.mktemp("registry"), creds=LOGIN) as reg:
        reg.push(pushed[0], "team/busybox")
        yield reg


@pytest.fixture(scope="module")
def s3():
    with running_s3() as server:
        server.client().create_bucket(Bucket="data")
        server.client().put_object(Bucket="data", Key="in/words.txt", Body=INPUT)
        keys = server.keys_for(
            "job",
            [
                {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": BUCKET},
                {"Effect": "Allow", "Action": "s3:GetObject", "Resource": f"{BUCKET}/in/*"},
                {"Effect": "Allow", "Action": "s3:PutObject", "Resource": f"{BUCKET}/out/*"},
            ],
        )
        yield server, keys


def provider_home(c: Cluster, name: str, s3: S3Config) -> Home:
    provider = ProviderConfig(
        capacity=Resources(cpu_milli=2000, memory_bytes=1024 * MiB, disk_bytes=1024 * MiB),
        prices=Prices(cpu_core_hour=PRICE, memory_gib_hour=MEM_PRICE),
        arch=Arch.AMD64,
    )
    return init_home(c.root / name, NodeConfig(provider=provider, s3=s3))


async def provider_and_buyer(c: Cluster, s3: S3Config) -> tuple[Node, Node]:
    """A provider and a buyer whose config.toml name the S3 endpoint; the buyer sees the
    provider's offer."""
    provider = await c.start(provider_home(c, "provider", s3))
    buyer = await c.start(init_home(c.root / "buyer", NodeConfig(s3=s3)))
    await buyer.peer.join(provider.addr)
    await until(lambda: market(buyer)["offers"] == 1, buyer)
    return provider, buyer


async def submit(buyer: Node, image: str, command: tuple[str, ...], **fields: Any) -> str:
    request = build_request(
        image=image,
        command=command,
        max_prices={"cpu_core_hour": 100_000_000, "memory_gib_hour": 10_000_000},
        cpu_milli=500,
        memory_bytes=64 * MiB,
        wall_ms=60_000,
        **fields,
    )
    return str(views.job(await buyer.peer.submit(request))["id"])


def _credentials(keys: Any) -> dict[str, Any]:
    return {
        "registry": {"username": LOGIN[0], "password": LOGIN[1]},
        "s3": {"access_key": keys.access_key, "secret_key": keys.secret_key},
    }


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _holds(root: Path, secret: str) -> list[Path]:
    """Files under ``root`` whose bytes contain ``secret``."""
    found = []
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            try:
                if secret.encode() in p.read_bytes():
                    found.append(p)
            except OSError:
                continue
    return found


async def test_registry_image_s3_input_and_output_prefix_with_sealed_secrets(
    image_layout, pushed, registry, s3
):
    server, keys = s3
    async with cluster(image_layout) as c:
        provider, buyer = await provider_and_buyer(c, server.config)
        job_id = await submit(
            buyer,
            registry.ref("team/busybox", pushed[1]),
            ("sh", "-c", "tr a-z A-Z < /in/words.txt > /out/upper.txt"),
            inputs=[{"path": "/in/words.txt", "url": INPUT_URL}],
            output_to="s3://data/out/run1/",
            credentials=_credentials(keys),
        )
        done = await finished(buyer, job_id)
        assert done["state"] == "succeeded", "\n".join(events(buyer, job_id))

        upper = b"ALPHA\nBETA\n"
        (output,) = done["outputs"]
        assert output == {
            "path": "/out/upper.txt",
            "digest": _digest(upper),
            "size": len(upper),
            "url": "s3://data/out/run1/upper.txt",
        }
        got = server.client().get_object(Bucket="data", Key="out/run1/upper.txt")["Body"].read()
        assert got == upper
        # The buyer took the output from the prefix, not from the provider.
        assert not (buyer.home.store_root / "blobs" / "sha256" / _digest(upper)[7:]).exists()
        await until(lambda: provider.peer.ledger(), provider)
        for home in (buyer.home.root, provider.home.root):
            assert _holds(home, LOGIN[1]) == []
            assert _holds(home, keys.secret_key) == []


async def test_content_that_is_not_what_the_job_named_fails_it_as_the_buyers_fault(
    image_layout, pushed, registry, s3
):
    server, keys = s3
    async with cluster(image_layout) as c:
        _, buyer = await provider_and_buyer(c, server.config)
        wrong = {"path": "/in/words.txt", "url": INPUT_URL, "digest": _digest(b"x"), "size": 11}
        job_id = await submit(
            buyer,
            registry.ref("team/busybox", pushed[1]),
            ("true",),
            inputs=[wrong],
            credentials=_credentials(keys),
        )
        await finished(buyer, job_id)
        done = await state(buyer, job_id, "settled")
        assert done["state"] == "failed", "\n".join(events(buyer, job_id))
        assert done["exit_reason"] == "bad-input"
        assert done["attempts"] == 1  # the buyer's fault: not bid for again
        assert f"{INPUT_URL} is sha256:" in "\n".join(events(buyer, job_id))


# -- as a user types it: cx run against a running buyer node ---------------------------------


async def test_cx_run_pulls_a_registry_image_and_reads_and_writes_s3(
    image_layout, pushed, registry, s3, monkeypatch, capsys, tmp_path
):
    """The observable contract: `cx run HOST:PORT/REPO@sha256:...` runs the image on the
    provider; `cx run --input s3://bucket/prefix/ --output-to s3://bucket/out/` reads every
    object under the prefix and leaves the outputs under the other."""
    server, keys = s3
    server.client().put_object(Bucket="data", Key="in/more/lines.txt", Body=b"gamma\n")
    monkeypatch.setenv("CX_REGISTRY_USERNAME", LOGIN[0])
    monkeypatch.setenv("CX_REGISTRY_PASSWORD", LOGIN[1])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", keys.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", keys.secret_key)
    ref = registry.ref("team/busybox", pushed[1])

    async def cx(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        home = ["--home", str(buyer.home.root), "--wait-match", "30s"]  # never hang the test
        code = await trio.to_thread.run_sync(main, ["run", *home, *argv])
        out, err = capsys.readouterr()
        return code, out, err

    async with cluster(image_layout) as c:
        provider, buyer = await provider_and_buyer(c, server.config)
        await c.nursery.start(serve_control, buyer.peer)

        code, out, err = await cx("--max-price", "100", "--timeout", "1m", ref, "--", "echo", "hi")
        assert code == 0, err
        assert out == "hi\n"

        code, out, err = await cx(
            "--max-price", "100", "--timeout", "1m", "--input", "s3://data/in/:/in",
            "--output-to", "s3://data/out/run2/", "--output", str(tmp_path / "got"),
            ref, "--", "sh", "-c", "cat /in/words.txt /in/more/lines.txt > /out/all.txt",
        )  # fmt: skip
        assert code == 0, err
        assert "1 output(s) uploaded under s3://data/out/run2/" in err
        got = server.client().get_object(Bucket="data", Key="out/run2/all.txt")["Body"].read()
        assert got == INPUT + b"gamma\n"
        for home in (buyer.home.root, provider.home.root):
            assert _holds(home, LOGIN[1]) == []
            assert _holds(home, keys.secret_key) == []

        code, _, err = await cx(
            "--max-price", "100", f"{registry.host}/team/busybox:latest", "true"
        )
        assert code == 125
        assert "pin the image" in err


async def test_the_node_reads_no_address_a_request_names_but_its_own_s3_endpoint(image_layout):
    """A web URL must come pinned (cx run hashes it on the user's machine); an s3:// input
    needs the node's [s3] endpoint. Either way nothing is fetched from the address given."""
    async with cluster(image_layout) as c:
        buyer = await c.start(init_home(c.root / "buyer", NodeConfig()))
        for url, said in (
            ("http://127.0.0.1:9/data.csv", "give its digest and size"),
            ("s3://data/in/words.txt", "set [s3] endpoint in config.toml"),
        ):
            request = build_request(
                image="sha256:" + "ab" * 32,
                command=("true",),
                max_prices={"cpu_core_hour": 1},
                inputs=[{"path": "/in/x", "url": url}],
            )
            with pytest.raises(RequestError, match=re.escape(said)):
                await buyer.peer.submit(request)
        assert buyer.peer.jobs() == []
