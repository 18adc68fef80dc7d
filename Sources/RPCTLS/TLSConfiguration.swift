import COpenSSL
import Synchronization

/// An immutable OpenSSL `SSL_CTX` configured for one role (server or client): certificates, trust,
/// protocol versions (TLS 1.2 minimum, TLS 1.3 allowed) and ALPN.
///
/// Build one per listener or per upstream at startup and share it with every connection: creating
/// an `SSL_CTX` loads files and parses keys, while `SSL_new` from a finished context is cheap and
/// thread-safe. The context is never mutated after the factory returns, which is what makes sharing
/// it across event loops sound (hence `@unchecked Sendable`). Each `OpenSSLHandler` keeps a strong
/// reference to its configuration, so the context and the ALPN list its callback reads outlive
/// every `SSL*` made from them.
public final class TLSConfiguration: @unchecked Sendable {
    /// Which side of the handshake connections made from this configuration play.
    public enum Role: Sendable, Hashable {
        case server
        case client
    }

    public let role: Role
    /// ALPN protocol names, in preference order (server) or offer order (client).
    public let alpn: [String]
    /// The name a client sends as SNI and checks the server certificate against (DNS name or IP).
    public let serverName: String?
    /// Whether a client verifies the server's certificate chain and name.
    public let verifyPeer: Bool

    /// Owned `SSL_CTX*`; freed in `deinit`.
    let context: OpaquePointer
    /// Wire-format ALPN list read by the server's selection callback (`copenssl_alpn_select_cb`).
    private let alpnList: UnsafeMutablePointer<copenssl_alpn_list>?
    private let alpnBytes: UnsafeMutableBufferPointer<UInt8>?
    /// `SSL*` handles made from this context and not yet freed (leak checks in tests).
    let liveSessions = Atomic<Int>(0)

    private init(
        role: Role, alpn: [String], serverName: String?, verifyPeer: Bool, context: OpaquePointer,
        alpnList: UnsafeMutablePointer<copenssl_alpn_list>?, alpnBytes: UnsafeMutableBufferPointer<UInt8>?
    ) {
        self.role = role
        self.alpn = alpn
        self.serverName = serverName
        self.verifyPeer = verifyPeer
        self.context = context
        self.alpnList = alpnList
        self.alpnBytes = alpnBytes
    }

    deinit {
        SSL_CTX_free(context)
        alpnList?.deallocate()
        alpnBytes?.deallocate()
    }

    /// A server configuration: a PEM certificate chain (leaf first) and its PEM private key, and the
    /// ALPN protocols this server speaks in preference order.
    ///
    /// The server picks the first protocol of *its* list that the client offers, so a gateway can
    /// list `["h2", "http/1.1"]` and get h2 from every client that can do it. A client that sends no
    /// ALPN at all is accepted (the negotiated protocol is then `nil`); a client that offers only
    /// protocols this server does not speak gets a `no_application_protocol` alert.
    public static func server(
        certificateChainPEMFile: String, privateKeyPEMFile: String, alpn: [String]
    ) throws -> TLSConfiguration {
        let wire = try encodeALPN(alpn)
        let ctx = try makeContext(method: TLS_server_method(), server: true)
        var owned = true
        defer { if owned { SSL_CTX_free(ctx) } }

        guard SSL_CTX_use_certificate_chain_file(ctx, certificateChainPEMFile) == 1 else {
            throw TLSError.configuration("cannot load certificate chain from \(certificateChainPEMFile)")
        }
        guard SSL_CTX_use_PrivateKey_file(ctx, privateKeyPEMFile, SSL_FILETYPE_PEM) == 1 else {
            throw TLSError.configuration("cannot load private key from \(privateKeyPEMFile)")
        }
        guard SSL_CTX_check_private_key(ctx) == 1 else {
            throw TLSError.configuration(
                "private key \(privateKeyPEMFile) does not match certificate \(certificateChainPEMFile)")
        }

        var list: UnsafeMutablePointer<copenssl_alpn_list>? = nil
        var bytes: UnsafeMutableBufferPointer<UInt8>? = nil
        if !wire.isEmpty {
            let buffer = UnsafeMutableBufferPointer<UInt8>.allocate(capacity: wire.count)
            _ = buffer.initialize(from: wire)
            let l = UnsafeMutablePointer<copenssl_alpn_list>.allocate(capacity: 1)
            l.initialize(to: copenssl_alpn_list(protocols: UnsafePointer(buffer.baseAddress), length: UInt32(wire.count)))
            copenssl_ctx_set_alpn_select(ctx, l)
            list = l
            bytes = buffer
        }
        owned = false
        return TLSConfiguration(
            role: .server, alpn: alpn, serverName: nil, verifyPeer: false, context: ctx,
            alpnList: list, alpnBytes: bytes)
    }

