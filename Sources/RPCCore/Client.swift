public struct CallOptions: Sendable {
    /// Relative deadline; sent as `grpc-timeout` and enforced locally.
    public var timeout: Duration?
    public var metadata: Metadata
    /// Metadata a relay passes on as its client's header block carried it (`MetadataBytes`),
    /// sent after `metadata`, lent to nghttp2 as it is when clean.
    public var forwardedMetadata = MetadataBytes()
    /// Entries a relay adds after those (its own, made once: the client's address), the same way.
    public var addedMetadata = MetadataBytes()
    /// Compress request messages with gzip.
    public var compressRequests: Bool
    /// Without a `timeout`: ends the call with DEADLINE_EXCEEDED and this limit's message once it
    /// has run `after`, without telling the server (no `grpc-timeout` goes out). For a relay that
    /// caps calls whose own clients set no deadline.
    public var limit: CallLimit?

    public init(timeout: Duration? = nil, metadata: Metadata = Metadata(), compressRequests: Bool = false, limit: CallLimit? = nil) {
        self.timeout = timeout
        self.metadata = metadata
        self.compressRequests = compressRequests
        self.limit = limit
    }
    public static let defaults = CallOptions()
}

/// How long a call may run at most when it has no deadline of its own, and what it ends with.
public struct CallLimit: Sendable {
    /// How long, in nanoseconds (kept so: a transport arms its timer from it on every call, with
    /// no `Duration` arithmetic).
    public var nanoseconds: Int64
    public var after: Duration {
        get { .nanoseconds(nanoseconds) }
        set { nanoseconds = Int64(newValue.wholeNanoseconds) }
    }
    public var message: String
    public init(after: Duration, message: String) {
        self.nanoseconds = Int64(after.wholeNanoseconds)
        self.message = message
    }
}

/// A client-side call as a transport exposes it: raw messages both ways. One task sends, one
/// reads; either may cancel (`cancel()`: RST_STREAM CANCEL).
public protocol RawClientCall: Cancellable {
    /// Sends one encoded message; suspends while the server is not reading.
    func send(_ message: [UInt8], compress: Bool) async throws
    /// Half-closes the request stream.
    func closeSend() async throws
    /// The response headers (initial metadata); throws the call's error for a Trailers-Only reply.
    func initialMetadata() async throws -> Metadata
    /// Response messages, ending when the server ends the stream.
    var responses: RawMessageStream { get }
    /// The final status and trailing metadata (waits for them).
    func finalStatus() async -> (status: RPCStatus, trailers: Metadata)
    /// Whether the final status is the server's own (its `grpc-status` arrived) rather than one
    /// the client's transport made: no connection, the connection lost, a reset, a deadline, a
    /// malformed response. Read once `finalStatus()` has returned. A proxy passes the server's
    /// status on as it is and words its own (`Gateway`: the upstream named, not its address).
    var statusCameFromPeer: Bool { get }
}

extension RawClientCall {
    /// A call that cannot tell: its status is taken as the server's.
    public var statusCameFromPeer: Bool { true }
}

/// What a channel offers to typed stubs: start a call.
public protocol ClientTransport: Sendable {
    func startCall(_ method: MethodDescriptor, options: CallOptions) async throws -> any RawClientCall
}

/// A unary or client-streaming result with its metadata.
public struct ClientResponse<Message: ProtoMessage>: Sendable {
    public var message: Message
    public var initialMetadata: Metadata
    public var trailers: Metadata
}

/// Typed writer for a client's request stream.
public struct RequestWriter<Message: ProtoMessage>: Sendable {
    let call: any RawClientCall
    let compress: Bool
    public func write(_ message: Message) async throws {
        try await call.send(message.serializedBytes(), compress: compress)
    }
}

/// A typed server stream seen by a client, with access to metadata and the final status.
public struct ClientStreamingResponse<Message: ProtoMessage>: Sendable {
    public let call: any RawClientCall
    public var messages: MessageStream<Message> { MessageStream(raw: call.responses, decodeFailure: .internal) }
    public func initialMetadata() async throws -> Metadata { try await call.initialMetadata() }
    public func trailers() async -> Metadata { await call.finalStatus().trailers }
}

/// The typed client every generated stub uses. Errors arrive as `RPCError` with the server's
/// status, message and trailers.
public struct RPCClient: Sendable {
    public let transport: any ClientTransport
    public init(transport: any ClientTransport) { self.transport = transport }

