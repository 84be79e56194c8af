"""HTTP plumbing that knows OpenAI's API only by its error shape (service/openai/errors.py): protocol.py
guards connections (header limits, slow clients, the shutdown's close), body.py reads a request body within its
limits and decodes it (surrogates.py names a lone surrogate's field), middleware.py holds the middlewares
(errors, the protocol's refusals, API keys with auth.py, request counting, CORS), ids.py gives each answer its
X-Request-Id and traceresponse headers. Besides config/, it may import openai/errors.py and nothing else of
service/; no module of openai/ imports it."""
