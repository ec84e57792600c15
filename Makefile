# mmleak: `make` builds mmleak.so (the tracer, preloaded or attached) and mmleak-tools.so (the
# compiled shrinker and the ptrace injector, which only mmleak.py loads); `make check` runs the
# tests; `make demo` the whole job on a bundled leaky program; `make bench` the benchmarks;
# `make debug` both libraries unoptimised, in build/debug/; `make man` the manual pages (from
# docs/, into build/man/); `make install` all of it; `make deb` the Debian package (debian/).
# Nothing to configure.  CFLAGS, CPPFLAGS and LDFLAGS are added to the build's own (the
# package passes dpkg-buildflags' hardening flags through them).
PYTHON  ?= /usr/bin/python3
CC      ?= cc
CXX     ?= c++
PREFIX  ?= /usr/local
DESTDIR ?=
OPT     ?= -O2 -g
# -fexceptions: a C++ exception thrown by the real operator new may unwind through our frame.
# -fdata-sections with mmleak.so's --sort-section=alignment (below): its .bss holds 3.4 MB of
# tables (the memo's, the rule cache, the sequence table...) and about 150 small variables; in
# the files' order each table put its neighbours on pages of their own, and a start touched
# about 20 of them, a page fault each.  Sorted by alignment, the tables (64-byte aligned) come
# first and the small variables share a few pages.  The code's layout does not change.
CFLAGS_LIB = -std=gnu11 -Wall -Wextra -Werror -fPIC -fvisibility=hidden -fexceptions \
             -fno-omit-frame-pointer -fdata-sections $(OPT)
