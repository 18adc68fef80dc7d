import Synchronization

/// Server interceptors that wrap the call, as grpc-swift 2's do: each runs around the rest of the
/// chain (`next`: the interceptors after it, then the method's handler), so it can refuse the call,
/// change what the handler sees (the request, the responses, values on the context) and see how
/// the call ended: the status (`next` returns or throws), how long it took (around `next`), and
/// the messages and bytes each way (the request it passes on, the response `next` returns or the
/// sink it gives the handler; `ServerCall.observingMessages` counts them).
///
/// A server wraps each method's handler once, when it is built (`Router(services:interceptors:)`),
/// so a call runs a chain of closures made beforehand: nothing is allocated per call for the chain
/// itself, and a process with no interceptor runs its handlers as they are.
///
/// Two ways in, one per kind of handler:
/// - `intercept`: every call whose handler runs in a task (the four call kinds of a service);
/// - `interceptForwarded`: calls whose handler answers without a task (`unaryForwarding`,
///   `serverStreamingForwarding`: the gateway's relay), on the connection's event loop. It must
///   not block; an interceptor that can decide at once calls `next` there and then, and the call
///   stays task-free. The default runs `intercept` in a task, so every interceptor works on every
///   handler; the cheap ones (`CallCheck`, the tracing interceptor) implement both.
public protocol ServerInterceptor: Sendable {
    /// Runs around one call whose handler runs in a task. Returns the response message of a call
    /// that answers with one (unary, client streaming) as `next` gave it (or changed); streaming
    /// responses go through `call.responses` and `next` returns `[]`. Throwing refuses or fails
    /// the call with that error.
    func intercept(_ call: ServerCall, next: ServerCall.Next) async throws -> [UInt8]

    /// Runs around one call whose handler answers without a task, on the connection's event
    /// loop: call `next` (now, or later from anywhere) with the call, or answer it yourself
    /// (`call.fail`). Wrap `call.answer` to see the outcome. Returns what stops the work when the
    /// call ends early (what `next` returned, or something of your own that cancels it).
    func interceptForwarded(_ call: ForwardedCall, next: @escaping ForwardedCall.Next) -> (any Cancellable)?

    /// Decides from the request headers alone, when they arrive and before any request byte is
    /// read or buffered: an error refuses the call at once (the client gets it as a Trailers-Only
    /// response; its body is discarded unread; no interceptor runs), nil lets it go on. Must be
    /// quick and must not block: the transport calls it on the connection's event loop for every
    /// routed call. The default objects to nothing. `CredentialCheck.missingCredential` is the
    /// check every process wants: no credential at all on a method that needs one.
    func rejectAtHeaders(_ method: MethodDescriptor, _ metadata: Metadata) -> RPCError?

    /// What runs for `method`'s calls, decided once when the server is built: this interceptor
    /// (the default), one made for the method (with what it would otherwise work out per call),
    /// or nil to stay out of its calls (tracing leaves health probes alone).
    func specialized(for method: MethodDescriptor) -> (any ServerInterceptor)?

    /// Whether this interceptor has nothing to do for this call, seen from its context before
    /// it would run: the chain then goes straight on to the next one, without this
    /// interceptor's frame (every async frame around a handler costs its task; tracing passes
    /// over a relayed call the gateway did not sample). Must be quick. The default: never.
    func passes(_ context: ServerContext) -> Bool
}

extension ServerInterceptor {
    public func rejectAtHeaders(_ method: MethodDescriptor, _ metadata: Metadata) -> RPCError? { nil }
    public func specialized(for method: MethodDescriptor) -> (any ServerInterceptor)? { self }
    public func passes(_ context: ServerContext) -> Bool { false }

    /// Runs `intercept` in a task around the forwarded call (see `ForwardedCall.inTask`).
    public func interceptForwarded(_ call: ForwardedCall, next: @escaping ForwardedCall.Next) -> (any Cancellable)? {
        call.inTask(next) { call, next in try await self.intercept(call, next: next) }
    }
}

/// One call as an interceptor sees it, whatever its kind.
public struct ServerCall: Sendable {
    /// What the rest of the chain is: the interceptors after this one, then the handler.
    public typealias Next = @Sendable (ServerCall) async throws -> [UInt8]

