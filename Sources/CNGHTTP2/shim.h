#ifndef CNGHTTP2_SHIM_H
#define CNGHTTP2_SHIM_H
/* libnghttp2 (Debian: libnghttp2-dev). HTTP/2 framing, HPACK, flow control. */
#include <nghttp2/nghttp2.h>
#endif
