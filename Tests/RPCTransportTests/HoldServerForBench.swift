import Foundation
import NIOCore
import RPCCore
import Testing

@testable import RPCTransport

/// Keeps an echo server up for manual load runs: `ECHO_BENCH_PORT=P ECHO_BENCH_SECONDS=S swift test
/// -c release --filter holdEchoServer`. Skipped unless both are set.
@Test(.enabled(if: ProcessInfo.processInfo.environment["ECHO_BENCH_PORT"] != nil))
func holdEchoServer() async throws {
    let env = ProcessInfo.processInfo.environment
    var config = ServerConfiguration(host: "127.0.0.1", port: Int(env["ECHO_BENCH_PORT"]!)!)
    config.threads = Int(env["ECHO_BENCH_THREADS"] ?? "") ?? System.coreCount
    let server = RPCServer(configuration: config, services: [EchoService()])
    _ = try await server.start()
    try await Task.sleep(for: .seconds(Int(env["ECHO_BENCH_SECONDS"] ?? "30") ?? 30))
    await server.shutdownGracefully()
}
