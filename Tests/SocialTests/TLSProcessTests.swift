import ContractTesting
import Contracts
import Foundation
import GRPCContracts
import RPCCore
import RPCTLS
import RPCTransport
import ServiceCluster
import ServiceKitTesting
import Testing

/// TLS between services with the real executables (issue 20): accounts-service and social-service
/// as child processes, each serving mutual TLS (`--tls-cert`, `--tls-key`, `--tls-client-ca`) and
/// social reaching accounts with `PEER_TLS_CA`/`PEER_TLS_CERT`/`PEER_TLS_KEY`; the test calls both
/// as a tool holding a certificate of the cluster CA. Certificates are made at test time.
@Suite("TLS between services: the executables", .serialized)
struct TLSProcessTests {
    static func channel(_ port: Int, _ tls: TLSConfiguration?) -> RPCChannel {
        RPCChannel(configuration: ChannelConfiguration(host: "127.0.0.1", port: port, tls: tls))
    }

    static func signUp(_ accounts: Accounts_V1_AccountsClient, _ prefix: String) async throws -> (name: String, token: String) {
        let name = uniqueName(prefix)
        var r = Accounts_V1_SignUpRequest()
        r.username = name
        r.email = "\(name)@example.com"
        r.password = "correct horse battery staple"
        r.displayName = name
        return (name, try await accounts.signUp(r, options: CallOptions(timeout: .seconds(20))).session.accessToken)
    }

    @Test func socialCallsAccountsOverMutualTLSAndRefusesCallersWithoutACertificate() async throws {
        let certs = try TestCertificates(names: ["accounts", "social", "probe"])
        defer { certs.remove() }
        let dir = TemporaryDirectory("tls-proc")
        defer { dir.remove() }

        let accounts = try ServiceProcess(
            "accounts-service", name: "accounts", dataDir: dir.path + "/accounts",
            environment: ["ACCOUNTS_SCRYPT_N": "1024", "ACCOUNTS_MAILDIR": dir.path + "/mail"],
            arguments: ["--host", "127.0.0.1", "--port", "0", "--data-dir", dir.path + "/accounts"] + certs.serverArguments("accounts", mutual: true))
        defer { accounts.forceStop() }
        let accountsPort = try await accounts.waitUntilListening()
        var peers = certs.peerEnvironment(as: "social")
        peers["ACCOUNTS_ADDR"] = "127.0.0.1:\(accountsPort)"
        peers["TASKS_ADDR"] = "127.0.0.1:\(closedPort())"
        let social = try ServiceProcess(
            "social-service", name: "social", dataDir: dir.path + "/social", environment: peers,
            arguments: ["--host", "127.0.0.1", "--port", "0", "--data-dir", dir.path + "/social"] + certs.serverArguments("social", mutual: true))
        defer { social.forceStop() }
        let socialPort = try await social.waitUntilListening()

        // A tool with a certificate of the cluster CA signs two users up at accounts...
        let tool = try certs.client(as: "probe")
        let toAccounts = Self.channel(accountsPort, tool), toSocial = Self.channel(socialPort, tool)
        let alice = try await Self.signUp(Accounts_V1_AccountsClient(toAccounts.client), "alice")
        let bob = try await Self.signUp(Accounts_V1_AccountsClient(toAccounts.client), "bob")
        // ...and befriends them through social, which verifies alice's token with accounts' keys
        // and finds bob by name at accounts: both peer calls over mutual TLS.
        var add = Social_V1_AddFriendRequest()
        add.user.username = bob.name
        let added = try await Social_V1_SocialClient(toSocial.client).addFriend(add, options: bearer(alice.token))
        #expect(added.friendship.user.username == bob.name)

        // Callers without a certificate of the cluster CA get nowhere.
        let bare = Self.channel(socialPort, try certs.client(as: nil))
        let none = await expectFailure(.unavailable) {
            try await Grpc_Health_V1_HealthClient(bare.client).check(Grpc_Health_V1_HealthCheckRequest())
        }
        #expect(none?.message.contains("requires a client certificate") == true, "\(none?.message ?? "")")
        let plain = RPCChannel(host: "127.0.0.1", port: socialPort)
        await expectFailure(.unavailable) { try await Grpc_Health_V1_HealthClient(plain.client).check(Grpc_Health_V1_HealthCheckRequest()) }

        // health-probe, as scripts/run and compose use it: with a certificate SERVING, without refused.
        let probe = ServiceProcess.builtProduct("health-probe")
        let tlsArgs = ["--ca-file", certs.caFile, "--server-name", "social"]
        let ok = try await Subprocess.capture(
            probe,
            ["--addr", "127.0.0.1:\(socialPort)", "--verbose"] + tlsArgs + [
                "--cert-file", certs.certFile("probe"), "--key-file", certs.keyFile("probe"),
            ],
            input: [])
        #expect(ok.status == 0, "\(String(decoding: ok.stdout + ok.stderr, as: UTF8.self))")
        let refused = try await Subprocess.capture(probe, ["--addr", "127.0.0.1:\(socialPort)", "--verbose"] + tlsArgs, input: [])
        #expect(refused.status == 2 && String(decoding: refused.stdout, as: UTF8.self).contains("client certificate"))

        // Metrics on the same port: a scraper over HTTP/1.1 (ALPN offers it beside h2) needs a
        // certificate of the cluster CA like any caller.
        let curl = ["-s", "--http1.1", "--max-time", "10", "--cacert", certs.caFile, "--resolve", "social:\(socialPort):127.0.0.1"]
        let url = "https://social:\(socialPort)/metrics"
        let scraped = try await Subprocess.capture(
            "/usr/bin/curl", curl + ["--cert", certs.certFile("probe"), "--key", certs.keyFile("probe"), url], input: [])
        #expect(scraped.status == 0 && String(decoding: scraped.stdout, as: UTF8.self).contains("grpc_server_handled_total"))
        let unscraped = try await Subprocess.capture("/usr/bin/curl", curl + [url], input: [])
        #expect(unscraped.status != 0 && !String(decoding: unscraped.stdout, as: UTF8.self).contains("grpc_server"))

        for c in [toAccounts, toSocial, bare, plain] { await c.close() }
        social.signal(SIGTERM)
        accounts.signal(SIGTERM)
        #expect(await social.waitForExit() == 0)
        #expect(await accounts.waitForExit() == 0)
    }

    @Test func aPeerKeyThatDoesNotMatchItsCertificateRefusesTheStart() async throws {
        let certs = try TestCertificates(names: ["social", "tasks"])
        defer { certs.remove() }
        let dir = TemporaryDirectory("tls-proc")
        defer { dir.remove() }
        var env = certs.peerEnvironment(as: "social")
        env["PEER_TLS_KEY"] = certs.keyFile("tasks")
        let social = try ServiceProcess("social-service", name: "social", dataDir: dir.path, environment: env)
        defer { social.forceStop() }
        let status = await social.waitForExit()
        #expect(status != nil && status != 0)
        #expect(social.log.contains("PEER_TLS_KEY") && social.log.contains("does not match"), "\(social.log)")
    }
}
