"""TPM evidence producer for providers: tpm2-pytss ESAPI on any TCTI.

Rules:
- TCTI strings are ``name:config``: ``device:/dev/tpmrm0`` on real hosts,
  ``swtpm:host=127.0.0.1,port=P`` in tests and ``cx testnet``.
- On open, transient objects left by a crashed client are flushed: swtpm and ``/dev/tpm0``
  have no resource manager, and leftovers end in "out of memory for object contexts".
- EK and AK are primary keys of the endorsement hierarchy, made persistent (EvictControl)
  so they survive node restarts. An AK in the endorsement hierarchy quotes the real
  resetCount/restartCount (the owner hierarchy obfuscates them), which reveals reboots.
- The EK is the TCG low-range RSA-2048 EK (its certificate sits at NV 0x01c00002); its
  policy is PolicySecret(endorsement), which ActivateCredential satisfies here.
- Every TSS error becomes ProducerError(DEVICE_ERROR) with the TPM's message.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from tpm2_pytss import ESAPI, TCTILdr, TSS2_Exception
from tpm2_pytss.constants import ESYS_TR, TPM2_CAP, TPM2_HC, TPM2_SE, TPMA_OBJECT
from tpm2_pytss.types import (
    TPM2B_ENCRYPTED_SECRET,
    TPM2B_ID_OBJECT,
    TPM2B_PUBLIC,
    TPML_PCR_SELECTION,
    TPMT_SYM_DEF,
)
from tpm2_pytss.utils import NoSuchIndex, create_ek_template

from attest.binding import tpm_qualifying_data
from attest.errors import ProducerError, Reason
from attest.evidence import tpm_evidence
from protocol.messages import Evidence

__all__ = [
    "AK_HANDLE",
    "EK_CERT_INDEX",
    "EK_HANDLE",
    "Quote",
    "TpmProducer",
    "ak_template",
]

log = logging.getLogger(__name__)

EK_HANDLE = 0x81010001  # TCG provisioning guidance: RSA-2048 EK
AK_HANDLE = 0x81018000  # ours, in the endorsement range
EK_CERT_INDEX = 0x01C00002
_NV_CHUNK = 512
_PCR_READ_MAX = 8  # a TPML_DIGEST holds at most 8 digests
_AK_ATTRS = (
    TPMA_OBJECT.FIXEDTPM
    | TPMA_OBJECT.FIXEDPARENT
    | TPMA_OBJECT.SENSITIVEDATAORIGIN
    | TPMA_OBJECT.USERWITHAUTH
    | TPMA_OBJECT.RESTRICTED
    | TPMA_OBJECT.SIGN_ENCRYPT
)


@contextmanager
def _device(what: str) -> Iterator[None]:
    try:
        yield
    except TSS2_Exception as exc:
        raise ProducerError(Reason.DEVICE_ERROR, f"TPM refused to {what}: {exc}") from exc


@dataclass(frozen=True, slots=True, kw_only=True)
class Quote:
    ak_public: bytes  # TPM2B_PUBLIC
    attest: bytes  # TPMS_ATTEST
    signature: bytes  # TPMT_SIGNATURE
    pcrs: dict[str, dict[int, bytes]]


class TpmProducer:
    """One open TPM. Use as a context manager or call :meth:`close`."""

    def __init__(
        self,
        tcti: str,
        *,
        ek_handle: int = EK_HANDLE,
        ak_handle: int = AK_HANDLE,
        ek_type: str = "EK-RSA2048",
    ) -> None:
        """Open the TPM and flush leftover transient objects.

        Raises ProducerError(CANNOT_PRODUCE) when no TPM answers at ``tcti``.
        """
        name, _, config = tcti.partition(":")
        try:
            self._esys = ESAPI(TCTILdr(name, config or None))
        except TSS2_Exception as exc:
            raise ProducerError(
                Reason.CANNOT_PRODUCE, f"no TPM at {tcti!r} ({exc}); check the device or swtpm"
            ) from exc
        self._ek_handle = ek_handle
        self._ak_handle = ak_handle
        self._ek_type = ek_type  # a low-range template: its policy is PolicySecret(endorsement)
        self._ek: ESYS_TR | None = None
        self._ak: ESYS_TR | None = None
        self.leftovers_flushed = self.flush_transients()

    def __enter__(self) -> TpmProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._esys.close()

    def _handles(self, first: int) -> list[int]:
        with _device("list handles"):
            _more, data = self._esys.get_capability(TPM2_CAP.HANDLES, first, 64)
        return [int(h) for h in data.data.handles]

    def flush_transients(self) -> int:
        """Flush every transient object on the TPM; return how many there were."""
        handles = self._handles(TPM2_HC.HR_TRANSIENT)
        for handle in handles:
            with _device("flush a leftover object"):
                self._esys.flush_context(self._esys.tr_from_tpmpublic(handle))
        if handles:
            log.info("flushed %d leftover transient objects", len(handles))
        return len(handles)

    def _nv_read(self, index: int) -> bytes:
        if index not in self._handles(TPM2_HC.HR_NV_INDEX):
            raise NoSuchIndex(index)
        with _device(f"read NV 0x{index:08x}"):
            nv = self._esys.tr_from_tpmpublic(index)
            public, _name = self._esys.nv_read_public(nv)
            size = public.nvPublic.dataSize
            out = b""
            while len(out) < size:
                chunk = min(_NV_CHUNK, size - len(out))
                out += bytes(self._esys.nv_read(nv, chunk, len(out)))
        return out

    def ek_certificate(self) -> bytes:
        """The RSA EK certificate (DER); ProducerError(CANNOT_PRODUCE) when there is none."""
        try:
            return self._nv_read(EK_CERT_INDEX)
        except NoSuchIndex:
            raise ProducerError(
                Reason.CANNOT_PRODUCE, "this TPM has no RSA EK certificate at NV 0x01c00002"
            ) from None

    def _persistent(self, handle: int, template: TPM2B_PUBLIC) -> ESYS_TR:
        """Load the persistent key at ``handle``, creating and persisting it when absent."""
        if handle in self._handles(TPM2_HC.HR_PERSISTENT):
            with _device(f"load persistent key 0x{handle:08x}"):
                return self._esys.tr_from_tpmpublic(handle)
        with _device("create a primary key"):
            transient, *_ = self._esys.create_primary(None, template, ESYS_TR.ENDORSEMENT)
        try:
            with _device(f"persist a key at 0x{handle:08x}"):
                return self._esys.evict_control(ESYS_TR.OWNER, transient, handle)
        finally:
            self._esys.flush_context(transient)

    @property
    def ek(self) -> ESYS_TR:
        if self._ek is None:
            _cert, template = create_ek_template(self._ek_type, self._nv_read)
            self._ek = self._persistent(self._ek_handle, template)
        return self._ek

    @property
    def ak(self) -> ESYS_TR:
        if self._ak is None:
            self._ak = self._persistent(self._ak_handle, ak_template())
        return self._ak

    def public(self, key: ESYS_TR) -> bytes:
        """The TPM2B_PUBLIC of a loaded key."""
        with _device("read a public area"):
            public, _name, _qualified = self._esys.read_public(key)
        return bytes(public.marshal())

    def create_ak(self, template: TPM2B_PUBLIC) -> ESYS_TR:
        """A transient primary AK in the endorsement hierarchy (tests, other algorithms)."""
        with _device("create an AK"):
            handle, *_ = self._esys.create_primary(None, template, ESYS_TR.ENDORSEMENT)
        return handle

    def flush(self, key: ESYS_TR) -> None:
        with _device("flush a key"):
            self._esys.flush_context(key)

    def activate(self, credential_blob: bytes, encrypted_secret: bytes) -> bytes:
        """TPM2_ActivateCredential with the AK and EK; return the recovered secret.

        Raises ProducerError(ACTIVATION_FAILED) when the TPM refuses: the challenge was not
        made for this TPM's EK and AK.
        """
        ek, ak = self.ek, self.ak
        with _device("start a policy session"):
            session = self._esys.start_auth_session(
                ESYS_TR.NONE,
                ESYS_TR.NONE,
                TPM2_SE.POLICY,
                TPMT_SYM_DEF.parse("aes128cfb"),
                "sha256",
            )
        try:
            with _device("satisfy the EK policy"):
                self._esys.policy_secret(ESYS_TR.ENDORSEMENT, session)
            secret = self._esys.activate_credential(
                ak,
                ek,
                TPM2B_ID_OBJECT(credential=credential_blob),
                TPM2B_ENCRYPTED_SECRET(secret=encrypted_secret),
                session1=ESYS_TR.PASSWORD,
                session2=session,
            )
        except TSS2_Exception as exc:
            raise ProducerError(
                Reason.ACTIVATION_FAILED, f"TPM refused the credential: {exc}"
            ) from exc
        finally:
            self._esys.flush_context(session)
        return bytes(secret)

    def extend(self, pcr: int, data: bytes) -> None:
        """TPM2_PCR_Event: extend ``data``'s digest into PCR ``pcr`` in every bank."""
        with _device(f"extend PCR {pcr}"):
            self._esys.pcr_event(ESYS_TR.parse(f"pcr{pcr}"), data)

    def read_pcrs(self, selection: Mapping[str, Sequence[int]]) -> dict[str, dict[int, bytes]]:
        out: dict[str, dict[int, bytes]] = {}
        for bank, indices in selection.items():
            wanted = sorted(set(indices))
            for start in range(0, len(wanted), _PCR_READ_MAX):
                chunk = wanted[start : start + _PCR_READ_MAX]
                sel = TPML_PCR_SELECTION.parse(f"{bank}:{','.join(map(str, chunk))}")
                with _device("read PCRs"):
                    _counter, _sel, digests = self._esys.pcr_read(sel)
                values = [bytes(d) for d in digests]
                if len(values) != len(chunk):
                    raise ProducerError(
                        Reason.CANNOT_PRODUCE, f"this TPM has no {bank} bank for PCRs {chunk}"
                    )
                out.setdefault(bank, {}).update(zip(chunk, values, strict=True))
        return out

    def quote(
        self,
        qualifying_data: bytes,
        selection: Mapping[str, Sequence[int]],
        *,
        ak: ESYS_TR | None = None,
    ) -> Quote:
        """TPM2_Quote over ``selection`` (``{"sha256": [0, 7]}``) with the AK.

        The PCR values are read before and after; if a PCR changed in between, quote again.
        """
        key = self.ak if ak is None else ak
        spec = "+".join(
            f"{bank}:{','.join(map(str, sorted(set(i))))}" for bank, i in selection.items()
        )
        for _ in range(3):
            before = self.read_pcrs(selection)
            with _device("quote"):
                attest, signature = self._esys.quote(
                    key, TPML_PCR_SELECTION.parse(spec), qualifying_data
                )
            if self.read_pcrs(selection) == before:
                return Quote(
                    ak_public=self.public(key),
                    attest=bytes(attest),
                    signature=bytes(signature.marshal()),
                    pcrs=before,
                )
        raise ProducerError(Reason.DEVICE_ERROR, "PCRs keep changing while quoting; try later")

    def evidence(
        self,
        *,
        provider_key: bytes,
        nonce: bytes,
        terms_hash: bytes,
        selection: Mapping[str, Sequence[int]],
    ) -> Evidence:
        """A fresh quote bound to this negotiation, as ``tpm-quote/v1`` evidence."""
        quote = self.quote(tpm_qualifying_data(provider_key, nonce, terms_hash), selection)
        return tpm_evidence(
            ak_public=quote.ak_public,
            quote=quote.attest,
            signature=quote.signature,
            pcrs=quote.pcrs,
        )


def ak_template(alg: str = "rsa2048:rsassa-sha256:null") -> TPM2B_PUBLIC:
    """A restricted signing key template in tpm2-tools syntax, e.g. ``ecc256:ecdsa-sha256:null``."""
    return TPM2B_PUBLIC.parse(alg, objectAttributes=_AK_ATTRS, nameAlg="sha256")
