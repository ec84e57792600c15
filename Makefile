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
# modules mmleak.py loads from its own directory (report's exports)
MODULES = mmleak_export.py

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

install: all
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(BINDIR)
	install -m 0644 mmleak.so $(DESTDIR)$(LIBDIR)/mmleak.so
	for s in $(SCRIPTS); do [ -f $$s ] && install -m 0755 $$s $(DESTDIR)$(BINDIR)/$$s; done; true
	install -m 0644 $(MODULES) $(DESTDIR)$(BINDIR)/

uninstall:
	rm -f $(DESTDIR)$(LIBDIR)/mmleak.so
	-rmdir $(DESTDIR)$(LIBDIR)
	for s in $(SCRIPTS) $(MODULES); do rm -f $(DESTDIR)$(BINDIR)/$$s; done

clean:
	rm -rf mmleak.so tests/bin bench/out demo __pycache__ tests/__pycache__

.PHONY: all check bench demo install uninstall clean
