import COpenSSL

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Certificates for local development and tests, made with OpenSSL's C API so that `scripts/run`
/// and the test suites need neither the `openssl` tool nor a checked-in key.
///
/// Certificates are X.509 v3 with EC P-256 keys (the curve every TLS client supports, unlike
/// Ed25519 certificates), valid from one hour ago. Two kinds:
/// - **self-signed** end-entity certificates (`generate(commonName:directory:)`): a client trusts
///   one by using the certificate file itself as its trust roots (`TLSConfiguration.client(…,
///   trustRootsPEMFile: certFile, …)`, Python's `cafile=`, `grpcurl -cacert`);
/// - a **development certificate authority** (`generateAuthority`) and end-entity certificates it
///   signs (`generate(…, issuer:)`): a cluster's services trust the CA file and each presents its
///   own certificate, as a server and as a client (mutual TLS between services).
///
/// End-entity certificates are for both TLS server and client authentication, with subject
/// alternative names `localhost`, `127.0.0.1`, `::1`, the common name and `alternativeNames`.
public enum DevelopmentCertificate {
    /// Creates `directory` if needed and writes `cert.pem` and `key.pem` (PKCS#8, mode 0600) into
    /// it — or `<fileName>.pem` and `<fileName>-key.pem` — replacing earlier ones atomically.
    /// Self-signed, or signed by `issuer` (a CA from `generateAuthority`). Valid for a year.
    /// Returns the two paths.
    public static func generate(
        commonName: String, directory: String, alternativeNames: [String] = [],
        issuer: (certFile: String, keyFile: String)? = nil, fileName: String? = nil
    ) throws -> (certFile: String, keyFile: String) {
        ERR_clear_error()
        var signer: (certificate: OpaquePointer, key: OpaquePointer)? = nil
        if let issuer {
            let certificate = try readCertificate(issuer.certFile)
            guard let key = try? readPrivateKey(issuer.keyFile) else {
                X509_free(certificate)
                throw TLSError.configuration("cannot read the CA's private key from \(issuer.keyFile)", path: issuer.keyFile)
            }
            signer = (certificate, key)
        }
        defer {
            if let signer {
                X509_free(signer.certificate)
                EVP_PKEY_free(signer.key)
            }
        }
        let names = subjectAlternativeNames(commonName, extra: alternativeNames)
        return try make(
            commonName: commonName, directory: directory, fileName: fileName, days: 365,
            extensions: [
                (NID_basic_constraints, "critical,CA:FALSE"),
                (NID_key_usage, "critical,digitalSignature"),
                (NID_ext_key_usage, "serverAuth,clientAuth"),
                (NID_subject_key_identifier, "hash"),
                (NID_authority_key_identifier, "keyid:always"),
                (NID_subject_alt_name, names),
            ], signer: signer)
    }

    /// A development certificate authority: writes `ca.pem` and `ca-key.pem` (0600) into
    /// `directory` (or `<fileName>.pem`, `<fileName>-key.pem`), valid for ten years. Keep its key
    /// as secret as any service key: whoever holds it can mint certificates every service accepts.
    public static func generateAuthority(
        commonName: String, directory: String, fileName: String = "ca"
    ) throws -> (certFile: String, keyFile: String) {
        ERR_clear_error()
        return try make(
            commonName: commonName, directory: directory, fileName: fileName, days: 3650,
            extensions: [
                (NID_basic_constraints, "critical,CA:TRUE,pathlen:0"),
                (NID_key_usage, "critical,keyCertSign,cRLSign"),
                (NID_subject_key_identifier, "hash"),
            ], signer: nil)
    }

