import Contracts
import Foundation
import RPCCore
import RPCTransport
import Testing

@testable import Gateway

/// curl's raw output bytes (binary frames), on a thread of its own.
func curlBytes(_ args: [String]) async throws -> (status: Int, headers: [String: String], body: [UInt8]) {
    try await withCheckedThrowingContinuation { c in
        let t = Thread {
            c.resume(
                with: Result {
                    let p = Process()
                    p.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
                    let headerFile = FileManager.default.temporaryDirectory.appendingPathComponent("gw-head-\(UUID().uuidString)").path
                    defer { try? FileManager.default.removeItem(atPath: headerFile) }
                    p.arguments = ["-s", "--max-time", "10", "-D", headerFile] + args
                    let pipe = Pipe()
                    p.standardOutput = pipe
                    try p.run()
                    let body = [UInt8](pipe.fileHandleForReading.readDataToEndOfFile())
                    p.waitUntilExit()
                    let (status, headers) = curlHeaders(headerFile)
                    return (status, headers, body)
                })
        }
        t.start()
    }
}

/// The frames of a gRPC-Web / Connect streaming body: (flag, payload).
func frames(_ body: [UInt8]) -> [(UInt8, [UInt8])] {
    var out: [(UInt8, [UInt8])] = []
    var i = 0
    while i + 5 <= body.count {
        let n = Int(body[i + 1]) << 24 | Int(body[i + 2]) << 16 | Int(body[i + 3]) << 8 | Int(body[i + 4])
        guard i + 5 + n <= body.count else { break }
        out.append((body[i], Array(body[(i + 5)..<(i + 5 + n)])))
        i += 5 + n
    }
    return out
}

func writeTemp(_ bytes: [UInt8]) throws -> String {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("gw-req-\(UUID().uuidString)").path
    try Data(bytes).write(to: URL(fileURLWithPath: path))
    return path
}

@Suite struct BrowserCodecTests {
    @Test func grpcWebTextAcceptsConcatenatedPaddedChunks() {
        #expect(GRPCWeb.decodeText(Array("AAAAAAA=".utf8)) == [0, 0, 0, 0, 0])
        // Two padded chunks one after the other, and a line break between them.
        #expect(GRPCWeb.decodeText(Array("AAAAAAA=\r\nAQ==".utf8)) == [0, 0, 0, 0, 0, 1])
        #expect(GRPCWeb.decodeText(Array("AAECAw".utf8)) == [0, 1, 2, 3], "an unpadded last chunk")
        #expect(GRPCWeb.decodeText(Array("-_8".utf8)) == [0xFB, 0xFF], "the URL-safe alphabet too")
        for bad in ["AAAA*AAA", "A===", "AA=A", "A", "====", "not base64!"] {
            #expect(GRPCWeb.decodeText(Array(bad.utf8)) == nil, "\(bad)")
        }
    }

    @Test func grpcWebSingleMessageNamesWhatIsWrong() throws {
        let path = "/accounts.v1.Accounts/LogIn"
        #expect(try GRPCWeb.singleMessage(GRPCWeb.frame([1, 2, 3]), limit: 10, path: path, encoding: nil) == [1, 2, 3])
        func code(_ body: [UInt8], limit: Int = 10, encoding: String? = nil) -> (StatusCode?, String) {
            do {
                _ = try GRPCWeb.singleMessage(body, limit: limit, path: path, encoding: encoding)
                return (nil, "")
            } catch let e as RPCError { return (e.code, e.message) } catch { return (.unknown, "\(error)") }
        }
        #expect(code([0, 0, 0]).0 == .invalidArgument)
        #expect(code([0, 0, 0]).1.contains("truncated"))
        #expect(code([0, 0, 0, 0, 9, 1, 2]).1.contains("truncated"))
        #expect(code(GRPCWeb.frame([UInt8](repeating: 7, count: 11))).0 == .resourceExhausted)
        #expect(code(GRPCWeb.frame([UInt8](repeating: 7, count: 11))).1.contains("limit of 10 bytes"))
        #expect(code(GRPCWeb.frame([1]) + GRPCWeb.frame([2])).0 == .unimplemented)
        #expect(code([]).0 == .unimplemented)
        #expect(code(GRPCWeb.frame([1], flag: 0x80)).0 == .invalidArgument)
        #expect(code(GRPCWeb.frame([1], flag: 1)).1.contains("no grpc-encoding"))
        let gz = Gzip.compress([5, 5, 5])
        #expect(try GRPCWeb.singleMessage(GRPCWeb.frame(gz, flag: 1), limit: 100, path: path, encoding: "gzip") == [5, 5, 5])
        let bomb = Gzip.compress([UInt8](repeating: 0, count: 1000))
        #expect(code(GRPCWeb.frame(bomb, flag: 1), limit: 100, encoding: "gzip").0 == .resourceExhausted, "the limit holds after inflating")
    }

