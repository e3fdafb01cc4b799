"""Inputs from and outputs to object stores, against a real S3-compatible server (moto's, on
loopback, checking signatures and IAM policies) and a plain HTTP server."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from process_support import serving_directory
from s3_support import running_s3

from node.storage.fetching import FetchReason
from node.storage.objects import (
    ObjectError,
    S3Keys,
    fetch_object,
    hash_object,
    list_prefix,
    parse_url,
    put_object,
    sigv4_headers,
)
from node.storage.store import BlobStore

pytestmark = pytest.mark.integration


def _now():
    return datetime.now(UTC)


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def s3():
    with running_s3() as server:
        admin = server.client()
        admin.create_bucket(Bucket="data")
        for key, body in {
            "in/a.txt": b"alpha\n",
            "in/sub/b.txt": b"beta\n",
            "in/c.bin": bytes(range(256)) * 4096,
            "elsewhere/x": b"not under the prefix",
        }.items():
            admin.put_object(Bucket="data", Key=key, Body=body)
        yield server


@pytest.fixture
def store(tmp_path):
    return BlobStore(tmp_path / "store")


async def test_list_a_prefix_with_keys_for_it(s3):
    keys = s3.keys_for(
        "lister",
        [{"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::data"}],
    )
    listed = await list_prefix("s3://data/in/", s3=s3.config, keys=keys, now=_now())
    assert listed == [("a.txt", 6), ("c.bin", 256 * 4096), ("sub/b.txt", 5)]


async def test_fetch_verifies_the_digest_and_refuses_other_content(s3, store):
    keys = s3.admin
    body = bytes(range(256)) * 4096
    url = "s3://data/in/c.bin"
    await fetch_object(
        store, url, digest=_digest(body), size=len(body), s3=s3.config, keys=keys, now=_now()
    )
    assert store.read_bytes(_digest(body)) == body
    wrong = _digest(b"something else")
    with pytest.raises(ObjectError) as info:
        await fetch_object(
            store, url, digest=wrong, size=len(body), s3=s3.config, keys=keys, now=_now()
        )
    assert info.value.reason is FetchReason.DIGEST_MISMATCH
    assert info.value.buyer_fault
    with pytest.raises(ObjectError) as info:
        await fetch_object(
            store, "s3://data/in/a.txt", digest=wrong, size=2, s3=s3.config, keys=keys, now=_now()
        )
    assert info.value.reason is FetchReason.DIGEST_MISMATCH  # longer than named: cut off
    assert not store.has(wrong)
    assert sorted(store.digests()) == [_digest(body)]


async def test_missing_objects_and_bad_keys_are_the_buyers_fault(s3, store):
    digest = _digest(b"x")
    with pytest.raises(ObjectError) as info:
        await fetch_object(
            store, "s3://data/in/none", digest=digest, size=1, s3=s3.config, keys=s3.admin,
            now=_now(),
        )  # fmt: skip
    assert info.value.reason is FetchReason.NOT_FOUND
    forged = S3Keys(access_key=s3.admin.access_key, secret_key="not-the-secret")
    with pytest.raises(ObjectError) as info:
        await fetch_object(
            store, "s3://data/in/a.txt", digest=digest, size=1, s3=s3.config, keys=forged,
            now=_now(),
        )  # fmt: skip
    assert info.value.reason is FetchReason.DENIED
    assert info.value.buyer_fault
    assert "not-the-secret" not in str(info.value)
    assert "not-the-secret" not in repr(forged)


async def test_upload_is_allowed_only_under_the_keys_prefix(s3, store):
    keys = s3.keys_for(
        "writer",
        [{"Effect": "Allow", "Action": "s3:PutObject", "Resource": "arn:aws:s3:::data/run1/*"}],
    )
    digest = store.put_bytes(b"result\n")
    await put_object(store, digest, "s3://data/run1/out.txt", s3=s3.config, keys=keys, now=_now())
    got = s3.client().get_object(Bucket="data", Key="run1/out.txt")["Body"].read()
    assert got == b"result\n"
    with pytest.raises(ObjectError) as info:
        await put_object(
            store, digest, "s3://data/other/out.txt", s3=s3.config, keys=keys, now=_now()
        )
    assert info.value.reason is FetchReason.DENIED


async def test_a_node_without_an_s3_endpoint_says_how_to_set_one(store):
    with pytest.raises(ObjectError, match=r"set \[s3\] endpoint in config.toml"):
        await hash_object("s3://data/in/a.txt", now=_now())


async def test_https_and_http_urls(tmp_path, store):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "data.csv").write_bytes(b"a,b\n1,2\n")

    with serving_directory(tmp_path / "site") as base:
        url = f"{base}/data.csv"
        digest, size = await hash_object(url, now=_now())
        assert (digest, size) == (_digest(b"a,b\n1,2\n"), 8)
        await fetch_object(store, url, digest=digest, size=size, now=_now())
        assert store.read_bytes(digest) == b"a,b\n1,2\n"
        with pytest.raises(ObjectError) as info:
            await fetch_object(store, url + ".gone", digest=_digest(b""), size=0, now=_now())
        assert info.value.reason is FetchReason.NOT_FOUND


def test_urls_are_parsed_strictly():
    prefix = parse_url("s3://data/in/")
    assert (prefix.bucket, prefix.key, prefix.is_prefix) == ("data", "in/", True)
    assert parse_url("s3://data/in/a.txt").is_prefix is False
    assert prefix.child("sub/b.txt").key == "in/sub/b.txt"
    for bad in ("ftp://x/y", "s3:///key", "/local/file", "s3://data/../etc"):
        with pytest.raises(ObjectError) as info:
            parse_url(bad)
        assert info.value.reason is FetchReason.BAD_REFERENCE


@pytest.mark.parametrize(
    ("method", "url", "body"),
    [
        ("GET", "http://127.0.0.1:9000/data/in/a%20b.txt", b""),
        ("GET", "https://s3.eu-west-1.amazonaws.com/data?list-type=2&prefix=in%2F", b""),
        ("PUT", "http://127.0.0.1:9000/data/run1/out.txt", b"result\n"),
    ],
)
def test_sigv4_matches_botocore(method, url, body):
    """Our signer against the reference implementation, byte for byte."""
    keys = S3Keys(access_key="AKIDEXAMPLE", secret_key="wJalrXUtnFEMI/K7MDENG", session_token="tok")
    now = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)
    payload = hashlib.sha256(body).hexdigest()
    ours = sigv4_headers(
        method, url, keys=keys, region="eu-west-1", payload_sha256=payload, now=now
    )
    request = AWSRequest(method=method, url=url, data=body)
    request.context["timestamp"] = now.strftime("%Y%m%dT%H%M%SZ")  # add_auth reads the clock
    creds = Credentials(keys.access_key, keys.secret_key, keys.session_token)
    signer = S3SigV4Auth(creds, "s3", "eu-west-1")
    signer._modify_request_before_signing(request)
    canonical = signer.canonical_request(request)
    signature = signer.signature(signer.string_to_sign(request, canonical), request)
    assert ours["Authorization"].endswith(f"Signature={signature}")
