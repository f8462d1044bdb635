import sys

from ._cli import main

sys.exit(main(prog="python -m sparse_mla_fp8"))
