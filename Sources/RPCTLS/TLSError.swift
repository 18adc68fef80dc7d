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
        /// The peer's certificate chain or name did not verify.
        case certificateVerificationFailed
        /// A record after the handshake was invalid (bad MAC, unexpected message, garbage).
        case protocolError
        /// The connection closed before the handshake finished.
        case closedDuringHandshake
        /// The handshake did not finish within the handler's `handshakeTimeout`.
        case handshakeTimeout
    }

    public let kind: Kind
    public let message: String

    public init(_ kind: Kind, _ message: String) {
        self.kind = kind
        self.message = message
    }

    public var description: String {
        switch kind {
        case .configuration: "TLS configuration error: \(message)"
        case .handshakeFailed: "TLS handshake failed: \(message)"
        case .certificateVerificationFailed: "TLS certificate verification failed: \(message)"
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
    static func configuration(_ what: String) -> TLSError {
        let detail = drainOpenSSLErrors()
        return TLSError(.configuration, detail.isEmpty ? what : "\(what) (\(detail))")
    }
}
