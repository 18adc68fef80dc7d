import ArgumentParser
import Foundation
import Observability
import RPCCore
import RPCTLS
import RPCTransport
import Security

/// Command-line options every service executable shares. Each falls back to an environment
/// variable named after the service (`ACCOUNTS_PORT`, `ACCOUNTS_DATA_DIR`, ...), then a default.
public struct ServiceOptions: ParsableArguments {
    @Option(help: "Address to bind (env <SERVICE>_HOST, default 127.0.0.1).") public var host: String?
    @Option(help: "Port (env <SERVICE>_PORT, default per service).") public var port: Int?
    @Option(
        name: .customLong("health-port"),
        help:
            "Also serve grpc.health.v1.Health alone on this port, plaintext h2c, for probes (env <SERVICE>_HEALTH_PORT or HEALTH_PORT; default off)."
    )
    public var healthPort: Int?
    @Option(name: .customLong("data-dir"), help: "Data directory (env <SERVICE>_DATA_DIR, else $DATA_DIR/<service>, else ./data/<service>).")
    public var dataDir: String?
    @Option(name: .customLong("tls-cert"), help: "PEM certificate chain: serve TLS (ALPN h2).") public var tlsCert: String?
    @Option(name: .customLong("tls-key"), help: "PEM private key for --tls-cert.") public var tlsKey: String?
    @Option(
        name: .customLong("tls-client-ca"),
        help: "PEM CA bundle: require client certificates signed by it (mutual TLS; needs --tls-cert; env <SERVICE>_TLS_CLIENT_CA).")
    public var tlsClientCA: String?
    @Option(name: .customLong("log-level"), help: "trace, debug, info, notice, warning, error (env LOG_LEVEL).") public var logLevel: String?
    @Option(name: .customLong("log-format"), help: "text (default) or json: one JSON object per line (env LOG_FORMAT).")
    public var logFormat: String?
    @Option(
        name: .customLong("trace-export"),
        help: "off (default), file:<path> (JSON lines), otlp://host:port or otlps://host:port (OTLP/gRPC, h2c or TLS) (env TRACE_EXPORT).")
    public var traceExport: String?
    @Option(
        name: .customLong("trace-sample-ratio"),
        help: "Share of new traces recorded, 0 to 1 (env TRACE_SAMPLE_RATIO, default 0.01).")
    public var traceSampleRatio: String?
    @Flag(
        name: .customLong("dev-credentials"),
        help: "Development only (env ALLOW_DEV_CREDENTIALS=1): make missing credentials under $DATA_DIR and accept weak ones.")
    public var devCredentials = false
    public init() {}

    /// The flags given, by settings key (`<service>.port`, ...): they win over the environment.
    func flags(for name: String) -> [String: String] {
        var f: [String: String] = [:]
        f["\(name).host"] = host
        f["\(name).port"] = port.map(String.init)
        f["\(name).health.port"] = healthPort.map(String.init)
        f["\(name).data.dir"] = dataDir
        f["\(name).tls.cert"] = tlsCert
        f["\(name).tls.key"] = tlsKey
        f["\(name).tls.client.ca"] = tlsClientCA
        f["log.level"] = logLevel
        f["log.format"] = logFormat
        f["trace.export"] = traceExport
        f["trace.sample.ratio"] = traceSampleRatio
        if devCredentials { f["allow.dev.credentials"] = "1" }
        return f
    }
}

