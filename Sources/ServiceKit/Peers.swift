import Contracts
import Logging
import Observability
import RPCCore
import RPCTransport
import Storage
import Synchronization

/// Clients for the other services of the cluster, carrying the service credential: one
/// connection per peer, made on first use. The process host makes one from its settings
/// (`<PEER>_ADDR`); tests make one over loopback channels.
public final class PeerClients: Sendable {
    private let make: @Sendable (String) -> (RPCClient, RPCChannel?)
    private let clients = Mutex<[String: RPCClient]>([:])
    private let channels = Mutex<[RPCChannel]>([])

    /// Clients made by `make(peer)` (tests: loopback channels they close themselves); with a
    /// `tracer`, calls made inside a span carry it on (`TracingClientInterceptor`).
    public init(make: @escaping @Sendable (String) -> RPCClient, tracer: SpanTracer? = nil) {
        self.make = { peer in
            let client = make(peer)
            return (
                tracer.map { RPCClient(transport: ClientInterceptors(base: client.transport, [TracingClientInterceptor(tracer: $0)])) } ?? client, nil
            )
        }
    }

    /// Clients over channels made from `configuration(peer)`, each adding `serviceToken`; the
    /// channels (and the threads each owns) are closed by `close()`. With a `tracer`, a call made
    /// inside a span is a client span and carries `traceparent` (`TracingClientInterceptor`).
    public init(
        serviceToken: String, tracer: SpanTracer? = nil, configuration: @escaping @Sendable (String) -> ChannelConfiguration
    ) {
        self.make = { peer in
            let channel = RPCChannel(configuration: configuration(peer))
            return (RPCClient(transport: peerInterceptors(channel, serviceToken: serviceToken, tracer: tracer)), channel)
        }
    }

    /// Clients for the peers at their configured addresses (`settings.peerAddress`), each adding
    /// `settings.serviceToken`, over TLS with the cluster CA when `PEER_TLS_CA` is set (presenting
    /// `PEER_TLS_CERT` to peers that require a client certificate); calls fail fast (UNAVAILABLE)
    /// while a peer is down or refuses the handshake. Traced when the process traces
    /// (`ProcessTracing.tracer`, read here once).
    public convenience init(settings: ServiceSettings) {
        self.init(serviceToken: settings.serviceToken, tracer: ProcessTracing.tracer) { settings.peerChannelConfiguration($0) }
    }

    /// The client for `peer` (`"social"`, `"tasks"`, …).
    public func client(_ peer: String) -> RPCClient {
        clients.withLock { c in
            if let existing = c[peer] { return existing }
            let (new, channel) = make(peer)
            c[peer] = new
            if let channel { channels.withLock { $0.append(channel) } }
            return new
        }
    }

    /// Closes the connections this made (process shutdown).
    public func close() async {
        let all = channels.withLock { c in
            defer { c = [] }; return c
        }
        for channel in all { await channel.close() }
    }
}

/// A transport adding a credential to every call (`MetadataInterceptor`): tests and tools.
public struct CredentialedTransport: ClientTransport {
    let chain: ClientInterceptors
    public init(base: any ClientTransport, serviceToken: String) {
        chain = ClientInterceptors(base: base, [MetadataInterceptor(AuthInterceptor.serviceTokenHeader, serviceToken)])
    }
    /// A transport presenting the gateway's credential instead (as the gateway's relay does).
    public init(base: any ClientTransport, gatewayToken: String) {
        chain = ClientInterceptors(base: base, [MetadataInterceptor(AuthInterceptor.gatewayTokenHeader, gatewayToken)])
    }
    public func startCall(_ method: MethodDescriptor, options: CallOptions) async throws -> any RawClientCall {
        try await chain.startCall(method, options: options)
    }
}

/// A peer channel as services call each other: traced (outermost, when the process traces), then
/// the service credential on every call.
func peerInterceptors(_ channel: any ClientTransport, serviceToken: String, tracer: SpanTracer?) -> ClientInterceptors {
    let credential = MetadataInterceptor(AuthInterceptor.serviceTokenHeader, serviceToken)
    return ClientInterceptors(base: channel, tracer.map { [TracingClientInterceptor(tracer: $0), credential] } ?? [credential])
}

// MARK: Outbox events as RPC calls

/// The kit's outbox convention: an event *is* an internal RPC to make on another service. Its
/// `destination` is the service (`social`), its `kind` the method path
/// (`/social.v1.SocialInternal/SendNotification`) and its `payload` the serialized request, which
/// carries the event id the receiver deduplicates on. So delivery needs no code per kind: the
/// host registers one sender per destination (`OutboxSenders`), and a new event type is a new
/// internal RPC in the contracts, nothing else.
public enum OutboxCall {
    /// The service an internal method belongs to: `social.v1.SocialInternal` → `social`.
    public static func destination(of method: MethodDescriptor) -> String {
        String(method.service.split(separator: ".").first ?? "")
    }

