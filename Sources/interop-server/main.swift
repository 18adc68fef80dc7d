import ArgumentParser
import GRPCContracts
import Interop
import Logging
import RPCServices
import RPCTransport

/// `interop-server --host 127.0.0.1 --port P`: grpc.testing.TestService (and health, reflection)
/// for gRPC's interop tests and for the benchmark.
@main
struct InteropServer: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "interop-server",
                                                    abstract: "gRPC interop test server (grpc.testing.TestService).")
    @Option(help: "Address to bind.") var host = "127.0.0.1"
    @Option(help: "Port to listen on (0 picks a free one).") var port = 50051
    @Option(help: "Event-loop threads (default: one per core).") var threads: Int?

    func run() async throws {
        LoggingSystem.bootstrap { StreamLogHandler.standardError(label: $0) }
        let logger = Logger(label: "interop-server")
        var config = ServerConfiguration(host: host, port: port)
        if let threads { config.threads = threads }
        let (health, services) = StandardServices.make(for: [TestServiceImpl()], descriptors: GRPCContractsDescriptors.descriptorSet)
        let server = RPCServer(configuration: config, services: services, logger: logger)
        let bound = try await server.start()
        logger.info("interop-server listening on \(host):\(bound)")
        await server.runUntilSignalled(logger: logger) { health.markAllNotServing() }
    }
}