/// Resolved settings for one service process (and the gateway): where it listens, its data, its
/// credentials, where its peers are, and the raw `Settings` for what the service reads itself.
public struct ServiceSettings: Sendable {
    public var name: String
    public var host: String
    public var port: Int
    /// `--health-port`, `<SERVICE>_HEALTH_PORT`, else (services only) `HEALTH_PORT` (nil, the default: off): a
    /// second listener on `host` that serves only `grpc.health.v1.Health` (Check and Watch, the
    /// same statuses as the main port), plaintext h2c and without credentials, for kubelet's
    /// native gRPC probe, which cannot present a client certificate to a mutual-TLS port. 0 picks
    /// a free port (tests). Health is open on the main port too (`AuthInterceptor.open`): the
    /// listener reveals nothing the main port does not.
    public var healthPort: Int?
    public var dataDir: String
    /// This process's own server certificate and key (`--tls-cert`/`--tls-key`,
    /// `<SERVICE>_TLS_CERT`/`<SERVICE>_TLS_KEY`): the port speaks TLS.
    public var tlsCert: String?
    public var tlsKey: String?
    /// `--tls-client-ca`, `<SERVICE>_TLS_CLIENT_CA`: the port requires client certificates signed
    /// by this CA (mutual TLS). Needs `tlsCert`.
    public var tlsClientCA: String?
    /// How this process reaches its peers: TLS verified against the cluster CA (`PEER_TLS_CA`),
    /// presenting `PEER_TLS_CERT`/`PEER_TLS_KEY` to peers that require a client certificate;
    /// nil (no `PEER_TLS_CA`) is h2c. Built once at start, so a missing, unreadable or mismatched
    /// file refuses the start; shared by every peer channel (`peerChannelConfiguration`).
    public var peerTLS: TLSConfiguration?
    public var logLevel: String
    /// `METRICS` (default on): calls counted and timed, `GET /metrics` served. Off only to
    /// measure what they cost.
    public var metrics: Bool
    /// `LOG_FORMAT` / `--log-format`: `text` (the default) or `json` (`JSONLogHandler`).
    public var logFormat: LogFormat
    /// `ACCESS_LOG` (`on`, the default, or `off`): whether the transport writes one access-log
    /// line per finished call (`AccessLog`).
    public var accessLog: Bool
    /// `TRACE_EXPORT` / `--trace-export` (`off`, the default, `file:<path>`, `otlp://host:port` or
    /// `otlps://host:port`: TLS with the cluster CA, `PEER_TLS_CA`, when set) and
    /// `TRACE_SAMPLE_RATIO` / `--trace-sample-ratio` (default 0.01): traces
    /// (docs/observability.md, "Traces"). `ServiceHost.bootstrapLogging` makes the tracer.
    public var tracing: TracingSettings
    /// The cluster's service credential (`SERVICE_TOKEN`): what services present to each other
    /// and what opens internal RPCs. The gateway never has it.
    public var serviceToken: String
    /// The gateway's credential (`GATEWAY_TOKEN`): what the gateway presents on relayed user
    /// calls. It opens public and authenticated methods only, and tells a service that the call's
    /// `x-forwarded-for` was written by the gateway.
    public var gatewayToken: String
    /// `ALLOW_DEV_CREDENTIALS=1` / `--dev-credentials`: generated and weak credentials accepted.
    public var devCredentials: Bool
    /// Everything else, for the service's own settings.
    public let settings: Settings
    let environment: [String: String]

    /// Default ports of the whole system (DESIGN.md).
    public static let defaultPorts = [
        "gateway": 8080, "accounts": 9101, "tasks": 9102, "finance": 9103,
        "social": 9104, "matchmaking": 9105,
    ]

