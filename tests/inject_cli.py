#!/usr/bin/python3
"""tests/inject_cli.py: call mmleak_inject_call (mmleak-inject.c) from the command line.

    inject_cli.py MMLEAK_TOOLS_SO PID LIB FUNC|- ARG|- [TIMEOUT_MS]

Prints "result N" (exit 0) or "error CODE MESSAGE" (exit 1)."""
import ctypes
import sys


def main():
    so, pid, lib, func, arg = sys.argv[1:6]
    timeout = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    dll = ctypes.CDLL(so)
    fn = dll.mmleak_inject_call
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
                   ctypes.POINTER(ctypes.c_long), ctypes.c_char_p, ctypes.c_size_t]
    fn.restype = ctypes.c_int
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