    /// Builds, signs (by `signer`, else by its own key) and writes one certificate and its key.
    private static func make(
        commonName: String, directory: String, fileName: String?, days: Int,
        extensions: [(Int32, String)], signer: (certificate: OpaquePointer, key: OpaquePointer)?
    ) throws -> (certFile: String, keyFile: String) {
        guard let key = copenssl_generate_p256_key() else { throw TLSError.configuration("cannot generate a P-256 key") }
        defer { EVP_PKEY_free(key) }
        guard let certificate = X509_new() else { throw TLSError.configuration("X509_new failed") }
        defer { X509_free(certificate) }

        try check(X509_set_version(certificate, 2), "X509_set_version")  // 2 means v3
        try setRandomSerial(certificate)
        // Backdated an hour so a peer whose clock is slightly behind still accepts it.
        try check(X509_gmtime_adj(X509_getm_notBefore(certificate), -3600) != nil ? 1 : 0, "notBefore")
        try check(X509_gmtime_adj(X509_getm_notAfter(certificate), days * 24 * 3600) != nil ? 1 : 0, "notAfter")
        try check(X509_set_pubkey(certificate, key), "X509_set_pubkey")

        let name = X509_get_subject_name(certificate)
        try check(X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, commonName, -1, -1, 0), "common name")
        let issuerCertificate = signer?.certificate ?? certificate
        try check(X509_set_issuer_name(certificate, X509_get_subject_name(issuerCertificate)), "issuer name")

        var v3 = X509V3_CTX()
        X509V3_set_ctx(&v3, issuerCertificate, certificate, nil, nil, 0)
        // Subject key id before authority key id: the latter is derived from the issuer's.
        for (nid, value) in extensions {
            guard let ext = X509V3_EXT_conf_nid(nil, &v3, nid, value) else {
                throw TLSError.configuration("cannot build certificate extension \(value)")
            }
            defer { X509_EXTENSION_free(ext) }
            try check(X509_add_ext(certificate, ext, -1), "X509_add_ext")
        }
        guard X509_sign(certificate, signer?.key ?? key, EVP_sha256()) > 0 else { throw TLSError.configuration("X509_sign failed") }

        let certificatePEM = try pem { PEM_write_bio_X509($0, certificate) }
        let keyPEM = try pem { PEM_write_bio_PrivateKey($0, key, nil, nil, 0, nil, nil) }

        try makeDirectories(directory)
        let base = directory.hasSuffix("/") ? directory : directory + "/"
        let certFile = base + (fileName.map { "\($0).pem" } ?? "cert.pem")
        let keyFile = base + (fileName.map { "\($0)-key.pem" } ?? "key.pem")
        try writeAtomically(keyPEM, to: keyFile, mode: 0o600)
        try writeAtomically(certificatePEM, to: certFile, mode: 0o644)
        return (certFile, keyFile)
    }

    private static func readCertificate(_ path: String) throws -> OpaquePointer {
        guard let bio = BIO_new_file(path, "r") else { throw TLSError.configuration("cannot open \(path)", path: path) }
        defer { BIO_free(bio) }
        guard let certificate = PEM_read_bio_X509(bio, nil, nil, nil) else {
            throw TLSError.configuration("no PEM certificate in \(path)", path: path)
        }
        return certificate
    }

    private static func readPrivateKey(_ path: String) throws -> OpaquePointer {
        guard let bio = BIO_new_file(path, "r") else { throw TLSError.configuration("cannot open \(path)", path: path) }
        defer { BIO_free(bio) }
        guard let key = PEM_read_bio_PrivateKey(bio, nil, nil, nil) else {
            throw TLSError.configuration("no PEM private key in \(path)", path: path)
        }
        return key
    }

    /// `localhost`, `127.0.0.1`, `::1`, then the common name and `extra`, each as an IP or DNS
    /// name; names with characters a SAN cannot carry, and repeats, are left out.
    static func subjectAlternativeNames(_ commonName: String, extra: [String] = []) -> String {
        var names = ["DNS:localhost", "IP:127.0.0.1", "IP:::1"]
        for candidate in [commonName] + extra {
            let allowed = candidate.utf8.allSatisfy {
                ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x41 && $0 <= 0x5A) || ($0 >= 0x61 && $0 <= 0x7A)
                    || $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: "-") || $0 == UInt8(ascii: ":")
                    || $0 == UInt8(ascii: "*")
            }
            guard allowed, !candidate.isEmpty else { continue }
            let entry: String
            if let ip = a2i_IPADDRESS(candidate) {
                ASN1_OCTET_STRING_free(ip)
                entry = "IP:\(candidate)"
            } else {
                ERR_clear_error()
                if candidate.contains(":") { continue }
                entry = "DNS:\(candidate)"
            }
            if !names.contains(entry) { names.append(entry) }
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
