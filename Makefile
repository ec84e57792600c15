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

# Objects go to build/ (with -MMD dependency files beside them).
B = build
TRACER_SRCS = mmleak.c tracer/sites.c tracer/unwind.c tracer/got.c tools/shrink.c tools/inject.c
TRACER_OBJS = $(TRACER_SRCS:%.c=$(B)/%.o)

$(B)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_LIB) $(CFLAGS) -MMD -MP -c -o $@ $<

mmleak.so: $(TRACER_OBJS)
	$(CC) $(CFLAGS_LIB) $(CFLAGS) -shared -Wl,-z,defs -o $@ $(TRACER_OBJS) -ldl -lpthread $(LDFLAGS)

-include $(TRACER_OBJS:.o=.d)

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
	rm -rf mmleak.so $(B) tests/bin bench/out demo __pycache__ tests/__pycache__

.PHONY: all check bench demo install uninstall clean
