import RPCCore
import Testing

@testable import RPCTransport

/// Starts an echo server on a free loopback port for one test.
func withEchoServer<R>(
    _ configure: (inout ServerConfiguration) -> Void = { _ in },
    channel configureChannel: (inout ChannelConfiguration) -> Void = { _ in },
    _ body: (Int, RPCClient) async throws -> R
) async throws -> R {
    var config = ServerConfiguration(host: "127.0.0.1", port: 0)
    config.threads = 1
    configure(&config)
    let server = RPCServer(configuration: config, services: [EchoService()])
    let port = try await server.start()
    var channelConfig = ChannelConfiguration(host: "127.0.0.1", port: port)
    configureChannel(&channelConfig)
    let channel = RPCChannel(configuration: channelConfig)
    do {
        let r = try await body(port, channel.client)
        await channel.close()
        await server.shutdownGracefully()
        return r
    } catch {
        await channel.close()
        await server.shutdownGracefully()
        throw error
    }
}

@Suite struct ClientServerTests {
    @Test func unaryWithMetadata() async throws {
        try await withEchoServer { _, client in
            var options = CallOptions()
            options.metadata.add("x-echo-initial", "hello")
            options.metadata.add("x-echo-trailing-bin", binary: [0, 255, 10])
            let r = try await client.unary(EchoService.unaryMethod, Bytes("ping"), as: Bytes.self, options: options)
            #expect(r.message.text == "ping")
            #expect(r.initialMetadata["x-echo-initial"] == "hello")
            #expect(r.trailers.binary("x-echo-trailing-bin") == [0, 255, 10])
        }
    }

    @Test func manyConcurrentCallsShareOneConnection() async throws {
        try await withEchoServer { _, client in
            try await withThrowingTaskGroup(of: Void.self) { group in
                for i in 0..<500 {
                    group.addTask {
                        let r = try await client.unary(EchoService.unaryMethod, Bytes("m\(i)"), as: Bytes.self)
                        #expect(r.message.text == "m\(i)")
                    }
                }
                try await group.waitForAll()
            }
        }
    }

    @Test func serverStreamingLargeFlowControlled() async throws {
        try await withEchoServer { _, client in
            // 64 × 64 KiB = 4 MiB through 1 MiB windows: exercises WINDOW_UPDATE and backpressure.
            let total = try await client.serverStreaming(EchoService.serverStreamMethod, Bytes("64:65536"), as: Bytes.self) { stream in
                var n = 0
                for try await m in stream.messages { n += m.data.count }
                return n
            }
            #expect(total == 64 * 65536)
        }
    }

    @Test func clientStreamingAndBidi() async throws {
        try await withEchoServer { _, client in
            let r = try await client.clientStreaming(EchoService.clientStreamMethod, as: Bytes.self) { w in
                for _ in 0..<100 { try await w.write(Bytes([UInt8](repeating: 1, count: 10_000))) }
            }
            #expect(r.message.text == "1000000")
            let echoed = try await client.bidirectionalStreaming(EchoService.bidiMethod, as: Bytes.self) { (w: RequestWriter<Bytes>, responses) in
                var got: [String] = []
                var it = responses.messages.makeAsyncIterator()
                for i in 0..<20 {
                    try await w.write(Bytes("b\(i)"))
                    if let m = try await it.next() { got.append(m.text) }
                }
                return got
            }
            #expect(echoed == (0..<20).map { "b\($0)" })
        }
    }

    /// A small message left unread while a message larger than the window arrives: the large
    /// one's bytes wait with it (so a stalled reader holds the server back), and reading the
    /// small one must give them back, or the stream stalls for good (nghttp2 opens the window
    /// only once half of it is consumed, and no further chunk can come to release them).
    @Test func aMessageLargerThanTheWindowBehindAnUnreadOneStillArrives() async throws {
        try await withEchoServer(channel: { $0.initialWindowSize = 64 * 1024 }) { _, client in
            let large = Bytes([UInt8](repeating: 7, count: 100 * 1024))
            let sizes = try await client.bidirectionalStreaming(
                EchoService.bidiMethod, as: Bytes.self, options: CallOptions(timeout: .seconds(5))
            ) { (w: RequestWriter<Bytes>, responses) in
                try await w.write(Bytes("s"))
                try await w.write(large)
                // Both echoes are on their way before the first is read.
                try await Task.sleep(for: .milliseconds(300))
                var got: [Int] = []
                for try await m in responses.messages {
                    got.append(m.data.count)
                    if got.count == 2 { break }
                }
                return got
            }
            #expect(sizes == [1, 100 * 1024])
        }
    }

