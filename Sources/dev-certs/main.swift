import ArgumentParser
import Foundation
import RPCTLS

/// `dev-certs --dir DIR accounts tasks … [--if-missing]`: a development cluster CA and one
/// certificate per name signed by it, for TLS between the services (docs/operations.md, "TLS
/// between services"). `scripts/run` (with `INTERNAL_TLS=1`) and compose's `certs` job use it.
///
/// Writes `DIR/ca.pem` and `DIR/ca-key.pem` when the CA does not exist yet (an existing CA is
/// kept, so clients that trust it keep working), then `DIR/<name>.pem` and `DIR/<name>-key.pem`
/// (keys 0600) for every name: valid for TLS server and client authentication, for the names
/// `<name>`, `localhost`, `127.0.0.1`, `::1` and `--san`. Certificates are remade on every run
/// (they last a year), unless `--if-missing`, which makes only the files that are not there and
/// never touches a certificate someone put in place.
@main
struct DevCerts: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dev-certs",
        abstract: "Make a development cluster CA and certificates it signs (mutual TLS between services).")

    @Option(help: "Directory for the files (created if needed).") var dir: String
    @Option(help: "A further subject alternative name for every certificate (DNS name or IP); repeatable.") var san: [String] = []
    @Flag(help: "Make only missing files; keep every existing certificate.") var ifMissing = false
    @Argument(help: "Certificate names: one per service (accounts, tasks, …) and per tool (probe).") var names: [String]

    func validate() throws {
        for name in names where name.isEmpty || name == "ca" || name.contains("/") || name.hasPrefix(".") {
            throw ValidationError("'\(name)' cannot name a certificate file")
        }
    }

    func run() throws {
        let fm = FileManager.default
        let caCert = "\(dir)/ca.pem", caKey = "\(dir)/ca-key.pem"
        if !fm.fileExists(atPath: caCert) {
            if fm.fileExists(atPath: caKey) { throw ValidationError("\(caKey) exists without \(caCert): remove it or restore the CA") }
            _ = try DevelopmentCertificate.generateAuthority(commonName: "backend development cluster CA", directory: dir)
            print("made \(caCert)")
        }
        for name in names {
            let cert = "\(dir)/\(name).pem", key = "\(dir)/\(name)-key.pem"
            if ifMissing, fm.fileExists(atPath: cert), fm.fileExists(atPath: key) { continue }
            guard fm.isReadableFile(atPath: caKey) else {
                throw ValidationError("cannot sign \(name): the CA key \(caKey) is missing (a CA managed elsewhere? put its certificates in place)")
            }
            _ = try DevelopmentCertificate.generate(
                commonName: name, directory: dir, alternativeNames: san, issuer: (caCert, caKey), fileName: name)
            print("made \(cert)")
        }
    }
}
