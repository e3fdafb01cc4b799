"""A real OCI registry on loopback for the tests: Debian's ``docker-registry`` (distribution
2.8), fed by ``skopeo`` from OCI layouts the tests build.

``Registry`` starts one process per use (public, htpasswd or token auth), waits until it
says it listens (its own log line, no polling), and stops it on exit.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import json
import os
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID
from process_support import free_port, wait_for_log

from node.storage.image import (
    MT_INDEX,
    MT_MANIFEST,
    Entry,
    _json_bytes,
    busybox_entries,
    write_layout,
)


@dataclass(frozen=True, slots=True)
class Registry:
    host: str  # 127.0.0.1:PORT
    root: Path
    creds: tuple[str, str] | None

    def push(self, layout: Path, repo: str, tag: str = "latest", *, all_: bool = False) -> None:
        """Copy the image tagged ``tag`` in the OCI layout to ``repo:tag`` with skopeo."""
        cmd = ["skopeo", "copy", "--quiet", "--dest-tls-verify=false"]
        if all_:
            cmd.append("--all")
        if self.creds is not None:
            cmd += ["--dest-creds", f"{self.creds[0]}:{self.creds[1]}"]
        cmd += [f"oci:{layout}:{tag}", f"docker://{self.host}/{repo}:{tag}"]
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)

    def ref(self, repo: str, digest: str) -> str:
        return f"{self.host}/{repo}@{digest}"


@contextlib.contextmanager
def running_registry(
    root: Path,
    *,
    creds: tuple[str, str] | None = None,
    auth: dict[str, object] | None = None,
    creds_for_push: tuple[str, str] | None = None,
) -> Iterator[Registry]:
    """A registry storing under ``root``: public, with htpasswd ``creds``, or with the
    ``auth`` section given (e.g. token auth, pushed to with ``creds_for_push``)."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config: dict[str, object] = {
        "version": 0.1,
        "log": {"level": "info", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(root / "data")}},
        "http": {"addr": f"127.0.0.1:{port}", "secret": "test-secret"},
    }
    if creds is not None:
        htpasswd = subprocess.run(
            ["htpasswd", "-Bbn", *creds], check=True, capture_output=True, text=True
        ).stdout
        (root / "htpasswd").write_text(htpasswd)
        config["auth"] = {"htpasswd": {"realm": "cx-test", "path": str(root / "htpasswd")}}
    if auth is not None:
        config["auth"] = auth
    # JSON is YAML: the registry reads it as its configuration.
    (root / "config.yml").write_text(json.dumps(config))
    proc = subprocess.Popen(
        ["docker-registry", "serve", str(root / "config.yml")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for_log(proc, f"listening on 127.0.0.1:{port}")
        yield Registry(host=f"127.0.0.1:{port}", root=root, creds=creds or creds_for_push)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def multi_arch_layout(out: Path, *, tag: str = "latest") -> tuple[str, dict[str, str]]:
    """An OCI layout whose ``tag`` is an index of a busybox image for amd64 and a tiny one
    for arm64. Returns the index digest and each architecture's manifest digest."""
    arms = write_layout(out / "arm", [[Entry(path="marker", data=b"arm64\n")]], arch="arm64")
    amds = write_layout(out, [busybox_entries()], arch="amd64", tag="amd64-only")
    blobs = out / "blobs" / "sha256"
    for p in (out / "arm" / "blobs" / "sha256").iterdir():
        (blobs / p.name).write_bytes(p.read_bytes())
    manifests = {"amd64": amds, "arm64": arms}
    index = {
        "schemaVersion": 2,
        "mediaType": MT_INDEX,
        "manifests": [
            {
                "mediaType": MT_MANIFEST,
                "digest": d,
                "size": (blobs / d[7:]).stat().st_size,
                "platform": {"architecture": a, "os": "linux"},
            }
            for a, d in sorted(manifests.items())
        ],
    }
    index_bytes = _json_bytes(index)
    index_digest = "sha256:" + hashlib.sha256(index_bytes).hexdigest()
    (blobs / index_digest[7:]).write_bytes(index_bytes)
    top = json.loads((out / "index.json").read_text())
    top["manifests"].append(
        {
            "mediaType": MT_INDEX,
            "digest": index_digest,
            "size": len(index_bytes),
            "annotations": {"org.opencontainers.image.ref.name": tag},
        }
    )
    (out / "index.json").write_bytes(_json_bytes(top))
    return index_digest, manifests


class TokenServer:
    """A registry token service (the Docker token auth spec) for the tests: it checks the
    basic login and answers a JWT (ES256, the signing certificate in ``x5c``) granting what
    the scope asks; the registry trusts the certificate (its ``rootcertbundle``)."""

    SERVICE = "cx-test-registry"
    ISSUER = "cx-test-issuer"

    def __init__(self, root: Path, creds: tuple[str, str]) -> None:
        self.creds = creds
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cx test token issuer")])
        now = datetime.now(UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(hours=1))
            .not_valid_after(now + timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.bundle = root / "token-ca.pem"
        self.bundle.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        self.tokens_issued = 0

    def auth_config(self, port: int) -> dict[str, object]:
        return {
            "token": {
                "realm": f"http://127.0.0.1:{port}/token",
                "service": self.SERVICE,
                "issuer": self.ISSUER,
                "rootcertbundle": str(self.bundle),
            }
        }

    def token(self, subject: str, scopes: list[str]) -> str:
        def b64(data: bytes) -> str:
            return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

        der = self.cert.public_bytes(serialization.Encoding.DER)
        header = {"typ": "JWT", "alg": "ES256", "x5c": [base64.b64encode(der).decode()]}
        now = int(time.time())
        access = []
        for scope in scopes:
            kind, repo, actions = scope.split(":")
            access.append({"type": kind, "name": repo, "actions": actions.split(",")})
        claims = {
            "iss": self.ISSUER, "sub": subject, "aud": self.SERVICE, "exp": now + 300,
            "nbf": now - 10, "iat": now, "jti": os.urandom(8).hex(), "access": access,
        }  # fmt: skip
        signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
        r, s = decode_dss_signature(
            self.key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256()))
        )
        self.tokens_issued += 1
        return f"{signing_input}.{b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


@contextlib.contextmanager
def running_token_server(server: TokenServer) -> Iterator[int]:
    """Serve ``server`` on a loopback port (a thread); yields the port."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            expected = "Basic " + base64.b64encode(":".join(server.creds).encode()).decode()
            if self.headers.get("Authorization") != expected:
                self.send_response(401)
                self.end_headers()
                return
            body = json.dumps({"token": server.token(server.creds[0], query.get("scope", []))})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield int(httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()
