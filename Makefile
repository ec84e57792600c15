# mmleak: `make` builds mmleak.so (the tracer, preloaded or attached) and mmleak-tools.so (the
# compiled shrinker and the ptrace injector, which only mmleak.py loads); `make check` runs the
# tests; `make demo` the whole job on a bundled leaky program; `make bench` the benchmarks;
# `make debug` both libraries unoptimised, in build/debug/.  Nothing to configure.
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
# where the objects (and their -MMD dependency files) and the two libraries go
B   ?= build
OUT ?= .

all: $(OUT)/mmleak.so $(OUT)/mmleak-tools.so $(OUT)/mmleak-scan

# mmleak.so: mmleak.c, the interposed entry points, and the tracer's internals in tracer/
# (tracer/internal.h lists them and what each owns).
TRACER_SRCS = mmleak.c $(sort $(wildcard tracer/*.c))
# mmleak-tools.so: never preloaded; mmleak.py loads it with ctypes, from beside mmleak.so.
TOOLS_SRCS = $(filter-out tools/scan_main.c,$(sort $(wildcard tools/*.c)))
# mmleak-scan: the reachability scanner the tracer starts at a process's exit (beside mmleak.so)
SCAN_OBJS = $(B)/tools/scan_main.o $(B)/tools/scan.o $(B)/tools/shrink.o
TRACER_OBJS = $(TRACER_SRCS:%.c=$(B)/%.o)
TOOLS_OBJS = $(TOOLS_SRCS:%.c=$(B)/%.o)

# The facts the C side shares with the Python side (the option table, the runtime objects,
# the wrapper names, the bounds) are written once, in mmleaklib/facts.py: facts.h is made from
# it at build time, never by hand.
GEN = $(B)/gen
$(GEN)/facts.h: mmleaklib/facts.py
	@mkdir -p $(GEN)
	$(PYTHON) -m mmleaklib.facts --c-header > $@.tmp && mv $@.tmp $@

$(B)/%.o: %.c | $(GEN)/facts.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_LIB) -I$(GEN) $(CFLAGS) -MMD -MP -c -o $@ $<

$(OUT)/mmleak.so: $(TRACER_OBJS)
	$(CC) $(CFLAGS_LIB) $(CFLAGS) -shared -Wl,-z,defs -o $@ $(TRACER_OBJS) -ldl -lpthread $(LDFLAGS)

$(OUT)/mmleak-tools.so: $(TOOLS_OBJS)
	$(CC) $(CFLAGS_LIB) $(CFLAGS) -shared -Wl,-z,defs -o $@ $(TOOLS_OBJS) $(LDFLAGS)

$(OUT)/mmleak-scan: $(SCAN_OBJS)
	$(CC) $(CFLAGS_LIB) $(CFLAGS) -o $@ $(SCAN_OBJS) -lpthread $(LDFLAGS)

-include $(TRACER_OBJS:.o=.d) $(TOOLS_OBJS:.o=.d) $(B)/tools/scan_main.d

debug:
	@mkdir -p build/debug
	$(MAKE) B=build/debug/obj OUT=build/debug OPT="-O0 -g3" all

check: all
	$(PYTHON) -m pytest -q tests

bench: all
	$(PYTHON) bench/run.py
	$(PYTHON) bench/scan.py

demo: all
	$(PYTHON) tests/demo.py

# The scripts and their package go together in LIBDIR (a script finds the package beside
# itself); BINDIR gets a relative symbolic link to each script.
install: all
	install -d $(DESTDIR)$(LIBDIR)/mmleaklib $(DESTDIR)$(BINDIR)
	install -m 0644 mmleak.so $(DESTDIR)$(LIBDIR)/mmleak.so
	install -m 0644 mmleak-tools.so $(DESTDIR)$(LIBDIR)/mmleak-tools.so
	install -m 0755 mmleak-scan $(DESTDIR)$(LIBDIR)/mmleak-scan
	install -d $(DESTDIR)$(PREFIX)/include
	install -m 0644 include/mmleak.h $(DESTDIR)$(PREFIX)/include/mmleak.h
	install -m 0644 $(PACKAGE) $(DESTDIR)$(LIBDIR)/mmleaklib/
	for s in $(SCRIPTS); do install -m 0755 $$s $(DESTDIR)$(LIBDIR)/$$s && \
	    ln -sfr $(DESTDIR)$(LIBDIR)/$$s $(DESTDIR)$(BINDIR)/$$s || exit 1; done

uninstall:
	rm -f $(DESTDIR)$(LIBDIR)/mmleak.so $(DESTDIR)$(LIBDIR)/mmleak-tools.so $(DESTDIR)$(LIBDIR)/mmleak-scan
	rm -f $(DESTDIR)$(PREFIX)/include/mmleak.h
	rm -rf $(DESTDIR)$(LIBDIR)/mmleaklib
	for s in $(SCRIPTS); do rm -f $(DESTDIR)$(LIBDIR)/$$s $(DESTDIR)$(BINDIR)/$$s; done
	-rmdir $(DESTDIR)$(LIBDIR)

clean:
	rm -rf mmleak.so mmleak-tools.so mmleak-scan build tests/bin bench/out demo __pycache__ tests/__pycache__ mmleaklib/__pycache__

.PHONY: all check bench demo debug install uninstall clean
