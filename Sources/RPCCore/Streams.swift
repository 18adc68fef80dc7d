import Synchronization

/// The transport's side of a server response stream: raw encoded messages out.
public protocol ServerResponseSink: Sendable {
    /// Sends the response headers now (with `ServerContext.initialMetadata`) if not sent yet.
    func sendInitialMetadata() async throws
    /// Queues one encoded message; suspends while the peer is not reading (flow control).
    func write(_ message: [UInt8], compress: Bool?) async throws
}

/// Typed writer for a streaming response. `write` suspends while the client is slow, so a
/// handler never makes the server buffer without bound.
public struct ResponseWriter<Message: ProtoMessage>: Sendable {
    @usableFromInline let sink: any ServerResponseSink
    public init(sink: any ServerResponseSink) { self.sink = sink }

    /// Writes one message. `compress` overrides the call's policy for this message.
    @inlinable
    public func write(_ message: Message, compress: Bool? = nil) async throws {
        try await sink.write(message.serializedBytes(), compress: compress)
    }
    public func sendInitialMetadata() async throws { try await sink.sendInitialMetadata() }
}

/// An inbound stream of raw messages, fed by a transport on its event loop and read by one task.
/// Every message read is reported through `onConsumed` so the transport can open the HTTP/2 flow
/// control window only as fast as the handler reads.
public final class RawMessageStream: AsyncSequence, Sendable {
    public typealias Element = InboundMessage

    public struct InboundMessage: Sendable {
        public var bytes: [UInt8]
        public var compressed: Bool
        /// Bytes this message took on the wire (prefix included), for flow control.
        public var wireSize: Int
        public init(bytes: [UInt8], compressed: Bool, wireSize: Int) {
            self.bytes = bytes
            self.compressed = compressed
            self.wireSize = wireSize
        }
    }

    private struct State {
        var buffer: [InboundMessage] = []
        var head = 0
        var finished: Result<Void, any Error>? = nil
        var waiter: CheckedContinuation<InboundMessage?, any Error>? = nil
    }
    private let state = Mutex(State())
    private let onConsumed: @Sendable (Int) -> Void
    /// An observed view (`observed`): reads come from `upstream`, each told to `tap`.
    private let upstream: RawMessageStream?
    private let tap: (@Sendable (InboundMessage) -> Void)?

    public init(onConsumed: @escaping @Sendable (Int) -> Void = { _ in }) {
        self.onConsumed = onConsumed
        self.upstream = nil
        self.tap = nil
    }

    private init(upstream: RawMessageStream, tap: @escaping @Sendable (InboundMessage) -> Void) {
        self.onConsumed = { _ in }
        self.upstream = upstream
        self.tap = tap
    }

    /// The same messages, each told to `tap` as the reader takes it (an interceptor counting a
    /// call's requests). Producing into the view produces into this stream.
    public func observed(_ tap: @escaping @Sendable (InboundMessage) -> Void) -> RawMessageStream {
        RawMessageStream(upstream: self, tap: tap)
    }

    /// Producer: appends a message (or hands it straight to a waiting reader).
    public func yield(_ message: InboundMessage) {
        if let upstream { return upstream.yield(message) }
        let waiter: CheckedContinuation<InboundMessage?, any Error>? = state.withLock { s in
            if s.finished != nil { return nil }
            if let w = s.waiter { s.waiter = nil; return w }
            s.buffer.append(message)
            return nil
        }
        if let waiter {
            onConsumed(message.wireSize)
            waiter.resume(returning: message)
        }
    }

    /// Producer: ends the stream, normally or with an error (cancellation, bad frame...).
    public func finish(throwing error: (any Error)? = nil) {
        if let upstream { return upstream.finish(throwing: error) }
        let waiter: CheckedContinuation<InboundMessage?, any Error>? = state.withLock { s in
            if s.finished == nil { s.finished = error.map { .failure($0) } ?? .success(()) }
            let w = s.waiter
            s.waiter = nil
            return w
        }
        if let waiter {
            if let error { waiter.resume(throwing: error) } else { waiter.resume(returning: nil) }
        }
    }

