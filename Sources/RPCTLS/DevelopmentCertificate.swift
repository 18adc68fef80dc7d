import COpenSSL

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A self-signed certificate for local development and tests, made with OpenSSL's C API so that
/// `scripts/run` and the test suites need neither the `openssl` tool nor a checked-in key.
///
/// The certificate is an X.509 v3 end-entity certificate with an EC P-256 key (the curve every TLS
/// client supports, unlike Ed25519 certificates), valid from one hour ago for one year, with
/// subject alternative names `localhost`, `127.0.0.1`, `::1` and the common name. A client trusts it
/// by using the certificate file itself as its trust roots (`TLSConfiguration.client(…,
/// trustRootsPEMFile: certFile, …)`, Python's `cafile=`, `grpcurl -cacert`).
public enum DevelopmentCertificate {
    /// Creates `directory` if needed and writes `cert.pem` and `key.pem` (PKCS#8, mode 0600) into
    /// it, replacing earlier ones atomically. Returns the two paths.
    public static func generate(commonName: String, directory: String) throws -> (certFile: String, keyFile: String) {
        ERR_clear_error()
        guard let key = copenssl_generate_p256_key() else { throw TLSError.configuration("cannot generate a P-256 key") }
        defer { EVP_PKEY_free(key) }
        guard let certificate = X509_new() else { throw TLSError.configuration("X509_new failed") }
        defer { X509_free(certificate) }

        try check(X509_set_version(certificate, 2), "X509_set_version")  // 2 means v3
        try setRandomSerial(certificate)
        // Backdated an hour so a peer whose clock is slightly behind still accepts it.
        try check(X509_gmtime_adj(X509_getm_notBefore(certificate), -3600) != nil ? 1 : 0, "notBefore")
        try check(X509_gmtime_adj(X509_getm_notAfter(certificate), 365 * 24 * 3600) != nil ? 1 : 0, "notAfter")
        try check(X509_set_pubkey(certificate, key), "X509_set_pubkey")

        let name = X509_get_subject_name(certificate)
        try check(X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, commonName, -1, -1, 0), "common name")
        try check(X509_set_issuer_name(certificate, name), "issuer name")

        var v3 = X509V3_CTX()
        X509V3_set_ctx(&v3, certificate, certificate, nil, nil, 0)
        // Subject key id before authority key id: the latter is derived from the issuer's (our own).
        let extensions: [(Int32, String)] = [
            (NID_basic_constraints, "critical,CA:FALSE"),
            (NID_key_usage, "critical,digitalSignature"),
            (NID_ext_key_usage, "serverAuth,clientAuth"),
            (NID_subject_key_identifier, "hash"),
            (NID_authority_key_identifier, "keyid:always"),
            (NID_subject_alt_name, subjectAlternativeNames(commonName)),
        ]
        for (nid, value) in extensions {
            guard let ext = X509V3_EXT_conf_nid(nil, &v3, nid, value) else {
                throw TLSError.configuration("cannot build certificate extension \(value)")
            }
            defer { X509_EXTENSION_free(ext) }
            try check(X509_add_ext(certificate, ext, -1), "X509_add_ext")
        }
        guard X509_sign(certificate, key, EVP_sha256()) > 0 else { throw TLSError.configuration("X509_sign failed") }

        let certificatePEM = try pem { PEM_write_bio_X509($0, certificate) }
        let keyPEM = try pem { PEM_write_bio_PrivateKey($0, key, nil, nil, 0, nil, nil) }

