import Foundation
import NIOCore
import NIOPosix
import RPCCore
import RPCTLS
import Testing

@testable import RPCTransport

@Suite struct TLSTransportTests {
    @Test func grpcOverTLSWithALPNh2() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("tls-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let (cert, key) = try DevelopmentCertificate.generate(commonName: "localhost", directory: dir)
        var config = ServerConfiguration(host: "127.0.0.1", port: 0)
        config.threads = 1
        config.tls = try TLSConfiguration.server(certificateChainPEMFile: cert, privateKeyPEMFile: key, alpn: ["h2"])
        let server = RPCServer(configuration: config, services: [EchoService()])
        let port = try await server.start()

        // Our client, verifying the development certificate.
        let clientTLS = try TLSConfiguration.client(alpn: ["h2"], trustRootsPEMFile: cert, verifyPeer: true, serverName: "localhost")
        let channel = RPCChannel(configuration: ChannelConfiguration(host: "127.0.0.1", port: port, tls: clientTLS))
        let r = try await channel.client.unary(EchoService.unaryMethod, Bytes("over tls"), as: Bytes.self)
        #expect(r.message.text == "over tls")
        let total = try await channel.client.serverStreaming(EchoService.serverStreamMethod, Bytes("16:65536"), as: Bytes.self) { s in
            var n = 0
            for try await m in s.messages { n += m.data.count }
            return n
        }
        #expect(total == 16 * 65536)
        await channel.close()

        // grpcio, a client we did not write.
        let (status, output) = try runPython(
            """
            import grpc
            creds = grpc.ssl_channel_credentials(root_certificates=open('\(cert)','rb').read())
            ch = grpc.secure_channel('127.0.0.1:\(port)', creds, options=[('grpc.ssl_target_name_override','localhost')])
            assert ch.unary_unary('/test.Echo/Unary')(b'py tls', timeout=5) == b'py tls'
            print('OK')
            """)
        #expect(status == 0 && output.contains("OK"), "\(output)")
        await server.shutdownGracefully()
    }

    @Test func failedHandshakeIsUnavailableWithTheTLSReason() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("tls-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let (cert, key) = try DevelopmentCertificate.generate(commonName: "localhost", directory: dir)
        var config = ServerConfiguration(host: "127.0.0.1", port: 0)
        config.threads = 1
        config.tls = try TLSConfiguration.server(certificateChainPEMFile: cert, privateKeyPEMFile: key, alpn: ["h2"])
        let server = RPCServer(configuration: config, services: [EchoService()])
        let port = try await server.start()
        for _ in 0..<20 {
            // Trusts nothing: the handshake must fail, and every call must say why.
            let clientTLS = try TLSConfiguration.client(alpn: ["h2"], verifyPeer: true, serverName: "localhost")
            let channel = RPCChannel(configuration: ChannelConfiguration(host: "127.0.0.1", port: port, tls: clientTLS))
            do {
                _ = try await channel.client.unary(EchoService.unaryMethod, Bytes("x"), as: Bytes.self)
                Issue.record("expected failure")
            } catch let e as RPCError {
                #expect(e.code == .unavailable)
                #expect(e.message.contains("certificate"), "\(e.message)")
            }
            await channel.close()
        }
        await server.shutdownGracefully()
    }
    /// A TLS server that completes the handshake but never speaks HTTP/2 (no ALPN, no SETTINGS):
    /// the connect fails after the connect timeout, saying so, instead of holding its calls.
    @Test func aTLSServerThatNeverSpeaksFailsTheConnect() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("tls-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let (cert, key) = try DevelopmentCertificate.generate(commonName: "localhost", directory: dir)
        let serverTLS = try TLSConfiguration.server(certificateChainPEMFile: cert, privateKeyPEMFile: key, alpn: [])
        let listener = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(OpenSSLHandler(configuration: serverTLS)) }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        let clientTLS = try TLSConfiguration.client(alpn: ["h2"], trustRootsPEMFile: cert, serverName: "localhost")
        var configuration = ChannelConfiguration(host: "127.0.0.1", port: listener.localAddress!.port!, tls: clientTLS)
        configuration.connectTimeout = .milliseconds(300)
        let channel = RPCChannel(configuration: configuration)
        let started = ContinuousClock.now
        do {
            _ = try await channel.client.unary(EchoService.unaryMethod, Bytes("x"), as: Bytes.self, options: CallOptions(timeout: .seconds(20)))
            Issue.record("expected failure")
        } catch let e as RPCError {
            #expect(e.code == .unavailable)
            #expect(e.message.contains("sent nothing within"), "\(e.message)")
        }
        #expect(ContinuousClock.now - started < .seconds(10))
        await channel.close()
        try await listener.close()
    }
}
