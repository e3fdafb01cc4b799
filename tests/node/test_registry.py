"""Pulling images from a real OCI registry on loopback (docker-registry + skopeo)."""

from __future__ import annotations

import hashlib
import json
import shutil

import httpx
import pytest
import trio
from executor_support import searchable_dir
from process_support import free_port
from registry_support import (
    TokenServer,
    multi_arch_layout,
    running_registry,
    running_token_server,
)

from node.cli import main
from node.storage.fetching import FetchReason
from node.storage.image import RootfsCache, build_rootfs, image_config, list_images
from node.storage.registry import (
    Login,
    RegistryError,
    looks_like_registry_ref,
    parse_ref,
    pull_image,
)
from node.storage.store import BlobStore

pytestmark = pytest.mark.integration

CREDS = ("buyer", "s3cret-pass")


@pytest.fixture(scope="module")
def busybox(tmp_path_factory):
    layout = tmp_path_factory.mktemp("layout")
    return layout, build_rootfs(layout)


@pytest.fixture(scope="module")
def public(tmp_path_factory, busybox):
    with running_registry(tmp_path_factory.mktemp("public")) as reg:
        reg.push(busybox[0], "tools/busybox")
        yield reg


@pytest.fixture
def store(tmp_path):
    return BlobStore(tmp_path / "store")


async def test_pull_verifies_stores_and_pins_the_image(public, busybox, store):
    ref = parse_ref(public.ref("tools/busybox", busybox[1]))
    image = await pull_image(store, ref)
    assert image.manifest == busybox[1]
    assert image.names == (str(ref),)
    for digest in (image.manifest, image.config, *image.layers):
        store.verify(digest)
    assert f"image/{busybox[1][7:]}" in store.refs()
    assert image_config(store, image.manifest)["Cmd"] == ["/bin/sh"]
    assert [i.manifest for i in list_images(store)] == [busybox[1]]
    rootfs = await _unpack(store, image.manifest)
    assert (rootfs / "bin" / "busybox").is_file()


async def _unpack(store, digest):
    return await trio.to_thread.run_sync(RootfsCache(store).unpack, digest)


async def test_a_pulled_image_is_served_from_the_store_without_the_registry(tmp_path, busybox):
    store = BlobStore(tmp_path / "store")
    with running_registry(tmp_path / "reg") as reg:
        reg.push(busybox[0], "busybox")
        ref = parse_ref(reg.ref("busybox", busybox[1]))
        await pull_image(store, ref)
    # The registry is gone: a second pull must not need it.
    again = await pull_image(store, ref)
    assert again.manifest == busybox[1]


async def test_unknown_digest_is_not_found_and_the_buyers_fault(public, store):
    missing = "sha256:" + hashlib.sha256(b"nothing").hexdigest()
    with pytest.raises(RegistryError) as info:
        await pull_image(store, parse_ref(public.ref("tools/busybox", missing)))
    assert info.value.reason is FetchReason.NOT_FOUND
    assert info.value.buyer_fault


async def test_unreachable_registry_is_not_the_buyers_fault(store, busybox):
    ref = parse_ref(f"127.0.0.1:{free_port()}/busybox@{busybox[1]}")
    with pytest.raises(RegistryError) as info:
        await pull_image(store, ref)
    assert info.value.reason is FetchReason.UNREACHABLE
    assert not info.value.buyer_fault


async def test_htpasswd_registry_needs_the_login(tmp_path, busybox, store):
    with running_registry(tmp_path / "private", creds=CREDS) as reg:
        reg.push(busybox[0], "private/busybox")
        ref = parse_ref(reg.ref("private/busybox", busybox[1]))
        with pytest.raises(RegistryError) as info:
            await pull_image(store, ref)
        assert info.value.reason is FetchReason.DENIED
        assert "CX_REGISTRY_USERNAME" in str(info.value)
        wrong = Login(username=CREDS[0], password="not-it")
        with pytest.raises(RegistryError) as info:
            await pull_image(store, ref, login=wrong)
        assert info.value.reason is FetchReason.DENIED
        assert "not-it" not in str(info.value)
        assert "not-it" not in repr(wrong)
        image = await pull_image(store, ref, login=Login(username=CREDS[0], password=CREDS[1]))
        assert image.manifest == busybox[1]


async def test_multi_arch_index_resolves_to_the_asked_architecture(tmp_path, store):
    layout = tmp_path / "multi"
    index, manifests = multi_arch_layout(layout)
    with running_registry(tmp_path / "reg") as reg:
        reg.push(layout, "multi", all_=True)
        ref = parse_ref(reg.ref("multi", index))
        amd = await pull_image(store, ref, arch="amd64")
        arm = await pull_image(store, ref, arch="arm64")
        with pytest.raises(RegistryError) as info:
            await pull_image(store, ref, arch="riscv64")
    assert (amd.manifest, arm.manifest) == (manifests["amd64"], manifests["arm64"])
    assert info.value.reason is FetchReason.NO_PLATFORM
    assert index in store.refs()[f"image/{amd.manifest[7:]}"]  # the index stays with it


