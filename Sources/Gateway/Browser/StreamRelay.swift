import RPCCore
import Synchronization

/// Runs a server-streaming call for a browser protocol (gRPC-Web, Connect streaming) and hands
/// its messages to the HTTP response as they come.
///
/// The call (the same relay a gRPC client gets, `Proxy.serverStreaming`) runs in a task of its
/// own from the moment the request is read; the HTTP head waits until the call has started
/// answering (its headers, or a first message) or has ended, so that a call that fails before
/// any message is answered in one piece (gRPC-Web's trailers-only response, with the status in
/// headers). Once the head is out, each message is written to the response body as it arrives,
/// with backpressure (a slow browser holds the upstream back through the HTTP/2 windows); the
/// end of the call becomes the protocol's last frame. When the client goes (tab closed,
/// connection lost, stream reset), the response's task is cancelled and the call with it, so
/// the upstream stream ends too.
final class StreamRelay: ServerResponseSink, Sendable {
    enum Head: Sendable {
        /// The call answers: send the head, then stream.
        case started
        /// The call ended before answering anything.
        case ended((any Error)?)
    }

    private struct State {
        var head: Head?
        var headWaiter: CheckedContinuation<Head, Never>?
        var writer: (any HTTPBodyWriter)?
        var writerGone = false
        var writerWaiters: [CheckedContinuation<(any HTTPBodyWriter)?, Never>] = []
        var outcome: Result<Void, any Error>?
        var endWaiter: CheckedContinuation<Result<Void, any Error>, Never>?
        var task: Task<Void, Never>?
        var cancelled = false
    }
    private let state = Mutex(State())
    /// One response message → the bytes of its frame in the body.
    private let encode: @Sendable ([UInt8]) throws -> [UInt8]

    init(encode: @escaping @Sendable ([UInt8]) throws -> [UInt8]) {
        self.encode = encode
    }

    /// Starts the call; `body` is the method's server-streaming handler applied to its request.
    func start(_ body: @escaping @Sendable (StreamRelay) async throws -> Void) {
        let task = Task {
            do {
                try await body(self)
                self.finish(.success(()))
            } catch {
                self.finish(.failure(error))
            }
        }
        let cancelNow = state.withLock { s in
            s.task = task
            return s.cancelled
        }
        if cancelNow { task.cancel() }
    }

    /// Ends the call (the client went away).
    func cancel() {
        let (task, waiters) = state.withLock { s in
            s.cancelled = true
            if s.writer == nil { s.writerGone = true }
            let w = s.writerWaiters
            s.writerWaiters = []
            return (s.task, w)
        }
        task?.cancel()
        for w in waiters { w.resume(returning: nil) }
    }

    /// Waits until the call answers or ends (cancelled with the caller).
    func awaitHead() async -> Head {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (c: CheckedContinuation<Head, Never>) in
                let ready: Head? = state.withLock { s in
                    if let h = s.head { return h }
                    s.headWaiter = c
                    return nil
                }
                if let ready { c.resume(returning: ready) }
            }
        } onCancel: {
            cancel()
        }
    }

    /// The response body is ready; messages waiting for it go on.
    func attach(_ writer: any HTTPBodyWriter) {
        let waiters = state.withLock { s in
            s.writer = writer
            let w = s.writerWaiters
            s.writerWaiters = []
            return w
        }
        for w in waiters { w.resume(returning: writer) }
    }

    /// Waits for the end of the call (cancelled with the caller: the client went).
    func awaitEnd() async -> Result<Void, any Error> {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (c: CheckedContinuation<Result<Void, any Error>, Never>) in
                let done: Result<Void, any Error>? = state.withLock { s in
                    if let o = s.outcome { return o }
                    s.endWaiter = c
                    return nil
                }
                if let done { c.resume(returning: done) }
            }
        } onCancel: {
            cancel()
        }
    }

    /// The body of a response whose call has started: its messages as they come (`attach`),
    /// then `last`, the protocol's final frame, of the call's status.
    func body(last: @escaping @Sendable (RPCError) -> [UInt8]) -> @Sendable (any HTTPBodyWriter) async throws -> Void {
        { writer in
            self.attach(writer)
            let status: RPCError
            switch await self.awaitEnd() {
            case .success: status = RPCError(.ok, "")
            case .failure(let e): status = ConnectHandler.rpcError(e)
            }
            try await writer.write(last(status))
        }
    }

    private func decide(_ head: Head) {
        let waiter: CheckedContinuation<Head, Never>? = state.withLock { s in
            guard s.head == nil else { return nil }
            s.head = head
            let w = s.headWaiter
            s.headWaiter = nil
            return w
        }
        waiter?.resume(returning: head)
    }

    private func finish(_ outcome: Result<Void, any Error>) {
        if case .failure(let e) = outcome { decide(.ended(e)) } else { decide(.ended(nil)) }
        // (No message can wait for the body here: the call's writes are awaited inside it.)
        let waiter = state.withLock { s in
            s.outcome = outcome
            let w = s.endWaiter
            s.endWaiter = nil
            return w
        }
        waiter?.resume(returning: outcome)
    }

    // MARK: ServerResponseSink (called by the relay)

    func sendInitialMetadata() async throws {
        decide(.started)
    }

    func write(_ message: [UInt8], compress: Bool?) async throws {
        decide(.started)
        let frame = try encode(message)
        let writer = await withCheckedContinuation { (c: CheckedContinuation<(any HTTPBodyWriter)?, Never>) in
            let ready: (any HTTPBodyWriter)?? = state.withLock { s in
                if let w = s.writer { return .some(w) }
                if s.writerGone { return .some(nil) }
                s.writerWaiters.append(c)
                return nil
            }
            if let ready { c.resume(returning: ready) }
        }
        guard let writer else { throw RPCError.cancelled("the client has gone") }
        try await writer.write(frame)
    }
}
