import Foundation
import RPCCore
import Synchronization
import Testing

@testable import RPCTransport

struct EchoHTTP: HTTPHandler {
    func handle(_ request: HTTPRequest) async -> HTTPResponse {
        HTTPResponse(
            status: 200, headers: [("content-type", "application/json"), ("x-method", request.method)],
            body: Array("{\"path\":\"\(request.path)\",\"len\":\(request.body.count),\"ct\":\"\(request.header("content-type") ?? "")\"}".utf8))
    }
}

/// Holds its answer until the test opens the gate: a request in progress during a shutdown.
struct GatedHTTP: HTTPHandler {
    final class Gate: Sendable {
        let entered = Mutex(false)
        let open = Mutex(false)
    }
    let gate = Gate()

    func handle(_ request: HTTPRequest) async -> HTTPResponse {
        gate.entered.withLock { $0 = true }
        while !gate.open.withLock({ $0 }) { try? await Task.sleep(for: .milliseconds(5)) }
        return HTTPResponse(status: 200, headers: [("content-type", "text/plain")], body: Array("slow answer".utf8))
    }
}

/// Polls `condition` for up to 30 s (a busy machine starts curl slowly).
func waitFor(_ condition: () -> Bool) async throws -> Bool {
    let end = ContinuousClock.now + .seconds(30)
    while !condition() && ContinuousClock.now < end { try await Task.sleep(for: .milliseconds(10)) }
    return condition()
}

/// Starts curl (silent, 30 s at most) on `args`; its output comes from the pipe.
func startCurl(_ args: [String]) throws -> (Process, Pipe) {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
    p.arguments = ["-s", "--max-time", "30"] + args
    let pipe = Pipe()
    p.standardOutput = pipe
    try p.run()
    return (p, pipe)
}

/// What curl printed for `args`, once it has exited.
func curlOutput(_ curl: (Process, Pipe)) -> String {
    let out = String(decoding: curl.1.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    curl.0.waitUntilExit()
    return out
}

func curl(_ args: [String]) throws -> String { curlOutput(try startCurl(args)) }

@Suite struct HTTPFallbackTests {
    @Test func gracefulShutdownAnswersHTTP1RequestsInProgress() async throws {
        var config = ServerConfiguration(host: "127.0.0.1", port: 0)
        config.threads = 1
        let handler = GatedHTTP()
        config.httpHandler = handler
        config.acceptHTTP1 = true
        let server = RPCServer(configuration: config, services: [EchoService()])
        let port = try await server.start()
        let slow: (Process, Pipe)
        do { slow = try startCurl(["--http1.1", "-i", "http://127.0.0.1:\(port)/slow"]) } catch {
            await server.shutdownGracefully()
            throw error
        }
        #expect(try await waitFor { handler.gate.entered.withLock { $0 } })
        // Shut down while the request is in the handler; answer it once the drain has begun.
        let shutdown = Task { await server.shutdownGracefully() }
        #expect(try await waitFor { server.shared.registry.draining.load(ordering: .acquiring) })
        handler.gate.open.withLock { $0 = true }
        await shutdown.value
        let out = curlOutput(slow)
        #expect(out.hasPrefix("HTTP/1.1 200"), "\(out)")
        #expect(out.lowercased().contains("connection: close"), "\(out)")
        #expect(out.hasSuffix("slow answer"))
    }

    @Test func nonGRPCRequestsReachTheHTTPHandlerOverHTTP2() async throws {
        var config = ServerConfiguration(host: "127.0.0.1", port: 0)
        config.threads = 1
        config.httpHandler = EchoHTTP()
        let server = RPCServer(configuration: config, services: [EchoService()])
        let port = try await server.start()
        defer { Task { await server.shutdownGracefully() } }
        let out = try curl([
            "--http2-prior-knowledge", "-H", "content-type: application/json", "--data", "{\"a\":1}",
            "http://127.0.0.1:\(port)/pkg.Svc/Method",
        ])
        #expect(out == "{\"path\":\"/pkg.Svc/Method\",\"len\":7,\"ct\":\"application/json\"}")
        // gRPC still works on the same server.
        let channel = RPCChannel(host: "127.0.0.1", port: port)
        let r = try await channel.client.unary(EchoService.unaryMethod, Bytes("still grpc"), as: Bytes.self)
        #expect(r.message.text == "still grpc")
        await channel.close()
    }

    @Test func http1AndHTTP2AndGRPCOnOnePort() async throws {
        var config = ServerConfiguration(host: "127.0.0.1", port: 0)
        config.threads = 1
        config.httpHandler = EchoHTTP()
        config.acceptHTTP1 = true
        let server = RPCServer(configuration: config, services: [EchoService()])
        let port = try await server.start()
        defer { Task { await server.shutdownGracefully() } }
        let url = "http://127.0.0.1:\(port)/pkg.Svc/Method"
        let h1 = try curl(["--http1.1", "-H", "content-type: application/json", "--data", "{}", url, url])
        #expect(h1 == String(repeating: "{\"path\":\"/pkg.Svc/Method\",\"len\":2,\"ct\":\"application/json\"}", count: 2))
        // Expect: 100-continue gets its go-ahead (curl would otherwise wait its 10 s timeout).
        let expecting = try curl([
            "--http1.1", "-i", "--expect100-timeout", "10", "-H", "Expect: 100-continue",
            "-H", "content-type: application/json", "--data", "{\"k\":1}", url,
        ])
        #expect(expecting.hasPrefix("HTTP/1.1 100 Continue"), "\(expecting)")
        #expect(expecting.hasSuffix("{\"path\":\"/pkg.Svc/Method\",\"len\":7,\"ct\":\"application/json\"}"))
        let h2 = try curl(["--http2-prior-knowledge", "-H", "content-type: application/json", "--data", "{}", url])
        #expect(h2 == "{\"path\":\"/pkg.Svc/Method\",\"len\":2,\"ct\":\"application/json\"}")
        let channel = RPCChannel(host: "127.0.0.1", port: port)
        let r = try await channel.client.unary(EchoService.unaryMethod, Bytes("grpc too"), as: Bytes.self)
        #expect(r.message.text == "grpc too")
        await channel.close()
    }
}
