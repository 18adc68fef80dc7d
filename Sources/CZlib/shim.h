#ifndef CZLIB_SHIM_H
#define CZLIB_SHIM_H
/* zlib (Debian: zlib1g-dev). gzip message compression. */
#include <zlib.h>
#endif