    public enum Request: Sendable {
        /// The one request message of a unary or server-streaming call (for a browser call, as
        /// the browser sent it: decoded after the interceptors).
        case message([UInt8])
        /// The request stream of a client-streaming or bidirectional call.
        case stream(RawMessageStream)
    }

    public var context: ServerContext
    public var request: Request
    /// Where a server-streaming or bidirectional call's responses go; nil when the call answers
    /// with the one message `next` returns.
    public var responses: (any ServerResponseSink)?

    public init(context: ServerContext, request: Request, responses: (any ServerResponseSink)? = nil) {
        self.context = context
        self.request = request
        self.responses = responses
    }

    public var method: MethodDescriptor { context.method }

    /// The one request message, for the handlers that take one.
    public func message() throws -> [UInt8] {
        if case .message(let m) = request { return m }
        throw RPCError(.internal, "an interceptor gave \(method.path) a request stream where it takes one message")
    }
    /// The request stream, for the handlers that read one.
    public func stream() throws -> RawMessageStream {
        if case .stream(let s) = request { return s }
        throw RPCError(.internal, "an interceptor gave \(method.path) one request message where it reads a stream")
    }
    /// Where the responses go, for the handlers that stream them.
    public func sink() throws -> any ServerResponseSink {
        if let responses { return responses }
        throw RPCError(.internal, "an interceptor took the response stream of \(method.path) away")
    }

    /// This call with its request and response messages counted into `counts` as the handler
    /// reads and writes them (a unary response is counted by the caller of `next`, from what it
    /// returns: `counts.responded(_:)`).
    public func observingMessages(_ counts: MessageCounts) -> ServerCall {
        var call = self
        switch request {
        case .message(let m): counts.received(m.count)
        case .stream(let s): call.request = .stream(s.observed { counts.received($0.bytes.count) })
        }
        if let responses { call.responses = CountingSink(base: responses, counts: counts) }
        return call
    }
}

/// Messages and bytes of one call, each way (message bytes without their 5-byte prefix).
public final class MessageCounts: Sendable {
    private let lock = Mutex<(Int, Int, Int, Int)>((0, 0, 0, 0))
    public init() {}
    public func received(_ bytes: Int) {
        lock.withLock {
            $0.0 += 1; $0.1 += bytes
        }
    }
    public func responded(_ bytes: Int) {
        lock.withLock {
            $0.2 += 1; $0.3 += bytes
        }
    }
    public var requestMessages: Int { lock.withLock { $0.0 } }
    public var requestBytes: Int { lock.withLock { $0.1 } }
    public var responseMessages: Int { lock.withLock { $0.2 } }
    public var responseBytes: Int { lock.withLock { $0.3 } }
}

struct CountingSink: ServerResponseSink {
    let base: any ServerResponseSink
    let counts: MessageCounts
    func sendInitialMetadata() async throws { try await base.sendInitialMetadata() }
    func write(_ message: [UInt8], compress: Bool?) async throws {
        try await base.write(message, compress: compress)
        counts.responded(message.count)
    }
}

/// A call whose handler answers without a task (`unaryForwarding`, `serverStreamingForwarding`).
public struct ForwardedCall: Sendable {
    public typealias Next = @Sendable (ForwardedCall) -> (any Cancellable)?

    /// Where the answer goes: wrap it to see the outcome (the response, each streamed message,
    /// the end).
    public enum Answer: Sendable {
        case message(any UnaryResponder)
        case stream(any ResponseForwarder)

        /// Ends the call with `error`.
        public func fail(_ error: any Error) {
            switch self {
            case .message(let r): r.respond(.failure(error))
            case .stream(let f): f.end(.failure(error))
            }
        }
    }

    public var context: ServerContext
    /// The one request message.
    public var request: [UInt8]
    public var answer: Answer

    public init(context: ServerContext, request: [UInt8], answer: Answer) {
        self.context = context
        self.request = request
        self.answer = answer
    }

    public var method: MethodDescriptor { context.method }

    /// Ends the call with `error` (an interceptor refusing it). Exactly once, and only if `next`
    /// was not called.
    public func fail(_ error: any Error) { answer.fail(error) }

