import Logging
import RPCCore
import RPCProtobuf
import RPCServices
import RPCTLS
import RPCTransport

/// Starts one service process the way every service starts: the gRPC server with the access
/// policy interceptor, health and reflection, background loops (outbox delivery), then waits for
/// SIGTERM/SIGINT and shuts down gracefully. Executables are config plus one call to `run`.
public enum ServiceHost {
    public static func bootstrapLogging(level: String) {
        LoggingSystem.bootstrap { label in
            var h = StreamLogHandler.standardError(label: label)
            h.logLevel = Logger.Level(rawValue: level) ?? .info
            return h
        }
    }

    public static func run(settings: ServiceSettings, services: [any RPCService], descriptors: ProtoDescriptorSet,
                           keys: any SigningKeySource, logger: Logger,
                           background: [@Sendable () async -> Void] = [],
                           configure: (inout ServerConfiguration) -> Void = { _ in }) async throws {
        var config = ServerConfiguration(host: settings.host, port: settings.port)
        if let cert = settings.tlsCert, let key = settings.tlsKey {
            config.tls = try TLSConfiguration.server(certificateChainPEMFile: cert, privateKeyPEMFile: key, alpn: ["h2"])
        }
        config.interceptors = [AuthInterceptor(keys: keys, serviceToken: settings.serviceToken)]
        configure(&config)
        let (health, all) = StandardServices.make(for: services, descriptors: descriptors)
        let server = RPCServer(configuration: config, services: all, logger: logger)
        ShutdownSignals.install()  // before "listening": a SIGTERM from then on exits gracefully
        let port = try await server.start()
        logger.info("\(settings.name) listening on \(settings.host):\(port) (data: \(settings.dataDir))")
        await withTaskGroup(of: Void.self) { group in
            for job in background { group.addTask { await job() } }
            await server.runUntilSignalled(logger: logger) { health.markAllNotServing() }
            group.cancelAll()
        }
    }

    /// A client for another service of the cluster, carrying the service credential.
    public static func peerClient(_ peer: String, settings: ServiceSettings) -> RPCClient {
        let (host, port) = settings.peerAddress(peer)
        let channel = RPCChannel(configuration: ChannelConfiguration(host: host, port: port))
        return RPCClient(transport: CredentialedTransport(base: channel, serviceToken: settings.serviceToken))
    }
}

/// Adds the service credential to every call.
public struct CredentialedTransport: ClientTransport {
    let base: any ClientTransport
    let serviceToken: String
    public init(base: any ClientTransport, serviceToken: String) {
        self.base = base
        self.serviceToken = serviceToken
    }
    public func startCall(_ method: MethodDescriptor, options: CallOptions) async throws -> any RawClientCall {
        var options = options
        options.metadata.set(AuthInterceptor.serviceTokenHeader, serviceToken)
        return try await base.startCall(method, options: options)
    }
}
