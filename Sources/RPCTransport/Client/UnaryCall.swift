import NIOCore
import RPCCore
import Synchronization

/// How a unary call made without a task (`PendingUnaryCall`) ended.
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

/// A unary call in flight without a task (see `TasklessCall`): `completed` runs once when the
/// call ends. A relay subclasses it and overrides `completed`, so that one object per call holds
/// the relay's state too; start it with `RPCChannel.start(_:_:options:)`.
open class PendingUnaryCall: TasklessCall, @unchecked Sendable {
    // On the connection's loop.
    private var responseHeaders: Metadata?
    private var response: [UInt8]?
    private var count = 0

    public override init(request: [UInt8]) {
        super.init(request: request)
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

    public override func headersArrived(_ metadata: Metadata) { responseHeaders = metadata }

    public override func received(_ message: RawMessageStream.InboundMessage) -> Bool {
        if response == nil { response = message.bytes }
        count += 1
        return true
    }

    public override func ended(status: RPCStatus, trailers: Metadata, headers trailersOnlyHeaders: Metadata?) {
        // The response and headers moved out, not copied: this is their last use.
        completed(
            UnaryCallResult(
                status: status, initialMetadata: responseHeaders.take() ?? trailersOnlyHeaders ?? Metadata(),
                response: response.take(), responseCount: count, trailers: trailers))
    }

    /// The call ended (exactly once). Subclasses answer from here.
    open func completed(_ result: consuming UnaryCallResult) {}
}
