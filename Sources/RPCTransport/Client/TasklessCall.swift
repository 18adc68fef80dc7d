import NIOCore
import RPCCore
import Synchronization

/// A call with one request message, in flight without a task: the request goes out with its
/// headers in one flush, and the connection reports the headers, each response message and the
/// end to the hooks subclasses override, on the connection's event loop (the end may come from
/// whatever thread cancelled the call or failed to connect, when it never got that far). Made for
/// relays that already run on an event loop (the gateway): one object per call is its HTTP/2
/// stream's state in the connection (it is a `ClientStreamState`) and holds the relay's state
/// too. `PendingUnaryCall` collects a unary answer; a relay of server streams passes each message
/// on as it comes. Start one with `RPCChannel.start(_:_:options:)`, once.
open class TasklessCall: ClientStreamState, Cancellable, @unchecked Sendable {
    let request: [UInt8]

    private struct Shared {
        var cancelled = false
        var target: CallLink.Target?
    }
    private let shared = Mutex(Shared())
    /// Whether the call ended: set under `shared`'s lock (with `cancelled` and `target`), read
    /// without it (the connection asks when it starts the call and when its stream closes).
    private let finished = Atomic<Bool>(false)

    public init(request: [UInt8]) {
        self.request = request
        super.init()
    }

    /// Cancels the call (RST_STREAM CANCEL); the end reports CANCELLED unless the call already
    /// ended. Safe from any thread.
    public func cancel() {
        let (target, runNow): (CallLink.Target?, Bool) = shared.withLock { s in
            if finished.load(ordering: .relaxed) || s.cancelled { return (nil, false) }
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

    /// Gives `bytes` of messages `received` kept (it returned false) back to the stream's
    /// flow-control window, so the server may send that much more. Safe from any thread.
    public func consumed(_ bytes: Int) {
        guard let t = shared.withLock({ $0.target }) else { return }
        t.loop.runOnLoop { t.handler.value.consumed(t.streamID, bytes) }
    }

    // MARK: Hooks (on the connection's loop)

    /// The response headers arrived (not called for a Trailers-Only answer: see `ended`).
    open override func headersArrived(_ metadata: Metadata) {}

    /// A response message. Return true when it is used up (its bytes go back to the window at
    /// once); false to hold them until `consumed`.
    open override func received(_ message: RawMessageStream.InboundMessage) -> Bool { true }

    /// The call ended, exactly once: its status and trailers, and the headers of a Trailers-Only
    /// answer (`headers` non-nil when `headersArrived` was never called).
    open func ended(status: RPCStatus, trailers: Metadata, headers: Metadata?) {}

    // MARK: The stream's reports (ClientStreamState)

    override var isFinished: Bool { finished.load(ordering: .acquiring) }

    override func attach(to connection: ClientConnectionLink, streamID: Int32) -> Bool {
        shared.withLock { s in
            if s.cancelled { return false }
            s.target = .init(connection: connection, streamID: streamID)
            return true
        }
    }

    override func fail(_ status: RPCStatus) { finish(status: status, trailers: Metadata(), headers: Metadata()) }

    override func finish(status: RPCStatus, trailers: Metadata, headers: Metadata?) {
        let first = shared.withLock { s -> Bool in
            if finished.load(ordering: .relaxed) { return false }
            finished.store(true, ordering: .releasing)
            s.target = nil
            return true
        }
        guard first else { return }
        ended(status: status, trailers: trailers, headers: headers)
    }
}
