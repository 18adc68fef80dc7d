#ifndef CPROTOBUFC_SHIM_H
#define CPROTOBUFC_SHIM_H
/* libprotobuf-c (Debian: libprotobuf-c-dev). Message encoding runtime. */
#include <protobuf-c/protobuf-c.h>
#endif
