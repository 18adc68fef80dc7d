import ArgumentParser
import Foundation
import Gateway
import Logging
import Observability
import RPCTransport
import ServiceKit

/// The gateway process: configuration and lifecycle only; everything else is in `Gateway`.
@main
struct GatewayCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "gateway",
        abstract: "Public API gateway: gRPC and Connect JSON on one port, relayed to the services.")

    @OptionGroup var options: ServiceOptions

    func run() async throws {
        let environment = ProcessInfo.processInfo.environment
        let settings = try ServiceSettings(name: "gateway", options: options, environment: environment, credentials: .gateway)
        // The options are the services' (shared), but the gateway has no health-only listener:
        // its probes use its own port, which kubelet can reach (no client certificate needed).
        if let port = settings.healthPort {
            throw ValidationError(
                "the gateway has no health-only port (--health-port or GATEWAY_HEALTH_PORT is \(port)): probe its own port with the health service name 'gateway'"
            )
        }
        ServiceHost.bootstrapLogging(settings)
        // The spans still buffered are written however the gateway stops (a failed start throws).
        defer { ProcessTracing.shutdown() }
        let logger = Logger(label: "gateway")
        var config = try GatewayConfiguration.from(settings: settings)
        config.tracer = ProcessTracing.tracer
        let gateway = try Gateway(configuration: config, logger: logger)
        ShutdownSignals.install()  // before "listening": a SIGTERM from then on exits gracefully
        try await gateway.start()
        await gateway.runUntilSignalled()
    }
}