    @Test func messagesLargerThanTheFlowControlWindowArriveBothWays() async throws {
        // 3 MiB messages through 1 MiB stream windows: a partial message must release its bytes
        // as they arrive, or neither side could ever complete one.
        try await withEchoServer { _, client in
            let big = Bytes((0..<(3 * 1024 * 1024)).map { UInt8(truncatingIfNeeded: $0 &* 31) })
            let r = try await client.unary(EchoService.unaryMethod, big, as: Bytes.self, options: CallOptions(timeout: .seconds(30)))
            #expect(r.message == big)
            let total = try await client.clientStreaming(
                EchoService.clientStreamMethod, as: Bytes.self,
                options: CallOptions(timeout: .seconds(30))
            ) { w in
                for _ in 0..<3 { try await w.write(big) }
            }
            #expect(total.message.text == "\(3 * big.data.count)")
            let echoed = try await client.bidirectionalStreaming(
                EchoService.bidiMethod, as: Bytes.self,
                options: CallOptions(timeout: .seconds(30))
            ) { (w: RequestWriter<Bytes>, responses) in
                var it = responses.messages.makeAsyncIterator()
                var n = 0
                for _ in 0..<2 {
                    try await w.write(big)
                    if let m = try await it.next(), m == big { n += 1 }
                }
                return n
            }
            #expect(echoed == 2)
        }
    }

    @Test func bytesReadAfterTheStreamClosedGoBackToTheConnectionWindow() async throws {
        // 16 KiB stream windows, 64 KiB for the connection: each call leaves 16 KiB of responses
        // unread until after it has ended. Were those bytes lost to the connection window, the
        // fifth call would stall.
        try await withEchoServer(channel: { $0.initialWindowSize = 16 * 1024 }) { _, client in
            for i in 0..<20 {
                let call = try await client.transport.startCall(
                    EchoService.serverStreamMethod,
                    options: CallOptions(timeout: .seconds(5)))
                try await call.send(Bytes("2:8000").serializedBytes(), compress: false)
                try await call.closeSend()
                let (status, _) = await call.finalStatus()
                #expect(status.code == .ok, "call \(i): \(status)")
                var n = 0
                for try await m in call.responses { n += m.bytes.count }
                #expect(n == 16000)
            }
        }
    }

    @Test func addressesAreHostPortOrBracketedV6() {
        #expect(ChannelConfiguration.address("127.0.0.1:80")! == ("127.0.0.1", 80))
        #expect(ChannelConfiguration.address("[::1]:9101")! == ("::1", 9101))
        #expect(ChannelConfiguration.address("accounts:9101")! == ("accounts", 9101))
        for bad in ["fe80::1", "::1:80", "host", ":80", "host:0", "host:70000", "[::1]"] {
            #expect(ChannelConfiguration.address(bad) == nil, "\(bad)")
        }
    }

    @Test func windowsAndLimitsBeyondWhatHTTP2AllowsAreClamped() async throws {
        // A configuration may ask for more than a SETTINGS value can say (the gateway sizes its
        // windows from message limits): both ends clamp, nothing traps, calls go through.
        let huge = Int(UInt32.max) + 10
        try await withEchoServer(
            {
                $0.initialWindowSize = huge; $0.maxConcurrentStreams = huge; $0.maxHeaderListSize = huge
            },
            channel: {
                $0.initialWindowSize = huge; $0.maxHeaderListSize = huge
            }
        ) { _, client in
            for _ in 0..<3 {
                let r = try await client.unary(EchoService.unaryMethod, Bytes("ping"), as: Bytes.self)
                #expect(r.message.text == "ping")
            }
        }
    }

