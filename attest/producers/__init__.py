"""Evidence producers: the I/O side of attestation (a TPM through tpm2-pytss, the SEV-SNP
guest device). Import the module you need: ``attest.producers.tpm`` needs the optional
``tpm2-pytss`` package, ``attest.producers.snp`` does not, so nothing is re-exported here."""
