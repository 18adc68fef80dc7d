import Synchronization

/// A method implementation as the transport runs it: raw bytes in and out, shaped by call kind.
/// Generated code builds these from a service's typed methods, so handlers never see bytes.
///
/// Unary and server-streaming handlers receive their one request message whole: the transport
/// starts them only once the request stream has ended, which saves a message queue per call.
public enum RawHandler: Sendable {
    case unary(@Sendable (_ request: [UInt8], _ context: ServerContext) async throws -> [UInt8])
    case serverStreaming(@Sendable (_ request: [UInt8], _ responses: any ServerResponseSink, _ context: ServerContext) async throws -> Void)
    case clientStreaming(@Sendable (_ requests: RawMessageStream, _ context: ServerContext) async throws -> [UInt8])
    case bidirectionalStreaming(
        @Sendable (_ requests: RawMessageStream, _ responses: any ServerResponseSink, _ context: ServerContext) async throws -> Void)
    /// A unary handler that answers through a responder instead of returning from a task: for
    /// handlers that only pass the call on (the gateway's relay). The transport calls it on the
    /// connection's event loop, without starting a task when every interceptor decides at once;
    /// it must not block, and must answer through `responder` exactly once, from any thread. It
    /// returns what stops its work when the call ends early (client cancelled, deadline passed),
    /// if anything does.
    case unaryForwarding(
        @Sendable (_ request: [UInt8], _ context: ServerContext, _ responder: any UnaryResponder) -> (any Cancellable)?)

    /// A server-streaming handler that passes responses on as they come instead of running in a
    /// task (the gateway's relay): called on the connection's event loop as `unaryForwarding` is,
    /// it must not block; it sends through `responses` (headers, each message, the end, exactly
    /// once) and returns what stops its work when the call ends early.
    case serverStreamingForwarding(
        @Sendable (_ request: [UInt8], _ context: ServerContext, _ responses: any ResponseForwarder) -> (any Cancellable)?)

    /// A unary call relayed to another server with no `ServerContext` made for it (the gateway's
    /// relay of gRPC calls, tracing off): the transport calls `UnaryRelay.relay` on the
    /// connection's event loop with what a relay needs of the call, and the relay answers with the
    /// upstream's headers and trailers (`RelayResponder`). The relay applies its own check
    /// (`UnaryRelay.check`), so `ServerInterceptors.wrap` keeps this form only when that check is
    /// the whole chain; otherwise, and wherever a context is needed (the browser protocols,
    /// `asyncUnary`), the method runs as `unaryForwarding(relay.forward)`.
    case unaryRelay(any UnaryRelay)

    /// The form that takes a context, for a `unaryRelay` (others unchanged).
    public var withContext: RawHandler {
        if case .unaryRelay(let relay) = self { return .unaryForwarding { relay.forward($0, $1, $2) } }
        return self
    }

    public var kind: CallKind {
        switch self {
        case .unary, .unaryForwarding, .unaryRelay: .unary
        case .serverStreaming, .serverStreamingForwarding: .serverStreaming
        case .clientStreaming: .clientStreaming
        case .bidirectionalStreaming: .bidirectionalStreaming
        }
    }

    /// A unary handler as an async function, whichever form it has (nil for streaming methods):
    /// what callers outside the HTTP/2 transport use (the gateway's JSON front end).
    public var asyncUnary: (@Sendable (_ request: [UInt8], _ context: ServerContext) async throws -> [UInt8])? {
        switch self {
        case .unary(let body):
            return body
        case .unaryRelay:
            return withContext.asyncUnary
        case .unaryForwarding(let body):
            return { request, context in
                let cancellation = CallCancellation()
                return try await withTaskCancellationHandler {
                    try await withCheckedThrowingContinuation { continuation in
                        let work = body(request, context, ClosureResponder { continuation.resume(with: $0) })
                        if let work { cancellation.onCancel(cancelling: work) }
                    }
                } onCancel: {
                    cancellation.cancel()
                }
            }
        default:
            return nil
        }
    }

