"""The supply chain of a pushed image: what travels with it and who checks it.

SBOM (CycloneDX 1.6), provenance (in-toto, SLSA v1 build predicate), signatures and
attestations through the real ``cosign``, the Sigstore policy-controller ``ClusterImagePolicy``,
the deploy bundle pinned by digest, and promotion by digest through a real copier. Above
``docker`` (it reads pushed digests), below ``ops`` (``select --verify-key`` uses it).
"""
