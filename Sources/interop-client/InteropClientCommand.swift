import ArgumentParser
import GRPCContracts
import Interop
import RPCCore
import RPCTLS
import RPCTransport

#if canImport(Glibc)
import Glibc
#endif

/// `interop-client --host H --port P --test_case NAME[,NAME...]|all [--use_tls --ca_file F
/// --server_host_override NAME]`: gRPC's interop client cases (the `Interop` library's
/// `InteropClient`) against any `grpc.testing.TestService` server. Prints `PASS name (N ms)` /
/// `FAIL name: reason` per case and `interop-swift: N passed, N failed`; exits 1 if any failed.
@main
struct InteropClientCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "interop-client",
        abstract: "gRPC interop test client (grpc.testing.TestService cases) over our transport.")

    @Option(name: [.customLong("host"), .customLong("server_host")], help: "Server host.")
    var host = "127.0.0.1"
    @Option(name: [.customLong("port"), .customLong("server_port")], help: "Server port.")
    var port: Int?
    @Option(name: .customLong("test_case"), help: "all, or case names separated by commas (--list shows them).")
    var testCase = "all"
    @Flag(name: .customLong("use_tls"), help: "Speak TLS (ALPN h2); --use_tls=true/false is accepted too.")
    var useTLS = false
    @Option(name: .customLong("ca_file"), help: "PEM trust roots for --use_tls (default: the system store).")
    var caFile: String?
    @Option(name: .customLong("server_host_override"), help: "Name checked against the server certificate, sent as SNI and :authority.")
    var serverHostOverride: String?
    @Flag(
        name: .customLong("no_compression_probe"),
        help: "Skip the INVALID_ARGUMENT feature probe of client_compressed_* (for servers that cannot see a message's compressed flag, like grpcio)."
    )
    var noCompressionProbe = false
    @Option(help: "Seconds to wait for the server to answer before the first case.")
    var wait: Double = 10
    @Flag(help: "Print the case names and exit.")
    var list = false

    /// Interop harnesses pass booleans as `--use_tls=true`: turned into the flag (or dropped) here.
    static func main() async {
        let arguments = CommandLine.arguments.dropFirst().compactMap { argument -> String? in
            guard argument.hasPrefix("--use_tls=") else { return argument }
            switch argument.dropFirst("--use_tls=".count).lowercased() {
            case "true", "1", "yes": return "--use_tls"
            case "false", "0", "no": return nil
            default: return argument
            }
        }
        do {
            var command = try parseAsRoot(Array(arguments))
            if var asyncCommand = command as? any AsyncParsableCommand {
                try await asyncCommand.run()
            } else {
                try command.run()
            }
        } catch {
            exit(withError: error)
        }
    }

    func validate() throws {
        if list { return }
        guard port != nil else { throw ValidationError("--port is required") }
        if !useTLS && (caFile != nil) { throw ValidationError("--ca_file needs --use_tls") }
        _ = try cases()
    }

    func cases() throws -> [InteropTestCase] {
        if testCase == "all" { return InteropTestCase.allCases }
        return try testCase.split(separator: ",").map { $0.trimmingCharacters(in: " ") }.filter { !$0.isEmpty }.map { name in
            guard let c = InteropTestCase(rawValue: name) else {
                throw ValidationError("unknown test case \(name); --list shows them")
            }
            return c
        }
    }

    func run() async throws {
        if list {
            for c in InteropTestCase.allCases { print(c.name) }
            return
        }
        let cases = try cases()
        let port = port!
        var configuration = ChannelConfiguration(host: host, port: port, authority: serverHostOverride.map { "\($0):\(port)" })
        if useTLS {
            configuration.tls = try TLSConfiguration.client(
                alpn: ["h2"], trustRootsPEMFile: caFile, verifyPeer: true, serverName: serverHostOverride ?? host)
        }
        let channel = RPCChannel(configuration: configuration)
        let client = InteropClient(client: channel.client, options: .init(compressionProbe: !noCompressionProbe))

        var passed = 0
        var failed = 0
        if let problem = await waitForServer(channel.client) {
            print("FAIL connect: no answer from \(host):\(port) within \(wait) s: \(problem)")
            failed = cases.count
        } else {
            let results = await client.run(cases) {
                print($0.line); flushOutput()
            }
            passed = results.filter(\.passed).count
            failed = results.count - passed
        }
        await channel.close()
        print("interop-swift: \(passed) passed, \(failed) failed")
        flushOutput()
        if failed > 0 { throw ExitCode(1) }
    }

    /// EmptyCall until one succeeds (the server may still be starting); the last error otherwise.
    /// Only success counts: a failed connection can surface as other codes than UNAVAILABLE.
    func waitForServer(_ client: RPCClient) async -> String? {
        let test = Grpc_Testing_TestServiceClient(client)
        let clock = ContinuousClock()
        let deadline = clock.now + .milliseconds(Int(wait * 1000))
        var lastError = "no attempt"
        repeat {
            do {
                _ = try await test.emptyCall(Grpc_Testing_Empty(), options: CallOptions(timeout: .seconds(2)))
                return nil
            } catch {
                lastError = "\(error)"
            }
            try? await Task.sleep(for: .milliseconds(100))
        } while clock.now < deadline
        return lastError
    }
}

private func flushOutput() {
    fflush(nil)  // every stream: lines reach a pipe as each case ends
}

extension Substring {
    fileprivate func trimmingCharacters(in set: Character) -> String {
        var s = self
        while s.first == set { s.removeFirst() }
        while s.last == set { s.removeLast() }
        return String(s)
    }
}
