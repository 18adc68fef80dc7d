import Contracts
import Foundation
import RPCCore
import RPCTransport
import Security
import ServiceKitTesting
import Synchronization
import Testing

@testable import ServiceKit

/// Defects 5 and 7 of issue 11: the gateway's credential is not the service credential, and a
/// token key accounts removed stops verifying within the refresh interval.
@Suite struct AuthTests {
    /// `authorization: Bearer <token>`: the scheme in any case, spaces around the token dropped;
    /// anything else is no token at all.
    @Test func bearerTokensAreReadByteWise() {
        func bearer(_ value: String?) -> String? {
            var m = Metadata()
            if let value { m.add("authorization", value) }
            return AuthInterceptor.bearer(m)
        }
        #expect(bearer("Bearer abc.def") == "abc.def")
        #expect(bearer("bearer abc") == "abc")
        #expect(bearer("BEARER   abc  ") == "abc")
        #expect(bearer("Bearer é.ü") == "é.ü")
        for bad in [nil, "", "Bearer", "Bearer ", "Bearer    ", "Basic abc", "Bearerabc", "Bearer\tabc", "Bearex abc", "Béarer abc"] {
            #expect(bearer(bad) == nil, "\(String(describing: bad))")
        }
    }

    /// A service with one method of each marking; it answers who it took the caller for.
    struct Probe: RPCService {
        var serviceName: String { "probe.v1.Probe" }
        static let open = MethodDescriptor(service: "probe.v1.Probe", method: "Open", kind: .unary, visibility: .publicAnonymous)
        static let user = MethodDescriptor(service: "probe.v1.Probe", method: "User", kind: .unary, visibility: .publicAuthenticated)
        static let inside = MethodDescriptor(service: "probe.v1.Probe", method: "Inside", kind: .unary, visibility: .internal)
        var methods: [ServerMethod] {
            [Self.open, Self.user, Self.inside].map { m in
                ServerMethod(
                    m,
                    .unary(RawMessage.self, RawMessage.self) { _, ctx in
                        let who =
                            "user=\(ctx.identity?.userID ?? "-") service=\(ctx.isServiceCall) gateway=\(ctx.isGatewayCall) address=\(ctx.clientAddress)"
                        return RawMessage(bytes: Array(who.utf8))
                    })
            }
        }
    }

    func call(_ client: RPCClient, _ m: MethodDescriptor, _ metadata: [(String, String)] = []) async throws -> String {
        let r = try await client.unary(
            m, RawMessage(), as: RawMessage.self, options: CallOptions(timeout: .seconds(10), metadata: Metadata(metadata)))
        return String(decoding: r.message.bytes, as: UTF8.self)
    }

    @Test func theGatewayCredentialOpensUserMethodsOnlyAndVouchesForTheAddress() async throws {
        let tokens = TestTokens()
        let server = try await TestServer(services: [Probe()], keys: tokens.source)
        defer { Task { await server.stop() } }
        let auth = [("authorization", "Bearer \(tokens.token(user: "u-1"))")]
        let forwarded = [("x-forwarded-for", "198.51.100.7")]

        // The gateway relaying a user: public and authenticated methods; the address it saw.
        #expect(try await call(server.gateway, Probe.user, auth + forwarded).contains("user=u-1 service=false gateway=true address=198.51.100.7"))
        #expect(try await call(server.gateway, Probe.open, forwarded).contains("gateway=true"))
        // ...but never an internal method, with or without a user token.
        await expectFailure(.permissionDenied) { try await call(server.gateway, Probe.inside, auth) }
        await expectFailure(.permissionDenied) { try await call(server.gateway, Probe.inside) }
        // Another service: internal methods open; its x-forwarded-for is not believed.
        #expect(try await call(server.service, Probe.inside, forwarded).contains("service=true gateway=false address=127.0.0.1"))
        // A client directly: no internal method, its own x-forwarded-for ignored.
        await expectFailure(.permissionDenied) { try await call(server.anonymous, Probe.inside) }
        #expect(try await call(server.anonymous, Probe.user, auth + forwarded).contains("address=127.0.0.1"))
        // Forged credentials of either kind are refused outright.
        await expectFailure(.permissionDenied) { try await call(server.anonymous, Probe.open, [("x-gateway-token", "guess")]) }
        await expectFailure(.permissionDenied) { try await call(server.anonymous, Probe.open, [("x-service-token", "guess")]) }
        await expectFailure(.unauthenticated) { try await call(server.gateway, Probe.user) }
    }

