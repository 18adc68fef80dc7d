import RPCCore
import RPCTLS

/// How a server listens and what it tolerates. Defaults are safe for a public endpoint.
public struct ServerConfiguration: Sendable {
    public var host: String
    public var port: Int
    /// When set, the listener speaks TLS 1.2/1.3 (ALPN `h2`); otherwise h2c with prior knowledge.
    public var tls: TLSConfiguration?
    /// Sent in SETTINGS. Streams past it are refused by nghttp2: REFUSED_STREAM before the client
    /// acknowledged the SETTINGS, a connection error (GOAWAY PROTOCOL_ERROR) after.
    public var maxConcurrentStreams: Int = 100
    /// Counted in the header callback (RFC 7541 size: name + value + 32 per field).
    public var maxHeaderListSize: Int = 16 * 1024
    /// Larger request messages get RESOURCE_EXHAUSTED before they are buffered.
    public var maxReceiveMessageSize: Int = 4 * 1024 * 1024
    /// Initial flow-control window per stream; the connection window is 4× this.
    public var initialWindowSize: Int = 1024 * 1024
    /// Bytes a streaming handler may queue per stream before `write` waits for the client.
    public var maxBufferedResponseBytes: Int = 256 * 1024
    /// How long in-flight calls may run after a graceful shutdown starts.
    public var shutdownGracePeriod: Duration = .seconds(10)
    /// Event loop threads; defaults to one per core.
    public var threads: Int = System.coreCount
    public var interceptors: [any ServerInterceptor] = []
    /// Serves requests that are not `application/grpc` (the gateway's JSON and pages).
    public var httpHandler: (any HTTPHandler)?
    /// Also accept HTTP/1.1 on the same port (connections are told apart by their first bytes).
    public var acceptHTTP1 = false

    public init(host: String = "127.0.0.1", port: Int = 0, tls: TLSConfiguration? = nil) {
        self.host = host
        self.port = port
        self.tls = tls
    }
}

import NIOCore
