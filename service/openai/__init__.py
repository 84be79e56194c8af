"""OpenAI's API as this server speaks it, with no HTTP plumbing in it: schemas/ holds the request and response
bodies (msgspec structs), errors.py the error object and the statuses engine errors map to, params.py turns
sampling fields into SamplingParams and compiles response_format and guided_* into their grammar,
chat_bounds.py bounds what a chat may hold and its least length before it is rendered, prompts.py tokenizes and
checks prompts, tools.py, tool_prompt.py and tool_calls.py check, render and parse tools, formats.py (with
logprobs.py) writes engine outputs as responses and stream chunks. It imports nothing else of service/: the
routes, the bridge to the engine and the plumbing build on it."""
