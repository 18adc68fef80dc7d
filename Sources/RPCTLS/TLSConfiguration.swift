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
    /// Whether a client verifies the server's certificate chain and name; for a server, whether it
    /// requires and verifies a client certificate (mutual TLS).
    public let verifyPeer: Bool
    /// A server that refuses clients without a certificate signed by its client CA (mutual TLS).
    public var requiresClientCertificate: Bool { role == .server && verifyPeer }
    /// A client that presents a certificate of its own (mutual TLS).
    public let presentsCertificate: Bool

    /// Owned `SSL_CTX*`; freed in `deinit`.
    let context: OpaquePointer
    /// Wire-format ALPN list read by the server's selection callback (`copenssl_alpn_select_cb`).
    private let alpnList: UnsafeMutablePointer<copenssl_alpn_list>?
    private let alpnBytes: UnsafeMutableBufferPointer<UInt8>?
    /// `SSL*` handles made from this context and not yet freed (leak checks in tests).
    let liveSessions = Atomic<Int>(0)

    private init(
        role: Role, alpn: [String], serverName: String?, verifyPeer: Bool, presentsCertificate: Bool, context: OpaquePointer,
        alpnList: UnsafeMutablePointer<copenssl_alpn_list>?, alpnBytes: UnsafeMutableBufferPointer<UInt8>?
    ) {
        self.role = role
        self.alpn = alpn
        self.serverName = serverName
        self.verifyPeer = verifyPeer
        self.presentsCertificate = presentsCertificate
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
    ///
    /// With `clientCertificateAuthorityPEMFile` the server speaks **mutual TLS**: every client must
    /// present a certificate that chains to one of that file's certificates and is valid for client
    /// authentication (`SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT`). A client without one, or
    /// with one from another CA, fails the handshake (an alert; the server reports
    /// `TLSError.Kind.handshakeFailed` or `.certificateVerificationFailed`). The CA's names are sent
    /// in the CertificateRequest, so a client holding several certificates can pick the right one.
    public static func server(
        certificateChainPEMFile: String, privateKeyPEMFile: String, alpn: [String],
        clientCertificateAuthorityPEMFile: String? = nil
    ) throws -> TLSConfiguration {
        let wire = try encodeALPN(alpn)
        let ctx = try makeContext(method: TLS_server_method(), server: true)
        var owned = true
        defer { if owned { SSL_CTX_free(ctx) } }

        try useCertificate(ctx, chain: certificateChainPEMFile, key: privateKeyPEMFile)
        if let caFile = clientCertificateAuthorityPEMFile {
            guard SSL_CTX_load_verify_locations(ctx, caFile, nil) == 1 else {
                throw TLSError.configuration("cannot load client certificate authorities from \(caFile)", path: caFile)
            }
            guard let names = SSL_load_client_CA_file(caFile) else {
                throw TLSError.configuration("cannot read CA names from \(caFile)", path: caFile)
            }
            SSL_CTX_set_client_CA_list(ctx, names)  // takes ownership
            SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nil)
            // Sessions are tied to the verification that admitted them: without an id context
            // OpenSSL refuses every resumption attempt on a verifying server with a hard error.
            let id = Array("rpctls-mtls".utf8)
            guard SSL_CTX_set_session_id_context(ctx, id, UInt32(id.count)) == 1 else {
                throw TLSError.configuration("cannot set the session id context")
            }
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
            role: .server, alpn: alpn, serverName: nil, verifyPeer: clientCertificateAuthorityPEMFile != nil,
            presentsCertificate: true, context: ctx, alpnList: list, alpnBytes: bytes)
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
    ///   - certificateChainPEMFile, privateKeyPEMFile: this client's own certificate (leaf first)
    ///     and key, presented to servers that ask for one (mutual TLS). Both or neither.
    public static func client(
        alpn: [String], trustRootsPEMFile: String? = nil, verifyPeer: Bool = true, serverName: String?,
        certificateChainPEMFile: String? = nil, privateKeyPEMFile: String? = nil
    ) throws -> TLSConfiguration {
        let wire = try encodeALPN(alpn)
        guard (certificateChainPEMFile == nil) == (privateKeyPEMFile == nil) else {
            throw TLSError(.configuration, "a client certificate needs its private key, and a key its certificate")
        }
        let ctx = try makeContext(method: TLS_client_method(), server: false)
        var owned = true
        defer { if owned { SSL_CTX_free(ctx) } }

        if verifyPeer {
            SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nil)
            if let trustRootsPEMFile {
                guard SSL_CTX_load_verify_locations(ctx, trustRootsPEMFile, nil) == 1 else {
                    throw TLSError.configuration("cannot load trust roots from \(trustRootsPEMFile)", path: trustRootsPEMFile)
                }
            } else if SSL_CTX_set_default_verify_paths(ctx) != 1 {
                throw TLSError.configuration("cannot load the system trust store")
            }
        } else {
            SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nil)
        }
        if let chain = certificateChainPEMFile, let key = privateKeyPEMFile {
            try useCertificate(ctx, chain: chain, key: key)
        }
        if !wire.isEmpty {
            // Unusually, SSL_CTX_set_alpn_protos returns 0 on success.
            let rc = wire.withUnsafeBufferPointer { SSL_CTX_set_alpn_protos(ctx, $0.baseAddress, UInt32($0.count)) }
            guard rc == 0 else { throw TLSError.configuration("cannot set ALPN protocols \(alpn)") }
        }
        owned = false
        return TLSConfiguration(
            role: .client, alpn: alpn, serverName: serverName, verifyPeer: verifyPeer,
            presentsCertificate: certificateChainPEMFile != nil, context: ctx, alpnList: nil, alpnBytes: nil)
    }

    /// Loads this side's certificate chain and private key into `ctx` and checks that they match.
    private static func useCertificate(_ ctx: OpaquePointer, chain: String, key: String) throws {
        guard SSL_CTX_use_certificate_chain_file(ctx, chain) == 1 else {
            throw TLSError.configuration("cannot load certificate chain from \(chain)", path: chain)
        }
        guard SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) == 1 else {
            // OpenSSL checks the key against the loaded certificate here already.
            let mismatch = ERR_GET_LIB(ERR_peek_last_error()) == ERR_LIB_X509 && ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH
            throw TLSError.configuration(
                mismatch ? "private key \(key) does not match certificate \(chain)" : "cannot load private key from \(key)", path: key)
        }
        guard SSL_CTX_check_private_key(ctx) == 1 else {
            throw TLSError.configuration("private key \(key) does not match certificate \(chain)", path: key)
        }
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
