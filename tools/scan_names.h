/* tools/scan_names.h: the names of a scan's files, mmleak.ID.scan.N and .scan-debug.N
 * (tools/scan_result.c), shared with the tracer's own note of a scan it could not run
 * (tracer/exitscan.c, which links mmleak.so's copy of the scan's files). */
#ifndef MMLEAK_SCAN_NAMES_H
#define MMLEAK_SCAN_NAMES_H

#include <stdint.h>

#define SCAN_NAME_FIRST 64                      /* 1..64, then names nobody can guess */
#define SCAN_NAME_TRIES (SCAN_NAME_FIRST + 8)

/* N of the K-th name (from 0) tried, K < SCAN_NAME_TRIES */
uint64_t scan_name_number(int k);

#endif
