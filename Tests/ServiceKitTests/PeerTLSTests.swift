import ArgumentParser
import Foundation
import GRPCContracts
import RPCCore
import RPCTLS
import RPCTransport
import ServiceKitTesting
import Testing

@testable import ServiceKit

/// TLS between services (issue 20): peers reached through `PeerClients(settings:)` with
/// `PEER_TLS_*`, servers from `ServiceHost.serverConfiguration(settings:)` with `--tls-cert`,
/// `--tls-key` and `--tls-client-ca`; real gRPC over 127.0.0.1, certificates made at test time.
@Suite struct PeerTLSTests {
    /// The settings of process `name` from `environment` and `arguments` (development credentials).
    static func settings(_ name: String, _ environment: [String: String] = [:], _ arguments: [String] = []) throws -> ServiceSettings {
        try ServiceSettings(
            name: name, options: try ServiceOptions.parse(arguments), environment: environment.merging(["ALLOW_DEV_CREDENTIALS": "1"]) { a, _ in a })
    }

    /// An in-process "accounts" on 127.0.0.1 serving health, with the server TLS its settings say.
    static func accounts(_ certs: TestCertificates, as identity: String = "accounts", mutual: Bool) async throws -> TestServer {
        let settings = try settings("accounts", [:], certs.serverArguments(identity, mutual: mutual))
        let tls = try ServiceHost.serverConfiguration(settings: settings).tls
        #expect(tls?.requiresClientCertificate == mutual)
        return try await TestServer(services: [], keys: TestTokens().source) { $0.tls = tls }
    }

    /// One health Check of "accounts" through the peer clients of a "social" with `environment`.
    static func checkAccounts(port: Int, _ environment: [String: String]) async throws -> Grpc_Health_V1_HealthCheckResponse.ServingStatus {
        var env = environment
        env["ACCOUNTS_ADDR"] = "127.0.0.1:\(port)"
        let peers = PeerClients(settings: try settings("social", env))
        defer { Task { await peers.close() } }
        return try await Grpc_Health_V1_HealthClient(peers.client("accounts"))
            .check(Grpc_Health_V1_HealthCheckRequest(), options: CallOptions(timeout: .seconds(10))).status
    }

    @Test func aPeerCallOverTLSWithTheClusterCAWorks() async throws {
        let certs = try TestCertificates()
        defer { certs.remove() }
        let accounts = try await Self.accounts(certs, mutual: false)
        #expect(try await Self.checkAccounts(port: accounts.port, certs.peerEnvironment(as: nil)) == .serving)
        // With a client certificate too (a server that does not ask for one ignores it).
        #expect(try await Self.checkAccounts(port: accounts.port, certs.peerEnvironment(as: "social")) == .serving)
        // A plain h2c client is refused by a TLS port.
        await expectFailure(.unavailable) { try await Self.checkAccounts(port: accounts.port, [:]) }
        await accounts.stop()
    }

    @Test func theNameCheckedIsThePeersHostUnlessOverridden() async throws {
        let certs = try TestCertificates()
        defer { certs.remove() }
        let accounts = try await Self.accounts(certs, mutual: false)
        var env = certs.peerEnvironment(as: "social")
        // 127.0.0.1 is in the certificate; "accounts" too; "tasks" is not.
        env["ACCOUNTS_TLS_SERVER_NAME"] = "accounts"
        #expect(try await Self.checkAccounts(port: accounts.port, env) == .serving)
        env["ACCOUNTS_TLS_SERVER_NAME"] = "tasks"
        let failure = await expectFailure(.unavailable) { try await Self.checkAccounts(port: accounts.port, env) }
        #expect(failure?.message.contains("hostname mismatch") == true, "\(failure?.message ?? "")")
        await accounts.stop()
    }

    @Test func aServerWithACertificateFromAnotherCAIsRefused() async throws {
        let certs = try TestCertificates()
        defer { certs.remove() }
        let rogue = try await Self.accounts(certs, as: "rogue", mutual: false)
        let failure = await expectFailure(.unavailable) { try await Self.checkAccounts(port: rogue.port, certs.peerEnvironment(as: "social")) }
        #expect(failure?.message.contains("certificate verification failed") == true, "\(failure?.message ?? "")")
        #expect(failure?.message.contains("unable to get local issuer certificate") == true, "\(failure?.message ?? "")")
        await rogue.stop()
    }

    @Test func mutualTLSRefusesClientsWithoutACertificateFromTheClusterCA() async throws {
        let certs = try TestCertificates()
        defer { certs.remove() }
        let accounts = try await Self.accounts(certs, mutual: true)
        // A proper certificate.
        #expect(try await Self.checkAccounts(port: accounts.port, certs.peerEnvironment(as: "social")) == .serving)
        // No certificate: UNAVAILABLE, saying so.
        // A refused handshake is a failed connect (the channel's backoff applies), not a
        // connection that dies under its first call.
        let none = await expectFailure(.unavailable) { try await Self.checkAccounts(port: accounts.port, certs.peerEnvironment(as: nil)) }
        #expect(none?.message.contains("requires a client certificate") == true, "\(none?.message ?? "")")
        #expect(none?.message.contains("cannot connect to") == true, "\(none?.message ?? "")")
        // A certificate from another CA.
        var rogue = certs.peerEnvironment(as: "rogue")
        rogue["PEER_TLS_CA"] = certs.caFile
        let other = await expectFailure(.unavailable) { try await Self.checkAccounts(port: accounts.port, rogue) }
        #expect(other?.message.contains("does not trust the CA") == true, "\(other?.message ?? "")")
        // Plain h2c.
        await expectFailure(.unavailable) { try await Self.checkAccounts(port: accounts.port, [:]) }
        // And the refused connections left the server serving.
        #expect(try await Self.checkAccounts(port: accounts.port, certs.peerEnvironment(as: "tasks")) == .serving)
        await accounts.stop()
    }

