#!/usr/bin/python3
"""mmleak.py: shrink, symbolize and report the dump files written by mmleak.so.

Run `mmleak.py --help`.  The command line is mmleaklib/cli.py, beside this file, and the rest
of mmleak's Python side is the mmleaklib package (standard library only, so it runs wherever
the dumps are copied to)."""
from mmleaklib import interrupt

if __name__ == "__main__":
    interrupt.guard("mmleak.py")        # (first: Ctrl-C at any moment, see interrupt.py)
    from mmleaklib.cli import main
    interrupt.exit(main())