    @Test func errorsCarryStatusMessageAndTrailers() async throws {
        try await withEchoServer { _, client in
            let message = "bad\tfield\r\nnon-BMP 😀 and 100%"
            do {
                _ = try await client.unary(EchoService.failMethod, Bytes(message), as: Bytes.self)
                Issue.record("expected failure")
            } catch let e as RPCError {
                #expect(e.code == .invalidArgument)
                #expect(e.message == message)
                #expect(e.trailers["x-detail"] == "kept")
            }
            do {
                _ = try await client.unary(MethodDescriptor(service: "test.Echo", method: "Missing", kind: .unary), Bytes(), as: Bytes.self)
                Issue.record("expected failure")
            } catch let e as RPCError {
                #expect(e.code == .unimplemented)
            }
        }
    }

    @Test func deadlineExceeded() async throws {
        try await withEchoServer { _, client in
            let start = ContinuousClock.now
            do {
                _ = try await client.unary(EchoService.sleepMethod, Bytes("10"), as: Bytes.self, options: CallOptions(timeout: .milliseconds(200)))
                Issue.record("expected failure")
            } catch let e as RPCError {
                #expect(e.code == .deadlineExceeded)
            }
            #expect(ContinuousClock.now - start < .seconds(10))  // cut by the deadline, not the 10 s sleep
        }
    }

    /// A connection ends its calls at their deadlines with one timer, set for the earliest: a
    /// later call with an earlier deadline (a timeout, or a limit) moves it, and a call whose
    /// deadline is far off is not cut when the timer fires for the others.
    @Test func deadlinesAndLimitsShareOneTimerPerConnection() async throws {
        try await withEchoServer { _, client in
            let long = Task {
                try await client.unary(EchoService.sleepMethod, Bytes("10#long"), as: Bytes.self, options: CallOptions(timeout: .seconds(30)))
            }
            while !sleepsStarted.withLock({ $0.contains("10#long") }) { try await Task.sleep(for: .milliseconds(10)) }
            let start = ContinuousClock.now
            async let limited: Void = {
                do {
                    _ = try await client.unary(
                        EchoService.sleepMethod, Bytes("10#limited"), as: Bytes.self,
                        options: CallOptions(limit: CallLimit(after: .milliseconds(300), message: "past the relay's limit")))
                    Issue.record("the limit did not end the call")
                } catch let e as RPCError {
                    #expect(e.code == .deadlineExceeded && e.message == "past the relay's limit", "\(e)")
                }
            }()
            async let timed: Void = {
                do {
                    _ = try await client.unary(
                        EchoService.sleepMethod, Bytes("10#timed"), as: Bytes.self, options: CallOptions(timeout: .milliseconds(200)))
                    Issue.record("the timeout did not end the call")
                } catch let e as RPCError {
                    #expect(e.code == .deadlineExceeded && e.message.hasPrefix("deadline exceeded after"), "\(e)")
                }
            }()
            _ = try await (limited, timed)
            #expect(ContinuousClock.now - start < .seconds(5))
            // The long call is still running: cancelled here, not cut at the others' deadlines.
            try await Task.sleep(for: .milliseconds(100))
            long.cancel()
            do {
                _ = try await long.value
                Issue.record("expected the cancellation")
            } catch let e as RPCError {
                #expect(e.code == .cancelled, "\(e)")
            }
        }
    }

    @Test func cancellationStopsTheCall() async throws {
        try await withEchoServer { _, client in
            let task = Task {
                try await client.unary(EchoService.sleepMethod, Bytes("10"), as: Bytes.self)
            }
            try await Task.sleep(for: .milliseconds(100))
            task.cancel()
            do {
                _ = try await task.value
                Issue.record("expected failure")
            } catch let e as RPCError {
                #expect(e.code == .cancelled)
            }
        }
    }

    @Test func compressionBothWays() async throws {
        try await withEchoServer { _, client in
            let big = Bytes([UInt8](repeating: 7, count: 100_000))
            let r = try await client.unary(EchoService.unaryMethod, big, as: Bytes.self, options: CallOptions(compressRequests: true))
            #expect(r.message == big)
        }
    }

    @Test func oversizedRequestIsResourceExhausted() async throws {
        try await withEchoServer({ $0.maxReceiveMessageSize = 1000 }) { _, client in
            do {
                _ = try await client.unary(EchoService.unaryMethod, Bytes([UInt8](repeating: 1, count: 2000)), as: Bytes.self)
                Issue.record("expected failure")
            } catch let e as RPCError {
                #expect(e.code == .resourceExhausted)
            }
            // The connection still serves other calls.
            let ok = try await client.unary(EchoService.unaryMethod, Bytes("after"), as: Bytes.self)
            #expect(ok.message.text == "after")
        }
    }

