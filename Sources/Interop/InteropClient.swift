import GRPCContracts
import RPCCore

/// The client side of gRPC's interop tests (doc/interop-test-descriptions.md in grpc/grpc, "Client"
/// section), written against our typed stubs so that the same cases check our client against any
/// server of `grpc.testing.TestService`: our `interop-server`, or grpcio's.
///
/// Each case throws on failure: `InteropCaseFailure` when an assertion of the description does not
/// hold, `RPCError` when a call fails that should not. Calls carry a deadline (`callTimeout`) so a
/// broken peer fails a case instead of hanging the run.
public struct InteropClient: Sendable {
    public struct Options: Sendable {
        /// Send the `expect_compressed` feature probe of the client_compressed_* cases and require
        /// INVALID_ARGUMENT. Turn off for servers that cannot see a message's compressed flag
        /// (grpcio: a servicer is never told), which then accept the probe.
        public var compressionProbe = true
        /// Deadline of every call a case makes (except where the case sets its own).
        public var callTimeout: Duration = .seconds(10)
        public init(compressionProbe: Bool = true, callTimeout: Duration = .seconds(10)) {
            self.compressionProbe = compressionProbe
            self.callTimeout = callTimeout
        }
    }

    public let client: RPCClient
    public let options: Options
    let test: Grpc_Testing_TestServiceClient

    public init(client: RPCClient, options: Options = Options()) {
        self.client = client
        self.options = options
        self.test = Grpc_Testing_TestServiceClient(client)
    }

    /// Runs one case; returns normally when every assertion of its description holds.
    public func run(_ testCase: InteropTestCase) async throws {
        switch testCase {
        case .emptyUnary: try await emptyUnary()
        case .largeUnary: try await largeUnary()
        case .clientStreaming: try await clientStreaming()
        case .serverStreaming: try await serverStreaming()
        case .pingPong: try await pingPong()
        case .emptyStream: try await emptyStream()
        case .cancelAfterBegin: try await cancelAfterBegin()
        case .cancelAfterFirstResponse: try await cancelAfterFirstResponse()
        case .timeoutOnSleepingServer: try await timeoutOnSleepingServer()
        case .customMetadata: try await customMetadata()
        case .statusCodeAndMessage: try await statusCodeAndMessage()
        case .specialStatusMessage: try await specialStatusMessage()
        case .unimplementedMethod: try await unimplementedMethod()
        case .unimplementedService: try await unimplementedService()
        case .clientCompressedUnary: try await clientCompressedUnary()
        case .serverCompressedUnary: try await serverCompressedUnary()
        case .clientCompressedStreaming: try await clientCompressedStreaming()
        case .serverCompressedStreaming: try await serverCompressedStreaming()
        case .healthCheck: try await healthCheck()
        }
    }

    /// Runs `cases` in order on this client's channel, reporting each result as it completes
    /// (`PASS name (N ms)` / `FAIL name: reason` through `InteropCaseResult.line`).
    public func run(_ cases: [InteropTestCase], report: (InteropCaseResult) -> Void = { _ in }) async -> [InteropCaseResult] {
        var results: [InteropCaseResult] = []
        for testCase in cases {
            let clock = ContinuousClock()
            let start = clock.now
            var failure: String? = nil
            do { try await run(testCase) } catch { failure = Self.describe(error) }
            let result = InteropCaseResult(testCase: testCase, duration: clock.now - start, failure: failure)
            report(result)
            results.append(result)
        }
        return results
    }

    /// A failure reason a person can act on: the assertion, or the unexpected status.
    static func describe(_ error: any Error) -> String {
        switch error {
        case let f as InteropCaseFailure: f.message
        case let e as RPCError: "unexpected status \(e.code.name): \(e.message.debugDescription)"
        default: "\(type(of: error)): \(error)"
        }
    }

    // MARK: Shared request values

    static let echoInitialKey = "x-grpc-test-echo-initial"
    static let echoInitialValue = "test_initial_metadata_value"
    static let echoTrailingKey = "x-grpc-test-echo-trailing-bin"
    static let echoTrailingValue: [UInt8] = [0xAB, 0xAB, 0xAB]
    static let specialStatusMessage = "\t\ntest with whitespace\r\nand Unicode BMP \u{263A} and non-BMP \u{1F608}\t\n"

