"""river_anyio's adapter for River's cross-language conformance harness.

``python -m river_anyio_tests.conformance`` (run from the checkout's root) speaks the harness's
JSON-RPC contract (River's ``conformance/protocol/protocol.go``) on stdin and stdout, one
request and one response per line, and drives river_anyio through its public API only. The
client runs under asyncio, or under trio when ``RIVER_ANYIO_CONFORMANCE_BACKEND=trio``.
"""