    static func throwIfFailed(_ call: any RawClientCall) async throws -> Metadata {
        let (status, trailers) = await call.finalStatus()
        if status.code != .ok { throw RPCError(status.code, status.message, trailers: trailers) }
        return trailers
    }

    static func single<Res: ProtoMessage>(_ call: any RawClientCall, _: Res.Type) async throws -> ClientResponse<Res> {
        let headers: Metadata
        do { headers = try await call.initialMetadata() } catch {
            _ = try await throwIfFailed(call)
            throw error
        }
        var first: [UInt8]? = nil
        var extra = false
        do {
            for try await m in call.responses {
                if first == nil { first = m.bytes } else { extra = true }
            }
        } catch {
            _ = try await throwIfFailed(call)
            throw error
        }
        let trailers = try await throwIfFailed(call)
        if extra { throw RPCError(.internal, "server sent more than one response message to a unary call") }
        guard let bytes = first else { throw RPCError(.internal, "server sent no response message") }
        do {
            return ClientResponse(message: try Res(serializedBytes: bytes), initialMetadata: headers, trailers: trailers)
        } catch { throw RPCError(.internal, MessageDecodingError.describe(error, messageName: Res.protoMessageName)) }
    }

    public func unary<Req: ProtoMessage, Res: ProtoMessage>(
        _ method: MethodDescriptor, _ request: Req, as: Res.Type = Res.self, options: CallOptions = .defaults
    ) async throws -> ClientResponse<Res> {
        let call = try await transport.startCall(method, options: options)
        return try await withTaskCancellationHandler {
            try await call.send(request.serializedBytes(), compress: options.compressRequests)
            try await call.closeSend()
            return try await Self.single(call, Res.self)
        } onCancel: {
            call.cancel()
        }
    }

    public func serverStreaming<Req: ProtoMessage, Res: ProtoMessage, R: Sendable>(
        _ method: MethodDescriptor, _ request: Req, as: Res.Type = Res.self, options: CallOptions = .defaults,
        _ body: (ClientStreamingResponse<Res>) async throws -> R
    ) async throws -> R {
        let call = try await transport.startCall(method, options: options)
        return try await withTaskCancellationHandler {
            try await call.send(request.serializedBytes(), compress: options.compressRequests)
            try await call.closeSend()
            let r: R
            do { r = try await body(ClientStreamingResponse(call: call)) } catch {
                call.cancel()
                let (status, trailers) = await call.finalStatus()
                if status.code != .ok && status.code != .cancelled { throw RPCError(status.code, status.message, trailers: trailers) }
                throw error
            }
            // Drain anything the body did not read, then surface the status.
            for try await _ in call.responses {}
            _ = try await Self.throwIfFailed(call)
            return r
        } onCancel: {
            call.cancel()
        }
    }

    public func clientStreaming<Req: ProtoMessage, Res: ProtoMessage>(
        _ method: MethodDescriptor, as: Res.Type = Res.self, options: CallOptions = .defaults,
        _ send: (RequestWriter<Req>) async throws -> Void
    ) async throws -> ClientResponse<Res> {
        let call = try await transport.startCall(method, options: options)
        return try await withTaskCancellationHandler {
            do {
                try await send(RequestWriter(call: call, compress: options.compressRequests))
                try await call.closeSend()
            } catch {
                // The server may have ended the call already: its status explains better.
                let (status, trailers) = await call.finalStatus()
                if status.code != .ok { throw RPCError(status.code, status.message, trailers: trailers) }
                throw error
            }
            return try await Self.single(call, Res.self)
        } onCancel: {
            call.cancel()
        }
    }

    public func bidirectionalStreaming<Req: ProtoMessage, Res: ProtoMessage, R: Sendable>(
        _ method: MethodDescriptor, as: Res.Type = Res.self, options: CallOptions = .defaults,
        _ body: (RequestWriter<Req>, ClientStreamingResponse<Res>) async throws -> R
    ) async throws -> R {
        let call = try await transport.startCall(method, options: options)
        return try await withTaskCancellationHandler {
            let r: R
            do { r = try await body(RequestWriter(call: call, compress: options.compressRequests), ClientStreamingResponse(call: call)) } catch {
                call.cancel()
                let (status, trailers) = await call.finalStatus()
                if status.code != .ok && status.code != .cancelled { throw RPCError(status.code, status.message, trailers: trailers) }
                throw error
            }
            try? await call.closeSend()
            for try await _ in call.responses {}
            _ = try await Self.throwIfFailed(call)
            return r
        } onCancel: {
            call.cancel()
        }
    }
}
