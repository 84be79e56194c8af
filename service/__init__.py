"""The HTTP server, in parts that import downwards only (tests/test_import_rules.py): cli/ (the command) ->
app/ (the server's life) -> routes/ (the handlers) -> generation/ (the bridge to the engine) and http/ (the
plumbing) -> openai/ (the API's shapes and rules) -> config/."""
