import NIOCore
import RPCCore

/// One request stream's state. Owned by its `ServerConnectionHandler` and touched only on the
/// connection's event loop.
final class ServerStream {
    enum Phase { case receivingHeaders, receiving, running, done }

    let id: Int32
    var phase: Phase = .receivingHeaders

    // Request headers as they arrive.
    var method = ""
    var path = ""
    /// `content-type: application/grpc[+proto|...]`; `contentType` is kept only when not.
    var isGRPCContentType = false
    var contentType = ""
    var authority = ""
    var timeout: String?
    /// When the call's `grpc-timeout` runs out, counted from the request headers.
    var deadline: ContinuousClock.Instant?
    var encoding: String?
    var metadata = Metadata()
    var headerListSize = 0
    var headersTooLarge = false
    var badMetadata: String?
    /// Plain HTTP (not gRPC) request for the configured `HTTPHandler`: headers and body kept whole.
    var isHTTP = false
    var rawHeaders = HeaderBlock(capacity: 0)
    var httpBody: [UInt8] = []
    var httpComplete = false

    // Request messages.
    var deframer: MessageDeframer
    var target: ServerMethod?
    /// The target's requests stream (client or bidirectional streaming), kept apart so the data
    /// path does not copy `target`.
    var clientStreams = false
    var single: RawMessageStream.InboundMessage?
    var requestStream: RawMessageStream?
    var inputClosed = false
    /// Bytes of queued-but-unread request messages still holding the flow-control window;
    /// returned to the connection when the stream closes.
    var heldBytes = 0

    // The call.
    var context: ServerContext?
    var task: Task<Void, Never>?
    /// What stops a `unaryForwarding` handler (it runs without a task of its own).
    var cancellation: CallCancellation?
    var deadlineTimer: Scheduled<Void>?
    /// `grpc-accept-encoding` lists gzip.
    var clientAcceptsGzip = false

    // Response.
    var headersSent = false
    var outbound: ByteBuffer
    var dataDeferred = false
    var trailers: HeaderBlock?
    var writeWaiters: [CheckedContinuation<Void, any Error>] = []

    /// The call ended early (cancelled, deadline, connection gone): stop its handler.
    func cancelHandler() {
        task?.cancel()
        cancellation?.cancel()
    }

    init(id: Int32, maxMessageSize: Int) {
        self.id = id
        self.deframer = MessageDeframer(maxMessageSize: maxMessageSize)
        self.outbound = .empty
    }
}