    /// accounts' GetSigningKeys, publishing a key set the test changes.
    final class KeyServer: RPCService, Sendable {
        let published = Mutex<[String: Ed25519PublicKey]>([:])
        let fetches = Atomic<Int>(0)
        var serviceName: String { Accounts_V1_AccountsMethods.serviceName }
        var methods: [ServerMethod] {
            [
                ServerMethod(
                    Accounts_V1_AccountsMethods.getSigningKeys,
                    .unary(Accounts_V1_GetSigningKeysRequest.self, Accounts_V1_GetSigningKeysResponse.self) { [self] _, _ in
                        fetches.add(1, ordering: .relaxed)
                        var r = Accounts_V1_GetSigningKeysResponse()
                        r.keys = published.withLock { $0 }.map { id, key in
                            var k = Accounts_V1_SigningKey()
                            (k.keyId, k.algorithm, k.publicKey) = (id, .ed25519, key.rawRepresentation)
                            return k
                        }
                        var d = Google_Protobuf_Duration()
                        d.seconds = 1
                        r.cacheFor = d
                        return r
                    })
            ]
        }
    }

    /// Both ways of verifying: the shared cache, and the verification remembered for one
    /// connection (the gateway's relay), which the change of keys must end too.
    @Test(arguments: [false, true]) func aRemovedKeyStopsVerifyingWithinTheRefreshInterval(remembered: Bool) async throws {
        let tokens = TestTokens(keyID: "old")
        let accounts = KeyServer()
        accounts.published.withLock { $0 = ["old": tokens.pair.publicKey] }
        let accountsServer = try await TestServer(services: [accounts], keys: tokens.source)
        let channel = RPCChannel(host: "127.0.0.1", port: accountsServer.port)
        let interceptor = AuthInterceptor(
            keys: RemoteSigningKeys(client: channel.client, minRefreshInterval: .milliseconds(100)),
            serviceToken: "", keyRefreshInterval: .seconds(1))
        let token = tokens.token(user: "u-9")
        #expect(try await interceptor.verify(token).userID == "u-9")
        // Verified from the cache over and over: no fetch per call.
        for _ in 0..<100 { #expect(try interceptor.verifyImmediately(token)?.userID == "u-9") }
        let bytes = Array(token.utf8)
        let slot = Mutex<AuthInterceptor.RememberedToken?>(nil)
        @Sendable func rememberedVerify() throws -> CallerIdentity? {
            try slot.withLock { s in try bytes.withUnsafeBytes { try interceptor.verifyImmediately($0, remembering: &s) } }
        }
        for _ in 0..<3 { #expect(try rememberedVerify()?.userID == "u-9") }
        #expect(slot.withLock { $0 != nil })
        let fetchesBefore = accounts.fetches.load(ordering: .relaxed)
        #expect(fetchesBefore == 1)

        // accounts stops publishing the key (it leaked, say).
        accounts.published.withLock { $0 = [:] }
        let refused = await eventually(timeout: .seconds(10)) {
            if remembered {
                // Nil: the key is unknown now (the relay then asks `verify`, which refuses).
                do { return try rememberedVerify() == nil } catch { return false }
            }
            do { _ = try await interceptor.verify(token); return false } catch let e as RPCError { return e.code == .unauthenticated } catch {
                return false
            }
        }
        #expect(refused, "a removed key still verified after the refresh interval")
        await channel.close()
        await accountsServer.stop()
    }
}
