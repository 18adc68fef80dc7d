import Contracts
import Foundation
import GRPCContracts
import NIOPosix
import Observability
import RPCCore
import RPCTransport
import Security
import ServiceKit
import Testing

@testable import Gateway

@Suite(.serialized) struct ProxyTests {
    @Test func routeTableIsEveryPublicMethodFromTheDescriptors() throws {
        let registry = try SchemaRegistry(Gateway.descriptors)
        let routes = Gateway.publicRoutes(registry)
        #expect(
            Set(routes.keys) == [
                "accounts.v1.Accounts", "social.v1.Social", "tasks.v1.Tasks", "finance.v1.Finance",
                "matchmaking.v1.Matchmaking",
            ])
        let generated: [String: [MethodDescriptor]] = [
            Accounts_V1_AccountsMethods.serviceName: Accounts_V1_AccountsMethods.all,
            Social_V1_SocialMethods.serviceName: Social_V1_SocialMethods.all,
            Tasks_V1_TasksMethods.serviceName: Tasks_V1_TasksMethods.all,
            Finance_V1_FinanceMethods.serviceName: Finance_V1_FinanceMethods.all,
            Matchmaking_V1_MatchmakingMethods.serviceName: Matchmaking_V1_MatchmakingMethods.all,
        ]
        for (service, methods) in generated {
            // Same kinds, visibility and types as the generated tables; internal ones left out.
            #expect(routes[service] == methods.filter { $0.visibility != .internal }, "\(service)")
        }
        for internalMethods in [Accounts_V1_AccountsInternalMethods.all, Social_V1_SocialInternalMethods.all] {
            for m in internalMethods { #expect(m.visibility == .internal) }
        }
        #expect(routes.values.joined().allSatisfy { $0.visibility != .internal })
    }