    @Test func grpcWebTrailersAreHeaderLines() {
        var trailers = Metadata()
        trailers.add("x-sent", "2")
        trailers.add("x-raw-bin", binary: [0xFF])
        let f = GRPCWeb.trailersFrame(RPCError(.notFound, "no such\r\nthing 100%"), trailers: trailers)
        let parsed = frames(f)
        #expect(parsed.count == 1)
        #expect(parsed.first?.0 == 0x80)
        let text = String(decoding: parsed.first?.1 ?? [], as: UTF8.self)
        #expect(text == "grpc-status: 5\r\ngrpc-message: no such%0D%0Athing 100%25\r\nx-sent: 2\r\nx-raw-bin: /w\r\n")
    }

    @Test func connectEnvelopesAndTheEndOfStream() throws {
        let path = "/social.v1.Social/SubscribeNotifications"
        #expect(try ConnectEnvelope.single(ConnectEnvelope.frame([1, 2]), limit: 5, path: path, encoding: nil) == [1, 2])
        #expect(throws: RPCError.self) { try ConnectEnvelope.single([0, 0, 0, 0, 5, 1], limit: 10, path: path, encoding: nil) }
        #expect(throws: RPCError.self) { try ConnectEnvelope.single(ConnectEnvelope.frame([1], flags: 2), limit: 10, path: path, encoding: nil) }
        let transcoder = JSONTranscoder(registry: try SchemaRegistry(Gateway.descriptors))
        var trailers = Metadata()
        trailers.add("x-sent", "2")
        trailers.add("x-sent", "3")
        let ok = frames(ConnectEnvelope.endStream(RPCError(.ok, ""), trailers: trailers, transcoder: transcoder))
        #expect(ok.first?.0 == 2)
        #expect(String(decoding: ok.first?.1 ?? [], as: UTF8.self) == #"{"metadata":{"x-sent":["2","3"]}}"#)
        let failed = frames(ConnectEnvelope.endStream(RPCError(.deadlineExceeded, "late"), trailers: Metadata(), transcoder: transcoder))
        #expect(String(decoding: failed.first?.1 ?? [], as: UTF8.self) == #"{"error":{"code":"deadline_exceeded","message":"late"}}"#)
    }

    @Test func connectGetQueries() {
        let q = ConnectQuery(target: "/a.v1.A/M?encoding=json&message=%7B%22a%22%3A%22x+y%22%7D&base64&connect=v1")
        #expect(q["encoding"] == "json")
        #expect(q["message"] == #"{"a":"x y"}"#)
        #expect(q["base64"] == "")
        #expect(q["connect"] == "v1")
        #expect(q["missing"] == nil)
    }