    /// Runs `body` (an async interceptor's `intercept`) in a task around this call (on
    /// `context.executor`): `next`
    /// becomes an async function whose handler answers into a continuation (unary) or into the
    /// `ServerCall`'s responses (streams), and the interceptor's result answers the call. The
    /// call's early end cancels the task and whatever `next` started; a call cancelled while
    /// `body` waited (a key fetch) never reaches `next`.
    public func inTask(
        _ next: @escaping Next, _ body: @escaping @Sendable (ServerCall, ServerCall.Next) async throws -> [UInt8]
    ) -> any Cancellable {
        let work = CallCancellation()
        let forwarded = self
        // On the connection's loop, as the transport runs handlers (per-loop state, such as the
        // gateway's upstream connections, is found from there).
        let task = Task(executorPreference: context.executor) {
            switch forwarded.answer {
            case .message(let responder):
                let result: Result<[UInt8], any Error>
                do {
                    result = .success(
                        try await body(ServerCall(context: forwarded.context, request: .message(forwarded.request))) { call in
                            try Task.checkCancellation()
                            let context = call.context
                            let request = try call.message()
                            return try await withCheckedThrowingContinuation { continuation in
                                let answer = ClosureResponder { continuation.resume(with: $0) }
                                if let started = next(ForwardedCall(context: context, request: request, answer: .message(answer))) {
                                    work.onCancel(cancelling: started)
                                }
                            }
                        })
                } catch {
                    result = .failure(error)
                }
                responder.respond(result)
            case .stream(let forwarder):
                let sink = ForwarderSink(forwarder)
                do {
                    _ = try await body(ServerCall(context: forwarded.context, request: .message(forwarded.request), responses: sink)) {
                        call in
                        try Task.checkCancellation()
                        let bridge = ForwardedResponses()
                        if let started = next(ForwardedCall(context: call.context, request: try call.message(), answer: .stream(bridge))) {
                            work.onCancel(cancelling: started)
                        }
                        try await bridge.pump(into: call.sink())
                        return []
                    }
                    forwarder.end(.success(()))
                } catch {
                    forwarder.end(.failure(error))
                }
            }
        }
        return InterceptorTask(task: task, work: work)
    }
}

/// An interceptor's task around a forwarded call, and the work `next` started from it.
final class InterceptorTask: Cancellable {
    let task: Task<Void, Never>
    let work: CallCancellation
    init(task: Task<Void, Never>, work: CallCancellation) {
        self.task = task
        self.work = work
    }
    func cancel() {
        task.cancel()
        work.cancel()
    }
}

/// A `ResponseForwarder` written as an async sink (an async interceptor around a forwarded
/// stream): each write waits until the forwarder has room.
struct ForwarderSink: ServerResponseSink {
    let forwarder: any ResponseForwarder
    init(_ forwarder: any ResponseForwarder) { self.forwarder = forwarder }
    func sendInitialMetadata() async throws { forwarder.sendHeaders() }
    func write(_ message: [UInt8], compress: Bool?) async throws {
        if forwarder.forward(message) { return }
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in forwarder.whenWritable { c.resume() } }
    }
}

/// An interceptor that only decides whether a call goes on, before its handler runs (and may
/// attach values to the context: the caller's verified identity): the access policy. It runs in
/// the chain like any interceptor, at its place, and keeps the gateway's relay task-free whenever
/// it can decide at once.
public protocol CallCheck: ServerInterceptor {
    /// Lets the call go on, or throws an `RPCError` to refuse it.
    func check(_ context: ServerContext) async throws
    /// Decides without suspending when it can: true when the call may go on (same effects as
    /// `check`), a thrown error to refuse it, false when only `check` can decide; `check` then
    /// runs (in a task) with the same context, where anything already done can be noted so it is
    /// not done twice.
    func checkImmediately(_ context: ServerContext) throws -> Bool
}

extension CallCheck {
    public func checkImmediately(_ context: ServerContext) throws -> Bool { false }

    public func intercept(_ call: ServerCall, next: ServerCall.Next) async throws -> [UInt8] {
        try await check(call.context)
        return try await next(call)
    }

    public func interceptForwarded(_ call: ForwardedCall, next: @escaping ForwardedCall.Next) -> (any Cancellable)? {
        decideForwarded(call.context, go: { next(call) }, refuse: call.fail, later: { call.inTask(next) { try await self.checkThenNext($0, $1) } })
    }