    @Test func publicMethodNeedsNoToken() async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        var req = Accounts_V1_LogInRequest()
        req.username = "ada"
        req.password = "pw"
        let r = try await Accounts_V1_AccountsClient(h.client).logIn(req)
        #expect(r.user.userId == "u-ada")
        #expect(r.session.accessToken == "token-for-ada")
    }

    @Test func authenticatedMethodNeedsAValidToken() async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        let accounts = Accounts_V1_AccountsClient(h.client)
        let path = Accounts_V1_AccountsMethods.getMyProfile.path

        await #expect(throws: RPCError.self) { _ = try await accounts.getMyProfile(Accounts_V1_GetMyProfileRequest()) }
        do {
            _ = try await accounts.getMyProfile(Accounts_V1_GetMyProfileRequest())
        } catch let e as RPCError { #expect(e.code == .unauthenticated) }

        let forger = Ed25519KeyPair()
        let bad = [
            h.keys.token(expiresIn: -60),  // expired
            h.keys.token(signer: forger),  // right key id, wrong key
            h.keys.token(keyID: "nope", signer: forger),  // unknown key id
            "not.a.token",
        ]
        for token in bad {
            do {
                _ = try await accounts.getMyProfile(Accounts_V1_GetMyProfileRequest(), options: CallOptions(metadata: h.bearer(token)))
                Issue.record("token \(token) was accepted")
            } catch let e as RPCError {
                #expect(e.code == .unauthenticated, "\(e)")
            }
        }
        // Not the Bearer scheme.
        do {
            _ = try await accounts.getMyProfile(
                Accounts_V1_GetMyProfileRequest(),
                options: CallOptions(metadata: Metadata([("authorization", "Basic YTpi")])))
            Issue.record("Basic auth accepted")
        } catch let e as RPCError { #expect(e.code == .unauthenticated) }
        #expect(h.recorder.count(path) == 0, "rejected calls never reach the service")

        let r = try await accounts.getMyProfile(
            Accounts_V1_GetMyProfileRequest(),
            options: CallOptions(metadata: h.bearer(h.keys.token(user: "u-42"))))
        #expect(r.user.userId == "u-42", "the service verified the forwarded token itself")
    }

    @Test func aBadTokenOnAPublicMethodIsRejectedToo() async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        var req = Accounts_V1_LogInRequest()
        req.username = "ada"
        do {
            _ = try await Accounts_V1_AccountsClient(h.client).logIn(req, options: CallOptions(metadata: h.bearer(h.keys.token(expiresIn: -60))))
            Issue.record("expired token accepted")
        } catch let e as RPCError { #expect(e.code == .unauthenticated) }
    }

    @Test func internalMethodsAreNeverReachable() async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        // Even with the real service credential and a valid token.
        var md = h.bearer(h.keys.token())
        md.add("x-service-token", Fake.serviceToken)
        for m in Accounts_V1_AccountsInternalMethods.all {
            do {
                _ = try await h.client.unary(
                    m, Accounts_V1_GetUsersByIdsRequest(), as: Accounts_V1_GetUsersByIdsResponse.self,
                    options: CallOptions(metadata: md))
                Issue.record("\(m.path) reachable")
            } catch let e as RPCError {
                #expect(e.code == .unimplemented, "\(m.path): \(e)")
            }
        }
        #expect(h.recorder.count(Accounts_V1_AccountsInternalMethods.getUsersByIds.path) == 0)
        // Unknown paths too.
        let unknown = MethodDescriptor(service: "accounts.v1.Accounts", method: "Nope", kind: .unary)
        await #expect(throws: RPCError.self) { _ = try await h.client.unary(unknown, Bytes("x"), as: Bytes.self) }
    }

    @Test func clientIdentityAndInternalHeadersAreStripped() async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        let token = h.keys.token(user: "u-7")
        var md = h.bearer(token)
        for (k, v) in [
            ("x-service-token", "forged"), ("x-user-id", "u-admin"), ("x-identity-user", "u-admin"),
            ("x-internal-debug", "1"), ("x-forwarded-for", "6.6.6.6"), ("x-gateway-user", "u-admin"),
            ("x-custom", "kept"),
        ] {
            md.add(k, v)
        }
        md.add("x-custom-bin", binary: [0, 1, 2, 255])
        let r = try await Accounts_V1_AccountsClient(h.client).getMyProfile(
            Accounts_V1_GetMyProfileRequest(),
            options: CallOptions(metadata: md))
        #expect(r.user.userId == "u-7")
        let seen = try #require(h.recorder.last(Accounts_V1_AccountsMethods.getMyProfile.path))
        #expect(seen.values("x-gateway-token") == [.string(Fake.gatewayToken)], "only the gateway's credential")
        #expect(seen["x-service-token"] == nil, "a client's forged service credential is stripped")
        #expect(seen.values("x-forwarded-for") == [.string("127.0.0.1")], "the address the gateway saw")
        #expect(seen["x-user-id"] == nil)
        #expect(seen["x-identity-user"] == nil)
        #expect(seen["x-internal-debug"] == nil)
        #expect(seen["x-gateway-user"] == nil)
        #expect(seen["authorization"] == "Bearer \(token)", "the caller's token passes unchanged")
        #expect(seen["x-custom"] == "kept")
        #expect(seen.binary("x-custom-bin") == [0, 1, 2, 255])
    }

    /// What HTTP/2 allows in a header and gRPC does not (a tab, bytes above 0x7E, a name with
    /// `!`), sent by a raw client (curl, over h2c), reaches the service as the metadata rule
    /// makes it on both unary paths: bad bytes replaced, bad names dropped, the rest as sent.
    @Test(arguments: [false, true]) func metadataGRPCDoesNotAllowIsMadeSafe(accessLog: Bool) async throws {
        let h = try await Harness { $0.accessLog = accessLog }
        defer { Task { await h.stop() } }
        let token = h.keys.token(user: "u-9")
        let request = try writeTemp([0, 0, 0, 0, 0])
        let r = try await curlBytes([
            "--http2-prior-knowledge", "-X", "POST", "-H", "content-type: application/grpc", "-H", "te: trailers",
            "-H", "authorization: Bearer \(token)", "-H", "x-tab: a\tb", "-H", "x-obs: caf\u{e9}", "-H", "x-na!me: 1",
            "-H", "x-plain: ok", "--data-binary", "@\(request)",
            "http://127.0.0.1:\(h.port)\(Accounts_V1_AccountsMethods.getMyProfile.path)",
        ])
        #expect(r.status == 200)
        let seen = try #require(h.recorder.last(Accounts_V1_AccountsMethods.getMyProfile.path))
        #expect(seen["x-tab"] == "a?b")
        #expect(seen["x-obs"] == "caf??")
        #expect(seen["x-na!me"] == nil)
        #expect(seen["x-plain"] == "ok")
        #expect(seen["authorization"] == "Bearer \(token)")
        #expect(seen.values("x-forwarded-for") == [.string("127.0.0.1")])
    }

    /// Both unary paths: relayed without a context (the default) and with one (access log on).
    @Test(arguments: [false, true]) func metadataAndStatusDetailsComeBack(accessLog: Bool) async throws {
        let h = try await Harness { $0.accessLog = accessLog }
        defer { Task { await h.stop() } }
        var req = Accounts_V1_LogInRequest()
        req.username = "ada"
        let r = try await Accounts_V1_AccountsClient(h.client).logInWithMetadata(
            req, options: CallOptions(metadata: Metadata([("x-echo-initial", "hi"), ("x-echo-trailer", "bye")])))
        #expect(r.initialMetadata["x-echo-initial"] == "hi")
        #expect(r.trailers["x-echo-trailer"] == "bye")

        var signUp = Accounts_V1_SignUpRequest()
        signUp.username = "taken"
        do {
            _ = try await Accounts_V1_AccountsClient(h.client).signUp(signUp)
            Issue.record("no error")
        } catch let e as RPCError {
            #expect(e.code == .alreadyExists)
            #expect(e.message.contains("username"))
            #expect(e.trailers["x-why"] == "duplicate")
            let details = try #require(e.trailers.binary("grpc-status-details-bin"))
            let status = try Google_Rpc_Status(serializedBytes: details)
            #expect(status.code == Int32(StatusCode.alreadyExists.rawValue))
            #expect(status.details.first?.typeUrl == "type.googleapis.com/google.rpc.BadRequest")
            let bad = try Google_Rpc_BadRequest(serializedBytes: status.details[0].value)
            #expect(bad.fieldViolations.map(\.field) == ["username"])
        }
        // The upstream's own UNAVAILABLE passes as it is (only the transport's own is reworded).
        signUp.username = "unavailable"
        do {
            _ = try await Accounts_V1_AccountsClient(h.client).signUp(signUp)
            Issue.record("no error")
        } catch let e as RPCError {
            #expect(e.code == .unavailable && e.message == "the fake's store at 127.0.0.1:1 is down", "\(e)")
        }
    }

    /// Both unary paths: relayed without a context (the default) and with one (access log on).
    @Test(arguments: [false, true]) func deadlinesAreForwardedAndCapped(accessLog: Bool) async throws {
        let h = try await Harness {
            $0.maxDeadline = .seconds(5)
            $0.accessLog = accessLog
        }
        defer { Task { await h.stop() } }
        let accounts = Accounts_V1_AccountsClient(h.client)
        func remaining(_ timeout: Duration?) async throws -> Int {
            let r = try await accounts.getMyProfile(
                Accounts_V1_GetMyProfileRequest(),
                options: CallOptions(timeout: timeout, metadata: h.bearer(h.keys.token())))
            return Int(r.user.displayName.split(separator: ":")[1])!
        }
        let two = try await remaining(.seconds(2))
        #expect(two > 1000 && two <= 2000, "\(two)")
        let capped = try await remaining(.seconds(60))
        #expect(capped > 4000 && capped <= 5000, "\(capped)")
        let none = try await remaining(nil)
        #expect(none == -1, "no client deadline: none goes up (the gateway caps the call itself)")

        // A slow upstream ends at the client's deadline, promptly.
        var req = Accounts_V1_LogInRequest()
        req.password = "slow"
        let start = ContinuousClock.now
        do {
            _ = try await accounts.logIn(req, options: CallOptions(timeout: .milliseconds(300)))
            Issue.record("no deadline")
        } catch let e as RPCError {
            #expect(e.code == .deadlineExceeded)
        }
        #expect(ContinuousClock.now - start < .seconds(2))
    }

    @Test func callsWithoutADeadlineEndAtTheCap() async throws {
        let h = try await Harness { c in
            c.maxDeadline = .milliseconds(400)
            c.maxStreamDeadline = .milliseconds(600)
        }
        defer { Task { await h.stop() } }
        var req = Accounts_V1_LogInRequest()
        req.password = "slow"  // the fake sleeps 5 s
        let start = ContinuousClock.now
        do {
            _ = try await Accounts_V1_AccountsClient(h.client).logIn(req)
            Issue.record("no deadline")
        } catch let e as RPCError {
            #expect(e.code == .deadlineExceeded, "\(e)")
        }
        let took = ContinuousClock.now - start
        #expect(took >= .milliseconds(400) && took < .seconds(2), "\(took)")

        // A stream without a deadline is cut at the stream cap.
        let streamStart = ContinuousClock.now
        do {
            try await Social_V1_SocialClient(h.client).subscribeNotifications(
                Social_V1_SubscribeNotificationsRequest(), options: CallOptions(metadata: h.bearer(h.keys.token()))
            ) { s in
                for try await _ in s.messages {}
            }
            Issue.record("stream not cut")
        } catch let e as RPCError {
            #expect(e.code == .deadlineExceeded, "\(e)")
        }
        #expect(ContinuousClock.now - streamStart < .seconds(3))
        #expect(try await eventually { h.gateway.activeUpstreamCalls("social") == 0 })
    }

    @Test func serverStreamingPassesThroughLive() async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        let social = Social_V1_SocialClient(h.client)
        var req = Social_V1_SubscribeNotificationsRequest()
        req.afterNotificationId = "3"  // the fake sends three, then ends
        let (events, headers, trailers) = try await social.subscribeNotifications(
            req, options: CallOptions(metadata: h.bearer(h.keys.token()))
        ) { stream in
            var got: [Social_V1_SubscribeNotificationsResponse] = []
            for try await m in stream.messages { got.append(m) }
            return (got, try await stream.initialMetadata(), await stream.trailers())
        }
        #expect(events.count == 4)
        if case .started(let s)? = events.first?.event { #expect(s.unreadCount == 3) } else { Issue.record("no started") }
        #expect(
            events.dropFirst().map { e -> String in
                if case .notification(let n)? = e.event { return n.notificationId } else { return "" }
            } == ["n-0", "n-1", "n-2"])
        #expect(headers["x-stream"] == "live")
        #expect(trailers["x-sent"] == "3")

        // Without a token the stream is refused before the upstream sees it.
        do {
            try await social.subscribeNotifications(Social_V1_SubscribeNotificationsRequest()) { s in
                for try await _ in s.messages {}
            }
            Issue.record("no error")
        } catch let e as RPCError { #expect(e.code == .unauthenticated) }
    }

    @Test func cancellingAStreamCancelsTheUpstream() async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        let social = Social_V1_SocialClient(h.client)
        let token = h.keys.token()
        do {
            try await social.subscribeNotifications(
                Social_V1_SubscribeNotificationsRequest(),
                options: CallOptions(metadata: h.bearer(token))
            ) { stream in
                var n = 0
                for try await _ in stream.messages {
                    n += 1
                    if n == 3 { throw CancellationError() }
                }
            }
        } catch {}
        #expect(try await eventually { h.recorder.notes.contains { $0.hasPrefix("subscription ended") } })
        #expect(try await eventually { h.gateway.activeUpstreamCalls("social") == 0 })
    }

    /// Past the streams every upstream connection of a loop may carry, a new call is refused at
    /// once with UNAVAILABLE naming the limit (it used to wait, silently, for a free stream: for
    /// a subscription, until another one ended); once a stream ends, calls get through again.
    @Test func callsPastTheUpstreamConnectionLimitAreRefusedAtOnce() async throws {
        let h = try await Harness {
            $0.threads = 1
            $0.streamsPerUpstreamConnection = 2
            $0.upstreamMaxConnections = 1
        }
        defer { Task { await h.stop() } }
        let social = Social_V1_SocialClient(h.client)
        let options = CallOptions(metadata: h.bearer(h.keys.token()))
        // Two endless subscriptions, each open once its first message came.
        var held: [Task<Void, any Error>] = []
        for _ in 0..<2 {
            let (opened, open) = AsyncStream.makeStream(of: Void.self)
            held.append(
                Task {
                    try await social.subscribeNotifications(Social_V1_SubscribeNotificationsRequest(), options: options) { s in
                        for try await _ in s.messages { open.yield() }
                    }
                })
            var it = opened.makeAsyncIterator()
            _ = await it.next()
        }
        let start = ContinuousClock.now
        do {
            try await social.subscribeNotifications(Social_V1_SubscribeNotificationsRequest(), options: options) { s in
                for try await _ in s.messages {}
            }
            Issue.record("a third stream got through")
        } catch let e as RPCError {
            #expect(e.code == .unavailable && e.message.contains("as many calls to social as it may"), "\(e)")
        }
        #expect(ContinuousClock.now - start < .seconds(2))
        held[0].cancel()
        #expect(try await eventually { h.gateway.activeUpstreamCalls("social") == 1 })
        var req = Social_V1_SubscribeNotificationsRequest()
        req.afterNotificationId = "1"  // the fake sends one, then ends
        let (events, _, _) = try await social.subscribeNotifications(req, options: options) { s in
            var got = 0
            for try await _ in s.messages { got += 1 }
            return (got, 0, 0)
        }
        #expect(events == 2)
        held[1].cancel()
    }

    /// Both unary paths: relayed without a context (the default) and with one (access log on).
    @Test(arguments: [false, true]) func finishedUnaryCallsAreFreed(accessLog: Bool) async throws {
        // The client's stream holds the relayed call (to cancel it) and the call holds the stream
        // (to answer it) until the answer: a cycle that must break, or every call leaks.
        let h = try await Harness { $0.accessLog = accessLog }
        defer { Task { await h.stop() } }
        let accounts = Accounts_V1_AccountsClient(h.client)
        for _ in 0..<20 { _ = try await accounts.getSigningKeys(Accounts_V1_GetSigningKeysRequest()) }
        #expect(
            try await eventually { PendingUnaryCall.live.load(ordering: .relaxed) == 0 },
            "\(PendingUnaryCall.live.load(ordering: .relaxed)) relayed calls still alive")
    }

    /// Both unary paths: relayed without a context (the default) and with one (access log on).
    @Test(arguments: [false, true]) func cancellingAUnaryCallCancelsTheUpstream(accessLog: Bool) async throws {
        let h = try await Harness { $0.accessLog = accessLog }
        defer { Task { await h.stop() } }
        var req = Accounts_V1_LogInRequest()
        req.password = "slow"  // the fake sleeps 5 s unless cancelled
        let call = Task { try await Accounts_V1_AccountsClient(h.client).logIn(req) }
        // Once the upstream runs the call (not merely when the gateway opened its stream).
        #expect(try await eventually { h.recorder.count("/accounts.v1.Accounts/LogIn") == 1 })
        let start = ContinuousClock.now
        call.cancel()
        await #expect(throws: (any Error).self) { _ = try await call.value }
        #expect(try await eventually { h.recorder.notes.contains("login cancelled") })
        #expect(ContinuousClock.now - start < .seconds(2))
        #expect(try await eventually { h.gateway.activeUpstreamCalls("accounts") == 0 })
    }

    @Test func bidirectionalStreamsAreLiveBothWays() async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        let replies = try await h.client.bidirectionalStreaming(
            Fake.chat, as: Bytes.self,
            options: CallOptions(metadata: Metadata([("x-custom", "c")]))
        ) {
            (writer: RequestWriter<Bytes>, responses: ClientStreamingResponse<Bytes>) in
            var it = responses.messages.makeAsyncIterator()
            var got: [String] = []
            // One message at a time: each reply arrives before the next request is sent.
            for word in ["a", "b", "c"] {
                try await writer.write(Bytes(word))
                got.append(try await it.next()?.text ?? "<end>")
            }
            try await responses.call.closeSend()
            while let m = try await it.next() { got.append(m.text) }
            return got
        }
        #expect(replies == ["echo:a", "echo:b", "echo:c"])
        #expect(h.recorder.last(Fake.chat.path)?["x-custom"] == "c")

        // An upstream error in the middle of a stream.
        do {
            _ = try await h.client.bidirectionalStreaming(Fake.chat, as: Bytes.self) {
                (writer: RequestWriter<Bytes>, responses: ClientStreamingResponse<Bytes>) in
                try await writer.write(Bytes("x"))
                try await writer.write(Bytes("fail"))
                for try await _ in responses.messages {}
            }
            Issue.record("no error")
        } catch let e as RPCError {
            #expect(e.code == .failedPrecondition)
            #expect(e.message == "asked to fail")
        }
    }

    @Test func clientStreamingAndLargeStreams() async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        let r = try await h.client.clientStreaming(Fake.collect, as: Bytes.self) { (w: RequestWriter<Bytes>) in
            for _ in 0..<200 { try await w.write(Bytes(String(repeating: "z", count: 10_000))) }
        }
        #expect(r.message.text == "200 messages, 2000000 bytes")

        // 32 MiB through the gateway, read slowly at first: flow control holds the upstream back
        // and every message arrives, in order.
        let count = try await h.client.serverStreaming(Fake.expand, Bytes("512:65536"), as: Bytes.self) { stream in
            var n = 0
            for try await m in stream.messages {
                if n < 3 { try await Task.sleep(for: .milliseconds(100)) }
                #expect(m.data.count == 65536 && m.data.first == UInt8(ascii: "0") + UInt8(n % 10))
                n += 1
            }
            return n
        }
        #expect(count == 512)
    }

    /// A relayed server stream whose client stops reading holds the upstream back (the relay
    /// keeps the upstream's bytes in its flow-control window once the client's queue is full)
    /// instead of buffering the stream in the gateway; reading on, everything arrives in order.
    @Test func aStalledClientHoldsTheUpstreamBack() async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        let total = 2000  // 125 MiB of 64 KiB messages
        let before = Fake.expandWritten.load(ordering: .relaxed)
        let count = try await h.client.serverStreaming(Fake.expand, Bytes("\(total):65536"), as: Bytes.self) { stream in
            var n = 0
            for try await m in stream.messages {
                if n == 0 {
                    // Stalled: the upstream may fill the windows and buffers on the way, no more
                    // (35 messages here; 538 when unfinished messages' bytes were always given back).
                    try await Task.sleep(for: .milliseconds(800))
                    let written = Fake.expandWritten.load(ordering: .relaxed) - before
                    #expect(written < 100, "the upstream wrote \(written) of \(total) messages while the client read one")
                }
                #expect(m.data.count == 65536 && m.data.first == UInt8(ascii: "0") + UInt8(n % 10))
                n += 1
            }
            return n
        }
        #expect(count == total)
    }

    @Test func messagesOfSeveralMegabytesPassBothWays() async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        // The client's window must hold the whole 3 MiB response too.
        var config = ChannelConfiguration(host: "127.0.0.1", port: h.port)
        config.initialWindowSize = 8 << 20
        config.maxReceiveMessageSize = 8 << 20
        let channel = RPCChannel(configuration: config)
        defer { Task { await channel.close() } }
        let big = String(repeating: "m", count: 3 << 20)
        let r = try await channel.client.clientStreaming(Fake.collect, as: Bytes.self, options: CallOptions(timeout: .seconds(20))) {
            (w: RequestWriter<Bytes>) in try await w.write(Bytes(big))
        }
        #expect(r.message.text == "1 messages, \(3 << 20) bytes")
        let sizes = try await channel.client.serverStreaming(
            Fake.expand, Bytes("2:\(3 << 20)"), as: Bytes.self,
            options: CallOptions(timeout: .seconds(20))
        ) { stream in
            var sizes: [Int] = []
            for try await m in stream.messages { sizes.append(m.data.count) }
            return sizes
        }
        #expect(sizes == [3 << 20, 3 << 20])
    }

    @Test func aDownUpstreamIsUnavailableQuickly() async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        let social = Social_V1_SocialClient(h.client)
        let md = h.bearer(h.keys.token())
        _ = try await social.getNotificationSettings(Social_V1_GetNotificationSettingsRequest(), options: CallOptions(metadata: md))
        await h.social.stop()
        for _ in 0..<3 {
            let start = ContinuousClock.now
            do {
                _ = try await social.getNotificationSettings(Social_V1_GetNotificationSettingsRequest(), options: CallOptions(metadata: md))
                Issue.record("no error")
            } catch let e as RPCError {
                // Named, without its address or the transport's inner errors.
                #expect(e.code == .unavailable && e.message == "social is unavailable right now: try again shortly", "\(e)")
            }
            #expect(ContinuousClock.now - start < .seconds(2))
        }
        // A server stream and a bidirectional one are told the same.
        do {
            try await social.subscribeNotifications(Social_V1_SubscribeNotificationsRequest(), options: CallOptions(metadata: md)) { s in
                for try await _ in s.messages {}
            }
            Issue.record("no error")
        } catch let e as RPCError {
            #expect(e.code == .unavailable && e.message == "social is unavailable right now: try again shortly", "\(e)")
        }
        do {
            _ = try await h.client.bidirectionalStreaming(Fake.chat, as: Bytes.self) {
                (writer: RequestWriter<Bytes>, responses: ClientStreamingResponse<Bytes>) in
                try await writer.write(Bytes("x"))
                for try await _ in responses.messages {}
            }
            Issue.record("no error")
        } catch let e as RPCError {
            #expect(e.code == .unavailable && e.message == "social is unavailable right now: try again shortly", "\(e)")
        }
        // Other upstreams are unaffected.
        var req = Accounts_V1_LogInRequest()
        req.username = "ada"
        _ = try await Accounts_V1_AccountsClient(h.client).logIn(req)
    }

    @Test func rateLimitsPerAddressAndPerUser() async throws {
        let h = try await Harness { c in
            c.addressRate = 0.5
            c.addressBurst = 4
        }
        defer { Task { await h.stop() } }
        let accounts = Accounts_V1_AccountsClient(h.client)
        var codes: [StatusCode] = []
        for _ in 0..<6 {
            do {
                _ = try await accounts.logIn(Accounts_V1_LogInRequest())
                codes.append(.ok)
            } catch let e as RPCError {
                codes.append(e.code)
                if e.code == .resourceExhausted {
                    let status = try Google_Rpc_Status(serializedBytes: try #require(e.trailers.binary("grpc-status-details-bin")))
                    #expect(status.details.first?.typeUrl == "type.googleapis.com/google.rpc.RetryInfo")
                    #expect(e.trailers["retry-after"] != nil)
                }
            }
        }
        #expect(codes == [.ok, .ok, .ok, .ok, .resourceExhausted, .resourceExhausted])

        let u = try await Harness { c in
            c.userRate = 0.5
            c.userBurst = 2
        }
        defer { Task { await u.stop() } }
        let profile = Accounts_V1_AccountsClient(u.client)
        func call(_ user: String) async -> StatusCode {
            do {
                _ = try await profile.getMyProfile(
                    Accounts_V1_GetMyProfileRequest(),
                    options: CallOptions(metadata: u.bearer(u.keys.token(user: user))))
                return .ok
            } catch let e as RPCError { return e.code } catch { return .unknown }
        }
        #expect(await call("a") == .ok)
        #expect(await call("a") == .ok)
        #expect(await call("a") == .resourceExhausted)
        #expect(await call("b") == .ok, "buckets are per user")
    }

    /// Both unary paths: relayed without a context (the default) and with one (access log on).
    @Test(arguments: [false, true]) func tokensNamingUnknownKeysAreChargedToTheAddressOnce(accessLog: Bool) async throws {
        // Such a token defers from the immediate check to the one that fetches keys: the address
        // pays once per call, before any signature check, whichever path decides.
        let h = try await Harness { c in
            c.accessLog = accessLog
            c.addressRate = 0.5
            c.addressBurst = 4
        }
        defer { Task { await h.stop() } }
        let forged = h.keys.token(keyID: "k-unknown", signer: Ed25519KeyPair())
        var codes: [StatusCode] = []
        for _ in 0..<5 {
            do {
                _ = try await Accounts_V1_AccountsClient(h.client).getMyProfile(
                    Accounts_V1_GetMyProfileRequest(), options: CallOptions(metadata: h.bearer(forged)))
                codes.append(.ok)
            } catch let e as RPCError { codes.append(e.code) }
        }
        #expect(codes == [.unauthenticated, .unauthenticated, .unauthenticated, .unauthenticated, .resourceExhausted])
    }

    @Test func oversizedRequestsAreRefused() async throws {
        let h = try await Harness { $0.maxRequestBytes = 64 * 1024 }
        defer { Task { await h.stop() } }
        var req = Accounts_V1_LogInRequest()
        req.password = String(repeating: "p", count: 100_000)
        do {
            _ = try await Accounts_V1_AccountsClient(h.client).logIn(req)
            Issue.record("no error")
        } catch let e as RPCError {
            #expect(e.code == .resourceExhausted)
        }
        #expect(h.recorder.count(Accounts_V1_AccountsMethods.logIn.path) == 0)
    }

    /// Both unary paths: relayed without a context (the default) and with one (access log on).
    @Test(arguments: [false, true]) func newSigningKeysAreFetchedWhenATokenNamesThem(accessLog: Bool) async throws {
        let h = try await Harness {
            $0.keyRefreshInterval = .milliseconds(100)
            $0.accessLog = accessLog
        }
        defer { Task { await h.stop() } }
        let accounts = Accounts_V1_AccountsClient(h.client)
        _ = try await accounts.getMyProfile(Accounts_V1_GetMyProfileRequest(), options: CallOptions(metadata: h.bearer(h.keys.token())))
        let fetches = h.recorder.count(Accounts_V1_AccountsMethods.getSigningKeys.path)
        #expect(fetches == 1)
        // accounts rotates: a token signed with the new key works once the gateway refetches.
        let rotated = TestKeys(keyID: "k2")
        h.keyStore.add("k2", rotated.pair.publicKey)
        try await Task.sleep(for: .milliseconds(150))
        let r = try await accounts.getMyProfile(
            Accounts_V1_GetMyProfileRequest(),
            options: CallOptions(metadata: h.bearer(rotated.token(user: "u-new"))))
        #expect(r.user.userId == "u-new")
        #expect(h.recorder.count(Accounts_V1_AccountsMethods.getSigningKeys.path) == 2)
    }

    /// The token the relay remembers for a connection stands for those exact bytes: the same
    /// token with one byte of its signature changed, on the same connection, is refused.
    @Test func aTokenOneByteFromTheRememberedOneIsRefused() async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        let accounts = Accounts_V1_AccountsClient(h.client)
        let token = h.keys.token(user: "u-7")
        for _ in 0..<3 {
            _ = try await accounts.getMyProfile(Accounts_V1_GetMyProfileRequest(), options: CallOptions(metadata: h.bearer(token)))
        }
        var bytes = Array(token.utf8)
        let last = bytes.count - 2
        bytes[last] = bytes[last] == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
        let forged = String(decoding: bytes, as: UTF8.self)
        let arrived = h.accounts.arrivals.count.load(ordering: .relaxed)
        let error = await #expect(throws: RPCError.self) {
            _ = try await accounts.getMyProfile(Accounts_V1_GetMyProfileRequest(), options: CallOptions(metadata: h.bearer(forged)))
        }
        #expect(error?.code == .unauthenticated)
        #expect(h.accounts.arrivals.count.load(ordering: .relaxed) == arrived, "refused by the gateway")
        // And the real one still passes on the same connection.
        let r = try await accounts.getMyProfile(Accounts_V1_GetMyProfileRequest(), options: CallOptions(metadata: h.bearer(token)))
        #expect(r.user.userId == "u-7")
    }

    /// A remembered verification still checks expiry on every call: a token inside the
    /// verifier's leeway (5 s) passes, and the same token is refused once it is past it.
    @Test func aRememberedTokenIsRefusedOnceItExpires() async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        let accounts = Accounts_V1_AccountsClient(h.client)
        let token = CallOptions(metadata: h.bearer(h.keys.token(user: "u-late", expiresIn: -3)))
        _ = try await accounts.getMyProfile(Accounts_V1_GetMyProfileRequest(), options: token)
        _ = try await accounts.getMyProfile(Accounts_V1_GetMyProfileRequest(), options: token)
        try await Task.sleep(for: .milliseconds(2500))
        let arrived = h.accounts.arrivals.count.load(ordering: .relaxed)
        let error = await #expect(throws: RPCError.self) {
            _ = try await accounts.getMyProfile(Accounts_V1_GetMyProfileRequest(), options: token)
        }
        #expect(error?.code == .unauthenticated)
        #expect(error?.message == "access token expired: refresh the session")
        #expect(h.accounts.arrivals.count.load(ordering: .relaxed) == arrived, "refused by the gateway, not relayed")
    }

    @Test func unaryCallsAreRelayedWithoutAContextUnlessSomethingNeedsOne() throws {
        let loops = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { try? loops.syncShutdownGracefully() }
        let pool = UpstreamPool(
            name: "accounts", configuration: ChannelConfiguration(host: "127.0.0.1", port: 1), loops: [loops.next()],
            fallbackLoop: loops.next(), maxConnectionsPerLoop: 1)
        let policy = GatewayPolicy(
            verifier: AuthInterceptor(keys: StaticSigningKeys { [:] }, serviceToken: ""), addressLimiter: nil, userLimiter: nil)
        let method = Accounts_V1_AccountsMethods.logIn
        // As the gateway makes it when it writes no access log (which notes every call's trace).
        let tracer = SpanTracer(serviceName: "gateway", sampler: RatioSampler(ratio: 0), exporter: nil, notesCalls: false)
        func relayed(_ proxy: Proxy) -> Bool {
            if case .unaryRelay = proxy.handler(for: method) { return true }
            return false
        }
        #expect(relayed(Proxy(pool: pool, maxDeadline: .seconds(5), maxStreamDeadline: .seconds(5), relayPolicy: policy)))
        // No policy given (the gateway gives none when the access log notes callers): the
        // context path.
        #expect(!relayed(Proxy(pool: pool, maxDeadline: .seconds(5), maxStreamDeadline: .seconds(5))))
        // With a tracer, still a relay: the calls the tracer takes part in go through the chain
        // (`RelayGate`, GatewayTracingTests), the rest are relayed.
        let traced = Proxy(pool: pool, maxDeadline: .seconds(5), maxStreamDeadline: .seconds(5), tracer: tracer, relayPolicy: policy)
        #expect(relayed(traced))
        let chain = ServerInterceptors([TracingInterceptor(tracer: tracer, role: .relay), policy])
        guard case .unaryRelay(let gated) = chain.wrap(traced.handler(for: method), for: method) else {
            Issue.record("the tracer and the policy keep the relay")
            return
        }
        var bytes = MetadataBytes()
        #expect(gated.contextPath(method, bytes) == nil, "ratio 0, no traceparent: relayed")
        bytes.append(trusted: "traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
        #expect(gated.contextPath(method, bytes) != nil, "a client's trace: through the chain")
        let noting = SpanTracer(serviceName: "gateway", sampler: RatioSampler(ratio: 0), exporter: nil, notesCalls: true)
        if case .unaryRelay(let r) = ServerInterceptors([TracingInterceptor(tracer: noting, role: .relay), policy]).wrap(
            traced.handler(for: method), for: method)
        {
            #expect(r.contextPath(method, MetadataBytes()) != nil, "a trace noted for the access log: through the chain")
        }
        // Anything else in the chain (an interceptor that is no `RelayGate`): the context path.
        let observed = ServerInterceptors([ObservingInterceptor(RPCServerMetrics()), policy])
        guard case .unaryForwarding = observed.wrap(traced.handler(for: method), for: method) else {
            Issue.record("an observing chain takes the context path")
            return
        }
    }
}
