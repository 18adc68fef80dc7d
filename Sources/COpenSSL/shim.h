#ifndef COPENSSL_SHIM_H
#define COPENSSL_SHIM_H
/* OpenSSL 3 (Debian: libssl-dev). TLS, Ed25519, scrypt, random. */
#include <openssl/ssl.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <openssl/kdf.h>
#include <openssl/crypto.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/bio.h>
#include <openssl/sha.h>
#include <openssl/hmac.h>

/* Macros Swift cannot import. */
static inline long copenssl_set_min_proto(SSL_CTX *ctx, int v) { return SSL_CTX_set_min_proto_version(ctx, v); }
static inline long copenssl_set_mode(SSL *ssl, long mode) { return SSL_set_mode(ssl, mode); }
static inline int copenssl_bio_pending(BIO *b) { return (int)BIO_ctrl_pending(b); }
#endif
