"""What a published image carries and how it is read back: the OCI registry client
(ociregistry.py) and its logins (registry_auth.py), the SBOM and provenance (attest.py), and
cosign key-based signatures (signature.py). `invoke publish` and `invoke verify` use them."""
