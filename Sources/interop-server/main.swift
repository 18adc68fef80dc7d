import ArgumentParser
import GRPCContracts
import Interop
import Logging
import RPCServices
import RPCTLS
import RPCTransport

/// `interop-server --host 127.0.0.1 --port P`: grpc.testing.TestService (and health, reflection)
/// for gRPC's interop tests and for the benchmark.
@main
struct InteropServer: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "interop-server",
        abstract: "gRPC interop test server (grpc.testing.TestService).")
    @Option(help: "Address to bind.") var host = "127.0.0.1"
    @Option(help: "Port to listen on (0 picks a free one).") var port = 50051
    @Option(help: "Event-loop threads (default: one per core).") var threads: Int?
    @Option(help: "PEM certificate chain: serve TLS (ALPN h2) instead of h2c.") var tlsCert: String?
    @Option(help: "PEM private key for --tls-cert.") var tlsKey: String?

    func run() async throws {
        LoggingSystem.bootstrap { StreamLogHandler.standardError(label: $0) }
        let logger = Logger(label: "interop-server")
        var config = ServerConfiguration(host: host, port: port)
        if let threads { config.threads = threads }
        if let tlsCert {
            guard let tlsKey else { throw ValidationError("--tls-cert needs --tls-key") }
            config.tls = try TLSConfiguration.server(certificateChainPEMFile: tlsCert, privateKeyPEMFile: tlsKey, alpn: ["h2"])
        }
        let (health, services) = StandardServices.make(for: [TestServiceImpl()], descriptors: GRPCContractsDescriptors.descriptorSet)
        let server = RPCServer(configuration: config, services: services, logger: logger)
        ShutdownSignals.install()
        let bound = try await server.start()
        logger.info("interop-server listening on \(host):\(bound)")
        await server.runUntilSignalled(logger: logger) { health.markAllNotServing() }
    }
}
