"""HTTP route handlers, one module per API surface."""