    /// A server-streaming handler as an async function, whichever form it has (nil for other
    /// kinds): what callers outside the HTTP/2 transport use (the gateway's browser protocols).
    public var asyncServerStreaming:
        (@Sendable (_ request: [UInt8], _ responses: any ServerResponseSink, _ context: ServerContext) async throws -> Void)?
    {
        switch self {
        case .serverStreaming(let body):
            return body
        case .serverStreamingForwarding(let body):
            return { request, sink, context in
                let bridge = ForwardedResponses()
                let cancellation = CallCancellation()
                try await withTaskCancellationHandler {
                    if let work = body(request, context, bridge) { cancellation.onCancel(cancelling: work) }
                    try await bridge.pump(into: sink)
                } onCancel: {
                    cancellation.cancel()
                }
            }
        default:
            return nil
        }
    }

    @inline(__always)
    static func decode<M: ProtoMessage>(_ bytes: [UInt8], as: M.Type) throws -> M {
        do { return try M(serializedBytes: bytes) } catch {
            throw RPCError(.invalidArgument, MessageDecodingError.describe(error, messageName: M.protoMessageName))
        }
    }

    /// Typed builders used by generated code.
    public static func unary<Req: ProtoMessage, Res: ProtoMessage>(
        _ req: Req.Type, _ res: Res.Type,
        _ body: @escaping @Sendable (Req, ServerContext) async throws -> Res
    ) -> RawHandler {
        .unary { bytes, ctx in try await body(decode(bytes, as: Req.self), ctx).serializedBytes() }
    }
    public static func serverStreaming<Req: ProtoMessage, Res: ProtoMessage>(
        _ req: Req.Type, _ res: Res.Type,
        _ body: @escaping @Sendable (Req, ResponseWriter<Res>, ServerContext) async throws -> Void
    ) -> RawHandler {
        .serverStreaming { bytes, sink, ctx in
            try await body(decode(bytes, as: Req.self), ResponseWriter(sink: sink), ctx)
        }
    }
    public static func clientStreaming<Req: ProtoMessage, Res: ProtoMessage>(
        _ req: Req.Type, _ res: Res.Type,
        _ body: @escaping @Sendable (MessageStream<Req>, ServerContext) async throws -> Res
    ) -> RawHandler {
        .clientStreaming { raw, ctx in try await body(MessageStream(raw: raw), ctx).serializedBytes() }
    }
    public static func bidirectionalStreaming<Req: ProtoMessage, Res: ProtoMessage>(
        _ req: Req.Type, _ res: Res.Type,
        _ body: @escaping @Sendable (MessageStream<Req>, ResponseWriter<Res>, ServerContext) async throws -> Void
    ) -> RawHandler {
        .bidirectionalStreaming { raw, sink, ctx in
            try await body(MessageStream(raw: raw), ResponseWriter(sink: sink), ctx)
        }
    }
}

/// One routable method: its descriptor and its implementation.
public struct ServerMethod: Sendable {
    public var descriptor: MethodDescriptor
    public var handler: RawHandler
    public init(_ descriptor: MethodDescriptor, _ handler: RawHandler) {
        self.descriptor = descriptor
        self.handler = handler
    }
}

/// A service implementation the server can route to. Generated service protocols refine this and
/// supply `methods` from their typed requirements.
public protocol RPCService: Sendable {
    /// Fully qualified service name, as reflection lists it.
    var serviceName: String { get }
    var methods: [ServerMethod] { get }
}

/// The header-time check behind `ServerInterceptor.rejectAtHeaders`: is there a credential at
/// all where the method's marking needs one? It does not verify anything (the interceptor's
/// `intercept` still does); it only turns away, before their bodies are read, calls that would be
/// refused whatever they carry, so an anonymous client cannot make a process buffer large
/// requests (an avatar, an attachment) that authentication would reject afterwards.
public enum CredentialCheck {
    /// The header carrying the cluster's service credential (as `ServiceKit.AuthInterceptor`).
    public static let serviceTokenHeader = "x-service-token"
    /// The header carrying the gateway's credential on the calls it relays.
    public static let gatewayTokenHeader = "x-gateway-token"

    /// - internal methods: no service credential → PERMISSION_DENIED (`serviceCredential` false:
    ///   the process accepts none, as the gateway, → UNIMPLEMENTED, as if it did not exist);
    /// - authenticated methods: neither `authorization: Bearer …` nor a service credential →
    ///   UNAUTHENTICATED;
    /// - public methods, and the infrastructure services (`MethodDescriptor.isInfrastructure`:
    ///   health, reflection): nil.
    /// The messages are the ones the full check would give.
    public static func missingCredential(
        _ method: MethodDescriptor, _ metadata: Metadata, serviceCredential: Bool = true
    ) -> RPCError? {
        missingCredential(
            method, serviceCredential: serviceCredential, hasBearer: { hasBearer(metadata) },
            hasServiceToken: { metadata.first(lowercased: serviceTokenHeader) != nil })
    }