    @Test func corsOriginsAndPreflights() throws {
        #expect(throws: CORSConfigurationError.self) { try CORSPolicy(origins: ["https://a.example/path"]) }
        #expect(throws: CORSConfigurationError.self) { try CORSPolicy(origins: ["a.example"]) }
        let cors = try CORSPolicy(origins: ["https://App.example", " http://127.0.0.1:5173 "], maxAge: 1_000_000)
        #expect(cors.maxAge == CORSPolicy.maxMaxAge)
        #expect(cors.allows("https://app.example"))
        #expect(!cors.allows("https://evil.example"))
        #expect(CORSPolicy().responseHeaders(origin: "https://app.example").isEmpty, "none allowed by default")
        let h = Dictionary(cors.responseHeaders(origin: "https://app.example").map { ($0.name, $0.value) }) { a, _ in a }
        #expect(h["access-control-allow-origin"] == "https://app.example")
        #expect(h["access-control-allow-credentials"] == "true")
        #expect(h["access-control-expose-headers"]?.contains("grpc-status") == true)
        let any = try CORSPolicy(origins: ["*"])
        let a = Dictionary(any.responseHeaders(origin: "https://x.example").map { ($0.name, $0.value) }) { a, _ in a }
        #expect(a["access-control-allow-origin"] == "*")
        #expect(a["access-control-allow-credentials"] == nil, "no wildcard with credentials")

        func preflight(_ origin: String, _ method: String, headers: String = "") -> HTTPResponse {
            cors.preflight(
                HTTPRequest(
                    method: "OPTIONS", target: "/a.v1.A/M",
                    headers: [("origin", origin), ("access-control-request-method", method), ("access-control-request-headers", headers)],
                    body: [], peer: "127.0.0.1:1"), methods: ["POST"])
        }
        let good = preflight("http://127.0.0.1:5173", "POST", headers: "content-type, x-grpc-web, x-custom, x-service-token")
        #expect(good.status == 204)
        let allowed = good.headers.first { $0.name == "access-control-allow-headers" }?.value ?? ""
        #expect(allowed.contains("x-grpc-web") && allowed.contains("x-custom") && allowed.contains("authorization"))
        #expect(!allowed.contains("x-service-token"), "reserved names are never allowed")
        #expect(preflight("https://evil.example", "POST").status == 403)
        #expect(preflight("http://127.0.0.1:5173", "DELETE").status == 403)
    }
}

/// gRPC-Web, Connect streaming, Connect GET and CORS through a gateway in front of fake upstreams.
@Suite(.serialized) struct BrowserGatewayTests {
    static let keysPath = "/accounts.v1.Accounts/GetSigningKeys"
    static let subscribe = "/social.v1.Social/SubscribeNotifications"

    @Test(arguments: [false, true]) func grpcWebUnaryBinaryAndText(http2: Bool) async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        let version = http2 ? "--http2-prior-knowledge" : "--http1.1"
        let url = "http://127.0.0.1:\(h.port)\(Self.keysPath)"
        let request = try writeTemp(GRPCWeb.frame([]))
        let binary = try await curlBytes([
            version, "-X", "POST", "-H", "content-type: application/grpc-web+proto", "--data-binary", "@\(request)", url,
        ])
        #expect(binary.status == 200)
        #expect(binary.headers["content-type"] == "application/grpc-web+proto")
        let parts = frames(binary.body)
        #expect(parts.count == 2)
        #expect(parts.first?.0 == 0)
        let keys = try Accounts_V1_GetSigningKeysResponse(serializedBytes: parts.first?.1 ?? [])
        #expect(keys.keys.count == 1)
        #expect(parts.last?.0 == 0x80)
        let trailerText = String(decoding: parts.last?.1 ?? [], as: UTF8.self)
        #expect(trailerText.hasPrefix("grpc-status: 0\r\n"))