    /// Reads the settings of process `name`. `credentials` says which the process needs: a
    /// service needs both (it presents the service credential and recognises the gateway's),
    /// the gateway only its own.
    public init(
        name: String, options: ServiceOptions, environment: [String: String] = ProcessInfo.processInfo.environment,
        credentials: Credentials.Needs = .service
    ) throws {
        let settings = Settings(environment: environment, flags: options.flags(for: name))
        self.settings = settings
        self.name = name
        self.environment = environment
        host = settings.string("\(name).host", default: "127.0.0.1")
        guard let port = try settings.int("\(name).port", range: 0...65535) ?? Self.defaultPorts[name] else {
            throw ValidationError("no port for \(name): pass --port or set \(Settings.variable("\(name).port"))")
        }
        self.port = port
        // The shared `HEALTH_PORT` is the services' (a common environment may set it for all): the
        // gateway, which has no health-only listener, reads only its own name (and refuses it).
        let sharedHealthPort = credentials == .gateway ? nil : try settings.int("health.port", range: 0...65535)
        healthPort = try settings.int("\(name).health.port", range: 0...65535) ?? sharedHealthPort
        if let healthPort, healthPort != 0, healthPort == port {
            throw ValidationError("the health port (\(healthPort)) must differ from the service's port")
        }
        let root = settings.string("data.dir", default: "./data")
        dataDir = Self.dataDirectory(name: name, settings: settings)
        tlsCert = settings.string("\(name).tls.cert")
        tlsKey = settings.string("\(name).tls.key")
        tlsClientCA = settings.string("\(name).tls.client.ca")
        if (tlsCert == nil) != (tlsKey == nil) { throw ValidationError("--tls-cert and --tls-key go together") }
        if tlsClientCA != nil, tlsCert == nil {
            throw ValidationError(
                "\(Self.flagOrVariable("tls-client-ca", "\(name).tls.client.ca")) needs --tls-cert and --tls-key: "
                    + "client certificates are asked for in a TLS handshake")
        }
        for (flag, key, path) in [
            ("tls-cert", "\(name).tls.cert", tlsCert), ("tls-key", "\(name).tls.key", tlsKey),
            ("tls-client-ca", "\(name).tls.client.ca", tlsClientCA),
        ] {
            if let path { try Self.checkReadable(path, Self.flagOrVariable(flag, key)) }
        }
        peerTLS = try Self.peerTLS(settings)
        logLevel = settings.string("log.level", default: "info")
        metrics = try settings.bool("metrics", default: true)
        logFormat = try settings.choice("log.format") ?? .text
        accessLog = try settings.bool("access.log", default: true)
        do {
            tracing = try TracingSettings.parse(export: settings.string("trace.export"), ratio: settings.string("trace.sample.ratio"))
        } catch let error as TracingSettingsError {
            throw ValidationError(error.description)
        }
        devCredentials = try settings.bool("allow.dev.credentials")
        let resolver = Credentials(settings: settings, root: root, development: devCredentials)
        serviceToken = credentials == .service ? try resolver.resolve(.service) : ""
        gatewayToken = try resolver.resolve(.gateway)
        // A peer address that does not parse would silently fall back to the default: refuse it.
        for peer in Self.defaultPorts.keys.sorted() {
            if let addr = settings.string("\(peer).addr"), ChannelConfiguration.address(addr) == nil {
                throw ValidationError("\(Settings.variable("\(peer).addr"))='\(addr)' is not host:port")
            }
            _ = try settings.int("\(peer).port", range: 0...65535)
            if settings.string("\(peer).tls.server.name") != nil, peerTLS == nil {
                throw ValidationError(
                    "\(Settings.variable("\(peer).tls.server.name")) is set but PEER_TLS_CA is not: peers are reached over h2c "
                        + "unless PEER_TLS_CA names the CA that signed their certificates")
            }
        }
        // Likewise the peer keepalive (a malformed value used to fall back to the default unsaid).
        peerKeepaliveMilliseconds = try settings.int("peer.keepalive.time.ms", range: 0...Int(Int32.max)) ?? peerKeepaliveMilliseconds
        peerKeepaliveTimeoutMilliseconds =
            try settings.int("peer.keepalive.timeout.ms", range: 1...Int(Int32.max)) ?? peerKeepaliveTimeoutMilliseconds
    }

    /// Where process `name` keeps its data: `--data-dir` (`flag`), else `<NAME>_DATA_DIR`, else
    /// `$DATA_DIR/<name>`, else `./data/<name>`. What serving, `backup` and `restore` all use.
    public static func dataDirectory(
        name: String, flag: String?, environment: [String: String] = ProcessInfo.processInfo.environment
    ) -> String {
        var flags: [String: String] = [:]
        flags["\(name).data.dir"] = flag
        return dataDirectory(name: name, settings: Settings(environment: environment, flags: flags))
    }

