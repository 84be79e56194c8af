"""OpenAI-shaped request and response bodies as msgspec Structs."""
