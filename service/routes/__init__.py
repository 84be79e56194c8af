"""HTTP route handlers, one module per API surface (completions.py, tokens.py, system.py), and what they share:
common.py (the runtime, the model's name, a chat body read and bounded before it is decoded in full or
rendered, a job from a request). A handler reads its request with http/, checks and translates it with openai/
and runs it with generation/; it imports nothing of app/, which registers it."""
