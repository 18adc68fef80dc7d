import GRPCContracts
import RPCCore

/// `grpc.testing.TestService` exactly as gRPC's interop test descriptions specify it
/// (doc/interop-test-descriptions.md, "Server" section): payload sizes, status echo, metadata
/// echo, compression on request, intervals between streamed responses.
public struct TestServiceImpl: Grpc_Testing_TestService {
    public init() {}

    static let echoInitial = "x-grpc-test-echo-initial"
    static let echoTrailing = "x-grpc-test-echo-trailing-bin"

    /// Echoes the two test metadata keys back, as every method must.
    static func echoMetadata(_ context: ServerContext) {
        if let v = context.requestMetadata[echoInitial] {
            var m = context.initialMetadata
            m.add(echoInitial, v)
            context.initialMetadata = m
        }
        if let b = context.requestMetadata.binary(echoTrailing) {
            var t = context.trailers
            t.add(echoTrailing, binary: b)
            context.trailers = t
        }
    }

    static func payload(size: Int32) throws -> Grpc_Testing_Payload {
        guard size >= 0 else { throw RPCError(.invalidArgument, "response size must not be negative") }
        var p = Grpc_Testing_Payload()
        p.body = [UInt8](repeating: 0, count: Int(size))
        return p
    }

    static func checkStatus(_ status: Grpc_Testing_EchoStatus?) throws {
        guard let status, status.code != 0 else { return }
        throw RPCError(StatusCode(rawValue: Int(status.code)) ?? .unknown, status.message)
    }

    public func emptyCall(request: Grpc_Testing_Empty, context: ServerContext) async throws -> Grpc_Testing_Empty {
        Self.echoMetadata(context)
        return Grpc_Testing_Empty()
    }

    public func unaryCall(request: Grpc_Testing_SimpleRequest, context: ServerContext) async throws -> Grpc_Testing_SimpleResponse {
        Self.echoMetadata(context)
        if request.hasExpectCompressed && request.expectCompressed.value && !context.requestCompressed {
            throw RPCError(.invalidArgument, "expected a compressed request message")
        }
        try Self.checkStatus(request.hasResponseStatus ? request.responseStatus : nil)
        context.compressResponses = request.hasResponseCompressed && request.responseCompressed.value
        var response = Grpc_Testing_SimpleResponse()
        response.payload = try Self.payload(size: request.responseSize)
        return response
    }

    public func cacheableUnaryCall(request: Grpc_Testing_SimpleRequest, context: ServerContext) async throws -> Grpc_Testing_SimpleResponse {
        try await unaryCall(request: request, context: context)
    }

    static func stream(
        _ request: Grpc_Testing_StreamingOutputCallRequest,
        to responses: ResponseWriter<Grpc_Testing_StreamingOutputCallResponse>
    ) async throws {
        try checkStatus(request.hasResponseStatus ? request.responseStatus : nil)
        for parameters in request.responseParameters {
            if parameters.intervalUs > 0 { try await Task.sleep(for: .microseconds(Int(parameters.intervalUs))) }
            var response = Grpc_Testing_StreamingOutputCallResponse()
            response.payload = try payload(size: parameters.size)
            try await responses.write(response, compress: parameters.hasCompressed ? parameters.compressed.value : nil)
        }
    }

    public func streamingOutputCall(
        request: Grpc_Testing_StreamingOutputCallRequest,
        responses: ResponseWriter<Grpc_Testing_StreamingOutputCallResponse>,
        context: ServerContext
    ) async throws {
        Self.echoMetadata(context)
        try await Self.stream(request, to: responses)
    }

    public func streamingInputCall(
        requests: MessageStream<Grpc_Testing_StreamingInputCallRequest>,
        context: ServerContext
    ) async throws -> Grpc_Testing_StreamingInputCallResponse {
        Self.echoMetadata(context)
        var total = 0
        for try await received in requests.withCompressionInfo {
            let r = received.message
            if r.hasExpectCompressed && r.expectCompressed.value && !received.compressed {
                throw RPCError(.invalidArgument, "expected a compressed request message")
            }
            total += r.payload.body.count
        }
        var response = Grpc_Testing_StreamingInputCallResponse()
        response.aggregatedPayloadSize = Int32(total)
        return response
    }

    public func fullDuplexCall(
        requests: MessageStream<Grpc_Testing_StreamingOutputCallRequest>,
        responses: ResponseWriter<Grpc_Testing_StreamingOutputCallResponse>,
        context: ServerContext
    ) async throws {
        Self.echoMetadata(context)
        try await responses.sendInitialMetadata()
        for try await request in requests {
            try await Self.stream(request, to: responses)
        }
    }

    public func halfDuplexCall(
        requests: MessageStream<Grpc_Testing_StreamingOutputCallRequest>,
        responses: ResponseWriter<Grpc_Testing_StreamingOutputCallResponse>,
        context: ServerContext
    ) async throws {
        Self.echoMetadata(context)
        var all: [Grpc_Testing_StreamingOutputCallRequest] = []
        for try await request in requests { all.append(request) }
        for request in all { try await Self.stream(request, to: responses) }
    }

    public func unimplementedCall(request: Grpc_Testing_Empty, context: ServerContext) async throws -> Grpc_Testing_Empty {
        throw RPCError(.unimplemented, "grpc.testing.TestService/UnimplementedCall is not implemented, by design")
    }
}