    /// A forwarded call's decision, without the `ForwardedCall` when it is decided at once (the
    /// usual case: `ServerInterceptors.wrap` calls this straight from the handler's entry when a
    /// check is the only interceptor, as on the gateway's relay): `go` when the call may go on,
    /// `refuse` with the error that refuses it, `later` (a task around `check`) when only
    /// `check` can decide.
    @inline(__always)
    func decideForwarded(
        _ context: ServerContext, go: () -> (any Cancellable)?, refuse: (any Error) -> Void, later: () -> (any Cancellable)?
    ) -> (any Cancellable)? {
        do {
            if try checkImmediately(context) { return go() }
        } catch {
            refuse(error)
            return nil
        }
        return later()
    }

    /// What runs in the task when only `check` can decide: the check, then the rest of the chain.
    func checkThenNext(_ call: ServerCall, _ next: ServerCall.Next) async throws -> [UInt8] {
        try await check(call.context)
        return try await next(call)
    }
}

/// A server's interceptors in order (the first runs outermost), as one chain.
public struct ServerInterceptors: Sendable {
    public let list: [any ServerInterceptor]
    /// Each interceptor's `rejectAtHeaders`, bound once: calling a method on an existential in a
    /// loop or a closure copies the value in it on every call.
    private let rejecters: [@Sendable (MethodDescriptor, Metadata) -> RPCError?]

    public init(_ list: [any ServerInterceptor]) {
        self.list = list
        rejecters = list.map { $0.rejectAtHeaders }
    }
    public var isEmpty: Bool { list.isEmpty }

    /// The first refusal at the headers, if any interceptor refuses.
    public func rejectAtHeaders(_ method: MethodDescriptor, _ metadata: Metadata) -> RPCError? {
        for reject in rejecters {
            if let error = reject(method, metadata) { return error }
        }
        return nil
    }

    /// `handler`, `method`'s, with every call running through the chain first (each interceptor
    /// as `specialized(for:)` gives it); `handler` itself when none takes part.
    public func wrap(_ handler: RawHandler, for method: MethodDescriptor) -> RawHandler {
        let chain = ServerInterceptors(list.compactMap { $0.specialized(for: method) })
        return chain.wrap(handler)
    }

    /// `handler` with every call running through the chain first, as it is. A `unaryRelay` is
    /// kept when its own check is the whole chain (then nothing else would run), and when the
    /// rest of the chain is `RelayGate`s (a call they all pass is relayed; any other runs
    /// through the chain: `GatedRelay`); otherwise every call takes its context path, through
    /// the chain.
    public func wrap(_ handler: RawHandler) -> RawHandler {
        if case .unaryRelay(let relay) = handler {
            let rest: ArraySlice<any ServerInterceptor>
            if let check = relay.check {
                guard let last = list.last, (last as AnyObject) === (check as AnyObject) else { return wrap(handler.withContext) }
                rest = list.dropLast()
            } else {
                rest = list[...]
            }
            if rest.isEmpty { return handler }
            let gates = rest.compactMap { $0 as? any RelayGate }
            guard gates.count == rest.count, case .unaryForwarding(let chained) = wrap(handler.withContext) else {
                return wrap(handler.withContext)
            }
            return .unaryRelay(GatedRelay(relay, gates: gates, chained: chained))
        }
        guard !list.isEmpty else { return handler }
        switch handler {
        case .unary(let body):
            let chain = self.selectingChain { call in try await body(call.message(), call.context) }
            return .unary { request, context in try await chain(context)(ServerCall(context: context, request: .message(request))) }
        case .serverStreaming(let body):
            let chain = self.selectingChain { call in
                try await body(call.message(), call.sink(), call.context)
                return []
            }
            return .serverStreaming { request, sink, context in
                _ = try await chain(context)(ServerCall(context: context, request: .message(request), responses: sink))
            }
        case .clientStreaming(let body):
            let chain = self.selectingChain { call in try await body(call.stream(), call.context) }
            return .clientStreaming { requests, context in
                try await chain(context)(ServerCall(context: context, request: .stream(requests)))
            }
        case .bidirectionalStreaming(let body):
            let chain = self.selectingChain { call in
                try await body(call.stream(), call.sink(), call.context)
                return []
            }
            return .bidirectionalStreaming { requests, sink, context in
                _ = try await chain(context)(ServerCall(context: context, request: .stream(requests), responses: sink))
            }
        case .unaryForwarding(let body):
            let terminal: ForwardedCall.Next = { call in
                guard case .message(let responder) = call.answer else {
                    call.fail(RPCError(.internal, "an interceptor gave a unary call a stream's answer"))
                    return nil
                }
                return body(call.request, call.context, responder)
            }
            if let check = onlyCheck {
                // The check decides at the entry; a task around the rest only when it cannot.
                return .unaryForwarding { request, context, responder in
                    Self.decide(check, context, request, terminal, go: { body(request, context, responder) }) { .message(responder) }
                }
            }
            let chain = forwardedChain(terminal)
            return .unaryForwarding { request, context, responder in
                chain(ForwardedCall(context: context, request: request, answer: .message(responder)))
            }
        case .unaryRelay:
            preconditionFailure("handled above")
        case .serverStreamingForwarding(let body):
            let terminal: ForwardedCall.Next = { call in
                guard case .stream(let forwarder) = call.answer else {
                    call.fail(RPCError(.internal, "an interceptor gave a streaming call a unary answer"))
                    return nil
                }
                return body(call.request, call.context, forwarder)
            }
            if let check = onlyCheck {
                return .serverStreamingForwarding { request, context, responses in
                    Self.decide(check, context, request, terminal, go: { body(request, context, responses) }) { .stream(responses) }
                }
            }
            let chain = forwardedChain(terminal)
            return .serverStreamingForwarding { request, context, responses in
                chain(ForwardedCall(context: context, request: request, answer: .stream(responses)))
            }
        }
    }

