"""`python -m minivllm ...`: the `minivllm` command (cli.py)."""

import sys

from minivllm.cli import main

sys.exit(main())
