#ifndef CNGHTTP2MEMORY_H
#define CNGHTTP2MEMORY_H
#include <nghttp2/nghttp2.h>

/* The allocator every nghttp2 session of this process uses (nghttp2_session_*_new3): blocks of
 * up to 4 KiB come from per-thread free lists by size class (powers of two from 32 bytes), kept
 * within a cap per class, so the dozen allocations nghttp2 makes for each call (its stream
 * objects, the outbound frames, the copied header arrays, the decoded header values) skip
 * malloc and free; larger blocks go to malloc. A session is used on one thread (its
 * connection's event loop), but a block may be freed on any thread: it then joins that thread's
 * lists. A thread's lists are given back to malloc when it exits. */
nghttp2_mem *rpc_nghttp2_memory(void);

/* Blocks the calling thread's lists hold now, over all classes (tests). */
unsigned rpc_nghttp2_memory_cached(void);

/* Gives the calling thread's cached blocks back to malloc (tests; thread exit does it). */
void rpc_nghttp2_memory_trim(void);

#endif