    @Test func unavailableFastThenReconnectsWhenThePeerComesBack() async throws {
        // Find a free port, then leave it closed.
        var config = ServerConfiguration(host: "127.0.0.1", port: 0)
        config.threads = 1
        let probe = RPCServer(configuration: config, services: [EchoService()])
        let port = try await probe.start()
        await probe.shutdownGracefully()

        let channel = RPCChannel(host: "127.0.0.1", port: port)
        let start = ContinuousClock.now
        do {
            _ = try await channel.client.unary(EchoService.unaryMethod, Bytes("x"), as: Bytes.self)
            Issue.record("expected failure")
        } catch let e as RPCError {
            #expect(e.code == .unavailable)
        }
        // Fails fast rather than waiting: no deadline is set, so a hang would never end. The bound
        // is loose on purpose (loaded CI machines); it separates "fast" from "hung", nothing more.
        #expect(ContinuousClock.now - start < .seconds(10))

        config.port = port
        let server = RPCServer(configuration: config, services: [EchoService()])
        _ = try await server.start()
        var back = false
        for _ in 0..<100 where !back {  // retried past the backoff
            if let r = try? await channel.client.unary(EchoService.unaryMethod, Bytes("back"), as: Bytes.self) {
                back = r.message.text == "back"
            } else {
                try await Task.sleep(for: .milliseconds(100))
            }
        }
        #expect(back)

        // Restart the server under the channel: the next call after backoff reconnects.
        await server.shutdownGracefully()
        let again = RPCServer(configuration: config, services: [EchoService()])
        _ = try await again.start()
        var recovered = false
        for _ in 0..<100 where !recovered {
            if let r = try? await channel.client.unary(EchoService.unaryMethod, Bytes("again"), as: Bytes.self) {
                recovered = r.message.text == "again"
            } else {
                try await Task.sleep(for: .milliseconds(100))
            }
        }
        #expect(recovered)
        await channel.close()
        await again.shutdownGracefully()
    }

    /// A one-thread server with a Sleep call of `seconds` in flight, returned once its handler
    /// runs: a call the server never received would rightly be refused by the GOAWAY.
    static func serverWithSleepingCall(
        seconds: Int, grace: Duration = .seconds(10)
    ) async throws
        -> (server: RPCServer, channel: RPCChannel, tag: String, call: Task<ClientResponse<Bytes>, any Error>)
    {
        var config = ServerConfiguration(host: "127.0.0.1", port: 0)
        config.threads = 1
        config.shutdownGracePeriod = grace
        let server = RPCServer(configuration: config, services: [EchoService()])
        let port = try await server.start()
        let channel = RPCChannel(host: "127.0.0.1", port: port)
        let tag = "\(seconds)#sleep-\(port)"
        let call = Task { try await channel.client.unary(EchoService.sleepMethod, Bytes(tag), as: Bytes.self) }
        while !sleepsStarted.withLock({ $0.contains(tag) }) { try await Task.sleep(for: .milliseconds(10)) }
        return (server, channel, tag, call)
    }

    @Test func gracefulShutdownLetsInFlightCallsFinish() async throws {
        let (server, channel, tag, inflight) = try await Self.serverWithSleepingCall(seconds: 1)
        await server.shutdownGracefully()
        let r = try await inflight.value
        #expect(r.message.text == tag)
        await channel.close()
    }

    @Test func gracefulShutdownEndsWhenTheGracePeriodRunsOut() async throws {
        // A call that outlives the grace period is cut, and the shutdown returns then rather
        // than when the call would have ended (60 s).
        let (server, channel, _, inflight) = try await Self.serverWithSleepingCall(seconds: 60, grace: .milliseconds(200))
        let start = ContinuousClock.now
        await server.shutdownGracefully()
        #expect(ContinuousClock.now - start < .seconds(30), "shutdown waited for the call, not the grace period")
        await #expect(throws: (any Error).self) { _ = try await inflight.value }
        await channel.close()
    }
}