    /// The chain's one interceptor when it is a `CallCheck` (the gateway's policy, with tracing
    /// off): a forwarded call is then decided at the handler's entry, without the `ForwardedCall`
    /// and the two closures around it that the chain would pass it through (about 4 retains and
    /// 5 releases per relayed call, measured). The same decision as the chain's: a `CallCheck`'s
    /// part in a forwarded chain is `CallCheck.interceptForwarded`, which is `decideForwarded`.
    private var onlyCheck: (any CallCheck)? { list.count == 1 ? list[0] as? any CallCheck : nil }

    /// `onlyCheck`'s decision on a forwarded call: `go` (the handler) when it passes or says yes,
    /// the refusal to the call's answer, else a task around `check` and then `rest`.
    private static func decide(
        _ check: any CallCheck, _ context: ServerContext, _ request: [UInt8], _ rest: @escaping ForwardedCall.Next,
        go: () -> (any Cancellable)?, answer: () -> ForwardedCall.Answer
    ) -> (any Cancellable)? {
        if check.passes(context) { return go() }
        return check.decideForwarded(
            context, go: go, refuse: { answer().fail($0) },
            later: { ForwardedCall(context: context, request: request, answer: answer()).inTask(rest) { try await check.checkThenNext($0, $1) } })
    }

    /// The chain in front of `terminal`, chosen per call before any of it runs: without the
    /// first interceptor when it `passes` the call, so that passing costs no frame at all (the
    /// handler's entry calls the chosen chain directly).
    public func selectingChain(_ terminal: @escaping ServerCall.Next) -> @Sendable (ServerContext) -> ServerCall.Next {
        guard let first = list.first else { return { _ in terminal } }
        let rest = ServerInterceptors(Array(list.dropFirst()))
        let selectRest = rest.selectingChain(terminal), restChain = rest.chain(terminal)
        let intercept = first.intercept, passes = first.passes
        let full: ServerCall.Next = { call in try await intercept(call, restChain) }
        // Passed: the rest chosen the same way, so a call runs through exactly the frames it
        // would if the interceptor were not there at all.
        return { context in passes(context) ? selectRest(context) : full }
    }

    /// The chain in front of `terminal` (the work itself), for callers that run a call's parts
    /// in their own order (the gateway's browser protocols decode the request inside it).
    public func chain(_ terminal: @escaping ServerCall.Next) -> ServerCall.Next {
        var next = terminal
        for interceptor in list.reversed() {
            // Bound once (a call on the existential in the closure would copy it every call).
            let inner = next, intercept = interceptor.intercept, passes = interceptor.passes
            next = { call in
                if passes(call.context) { return try await inner(call) }
                return try await intercept(call, inner)
            }
        }
        return next
    }

    /// The same for calls answered without a task.
    public func forwardedChain(_ terminal: @escaping ForwardedCall.Next) -> ForwardedCall.Next {
        var next = terminal
        for interceptor in list.reversed() {
            let inner = next, intercept = interceptor.interceptForwarded, passes = interceptor.passes
            next = { call in passes(call.context) ? inner(call) : intercept(call, inner) }
        }
        return next
    }
}
