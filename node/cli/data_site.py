"""``cx run``'s flags for where a job's data lives (spec/matching.md, "Transfer cost"): with
them the bid states its data's region and size, and matching counts what moving it to each
provider costs, so a cheap provider far from large data loses to a dearer one beside it."""

from __future__ import annotations

import argparse

from node.cli.common import parse_credits, size_bytes

__all__ = ["add_data_flags", "data_fields"]


def add_data_flags(parser: argparse.ArgumentParser) -> None:
    data = parser.add_argument_group("where its data lives (moving it counts in matching)")
    data.add_argument(
        "--data-region",
        metavar="REGION",
        help="the region the job's image and inputs live in; offers elsewhere pay the "
        "data's egress to reach them",
    )
    data.add_argument(
        "--data-size",
        type=size_bytes,
        metavar="SIZE",
        help="how big the data is, e.g. 50Gi; default: the image and inputs this node holds",
    )
    data.add_argument(
        "--data-egress-price",
        type=parse_credits,
        metavar="CREDITS",
        help="what the data's region charges per GiB sent out of it, e.g. 0.09; default 0",
    )
    data.add_argument(
        "--output-size",
        type=size_bytes,
        metavar="SIZE",
        help="the outputs expected back, charged at each provider's egress price; default 0",
    )
    data.add_argument(
        "--egress-budget",
        type=parse_credits,
        metavar="CREDITS",
        help="the most moving the data may cost; providers costing more do not fit",
    )


def data_fields(args: argparse.Namespace) -> dict[str, object]:
    """The job request's fields for these flags (only those given)."""
    given = {
        "data_region": args.data_region,
        "data_bytes": args.data_size,
        "data_egress_gib": args.data_egress_price,
        "output_bytes": args.output_size,
        "egress_budget": args.egress_budget,
    }
    return {name: value for name, value in given.items() if value is not None}
