"""`python -m headscope VERB ...`, and so `torchrun --nproc-per-node N -m headscope analyze ...`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
