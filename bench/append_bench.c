/* What a flush of mmleak.so costs the kernel: append TOTAL_MB of text to a new file in
 * pwrite()s of CHUNK_KB, as a busy thread's flushes do, either plainly or after reserving
 * each chunk's range with fallocate(FALLOC_FL_KEEP_SIZE) (tracer/threadfile.c: prealloc).
 * Prints the CPU time (user + system) per byte and per 33 bytes, the average size of an event
 * line at MMLEAK_DEPTH=1.
 *
 *   append_bench DIR CHUNK_KB TOTAL_MB plain|reserve
 *
 * The file is created in DIR (the file system under test) and deleted at the end; the buffer
 * written is prefaulted, so what is measured is the write path alone.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

static double cpu_s(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

int main(int argc, char **argv)
{
    if (argc != 5 || (strcmp(argv[4], "plain") && strcmp(argv[4], "reserve"))) {
        fprintf(stderr, "usage: append_bench DIR CHUNK_KB TOTAL_MB plain|reserve\n");
        return 2;
    }
    size_t chunk = (size_t)atol(argv[2]) << 10, total = (size_t)atol(argv[3]) << 20;
    int reserve = !strcmp(argv[4], "reserve");
    if (!chunk || total < chunk) {
        fprintf(stderr, "append_bench: CHUNK_KB and TOTAL_MB must be positive, CHUNK <= TOTAL\n");
        return 2;
    }
    char *buf = mmap(NULL, chunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                     -1, 0);
    if (buf == MAP_FAILED)
        return perror("mmap"), 1;
    for (size_t i = 0; i < chunk; i++)
        buf[i] = (i % 33 == 32) ? '\n' : "0123456789abcdef"[i % 16];
    char path[4096];
    snprintf(path, sizeof path, "%s/append_bench.%d", argv[1], (int)getpid());
    int fd = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
    if (fd < 0)
        return fprintf(stderr, "append_bench: %s: %s\n", path, strerror(errno)), 1;
    int failed_reserve = 0;
    double t0 = cpu_s();
    for (size_t off = 0; off < total; off += chunk) {
        if (reserve && fallocate(fd, FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)chunk))
            failed_reserve = errno;
        if (pwrite(fd, buf, chunk, (off_t)off) != (ssize_t)chunk) {
            fprintf(stderr, "append_bench: write: %s\n", strerror(errno));
            unlink(path);
            return 1;
        }
    }
    double t1 = cpu_s();
    close(fd);
    unlink(path);
    printf("append chunk_kb=%zu total_mb=%zu mode=%s cpu_s=%.4f ns_per_byte=%.4f "
           "ns_per_33B=%.2f%s%s\n", chunk >> 10, total >> 20, argv[4], t1 - t0,
           (t1 - t0) * 1e9 / (double)total, (t1 - t0) * 1e9 / (double)total * 33,
           failed_reserve ? " fallocate_failed=" : "", failed_reserve ? strerror(failed_reserve) : "");
    return 0;
}
