import ArgumentParser
import Foundation
import RPCTransport
import Security

/// Command-line options every service executable shares. Each falls back to an environment
/// variable named after the service (`ACCOUNTS_PORT`, `ACCOUNTS_DATA_DIR`, ...), then a default.
public struct ServiceOptions: ParsableArguments {
    @Option(help: "Address to bind (env <SERVICE>_HOST, default 127.0.0.1).") public var host: String?
    @Option(help: "Port (env <SERVICE>_PORT, default per service).") public var port: Int?
    @Option(name: .customLong("data-dir"), help: "Data directory (env <SERVICE>_DATA_DIR, else $DATA_DIR/<service>, else ./data/<service>).")
    public var dataDir: String?
    @Option(name: .customLong("tls-cert"), help: "PEM certificate chain: serve TLS (ALPN h2).") public var tlsCert: String?
    @Option(name: .customLong("tls-key"), help: "PEM private key for --tls-cert.") public var tlsKey: String?
    @Option(name: .customLong("log-level"), help: "trace, debug, info, notice, warning, error (env LOG_LEVEL).") public var logLevel: String?
    public init() {}
}

/// Resolved settings for one service process.
public struct ServiceSettings: Sendable {
    public var name: String
    public var host: String
    public var port: Int
    public var dataDir: String
    public var tlsCert: String?
    public var tlsKey: String?
    public var logLevel: String
    /// The cluster's shared service credential (env SERVICE_TOKEN, else `<DATA_DIR>/service-token`,
    /// created on first use with 0600 permissions, so every service started from one data root
    /// shares it and no client ever sees it).
    public var serviceToken: String
    let environment: [String: String]

    /// Default ports of the whole system (DESIGN.md).
    public static let defaultPorts = ["gateway": 8080, "accounts": 9101, "tasks": 9102, "finance": 9103,
                                      "social": 9104, "matchmaking": 9105]

    public init(name: String, options: ServiceOptions, environment: [String: String] = ProcessInfo.processInfo.environment) throws {
        let prefix = name.uppercased()
        self.name = name
        self.environment = environment
        host = options.host ?? environment["\(prefix)_HOST"] ?? "127.0.0.1"
        guard let port = options.port ?? environment["\(prefix)_PORT"].flatMap(Int.init) ?? Self.defaultPorts[name] else {
            throw ValidationError("no port for \(name): pass --port or set \(prefix)_PORT")
        }
        guard (0...65535).contains(port) else { throw ValidationError("port \(port) is out of range") }
        self.port = port
        let root = environment["DATA_DIR"] ?? "./data"
        dataDir = options.dataDir ?? environment["\(prefix)_DATA_DIR"] ?? "\(root)/\(name)"
        tlsCert = options.tlsCert ?? environment["\(prefix)_TLS_CERT"]
        tlsKey = options.tlsKey ?? environment["\(prefix)_TLS_KEY"]
        if (tlsCert == nil) != (tlsKey == nil) { throw ValidationError("--tls-cert and --tls-key go together") }
        logLevel = options.logLevel ?? environment["LOG_LEVEL"] ?? "info"
        serviceToken = try environment["SERVICE_TOKEN"] ?? Self.sharedToken(root: root)
        // A peer address that does not parse would silently fall back to the default: refuse it.
        for peer in Self.defaultPorts.keys.sorted() {
            let variable = "\(peer.uppercased())_ADDR"
            if let addr = environment[variable], ChannelConfiguration.address(addr) == nil {
                throw ValidationError("\(variable)='\(addr)' is not host:port")
            }
        }
    }

    /// Address of another service: `<PEER>_ADDR` (host:port), else 127.0.0.1 and its port.
    public func peerAddress(_ peer: String) -> (host: String, port: Int) {
        let prefix = peer.uppercased()
        if let addr = environment["\(prefix)_ADDR"].flatMap(ChannelConfiguration.address) { return addr }
        let port = environment["\(prefix)_PORT"].flatMap(Int.init) ?? Self.defaultPorts[peer] ?? 0
        return (environment["\(prefix)_HOST"] ?? "127.0.0.1", port)
    }

    static func sharedToken(root: String) throws -> String {
        let path = "\(root)/service-token"
        let fm = FileManager.default
        try fm.createDirectory(atPath: root, withIntermediateDirectories: true)
        if let existing = try? String(contentsOfFile: path, encoding: .utf8), !existing.isEmpty {
            return existing.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        let token = SecureRandom.token(bytes: 32)
        // Written whole to a private file, then linked into place: the link fails if another
        // service got there first (its token wins), and a crash never leaves an empty or partial
        // credential behind.
        let temporary = "\(path).tmp-\(getpid())"
        unlink(temporary)
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw ValidationError("cannot create \(temporary): \(String(cString: strerror(errno)))") }
        let bytes = Array(token.utf8)
        let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        let synced = fsync(fd)
        close(fd)
        defer { unlink(temporary) }
        guard written == bytes.count, synced == 0 else {
            throw ValidationError("cannot write the service credential \(temporary): \(String(cString: strerror(errno)))")
        }
        if link(temporary, path) == 0 {
            let dir = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            if dir >= 0 { fsync(dir); close(dir) }
            return token
        }
        // Only "already there" means another process made it first; anything else is the error.
        guard errno == EEXIST else {
            throw ValidationError("cannot put the service credential at \(path): \(String(cString: strerror(errno)))")
        }
        for _ in 0..<50 {
            if let existing = try? String(contentsOfFile: path, encoding: .utf8), !existing.isEmpty {
                return existing.trimmingCharacters(in: .whitespacesAndNewlines)
            }
            usleep(20_000)
        }
        throw ValidationError("the service credential at \(path) is empty or unreadable: remove it (a new one is made) or set SERVICE_TOKEN")
    }
}
