import GRPCContracts
import RPCCore

/// The cases, one method each, in the order of the interop descriptions. Each says in its doc comment
/// what it asserts beyond the description, if anything.
extension InteropClient {
    typealias StreamingResponse = ClientStreamingResponse<Grpc_Testing_StreamingOutputCallResponse>

    /// EmptyCall: the response decodes and is the empty message (zero bytes serialized).
    func emptyUnary() async throws {
        let response = try await test.emptyCall(Grpc_Testing_Empty(), options: callOptions())
        try check(response.serializedBytes().isEmpty, "response is not an empty message")
    }

    func largeUnary() async throws {
        let response = try await test.unaryCall(Self.largeRequest(), options: callOptions())
        try Self.checkPayload(response.payload, size: 314_159, "UnaryCall")
    }

    func clientStreaming() async throws {
        let response = try await test.streamingInputCall(options: callOptions()) { requests in
            for n in [27_182, 8, 1_828, 45_904] {
                var request = Grpc_Testing_StreamingInputCallRequest()
                request.payload = Self.zeros(n)
                try await requests.write(request)
            }
        }
        try check(response.aggregatedPayloadSize == 74_922, "aggregated_payload_size is \(response.aggregatedPayloadSize), expected 74922")
    }

    func serverStreaming() async throws {
        let sizes = [31_415, 9, 2_653, 58_979]
        let request = Self.streamingRequest(responseSizes: sizes)
        let got = try await test.streamingOutputCall(request, options: callOptions()) { responses in
            var got: [Int] = []
            for try await response in responses.messages {
                try Self.checkPayload(response.payload, size: response.payload.body.count, "response \(got.count)")
                got.append(response.payload.body.count)
            }
            return got
        }
        try check(got == sizes, "response sizes \(got), expected \(sizes)")
    }

    /// Each request only after the previous response; after the half-close, no further response and
    /// an OK status (checked by the stub when the body returns).
    func pingPong() async throws {
        let steps = [(31_415, 27_182), (9, 8), (2_653, 1_828), (58_979, 45_904)]
        try await test.fullDuplexCall(options: callOptions()) { requests, responses in
            var iterator = responses.messages.makeAsyncIterator()
            for (index, (responseSize, requestSize)) in steps.enumerated() {
                try await requests.write(Self.streamingRequest(responseSizes: [responseSize], payload: requestSize))
                guard let response = try await iterator.next() else {
                    throw InteropCaseFailure("response stream ended after \(index) responses, expected 4")
                }
                try Self.checkPayload(response.payload, size: responseSize, "response \(index)")
            }
            try await responses.call.closeSend()
            var extra = 0
            while try await iterator.next() != nil { extra += 1 }
            try check(extra == 0, "\(extra) extra responses after the half-close")
        }
    }

    func emptyStream() async throws {
        let count = try await test.fullDuplexCall(options: callOptions()) { _, responses in
            try await responses.call.closeSend()
            var count = 0
            for try await _ in responses.messages { count += 1 }
            return count
        }
        try check(count == 0, "\(count) responses to an empty request stream")
    }

    /// The call is started (its stub body runs, so HEADERS are on their way), then its task is
    /// cancelled: the call must end CANCELLED, as an `RPCError` the caller sees.
    func cancelAfterBegin() async throws {
        let (started, signal) = AsyncStream<Void>.makeStream()
        let test = self.test
        let options = callOptions()
        let task = Task {
            defer { signal.finish() }
            return try await test.streamingInputCall(options: options) { _ in
                signal.yield()
                try await Task.sleep(for: .seconds(3600))
            }
        }
        var iterator = started.makeAsyncIterator()
        _ = await iterator.next()
        task.cancel()
        switch await task.result {
        case .success(let response):
            throw InteropCaseFailure("the cancelled call returned a response (aggregated_payload_size \(response.aggregatedPayloadSize))")
        case .failure(let error as RPCError):
            try check(error.code == .cancelled, "the cancelled call ended \(error.code.name): \(error.message.debugDescription)")
        case .failure(let error):
            throw InteropCaseFailure("the cancelled call ended with \(type(of: error)): \(error), not CANCELLED")
        }
    }

