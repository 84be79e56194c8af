"""The bridge to the engine, what a request holds while it runs: state.py (the server's phase, the loaded
runtime and the app's keys; EngineLike, the part of the engine the service uses), tokenize.py (the tokenizer
threads: prompt work of any size off the event loop, behind a bounded queue), jobs.py (a request's prompts
submitted to the engine, answered in one body or as Server-Sent Events, and aborted however the handler ends),
pacing.py (one SSE event budget shared by all streams), transcript.py (prompts and outputs logged when
log_prompts is on). It speaks OpenAI through openai/ and imports nothing of the HTTP plumbing or the routes."""
