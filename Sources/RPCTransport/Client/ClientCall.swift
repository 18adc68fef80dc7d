import NIOCore
import RPCCore
import Synchronization

/// Where a call lives once started: its connection handler, loop and stream id.
final class CallLink: Sendable {
    struct Target: Sendable {
        let connection: ClientConnectionLink
        let streamID: Int32
        var handler: NIOLoopBound<ClientConnectionHandler> { connection.handler }
        var loop: any EventLoop { connection.loop }
    }
    let target = Mutex<Target?>(nil)

    /// Runs `body` on the connection's loop with the handler, if the call is attached.
    func withHandler(_ body: @escaping @Sendable (ClientConnectionHandler, Int32) -> Void) -> Bool {
        guard let t = target.withLock({ $0 }) else { return false }
        t.loop.runOnLoop { body(t.handler.value, t.streamID) }
        return true
    }
}

/// A client call as `RPCClient` sees it (`RawClientCall`): thread-safe, every operation hops to the
/// connection's event loop where the stream state lives.
final class ClientCall: RawClientCall, Sendable {
    let responses: RawMessageStream
    private let link: CallLink

    private struct State {
        var headers: Result<Metadata, RPCError>?
        var headerWaiters: [CheckedContinuation<Metadata, any Error>] = []
        var status: (RPCStatus, Metadata)?
        var statusFromPeer = false
        var statusWaiters: [CheckedContinuation<(status: RPCStatus, trailers: Metadata), Never>] = []
    }
    private let state = Mutex(State())

    init() {
        let link = CallLink()
        self.link = link
        self.responses = RawMessageStream(onConsumed: { bytes in
            _ = link.withHandler { h, id in h.consumed(id, bytes) }
        })
    }

    func attach(to connection: ClientConnectionLink, streamID: Int32) -> Bool {
        link.target.withLock { $0 = .init(connection: connection, streamID: streamID) }
        return true
    }

    func received(_ message: RawMessageStream.InboundMessage) -> Bool {
        responses.yield(message)
        return false
    }

    var isFinished: Bool { state.withLock { $0.status != nil } }

    // MARK: From the connection (on its loop)

    func headersArrived(_ metadata: Metadata) {
        let waiters: [CheckedContinuation<Metadata, any Error>] = state.withLock { s in
            guard s.headers == nil else { return [] }
            s.headers = .success(metadata)
            defer { s.headerWaiters = [] }
            return s.headerWaiters
        }
        for w in waiters { w.resume(returning: metadata) }
    }

    func fail(_ status: RPCStatus) { finish(status: status, trailers: Metadata(), headers: nil) }

    func finish(status: RPCStatus, trailers: Metadata, headers: Metadata?, fromPeer: Bool = false) {
        let error = RPCError(status.code, status.message, trailers: trailers)
        let (hw, sw, headerResult) = state.withLock {
            s -> (
                [CheckedContinuation<Metadata, any Error>], [CheckedContinuation<(status: RPCStatus, trailers: Metadata), Never>],
                Result<Metadata, RPCError>?
            ) in
            guard s.status == nil else { return ([], [], nil) }
            s.status = (status, trailers)
            s.statusFromPeer = fromPeer
            var result: Result<Metadata, RPCError>? = nil
            if s.headers == nil {
                s.headers = status.code == .ok ? .success(headers ?? Metadata()) : .failure(error)
                result = s.headers
            }
            defer { s.headerWaiters = []; s.statusWaiters = [] }
            return (s.headerWaiters, s.statusWaiters, result)
        }
        if let headerResult {
            for w in hw { w.resume(with: headerResult.mapError { $0 as any Error }) }
        }
        responses.finish(throwing: status.code == .ok ? nil : error)
        for w in sw { w.resume(returning: (status, trailers)) }
    }

    // MARK: RawClientCall

    func send(_ message: [UInt8], compress: Bool) async throws {
        if let (status, _) = state.withLock({ $0.status }) {
            throw RPCError(status.code == .ok ? .failedPrecondition : status.code, status.code == .ok ? "the call has ended" : status.message)
        }
        do {
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<Void, any Error>) in
                if !link.withHandler({ h, id in h.send(id, message, compress: compress, c) }) {
                    c.resume(throwing: RPCError(.unavailable, "call is not connected"))
                }
            }
        } catch {
            // The call may have ended meanwhile (connection lost, server answered): its status
            // says why better than "stream closed".
            if let (status, trailers) = state.withLock({ $0.status }), status.code != .ok {
                throw RPCError(status.code, status.message, trailers: trailers)
            }
            throw error
        }
    }

    func closeSend() async throws {
        _ = link.withHandler { h, id in h.closeSend(id) }
    }

    func initialMetadata() async throws -> Metadata {
        try await withCheckedThrowingContinuation { (c: CheckedContinuation<Metadata, any Error>) in
            let ready: Result<Metadata, RPCError>? = state.withLock { s in
                if let h = s.headers { return h }
                s.headerWaiters.append(c)
                return nil
            }
            if let ready { c.resume(with: ready.mapError { $0 as any Error }) }
        }
    }

    var statusCameFromPeer: Bool { state.withLock { $0.statusFromPeer } }

    func finalStatus() async -> (status: RPCStatus, trailers: Metadata) {
        await withCheckedContinuation { (c: CheckedContinuation<(status: RPCStatus, trailers: Metadata), Never>) in
            let ready: (RPCStatus, Metadata)? = state.withLock { s in
                if let st = s.status { return st }
                s.statusWaiters.append(c)
                return nil
            }
            if let ready { c.resume(returning: ready) }
        }
    }

    func cancel() {
        if isFinished { return }
        if !link.withHandler({ h, id in h.cancel(id, status: RPCStatus(.cancelled, "cancelled by the client")) }) {
            fail(RPCStatus(.cancelled, "cancelled by the client"))
        }
    }
}
