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
#include <openssl/x509v3.h>
#include <openssl/bn.h>
#include <openssl/bio.h>
#include <openssl/sha.h>
#include <openssl/hmac.h>

/* Macros Swift cannot import. */
static inline long copenssl_set_min_proto(SSL_CTX *ctx, int v) { return SSL_CTX_set_min_proto_version(ctx, v); }
static inline long copenssl_set_mode(SSL *ssl, long mode) { return SSL_set_mode(ssl, mode); }
static inline int copenssl_bio_pending(BIO *b) { return (int)BIO_ctrl_pending(b); }

/* ---- RPCTLS helpers: macros and C callbacks Swift cannot import or express. ---- */

/* SSL_set_tlsext_host_name is a macro over SSL_ctrl: sets SNI on a client SSL. */
static inline int copenssl_set_tlsext_host_name(SSL *ssl, const char *name) {
    return (int)SSL_set_tlsext_host_name(ssl, name);
}

/* An empty memory BIO returns v with the retry flag set instead of EOF, so SSL_read/SSL_do_handshake
 * report SSL_ERROR_WANT_READ ("feed me more bytes") rather than a truncated connection. */
static inline void copenssl_bio_set_mem_eof_return(BIO *b, int v) { (void)BIO_set_mem_eof_return(b, v); }

/* Context options every RPCTLS context gets: no renegotiation (so SSL_write never needs to read),
 * no compression (CRIME), and a write buffer that may move between retries (ByteBuffer storage). */
static inline void copenssl_ctx_apply_defaults(SSL_CTX *ctx, int server) {
    uint64_t options = SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION;
    if (server) options |= SSL_OP_CIPHER_SERVER_PREFERENCE;
    SSL_CTX_set_options(ctx, options);
    SSL_CTX_set_mode(ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
}

/* Server ALPN: the list in wire format (length-prefixed names), owned by the Swift configuration
 * object that also owns the SSL_CTX, so it lives exactly as long as the context. */
typedef struct copenssl_alpn_list {
    const unsigned char *protocols;
    unsigned int length;
} copenssl_alpn_list;

/* Server preference: the first protocol in the server's list that the client also offers.
 * No overlap is a fatal no_application_protocol alert (RFC 7301 §3.2). A client that sends no
 * ALPN extension never reaches this callback and proceeds with no protocol. */
static inline int copenssl_alpn_select_cb(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                                          const unsigned char *in, unsigned int inlen, void *arg) {
    (void)ssl;
    const copenssl_alpn_list *list = (const copenssl_alpn_list *)arg;
    unsigned char *selected = NULL;
    unsigned char selected_length = 0;
    if (SSL_select_next_proto(&selected, &selected_length, list->protocols, list->length, in, inlen)
        != OPENSSL_NPN_NEGOTIATED) {
        return SSL_TLSEXT_ERR_ALERT_FATAL;
    }
    *out = selected;
    *outlen = selected_length;
    return SSL_TLSEXT_ERR_OK;
}

static inline void copenssl_ctx_set_alpn_select(SSL_CTX *ctx, const copenssl_alpn_list *list) {
    SSL_CTX_set_alpn_select_cb(ctx, copenssl_alpn_select_cb, (void *)list);
}

/* EVP_EC_gen is a macro over the variadic EVP_PKEY_Q_keygen. */
static inline EVP_PKEY *copenssl_generate_p256_key(void) { return EVP_EC_gen("P-256"); }
#endif