        let text = try await curlBytes([version, "-X", "POST", "-H", "content-type: application/grpc-web-text", "--data", "AAAAAAA=", url])
        #expect(text.headers["content-type"] == "application/grpc-web-text+proto")
        let decoded = GRPCWeb.decodeText(text.body) ?? []
        #expect(frames(decoded).count == 2)
        #expect(frames(decoded).first?.1 == parts.first?.1)
    }

    @Test func grpcWebErrorsBeforeAnyMessageAreTrailersOnly() async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        let url = "http://127.0.0.1:\(h.port)/accounts.v1.Accounts/GetMyProfile"
        // No token for an authenticated method: the policy refuses it as for gRPC.
        let r = try await curlBytes(["--http1.1", "-X", "POST", "-H", "content-type: application/grpc-web-text", "--data", "AAAAAAA=", url])
        #expect(r.status == 200)
        #expect(r.headers["grpc-status"] == "16")
        #expect(r.headers["grpc-message"]?.contains("Bearer") == true)
        #expect(r.body.isEmpty)
        // Bad base64, a truncated frame, a wrong sub-type (to a public method: a missing token is
        // refused first, at the head, as for gRPC).
        let publicURL = "http://127.0.0.1:\(h.port)\(Self.keysPath)"
        let notBase64 = try await curlBytes([
            "--http1.1", "-X", "POST", "-H", "content-type: application/grpc-web-text", "--data-raw", "@@@@", publicURL,
        ])
        #expect(notBase64.headers["grpc-status"] == "3")
        let truncated = try await curlBytes([
            "--http1.1", "-X", "POST", "-H", "content-type: application/grpc-web-text", "--data", "AAAAAAoB", publicURL,
        ])
        #expect(truncated.headers["grpc-status"] == "3")
        #expect(truncated.headers["grpc-message"]?.contains("truncated") == true)
        // +json is served (BrowserCompletenessTests); a sub-type nobody speaks here is 415.
        let thrift = try await curlBytes(["--http1.1", "-X", "POST", "-H", "content-type: application/grpc-web+thrift", "--data", "{}", publicURL])
        #expect(thrift.status == 415)
        #expect(thrift.headers["grpc-status"] == "3")
    }

    @Test(arguments: [false, true]) func grpcWebAndConnectStreams(http2: Bool) async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        let version = http2 ? "--http2-prior-knowledge" : "--http1.1"
        let url = "http://127.0.0.1:\(h.port)\(Self.subscribe)"
        var request = Social_V1_SubscribeNotificationsRequest()
        request.afterNotificationId = "3"  // the fake stops after three notifications
        let body = try writeTemp(GRPCWeb.frame(request.serializedBytes()))
        let auth = "authorization: Bearer \(h.keys.token())"
        let web = try await curlBytes([
            version, "-X", "POST", "-H", "content-type: application/grpc-web", "-H", auth, "--data-binary", "@\(body)", url,
        ])
        #expect(web.status == 200)
        #expect(web.headers["x-stream"] == "live")
        let parts = frames(web.body)
        try #require(parts.count == 5, "started, three notifications, trailers")
        let third = try Social_V1_SubscribeNotificationsResponse(serializedBytes: parts[3].1)
        #expect(third.notification.title == "hello 2")
        let trailers = String(decoding: parts.last?.1 ?? [], as: UTF8.self)
        #expect(parts.last?.0 == 0x80)
        #expect(trailers.contains("grpc-status: 0\r\n") && trailers.contains("x-sent: 3\r\n"))

        let connectBody = try writeTemp(ConnectEnvelope.frame(Array(#"{"afterNotificationId":"2"}"#.utf8)))
        let connect = try await curlBytes([
            version, "-X", "POST", "-H", "content-type: application/connect+json", "-H", auth, "--data-binary", "@\(connectBody)", url,
        ])
        #expect(connect.status == 200)
        let c = frames(connect.body)
        try #require(c.count == 4)
        #expect(String(decoding: c[2].1, as: UTF8.self) == #"{"notification":{"notificationId":"n-1","title":"hello 1"}}"#)
        #expect(c.last?.0 == 2)
        #expect(String(decoding: c.last?.1 ?? [], as: UTF8.self) == #"{"metadata":{"x-sent":["2"]}}"#)

        // The deadline ends an endless stream with the status in the last frame.
        let endless = try writeTemp(ConnectEnvelope.frame(Array("{}".utf8)))
        let timed = try await curlBytes([
            version, "-X", "POST", "-H", "content-type: application/connect+json", "-H", "connect-timeout-ms: 300", "-H", auth,
            "--data-binary", "@\(endless)", url,
        ])
        let end = String(decoding: frames(timed.body).last?.1 ?? [], as: UTF8.self)
        #expect(end.contains(#""code":"deadline_exceeded""#), "\(end)")
    }

    /// A browser that goes away mid-stream cancels the upstream stream (over HTTP/1.1, where only
    /// the closed connection says so).
    @Test func aBrowserThatGoesCancelsTheUpstreamStream() async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        let url = "http://127.0.0.1:\(h.port)\(Self.subscribe)"
        _ = try? await curlBytes([
            "--http1.1", "--max-time", "0.5", "-X", "POST", "-H", "content-type: application/grpc-web-text",
            "-H", "authorization: Bearer \(h.keys.token())", "--data", "AAAAAAA=", url,
        ])
        #expect(try await eventually { h.recorder.notes.contains { $0.hasPrefix("subscription ended") } })
    }

    @Test func connectGetOnlyForMethodsFreeOfSideEffects() async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        let base = "http://127.0.0.1:\(h.port)"
        let get = try await curl(["--http1.1", "\(base)\(Self.keysPath)?encoding=json&message=%7B%7D&connect=v1"])
        #expect(get.status == 200, "\(get.body)")
        #expect(get.body.contains("\"keys\""))
        let proto = try await curl(["--http1.1", "\(base)\(Self.keysPath)?encoding=proto&base64=1&message="])
        #expect(proto.status == 200)
        let login = try await curl(["--http1.1", "\(base)/accounts.v1.Accounts/LogIn?encoding=json&message=%7B%7D"])
        #expect(login.status == 405)
        #expect(login.headers["allow"] == "POST")
        // The protocol: a codec the server does not support is 415 (connect-go: a missing one too).
        let noEncoding = try await curl(["--http1.1", "\(base)\(Self.keysPath)?message=%7B%7D"])
        #expect(noEncoding.status == 415)
        let xml = try await curl(["--http1.1", "\(base)\(Self.keysPath)?encoding=xml&message=%7B%7D"])
        #expect(xml.status == 415 && json(xml.body)["code"] as? String == "unimplemented", "\(xml)")
    }

    @Test func corsThroughTheGateway() async throws {
        let h = try await Harness { c in c.cors = try! CORSPolicy(origins: ["http://app.test"]) }
        defer { Task { await h.stop() } }
        let url = "http://127.0.0.1:\(h.port)\(Self.keysPath)"
        let pre = try await curl([
            "--http1.1", "-X", "OPTIONS", "-H", "origin: http://app.test", "-H", "access-control-request-method: GET", url,
        ])
        #expect(pre.status == 204)
        #expect(pre.headers["access-control-allow-methods"] == "GET, POST, OPTIONS")
        #expect(pre.headers["access-control-allow-origin"] == "http://app.test")
        let refused = try await curl([
            "--http1.1", "-X", "OPTIONS", "-H", "origin: http://evil.test", "-H", "access-control-request-method: POST", url,
        ])
        #expect(refused.status == 403)
        #expect(refused.headers["access-control-allow-origin"] == nil)
        let unknown = try await curl([
            "--http1.1", "-X", "OPTIONS", "-H", "origin: http://app.test", "-H", "access-control-request-method: POST",
            "http://127.0.0.1:\(h.port)/accounts.v1.AccountsInternal/EraseUser",
        ])
        #expect(unknown.status == 404, "internal methods are not routed, so not preflighted either")
        let call = try await curl([
            "--http1.1", "-X", "POST", "-H", "origin: http://app.test", "-H", "content-type: application/grpc-web-text", "--data",
            "AAAAAAA=", url,
        ])
        #expect(call.headers["access-control-allow-origin"] == "http://app.test")
        #expect(call.headers["access-control-expose-headers"]?.contains("grpc-message") == true)
    }
}