    /// Call options with the case deadline (and whatever else the case sets).
    func callOptions(metadata: Metadata = Metadata(), compress: Bool = false) -> CallOptions {
        CallOptions(timeout: options.callTimeout, metadata: metadata, compressRequests: compress)
    }

    static func zeros(_ n: Int) -> Grpc_Testing_Payload {
        var p = Grpc_Testing_Payload()
        p.body = [UInt8](repeating: 0, count: n)
        return p
    }

    /// `{response_size: 314159, payload: 271828 zeros}`, the large_unary request.
    static func largeRequest() -> Grpc_Testing_SimpleRequest {
        var r = Grpc_Testing_SimpleRequest()
        r.responseSize = 314_159
        r.payload = zeros(271_828)
        return r
    }

    static func streamingRequest(responseSizes: [Int], payload: Int? = nil) -> Grpc_Testing_StreamingOutputCallRequest {
        var r = Grpc_Testing_StreamingOutputCallRequest()
        r.responseParameters = responseSizes.map { n in
            var p = Grpc_Testing_ResponseParameters()
            p.size = Int32(n)
            return p
        }
        if let payload { r.payload = zeros(payload) }
        return r
    }

    /// Checks a payload is `size` zeros (the descriptions let clients compare the whole body).
    static func checkPayload(_ payload: Grpc_Testing_Payload, size: Int, _ what: String) throws {
        try check(payload.body.count == size, "\(what): payload is \(payload.body.count) bytes, expected \(size)")
        try check(payload.body.allSatisfy { $0 == 0 }, "\(what): payload of \(size) bytes is not all zeros")
    }
}

/// The cases this client runs, named as gRPC's interop descriptions name them.
public enum InteropTestCase: String, CaseIterable, Sendable {
    case emptyUnary = "empty_unary"
    case largeUnary = "large_unary"
    case clientStreaming = "client_streaming"
    case serverStreaming = "server_streaming"
    case pingPong = "ping_pong"
    case emptyStream = "empty_stream"
    case cancelAfterBegin = "cancel_after_begin"
    case cancelAfterFirstResponse = "cancel_after_first_response"
    case timeoutOnSleepingServer = "timeout_on_sleeping_server"
    case customMetadata = "custom_metadata"
    case statusCodeAndMessage = "status_code_and_message"
    case specialStatusMessage = "special_status_message"
    case unimplementedMethod = "unimplemented_method"
    case unimplementedService = "unimplemented_service"
    case clientCompressedUnary = "client_compressed_unary"
    case serverCompressedUnary = "server_compressed_unary"
    case clientCompressedStreaming = "client_compressed_streaming"
    case serverCompressedStreaming = "server_compressed_streaming"
    /// Not an interop description: `grpc.health.v1.Health/Check` for the server, TestService and an
    /// unknown service (NOT_FOUND).
    case healthCheck = "health_check"

    public var name: String { rawValue }
}

/// One case's outcome.
public struct InteropCaseResult: Sendable {
    public var testCase: InteropTestCase
    public var duration: Duration
    /// Why it failed; nil when it passed.
    public var failure: String?

    public var passed: Bool { failure == nil }
    public var milliseconds: Int {
        let (s, atto) = duration.components
        return Int(s) * 1000 + Int(atto / 1_000_000_000_000_000)
    }
    /// `PASS name (N ms)` or `FAIL name: reason`.
    public var line: String {
        if let failure { return "FAIL \(testCase.name): \(failure)" }
        return "PASS \(testCase.name) (\(milliseconds) ms)"
    }
}

/// An assertion of a case description that did not hold.
public struct InteropCaseFailure: Error, Sendable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}

func check(_ condition: Bool, _ message: @autoclosure () -> String) throws {
    if !condition { throw InteropCaseFailure(message()) }
}

/// Runs `body`, which must fail with `code` (and `message`, when given); returns the error.
@discardableResult
func expectStatus<T>(
    _ code: StatusCode, message: String? = nil, _ what: String, _ body: () async throws -> T
) async throws -> RPCError {
    do {
        _ = try await body()
    } catch let error as RPCError {
        try check(error.code == code, "\(what): expected \(code.name), got \(error.code.name): \(error.message.debugDescription)")
        if let message {
            try check(error.message == message, "\(what): expected message \(message.debugDescription), got \(error.message.debugDescription)")
        }
        return error
    }
    throw InteropCaseFailure("\(what): expected \(code.name), the call succeeded")
}
