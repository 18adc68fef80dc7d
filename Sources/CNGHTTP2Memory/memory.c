#include "CNGHTTP2Memory.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Each block starts with a 16-byte header (malloc's alignment is kept): its class, or LARGE and
 * its size for a block from malloc. The pointer nghttp2 gets is just past the header; a free
 * block's first word links it into its list. */
enum { HEADER = 16, CLASSES = 8, SMALLEST = 5 /* 32 bytes */, LARGE = 0xFF };
/* Per thread and class, at most this many free blocks are kept (about 0.5 MiB a thread in all;
 * what a burst frees beyond them goes back to malloc). */
static const uint32_t caps[CLASSES] = {256, 256, 256, 256, 128, 128, 32, 32};

typedef struct header {
  size_t cls;
  size_t size; /* LARGE: the size asked for */
} header;

typedef struct block {
  struct block *next;
} block;

typedef struct cache {
  block *head[CLASSES];
  uint32_t count[CLASSES];
  int registered;
} cache;

static __thread cache lists;
static pthread_key_t exit_key;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;

void rpc_nghttp2_memory_trim(void) {
  for (int c = 0; c < CLASSES; ++c) {
    block *b = lists.head[c];
    while (b) {
      block *next = b->next;
      free((char *)b - HEADER);
      b = next;
    }
    lists.head[c] = NULL;
    lists.count[c] = 0;
  }
}

static void thread_exit(void *unused) {
  (void)unused;
  rpc_nghttp2_memory_trim();
}

static void make_exit_key(void) { pthread_key_create(&exit_key, thread_exit); }

unsigned rpc_nghttp2_memory_cached(void) {
  unsigned n = 0;
  for (int c = 0; c < CLASSES; ++c) n += lists.count[c];
  return n;
}

/* The class of a block of `total` bytes (header included): 0 for up to 32 bytes, 1 for 64, ... */
static inline size_t class_of(size_t total) {
  if (total <= (1u << SMALLEST)) return 0;
  return (size_t)(64 - __builtin_clzl(total - 1)) - SMALLEST;
}

static void *mem_malloc(size_t size, void *user) {
  (void)user;
  if (size > (1u << (SMALLEST + CLASSES - 1)) - HEADER) {
    if (size > SIZE_MAX - HEADER) return NULL;
    header *h = malloc(HEADER + size);
    if (!h) return NULL;
    h->cls = LARGE;
    h->size = size;
    return (char *)h + HEADER;
  }
  size_t c = class_of(size + HEADER);
  block *b = lists.head[c];
  if (b) {
    lists.head[c] = b->next;
    lists.count[c]--;
    return b;
  }
  header *h = malloc((size_t)1 << (c + SMALLEST));
  if (!h) return NULL;
  h->cls = c;
  return (char *)h + HEADER;
}

static void mem_free(void *ptr, void *user) {
  (void)user;
  if (!ptr) return;
  header *h = (header *)((char *)ptr - HEADER);
  size_t c = h->cls;
  if (c == LARGE || lists.count[c] >= caps[c]) {
    free(h);
    return;
  }
  if (__builtin_expect(!lists.registered, 0)) {
    /* This thread's lists go back to malloc when it exits. */
    pthread_once(&exit_once, make_exit_key);
    pthread_setspecific(exit_key, &lists);
    lists.registered = 1;
  }
  block *b = ptr;
  b->next = lists.head[c];
  lists.head[c] = b;
  lists.count[c]++;
}

static void *mem_calloc(size_t n, size_t size, void *user) {
  if (size && n > SIZE_MAX / size) return NULL;
  void *p = mem_malloc(n * size, user);
  if (p) memset(p, 0, n * size);
  return p;
}

static void *mem_realloc(void *ptr, size_t size, void *user) {
  if (!ptr) return mem_malloc(size, user);
  if (size == 0) {
    mem_free(ptr, user);
    return NULL;
  }
  header *h = (header *)((char *)ptr - HEADER);
  size_t room = h->cls == LARGE ? h->size : ((size_t)1 << (h->cls + SMALLEST)) - HEADER;
  if (size <= room && h->cls != LARGE) return ptr;
  if (h->cls == LARGE && size > (1u << (SMALLEST + CLASSES - 1)) - HEADER) {
    if (size > SIZE_MAX - HEADER) return NULL;
    header *g = realloc(h, HEADER + size);
    if (!g) return NULL;
    g->size = size;
    return (char *)g + HEADER;
  }
  void *p = mem_malloc(size, user);
  if (!p) return NULL;
  memcpy(p, ptr, room < size ? room : size);
  mem_free(ptr, user);
  return p;
}

static nghttp2_mem memory = {NULL, mem_malloc, mem_free, mem_calloc, mem_realloc};

nghttp2_mem *rpc_nghttp2_memory(void) { return &memory; }
