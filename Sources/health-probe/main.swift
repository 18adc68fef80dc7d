import ArgumentParser
import GRPCContracts
import RPCCore
import RPCTLS
import RPCTransport

/// `health-probe --addr 127.0.0.1:9101 [--service NAME] [--ca-file ca.pem [--cert-file c.pem --key-file k.pem]]`:
/// one grpc.health.v1 Check over real gRPC (TLS when given the certificate to trust; with a client
/// certificate for a service that requires one); exit 0 when SERVING. Used by scripts/run to wait
/// for processes and by compose health checks.
@main
struct HealthProbe: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "health-probe",
        abstract: "Exit 0 if a gRPC server reports SERVING.")
    @Option(help: "host:port of the server.") var addr: String
    @Option(help: "Service name to check (empty: the whole server).") var service = ""
    @Option(help: "Seconds to wait for the answer.") var timeout = 2.0
    @Option(help: "Speak TLS, trusting this PEM certificate (a development certificate, say).") var caFile: String?
    @Option(help: "With --ca-file: the name the certificate must be valid for (default: the host of --addr).") var serverName: String?
    @Option(help: "With --ca-file: a client certificate (PEM) for a server that requires one (mutual TLS).") var certFile: String?
    @Option(help: "The private key (PEM) of --cert-file.") var keyFile: String?
    @Flag(help: "Print the status.") var verbose = false

    func run() async throws {
        guard let (host, port) = ChannelConfiguration.address(addr) else {
            throw ValidationError("--addr must be host:port or [v6]:port, got '\(addr)'")
        }
        if serverName != nil && caFile == nil {
            throw ValidationError("--server-name needs --ca-file (without it the probe speaks plain h2c)")
        }
        if (certFile == nil) != (keyFile == nil) { throw ValidationError("--cert-file and --key-file go together") }
        if certFile != nil && caFile == nil {
            throw ValidationError("--cert-file needs --ca-file (without it the probe speaks plain h2c)")
        }
        var configuration = ChannelConfiguration(host: host, port: port)
        if let caFile {
            configuration.tls = try TLSConfiguration.client(
                alpn: ["h2"], trustRootsPEMFile: caFile, serverName: serverName ?? host, certificateChainPEMFile: certFile,
                privateKeyPEMFile: keyFile)
        }
        let channel = RPCChannel(configuration: configuration)
        defer { Task { await channel.close() } }
        var request = Grpc_Health_V1_HealthCheckRequest()
        request.service = service
        do {
            let response = try await Grpc_Health_V1_HealthClient(channel.client)
                .check(request, options: CallOptions(timeout: .milliseconds(Int(timeout * 1000))))
            if verbose { print(response.status.protoName ?? "\(response.status.rawValue)") }
            if response.status != .serving { throw ExitCode(1) }
        } catch let e as RPCError {
            if verbose { print("\(e.code.name): \(e.message)") }
            throw ExitCode(2)
        }
    }
}