    static func dataDirectory(name: String, settings: Settings) -> String {
        settings.string("\(name).data.dir") ?? "\(settings.string("data.dir", default: "./data"))/\(name)"
    }

    /// `PEER_KEEPALIVE_TIME_MS` (0 = off) and `PEER_KEEPALIVE_TIMEOUT_MS`, checked at start.
    public var peerKeepaliveMilliseconds = 30_000
    public var peerKeepaliveTimeoutMilliseconds = 10_000

    /// Address of another service: `<PEER>_ADDR` (host:port), else 127.0.0.1 and its port.
    public func peerAddress(_ peer: String) -> (host: String, port: Int) {
        if let addr = settings.string("\(peer).addr").flatMap(ChannelConfiguration.address) { return addr }
        let port = (try? settings.int("\(peer).port")) ?? nil
        return (settings.string("\(peer).host", default: "127.0.0.1"), port ?? Self.defaultPorts[peer] ?? 0)
    }

    /// How this process connects to a peer: fail fast while it is down (a short connect timeout
    /// and backoff), so a synchronous read of a peer answers its degraded form quickly; and
    /// keepalive PINGs while calls are open (`PEER_KEEPALIVE_TIME_MS`, default 30 s; 0 = off;
    /// `PEER_KEEPALIVE_TIMEOUT_MS`, default 10 s), so a peer that vanished without closing is
    /// noticed and its calls fail over instead of hanging.
    ///
    /// With `PEER_TLS_CA` the connection speaks TLS (`peerTLS`), checking the certificate against
    /// `host` (or `serverName`).
    public func peerChannelConfiguration(host: String, port: Int, serverName: String? = nil) -> ChannelConfiguration {
        var c = ChannelConfiguration(host: host, port: port, tls: peerTLS)
        c.tlsServerName = serverName
        c.connectTimeout = .seconds(1)
        c.maxBackoff = .seconds(2)
        c.keepaliveTime = peerKeepaliveMilliseconds == 0 ? nil : .milliseconds(peerKeepaliveMilliseconds)
        c.keepaliveTimeout = .milliseconds(peerKeepaliveTimeoutMilliseconds)
        return c
    }

    /// How this process connects to `peer`: its address (`peerAddress`), and over TLS the name
    /// its certificate must carry: `<PEER>_TLS_SERVER_NAME`, else the host of its address.
    public func peerChannelConfiguration(_ peer: String) -> ChannelConfiguration {
        let (host, port) = peerAddress(peer)
        return peerChannelConfiguration(host: host, port: port, serverName: peerTLSServerName(peer))
    }

    /// `<PEER>_TLS_SERVER_NAME`: the name `peer`'s certificate is checked against instead of the
    /// host of its address (a peer reached by IP whose certificate names its DNS name).
    public func peerTLSServerName(_ peer: String) -> String? { settings.string("\(peer).tls.server.name") }

    /// This process's server TLS (`--tls-cert`/`--tls-key`, and `--tls-client-ca` for mutual TLS)
    /// with `alpn`, or nil for h2c. A file that cannot be used refuses the start, naming its
    /// setting.
    public func serverTLS(alpn: [String]) throws -> TLSConfiguration? {
        guard let cert = tlsCert, let key = tlsKey else { return nil }
        do {
            return try TLSConfiguration.server(
                certificateChainPEMFile: cert, privateKeyPEMFile: key, alpn: alpn, clientCertificateAuthorityPEMFile: tlsClientCA)
        } catch let error as TLSError {
            let names = [
                (tlsClientCA, Self.flagOrVariable("tls-client-ca", "\(name).tls.client.ca")),
                (key, Self.flagOrVariable("tls-key", "\(name).tls.key")), (cert, Self.flagOrVariable("tls-cert", "\(name).tls.cert")),
            ]
            throw ValidationError(Self.describe(error, names))
        }
    }