async def test_content_that_does_not_match_its_digest_is_refused(public, busybox, store):
    """A registry (or a man in the middle) serving other bytes under the digest."""
    ref = parse_ref(public.ref("tools/busybox", busybox[1]))

    async def tamper(request: httpx.Request) -> httpx.Response:
        async with httpx.AsyncClient() as real:
            resp = await real.get(str(request.url), headers=dict(request.headers))
        body = resp.content
        if "/blobs/" in request.url.path:
            body = body[:-1] + bytes([body[-1] ^ 1])
        return httpx.Response(resp.status_code, headers=resp.headers, content=body)

    async with httpx.AsyncClient(transport=httpx.MockTransport(tamper)) as client:
        with pytest.raises(RegistryError) as info:
            await pull_image(store, ref, client=client)
    assert info.value.reason is FetchReason.DIGEST_MISMATCH
    assert info.value.buyer_fault
    assert list(store.digests()) == []  # nothing unverified was kept


def test_references_must_be_pinned_by_digest():
    digest = "sha256:" + "ab" * 32
    ref = parse_ref(f"registry.example:5000/team/app:v1@{digest}")
    assert (ref.host, ref.repository, ref.digest) == ("registry.example:5000", "team/app", digest)
    assert str(ref) == f"registry.example:5000/team/app@{digest}"
    with pytest.raises(RegistryError, match="names no digest: pin the image"):
        parse_ref("127.0.0.1:5000/busybox:latest")
    for bad in ("busybox", "127.0.0.1:5000/Upper@" + digest, "host/repo@sha256:abc"):
        with pytest.raises(RegistryError) as info:
            parse_ref(bad)
        assert info.value.reason is FetchReason.BAD_REFERENCE
    assert looks_like_registry_ref("127.0.0.1:5000/busybox@" + digest)
    assert looks_like_registry_ref("localhost/x")
    assert not looks_like_registry_ref("busybox")
    assert not looks_like_registry_ref("./layout/dir")
    assert not looks_like_registry_ref(digest)


def test_manifest_json_shape_of_a_pushed_layout(busybox):
    manifest = json.loads((busybox[0] / "blobs" / "sha256" / busybox[1][7:]).read_bytes())
    assert manifest["layers"]  # the fixture image is a real one


def test_cx_exec_runs_an_image_from_a_private_registry(tmp_path, busybox, capsys, monkeypatch):
    home = searchable_dir("cx-registry-")
    with running_registry(tmp_path / "reg", creds=CREDS) as reg:
        reg.push(busybox[0], "busybox")
        ref = reg.ref("busybox", busybox[1])
        h = ["--home", str(home)]
        assert main(["exec", *h, ref, "--", "echo", "hi"]) == 2
        assert "CX_REGISTRY_USERNAME" in capsys.readouterr().err
        monkeypatch.setenv("CX_REGISTRY_USERNAME", CREDS[0])
        monkeypatch.setenv("CX_REGISTRY_PASSWORD", CREDS[1])
        code = main(["exec", *h, "--timeout", "20s", ref, "--", "echo", "hi from the registry"])
        out = capsys.readouterr()
        assert code == 0, out.err
        assert "hi from the registry" in out.out
        assert main(["exec", *h, f"{reg.host}/busybox:latest", "--", "true"]) == 2
        assert "pin the image" in capsys.readouterr().err
    shutil.rmtree(home, ignore_errors=True)


async def test_token_auth_registry_gets_a_bearer_token_for_the_login(tmp_path, busybox, store):
    """Registries such as Docker Hub answer 401 with a Bearer challenge: the client asks the
    challenge's token service, with the login, for a token for the repository's scope."""
    tokens = TokenServer(tmp_path, CREDS)
    with running_token_server(tokens) as port:
        auth = tokens.auth_config(port)
        with running_registry(tmp_path / "reg", auth=auth, creds_for_push=CREDS) as reg:
            reg.push(busybox[0], "team/busybox")
            ref = parse_ref(reg.ref("team/busybox", busybox[1]))
            with pytest.raises(RegistryError) as info:
                await pull_image(store, ref)
            assert info.value.reason is FetchReason.DENIED
            issued = tokens.tokens_issued
            image = await pull_image(store, ref, login=Login(username=CREDS[0], password=CREDS[1]))
            assert image.manifest == busybox[1]
            assert tokens.tokens_issued == issued + 1  # one token, kept for every blob
