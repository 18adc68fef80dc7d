import Foundation
import RPCCore
import RPCTransport
import Synchronization
import Testing

/// Streams three parts (`/three`), or writes until the client goes (`/endless`), recording how
/// the body ended.
struct StreamingHTTP: HTTPHandler {
    final class Record: Sendable {
        let started = Mutex(0)
        let cancelled = Mutex(0)
        let writeFailed = Mutex(0)
    }
    let record = Record()

    func handle(_ request: HTTPRequest) async -> HTTPResponse {
        let record = self.record
        if request.path == "/three" {
            return HTTPResponse(status: 200, headers: [("content-type", "text/plain"), ("x-kind", "stream")]) { writer in
                for part in ["one,", "two,", "three"] {
                    try await writer.write(Array(part.utf8))
                    try await Task.sleep(for: .milliseconds(20))
                }
            }
        }
        return HTTPResponse(status: 200, headers: [("content-type", "text/plain")]) { writer in
            record.started.withLock { $0 += 1 }
            do {
                while true {
                    try await writer.write(Array("tick\n".utf8))
                    try await Task.sleep(for: .milliseconds(20))
                }
            } catch is CancellationError {
                record.cancelled.withLock { $0 += 1 }
            } catch {
                // The writer failed first (the client went between two ticks).
                record.writeFailed.withLock { $0 += 1 }
            }
        }
    }
}

@Suite(.serialized) struct StreamedHTTPTests {
    func server(_ handler: StreamingHTTP) async throws -> (RPCServer, Int) {
        var config = ServerConfiguration(host: "127.0.0.1", port: 0)
        config.threads = 1
        config.httpHandler = handler
        config.acceptHTTP1 = true
        let server = RPCServer(configuration: config, services: [EchoService()])
        return (server, try await server.start())
    }

    /// A streamed body arrives whole over HTTP/1.1 (chunked; the connection is reused for the next
    /// request) and HTTP/2, and HTTP/1.0 gets it close-delimited.
    @Test func aStreamedBodyArrivesOverEveryHTTPVersion() async throws {
        let handler = StreamingHTTP()
        let (server, port) = try await server(handler)
        defer { Task { await server.shutdownGracefully() } }
        let url = "http://127.0.0.1:\(port)/three"
        let h1 = try curl(["--http1.1", "-i", url, url])
        #expect(h1.lowercased().contains("transfer-encoding: chunked"), "\(h1)")
        #expect(!h1.lowercased().contains("content-length"), "\(h1)")
        #expect(h1.components(separatedBy: "one,two,three").count == 3, "two whole bodies: \(h1)")
        let h10 = try curl(["--http1.0", "-i", url])
        #expect(h10.hasSuffix("one,two,three"), "\(h10)")
        #expect(h10.lowercased().contains("connection: close"), "\(h10)")
        let h2 = try curl(["--http2-prior-knowledge", "-i", url])
        #expect(h2.hasPrefix("HTTP/2 200"), "\(h2)")
        #expect(h2.contains("x-kind: stream"), "\(h2)")
        #expect(h2.hasSuffix("one,two,three"), "\(h2)")
    }

    /// A graceful shutdown ends streamed bodies at once (their handlers are cancelled and write
    /// their last frame) instead of holding the drain for the grace period and being cut off.
    @Test func aGracefulShutdownEndsStreamedBodiesCleanly() async throws {
        for version in ["--http1.1", "--http2-prior-knowledge"] {
            let handler = StreamingHTTP()
            var config = ServerConfiguration(host: "127.0.0.1", port: 0)
            config.threads = 1
            config.httpHandler = handler
            config.acceptHTTP1 = true
            config.shutdownGracePeriod = .seconds(60)
            let server = RPCServer(configuration: config, services: [EchoService()])
            let port = try await server.start()
            let client = try startCurl([version, "http://127.0.0.1:\(port)/endless"])
            #expect(try await waitFor { handler.record.started.withLock { $0 } == 1 })
            await server.shutdownGracefully()
            let out = curlOutput(client)
            #expect(client.0.terminationStatus == 0, "\(version): the body was cut off, not ended (curl \(client.0.terminationStatus))")
            #expect(out.hasPrefix("tick\n"))
            #expect(handler.record.cancelled.withLock { $0 } + handler.record.writeFailed.withLock { $0 } == 1)
        }
    }

    /// A client that goes away mid-stream cancels the body (its task), over both protocols: a
    /// handler's upstream call ends with the browser tab.
    @Test func aClientThatGoesCancelsTheStreamedBody() async throws {
        for version in ["--http1.1", "--http2-prior-knowledge"] {
            let handler = StreamingHTTP()
            let (server, port) = try await server(handler)
            let client = try startCurl([version, "--max-time", "1", "http://127.0.0.1:\(port)/endless"])
            let out = curlOutput(client)
            #expect(out.hasPrefix("tick\n"), "\(version): \(out.prefix(40))")
            #expect(
                try await waitFor {
                    handler.record.cancelled.withLock { $0 } + handler.record.writeFailed.withLock { $0 } == 1
                }, "\(version): the body never learned that the client went")
            #expect(handler.record.started.withLock { $0 } == 1)
            await server.shutdownGracefully()
        }
    }
}
