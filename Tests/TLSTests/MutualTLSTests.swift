import Foundation
import NIOCore
import Testing

@testable import RPCTLS

/// Certificates of two development clusters, made at test time in a temporary directory: the
/// cluster's CA, a server and a client it signed; another CA with a server and a client of its own.
struct TestCluster {
    let directory: String
    let ca: (certFile: String, keyFile: String)
    let server: (certFile: String, keyFile: String)
    let client: (certFile: String, keyFile: String)
    let otherCA: (certFile: String, keyFile: String)
    let otherServer: (certFile: String, keyFile: String)
    let otherClient: (certFile: String, keyFile: String)

    static func make() throws -> TestCluster {
        let directory = NSTemporaryDirectory() + "rpctls-mtls-\(getpid())-\(UInt64.random(in: 0...UInt64.max))"
        let ca = try DevelopmentCertificate.generateAuthority(commonName: "test cluster CA", directory: directory)
        let other = try DevelopmentCertificate.generateAuthority(commonName: "other CA", directory: directory, fileName: "other-ca")
        func leaf(_ name: String, _ issuer: (certFile: String, keyFile: String)) throws -> (certFile: String, keyFile: String) {
            try DevelopmentCertificate.generate(commonName: name, directory: directory, issuer: issuer, fileName: name)
        }
        return TestCluster(
            directory: directory, ca: ca, server: try leaf("accounts", ca), client: try leaf("social", ca), otherCA: other,
            otherServer: try leaf("rogue-server", other), otherClient: try leaf("rogue-client", other))
    }

    func remove() { try? FileManager.default.removeItem(atPath: directory) }

    func serverConfiguration(
        _ identity: (certFile: String, keyFile: String)? = nil, clientCA: String? = nil
    ) throws -> TLSConfiguration {
        let identity = identity ?? server
        return try .server(
            certificateChainPEMFile: identity.certFile, privateKeyPEMFile: identity.keyFile, alpn: ["h2"],
            clientCertificateAuthorityPEMFile: clientCA)
    }

    func clientConfiguration(_ identity: (certFile: String, keyFile: String)?, serverName: String = "accounts") throws -> TLSConfiguration {
        try .client(
            alpn: ["h2"], trustRootsPEMFile: ca.certFile, serverName: serverName, certificateChainPEMFile: identity?.certFile,
            privateKeyPEMFile: identity?.keyFile)
    }
}

/// Certificates signed by a development CA, and mutual TLS: a server that requires client
/// certificates from its CA (`SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT`).
@Suite struct MutualTLSTests {
    @Test func aCertificateSignedByTheClusterCAVerifiesByNameAndNotByAnother() async throws {
        let cluster = try TestCluster.make()
        defer { cluster.remove() }
        let server = try await TestServer.start(try cluster.serverConfiguration())
        // The CA is the only trust root; the name checked is the service's.
        let good = try await TestClient.connect(
            port: server.port, try cluster.clientConfiguration(nil), payload: ByteBuffer(string: "hello"), expected: 5)
        #expect(try await withTimeout { try await good.handshake.get() } == "h2")
        #expect(try await withTimeout { try await good.received.get() } == ByteBuffer(string: "hello"))
        try await good.channel.close()
        // 127.0.0.1 and localhost are in every development certificate; another name is not.
        let wrongName = try await TestClient.connect(port: server.port, try cluster.clientConfiguration(nil, serverName: "tasks"))
        let error = await #expect(throws: TLSError.self) { try await withTimeout { try await wrongName.handshake.get() } }
        #expect(error?.kind == .certificateVerificationFailed && error?.message.contains("tasks") == true, "\(String(describing: error))")
        await server.stop()
    }

    @Test func aServerWithACertificateFromAnotherCAIsRefused() async throws {
        let cluster = try TestCluster.make()
        defer { cluster.remove() }
        let server = try await TestServer.start(try cluster.serverConfiguration(cluster.otherServer))
        let client = try await TestClient.connect(port: server.port, try cluster.clientConfiguration(cluster.client, serverName: "localhost"))
        let error = await #expect(throws: TLSError.self) { try await withTimeout { try await client.handshake.get() } }
        #expect(error?.kind == .certificateVerificationFailed)
        #expect(error?.message.contains("unable to get local issuer certificate") == true, "\(String(describing: error))")
        await server.stop()
    }

    @Test func mutualTLSAdmitsOnlyClientsWithACertificateFromItsCA() async throws {
        let cluster = try TestCluster.make()
        defer { cluster.remove() }
        let configuration = try cluster.serverConfiguration(clientCA: cluster.ca.certFile)
        #expect(configuration.requiresClientCertificate)
        let server = try await TestServer.start(configuration)

        // A proper certificate: the handshake completes and data flows both ways.
        let good = try await TestClient.connect(
            port: server.port, try cluster.clientConfiguration(cluster.client), payload: ByteBuffer(string: "mtls"), expected: 4)
        #expect(try await withTimeout { try await good.received.get() } == ByteBuffer(string: "mtls"))
        try await good.channel.close()

        // No certificate. Under TLS 1.3 the client's handshake ends before the server checks it:
        // the refusal is the server's alert, read as the first record, named plainly.
        let none = try await TestClient.connect(
            port: server.port, try cluster.clientConfiguration(nil), payload: ByteBuffer(string: "x"), expected: 1)
        let refused = await #expect(throws: TLSError.self) { try await withTimeout { try await none.received.get() } }
        #expect(refused?.kind == .certificateRejectedByPeer, "\(String(describing: refused))")
        #expect(refused?.message.contains("requires a client certificate") == true, "\(String(describing: refused))")
        await server.log.wait {
            if case .error(let e) = $0 { e.kind == .handshakeFailed && e.message.contains("presented no certificate") } else { false }
        }

        // A certificate from another CA.
        let rogue = try await TestClient.connect(
            port: server.port, try cluster.clientConfiguration(cluster.otherClient), payload: ByteBuffer(string: "x"), expected: 1)
        let rejected = await #expect(throws: TLSError.self) { try await withTimeout { try await rogue.received.get() } }
        #expect(rejected?.kind == .certificateRejectedByPeer, "\(String(describing: rejected))")
        #expect(rejected?.message.contains("does not trust the CA") == true, "\(String(describing: rejected))")
        await server.log.wait {
            if case .error(let e) = $0 { e.kind == .certificateVerificationFailed && e.message.contains("client certificate") } else { false }
        }
        await server.stop()
    }

    @Test func filesThatCannotBeUsedAreNamed() throws {
        let cluster = try TestCluster.make()
        defer { cluster.remove() }
        let missing = cluster.directory + "/missing.pem"
        #expect {
            _ = try cluster.serverConfiguration(clientCA: missing)
        } throws: { ($0 as? TLSError)?.path == missing }
        #expect {
            _ = try TLSConfiguration.client(
                alpn: ["h2"], trustRootsPEMFile: cluster.ca.certFile, serverName: nil, certificateChainPEMFile: cluster.client.certFile,
                privateKeyPEMFile: cluster.server.keyFile)
        } throws: { error in
            let e = error as? TLSError
            return e?.path == cluster.server.keyFile && e?.message.contains("does not match") == true
        }
        #expect(throws: TLSError.self) {
            try TLSConfiguration.client(alpn: ["h2"], serverName: nil, certificateChainPEMFile: cluster.client.certFile)
        }
    }
}
