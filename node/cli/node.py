"""``cx init`` (make a home: key and config) and ``cx node`` (run the node of a home)."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from typing import Any

import trio

from node.cli.common import add_common, cpu, credits, parse_credits, print_json, size_bytes
from node.cli.logs_json import use_json_logs
from node.storage.config_rules import host_shortfall
from node.storage.db import DamagedDatabase
from node.storage.home import (
    DEFAULT_LISTEN,
    DEFAULT_PRICES,
    Home,
    HomeError,
    NodeConfig,
    ProviderConfig,
    init_home,
)
from node.storage.image import host_arch
from protocol.messages import Arch, Prices, Resources

GIB = 1 << 30
_PRICE_FLAGS = (  # cx init's price options: flag, Prices field, what it is per
    ("--price", "cpu_core_hour", "core-hour of CPU"),
    ("--memory-price", "memory_gib_hour", "GiB-hour of memory"),
    ("--disk-price", "disk_gib_hour", "GiB-hour of disk"),
)


def register(commands: Any) -> None:  # noqa: ANN401 - argparse's private subparsers type
    init = commands.add_parser(
        "init",
        help="create a node's home: key, config, state directories",
        description=(
            "Create the home directory of a node: a fresh Ed25519 key (its peer id) and "
            "config.toml. A buyer needs no options; --provider also sells capacity."
        ),
        epilog=(
            "examples:\n"
            "  cx init\n"
            "  cx init --provider --cpu 4 --memory 8Gi --price 1 --region eu\n"
            "  cx init --home /tmp/b --bootstrap /ip4/127.0.0.1/tcp/4001/p2p/12D3Koo..."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common(init, json_help="print the new node's identity as JSON")
    init.add_argument(
        "--force", action="store_true", help="rewrite an existing config (the key stays)"
    )
    init.add_argument(
        "--convert-key",
        action="store_true",
        help="rewrite a cx 0.1 key file (a bare seed) in the checked format, and stop",
    )
    net = init.add_argument_group("network")
    net.add_argument(
        "--listen",
        action="append",
        metavar="MULTIADDR",
        help="listen address (default /ip4/127.0.0.1/tcp/0)",
    )
    net.add_argument(
        "--bootstrap",
        action="append",
        default=[],
        metavar="MULTIADDR",
        help="peer to join at start (repeatable; ends in /p2p/<id>)",
    )
    net.add_argument("--dht", action="store_true", help="run a Kademlia DHT for discovery")
    net.add_argument(
        "--mdns",
        action="store_true",
        help="discover peers on the local network (binds every interface)",
    )
    net.add_argument(
        "--api-port",
        type=int,
        default=0,
        help="control API port on 127.0.0.1 (default: any free port)",
    )
    net.add_argument(
        "--ek-root",
        action="append",
        default=[],
        metavar="PEM",
        help="TPM EK CA certificate this buyer trusts (repeatable)",
    )
    sell = init.add_argument_group("provider")
    sell.add_argument("--provider", action="store_true", help="offer this machine's capacity")
    sell.add_argument(
        "--cpu", "--cpus", type=cpu, default=2000, help="cores to sell, e.g. 4 (default 2)"
    )
    sell.add_argument(
        "-m",
        "--memory",
        type=size_bytes,
        default=2 * GIB,
        help="memory to sell, e.g. 8Gi or 8G (default 2Gi)",
    )
    sell.add_argument(
        "--disk", type=size_bytes, default=4 * GIB, help="disk to sell, e.g. 20Gi (default 4Gi)"
    )
    for flag, field, unit in _PRICE_FLAGS:
        default = getattr(DEFAULT_PRICES, field)
        sell.add_argument(
            flag,
            dest=field,
            type=parse_credits,
            default=default,
            metavar="CREDITS",
            help=f"credits per {unit} (default {credits(default)})",
        )
    sell.add_argument("--region", default="", help="region label buyers can ask for")
    sell.add_argument(
        "--arch",
        choices=[a.value for a in Arch],
        default=host_arch(),
        help="architecture (default: this machine's)",
    )
    sell.add_argument(
        "--tpm",
        action="store_true",
        help="attest with a TPM (a software TPM under the home unless --tcti)",
    )
    sell.add_argument("--tcti", help="TPM to use, e.g. device:/dev/tpmrm0")
    init.set_defaults(run=_init)

    node = commands.add_parser(
        "node",
        help="run the node of a home until interrupted",
        description=(
            "Run a node: join the network, keep the order book, trade as buyer (and as "
            "provider if the home offers capacity), and serve the control API on 127.0.0.1 "
            "for the other commands. Stop it with Ctrl-C or SIGTERM."
        ),
    )
    add_common(node, json_help="print the started node as one line of JSON (peer id, role, "
               "listen addresses, control API URL)")  # fmt: skip
    node.add_argument(
        "--bootstrap", action="append", default=[], metavar="MULTIADDR", help="also join this peer"
    )
    node.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="json: one JSON object per line (ts, level, logger, message, exc)",
    )
    node.set_defaults(run=_node)


def _init(args: argparse.Namespace) -> int:
    if args.convert_key:
        try:
            key = Home(args.home.expanduser()).convert_legacy_key()
        except HomeError as exc:
            print(f"cx init: {exc}", file=sys.stderr)
            return 1
        print(f"converted the key of {args.home}; peer id {key.peer_id}")
        return 0
    provider = None
    if args.provider:
        provider = ProviderConfig(
            capacity=Resources(cpu_milli=args.cpu, memory_bytes=args.memory, disk_bytes=args.disk),
            prices=Prices(
                cpu_core_hour=args.cpu_core_hour,
                memory_gib_hour=args.memory_gib_hour,
                disk_gib_hour=args.disk_gib_hour,
            ),
            arch=Arch(args.arch),
            region=args.region,
            tpm=args.tpm or args.tcti is not None,
            tcti=args.tcti,
            benchmark=True,  # state a work score in every offer (config: benchmark = false)
        )
    config = NodeConfig(
        listen=tuple(args.listen or DEFAULT_LISTEN),
        bootstrap=tuple(args.bootstrap),
        dht=args.dht,
        mdns=args.mdns,
        api_port=args.api_port,
        ek_roots=tuple(str(p) for p in args.ek_root),
        provider=provider,
    )
    _warn_beyond_host("cx init", config)
    try:
        home = init_home(args.home.expanduser(), config, force=args.force)
        peer_id = home.key().peer_id
    except HomeError as exc:
        print(f"cx init: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print_json({"home": str(home.root), "peer_id": peer_id, "provider": provider is not None})
    else:
        role = "provider and buyer" if provider else "buyer"
        print(f"initialised {home.root} as {role}; peer id {peer_id}")
        print(f"start it with: cx node --home {home.root}")
    return 0


def _node(args: argparse.Namespace) -> int:
    logging.getLogger().setLevel(min(logging.getLogger().level, logging.INFO))
    if args.log_format == "json":
        use_json_logs()
    home = Home(args.home.expanduser())
    try:
        _warn_beyond_host("cx node", home.config())
        trio.run(_serve, home, tuple(args.bootstrap), args.json)
    except (HomeError, DamagedDatabase, BaseExceptionGroup) as exc:
        refusal = start_refusal(exc)
        if refusal is None:
            raise
        for line in str(refusal).splitlines():  # one line per problem, each saying whose
            print(f"cx node: {line}", file=sys.stderr)
        return 1
    return 0


def _warn_beyond_host(name: str, config: NodeConfig) -> None:
    if config.provider is not None:
        for line in host_shortfall(config.provider.capacity):
            print(f"{name}: warning: this provider {line}", file=sys.stderr)


def start_refusal(exc: BaseException) -> BaseException | None:
    """The one reason a node refused to start (a bad home, a damaged database), looked
    for through the exception groups trio wraps it in; None for anything else."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, HomeError | DamagedDatabase) else None


async def _serve(home: Home, bootstrap: tuple[str, ...], as_json: bool) -> None:
    from node.api.controller import serve_control  # imported here: keeps `cx --help` fast
    from node.gc_policy import tune_gc
    from node.peer import serve_peer

    tune_gc()
    async with trio.open_nursery() as nursery:
        peer = await nursery.start(serve_peer, home)
        for addr in bootstrap:
            await peer.join(addr)
        api = await nursery.start(serve_control, peer)
        role = "provider" if peer.provider is not None else "buyer"
        if as_json:  # one line a supervisor can read
            started = {"peer_id": peer.net.peer_id, "role": role, "api": api}
            print(json.dumps({**started, "listen": peer.net.listen_addrs}), flush=True)
        else:
            addrs = ", ".join(peer.net.listen_addrs)
            print(f"cx node {peer.net.peer_id} ({role}) listening on {addrs}", flush=True)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                print("stopping", flush=True)
                break
        nursery.cancel_scope.cancel()
