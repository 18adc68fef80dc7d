import Observability
import RPCTLS
import RPCTransport
import ServiceKit

/// Everything the gateway needs to start. `GatewayConfiguration.from(settings:)`
/// reads the environment variables `docs/gateway.md` lists; tests build one directly.
public struct GatewayConfiguration: Sendable {
    public struct Upstream: Sendable, Hashable {
        public var name: String
        public var host: String
        public var port: Int
        /// With `upstreamTLS`: the name the upstream's certificate must carry, when it is not
        /// `host` (`<SERVICE>_TLS_SERVER_NAME`).
        public var tlsServerName: String?
        public init(name: String, host: String, port: Int, tlsServerName: String? = nil) {
            self.name = name
            self.host = host
            self.port = port
            self.tlsServerName = tlsServerName
        }
    }

    public var host: String
    public var port: Int
    /// The public port's TLS (server side; never mutual: the port is for ordinary clients).
    public var tls: TLSConfiguration?
    /// TLS towards the upstreams (`PEER_TLS_CA`, `PEER_TLS_CERT`/`PEER_TLS_KEY`): verified against
    /// the cluster CA, presenting the gateway's client certificate to services that require one.
    /// nil: h2c.
    public var upstreamTLS: TLSConfiguration?
    /// The same TLS offering HTTP/1.1, for the status page's `GET /metrics` of each upstream.
    public var upstreamScrapeTLS: TLSConfiguration?
    /// Where each service runs, by upstream name (`accounts`, `tasks`, ...).
    public var upstreams: [Upstream]
    /// Upstreams the gateway's overall health ("") requires (`GATEWAY_UPSTREAMS`).
    public var requiredUpstreams: Set<String>
    /// The gateway's own credential (`GATEWAY_TOKEN`), added to every relayed call: services
    /// take such calls as a user's, reaching public and authenticated methods only. The gateway
    /// never holds the service credential.
    public var gatewayToken: String

    /// Largest request message (gRPC) or body (Connect) of any method: RESOURCE_EXHAUSTED (HTTP 429)
    /// past it. Each method's `(common.v1.max_request_bytes)` (64 KiB unless set) applies below
    /// it; 6 MiB lets the largest, a 5 MiB attachment, through.
    public var maxRequestBytes = 6 * 1024 * 1024
    /// Bytes of large requests the gateway holds at once, all connections together
    /// (`ServerConfiguration.maxBufferedRequestBytesPerProcess`): past it, RESOURCE_EXHAUSTED
    /// with a retry hint.
    public var maxBufferedRequestBytes = 32 * 1024 * 1024
    /// Largest response message accepted from an upstream (tasks serves 5 MiB attachments through
    /// GetTeamTaskAttachment, accounts 1 MiB avatars).
    public var maxResponseBytes = 6 * 1024 * 1024
    /// Concurrent streams per client connection (HTTP/2 SETTINGS).
    public var maxConcurrentStreams = 100
    /// Open client connections (`ServerConfiguration.maxConnections`).
    public var maxConnections = 10_000
    /// Connection lifetimes and keepalives from the environment (`GATEWAY_*` or `SERVER_*`).
    public var connection: ServiceHost.ConnectionSettings?
    /// Last word on the server's settings (connection management timeouts...): tests shorten
    /// them here.
    public var adjustServer: @Sendable (inout ServerConfiguration) -> Void = { _ in }
    /// Deadline cap for unary and client-streaming calls, also their deadline when none is set.
    public var maxDeadline: Duration = .seconds(30)
    /// Deadline cap for server-streaming and bidirectional calls.
    public var maxStreamDeadline: Duration = .seconds(3600)
    /// Per-user token bucket (verified user id): calls per second and burst; rate 0 turns it off.
    public var userRate: Double = 50
    public var userBurst: Double = 100
    /// Per-client-address token bucket.
    public var addressRate: Double = 100
    public var addressBurst: Double = 200
    /// Least time between two fetches of accounts' token keys (a token naming an unknown key id
    /// triggers one; forged key ids must not make the gateway hammer accounts).
    public var keyRefreshInterval: Duration = .seconds(1)
    /// How often upstream health is polled.
    public var healthInterval: Duration = .seconds(2)
    /// Connection timeout to an upstream (a down upstream fails calls fast with UNAVAILABLE).
    public var upstreamConnectTimeout: Duration = .seconds(1)
    /// Keepalive PINGs on upstream connections: after this long without reading, a PING; no
    /// answer within the timeout closes the connection and fails its calls with UNAVAILABLE (a
    /// relayed notification stream notices a dead service). nil: none.
    public var upstreamKeepaliveTime: Duration? = .seconds(30)
    public var upstreamKeepaliveTimeout: Duration = .seconds(10)
    /// Longest wait between reconnection attempts to a down upstream.
    public var upstreamMaxBackoff: Duration = .seconds(1)
    /// Streams per upstream connection before another connection is opened.
    public var streamsPerUpstreamConnection = 90
    /// Connections per event loop and upstream (`GATEWAY_UPSTREAM_MAX_CONNECTIONS`): with 90
    /// streams each, 11,520 calls and subscriptions per loop and upstream. Past that a new call
    /// is refused at once with UNAVAILABLE rather than left waiting for a free stream.
    public var upstreamMaxConnections = 128
    /// Event loop threads (default: one per core).
    public var threads: Int? = nil
    /// How often the status page's board scrapes every process's `GET /metrics`
    /// (`GATEWAY_STATUS_SCRAPE_MS`; nil, from 0: never, the page shows health only). Each scrape
    /// has `StatusBoard.timeout(for:)`: half the interval, between 200 ms and 2 s.
    public var statusScrapeInterval: Duration? = .seconds(10)
    /// Calls counted and timed, `GET /metrics` served (`METRICS`, default on).
    public var metrics = true
    /// One access-log line per call, at info level. Off when built in code; `from(environment:)`
    /// sets it from `ACCESS_LOG`, on unless `off`.
    public var accessLog = false
    /// The tracer relayed calls are spans of (`TRACE_EXPORT`; `ProcessTracing.tracer`, set by the
    /// gateway command); nil: not traced, and a relayed call does no work for it.
    public var tracer: SpanTracer?
    /// `GATEWAY_METRICS_TOKEN`: the bearer token `/metrics` asks for; nil: loopback clients only.
    public var metricsToken: String?
    /// Web origins whose pages may call the gateway (CORS; `GATEWAY_CORS_ORIGINS`): none by
    /// default. See `CORSPolicy`.
    public var cors = CORSPolicy()
    public static let allUpstreams = ["accounts", "social", "tasks", "finance", "matchmaking"]

    public init(
        host: String = "127.0.0.1", port: Int = 0, upstreams: [Upstream], requiredUpstreams: Set<String>? = nil,
        gatewayToken: String
    ) {
        self.host = host
        self.port = port
        self.upstreams = upstreams
        self.requiredUpstreams = requiredUpstreams ?? Set(upstreams.map(\.name))
        self.gatewayToken = gatewayToken
    }
}