    /// The paths of every `EraseUser` in the contracts, by service (`tasks` →
    /// `/tasks.v1.TasksInternal/EraseUser`): where accounts' account-deletion events go. Read
    /// from the descriptors, so a new service with an EraseUser receives them with no change to
    /// accounts.
    public static let eraseUserPaths: [(destination: String, path: String)] = {
        ContractsDescriptors.descriptorSet.symbols.keys
            .filter { $0.hasSuffix("Internal.EraseUser") }
            .map { symbol -> (String, String) in
                let service = String(symbol.dropLast(".EraseUser".count))
                return (String(service.split(separator: ".").first ?? ""), "/\(service)/EraseUser")
            }
            .sorted { $0.0 < $1.0 }
    }()

    /// The `EraseUser` path of `destination`, if it has one.
    public static func eraseUserPath(of destination: String) -> String? {
        eraseUserPaths.first { $0.destination == destination }?.path
    }
}

extension Transaction {
    /// Queues the call `method(request)` to its service, delivered after this transaction commits
    /// (and only if it does), in order with the other events to that service. `eventID` must be
    /// unique; choose it deterministic where a retried request must not produce a second event.
    public func enqueueCall(_ method: MethodDescriptor, _ request: some ProtoMessage, eventID: String) throws {
        try enqueueOutbox(
            eventID: eventID, destination: OutboxCall.destination(of: method), kind: method.path,
            payload: request.serializedBytes())
    }

    /// Queues a call by path (a method of a service this one has no generated types for).
    public func enqueueCall(path: String, destination: String, payload: [UInt8], eventID: String) throws {
        try enqueueOutbox(eventID: eventID, destination: destination, kind: path, payload: payload)
    }
}

/// A message as bytes: the payload of an outbox call, sent as is.
public struct RawMessage: ProtoMessage {
    public static let protoMessageName = "kit.RawMessage"
    public var bytes: [UInt8]
    public init() { bytes = [] }
    public init(serializedBytes: [UInt8]) throws { bytes = serializedBytes }
    public init(bytes: [UInt8]) { self.bytes = bytes }
    public func serializedBytes() -> [UInt8] { bytes }
}

/// Who delivers the outbox events to each destination. The process host registers one sender per
/// peer (`rpc(peers:)`: the event's call on that peer with the service credential); tests or
/// special sinks register their own. An event for a destination with no sender waits (UNAVAILABLE,
/// with backoff) until one is configured.
///
/// An event's `kind` is normally the method path it calls (`Transaction.enqueueCall`). A service
/// whose events are named differently (accounts' `accounts.v1.UserDeleted`, one event for every
/// erasing service) adds a `Route` that turns such an event into its call.
public struct OutboxSenders: Sendable {
    public typealias Send = @Sendable (OutboxEvent) async throws -> Void
    /// The call an event of another kind stands for: (method path, request bytes).
    public typealias Route = @Sendable (OutboxEvent) throws -> (path: String, payload: [UInt8])

    private var senders: [String: Send] = [:]
    private var fallback: Send?

    public init() {}

    /// Sends `destination`'s events with `send`.
    public mutating func register(_ destination: String, _ send: @escaping Send) { senders[destination] = send }

    /// Sends every destination without a sender of its own as calls to the peer of that name:
    /// `kind` is the method path, or the kind is one of `routes`.
    public static func rpc(peers: PeerClients, routes: [String: Route] = [:], timeout: Duration = .seconds(10)) -> OutboxSenders {
        var s = OutboxSenders()
        s.fallback = { event in
            let (path, payload) = try routes[event.kind].map { try $0(event) } ?? (event.kind, event.payload)
            try await Self.call(
                path: path, payload: payload, eventID: event.eventID, client: peers.client(event.destination),
                timeout: timeout)
        }
        return s
    }

    /// The delivery closure for `OutboxDelivery`.
    public var deliver: OutboxDelivery.Deliver {
        let senders = self.senders, fallback = self.fallback
        return { event in
            guard let send = senders[event.destination] ?? fallback else {
                throw RPCError(.unavailable, "no sender for outbox destination '\(event.destination)'")
            }
            try await send(event)
        }
    }

    /// Makes the call `path(payload)` (unary; the answer's content is not needed, only its OK).
    public static func call(path: String, payload: [UInt8], eventID: String, client: RPCClient, timeout: Duration) async throws {
        let parts = path.split(separator: "/")
        guard path.hasPrefix("/"), parts.count == 2 else {
            throw RPCError(.internal, "outbox event \(eventID): '\(path)' is not a method path (add a route for its kind)")
        }
        let method = MethodDescriptor(service: String(parts[0]), method: String(parts[1]), kind: .unary, visibility: .internal)
        _ = try await client.unary(method, RawMessage(bytes: payload), as: RawMessage.self, options: CallOptions(timeout: timeout))
    }
}
