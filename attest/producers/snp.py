"""SEV-SNP evidence producer for providers running inside an SNP guest.

Rules:
- Prefer configfs-tsm (Linux 6.7+): make a directory under ``/sys/kernel/config/tsm/report``,
  write the 64-byte REPORT_DATA to ``inblob``, read ``outblob`` (the report) and ``auxblob``
  (the host's certificate table, when it provides one), remove the directory.
- Else ``/dev/sev-guest`` with the SNP_GET_REPORT ioctl (linux/sev-guest.h).
- Else, or on any failure, ProducerError(CANNOT_PRODUCE) says why: this node cannot prove
  SEV-SNP. None of this can run on our development machines beyond that refusal.
- The VCEK and the ASK/ARK chain come from the host's certificate table or from files the
  operator fetched from AMD's key distribution service; the verifier pins the ARK anyway.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from attest.binding import snp_report_data
from attest.errors import ProducerError, Reason
from attest.evidence import snp_evidence
from attest.snp import REPORT_SIZE
from protocol.messages import Evidence

__all__ = ["SnpProducer", "parse_cert_table"]

TSM_REPORTS = Path("/sys/kernel/config/tsm/report")
SEV_GUEST = Path("/dev/sev-guest")
# GUIDs of the GHCB certificate table (GHCB spec §4.1.8.1).
_ARK = uuid.UUID("c0b406a4-a803-4952-9743-3fb6014cd0ae")
_ASK = uuid.UUID("4ab7b379-bbac-4fe4-a02f-05aef327c782")
_VCEK = uuid.UUID("63da758d-e664-4564-adc5-f4b93be8accd")
# _IOWR('S', 0, struct snp_guest_request_ioctl), the struct being 32 bytes.
_SNP_GET_REPORT = 0xC0205300
_RESP_SIZE = 4000


def parse_cert_table(table: bytes) -> dict[uuid.UUID, bytes]:
    """Entries {GUID, offset u32, length u32} up to an all-zero entry -> GUID: DER."""
    out: dict[uuid.UUID, bytes] = {}
    for pos in range(0, len(table) - 23, 24):
        guid = uuid.UUID(bytes_le=table[pos : pos + 16])
        offset, length = struct.unpack_from("<II", table, pos + 16)
        if guid.int == 0:
            break
        if offset + length > len(table):
            raise ProducerError(Reason.DEVICE_ERROR, "host certificate table entry overflows")
        out[guid] = table[offset : offset + length]
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class SnpProducer:
    tsm_root: Path = TSM_REPORTS
    device: Path = SEV_GUEST

    def report(self, report_data: bytes) -> tuple[bytes, dict[uuid.UUID, bytes]]:
        """A fresh report over ``report_data`` (64 bytes) and the host's certificates."""
        if len(report_data) != 64:
            raise ProducerError(Reason.CANNOT_PRODUCE, "REPORT_DATA must be 64 bytes")
        if self.tsm_root.is_dir():
            return self._report_tsm(report_data)
        if self.device.exists():
            return self._report_ioctl(report_data), {}
        raise ProducerError(
            Reason.CANNOT_PRODUCE,
            f"not an SEV-SNP guest: neither {self.tsm_root} nor {self.device} exists",
        )

    def _report_tsm(self, report_data: bytes) -> tuple[bytes, dict[uuid.UUID, bytes]]:
        entry = self.tsm_root / f"cx-{os.getpid()}"
        try:
            entry.mkdir()
            try:
                if (entry / "provider").read_text().strip() != "sev_guest":
                    raise ProducerError(Reason.CANNOT_PRODUCE, "configfs-tsm is not SEV-SNP here")
                (entry / "inblob").write_bytes(report_data)
                report = (entry / "outblob").read_bytes()
                aux = entry / "auxblob"
                table = aux.read_bytes() if aux.exists() else b""
            finally:
                entry.rmdir()
        except OSError as exc:
            raise ProducerError(
                Reason.CANNOT_PRODUCE, f"configfs-tsm report failed: {exc}"
            ) from exc
        return _check(report), parse_cert_table(table) if table else {}

    def _report_ioctl(self, report_data: bytes) -> bytes:
        request = ctypes.create_string_buffer(report_data + bytes(4 + 28))  # user_data, vmpl 0
        response = ctypes.create_string_buffer(_RESP_SIZE)
        arg = bytearray(
            struct.pack("<B7xQQQ", 1, ctypes.addressof(request), ctypes.addressof(response), 0)
        )
        try:
            fd = os.open(self.device, os.O_RDWR)
            try:
                fcntl.ioctl(fd, _SNP_GET_REPORT, arg)
            finally:
                os.close(fd)
        except OSError as exc:
            raise ProducerError(Reason.CANNOT_PRODUCE, f"SNP_GET_REPORT failed: {exc}") from exc
        status, size = struct.unpack_from("<II", response.raw)
        if status != 0 or size != REPORT_SIZE:
            raise ProducerError(Reason.DEVICE_ERROR, f"firmware status {status}, size {size}")
        return _check(response.raw[32 : 32 + size])

    def evidence(
        self,
        *,
        provider_key: bytes,
        nonce: bytes,
        terms_hash: bytes,
        vcek: bytes | None = None,
        chain: bytes | None = None,
    ) -> Evidence:
        """A fresh report bound to this negotiation, as ``sev-snp-report/v1`` evidence.

        ``vcek`` (DER) and ``chain`` (PEM, ASK then ARK) override the host's table.
        """
        report, certs = self.report(snp_report_data(provider_key, nonce, terms_hash))
        vcek = vcek or certs.get(_VCEK)
        if chain is None and _ASK in certs and _ARK in certs:
            chain = b"".join(
                x509.load_der_x509_certificate(certs[g]).public_bytes(Encoding.PEM)
                for g in (_ASK, _ARK)
            )
        if vcek is None or chain is None:
            raise ProducerError(
                Reason.CANNOT_PRODUCE,
                "no VCEK and ASK/ARK chain: the host provides none; configure them from AMD KDS",
            )
        return snp_evidence(report=report, vcek=vcek, chain=chain)


def _check(report: bytes) -> bytes:
    if len(report) != REPORT_SIZE:
        raise ProducerError(Reason.DEVICE_ERROR, f"report is {len(report)} bytes")
    return report