    /// After the first response the task running the call is cancelled: the call's final status must
    /// be CANCELLED and the stub must end with an error (the task's CancellationError or CANCELLED).
    func cancelAfterFirstResponse() async throws {
        let (firstResponse, signal) = AsyncStream<StreamingResponse>.makeStream()
        let test = self.test
        let options = callOptions()
        let task = Task {
            defer { signal.finish() }
            try await test.fullDuplexCall(options: options) { requests, responses in
                try await requests.write(Self.streamingRequest(responseSizes: [31_415], payload: 27_182))
                var iterator = responses.messages.makeAsyncIterator()
                guard let first = try await iterator.next() else {
                    throw InteropCaseFailure("response stream ended before the first response")
                }
                try Self.checkPayload(first.payload, size: 31_415, "first response")
                signal.yield(responses)
                try await Task.sleep(for: .seconds(3600))
            }
        }
        var iterator = firstResponse.makeAsyncIterator()
        guard let call = await iterator.next() else {
            // The call failed before its first response: that failure is the case's.
            _ = try await task.value
            throw InteropCaseFailure("the call ended without a first response")
        }
        task.cancel()
        switch await task.result {
        case .success:
            throw InteropCaseFailure("the cancelled call completed normally")
        case .failure(let error as RPCError):
            try check(error.code == .cancelled, "the cancelled call ended \(error.code.name): \(error.message.debugDescription)")
        case .failure(let error):
            try check(error is CancellationError, "the cancelled call ended with \(type(of: error)): \(error)")
        }
        let (status, _) = await call.call.finalStatus()
        try check(status.code == .cancelled, "final status is \(status.code.name): \(status.message.debugDescription), expected CANCELLED")
    }

    /// The 1 ms deadline of the description, then 300 ms (the request reaches the server first, so
    /// either side may be the one that enforces it); both end DEADLINE_EXCEEDED, and promptly.
    func timeoutOnSleepingServer() async throws {
        for timeout in [Duration.milliseconds(1), .milliseconds(300)] {
            let clock = ContinuousClock()
            let start = clock.now
            try await expectStatus(.deadlineExceeded, "FullDuplexCall with a \(timeout) deadline") {
                try await test.fullDuplexCall(options: CallOptions(timeout: timeout)) { requests, responses in
                    var request = Grpc_Testing_StreamingOutputCallRequest()
                    request.payload = Self.zeros(27_182)
                    try await requests.write(request)
                    for try await _ in responses.messages {}
                }
            }
            let elapsed = clock.now - start
            try check(elapsed < timeout + .seconds(5), "a \(timeout) deadline took \(elapsed) to end the call")
        }
    }

    func customMetadata() async throws {
        var metadata = Metadata()
        metadata.add(Self.echoInitialKey, Self.echoInitialValue)
        metadata.add(Self.echoTrailingKey, binary: Self.echoTrailingValue)
        let options = callOptions(metadata: metadata)

        func verify(_ initial: Metadata, _ trailers: Metadata, _ what: String) throws {
            try check(
                initial[Self.echoInitialKey] == Self.echoInitialValue,
                "\(what): initial metadata \(initial) lacks \(Self.echoInitialKey): \(Self.echoInitialValue)")
            try check(
                trailers.binary(Self.echoTrailingKey) == Self.echoTrailingValue,
                "\(what): trailing metadata \(trailers) lacks \(Self.echoTrailingKey): 0xababab")
        }

        let unary = try await test.unaryCallWithMetadata(Self.largeRequest(), options: options)
        try Self.checkPayload(unary.message.payload, size: 314_159, "UnaryCall")
        try verify(unary.initialMetadata, unary.trailers, "UnaryCall")

        let (sizes, initial, call) = try await test.fullDuplexCall(options: options) { requests, responses in
            try await requests.write(Self.streamingRequest(responseSizes: [314_159], payload: 271_828))
            try await responses.call.closeSend()
            var sizes: [Int] = []
            for try await response in responses.messages { sizes.append(response.payload.body.count) }
            return (sizes, try await responses.initialMetadata(), responses)
        }
        try check(sizes == [314_159], "FullDuplexCall: response sizes \(sizes), expected [314159]")
        try verify(initial, await call.trailers(), "FullDuplexCall")
    }

