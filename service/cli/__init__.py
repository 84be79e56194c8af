"""The `pagedserve` command: launch.py is the console script (the backends' process-wide defaults, set before
NumPy loads), commands.py names the subcommands and imports each only to run it, generate.py is `pagedserve
generate` (one prompt, offline); `pagedserve serve` is service/app/server.py and `pagedserve bench` the load
generator. It may import app/ and config/; nothing of ours imports it but `python -m service`."""
