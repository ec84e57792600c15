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
# modules mmleak.py loads from its own directory (report's exports)
MODULES = mmleak_export.py
# where the objects (and their -MMD dependency files) and the two libraries go
B   ?= build
OUT ?= .

all: $(OUT)/mmleak.so $(OUT)/mmleak-tools.so

# mmleak.so: mmleak.c, the interposed entry points, and the tracer's internals in tracer/
# (tracer/internal.h lists them and what each owns).
TRACER_SRCS = mmleak.c $(sort $(wildcard tracer/*.c))
# mmleak-tools.so: never preloaded; mmleak.py loads it with ctypes, from beside mmleak.so.
TOOLS_SRCS = tools/shrink.c tools/inject.c
TRACER_OBJS = $(TRACER_SRCS:%.c=$(B)/%.o)
TOOLS_OBJS = $(TOOLS_SRCS:%.c=$(B)/%.o)

$(B)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_LIB) $(CFLAGS) -MMD -MP -c -o $@ $<

$(OUT)/mmleak.so: $(TRACER_OBJS)
	$(CC) $(CFLAGS_LIB) $(CFLAGS) -shared -Wl,-z,defs -o $@ $(TRACER_OBJS) -ldl -lpthread $(LDFLAGS)

$(OUT)/mmleak-tools.so: $(TOOLS_OBJS)
	$(CC) $(CFLAGS_LIB) $(CFLAGS) -shared -Wl,-z,defs -o $@ $(TOOLS_OBJS) $(LDFLAGS)

-include $(TRACER_OBJS:.o=.d) $(TOOLS_OBJS:.o=.d)

debug:
	@mkdir -p build/debug
	$(MAKE) B=build/debug/obj OUT=build/debug OPT="-O0 -g3" all

check: all
	$(PYTHON) -m pytest -q tests

bench: all
	$(PYTHON) bench/run.py

demo: all
	$(PYTHON) tests/demo.py

install: all
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(BINDIR)
	install -m 0644 mmleak.so $(DESTDIR)$(LIBDIR)/mmleak.so
	install -m 0644 mmleak-tools.so $(DESTDIR)$(LIBDIR)/mmleak-tools.so
	for s in $(SCRIPTS); do [ -f $$s ] && install -m 0755 $$s $(DESTDIR)$(BINDIR)/$$s; done; true
	install -m 0644 $(MODULES) $(DESTDIR)$(BINDIR)/

uninstall:
	rm -f $(DESTDIR)$(LIBDIR)/mmleak.so $(DESTDIR)$(LIBDIR)/mmleak-tools.so
	-rmdir $(DESTDIR)$(LIBDIR)
	for s in $(SCRIPTS) $(MODULES); do rm -f $(DESTDIR)$(BINDIR)/$$s; done

clean:
	rm -rf mmleak.so mmleak-tools.so build tests/bin bench/out demo __pycache__ tests/__pycache__

.PHONY: all check bench demo debug install uninstall clean