    /// `missingCredential` for metadata as its header block carried it (a relay's).
    public static func missingCredential(
        _ method: MethodDescriptor, _ metadata: MetadataBytes, serviceCredential: Bool = true
    ) -> RPCError? {
        missingCredential(
            method, serviceCredential: serviceCredential, hasBearer: { bearerTokenRange(metadata) != nil },
            hasServiceToken: { metadata.withFirstValue(of: "x-service-token") { $0 != nil } })
    }

    @inline(__always)
    private static func missingCredential(
        _ method: MethodDescriptor, serviceCredential: Bool, hasBearer: () -> Bool, hasServiceToken: () -> Bool
    ) -> RPCError? {
        if method.isInfrastructure { return nil }
        switch method.visibility {
        case .publicAnonymous:
            return nil
        case .publicAuthenticated:
            if hasBearer() { return nil }
            if serviceCredential && hasServiceToken() { return nil }
            return RPCError(.unauthenticated, "\(method.path) needs 'authorization: Bearer <access token>'")
        case .internal:
            guard serviceCredential else { return RPCError(.unimplemented, "Method not found: \(method.path)") }
            if hasServiceToken() { return nil }
            return RPCError(.permissionDenied, "\(method.path) is internal: only other services may call it")
        }
    }

    /// `authorization: Bearer <non-empty token>` is present (not checked further).
    public static func hasBearer(_ metadata: Metadata) -> Bool { bearerToken(metadata) != nil }

    /// The token of `authorization: Bearer <token>`: the scheme in any case, spaces around the
    /// token dropped; nil when absent, empty or another scheme. Byte-wise, allocating nothing: it
    /// runs on every call that carries a token.
    public static func bearerToken(_ metadata: Metadata) -> Substring? {
        guard let value = metadata.first(lowercased: "authorization") else { return nil }
        let utf8 = value.utf8
        // Over the string's own bytes (a token is a few hundred): no index arithmetic per byte.
        let found: Range<Int>?? = utf8.withContiguousStorageIfAvailable { bearerTokenRange(UnsafeRawBufferPointer($0)) }
        guard let range = found ?? Array(utf8).withUnsafeBytes({ bearerTokenRange($0) }) else { return nil }
        let start = utf8.index(utf8.startIndex, offsetBy: range.lowerBound)
        return Substring(utf8[start..<utf8.index(start, offsetBy: range.count)])
    }

    /// Where the token is in the bytes of an `authorization` value (`bearerToken`'s rule): nil
    /// when absent, empty or another scheme.
    public static func bearerTokenRange(_ value: UnsafeRawBufferPointer) -> Range<Int>? {
        guard value.count > 7 else { return nil }
        var i = 0
        for expected in "bearer".utf8 {
            guard value[i] | 0x20 == expected else { return nil }  // ASCII case-insensitive (letters only here)
            i += 1
        }
        guard value[i] == UInt8(ascii: " ") else { return nil }
        var lo = i + 1
        var hi = value.count
        while lo < hi && value[lo] == UInt8(ascii: " ") { lo += 1 }
        while hi > lo && value[hi - 1] == UInt8(ascii: " ") { hi -= 1 }
        return lo < hi ? lo..<hi : nil
    }

    /// Where the token of `authorization: Bearer <token>` is in that header's value, for metadata
    /// as its header block carried it (`bearerToken`'s rule).
    public static func bearerTokenRange(_ metadata: MetadataBytes) -> Range<Int>? {
        metadata.withFirstValue(of: "authorization") { $0.flatMap { bearerTokenRange($0) } }
    }
}

/// Something the end of a call can cancel (the upstream call a relay started).
public protocol Cancellable: Sendable {
    func cancel()
}

/// Where a `unaryForwarding` handler's answer goes: called exactly once, from any thread.
public protocol UnaryResponder: AnyObject, Sendable {
    func respond(_ result: Result<[UInt8], any Error>)
}