    /// A client configuration.
    ///
    /// - Parameters:
    ///   - alpn: protocols to offer, in order; empty sends no ALPN extension.
    ///   - trustRootsPEMFile: PEM file of trusted certificates; `nil` uses the system trust store.
    ///   - verifyPeer: verify the server's chain and that it is valid for `serverName`. Turn off only
    ///     for tests and local tools.
    ///   - serverName: DNS name (sent as SNI and checked against the certificate) or IP address
    ///     (checked against IP SANs; never sent as SNI, per RFC 6066). `OpenSSLHandler` can override
    ///     it per connection.
    public static func client(
        alpn: [String], trustRootsPEMFile: String? = nil, verifyPeer: Bool = true, serverName: String?
    ) throws -> TLSConfiguration {
        let wire = try encodeALPN(alpn)
        let ctx = try makeContext(method: TLS_client_method(), server: false)
        var owned = true
        defer { if owned { SSL_CTX_free(ctx) } }

        if verifyPeer {
            SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nil)
            if let trustRootsPEMFile {
                guard SSL_CTX_load_verify_locations(ctx, trustRootsPEMFile, nil) == 1 else {
                    throw TLSError.configuration("cannot load trust roots from \(trustRootsPEMFile)")
                }
            } else if SSL_CTX_set_default_verify_paths(ctx) != 1 {
                throw TLSError.configuration("cannot load the system trust store")
            }
        } else {
            SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nil)
        }
        if !wire.isEmpty {
            // Unusually, SSL_CTX_set_alpn_protos returns 0 on success.
            let rc = wire.withUnsafeBufferPointer { SSL_CTX_set_alpn_protos(ctx, $0.baseAddress, UInt32($0.count)) }
            guard rc == 0 else { throw TLSError.configuration("cannot set ALPN protocols \(alpn)") }
        }
        owned = false
        return TLSConfiguration(
            role: .client, alpn: alpn, serverName: serverName, verifyPeer: verifyPeer, context: ctx,
            alpnList: nil, alpnBytes: nil)
    }

    private static func makeContext(method: OpaquePointer?, server: Bool) throws -> OpaquePointer {
        ERR_clear_error()
        guard let ctx = SSL_CTX_new(method) else { throw TLSError.configuration("SSL_CTX_new failed") }
        guard copenssl_set_min_proto(ctx, TLS1_2_VERSION) == 1 else {
            SSL_CTX_free(ctx)
            throw TLSError.configuration("cannot set the minimum protocol version to TLS 1.2")
        }
        copenssl_ctx_apply_defaults(ctx, server ? 1 : 0)
        return ctx
    }

    /// ALPN wire format (RFC 7301): each name as a one-byte length and 1…255 bytes.
    static func encodeALPN(_ protocols: [String]) throws -> [UInt8] {
        var wire: [UInt8] = []
        for name in protocols {
            let bytes = Array(name.utf8)
            guard (1...255).contains(bytes.count) else {
                throw TLSError(.configuration, "ALPN protocol name must be 1…255 bytes: \(name.debugDescription)")
            }
            wire.append(UInt8(bytes.count))
            wire.append(contentsOf: bytes)
        }
        return wire
    }
}
