/// Sees every call a server ends, whatever ended it: the handler's answer, an interceptor's
/// refusal, a refusal at the headers, a deadline, a client that cancelled or went away, a
/// transport error. Metrics and the access log are observers. It is called on the connection's
/// event loop: quick, non-blocking, no suspension.
///
/// A transport hook rather than an interceptor: it sees the calls no interceptor runs for
/// (refused before routing, cancelled before the handler started), and costs no closure, task or
/// allocation on the task-free unary path. Class-bound: the transport holds one per connection and
/// copying the reference is a retain (an opaque existential's copy went through its value witness
/// on every call).
public protocol ServerCallObserver: AnyObject, Sendable {
    /// The server is about to serve these methods (once, before it accepts): build per-method
    /// state here so that `callEnded` finds it without hashing a path.
    func prepare(_ methods: [MethodDescriptor])
    /// A call's request headers arrived (it counts as in flight until `callEnded`).
    func callStarted()
    func callEnded(_ call: ServerCallRecord)
    /// Whether `callEnded` reads a record's `peer` or `context` (the access log does; metrics do
    /// not). When it does not, the transport tells it `callEnded(method:code:...)` instead: no
    /// record is made (its strings and objects retained, then copied into the call). Asked once
    /// per connection; the default: true.
    var readsCallDetails: Bool { get }
    /// `callEnded` without the details (`readsCallDetails` false). The default makes the record
    /// without them.
    func callEnded(
        method: MethodDescriptor?, code: StatusCode, nanoseconds: Int, requestMessages: Int, requestBytes: Int,
        responseMessages: Int, responseBytes: Int)
    /// A client connection was accepted (`true`) or closed (`false`), any protocol.
    func connection(opened: Bool)
    /// The observer of the calls served on one event loop (`loop`: the loop object's identity),
    /// which the transport tells `callStarted` and `callEnded` only from that loop's thread, so
    /// that it may count without shared writes (metrics keep one set of counts per loop).
    /// Asked once per connection; the default is the observer itself.
    func onLoop(_ loop: ObjectIdentifier) -> any ServerCallObserver
}

extension ServerCallObserver {
    public func prepare(_ methods: [MethodDescriptor]) {}
    public func callStarted() {}
    public func connection(opened: Bool) {}
    public func onLoop(_ loop: ObjectIdentifier) -> any ServerCallObserver { self }
    public var readsCallDetails: Bool { true }
    public func callEnded(
        method: MethodDescriptor?, code: StatusCode, nanoseconds: Int, requestMessages: Int, requestBytes: Int,
        responseMessages: Int, responseBytes: Int
    ) {
        callEnded(
            ServerCallRecord(
                method: method, code: code, nanoseconds: nanoseconds, requestMessages: requestMessages, requestBytes: requestBytes,
                responseMessages: responseMessages, responseBytes: responseBytes))
    }
}

/// One ended call, as a `ServerCallObserver` sees it.
public struct ServerCallRecord: Sendable {
    /// The routed method; nil when the call was refused before routing (unknown method, bad
    /// headers, not gRPC): never a raw path, so label sets stay bounded.
    public var method: MethodDescriptor?
    public var code: StatusCode
    /// From the accepted request headers to the status sent (or the stream's end), in
    /// nanoseconds (what the transport measures and the metrics bucket: no `Duration`'s 128-bit
    /// arithmetic on every call).
    public var nanoseconds: Int
    /// `nanoseconds` as a duration.
    public var duration: Duration {
        get { .nanoseconds(nanoseconds) }
        set { nanoseconds = newValue.wholeNanoseconds }
    }
    public var requestMessages: Int
    /// Request message bytes as received (compressed size when compressed, without the 5-byte prefix).
    public var requestBytes: Int
    public var responseMessages: Int
    /// Response message bytes as handed to the transport (before compression, without prefixes).
    public var responseBytes: Int
    /// The client's address (`127.0.0.1:50123`).
    public var peer: String
    /// The call's context when the call got that far (values interceptors attached, such as
    /// the verified caller); nil when it was refused before.
    public var context: ServerContext?

    public init(
        method: MethodDescriptor?, code: StatusCode, duration: Duration, requestMessages: Int = 0, requestBytes: Int = 0,
        responseMessages: Int = 0, responseBytes: Int = 0, peer: String = "", context: ServerContext? = nil
    ) {
        self.init(
            method: method, code: code, nanoseconds: duration.wholeNanoseconds, requestMessages: requestMessages,
            requestBytes: requestBytes, responseMessages: responseMessages, responseBytes: responseBytes, peer: peer, context: context)
    }

    public init(
        method: MethodDescriptor?, code: StatusCode, nanoseconds: Int, requestMessages: Int = 0, requestBytes: Int = 0,
        responseMessages: Int = 0, responseBytes: Int = 0, peer: String = "", context: ServerContext? = nil
    ) {
        self.method = method
        self.code = code
        self.nanoseconds = nanoseconds
        self.requestMessages = requestMessages
        self.requestBytes = requestBytes
        self.responseMessages = responseMessages
        self.responseBytes = responseBytes
        self.peer = peer
        self.context = context
    }
}

/// Several observers as one (metrics and the access log), told in order.
public final class ServerCallObservers: ServerCallObserver {
    public let observers: [any ServerCallObserver]
    public init(_ observers: [any ServerCallObserver]) { self.observers = observers }