/// A unary call passed on to another server by the transport itself, without a `ServerContext`,
/// interceptor closures or a task (`RawHandler.unaryRelay`): the gateway's relay.
public protocol UnaryRelay: AnyObject, Sendable {
    /// The check the relay applies to each call itself (nil: none). `ServerInterceptors.wrap`
    /// keeps the relay only when this check (the same instance) is the server's whole chain, so
    /// that a relayed call is checked exactly as the chain would check it.
    var check: (any CallCheck)? { get }
    /// `check`'s `rejectAtHeaders`, from the request's metadata as its header block carried it
    /// (the same decision: the transport asks this one for the relay's calls).
    func rejectAtHeaders(_ method: MethodDescriptor, _ metadata: MetadataBytes) -> RPCError?
    /// Relays a call (on the connection's event loop; must not block): checks it, starts the
    /// upstream call and answers through `responder` exactly once, from any thread. Returns
    /// what stops its work when the call ends early, if anything does. The call's values are
    /// passed one by one, not in a struct, so that none is retained to be passed; its metadata
    /// as the header block carried it, lent (the transport reuses its storage once `relay`
    /// returns: a relay that keeps it, for a task, costs that storage a copy).
    func relay(
        _ request: [UInt8], _ method: MethodDescriptor, _ metadata: MetadataBytes, deadline: ContinuousClock.Instant?,
        _ connection: RelayConnection, _ responder: any RelayResponder
    ) -> (any Cancellable)?
    /// The same relay as a `unaryForwarding` handler (with a context; the chain already ran).
    func forward(_ request: [UInt8], _ context: ServerContext, _ responder: any UnaryResponder) -> (any Cancellable)?
    /// For a call whose headers say that more than the relay's check takes part in it (the
    /// chain's `RelayGate`s): the handler to run it with, through the chain, with a context; nil
    /// to relay it. The transport asks once per call, when its headers are complete. The
    /// default: nil (the relay's check is the whole chain).
    func contextPath(_ method: MethodDescriptor, _ metadata: MetadataBytes) -> RawHandler?
}

extension UnaryRelay {
    public func contextPath(_ method: MethodDescriptor, _ metadata: MetadataBytes) -> RawHandler? { nil }
}

/// An interceptor that takes no part in some calls, and knows which from their headers alone:
/// a relay (`RawHandler.unaryRelay`) relays those without a context, as if the interceptor were
/// not in the chain, and sends the others through the chain (`ServerInterceptors.wrap`). Tracing
/// is one: a call with no `traceparent` whose new trace is not sampled gets no span, no context
/// and no header upstream, so the gateway relays it as it does with tracing off.
public protocol RelayGate: ServerInterceptor {
    /// Whether this interceptor takes part in a call, from its metadata as the header block
    /// carried it (lent). Must be quick: asked on the event loop for every relayed call.
    func relayPart(_ method: MethodDescriptor, _ metadata: MetadataBytes) -> RelayPart
}

/// What a `RelayGate` says of a call.
public enum RelayPart: Sendable {
    /// The interceptor would do nothing: the call may be relayed without it.
    case passes
    /// The call goes through the chain. `note`, when given, is set on its context before the
    /// chain runs, under `key`: a decision made here that must not be made twice (tracing's
    /// sampling draw), for the interceptor to read back.
    case takesPart(note: (key: String, value: any Sendable)?)
}

/// A relay whose chain has `RelayGate`s besides the relay's own check (`ServerInterceptors.wrap`):
/// a call they all pass is relayed as the relay does it; any other runs through the chain.
final class GatedRelay: UnaryRelay {
    let base: any UnaryRelay
    let gates: [any RelayGate]
    /// `base` through the whole chain, with a context.
    let chained: @Sendable (_ request: [UInt8], _ context: ServerContext, _ responder: any UnaryResponder) -> (any Cancellable)?

    init(
        _ base: any UnaryRelay, gates: [any RelayGate],
        chained: @escaping @Sendable (_ request: [UInt8], _ context: ServerContext, _ responder: any UnaryResponder) -> (any Cancellable)?
    ) {
        self.base = base
        self.gates = gates
        self.chained = chained
    }

    var check: (any CallCheck)? { base.check }

    func rejectAtHeaders(_ method: MethodDescriptor, _ metadata: MetadataBytes) -> RPCError? {
        base.rejectAtHeaders(method, metadata)
    }

    func relay(
        _ request: [UInt8], _ method: MethodDescriptor, _ metadata: MetadataBytes, deadline: ContinuousClock.Instant?,
        _ connection: RelayConnection, _ responder: any RelayResponder
    ) -> (any Cancellable)? {
        base.relay(request, method, metadata, deadline: deadline, connection, responder)
    }

