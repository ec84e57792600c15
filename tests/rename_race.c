/* tests/test_dumpdir.py: a race, made certain.  mmleak.so renames a rotating thread's staging
 * file (mmleak.ID.N.tail) to the next file's name right after ending the old file with "#end";
 * a compactor may fold the ended file and delete its staging file in between, and another
 * user may then put anything at the old name.  Preloaded before mmleak.so, this renameat()
 * does that to every staging file renamed: deleted, and a FIFO of another user (nobody) put
 * at its name, just before the real rename. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int renameat(int olddir, const char *from, int newdir, const char *to)
{
    static int (*real)(int, const char *, int, const char *);
    if (!real)
        real = (int (*)(int, const char *, int, const char *))dlsym(RTLD_NEXT, "renameat");
    size_t n = strlen(from);
    if (n > 5 && !strcmp(from + n - 5, ".tail") && strstr(from, "mmleak.")) {
        unlinkat(olddir, from, 0);
        if (mkfifoat(olddir, from, 0600) == 0)
            fchownat(olddir, from, 65534, 65534, AT_SYMLINK_NOFOLLOW);
    }
    return real(olddir, from, newdir, to);
}
