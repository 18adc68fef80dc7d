import Synchronization

/// Everything a handler knows about its call besides the messages, and the response metadata it
/// may set. One per call; safe to share with tasks the handler starts.
public final class ServerContext: Sendable {
    public let method: MethodDescriptor
    /// Request metadata, reserved headers (`:path`, `grpc-*`, `content-type`, ...) removed.
    public let requestMetadata: Metadata
    /// When the client gives up (`grpc-timeout`), if it said. The transport cancels the handler then.
    public let deadline: ContinuousClock.Instant?
    /// The client's address (`127.0.0.1:50123`).
    public let peer: String
    /// The client's host without the port (`127.0.0.1`, `::1`): what rate limits and
    /// `x-forwarded-for` use.
    public let peerHost: String
    /// `:authority` of the request.
    public let authority: String
    /// Whether the (single) request message of a unary or server-streaming call arrived compressed.
    public let requestCompressed: Bool
    /// Where the call's tasks run (the connection's event loop), for tasks started on its behalf
    /// outside the handler's own (an interceptor's around a task-free handler); nil: anywhere.
    public let executor: (any TaskExecutor)?

    private struct State: Sendable {
        var initialMetadata = Metadata()
        var trailers = Metadata()
        var compressResponses = false
        /// A handful at most: a list is cheaper than a dictionary (no hashing, one allocation).
        var values: [(key: String, value: any Sendable)] = []
    }
    private let state: Mutex<State>
    /// Set once the handler changed the response's headers, trailers or compression: until then
    /// they are read as they started (empty; `startedCompressed`) without the lock, which the
    /// transport would otherwise take three times on every call.
    private let responseChanged = Atomic<Bool>(false)
    private let startedCompressed: Bool

    public init(
        method: MethodDescriptor, requestMetadata: Metadata, deadline: ContinuousClock.Instant?,
        peer: String, peerHost: String? = nil, authority: String = "", requestCompressed: Bool = false,
        compressResponses: Bool = false, executor: (any TaskExecutor)? = nil
    ) {
        self.executor = executor
        self.method = method
        self.requestMetadata = requestMetadata
        self.deadline = deadline
        self.peer = peer
        self.peerHost = peerHost ?? Self.host(ofPeer: peer)
        self.authority = authority
        self.requestCompressed = requestCompressed
        self.state = Mutex(State(compressResponses: compressResponses))
        self.startedCompressed = compressResponses
    }

    /// Metadata sent in the response HEADERS, before the first message (or with the status when
    /// there is none). Changes after the headers went out are ignored.
    public var initialMetadata: Metadata {
        get { responseChanged.load(ordering: .acquiring) ? state.withLock { $0.initialMetadata } : Metadata() }
        set {
            state.withLock { $0.initialMetadata = newValue }
            responseChanged.store(true, ordering: .releasing)
        }
    }
    /// Metadata sent in the trailers with the status.
    public var trailers: Metadata {
        get { responseChanged.load(ordering: .acquiring) ? state.withLock { $0.trailers } : Metadata() }
        set {
            state.withLock { $0.trailers = newValue }
            responseChanged.store(true, ordering: .releasing)
        }
    }
    /// Whether responses are gzip-compressed (only honoured when the client accepts gzip).
    public var compressResponses: Bool {
        get { responseChanged.load(ordering: .acquiring) ? state.withLock { $0.compressResponses } : startedCompressed }
        set {
            state.withLock { $0.compressResponses = newValue }
            responseChanged.store(true, ordering: .releasing)
        }
    }

    /// Values interceptors attach for handlers (the verified caller identity, ...).
    public subscript<T: Sendable>(key key: String, as type: T.Type = T.self) -> T? {
        get { value(forKey: key) as? T }
        set { setValue(newValue.map { $0 as any Sendable }, forKey: key) }
    }

    /// Attaches `value` under `key` (nil removes it). Not generic, for the same reason as
    /// `value(forKey:)`: the subscript's setter, unspecialized across modules, looked up the
    /// metadata of its element tuple on every call (≈ 50 ns a call in every service that took a
    /// relayed call, measured).
    public func setValue(_ value: (any Sendable)?, forKey key: String) {
        state.withLock { s in
            let i = s.values.firstIndex { $0.key == key }
            switch (i, value) {
            case (let i?, let v?): s.values[i].value = v
            case (let i?, nil): s.values.remove(at: i)
            case (nil, let v?):
                // Room for what a call usually gets (a caller flag, an identity, a trace) at once.
                if s.values.capacity == 0 { s.values.reserveCapacity(4) }
                s.values.append((key, v))
            case (nil, nil): break
            }
        }
    }

    /// The value attached under `key`, as it was stored. Not generic, so a caller on every call's
    /// path (the relay reading its upstream trace) casts to its own concrete type without the
    /// generic subscript's metadata lookups (about 0.1 µs a read, measured).
    public func value(forKey key: String) -> (any Sendable)? {
        state.withLock { s in s.values.first { $0.key == key }?.value }
    }

    /// `127.0.0.1:5000` → `127.0.0.1`, `[::1]:5000` → `::1`; anything else unchanged.
    public static func host(ofPeer peer: String) -> String {
        let u = peer.utf8
        if u.first == UInt8(ascii: "["), let close = u.firstIndex(of: UInt8(ascii: "]")) {
            return String(peer[u.index(after: u.startIndex)..<close])
        }
        var colon: String.Index? = nil
        var i = u.startIndex
        while i < u.endIndex {
            if u[i] == UInt8(ascii: ":") {
                if colon != nil { return peer }  // a bare IPv6 address
                colon = i
            }
            i = u.index(after: i)
        }
        if let colon { return String(peer[..<colon]) }
        return peer
    }

    /// Time left before the deadline, if any.
    public var timeRemaining: Duration? { deadline.map { $0 - .now } }
}