    /// Consumer: the next message, or nil at the end.
    public func next() async throws -> InboundMessage? {
        if let upstream, let tap {
            let m = try await upstream.next()
            if let m { tap(m) }
            return m
        }
        enum Step { case value(InboundMessage), end, fail(any Error), wait }
        let step: Step = state.withLock { s in
            if s.head < s.buffer.count {
                let m = s.buffer[s.head]
                s.head += 1
                if s.head == s.buffer.count { s.buffer.removeAll(keepingCapacity: true); s.head = 0 }
                return .value(m)
            }
            switch s.finished {
            case .some(.success): return .end
            case .some(.failure(let e)): return .fail(e)
            case .none: return .wait
            }
        }
        switch step {
        case .value(let m): onConsumed(m.wireSize); return m
        case .end: return nil
        case .fail(let e): throw e
        case .wait:
            return try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation { (c: CheckedContinuation<InboundMessage?, any Error>) in
                    let immediate: Result<InboundMessage?, any Error>? = state.withLock { s in
                        if s.head < s.buffer.count {
                            let m = s.buffer[s.head]; s.head += 1
                            if s.head == s.buffer.count { s.buffer.removeAll(keepingCapacity: true); s.head = 0 }
                            return .success(m)
                        }
                        switch s.finished {
                        case .some(.success): return .success(nil)
                        case .some(.failure(let e)): return .failure(e)
                        case .none: s.waiter = c; return nil
                        }
                    }
                    if let immediate {
                        if case .success(let m?) = immediate { onConsumed(m.wireSize) }
                        c.resume(with: immediate)
                    }
                }
            } onCancel: {
                self.finish(throwing: RPCError.cancelled())
            }
        }
    }

    public struct AsyncIterator: AsyncIteratorProtocol {
        let stream: RawMessageStream
        public mutating func next() async throws -> InboundMessage? { try await stream.next() }
    }
    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(stream: self) }
}

/// Typed stream of request (server side) or response (client side) messages.
public struct MessageStream<Message: ProtoMessage>: AsyncSequence, Sendable {
    public typealias Element = Message
    let raw: RawMessageStream
    let decodeFailure: StatusCode
    public init(raw: RawMessageStream, decodeFailure: StatusCode = .invalidArgument) {
        self.raw = raw
        self.decodeFailure = decodeFailure
    }

    public struct AsyncIterator: AsyncIteratorProtocol {
        let raw: RawMessageStream
        let decodeFailure: StatusCode
        public mutating func next() async throws -> Message? {
            guard let m = try await raw.next() else { return nil }
            do { return try Message(serializedBytes: m.bytes) } catch {
                throw RPCError(decodeFailure, MessageDecodingError.describe(error, messageName: Message.protoMessageName))
            }
        }
    }
    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(raw: raw, decodeFailure: decodeFailure) }
}

extension MessageStream {
    /// A message with how it arrived.
    public struct Received: Sendable {
        public var message: Message
        /// Whether the sender compressed it (the interop tests check this; handlers rarely care).
        public var compressed: Bool
    }

    /// The same messages, each with its compressed flag.
    public var withCompressionInfo: ReceivedStream { ReceivedStream(raw: raw, decodeFailure: decodeFailure) }

    public struct ReceivedStream: AsyncSequence, Sendable {
        public typealias Element = Received
        let raw: RawMessageStream
        let decodeFailure: StatusCode
        public struct AsyncIterator: AsyncIteratorProtocol {
            let raw: RawMessageStream
            let decodeFailure: StatusCode
            public mutating func next() async throws -> Received? {
                guard let m = try await raw.next() else { return nil }
                do { return Received(message: try Message(serializedBytes: m.bytes), compressed: m.compressed) } catch {
                    throw RPCError(decodeFailure, MessageDecodingError.describe(error, messageName: Message.protoMessageName))
                }
            }
        }
        public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(raw: raw, decodeFailure: decodeFailure) }
    }
}