# where `make install` puts things (the Debian package: debian/rules): the two libraries in
# LIBDIR; the scripts and their package in SHAREDIR, a private directory; the commands, without
# .py, as links to the scripts in BINDIR (mmleak, mmleak-panda) and SBINDIR (mmleak-install);
# the manual pages in MANDIR; the program-side API header in INCLUDEDIR
LIBDIR   = $(PREFIX)/lib/mmleak
SHAREDIR = $(PREFIX)/share/mmleak
BINDIR   = $(PREFIX)/bin
SBINDIR  = $(PREFIX)/sbin
MANDIR   = $(PREFIX)/share/man
INCLUDEDIR = $(PREFIX)/include
SCRIPTS = mmleak.py mmleak-panda.py mmleak-install.py
# the Python package the scripts import (standard library only), installed beside them
PACKAGE = $(wildcard mmleaklib/*.py)
# the header of the program-side API, if the tree has it
HEADERS = $(wildcard include/*.h)
# where the objects (and their -MMD dependency files) and the two libraries go
B   ?= build
OUT ?= .

all: $(OUT)/mmleak.so $(OUT)/mmleak-tools.so $(OUT)/mmleak-scan

# mmleak.so: mmleak.c, the interposed entry points, and the tracer's internals in tracer/
# (tracer/internal.h lists them and what each owns).
TRACER_SRCS = mmleak.c $(sort $(wildcard tracer/*.c))
# mmleak-tools.so: never preloaded; mmleak.py loads it with ctypes, from beside mmleak.so.
TOOLS_SRCS = $(filter-out tools/scan_main.c,$(sort $(wildcard tools/*.c)))
# mmleak-scan: the reachability scanner the tracer starts at a process's exit (beside mmleak.so):
# the scan's files, tools/scan*.c (tools/scan.c lists them), with scan_main.c
SCAN_SRCS = $(sort $(wildcard tools/scan*.c))
SCAN_OBJS = $(SCAN_SRCS:%.c=$(B)/%.o)
TRACER_OBJS = $(TRACER_SRCS:%.c=$(B)/%.o)
# mmleak.so carries a second copy of the scan (without scan_main.c), built with
# tools/scan_inproc.h, for the scan at exit of a process left with one thread, in a child
# that shares its memory (tracer/scanhere.c): no mmleak-scan started there.
SCAN_INPROC_OBJS = $(filter-out %/scan_main.o,$(SCAN_SRCS:%.c=$(B)/inproc/%.o))
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
	$(CC) $(CFLAGS_LIB) -I$(GEN) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c -o $@ $<

$(B)/inproc/%.o: %.c tools/scan_inproc.h | $(GEN)/facts.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_LIB) -include tools/scan_inproc.h -I$(GEN) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c -o $@ $<

$(OUT)/mmleak.so: $(TRACER_OBJS) $(SCAN_INPROC_OBJS)
	$(CC) $(CFLAGS_LIB) $(CFLAGS) -shared -Wl,-z,defs -Wl,--sort-section=alignment -o $@ \
	    $(TRACER_OBJS) $(SCAN_INPROC_OBJS) -ldl -lpthread $(LDFLAGS)

$(OUT)/mmleak-tools.so: $(TOOLS_OBJS)
	$(CC) $(CFLAGS_LIB) $(CFLAGS) -shared -Wl,-z,defs -o $@ $(TOOLS_OBJS) $(LDFLAGS)

# mmleak-scan starts at every traced process's exit, which waits for it: it is linked as a
# static PIE (SCAN_LINK) when the C library allows it (libc.a: Debian's libc6-dev has it), so
# that no loader maps and relocates libc.so.6 at every exit (docs/performance-heap.rst,
# "Start-up with the scan"); otherwise, or with SCAN_LINK= , dynamically.
SCAN_LINK ?= -static-pie
$(OUT)/mmleak-scan: $(SCAN_OBJS)
	$(if $(SCAN_LINK),$(CC) $(CFLAGS_LIB) $(CFLAGS) $(SCAN_LINK) -o $@ $(SCAN_OBJS) -lpthread \
	    $(LDFLAGS) 2>/dev/null ||) $(CC) $(CFLAGS_LIB) $(CFLAGS) -o $@ $(SCAN_OBJS) -lpthread $(LDFLAGS)

-include $(TRACER_OBJS:.o=.d) $(TOOLS_OBJS:.o=.d) $(B)/tools/scan_main.d $(SCAN_INPROC_OBJS:.o=.d)

debug:
	@mkdir -p build/debug
	$(MAKE) B=build/debug/obj OUT=build/debug OPT="-O0 -g3" all

# The tests run on JOBS workers (pytest-xdist, Debian's python3-pytest-xdist: -n auto, one a
# core) when xdist is there, each module on one worker, the box's modules together
# (--dist loadgroup: one group a module, tests/conftest.py); without xdist, or with JOBS=1, in
# one process, one after the other (docs/testing.rst).
JOBS ?= auto
XDIST = $(if $(filter-out 1,$(JOBS)),$(if $(shell $(PYTHON) -c 'import xdist' 2>/dev/null && \
	  echo y),-n $(JOBS) --dist loadgroup))
# PYTHONDONTWRITEBYTECODE unset: the tests start mmleak.py and the other scripts thousands of
# times, and each start would otherwise compile mmleaklib afresh (__pycache__ is ignored by
# git and left out of make deb; make clean removes it).
check: all
	$(if $(XDIST),,@echo "make check: no pytest-xdist for $(PYTHON) (or JOBS=1): the tests run one at a time")
	env -u PYTHONDONTWRITEBYTECODE $(PYTHON) -m pytest -q $(XDIST) tests

bench: all
	$(PYTHON) bench/run.py
	$(PYTHON) bench/live.py
	$(PYTHON) bench/scan.py

demo: all
	$(PYTHON) tests/demo.py

# The manual pages, from docs/ (docs/man.py: docutils' manual-page writer, what rst2man runs,
# with the option table made afresh from mmleaklib/facts.py and the installed commands' names):
# one per command, the dump format, the environment, the reference pages.  The architecture
# and testing pages are about the source tree: not installed.
MAN_SRCS = $(filter-out docs/architecture.rst docs/testing.rst,$(sort $(wildcard docs/*.rst)))
MAN = $(B)/man

man: $(MAN)/.stamp

$(MAN)/.stamp: $(MAN_SRCS) docs/man.py mmleaklib/facts.py mmleaklib/layout.py
	rm -rf $(MAN)
	$(PYTHON) docs/man.py $(MAN) $(MAN_SRCS)
	touch $@

# The libraries go to LIBDIR, the scripts and their package together to SHAREDIR (a script
# finds the package beside itself), with LIBDIR written into the installed
# mmleaklib/layout.py (how the commands find the libraries); BINDIR and SBINDIR get a
# relative symbolic link to each script, named without .py.
install: all man
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(SHAREDIR)/mmleaklib $(DESTDIR)$(BINDIR) \
	    $(DESTDIR)$(SBINDIR)
	install -m 0644 mmleak.so mmleak-tools.so $(DESTDIR)$(LIBDIR)/
	install -m 0755 mmleak-scan $(DESTDIR)$(LIBDIR)/
	install -m 0644 $(PACKAGE) $(DESTDIR)$(SHAREDIR)/mmleaklib/
	sed 's|^LIBDIR = None .*|LIBDIR = "$(LIBDIR)"|' mmleaklib/layout.py \
	    > $(DESTDIR)$(SHAREDIR)/mmleaklib/layout.py
	grep -q '^LIBDIR = "$(LIBDIR)"$$' $(DESTDIR)$(SHAREDIR)/mmleaklib/layout.py
	install -m 0755 $(SCRIPTS) $(DESTDIR)$(SHAREDIR)/
	ln -sfr $(DESTDIR)$(SHAREDIR)/mmleak.py $(DESTDIR)$(BINDIR)/mmleak
	ln -sfr $(DESTDIR)$(SHAREDIR)/mmleak-panda.py $(DESTDIR)$(BINDIR)/mmleak-panda
	ln -sfr $(DESTDIR)$(SHAREDIR)/mmleak-install.py $(DESTDIR)$(SBINDIR)/mmleak-install
	for f in $(MAN)/*.[1-8]; do s=$${f##*.}; install -d $(DESTDIR)$(MANDIR)/man$$s && \
	    install -m 0644 $$f $(DESTDIR)$(MANDIR)/man$$s/ || exit 1; done
	$(if $(HEADERS),install -d $(DESTDIR)$(INCLUDEDIR))
	$(if $(HEADERS),install -m 0644 $(HEADERS) $(DESTDIR)$(INCLUDEDIR)/)

uninstall:
	rm -f $(DESTDIR)$(LIBDIR)/mmleak.so $(DESTDIR)$(LIBDIR)/mmleak-tools.so \
	    $(DESTDIR)$(LIBDIR)/mmleak-scan
	rm -rf $(DESTDIR)$(SHAREDIR)
	rm -f $(DESTDIR)$(BINDIR)/mmleak $(DESTDIR)$(BINDIR)/mmleak-panda \
	    $(DESTDIR)$(SBINDIR)/mmleak-install
	rm -f $(DESTDIR)$(MANDIR)/man[1-8]/mmleak.[1-8] $(DESTDIR)$(MANDIR)/man[1-8]/mmleak-*.[1-8]
	$(if $(HEADERS),rm -f $(addprefix $(DESTDIR)$(INCLUDEDIR)/,$(notdir $(HEADERS))))
	-rmdir $(DESTDIR)$(LIBDIR)

# The Debian package, from this tree (debian/), built in a copy of it (dpkg-buildpackage writes
# beside the tree it builds): build/deb/mmleak_VERSION_ARCH.deb; then lintian on it, which
# must report no error and no warning (an override would go in debian/mmleak.lintian-overrides
# with its reason in a comment; none is needed).  Needs debhelper, dh-python, dpkg-dev,
# python3-docutils, lintian.
DEB = $(B)/deb

deb:
	rm -rf $(DEB) && mkdir -p $(DEB)/mmleak
	tar -c --exclude=./build --exclude=./.git --exclude=./demo --exclude=./tests/bin \
	    --exclude=./bench/out --exclude='*.so' --exclude='*.o' --exclude=__pycache__ \
	    --exclude=.pytest_cache . | tar -x -C $(DEB)/mmleak
	cd $(DEB)/mmleak && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL dpkg-buildpackage -b -us -uc
	lintian --fail-on error,warning --show-overrides $(DEB)/*.changes

# `make fuzz`: the libFuzzer harnesses of the tools' file readers (tests/fuzz/fuzz_tools.c, one
# binary per entry point, clang with AddressSanitizer and UBSan, in build/fuzz/), each run
# FUZZ_SECONDS from tests/fuzz/seeds/ and tests/fuzz/regress/ (docs/format.rst).
# Not part of `make check`.
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZ_TARGETS = shrink blocks result_blocks merge blocks_merge pick leb
FUZZ_FLAGS   = -std=gnu11 -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined \
               -fno-sanitize-recover=undefined -I$(GEN)
FUZZ_OBJS    = $(TOOLS_SRCS:%.c=build/fuzz/obj/%.o)
# the harness's entry point: the index of the target's name ($*) in FUZZ_TARGETS
FUZZ_TARGET  = -DFUZZ_TARGET=$$(n=0; for t in $(FUZZ_TARGETS); do [ $$t = $* ] && echo $$n; n=$$((n+1)); done)
build/fuzz/obj/%.o: %.c | $(GEN)/facts.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -c -o $@ $<
build/fuzz/fuzz-%: tests/fuzz/fuzz_tools.c $(FUZZ_OBJS)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer \
	    $(FUZZ_TARGET) \
	    -Wl,--wrap=mmap,--wrap=munmap -o $@ $< $(FUZZ_OBJS)
.SECONDARY: $(FUZZ_OBJS)
# the same harnesses over readers built to read 61 bytes at a time with lines of at most 600
# bytes (mmleaklib keeps 1 MiB): the chunk boundaries and the lines too long, from small inputs
FUZZ_SMALL = shrink merge pick
FUZZ_SMALL_OBJS = $(TOOLS_SRCS:%.c=build/fuzz/small/%.o)
build/fuzz/small/gen/facts.h: $(GEN)/facts.h
	@mkdir -p $(dir $@)
	sed 's/^#define MMLEAK_LINE_MAX .*/#define MMLEAK_LINE_MAX 600/' $< > $@
build/fuzz/small/%.o: %.c build/fuzz/small/gen/facts.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS:-I$(GEN)=-Ibuild/fuzz/small/gen) -DREAD_CHUNK='((size_t)61)' \
	    -fsanitize=fuzzer-no-link -c -o $@ $<
