# mmleak: `make` builds mmleak.so; `make check` runs the tests; `make demo` the whole job on a
# bundled leaky program; `make bench` the benchmarks.  Nothing to configure.
PYTHON  ?= /usr/bin/python3
CC      ?= cc
CXX     ?= c++
PREFIX  ?= /usr/local
DESTDIR ?=
OPT     ?= -O2 -g
# -fexceptions: a C++ exception thrown by the real operator new may unwind through our frame.
CFLAGS_LIB = -std=gnu11 -Wall -Wextra -Werror -fPIC -fvisibility=hidden -fexceptions \
             -fno-omit-frame-pointer $(OPT)
LIBDIR  = $(PREFIX)/lib/mmleak
BINDIR  = $(PREFIX)/bin
SCRIPTS = mmleak.py mmleak-panda.py mmleak-install.py
# the Python package the scripts import (standard library only), installed beside them
PACKAGE = $(wildcard mmleaklib/*.py)

all: mmleak.so

# mmleak-sites.c: is a return address the program's code or the runtime's (the default depth);
# mmleak-unwind.c: the stack unwinder (cached DWARF CFI rules), API in mmleak-unwind.h;
# mmleak-got.c: switching the GOT slots of a running process (attach, detach, pause).
# mmleak-shrink.c: the compiled shrinker mmleak.py loads with ctypes (same library, inactive tracer);
# mmleak-inject.c: the ptrace injector of `mmleak.py attach` (same way).
SRCS = mmleak.c mmleak-sites.c mmleak-unwind.c mmleak-got.c mmleak-shrink.c mmleak-inject.c
mmleak.so: $(SRCS) mmleak.h mmleak-unwind.h
	$(CC) $(CFLAGS_LIB) $(CFLAGS) -shared -Wl,-z,defs -o $@ $(SRCS) -ldl -lpthread $(LDFLAGS)

check: all
	$(PYTHON) -m pytest -q tests

bench: all
	$(PYTHON) bench/run.py

demo: all
	$(PYTHON) tests/demo.py

# The scripts and their package go together in LIBDIR (a script finds the package beside
# itself); BINDIR gets a relative symbolic link to each script.
install: all
	install -d $(DESTDIR)$(LIBDIR)/mmleaklib $(DESTDIR)$(BINDIR)
	install -m 0644 mmleak.so $(DESTDIR)$(LIBDIR)/mmleak.so
	install -m 0644 $(PACKAGE) $(DESTDIR)$(LIBDIR)/mmleaklib/
	for s in $(SCRIPTS); do install -m 0755 $$s $(DESTDIR)$(LIBDIR)/$$s && \
	    ln -sfr $(DESTDIR)$(LIBDIR)/$$s $(DESTDIR)$(BINDIR)/$$s || exit 1; done

uninstall:
	rm -f $(DESTDIR)$(LIBDIR)/mmleak.so
	rm -rf $(DESTDIR)$(LIBDIR)/mmleaklib
	for s in $(SCRIPTS); do rm -f $(DESTDIR)$(LIBDIR)/$$s $(DESTDIR)$(BINDIR)/$$s; done
	-rmdir $(DESTDIR)$(LIBDIR)

clean:
	rm -rf mmleak.so tests/bin bench/out demo __pycache__ tests/__pycache__ mmleaklib/__pycache__

.PHONY: all check bench demo install uninstall clean
