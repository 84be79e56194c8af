"""HTTP plumbing that knows OpenAI's API only by its error shape (service/openai/errors.py): protocol.py
guards connections (header limits, slow clients, the shutdown's close), body.py reads a request body within its
limits and decodes it (json_depth.py measures its nesting first, surrogates.py names a lone surrogate's field),
middleware.py answers errors, checks API keys (auth.py) and counts requests, cors.py serves browsers,
request_id.py and traceresponse.py give each answer its X-Request-Id and traceresponse headers. Besides config/,
it may import openai/errors.py and nothing else of service/; no module of openai/ imports it."""