    /// With a context: always through the chain (`withContext`, the browser protocols).
    func forward(_ request: [UInt8], _ context: ServerContext, _ responder: any UnaryResponder) -> (any Cancellable)? {
        chained(request, context, responder)
    }

    func contextPath(_ method: MethodDescriptor, _ metadata: MetadataBytes) -> RawHandler? {
        var notes: [(key: String, value: any Sendable)] = []
        var takesPart = false
        for gate in gates {
            guard case .takesPart(let note) = gate.relayPart(method, metadata) else { continue }
            takesPart = true
            if let note { notes.append(note) }
        }
        guard takesPart else { return nil }
        let chained = self.chained
        guard !notes.isEmpty else { return .unaryForwarding(chained) }
        let noted = notes
        return .unaryForwarding { request, context, responder in
            for note in noted { context.setValue(note.value, forKey: note.key) }
            return chained(request, context, responder)
        }
    }
}

/// The client connection a relayed call came on (`UnaryRelay.relay`): its address, and a place
/// for the relay's own state about that connection (the token it verified last, the entries it
/// adds to each call), kept for the connection's life. One per connection, made at its first
/// relayed call. `state` is read and written only on the connection's event loop, where `relay`
/// is called (not from work the relay hands to a task).
public final class RelayConnection: @unchecked Sendable {
    /// The client's IP address (what `ServerContext.peerHost` would say).
    public let peerHost: String
    /// The relay's state for this connection (on its event loop only).
    public var state: AnyObject?

    public init(peerHost: String) {
        self.peerHost = peerHost
    }
}

/// Where a `unaryRelay`'s answer goes: exactly once, from any thread.
public protocol RelayResponder: AnyObject, Sendable {
    /// The call's answer with the response headers and trailers to send with it (the upstream's:
    /// headers go out on errors too, Trailers-Only; an error's own trailers are its `RPCError`'s).
    func respond(_ result: Result<[UInt8], any Error>, headers: Metadata, trailers: Metadata)
}

/// A responder that runs a closure (callers that are not the HTTP/2 transport).
public final class ClosureResponder: UnaryResponder {
    let body: @Sendable (Result<[UInt8], any Error>) -> Void
    public init(_ body: @escaping @Sendable (Result<[UInt8], any Error>) -> Void) { self.body = body }
    public func respond(_ result: Result<[UInt8], any Error>) { body(result) }
}

/// Where a `serverStreamingForwarding` handler's responses go. Meant to be called on the call's
/// event loop, where `forward` can say at once whether the client keeps up; from elsewhere each
/// call hops there (and `forward` reports room).
public protocol ResponseForwarder: AnyObject, Sendable {
    /// Sends the response headers (`ServerContext.initialMetadata`) if not sent yet.
    func sendHeaders()
    /// Queues one response message; false when the queued responses are past the limit: hold
    /// the source back until `whenWritable` calls back.
    func forward(_ message: [UInt8]) -> Bool
    /// Runs `body` once the queued responses are back under the limit (at once if they are);
    /// never if the call ends first.
    func whenWritable(_ body: @escaping @Sendable () -> Void)
    /// Ends the call: OK with `ServerContext.trailers`, or the error. Exactly once.
    func end(_ result: Result<Void, any Error>)
}

/// A `ResponseForwarder` drained into an async `ServerResponseSink` (see
/// `RawHandler.asyncServerStreaming`): responses wait here, at most `limit` messages before the
/// source is held back.
final class ForwardedResponses: ResponseForwarder, @unchecked Sendable {
    enum Event {
        case headers
        case message([UInt8])
        case end(Result<Void, any Error>)
    }
    private struct State {
        var events: [Event] = []
        var queuedMessages = 0
        var waiter: CheckedContinuation<Event, Never>?
        var writable: (@Sendable () -> Void)?
    }
    private let state = Mutex(State())
    let limit = 16

    func sendHeaders() { push(.headers) }

    func forward(_ message: [UInt8]) -> Bool {
        push(.message(message))
        return state.withLock { $0.queuedMessages < limit }
    }

    func whenWritable(_ body: @escaping @Sendable () -> Void) {
        let now = state.withLock { s -> Bool in
            if s.queuedMessages < limit { return true }
            s.writable = body
            return false
        }
        if now { body() }
    }

    func end(_ result: Result<Void, any Error>) { push(.end(result)) }

