import NIOCore
import RPCCore
import Synchronization

/// How a unary call made with `RPCChannel.unary(_:request:options:completion:)` ended.
public struct UnaryCallResult: Sendable {
    /// The call's status (OK, the server's error, or the transport's: UNAVAILABLE, CANCELLED,
    /// DEADLINE_EXCEEDED, ...).
    public var status: RPCStatus
    /// Response headers (empty when the call failed before any arrived).
    public var initialMetadata: Metadata
    /// The first response message, if any.
    public var response: [UInt8]?
    /// How many response messages arrived (a correct unary server sends exactly one on OK).
    public var responseCount: Int
    /// Trailing metadata, `grpc-status-details-bin` included.
    public var trailers: Metadata
}

/// A unary call in flight without a task: the request goes out with its headers in one flush
/// and the completion runs once when the call ends: on the connection's event loop when the
/// call got that far, else on whatever thread cancelled it or failed to connect (a completion
/// that touches loop-bound state must hop). Made for relays that already run on an event loop
/// (the gateway); everything else uses `RPCClient`. A relay subclasses it and overrides
/// `completed`, so that one object per call holds the relay's state too.
open class PendingUnaryCall: ClientCallObserver, Cancellable, @unchecked Sendable {
    let request: [UInt8]
    /// Dropped once called: whatever it captured (often something that holds this call, to
    /// cancel it) is released with it.
    private var completion: (@Sendable (UnaryCallResult) -> Void)?

    // On the connection's loop.
    private var headers: Metadata?
    private var response: [UInt8]?
    private var count = 0

    private struct Shared {
        var finished = false
        var cancelled = false
        var target: CallLink.Target?
    }
    private let shared = Mutex(Shared())

    init(request: [UInt8], completion: @escaping @Sendable (UnaryCallResult) -> Void) {
        self.request = request
        self.completion = completion
        #if DEBUG
        Self.live.add(1, ordering: .relaxed)
        #endif
    }

    /// For subclasses, which override `completed`; start it with `RPCChannel.start(_:_:options:)`.
    public init(request: [UInt8]) {
        self.request = request
        #if DEBUG
        Self.live.add(1, ordering: .relaxed)
        #endif
    }

    #if DEBUG
    /// Calls not yet freed (debug builds): tests check that finished calls do not leak through
    /// a reference cycle with the closures that cancel them.
    public static let live = Atomic<Int>(0)
    deinit { Self.live.subtract(1, ordering: .relaxed) }
    #endif

    /// Cancels the call (RST_STREAM CANCEL); the completion reports CANCELLED unless the call
    /// already ended. Safe from any thread.
    public func cancel() {
        let (target, runNow): (CallLink.Target?, Bool) = shared.withLock { s in
            if s.finished || s.cancelled { return (nil, false) }
            s.cancelled = true
            return (s.target, s.target == nil)
        }
        if let t = target {
            t.loop.runOnLoop { t.handler.value.cancel(t.streamID, status: RPCStatus(.cancelled, "cancelled by the client")) }
        } else if runNow {
            // Not on a connection yet: the start will find the flag; report now.
            fail(RPCStatus(.cancelled, "cancelled by the client"))
        }
    }

    // MARK: ClientCallObserver (on the connection's loop, or before it has one)

    var isFinished: Bool { shared.withLock { $0.finished } }

    func attach(handler: NIOLoopBound<ClientConnectionHandler>, loop: any EventLoop, streamID: Int32) -> Bool {
        shared.withLock { s in
            if s.cancelled { return false }
            s.target = .init(handler: handler, loop: loop, streamID: streamID)
            return true
        }
    }

    func headersArrived(_ metadata: Metadata) { headers = metadata }

    func received(_ message: RawMessageStream.InboundMessage) -> Bool {
        if response == nil { response = message.bytes }
        count += 1
        return true
    }

    func fail(_ status: RPCStatus) { finish(status: status, trailers: Metadata(), headers: nil) }

    func finish(status: RPCStatus, trailers: Metadata, headers trailersOnlyHeaders: Metadata?) {
        let first = shared.withLock { s -> Bool in
            if s.finished { return false }
            s.finished = true
            s.target = nil
            return true
        }
        guard first else { return }
        completed(
            UnaryCallResult(
                status: status, initialMetadata: headers ?? trailersOnlyHeaders ?? Metadata(),
                response: response, responseCount: count, trailers: trailers))
        response = nil
    }

    /// The call ended (exactly once): runs the completion given at init.
    open func completed(_ result: UnaryCallResult) {
        guard let completion else { return }
        self.completion = nil
        completion(result)
    }
}