build/fuzz/fuzz-small-%: tests/fuzz/fuzz_tools.c $(FUZZ_SMALL_OBJS)
	$(FUZZ_CC) $(FUZZ_FLAGS:-I$(GEN)=-Ibuild/fuzz/small/gen) -fsanitize=fuzzer \
	    $(FUZZ_TARGET) \
	    -Wl,--wrap=mmap,--wrap=munmap -o $@ $< $(FUZZ_SMALL_OBJS)
.SECONDARY: $(FUZZ_SMALL_OBJS)
fuzz-build: $(FUZZ_TARGETS:%=build/fuzz/fuzz-%) $(FUZZ_SMALL:%=build/fuzz/fuzz-small-%)
fuzz: fuzz-build
	@for t in $(FUZZ_TARGETS) $(FUZZ_SMALL:%=small-%); do mkdir -p build/fuzz/corpus/$$t && \
	    echo "fuzz-$$t: $(FUZZ_SECONDS) s" && \
	    build/fuzz/fuzz-$$t -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -timeout=10 \
	        -dict=tests/fuzz/dump.dict \
	        -artifact_prefix=build/fuzz/ build/fuzz/corpus/$$t tests/fuzz/seeds \
	        tests/fuzz/regress 2>build/fuzz/$$t.log || { tail -40 build/fuzz/$$t.log; exit 1; }; \
	    tail -1 build/fuzz/$$t.log; done

clean:
	rm -rf mmleak.so mmleak-tools.so mmleak-scan build tests/bin bench/out demo __pycache__ tests/__pycache__ mmleaklib/__pycache__

.PHONY: all check bench demo debug man install uninstall deb clean fuzz fuzz-build
