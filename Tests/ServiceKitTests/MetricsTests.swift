import Foundation
import Observability
import RPCCore
import RPCTransport
import ServiceKitTesting
import Synchronization
import Testing

@testable import ServiceKit

/// Issue 19: every call a service ends is counted by method and code and timed, whatever ended
/// it, and `GET /metrics` on the service's own port shows it in the Prometheus text format.
@Suite(.serialized) struct MetricsTests {
    /// A service of its own (its labels are used by no other test): one method answers, one
    /// fails, one waits until cancelled.
    struct Meter: RPCService {
        var serviceName: String { "metrics.v1.Meter" }
        static let ok = MethodDescriptor(service: "metrics.v1.Meter", method: "Ok", kind: .unary, visibility: .publicAnonymous)
        static let fail = MethodDescriptor(service: "metrics.v1.Meter", method: "Fail", kind: .unary, visibility: .publicAnonymous)
        static let wait = MethodDescriptor(service: "metrics.v1.Meter", method: "Wait", kind: .unary, visibility: .publicAnonymous)
        static let user = MethodDescriptor(service: "metrics.v1.Meter", method: "User", kind: .unary, visibility: .publicAuthenticated)
        var methods: [ServerMethod] {
            [
                ServerMethod(Self.ok, .unary(RawMessage.self, RawMessage.self) { m, _ in RawMessage(bytes: m.bytes + m.bytes) }),
                ServerMethod(Self.fail, .unary(RawMessage.self, RawMessage.self) { _, _ in throw RPCError(.notFound, "nothing here") }),
                ServerMethod(
                    Self.wait,
                    .unary(RawMessage.self, RawMessage.self) { _, _ in
                        try await Task.sleep(for: .seconds(60))
                        return RawMessage()
                    }),
                ServerMethod(Self.user, .unary(RawMessage.self, RawMessage.self) { m, _ in m }),
            ]
        }
    }

    static func labels(_ method: String, code: String? = nil) -> [(String, String)] {
        [("grpc_service", "metrics.v1.Meter"), ("grpc_method", method)] + (code.map { [("grpc_code", $0)] } ?? [])
    }

