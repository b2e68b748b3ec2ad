"""The only package that imports Proton: the reactor, the lean data-path endpoints, the
listener (TLS and SASL before Proton), the client-facing router, the broker-facing side,
and the assembly that runs them (``server``). tests/unit/test_layout.py keeps it so, and
checks that every private Proton name used here still exists."""
