"""What can go wrong fetching a job's content from outside the market (a registry, an object
store), and whose fault it is.

Errors::

    FetchError            ``reason`` (FetchReason); ``buyer_fault``
      RegistryError       node.storage.registry
      ObjectError         node.storage.objects
"""

from __future__ import annotations

import enum

__all__ = ["FetchError", "FetchReason"]


class FetchReason(enum.StrEnum):
    BAD_REFERENCE = "bad-reference"  # not a usable image reference or URL
    NOT_FOUND = "not-found"
    DENIED = "denied"  # a login or keys needed, or refused
    DIGEST_MISMATCH = "digest-mismatch"
    NO_PLATFORM = "no-platform"  # an index with no image for this architecture
    BAD_CONTENT = "bad-content"  # e.g. a malformed image manifest
    UNREACHABLE = "unreachable"
    SERVER_FAILED = "server-failed"


_NOT_BUYERS = frozenset({FetchReason.UNREACHABLE, FetchReason.SERVER_FAILED})


class FetchError(Exception):
    """Content could not be had; ``reason`` says why, the message what to do."""

    def __init__(self, reason: FetchReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason

    @property
    def buyer_fault(self) -> bool:
        """The job named something wrong (a reference, content, a login), not a service
        that is down or failing."""
        return self.reason not in _NOT_BUYERS
