import Contracts
import Foundation
import GRPCContracts
import RPCCore
import RPCTransport
import Testing

@testable import Gateway

/// Issue 35, what outside clients met first: deadlines on the gateway's own streams over the
/// browser protocols, HEAD on every page, gRPC-Web with JSON messages, and rate limits that say
/// when to come back.
@Suite(.serialized) struct ClientFacingTests {
    static let watch = "/grpc.health.v1.Health/Watch"

    /// The gateway's own `Health/Watch` never ends by itself: over gRPC the transport ends it at
    /// the client's deadline; over gRPC-Web and Connect it used to run on (33 s and counting).
    /// Now it ends with DEADLINE_EXCEEDED at 1 s, over both HTTP versions.
    @Test(arguments: ["grpc-web", "connect"], [false, true])
    func theGatewaysOwnStreamsEndAtTheirDeadline(protocolName: String, http2: Bool) async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        let grpcWeb = protocolName == "grpc-web"
        let body = try writeTemp(grpcWeb ? GRPCWeb.frame([]) : GRPCWeb.frame(Array("{}".utf8)))
        defer { try? FileManager.default.removeItem(atPath: body) }
        let headers =
            grpcWeb
            ? ["-H", "content-type: application/grpc-web+proto", "-H", "grpc-timeout: 1S"]
            : ["-H", "content-type: application/connect+json", "-H", "connect-timeout-ms: 1000"]
        let started = ContinuousClock.now
        let r = try await curlBytes(
            [http2 ? "--http2-prior-knowledge" : "--http1.1", "-X", "POST"] + headers
                + ["--data-binary", "@\(body)", "http://127.0.0.1:\(h.port)\(Self.watch)"])
        let elapsed = ContinuousClock.now - started
        #expect(elapsed > .milliseconds(900) && elapsed < .seconds(5), "ended at \(elapsed)")
        let f = frames(r.body)
        #expect(f.count >= 2, "the status (more if it changed meanwhile), then the end")
        let end = String(decoding: f.last?.1 ?? [], as: UTF8.self)
        if grpcWeb {
            #expect(f.last?.0 == 0x80 && end.contains("grpc-status: 4"), "\(end)")
        } else {
            #expect(f.last?.0 == 0x02 && end.contains("deadline_exceeded"), "\(end)")
        }
    }

    /// HEAD on every page the gateway serves sends what GET would, length included, and no body
    /// (RFC 9110 §9.3.2): `/status` used to say `content-length: 0`, `/metrics` too.
    @Test(arguments: [false, true]) func headAnswersWhatGETWould(http2: Bool) async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        let version = http2 ? "--http2-prior-knowledge" : "--http1.1"
        let pages = [
            "/", "/healthz", "/status", "/status.json", "/metrics", "/upload", "/upload?token=K7Q2-M9XD4", "/t/" + String(repeating: "a", count: 43),
        ]
        for page in pages {
            let url = "http://127.0.0.1:\(h.port)\(page)"
            let get = try await curlBytes([version, url])
            let head = try await curlBytes([version, "-I", url])
            let length = head.headers["content-length"].flatMap { Int($0) } ?? -1
            #expect(head.status == get.status, "\(page)")
            #expect(head.headers["content-type"] == get.headers["content-type"], "\(page)")
            // The status page and the metrics change between two requests; the others do not.
            if ["/status", "/status.json", "/metrics"].contains(page) {
                #expect(length > 0 && abs(length - get.body.count) * 10 < get.body.count, "\(page): HEAD \(length), GET \(get.body.count)")
            } else {
                #expect(length == get.body.count && length > 0, "\(page): HEAD \(length), GET \(get.body.count)")
            }
        }
    }

    /// `application/grpc-web+json` (connect-es with `useBinaryFormat: false`): the same frames
    /// holding JSON, unary (relayed and the gateway's own) and server streaming, over both HTTP
    /// versions; a bad field is named. It used to be refused with 415.
    @Test(arguments: [false, true]) func grpcWebWithJSONMessages(http2: Bool) async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        let version = http2 ? "--http2-prior-knowledge" : "--http1.1"
        func call(
            _ path: String, _ json: String, token: String? = nil, extra: [String] = []
        ) async throws -> (status: Int, headers: [String: String], frames: [(UInt8, [UInt8])]) {
            let file = try writeTemp(GRPCWeb.frame(Array(json.utf8)))
            defer { try? FileManager.default.removeItem(atPath: file) }
            var args = [version, "-X", "POST", "-H", "content-type: application/grpc-web+json", "--data-binary", "@\(file)"] + extra
            if let token { args += ["-H", "authorization: Bearer \(token)"] }
            let r = try await curlBytes(args + ["http://127.0.0.1:\(h.port)\(path)"])
            return (r.status, r.headers, frames(r.body))
        }
        func text(_ bytes: [UInt8]) -> String { String(decoding: bytes, as: UTF8.self) }

        let check = try await call("/grpc.health.v1.Health/Check", "{}")
        #expect(check.status == 200 && check.headers["content-type"] == "application/grpc-web+json")
        #expect(check.frames.map(\.0) == [0, 0x80], "\(check.headers)")
        #expect(text(check.frames.first?.1 ?? []) == #"{"status":"SERVING"}"#)
        let trailers = text(check.frames.last?.1 ?? [])
        #expect(trailers.contains("grpc-status: 0"), "\(trailers)")

        let login = try await call("/accounts.v1.Accounts/LogIn", #"{"username":"ada","password":"pw"}"#)
        #expect(json(text(login.frames.first?.1 ?? []))["session"] as? [String: String] == ["sessionId": "s-1", "accessToken": "token-for-ada"])

        let bad = try await call("/accounts.v1.Accounts/LogIn", #"{"username":7}"#)
        #expect(bad.headers["grpc-status"] == "3" && bad.headers["grpc-message"]?.contains("username") == true, "\(bad.headers)")

        let stream = try await call(
            "/social.v1.Social/SubscribeNotifications", #"{"afterNotificationId":"2"}"#, token: h.keys.token())
        #expect(stream.frames.map(\.0) == [0, 0, 0, 0x80], "\(stream.frames.map(\.0))")
        let second = text(stream.frames.dropFirst().first?.1 ?? [])
        #expect(json(second)["notification"] != nil, "\(second)")
    }

    /// A spent rate limit says when to come back, in every protocol: gRPC a
    /// `google.rpc.RetryInfo` with the wait and `retry-after`; over HTTP (Connect, gRPC-Web,
    /// Connect streaming, the pages) `Retry-After` and the RateLimit fields of
    /// draft-ietf-httpapi-ratelimit-headers-10 as headers.
    @Test func rateLimitsSayWhenToComeBack() async throws {
        let h = try await Harness { c in
            c.addressRate = 0.5
            c.addressBurst = 1
            // The pages call tasks: routed (to nothing), so the limit is what answers.
            c.upstreams.append(.init(name: "tasks", host: "127.0.0.1", port: 1))
        }
        defer { Task { await h.stop() } }
        let base = "http://127.0.0.1:\(h.port)"
        func expectLimitHeaders(_ headers: [String: String], _ what: String) {
            let after = headers["retry-after"].flatMap { Int($0) }
            #expect(after.map { $0 >= 1 && $0 <= 2 } == true, "\(what): \(headers)")
            #expect(headers["ratelimit-policy"] == #""address";q=1;w=2"#, "\(what): \(headers)")
            #expect(headers["ratelimit"] == #""address";r=0;t=\#(after ?? -1)"#, "\(what): \(headers)")
        }
        _ = try await curl(["--http1.1", base + "/healthz"])  // not limited
        let first = try await ConnectTests.post(h, "/accounts.v1.Accounts/LogIn", "{}")
        #expect(first.status == 200)

        let connect = try await ConnectTests.post(h, "/accounts.v1.Accounts/LogIn", "{}")
        #expect(connect.status == 429 && json(connect.body)["code"] as? String == "resource_exhausted")
        expectLimitHeaders(connect.headers, "Connect")

        let empty = try writeTemp(GRPCWeb.frame([]))
        defer { try? FileManager.default.removeItem(atPath: empty) }
        let web = try await curlBytes([
            "--http1.1", "-X", "POST", "-H", "content-type: application/grpc-web+proto", "--data-binary", "@\(empty)",
            base + "/accounts.v1.Accounts/GetSigningKeys",
        ])
        #expect(web.headers["grpc-status"] == "8")
        expectLimitHeaders(web.headers, "gRPC-Web")

        let streamBody = try writeTemp(GRPCWeb.frame(Array("{}".utf8)))
        defer { try? FileManager.default.removeItem(atPath: streamBody) }
        let stream = try await curlBytes([
            "--http2-prior-knowledge", "-X", "POST", "-H", "content-type: application/connect+json", "-H",
            "authorization: Bearer \(h.keys.token())", "--data-binary", "@\(streamBody)", base + "/social.v1.Social/SubscribeNotifications",
        ])
        let end = String(decoding: frames(stream.body).last?.1 ?? [], as: UTF8.self)
        #expect(end.contains("resource_exhausted"), "\(end)")
        expectLimitHeaders(stream.headers, "Connect streaming")

        let page = try await curl(["--http1.1", base + "/t/" + String(repeating: "a", count: 43)])
        #expect(page.status == 429)
        expectLimitHeaders(page.headers, "page")

        do {
            _ = try await Accounts_V1_AccountsClient(h.client).logIn(Accounts_V1_LogInRequest())
            Issue.record("the limit let a gRPC call through")
        } catch let e as RPCError {
            #expect(e.code == .resourceExhausted)
            let status = try Google_Rpc_Status(serializedBytes: try #require(e.trailers.binary("grpc-status-details-bin")))
            let info = try Google_Rpc_RetryInfo(serializedBytes: try #require(status.details.first).value)
            let wait = Double(info.retryDelay.seconds) + Double(info.retryDelay.nanos) / 1e9
            #expect(wait > 0 && wait <= 2, "RetryInfo holds the wait itself: \(info.retryDelay)")
            #expect(e.trailers["retry-after"] == String(Int(wait.rounded(.up))))
        }

        // The user's limit names itself.
        let u = try await Harness { c in
            c.userRate = 2
            c.userBurst = 1
        }
        defer { Task { await u.stop() } }
        let token = u.keys.token()
        _ = try await ConnectTests.post(u, "/accounts.v1.Accounts/GetMyProfile", "{}", headers: ["authorization: Bearer \(token)"])
        let user = try await ConnectTests.post(u, "/accounts.v1.Accounts/GetMyProfile", "{}", headers: ["authorization: Bearer \(token)"])
        #expect(user.status == 429)
        #expect(user.headers["ratelimit-policy"] == #""user";q=2;w=1"#, "\(user.headers)")
        #expect(user.headers["ratelimit"] == #""user";r=0;t=1"# && user.headers["retry-after"] == "1", "\(user.headers)")
    }
}