    public func prepare(_ methods: [MethodDescriptor]) { for o in observers { o.prepare(methods) } }
    public func callStarted() { for o in observers { o.callStarted() } }
    public func callEnded(_ call: ServerCallRecord) { for o in observers { o.callEnded(call) } }
    public var readsCallDetails: Bool { observers.contains { $0.readsCallDetails } }
    public func callEnded(
        method: MethodDescriptor?, code: StatusCode, nanoseconds: Int, requestMessages: Int, requestBytes: Int,
        responseMessages: Int, responseBytes: Int
    ) {
        for o in observers {
            o.callEnded(
                method: method, code: code, nanoseconds: nanoseconds, requestMessages: requestMessages, requestBytes: requestBytes,
                responseMessages: responseMessages, responseBytes: responseBytes)
        }
    }
    public func connection(opened: Bool) { for o in observers { o.connection(opened: opened) } }
    public func onLoop(_ loop: ObjectIdentifier) -> any ServerCallObserver {
        ServerCallObservers(observers.map { $0.onLoop(loop) })
    }

    /// nil for none, the observer itself for one, else the chain.
    public static func combine(_ observers: [any ServerCallObserver]) -> (any ServerCallObserver)? {
        observers.count <= 1 ? observers.first : ServerCallObservers(observers)
    }
}

/// A `ServerCallObserver` told of the calls that do not come through the gRPC transport (the
/// gateway's browser protocols), as an interceptor: the outermost of their chain, it reports each
/// call's status, duration and messages and bytes each way, as the transport would.
public struct ObservingInterceptor: ServerInterceptor {
    public let observer: any ServerCallObserver
    public init(_ observer: any ServerCallObserver) { self.observer = observer }

    public func intercept(_ call: ServerCall, next: ServerCall.Next) async throws -> [UInt8] {
        observer.callStarted()
        let started = ContinuousClock.now
        let counts = MessageCounts()
        do {
            let response = try await next(call.observingMessages(counts))
            if call.responses == nil { counts.responded(response.count) }
            observer.callEnded(record(call.context, .ok, counts, started))
            return response
        } catch {
            observer.callEnded(record(call.context, StatusCode.of(error, call.context), counts, started))
            throw error
        }
    }

    public func interceptForwarded(_ call: ForwardedCall, next: @escaping ForwardedCall.Next) -> (any Cancellable)? {
        observer.callStarted()
        let started = ContinuousClock.now
        let counts = MessageCounts()
        counts.received(call.request.count)
        var observed = call
        switch call.answer {
        case .message(let responder):
            observed.answer = .message(
                ClosureResponder { [observer] result in
                    if case .success(let bytes) = result { counts.responded(bytes.count) }
                    observer.callEnded(record(call.context, StatusCode.of(result, call.context), counts, started))
                    responder.respond(result)
                })
        case .stream(let forwarder):
            observed.answer = .stream(
                ObservedForwarder(forwarder, counts: counts) { [observer] result in
                    observer.callEnded(record(call.context, StatusCode.of(result, call.context), counts, started))
                })
        }
        return next(observed)
    }

    /// Reports a call refused before its chain ran (at its headers).
    public func refused(_ method: MethodDescriptor, peer: String, _ error: RPCError) {
        observer.callStarted()
        observer.callEnded(ServerCallRecord(method: method, code: error.code, duration: .zero, peer: peer))
    }

    func record(
        _ context: ServerContext, _ code: StatusCode, _ counts: MessageCounts, _ started: ContinuousClock.Instant
    )
        -> ServerCallRecord
    {
        ServerCallRecord(
            method: context.method, code: code, duration: .now - started, requestMessages: counts.requestMessages,
            requestBytes: counts.requestBytes, responseMessages: counts.responseMessages, responseBytes: counts.responseBytes,
            peer: context.peer, context: context)
    }

}

extension StatusCode {
    /// The status an error ends a call with, as the transport answers it: an `RPCError`'s code;
    /// cancellation is DEADLINE_EXCEEDED past the call's deadline, else CANCELLED; anything else
    /// INTERNAL.
    public static func of(_ error: any Error, _ context: ServerContext?) -> StatusCode {
        if let rpc = error as? RPCError { return rpc.code }
        if error is CancellationError {
            if let remaining = context?.timeRemaining, remaining <= .zero { return .deadlineExceeded }
            return .cancelled
        }
        return .internal
    }

    /// The status a call's outcome ends it with (`of(_:_:)` for a failure, OK for a success).
    public static func of<T>(_ result: Result<T, any Error>, _ context: ServerContext?) -> StatusCode {
        switch result {
        case .success: .ok
        case .failure(let error): of(error, context)
        }
    }
}

/// A forwarded stream's responses, counted into `counts` if given, and its end told to `ended`
/// before the stream ends.
public final class ObservedForwarder: ResponseForwarder {
    let base: any ResponseForwarder
    let counts: MessageCounts?
    let ended: @Sendable (Result<Void, any Error>) -> Void
    public init(
        _ base: any ResponseForwarder, counts: MessageCounts? = nil, ended: @escaping @Sendable (Result<Void, any Error>) -> Void
    ) {
        self.base = base
        self.counts = counts
        self.ended = ended
    }
    public func sendHeaders() { base.sendHeaders() }
    public func forward(_ message: [UInt8]) -> Bool {
        counts?.responded(message.count)
        return base.forward(message)
    }
    public func whenWritable(_ body: @escaping @Sendable () -> Void) { base.whenWritable(body) }
    public func end(_ result: Result<Void, any Error>) {
        ended(result)
        base.end(result)
    }
}
