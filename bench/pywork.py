"""Allocation-heavy Python workload for bench/run.py (deterministic: fixed seed).

    python3 bench/pywork.py [N]

Builds a dict of lists of string slices, keeps a table of 2000 live strings of 16-2047
characters that are replaced at random (strings past 512 bytes go to malloc, shorter ones to
Python's own small-object allocator), joins big temporary strings, then sorts and serializes
everything.  Prints a checksum line.
"""
import random
import sys


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 150000
    r = random.Random(12345)
    d = {}
    live = [""] * 2000
    total = 0
    for i in range(n):
        k = "key%d" % r.randrange(n // 4 + 1)
        s = "x" * r.randrange(16, 2048)
        lst = d.get(k)
        if lst is None:
            d[k] = lst = []
        lst.append(s[: r.randrange(1, 64)])
        live[r.randrange(2000)] = s + k
        if i % 1000 == 999:
            total += len(" ".join(live[:500]))
    keys = sorted(d, key=lambda k: (-len(d[k]), k))
    blob = "\n".join("%s=%s" % (k, ",".join(d[k])) for k in keys)
    print(len(d), len(blob), total)


if __name__ == "__main__":
    main()
