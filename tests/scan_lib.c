/* scan_lib.c: the dlopen'ed library of scan_cases.c: a slot in its .bss and one in its
 * thread-local storage (dynamic TLS: the block that holds it is allocated on first use). */
void *lib_slot;
__thread void *lib_tls_slot;

void lib_set(void *p) { lib_slot = p; }
void lib_set_tls(void *p) { lib_tls_slot = p; }
