"""Privacy a participant can check: secure aggregation (the coordinator learns only a round's sum) and
client-level differential privacy (a bound on what the sum, and so the model, reveals of one participant).

Pure Python (no numpy, no ``cryptography``) so the same bytes come out in
CPython and in Pyodide. Secure aggregation: ``x25519`` (RFC 7748 key agreement), ``prg``
(SHAKE-256 expansion and the pairwise channel's encryption), ``shamir``
(threshold sharing over a prime field), ``fixedpoint`` (updates into
Z_{2^64}), ``secagg`` (the protocol's two sides, sans-I/O). Differential privacy:
``dp_settings`` (``settings.privacy.dp``), ``dp_noise`` (clipping and the seeded
Gaussian noise), ``dp_accountant`` (ε at δ over rounds).
"""