        try makeDirectories(directory)
        let certFile = directory.hasSuffix("/") ? directory + "cert.pem" : directory + "/cert.pem"
        let keyFile = directory.hasSuffix("/") ? directory + "key.pem" : directory + "/key.pem"
        try writeAtomically(keyPEM, to: keyFile, mode: 0o600)
        try writeAtomically(certificatePEM, to: certFile, mode: 0o644)
        return (certFile, keyFile)
    }

    static func subjectAlternativeNames(_ commonName: String) -> String {
        var names = ["DNS:localhost", "IP:127.0.0.1", "IP:::1"]
        let allowed = commonName.utf8.allSatisfy {
            ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x41 && $0 <= 0x5A) || ($0 >= 0x61 && $0 <= 0x7A)
                || $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: "-") || $0 == UInt8(ascii: ":")
                || $0 == UInt8(ascii: "*")
        }
        if allowed, !commonName.isEmpty, commonName != "localhost" {
            if let ip = a2i_IPADDRESS(commonName) {
                ASN1_OCTET_STRING_free(ip)
                if commonName != "127.0.0.1", commonName != "::1" { names.append("IP:\(commonName)") }
            } else {
                ERR_clear_error()
                if !commonName.contains(":") { names.append("DNS:\(commonName)") }
            }
        }
        return names.joined(separator: ",")
    }

    private static func setRandomSerial(_ certificate: OpaquePointer) throws {
        // RFC 5280: positive, at most 20 octets; 127 random bits.
        var bytes = [UInt8](repeating: 0, count: 16)
        try check(RAND_bytes(&bytes, Int32(bytes.count)), "RAND_bytes")
        bytes[0] &= 0x7F
        guard let number = BN_bin2bn(bytes, Int32(bytes.count), nil) else { throw TLSError.configuration("BN_bin2bn failed") }
        defer { BN_free(number) }
        guard BN_to_ASN1_INTEGER(number, X509_get_serialNumber(certificate)) != nil else {
            throw TLSError.configuration("cannot set the serial number")
        }
    }

    private static func pem(_ write: (OpaquePointer) -> Int32) throws -> [UInt8] {
        guard let bio = BIO_new(BIO_s_mem()) else { throw TLSError.configuration("BIO_new failed") }
        defer { BIO_free(bio) }
        try check(write(bio), "PEM encoding")
        let count = Int(copenssl_bio_pending(bio))
        var bytes = [UInt8](repeating: 0, count: count)
        let read = BIO_read(bio, &bytes, Int32(count))
        guard read == Int32(count) else { throw TLSError.configuration("cannot read PEM output") }
        return bytes
    }

    private static func check(_ rc: Int32, _ what: String) throws {
        if rc != 1 { throw TLSError.configuration("\(what) failed") }
    }

    private static func makeDirectories(_ path: String) throws {
        var prefix = path.hasPrefix("/") ? "/" : ""
        for component in path.split(separator: "/") {
            prefix += component
            if mkdir(prefix, 0o755) != 0, errno != EEXIST {
                throw TLSError(.configuration, "cannot create directory \(prefix) (errno \(errno))")
            }
            prefix += "/"
        }
    }

    /// Writes to a temporary file in the same directory and renames it over `path`, so a reader
    /// never sees half a key and the key is never readable by others, not even briefly.
    private static func writeAtomically(_ bytes: [UInt8], to path: String, mode: mode_t) throws {
        let temporary = "\(path).tmp.\(getpid())"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC, mode)
        guard fd >= 0 else { throw TLSError(.configuration, "cannot create \(temporary) (errno \(errno))") }
        var offset = 0
        while offset < bytes.count {
            let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + offset, bytes.count - offset) }
            if written < 0 {
                if errno == EINTR { continue }
                let code = errno
                close(fd)
                unlink(temporary)
                throw TLSError(.configuration, "cannot write \(temporary) (errno \(code))")
            }
            offset += written
        }
        guard fsync(fd) == 0, close(fd) == 0 else {
            unlink(temporary)
            throw TLSError(.configuration, "cannot write \(temporary) (errno \(errno))")
        }
        guard rename(temporary, path) == 0 else {
            unlink(temporary)
            throw TLSError(.configuration, "cannot rename \(temporary) to \(path) (errno \(errno))")
        }
    }
}