    func statusCodeAndMessage() async throws {
        try await echoStatus("test status message", streaming: true)
    }

    func specialStatusMessage() async throws {
        try await echoStatus(Self.specialStatusMessage, streaming: false)
    }

    /// Echo Status with code 2 (UNKNOWN): the exact code and message must come back.
    private func echoStatus(_ message: String, streaming: Bool) async throws {
        var status = Grpc_Testing_EchoStatus()
        status.code = 2
        status.message = message
        var unary = Grpc_Testing_SimpleRequest()
        unary.responseStatus = status
        try await expectStatus(.unknown, message: message, "UnaryCall") {
            try await test.unaryCall(unary, options: callOptions())
        }
        guard streaming else { return }
        var request = Grpc_Testing_StreamingOutputCallRequest()
        request.responseStatus = status
        try await expectStatus(.unknown, message: message, "FullDuplexCall") {
            try await test.fullDuplexCall(options: callOptions()) { requests, responses in
                try await requests.write(request)
                try await responses.call.closeSend()
                for try await _ in responses.messages {}
            }
        }
    }

    func unimplementedMethod() async throws {
        try await expectStatus(.unimplemented, "TestService/UnimplementedCall") {
            try await test.unimplementedCall(Grpc_Testing_Empty(), options: callOptions())
        }
    }

    func unimplementedService() async throws {
        let service = Grpc_Testing_UnimplementedServiceClient(client)
        try await expectStatus(.unimplemented, "UnimplementedService/UnimplementedCall") {
            try await service.unimplementedCall(Grpc_Testing_Empty(), options: callOptions())
        }
    }

    func clientCompressedUnary() async throws {
        func request(expectCompressed: Bool) -> Grpc_Testing_SimpleRequest {
            var r = Self.largeRequest()
            var flag = Grpc_Testing_BoolValue()
            flag.value = expectCompressed
            r.expectCompressed = flag
            return r
        }
        if options.compressionProbe {
            try await expectStatus(.invalidArgument, "feature probe (uncompressed, expect_compressed: true)") {
                try await test.unaryCall(request(expectCompressed: true), options: callOptions())
            }
        }
        for compressed in [true, false] {
            let response = try await test.unaryCall(request(expectCompressed: compressed), options: callOptions(compress: compressed))
            try Self.checkPayload(response.payload, size: 314_159, compressed ? "compressed call" : "uncompressed call")
        }
    }

    /// Through the typed stub (decompression), then the raw call for each message's compressed flag.
    func serverCompressedUnary() async throws {
        for compressed in [true, false] {
            var request = Self.largeRequest()
            var flag = Grpc_Testing_BoolValue()
            flag.value = compressed
            request.responseCompressed = flag
            let what = "response_compressed: \(compressed)"
            let response = try await test.unaryCall(request, options: callOptions())
            try Self.checkPayload(response.payload, size: 314_159, what)

            let raw = try await rawCall(Grpc_Testing_TestServiceMethods.unaryCall, [(request.serializedBytes(), false)], options: callOptions())
            try raw.checkOK(what)
            try check(raw.messages.count == 1, "\(what): \(raw.messages.count) response messages")
            try check(raw.messages[0].compressed == compressed, "\(what): the response's compressed flag is \(raw.messages[0].compressed ? 1 : 0)")
            try Self.checkPayload(try Grpc_Testing_SimpleResponse(serializedBytes: raw.messages[0].bytes).payload, size: 314_159, "\(what) (raw)")
        }
    }

