/// Fired inbound (`fireUserInboundEventTriggered`) by `OpenSSLHandler` once the TLS handshake has
/// finished, before any decrypted application data reaches the next handler.
///
/// The handler after TLS configures itself from it: an HTTP/2 connection handler checks that
/// `negotiatedProtocol == "h2"`, and a gateway's protocol selector installs HTTP/2 for `"h2"` and
/// HTTP/1.1 for `"http/1.1"` or `nil` (a client that sent no ALPN).
///
/// Because it is an event and not a query, the next handler never has to poll or reach back into
/// the TLS handler; a handler added to the pipeline *after* the handshake can still read
/// `OpenSSLHandler.negotiatedProtocol` through `pipeline.syncOperations.handler(type:)`.
public struct TLSHandshakeCompleted: Sendable, Hashable {
    /// The ALPN protocol both sides agreed on (`"h2"`, `"http/1.1"`, …), or `nil` when the client
    /// offered none or the server configured none.
    public let negotiatedProtocol: String?

    public init(negotiatedProtocol: String?) {
        self.negotiatedProtocol = negotiatedProtocol
    }
}
