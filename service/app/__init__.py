"""The server's life and wiring: server.py is `pagedserve serve` read top to bottom (configuration, the checks
before the port is taken, the app with its middlewares and routes, the model loaded in the background, the drain
on SIGTERM); assemble.py builds the model stack (files, backend, KV pool, calibrated step cost, then the engine
or the offline LLM), own_thread.py runs the calibration on a thread that ends with it, metrics.py is the
server's Prometheus registry, openapi.py (with openapi_rules.py) the /openapi.json document of what server.py
serves. The top of the server: it may import every other part of service/ but cli/, and only cli/ imports it."""