    @Test func tlsSettingsAreCheckedAtStartNamingTheVariable() throws {
        let certs = try TestCertificates()
        defer { certs.remove() }
        let missing = certs.directory + "/nope.pem"
        func refuses(_ env: [String: String], args arguments: [String] = [], _ text: String, sourceLocation: SourceLocation = #_sourceLocation) {
            #expect(sourceLocation: sourceLocation) {
                let s = try Self.settings("social", env, arguments)
                _ = try s.serverTLS(alpn: ["h2"])
            } throws: { error in
                let said = "\(error)"
                if !said.contains(text) { Issue.record("'\(said)' does not say '\(text)'", sourceLocation: sourceLocation) }
                return true
            }
        }
        refuses(["PEER_TLS_CA": missing], "PEER_TLS_CA='\(missing)' cannot be read: No such file or directory")
        refuses(["PEER_TLS_CA": certs.directory], "PEER_TLS_CA='\(certs.directory)' is not a file")
        refuses(
            ["PEER_TLS_CA": certs.keyFile("social")], "PEER_TLS_CA='\(certs.keyFile("social"))': TLS configuration error: cannot load trust roots")
        refuses(["PEER_TLS_CA": certs.caFile, "PEER_TLS_CERT": certs.certFile("social")], "PEER_TLS_CERT and PEER_TLS_KEY go together")
        refuses(
            ["PEER_TLS_CERT": certs.certFile("social"), "PEER_TLS_KEY": certs.keyFile("social")],
            "PEER_TLS_CERT and PEER_TLS_KEY need PEER_TLS_CA")
        refuses(
            ["PEER_TLS_CA": certs.caFile, "PEER_TLS_CERT": certs.certFile("social"), "PEER_TLS_KEY": missing],
            "PEER_TLS_KEY='\(missing)' cannot be read")
        refuses(
            ["PEER_TLS_CA": certs.caFile, "PEER_TLS_CERT": certs.certFile("social"), "PEER_TLS_KEY": certs.keyFile("tasks")],
            "PEER_TLS_KEY='\(certs.keyFile("tasks"))': TLS configuration error: private key \(certs.keyFile("tasks")) does not match certificate")
        refuses(
            ["PEER_TLS_CA": certs.caFile, "PEER_TLS_CERT": certs.caFile, "PEER_TLS_KEY": certs.keyFile("social")],
            "does not match")
        refuses(["ACCOUNTS_TLS_SERVER_NAME": "accounts"], "ACCOUNTS_TLS_SERVER_NAME is set but PEER_TLS_CA is not")
        // The server's own files.
        refuses([:], args: ["--tls-client-ca", certs.caFile], "--tls-client-ca/SOCIAL_TLS_CLIENT_CA needs --tls-cert and --tls-key")
        refuses(
            ["SOCIAL_TLS_CLIENT_CA": missing], args: certs.serverArguments("social", mutual: false),
            "--tls-client-ca/SOCIAL_TLS_CLIENT_CA='\(missing)' cannot be read")
        refuses(
            [:], args: certs.serverArguments("social", mutual: false) + ["--tls-client-ca", certs.keyFile("social")],
            "--tls-client-ca/SOCIAL_TLS_CLIENT_CA='\(certs.keyFile("social"))': TLS configuration error: cannot load client certificate authorities")
        refuses(
            [:], args: ["--tls-cert", certs.certFile("social"), "--tls-key", certs.keyFile("tasks")],
            "--tls-key/SOCIAL_TLS_KEY='\(certs.keyFile("tasks"))': TLS configuration error: private key")

        // Good settings: one client context for every peer, checking each peer's own name.
        let good = try Self.settings(
            "social",
            certs.peerEnvironment(as: "social").merging(["ACCOUNTS_ADDR": "accounts.internal:9101", "TASKS_TLS_SERVER_NAME": "tasks.internal"]) {
                a, _ in a
            })
        let accounts = good.peerChannelConfiguration("accounts"), tasks = good.peerChannelConfiguration("tasks")
        #expect(accounts.tls != nil && accounts.tls === tasks.tls && accounts.tls?.presentsCertificate == true)
        #expect(accounts.host == "accounts.internal" && accounts.tlsServerName == nil)
        #expect(tasks.host == "127.0.0.1" && tasks.tlsServerName == "tasks.internal")
        #expect(try Self.settings("social").peerChannelConfiguration("accounts").tls == nil)
    }
}
