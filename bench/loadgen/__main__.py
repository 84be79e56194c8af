"""`python -m bench.loadgen ...` is `pagedserve bench ...`."""

import sys

from service.cli import main

sys.exit(main(["bench", *sys.argv[1:]]))
