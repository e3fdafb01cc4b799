"""A real OCI registry on loopback for the tests: Debian's ``docker-registry`` (distribution
2.8), fed by ``skopeo`` from OCI layouts the tests build.

``Registry`` starts one process per use (public, htpasswd or token auth), waits until it
says it listens (its own log line, no polling), and stops it on exit.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

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
) -> Iterator[Registry]:
    """A registry storing under ``root``: public, with htpasswd ``creds``, or with the
    ``auth`` section given (e.g. token auth)."""
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
        yield Registry(host=f"127.0.0.1:{port}", root=root, creds=creds)
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
