import NIOCore
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
    /// Larger request messages get RESOURCE_EXHAUSTED before they are buffered. A method's own
    /// limit (`MethodDescriptor.maxRequestBytes`, from the contracts) lowers it for that method:
    /// the limit is `min(this, the method's)`, applied from the request headers on.
    public var maxReceiveMessageSize: Int = 4 * 1024 * 1024
    /// Initial flow-control window per stream (SETTINGS_INITIAL_WINDOW_SIZE): what a client may
    /// send on a stream before the server reads it. Half of it is the line between small and
    /// large messages: a message within half the window (nghttp2 reopens a window once half of it
    /// is consumed) always arrives whole and is simply held; a larger one must be admitted
    /// against the budgets below, and its bytes are released as they arrive. 64 KiB lets a 5 MiB
    /// upload flow at full speed on a LAN (a window update every 32 KiB) while each stream holds
    /// at most 64 KiB unread.
    public var initialWindowSize: Int = 64 * 1024
    /// The connection's flow-control window. nil: 2 × `maxConcurrentStreams` × `initialWindowSize`
    /// (12.5 MiB at the defaults), the least that lets an admitted message always progress while
    /// every other stream holds a full window unread (nghttp2 reopens the connection window only
    /// once half of it is consumed). It does not bound memory: each stream's window does (bytes
    /// not yet consumed) and the budgets (bytes consumed but not handed over).
    public var connectionWindowSize: Int?
    /// Bytes of large request messages one connection may hold at once, counted by declared
    /// length when a message's prefix arrives, until its call ends (unary, server streaming: the
    /// handler holds the bytes until then) or its handler reads it (client/bidi streaming). Past
    /// it, further large messages of the connection wait with their windows closed (backpressure;
    /// a connection with nothing admitted still admits any one message). Default: the default
    /// message limit + 64 KiB, one largest message at a time.
    public var maxBufferedRequestBytesPerConnection: Int = 4 * 1024 * 1024 + 64 * 1024
    /// Bytes of large request messages (and of plain-HTTP bodies past `initialWindowSize`) the
    /// whole process may hold at once. Past it a large message is refused from its prefix with
    /// RESOURCE_EXHAUSTED, a `google.rpc.RetryInfo` detail and `retry-after: 1` (a plain-HTTP
    /// body with 429). 32 MiB: six 5 MiB uploads or thirty 1 MiB avatars in flight at once, while
    /// a flood of large requests cannot push a process past a few tens of MiB (windows of
    /// waiting streams add at most `initialWindowSize` each). Shared by every server of the
    /// process; each compares the shared total with its own setting.
    public var maxBufferedRequestBytesPerProcess: Int = 32 * 1024 * 1024
    /// The counter behind `maxBufferedRequestBytesPerProcess` (tests give a server its own).
    var requestBudget = RequestBudget.process
    /// Bytes a streaming handler may queue per stream before `write` waits for the client.
    public var maxBufferedResponseBytes: Int = 256 * 1024
    /// How long in-flight calls may run after a graceful shutdown starts.
    public var shutdownGracePeriod: Duration = .seconds(10)
    /// Event loop threads; defaults to one per core.
    public var threads: Int = System.coreCount
    public var interceptors: [any ServerInterceptor] = []
    /// Sees every gRPC call end and every connection open and close (metrics, access log).
    public var observer: (any ServerCallObserver)?
    /// Serves requests that are not `application/grpc` (the gateway's JSON and pages).
    public var httpHandler: (any HTTPHandler)?
    /// Also accept HTTP/1.1 on the same port (connections are told apart by their first bytes).
    public var acceptHTTP1 = false

    // MARK: Connection management (gRPC proposals A8 and A9 describe the same settings)

    /// A connection that has not sent complete request headers this long after it was accepted
    /// (TLS handshake, HTTP/2 preface, first HEADERS, or an HTTP/1.1 request head) is closed:
    /// slow or silent clients (slowloris) cannot hold sockets. 20 s: several round trips on the
    /// slowest mobile link, far more than any real client needs. nil: never.
    public var firstRequestTimeout: Duration? = .seconds(20)
    /// HTTP/2: after this long without reading anything from the client, the server sends a PING.
    /// 30 s keeps an idle connection (a quiet notification stream) alive through NATs and proxies
    /// that drop flows idle for 60 s, for one 17-byte frame each way. nil: no PINGs.
    public var keepaliveTime: Duration? = .seconds(30)
    /// HTTP/2: a PING unanswered (nothing read at all) this long closes the connection: the peer
    /// is gone. 20 s, gRPC's default.
    public var keepaliveTimeout: Duration = .seconds(20)
    /// HTTP/2: a connection with no open stream for this long gets GOAWAY and is closed
    /// (noticed within a quarter of it). 5 min: clients that come back within minutes reuse their
    /// connection, forgotten ones stop costing a socket and a session. nil: never.
    public var maxConnectionIdle: Duration? = .seconds(300)
    /// HTTP/2: a connection this old (±10% jitter, so connections made together do not all end
    /// together) gets a graceful GOAWAY: calls in progress finish, new ones go to a new
    /// connection (spreads long-lived clients over restarted or added instances). 1 h. nil: never.
    public var maxConnectionAge: Duration? = .seconds(3600)
    /// After that GOAWAY, calls still running get this long before the connection is closed.
    /// 5 min: every unary call (30 s deadline at most) finishes; streams (notifications, game
    /// queues) are cut and reconnect, naming the last item they saw.
    public var maxConnectionAgeGrace: Duration = .seconds(300)
    /// HTTP/1.1: a keep-alive connection with no request in progress for this long is closed
    /// (also a request whose head or body stalls that long). 60 s, as common proxies do.
    public var http1IdleTimeout: Duration? = .seconds(60)
    /// TCP keepalive on accepted connections: probes after this long without traffic, every
    /// 10 s, 3 unanswered close the socket. It finds a peer that vanished without a FIN (a phone
    /// that lost its network) on connections that carry nothing for long, such as an HTTP/1.1
    /// browser stream (HTTP/2 connections also PING, above). nil: the kernel's default (off).
    public var tcpKeepaliveIdle: Duration? = .seconds(60)
    /// Open connections per server (sockets, whatever protocol, including those still in TLS or
    /// protocol sniffing). New ones past it are closed at once (logged at most every 10 s).
    /// 10,000: well under the default file-descriptor limits raised for servers (the process
    /// needs some for itself, its database and its upstreams), and ~30 KiB each at most idle.
    public var maxConnections: Int = 10_000

    public init(host: String = "127.0.0.1", port: Int = 0, tls: TLSConfiguration? = nil) {
        self.host = host
        self.port = port
        self.tls = tls
    }
}
