"""A real S3-compatible server on loopback for the tests: moto's standalone server, with
signature checking and IAM policies on (``INITIAL_NO_AUTH_ACTION_COUNT``), so a request
signed with the wrong key, or outside the prefix its keys allow, is refused as AWS would.

The first three calls (an admin user, its policy, its key) go unauthenticated; everything
after is signed, by the admin's keys (boto3, the reference client) or by keys the test
makes for one prefix.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
from process_support import free_port, wait_for_log

from node.storage.home import S3Config
from node.storage.objects import S3Keys

REGION = "us-east-1"
_UNAUTHENTICATED_SETUP_CALLS = 3


@dataclass(frozen=True, slots=True)
class S3Server:
    config: S3Config
    admin: S3Keys

    def client(self, service: str = "s3", keys: S3Keys | None = None) -> Any:
        keys = keys or self.admin
        return boto3.client(
            service,
            endpoint_url=self.config.endpoint,
            region_name=REGION,
            aws_access_key_id=keys.access_key,
            aws_secret_access_key=keys.secret_key,
        )

    def keys_for(self, user: str, statements: list[dict[str, Any]]) -> S3Keys:
        """A new IAM user allowed exactly ``statements``; its keys."""
        iam = self.client("iam")
        iam.create_user(UserName=user)
        policy = {"Version": "2012-10-17", "Statement": statements}
        iam.put_user_policy(UserName=user, PolicyName="only", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName=user)["AccessKey"]
        return S3Keys(access_key=key["AccessKeyId"], secret_key=key["SecretAccessKey"])


@contextlib.contextmanager
def running_s3() -> Iterator[S3Server]:
    port = free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(_UNAUTHENTICATED_SETUP_CALLS)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        wait_for_log(proc, f"Running on http://127.0.0.1:{port}")
        endpoint = f"http://127.0.0.1:{port}"
        iam = boto3.client(
            "iam",
            endpoint_url=endpoint,
            region_name=REGION,
            aws_access_key_id="setup",
            aws_secret_access_key="setup",
        )
        iam.create_user(UserName="admin")
        everything = {"Effect": "Allow", "Action": "*", "Resource": "*"}
        iam.put_user_policy(
            UserName="admin",
            PolicyName="all",
            PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [everything]}),
        )
        key = iam.create_access_key(UserName="admin")["AccessKey"]
        admin = S3Keys(access_key=key["AccessKeyId"], secret_key=key["SecretAccessKey"])
        yield S3Server(config=S3Config(endpoint=endpoint, region=REGION), admin=admin)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
