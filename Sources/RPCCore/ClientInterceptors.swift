import Synchronization

/// A client interceptor wraps each outgoing call, as grpc-swift 2's do: it runs around `next`
/// (the interceptors after it, then the transport starting the call), so it can change the call's
/// options (metadata such as a credential or `traceparent`, the deadline), refuse the call by
/// throwing, and wrap the call `next` returns to see its messages and how it ended
/// (`ObservedClientCall` does the counting and reports once the status is known). It works the
/// same for the four call kinds: a call is its messages each way and its status.
public protocol ClientInterceptor: Sendable {
    func intercept(
        _ method: MethodDescriptor, _ options: CallOptions, next: ClientInterceptors.Next
    ) async throws
        -> any RawClientCall
}

/// Interceptors in order (the first runs outermost) in front of a transport: a transport itself.
public struct ClientInterceptors: ClientTransport {
    public typealias Next = @Sendable (MethodDescriptor, CallOptions) async throws -> any RawClientCall

    public let base: any ClientTransport
    public let list: [any ClientInterceptor]
    private let chain: Next

    public init(base: any ClientTransport, _ list: [any ClientInterceptor]) {
        self.base = base
        self.list = list
        var next: Next = { method, options in try await base.startCall(method, options: options) }
        for interceptor in list.reversed() {
            let inner = next
            next = { method, options in try await interceptor.intercept(method, options, next: inner) }
        }
        chain = next
    }

    public func startCall(_ method: MethodDescriptor, options: CallOptions) async throws -> any RawClientCall {
        try await chain(method, options)
    }
}

/// Adds one metadata entry to every call (a credential).
public struct MetadataInterceptor: ClientInterceptor {
    public let name: String
    public let value: String
    public init(_ name: String, _ value: String) {
        self.name = name
        self.value = value
    }
    public func intercept(
        _ method: MethodDescriptor, _ options: CallOptions, next: ClientInterceptors.Next
    ) async throws
        -> any RawClientCall
    {
        var options = options
        options.metadata.set(name, value)
        return try await next(method, options)
    }
}

/// How a client call ended, as an interceptor sees it.
public struct ClientCallOutcome: Sendable {
    public var method: MethodDescriptor
    public var status: RPCStatus
    /// From the start of the call to its final status.
    public var duration: Duration
    public var requestMessages: Int
    /// Request message bytes as handed to the transport (before compression, without prefixes).
    public var requestBytes: Int
    public var responseMessages: Int
    /// Response message bytes as received (without prefixes).
    public var responseBytes: Int
}

/// A client call that counts its messages each way and tells `report` how it ended, once: when
/// its final status is first asked for (every `RPCClient` call asks), or, if nobody asks, when
/// the call is released (status CANCELLED, "the caller abandoned the call").
public final class ObservedClientCall: RawClientCall, Sendable {
    let base: any RawClientCall
    let method: MethodDescriptor
    let started: ContinuousClock.Instant
    let report: @Sendable (ClientCallOutcome) -> Void
    private let counts = MessageCounts()
    private let reported = Atomic<Bool>(false)
    public let responses: RawMessageStream

    public init(_ base: any RawClientCall, method: MethodDescriptor, report: @escaping @Sendable (ClientCallOutcome) -> Void) {
        self.base = base
        self.method = method
        self.started = .now
        self.report = report
        let counts = self.counts
        self.responses = base.responses.observed { counts.responded($0.bytes.count) }
    }

    deinit {
        if !reported.load(ordering: .relaxed) {
            finish(RPCStatus(.cancelled, "the caller abandoned the call"))
        }
    }

    public func send(_ message: [UInt8], compress: Bool) async throws {
        try await base.send(message, compress: compress)
        counts.received(message.count)
    }
    public func closeSend() async throws { try await base.closeSend() }
    public func initialMetadata() async throws -> Metadata { try await base.initialMetadata() }
    public var statusCameFromPeer: Bool { base.statusCameFromPeer }
    public func finalStatus() async -> (status: RPCStatus, trailers: Metadata) {
        let r = await base.finalStatus()
        finish(r.status)
        return r
    }
    public func cancel() { base.cancel() }

    private func finish(_ status: RPCStatus) {
        guard reported.compareExchange(expected: false, desired: true, ordering: .relaxed).exchanged else { return }
        // `counts` counts requests as `received` and responses as `responded`: the server's words.
        report(
            ClientCallOutcome(
                method: method, status: status, duration: .now - started, requestMessages: counts.requestMessages,
                requestBytes: counts.requestBytes, responseMessages: counts.responseMessages, responseBytes: counts.responseBytes))
    }
}
