import COpenSSL

/// A TLS failure as the pipeline sees it: what went wrong (``Kind``) and a message a person can act
/// on, built from OpenSSL's error queue and, for certificate problems, the X.509 verify result.
///
/// `OpenSSLHandler` fires it through `errorCaught` and then closes the channel; configuration
/// factories throw it.
public struct TLSError: Error, CustomStringConvertible, Sendable, Hashable {
    public enum Kind: String, Sendable, Hashable {
        /// A certificate, key or trust file could not be loaded, or an option is invalid.
        case configuration
        /// The handshake failed for a reason other than the peer's certificate (no shared
        /// protocol version or cipher, no common ALPN protocol, bytes that are not TLS, …).
        case handshakeFailed
        /// The peer's certificate chain or name did not verify (a client checking a server, or a
        /// server requiring client certificates checking a client).
        case certificateVerificationFailed
        /// The peer refused this side's certificate, or its lack of one: a server that requires
        /// client certificates answered with an alert (`certificate required`, `unknown ca`, `bad
        /// certificate`, …). Under TLS 1.3 a client learns this only after its own handshake has
        /// finished, from the first record the server sends.
        case certificateRejectedByPeer
        /// A record after the handshake was invalid (bad MAC, unexpected message, garbage).
        case protocolError
        /// The connection closed before the handshake finished.
        case closedDuringHandshake
        /// The handshake did not finish within the handler's `handshakeTimeout`.
        case handshakeTimeout
    }

    public let kind: Kind
    public let message: String
    /// For configuration errors: the file that could not be used (so a caller can name the setting
    /// that gave it); nil otherwise.
    public let path: String?

    public init(_ kind: Kind, _ message: String, path: String? = nil) {
        self.kind = kind
        self.message = message
        self.path = path
    }

    public var description: String {
        switch kind {
        case .configuration: "TLS configuration error: \(message)"
        case .handshakeFailed: "TLS handshake failed: \(message)"
        case .certificateVerificationFailed: "TLS certificate verification failed: \(message)"
        case .certificateRejectedByPeer: "TLS certificate rejected by the peer: \(message)"
        case .protocolError: "TLS protocol error: \(message)"
        case .closedDuringHandshake: "TLS connection closed during the handshake: \(message)"
        case .handshakeTimeout: "TLS handshake timed out: \(message)"
        }
    }
}

extension TLSError {
    /// Drains this thread's OpenSSL error queue into one line. The queue is per thread and every
    /// connection on an event loop shares it, so callers clear it before each operation
    /// (`ERR_clear_error`) and drain it right after a failure.
    static func drainOpenSSLErrors() -> String {
        var parts: [String] = []
        while true {
            let code = ERR_get_error()
            if code == 0 { break }
            var buffer = [CChar](repeating: 0, count: 256)
            ERR_error_string_n(code, &buffer, buffer.count)
            parts.append(String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
        }
        return parts.joined(separator: "; ")
    }

    /// A configuration error with OpenSSL's reason appended (when it gave one).
    static func configuration(_ what: String, path: String? = nil) -> TLSError {
        let detail = drainOpenSSLErrors()
        return TLSError(.configuration, detail.isEmpty ? what : "\(what) (\(detail))", path: path)
    }

    /// The alert a peer sent about this side's certificate, read from the front of this thread's
    /// error queue (before it is drained), as a sentence; nil when the failure was something else.
    static func peerCertificateAlert() -> String? {
        let code = ERR_peek_error()
        guard code != 0, ERR_GET_LIB(code) == ERR_LIB_SSL else { return nil }
        switch ERR_GET_REASON(code) {
        case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
            return "the server requires a client certificate and this client presented none"
        case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
            return "the server does not trust the CA that signed this client's certificate (alert unknown_ca)"
        case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE, SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN, SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE:
            return "the server refused this client's certificate (alert bad_certificate or certificate_unknown)"
        case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
            return "the server refused this client's certificate as expired"
        case SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED:
            return "the server refused this client's certificate as revoked"
        default:
            return nil
        }
    }
}
