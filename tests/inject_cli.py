#!/usr/bin/python3
"""tests/inject_cli.py: call mmleak_inject_call (tools/inject.c) from the command line.

    inject_cli.py MMLEAK_TOOLS_SO PID LIB FUNC|- ARG|- [TIMEOUT_MS]

Prints "result N" (exit 0) or "error CODE MESSAGE" (exit 1).  The binding is mmleaklib's
(native.inject_call): the package beside this file, or in the checkout above it."""
import ctypes
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[1:1] = [HERE, os.path.dirname(HERE)]
from mmleaklib.native import inject_call  # noqa: E402


def main():
    so, pid, lib, func, arg = sys.argv[1:6]
    timeout = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    fn = inject_call(so)
    res = ctypes.c_long(0)
    err = ctypes.create_string_buffer(1024)
    enc = lambda s: None if s == "-" else s.encode()
    rc = fn(int(pid), enc(lib), enc(func), enc(arg), timeout, ctypes.byref(res), err, len(err))
    if rc == 0:
        print("result %d" % res.value)
        return 0
    print("error %d %s" % (rc, err.value.decode(errors="replace")))
    return 1


if __name__ == "__main__":
    sys.exit(main())