    /// The typed `RequestWriter` compresses all of a call's messages or none (`compressRequests`), so
    /// the per-message part goes through the raw call, which takes `compress` per message: the
    /// call says `grpc-encoding: gzip`, the first message has the compressed flag and the second not.
    func clientCompressedStreaming() async throws {
        func request(expectCompressed: Bool, size: Int) -> Grpc_Testing_StreamingInputCallRequest {
            var r = Grpc_Testing_StreamingInputCallRequest()
            var flag = Grpc_Testing_BoolValue()
            flag.value = expectCompressed
            r.expectCompressed = flag
            r.payload = Self.zeros(size)
            return r
        }
        if options.compressionProbe {
            try await expectStatus(.invalidArgument, "feature probe (uncompressed, expect_compressed: true)") {
                try await test.streamingInputCall(options: callOptions()) { requests in
                    try await requests.write(request(expectCompressed: true, size: 27_182))
                }
            }
        }
        let raw = try await rawCall(
            Grpc_Testing_TestServiceMethods.streamingInputCall,
            [
                (request(expectCompressed: true, size: 27_182).serializedBytes(), true),
                (request(expectCompressed: false, size: 45_904).serializedBytes(), false),
            ],
            options: callOptions(compress: true))
        try raw.checkOK("StreamingInputCall")
        try check(raw.messages.count == 1, "\(raw.messages.count) response messages")
        let response = try Grpc_Testing_StreamingInputCallResponse(serializedBytes: raw.messages[0].bytes)
        try check(response.aggregatedPayloadSize == 73_086, "aggregated_payload_size is \(response.aggregatedPayloadSize), expected 73086")
    }

    func serverCompressedStreaming() async throws {
        var request = Grpc_Testing_StreamingOutputCallRequest()
        request.responseParameters = [(31_415, true), (92_653, false)].map { size, compressed in
            var p = Grpc_Testing_ResponseParameters()
            p.size = Int32(size)
            var flag = Grpc_Testing_BoolValue()
            flag.value = compressed
            p.compressed = flag
            return p
        }
        let sizes = try await test.streamingOutputCall(request, options: callOptions()) { responses in
            var sizes: [Int] = []
            for try await response in responses.messages { sizes.append(response.payload.body.count) }
            return sizes
        }
        try check(sizes == [31_415, 92_653], "response sizes \(sizes), expected [31415, 92653]")

        let raw = try await rawCall(Grpc_Testing_TestServiceMethods.streamingOutputCall, [(request.serializedBytes(), false)], options: callOptions())
        try raw.checkOK("raw StreamingOutputCall")
        let flags = raw.messages.map { $0.compressed ? 1 : 0 }
        try check(flags == [1, 0], "compressed flags \(flags), expected [1, 0]")
        let rawSizes = try raw.messages.map { try Grpc_Testing_StreamingOutputCallResponse(serializedBytes: $0.bytes).payload.body.count }
        try check(rawSizes == [31_415, 92_653], "raw: response sizes \(rawSizes), expected [31415, 92653]")
    }

    func healthCheck() async throws {
        let health = Grpc_Health_V1_HealthClient(client)
        for service in ["", Grpc_Testing_TestServiceMethods.serviceName] {
            var request = Grpc_Health_V1_HealthCheckRequest()
            request.service = service
            let response = try await health.check(request, options: callOptions())
            try check(
                response.status == .serving, "Check(\(service.debugDescription)) is \(response.status.protoName ?? "\(response.status.rawValue)")")
        }
        var unknown = Grpc_Health_V1_HealthCheckRequest()
        unknown.service = "no.such.Service"
        try await expectStatus(.notFound, "Check(\"no.such.Service\")") {
            try await health.check(unknown, options: callOptions())
        }
    }
}