    private func push(_ event: Event) {
        let waiter = state.withLock { s -> CheckedContinuation<Event, Never>? in
            if case .message = event { s.queuedMessages += 1 }
            if let w = s.waiter {
                s.waiter = nil
                return w
            }
            s.events.append(event)
            return nil
        }
        if let waiter { taken(event, resuming: waiter) }
    }

    /// An event leaves: a message makes room.
    private func taken(_ event: Event, resuming waiter: CheckedContinuation<Event, Never>? = nil) {
        var writable: (@Sendable () -> Void)? = nil
        if case .message = event {
            writable = state.withLock { s in
                s.queuedMessages -= 1
                guard s.queuedMessages < limit else { return nil }
                defer { s.writable = nil }
                return s.writable
            }
        }
        waiter?.resume(returning: event)
        writable?()
    }

    private func next() async -> Event {
        await withCheckedContinuation { c in
            let event = state.withLock { s -> Event? in
                if s.events.isEmpty {
                    s.waiter = c
                    return nil
                }
                return s.events.removeFirst()
            }
            if let event { taken(event, resuming: c) }
        }
    }

    /// Writes the responses into `sink` until the end; throws the call's error.
    func pump(into sink: any ServerResponseSink) async throws {
        while true {
            switch await next() {
            case .headers: try await sink.sendInitialMetadata()
            case .message(let m): try await sink.write(m, compress: nil)
            case .end(let result): return try result.get()
            }
        }
    }
}

/// Cancels work a `unaryForwarding` handler started: the handler registers what to cancel, the
/// transport cancels it when the call ends early. Thread-safe; something registered after the
/// cancellation is cancelled at once. Open so a watch that cancels at a deadline can be one (the
/// gateway's `DeadlineSweeper.Watch`): its state lives in a mutex, hence `@unchecked`.
open class CallCancellation: Cancellable, @unchecked Sendable {
    /// `done`: disarmed, the work finished; later registrations are dropped.
    private enum State { case waiting((any Cancellable)?), cancelled, done }
    private let state = Mutex<State>(.waiting(nil))

    public init() {}

    /// Cancels `target` when the call ends early (held as is: no closure, no allocation).
    public func onCancel(cancelling target: some Cancellable) {
        let runNow = state.withLock { s -> Bool in
            switch s {
            case .cancelled: return true
            case .done: return false
            case .waiting: s = .waiting(target); return false
            }
        }
        if runNow { target.cancel() }
    }

    public func cancel() {
        let target = state.withLock { s -> (any Cancellable)? in
            guard case .waiting(let t) = s else { return nil }
            s = .cancelled
            return t
        }
        target?.cancel()
    }

    /// The work finished: forget the target without cancelling it.
    public func disarm() {
        state.withLock { s in if case .waiting = s { s = .done } }
    }

    public var isCancelled: Bool { state.withLock { if case .cancelled = $0 { true } else { false } } }

    /// Disarmed: the work finished before any cancellation.
    public var isDone: Bool { state.withLock { if case .done = $0 { true } else { false } } }
}

/// Maps `:path` to methods. Built once at start; read-only afterwards, so lookups need no lock.
public struct Router: Sendable {
    public private(set) var methods: [String: ServerMethod] = [:]
    public private(set) var services: [String] = []

    public init() {}
    /// Every method of `services`, its handler wrapped by `interceptors` (the first outermost).
    public init(services: [any RPCService], interceptors: ServerInterceptors = ServerInterceptors([])) {
        for s in services { register(s, interceptors: interceptors) }
    }

    public mutating func register(_ service: any RPCService, interceptors: ServerInterceptors = ServerInterceptors([])) {
        if !services.contains(service.serviceName) { services.append(service.serviceName) }
        for m in service.methods { methods[m.descriptor.path] = ServerMethod(m.descriptor, interceptors.wrap(m.handler, for: m.descriptor)) }
    }

    /// Looks a path up; on a miss tells apart an unknown service from an unknown method.
    public func lookup(_ path: String) -> Result<ServerMethod, RPCError> {
        if let m = methods[path] { return .success(m) }
        let parts = path.split(separator: "/", omittingEmptySubsequences: true)
        if parts.count == 2, services.contains(String(parts[0])) {
            return .failure(RPCError(.unimplemented, "Method not found: \(path)"))
        }
        if parts.count == 2 {
            return .failure(RPCError(.unimplemented, "Service not found: \(parts[0])"))
        }
        return .failure(RPCError(.unimplemented, "Malformed method path: \(path)"))
    }
}
