/*
 * tracer/facts.h: facts the tracer shares with mmleak.py.
 */
#ifndef MMLEAK_FACTS_H
#define MMLEAK_FACTS_H

/* The dump format's version (the "#mmleak N" header); readers accept 1 and 2. */
#define MMLEAK_FORMAT_VERSION 2
/* Frames recorded per allocation at most (MMLEAK_DEPTH's upper bound). */
#define MMLEAK_MAX_DEPTH 64

#endif
