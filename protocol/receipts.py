"""Usage receipts: provider-signed, buyer-countersigned (spec/settlement.md).

Rules:
- The provider signs a UsageReceipt naming the agreement, the metered usage, why the job
  ended, the outputs and the cost, which MUST equal ``settlement.charge`` of the agreed terms.
- The buyer checks the receipt against the agreement (signer, agreement id, cost) and
  countersigns the receipt's exact wire bytes under ``cx/receipt-countersign/v1``.
- A countersigned receipt is ``{"receipt": provider's wire bytes, "buyer_sig": bytes}`` and
  is what both ledgers settle from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from protocol.elastic import check_grants
from protocol.encoding import decode, encode
from protocol.envelope import Signed, open_signed
from protocol.errors import InvalidMessage, Reason
from protocol.identity import PrivateKey, PublicKey
from protocol.messages import ExitReason, Usage, UsageReceipt
from protocol.negotiation import Agreement
from protocol.schema import bytes_fields
from protocol.settlement import LedgerEntry, charge

__all__ = ["COUNTERSIGN_DOMAIN", "CountersignedReceipt", "agreed_charge", "check_receipt"]

COUNTERSIGN_DOMAIN = b"cx/receipt-countersign/v1"


def agreed_charge(agreement: Agreement, usage: Usage, exit_reason: ExitReason) -> int:
    """The one cost a receipt under ``agreement`` may state."""
    terms = agreement.terms
    return charge(terms.prices, terms.resources, terms.max_cost, usage, exit_reason)


def check_receipt(receipt: Signed[UsageReceipt], agreement: Agreement) -> None:
    """What a buyer checks before countersigning.

    Raises:
        InvalidMessage: WRONG_PARTY or TERMS_MISMATCH.
    """
    if receipt.signer.raw != agreement.terms.provider:
        raise InvalidMessage(Reason.WRONG_PARTY, "receipt not signed by the agreement's provider")
    if receipt.payload.agreement_id != agreement.id:
        raise InvalidMessage(Reason.TERMS_MISMATCH, "receipt is for another agreement")
    terms = agreement.terms
    check_grants(terms.resources, terms.elastic, receipt.payload.usage)
    expected = agreed_charge(agreement, receipt.payload.usage, receipt.payload.exit_reason)
    if receipt.payload.cost != expected:
        raise InvalidMessage(
            Reason.TERMS_MISMATCH, f"receipt charges {receipt.payload.cost}, terms say {expected}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class CountersignedReceipt:
    receipt: Signed[UsageReceipt]
    buyer_signature: bytes

    @classmethod
    def countersign(
        cls, key: PrivateKey, receipt: Signed[UsageReceipt], agreement: Agreement
    ) -> CountersignedReceipt:
        """Check ``receipt`` against ``agreement`` and countersign it as the buyer."""
        if key.public_key.raw != agreement.terms.buyer:
            raise InvalidMessage(Reason.WRONG_PARTY, "only the agreement's buyer countersigns")
        check_receipt(receipt, agreement)
        return cls(receipt=receipt, buyer_signature=key.sign(COUNTERSIGN_DOMAIN, receipt.wire))

    def to_wire(self) -> bytes:
        return encode({"receipt": self.receipt.wire, "buyer_sig": self.buyer_signature})

    @classmethod
    def from_wire(cls, data: bytes, agreements: Mapping[bytes, Agreement]) -> CountersignedReceipt:
        """Decode and verify against the agreement it names: both signatures, the terms and
        the cost.

        Raises:
            DecodeError, InvalidMessage (TERMS_MISMATCH for an unknown agreement).
        """
        wire, signature = bytes_fields(decode(data), ("receipt", "buyer_sig"), "receipt")
        receipt = open_signed(wire, UsageReceipt)
        agreement = agreements.get(receipt.payload.agreement_id)
        if agreement is None:
            raise InvalidMessage(Reason.TERMS_MISMATCH, "receipt for an unknown agreement")
        check_receipt(receipt, agreement)
        PublicKey(agreement.terms.buyer).verify(COUNTERSIGN_DOMAIN, wire, signature)
        return cls(receipt=receipt, buyer_signature=signature)

    def ledger_entry(self, agreement: Agreement) -> LedgerEntry:
        return LedgerEntry(
            agreement_id=agreement.id,
            payer=agreement.terms.buyer,
            payee=agreement.terms.provider,
            amount=self.receipt.payload.cost,
        )