    /// `PEER_TLS_CA` (turns TLS to peers on), `PEER_TLS_CERT`/`PEER_TLS_KEY` (this process's client
    /// certificate, for peers that require one), checked and loaded.
    /// TLS towards peers from `PEER_TLS_*` (nil when `PEER_TLS_CA` is unset), offering `alpn`
    /// (`h2` for gRPC; `http/1.1` for a plain GET of a peer's `/metrics`).
    public static func peerTLS(_ settings: Settings, alpn: [String] = ["h2"]) throws -> TLSConfiguration? {
        let ca = settings.string("peer.tls.ca"), cert = settings.string("peer.tls.cert"), key = settings.string("peer.tls.key")
        if (cert == nil) != (key == nil) { throw ValidationError("PEER_TLS_CERT and PEER_TLS_KEY go together") }
        guard let ca else {
            if cert != nil {
                throw ValidationError(
                    "PEER_TLS_CERT and PEER_TLS_KEY need PEER_TLS_CA (the CA that signed the peers' certificates): "
                        + "without it peers are reached over h2c")
            }
            return nil
        }
        let names = [(ca, "PEER_TLS_CA"), (key, "PEER_TLS_KEY"), (cert, "PEER_TLS_CERT")]
        for (path, variable) in names { if let path { try checkReadable(path, variable) } }
        do {
            return try TLSConfiguration.client(
                alpn: alpn, trustRootsPEMFile: ca, verifyPeer: true, serverName: nil, certificateChainPEMFile: cert,
                privateKeyPEMFile: key)
        } catch let error as TLSError {
            throw ValidationError(describe(error, names))
        }
    }

    /// `--flag / VARIABLE`: both ways a setting is given.
    static func flagOrVariable(_ flag: String, _ key: String) -> String { "--\(flag)/\(Settings.variable(key))" }

    /// A file named by a setting must exist and be readable by this process.
    static func checkReadable(_ path: String, _ setting: String) throws {
        var info = stat()
        guard stat(path, &info) == 0 else {
            throw ValidationError("\(setting)='\(path)' cannot be read: \(String(cString: strerror(errno)))")
        }
        guard (info.st_mode & S_IFMT) == S_IFREG else { throw ValidationError("\(setting)='\(path)' is not a file") }
        guard access(path, R_OK) == 0 else {
            throw ValidationError("\(setting)='\(path)' cannot be read: \(String(cString: strerror(errno)))")
        }
    }

    /// A TLS file error with the setting that named the file (the first whose path it is).
    static func describe(_ error: TLSError, _ names: [(String?, String)]) -> String {
        if let path = error.path, let setting = names.first(where: { $0.0 == path })?.1 { return "\(setting)='\(path)': \(error)" }
        return "\(names.compactMap { $0.0 == nil ? nil : $0.1 }.joined(separator: ", ")): \(error)"
    }
}

/// How a process writes its log (`LOG_FORMAT`): swift-log's `StreamLogHandler` text lines, or
/// one JSON object per line (`JSONLogHandler`).
public enum LogFormat: String, Sendable, CaseIterable {
    case text
    case json
}

/// The two credentials of the cluster and where they come from.
///
/// Each is read from its variable (`SERVICE_TOKEN`, `GATEWAY_TOKEN`), else from the file its
/// `_FILE` variable names (a mounted secret), else — only with `ALLOW_DEV_CREDENTIALS=1` — from
/// `$DATA_DIR/<service-token|gateway-token>`, made on first use with 0600 permissions so every
/// process started from one data root shares it. Without the development flag a process refuses
/// to start when a credential is missing, shorter than 32 characters, or a well-known placeholder
/// (`change-me-in-production`, …): a guessable credential is an open door to internal RPCs.
public struct Credentials: Sendable {
    public enum Kind: String, Sendable {
        case service
        case gateway
        var key: String { self == .service ? "service.token" : "gateway.token" }
        var fileName: String { self == .service ? "service-token" : "gateway-token" }
    }

