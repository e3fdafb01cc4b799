"""A job's secrets sealed to its provider (spec/messages.md, "Sealed secrets").

Rules:
- The plaintext is the canonical encoding of :class:`SecretsPlain`: the agreement it belongs
  to and the secrets themselves (a registry login, S3 keys).
- The box is libsodium's sealed box (``crypto_box_seal``: an ephemeral X25519 key, then
  XSalsa20-Poly1305) to the ``seal_key`` of the offer the agreement names, so only the
  process that signed that offer can open it; a box is 48 bytes longer than its plaintext.
- Opening checks the box, the encoding, the schema and that the plaintext names the
  agreement the box arrived for (a box cannot be moved to another job).

Opening is pure and lives here; sealing needs randomness and lives in the node.
"""

from __future__ import annotations

import nacl.exceptions
import nacl.public

from protocol.encoding import decode, encode
from protocol.errors import InvalidMessage, Reason
from protocol.messages import SecretsPlain
from protocol.schema import from_value, to_value

__all__ = ["MAX_BOX", "encode_secrets", "open_secrets"]

MAX_BOX = 64 * 1024


def encode_secrets(plain: SecretsPlain) -> bytes:
    """The plaintext a buyer seals."""
    return encode(to_value(plain))


def open_secrets(box: bytes, recipient: bytes, *, agreement_id: bytes) -> SecretsPlain:
    """Open ``box`` with the 32-byte X25519 private key ``recipient``.

    Raises:
        InvalidMessage: BAD_SEAL (does not open with this key, or too large), a decoding or
            schema reason, TERMS_MISMATCH (sealed for another agreement).
    """
    if len(box) > MAX_BOX:
        raise InvalidMessage(Reason.BAD_SEAL, f"sealed secrets over {MAX_BOX} bytes")
    try:
        plaintext = nacl.public.SealedBox(nacl.public.PrivateKey(recipient)).decrypt(box)
    except nacl.exceptions.CryptoError as exc:
        raise InvalidMessage(Reason.BAD_SEAL, "the secrets are not sealed to this key") from exc
    plain = from_value(SecretsPlain, decode(plaintext))
    if plain.agreement_id != agreement_id:
        raise InvalidMessage(Reason.TERMS_MISMATCH, "the secrets were sealed for another job")
    return plain