    /// GET over HTTP/1.1 on a plain socket, as Prometheus scrapes: the status line and the body.
    static func scrape(port: Int, method: String = "GET", path: String = "/metrics") throws -> (status: Int, headers: String, body: String) {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = UInt16(port).bigEndian
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        let rc = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        try #require(rc == 0)
        let request = "\(method) \(path) HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n"
        _ = request.withCString { write(fd, $0, strlen($0)) }
        var data = [UInt8]()
        var buf = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = read(fd, &buf, buf.count)
            if n <= 0 { break }
            data += buf[0..<n]
        }
        let text = String(decoding: data, as: UTF8.self)
        let parts = text.components(separatedBy: "\r\n\r\n")
        let head = parts[0]
        let status = Int(head.split(separator: " ")[1]) ?? 0
        var body = parts.dropFirst().joined(separator: "\r\n\r\n")
        if head.lowercased().contains("transfer-encoding: chunked") { body = Self.unchunk(body) }
        return (status, head, body)
    }

    static func unchunk(_ s: String) -> String {
        var out = "", rest = Substring(s)
        while let eol = rest.range(of: "\r\n"), let size = Int(rest[..<eol.lowerBound], radix: 16), size > 0 {
            let start = eol.upperBound
            let bytes = rest[start...].utf8.prefix(size)
            out += String(decoding: bytes, as: UTF8.self)
            rest = rest[rest.utf8.index(start, offsetBy: size)...].dropFirst(2)
        }
        return out
    }

    @Test func callsAreCountedByMethodAndCodeAndServedAtSlashMetrics() async throws {
        let tokens = TestTokens()
        let server = try await TestServer(services: [Meter()], keys: tokens.source)
        defer { Task { await server.stop() } }
        func value(_ name: String, _ labels: [(String, String)]) throws -> Double {
            ProcessMetrics.sample(name, labels: labels, in: try Self.scrape(port: server.port).body) ?? 0
        }
        let okBefore = try value("grpc_server_handled_total", Self.labels("Ok", code: "OK"))
        let notFoundBefore = try value("grpc_server_handled_total", Self.labels("Fail", code: "NOT_FOUND"))
        let cancelledBefore = try value("grpc_server_handled_total", Self.labels("Wait", code: "CANCELLED"))
        let deadlineBefore = try value("grpc_server_handled_total", Self.labels("Wait", code: "DEADLINE_EXCEEDED"))
        let unauthenticatedBefore = try value("grpc_server_handled_total", Self.labels("User", code: "UNAUTHENTICATED"))
        let unknownBefore = try value(
            "grpc_server_handled_total", [("grpc_service", "unknown"), ("grpc_method", "unknown"), ("grpc_code", "UNIMPLEMENTED")])
        let bytesBefore = try value("grpc_server_sent_bytes_total", Self.labels("Ok"))

        let client = server.anonymous
        for _ in 0..<3 {
            let r = try await client.unary(Meter.ok, RawMessage(bytes: [1, 2, 3]), as: RawMessage.self, options: CallOptions(timeout: .seconds(10)))
            #expect(r.message.bytes == [1, 2, 3, 1, 2, 3])
        }
        await expectFailure(.notFound) {
            _ = try await client.unary(Meter.fail, RawMessage(), as: RawMessage.self, options: CallOptions(timeout: .seconds(10)))
        }
        // Refused by the policy before the handler (no token), and by the router (no such method).
        await expectFailure(.unauthenticated) {
            _ = try await client.unary(Meter.user, RawMessage(), as: RawMessage.self, options: CallOptions(timeout: .seconds(10)))
        }
        let missing = MethodDescriptor(service: "metrics.v1.Meter", method: "Missing", kind: .unary, visibility: .publicAnonymous)
        await expectFailure(.unimplemented) {
            _ = try await client.unary(missing, RawMessage(), as: RawMessage.self, options: CallOptions(timeout: .seconds(10)))
        }
        // Ended by the deadline, and by the client going away.
        await expectFailure(.deadlineExceeded) {
            _ = try await client.unary(Meter.wait, RawMessage(), as: RawMessage.self, options: CallOptions(timeout: .milliseconds(50)))
        }
        let waiting = Task { try await client.unary(Meter.wait, RawMessage(), as: RawMessage.self, options: CallOptions(timeout: .seconds(30))) }
        #expect(try await eventually { try value("grpc_server_calls_in_flight", []) >= 1 })
        waiting.cancel()
        _ = try? await waiting.value

        // The call whose deadline passed ends as DEADLINE_EXCEEDED when the server's timer fires
        // first, as CANCELLED when the client's RST_STREAM arrives first: two calls in all.
        func waitEnded() throws -> Double {
            try value("grpc_server_handled_total", Self.labels("Wait", code: "CANCELLED"))
                + value("grpc_server_handled_total", Self.labels("Wait", code: "DEADLINE_EXCEEDED"))
        }
        #expect(try await eventually { try waitEnded() == cancelledBefore + deadlineBefore + 2 })
        #expect(try value("grpc_server_handled_total", Self.labels("Wait", code: "CANCELLED")) >= cancelledBefore + 1)
        #expect(try value("grpc_server_handled_total", Self.labels("Ok", code: "OK")) == okBefore + 3)
        #expect(try value("grpc_server_handled_total", Self.labels("Fail", code: "NOT_FOUND")) == notFoundBefore + 1)
        #expect(try value("grpc_server_handled_total", Self.labels("User", code: "UNAUTHENTICATED")) == unauthenticatedBefore + 1)
        #expect(
            try value("grpc_server_handled_total", [("grpc_service", "unknown"), ("grpc_method", "unknown"), ("grpc_code", "UNIMPLEMENTED")])
                == unknownBefore + 1)
        #expect(try value("grpc_server_sent_bytes_total", Self.labels("Ok")) == bytesBefore + 18)

        // The latency histogram of the method, in seconds, with its count and sum.
        let text = try Self.scrape(port: server.port).body
        #expect(text.contains("# TYPE grpc_server_handling_seconds histogram"))
        let count = ProcessMetrics.sample("grpc_server_handling_seconds_count", labels: Self.labels("Ok"), in: text) ?? 0
        #expect(count >= 3)
        #expect(text.contains(#"grpc_server_handling_seconds_bucket{grpc_service="metrics.v1.Meter",grpc_method="Ok",le="+Inf"}"#))
        #expect(try value("grpc_server_connections", []) >= 1)
        // Label values name only routed methods: the missing method's path appears nowhere.
        #expect(!text.contains("Missing"))
    }

    @Test func theMetricsPathIsTheOnlyPlainHTTPRoute() async throws {
        let server = try await TestServer(services: [Meter()], keys: TestTokens().source)
        defer { Task { await server.stop() } }
        let ok = try Self.scrape(port: server.port)
        #expect(ok.status == 200)
        #expect(ok.headers.lowercased().contains("content-type: text/plain; version=0.0.4"))
        let head = try Self.scrape(port: server.port, method: "HEAD")
        #expect(head.status == 200 && head.body.isEmpty)
        let post = try Self.scrape(port: server.port, method: "POST")
        #expect(post.status == 405)
        #expect(post.headers.lowercased().contains("allow: get, head"))
        #expect(try Self.scrape(port: server.port, path: "/").status == 404)
        #expect(try Self.scrape(port: server.port, path: "/metrics/x").status == 404)
        // gRPC on the same port is unaffected.
        let r = try await server.anonymous.unary(Meter.ok, RawMessage(bytes: [7]), as: RawMessage.self, options: CallOptions(timeout: .seconds(10)))
        #expect(r.message.bytes == [7, 7])
    }
}
