"""Transfer benchmark: one blob between two libp2p nodes on loopback, beside raw TCP.

Measures in one run:
- raw TCP throughput on loopback (trio sockets, the same bytes, nothing stored);
- one yamux stream through node/net/p2p.py (Noise + yamux), the bytes discarded;
- node/transfer.fetch_blob of a ``--size-mb`` blob from node A's store into node B's:
  chunked, each chunk verified, written and fsynced, the whole blob hashed as the chunks
  land (node/storage/partial.py);
  ``--repeat`` times into an empty store over direct channels (AES-GCM over TCP,
  negotiated on libp2p, spec/content.md "Direct channel"), each run followed by one over
  libp2p streams only (the fallback, ``direct=False``), with the CPU each side spent per
  MB. CPU per MB is the steadier figure on a shared machine, and it sets a ceiling: two
  processes on ``cores`` cores cannot beat ``cores / (receiver + sender CPU per MB)``,
  printed beside the measured figure.
The stores live under ``--dir``, by default in /dev/shm (tmpfs) where there is one: on
the development machine's disk, write + fsync of 4 MiB chunks runs at 175-335 MB/s and
would cap the figure below what the network path does; pass ``--dir /tmp`` for a disk.
Node A runs in a child process (``--serve``), as a peer would; ``--one-process`` runs both
nodes in this process instead (one core for both, as in bench/gossip.py). ``--streams`` and
``--batch`` override node.storage.transfer's streams per peer and chunks per request.
Goal (issue 10): fetch_blob >= 500 MB/s. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio

from node.gc_policy import tune_gc
from node.net.p2p import serve_network
from node.net.transport import FramedStream, Network, PeerId, ProtocolId, Stream
from node.storage import transfer
from node.storage.store import BlobStore
from protocol.identity import PrivateKey

SOURCE = ProtocolId("/cx/bench/source/1")  # sends as many zero bytes as asked
BLOCK = 1 << 20
MB = 1e6


async def raw_tcp_mb_s(data: bytes) -> float:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    done = trio.Event()
    elapsed = 0.0

    async def sink(stream: trio.SocketStream) -> None:
        nonlocal elapsed
        got, start = 0, time.perf_counter()
        while got < len(data) and (part := await stream.receive_some(BLOCK)):
            got += len(part)
        elapsed = time.perf_counter() - start
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, sink, listeners)
        client = await trio.open_tcp_stream("127.0.0.1", port)
        view = memoryview(data)
        for offset in range(0, len(data), BLOCK):
            await client.send_all(view[offset : offset + BLOCK])
        await done.wait()
        await client.aclose()
        nursery.cancel_scope.cancel()
    return len(data) / elapsed / MB


# -- node A: the sender ----------------------------------------------------------------------


async def serve_node(store_dir: Path, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serves the blob store and the byte source; reports its address."""

    async def source(stream: Stream) -> None:
        framed = FramedStream(stream)
        total = int(await framed.receive_frame() or b"0")
        block = b"\0" * 65536
        for _ in range(total // len(block)):
            await stream.send_all(block)
        await framed.receive_frame()  # the reader says when it has everything

    async with trio.open_nursery() as nursery:
        net = await nursery.start(serve_network, PrivateKey.from_seed(b"\x01" * 32))
        transfer.serve_blobs(net, BlobStore(store_dir))
        net.serve(SOURCE, source)
        task_status.started(net.listen_addrs[0])
        await trio.sleep_forever()


async def child(store_dir: Path) -> None:
    """``--serve``: run node A until the parent closes our stdin."""
    async with trio.open_nursery() as nursery:
        print(await nursery.start(serve_node, store_dir), flush=True)
        stdin = trio.lowlevel.FdStream(os.dup(0))
        while await stdin.receive_some():
            pass
        nursery.cancel_scope.cancel()


async def start_sender(
    nursery: trio.Nursery, args: argparse.Namespace, store: Path
) -> tuple[str, int | None]:
    """Node A's address, and its process id (None when it runs in this process)."""
    if args.one_process:
        return await nursery.start(serve_node, store), None
    command = [sys.executable, __file__, "--serve", str(store)]
    process = await trio.lowlevel.open_process(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    nursery.start_soon(_reap, process)  # closing its stdin (at cancellation) ends it
    assert process.stdout is not None
    line = b""
    while not line.endswith(b"\n"):
        part = await process.stdout.receive_some(4096)
        if not part:
            raise SystemExit("the serving node exited before it listened")
        line += part
    return line.decode().strip(), process.pid


async def _reap(process: trio.Process) -> None:
    try:
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            assert process.stdin is not None
            await process.stdin.aclose()
            await process.wait()


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU of ``pid`` (Linux), or of this process."""
    if pid is None:
        return time.process_time()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- node B: the receiver --------------------------------------------------------------------


async def one_stream_mb_s(net: Network, peer: PeerId, total: int) -> float:
    stream = await net.open_stream(peer, SOURCE)
    framed = FramedStream(stream)
    start = time.perf_counter()
    await framed.send_frame(str(total).encode())
    got = 0
    while got < total and (part := await stream.receive_some(BLOCK)):
        got += len(part)
    elapsed = time.perf_counter() - start
    await framed.send_frame(b"done")
    await stream.aclose()
    return total / elapsed / MB


async def fetch_once(
    net: Network, peer: PeerId, digest: str, root: Path, pid: int | None, *, direct: bool
):
    shutil.rmtree(root, ignore_errors=True)
    receiver = BlobStore(root)
    ours, theirs = time.process_time(), cpu_seconds(pid)
    start = time.perf_counter()
    await transfer.fetch_blob(net, receiver, digest, [peer], direct=direct)
    elapsed = time.perf_counter() - start
    return elapsed, time.process_time() - ours, cpu_seconds(pid) - theirs, receiver


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, float | int]:
    size = args.size_mb << 20
    data = os.urandom(size)
    sender = BlobStore(workdir / "a")
    digest = sender.put_bytes(data)
    sender.manifest(digest)  # computed once per blob and cached, as a serving node does
    r: dict[str, float | int] = {
        "size_mb": args.size_mb,
        "processes": 1 if args.one_process else 2,
        "cores": os.cpu_count() or 0,
        "streams_per_peer": transfer.STREAMS_PER_PEER,
        "batch": transfer.BATCH,
        "raw_tcp_mb_s": await raw_tcp_mb_s(data),
    }
    async with trio.open_nursery() as nursery:
        addr, pid = await start_sender(nursery, args, workdir / "a")
        net = await nursery.start(serve_network, PrivateKey.from_seed(b"\x02" * 32))
        peer = await net.connect(addr)
        r["one_stream_mb_s"] = await one_stream_mb_s(net, peer, min(size, 128 << 20))
        runs: dict[str, list[Run]] = {"direct": [], "libp2p": []}
        for _ in range(args.repeat):  # interleaved, so both meet the same load
            for mode, direct in (("direct", True), ("libp2p", False)):
                run_ = await fetch_once(net, peer, digest, workdir / "b", pid, direct=direct)
                if run_[3].read_bytes(digest) != data:
                    raise SystemExit("the fetched blob differs from the sent one")
                runs[mode].append(run_)
        nursery.cancel_scope.cancel()
    for mode, done in runs.items():
        rates = [size / elapsed / MB for elapsed, *_ in done]
        r[f"{mode}_mb_s_best"] = max(rates)
        r[f"{mode}_mb_s_median"] = statistics.median(rates)
        # In one process the receiver's CPU includes the sender's.
        r[f"{mode}_receiver_cpu_ms_per_mb"] = statistics.median(
            1000 * c * MB / size for _, c, _, _ in done
        )
        if pid is not None:
            r[f"{mode}_sender_cpu_ms_per_mb"] = statistics.median(
                1000 * c * MB / size for *_, c, _ in done
            )
    if pid is not None:  # what the CPU each MB costs allows on these cores, at best
        for mode in runs:
            cpu = r[f"{mode}_receiver_cpu_ms_per_mb"] + r[f"{mode}_sender_cpu_ms_per_mb"]
            r[f"{mode}_cpu_ceiling_mb_s"] = 1000 * r["cores"] / cpu
    r["direct_to_raw"] = r["direct_mb_s_median"] / r["raw_tcp_mb_s"]
    r["direct_to_libp2p"] = r["direct_mb_s_median"] / r["libp2p_mb_s_median"]
    r["libp2p_to_raw"] = r["libp2p_mb_s_median"] / r["raw_tcp_mb_s"]
    r["load_avg_1m"] = os.getloadavg()[0]
    return r


Run = tuple[float, float, float, BlobStore]  # seconds, our CPU, the sender's CPU, store


def table(r: dict[str, float | int]) -> list[tuple[str, str]]:
    shape = f"{r['streams_per_peer']} streams x {r['batch']} chunks"
    rows = [
        ("raw TCP, loopback (baseline)", f"{r['raw_tcp_mb_s']:8.0f} MB/s"),
        ("one yamux stream, bytes discarded", f"{r['one_stream_mb_s']:8.0f} MB/s"),
    ]
    for mode, name in (("direct", "direct channels"), ("libp2p", "libp2p streams")):
        rows += [
            (f"fetch_blob, {name}, {shape}, median", f"{r[f'{mode}_mb_s_median']:8.0f} MB/s"),
            (f"fetch_blob, {name}, best", f"{r[f'{mode}_mb_s_best']:8.0f} MB/s"),
            (f"  receiver CPU ({name})", f"{r[f'{mode}_receiver_cpu_ms_per_mb']:8.1f} ms/MB"),
        ]
        if f"{mode}_sender_cpu_ms_per_mb" in r:
            rows.append(
                (f"  sender CPU ({name})", f"{r[f'{mode}_sender_cpu_ms_per_mb']:8.1f} ms/MB")
            )
            rows.append(
                (
                    f"  CPU-bound ceiling, {r['cores']} cores / CPU per MB",
                    f"{r[f'{mode}_cpu_ceiling_mb_s']:8.0f} MB/s",
                )
            )
    rows += [
        ("direct / raw TCP (medians)", f"{r['direct_to_raw']:8.3f}"),
        ("direct / libp2p streams (medians)", f"{r['direct_to_libp2p']:8.2f}x"),
        ("libp2p streams / raw TCP (medians)", f"{r['libp2p_to_raw']:8.3f}"),
        ("load average (1 min) at the end", f"{r['load_avg_1m']:8.2f}"),
    ]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--streams", type=int, default=transfer.STREAMS_PER_PEER)
    parser.add_argument("--batch", type=int, default=transfer.BATCH)
    shm = Path("/dev/shm")
    parser.add_argument(
        "--dir",
        type=Path,
        default=shm if shm.is_dir() else None,
        help="where the two stores live (default: /dev/shm, tmpfs, where there is one)",
    )
    parser.add_argument("--one-process", action="store_true", help="both nodes in one process")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)  # the child's mode
    args = parser.parse_args()
    transfer.STREAMS_PER_PEER, transfer.BATCH = args.streams, args.batch
    tune_gc()  # as `cx node` does, in both nodes
    if args.serve:
        trio.run(child, args.serve)
        return
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="cx-bench-transfer-") as tmp:
        r = trio.run(run, args, Path(tmp))
    print(f"{r['size_mb']} MB blob, nodes in {r['processes']} process(es), {r['cores']} cores")
    for name, value in table(r):
        print(f"{name:<44} {value}")
    goal = "met" if r["direct_mb_s_median"] >= 500 else "NOT met"
    print(f"goal fetch_blob >= 500 MB/s (median, direct channels): {goal}", end="")
    if "direct_cpu_ceiling_mb_s" in r:
        ceiling = r["direct_cpu_ceiling_mb_s"]
        print(f"; the CPU it costs caps it at {ceiling:.0f} MB/s on {r['cores']} cores", end="")
    print()
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}))


if __name__ == "__main__":
    main()