    /// Which credentials a process needs.
    public enum Needs: Sendable {
        /// A service: both (its own to call peers, the gateway's to recognise relayed calls).
        case service
        /// The gateway: its own only.
        case gateway
    }

    public static let minimumLength = 32
    /// Values that are never a real secret (compared lower-cased).
    public static let placeholders: Set<String> = [
        "change-me-in-production", "change-me", "changeme", "change_me", "secret", "password", "token", "service-token",
        "gateway-token", "test", "dev", "development", "example", "default", "insecure", "please-change-me",
    ]

    let settings: Settings
    let root: String
    let development: Bool

    public init(settings: Settings, root: String, development: Bool) {
        self.settings = settings
        self.root = root
        self.development = development
    }

    /// The credential, or the reason the process cannot start.
    public func resolve(_ kind: Kind) throws -> String {
        let variable = Settings.variable(kind.key)
        var value = settings.string(kind.key, secret: true)
        if value == nil, let file = settings.string("\(kind.key).file") {
            guard let text = try? String(contentsOfFile: file, encoding: .utf8) else {
                throw ValidationError("\(variable)_FILE='\(file)' cannot be read")
            }
            value = text.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        if let value {
            // Sent as a header on every peer call: a byte a header cannot carry would be replaced
            // on the way, and every call would then be refused with a credential that looks right.
            guard Metadata.isTextValue(value), !value.utf8.contains(UInt8(ascii: " ")) else {
                throw ValidationError("\(variable) must be printable ASCII without spaces (it travels as a header value)")
            }
            if let problem = Self.weakness(value), !development {
                throw ValidationError(
                    "\(variable) \(problem): use at least \(Self.minimumLength) random characters "
                        + "(e.g. `openssl rand -base64 33`), or set ALLOW_DEV_CREDENTIALS=1 on a development machine")
            }
            return value
        }
        guard development else {
            throw ValidationError(
                "\(variable) is not set (nor \(variable)_FILE): set it to at least \(Self.minimumLength) random "
                    + "characters shared by the cluster, or set ALLOW_DEV_CREDENTIALS=1 on a development machine "
                    + "to use one generated under $DATA_DIR")
        }
        return try Self.shared(root: root, fileName: kind.fileName)
    }

    /// Why `value` is not acceptable as a production credential, or nil.
    public static func weakness(_ value: String) -> String? {
        if placeholders.contains(value.lowercased()) { return "is a well-known placeholder ('\(value)')" }
        if value.count < minimumLength { return "is too short (\(value.count) characters)" }
        return nil
    }

    /// `<root>/<fileName>`, made with a new random credential on first use (0600, written whole
    /// then linked into place: the link fails if another process got there first, whose value
    /// wins, and a crash never leaves an empty or partial credential behind).
    static func shared(root: String, fileName: String) throws -> String {
        let path = "\(root)/\(fileName)"
        let fm = FileManager.default
        try fm.createDirectory(atPath: root, withIntermediateDirectories: true)
        if let existing = try? String(contentsOfFile: path, encoding: .utf8), !existing.isEmpty {
            return existing.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        let token = SecureRandom.token(bytes: 32)
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
            throw ValidationError("cannot write the credential \(temporary): \(String(cString: strerror(errno)))")
        }
        if link(temporary, path) == 0 {
            let dir = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            if dir >= 0 { fsync(dir); close(dir) }
            return token
        }
        // Only "already there" means another process made it first; anything else is the error.
        guard errno == EEXIST else {
            throw ValidationError("cannot put the credential at \(path): \(String(cString: strerror(errno)))")
        }
        for _ in 0..<50 {
            if let existing = try? String(contentsOfFile: path, encoding: .utf8), !existing.isEmpty {
                return existing.trimmingCharacters(in: .whitespacesAndNewlines)
            }
            usleep(20_000)
        }
        throw ValidationError("the credential at \(path) is empty or unreadable: remove it (a new one is made)")
    }
}
