import ContractTesting
import Foundation
import RPCCore
import ServiceKitTesting
import Synchronization

/// A service executable (`finance-service`, …) as a child process under `timeout -s KILL` (it
/// stops by itself even if the test runner dies). Started through `posix_spawn` (ContractTesting's
/// `Subprocess`), never `Foundation.Process`, which can crash the test process when two start at
/// once; its environment is set by `env(1)`, its output goes to a file scanned for "listening on".
/// Its peers are normally a cluster's services (`ServiceProcess.peerEnvironment`).
public final class ServiceProcess: Sendable {
    public let name: String
    public let dataDir: String
    public let logPath: String
    public let spawned: pid_t
    private let exitStatus = Mutex<Int32?>(nil)
    private let servicePid = Mutex<Int32?>(nil)

    /// Starts `executable` (next to the test binary) with the test credentials, `environment`
    /// on top, and `arguments` (default: `--host 127.0.0.1 --port 0 --data-dir <dataDir>`).
    /// `name` is the service's name (its lock file is `<dataDir>/<name>.sqlite.lock`).
    public init(
        _ executable: String, name: String, dataDir: String, environment: [String: String] = [:], arguments: [String]? = nil
    ) throws {
        self.name = name
        self.dataDir = dataDir
        try? FileManager.default.createDirectory(atPath: dataDir, withIntermediateDirectories: true)
        logPath = dataDir + "-\(UUID().uuidString.prefix(8)).log"
        var env = [
            "SERVICE_TOKEN": TestCredentials.serviceToken, "GATEWAY_TOKEN": TestCredentials.gatewayToken,
            "ALLOW_DEV_CREDENTIALS": "1", "LOG_LEVEL": "info",
        ]
        for (k, v) in environment { env[k] = v }
        let assignments = env.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }
        spawned = try Subprocess.spawn(
            "/usr/bin/env",
            assignments + ["/usr/bin/timeout", "-s", "KILL", "300", Self.builtProduct(executable)]
                + (arguments ?? ["--host", "127.0.0.1", "--port", "0", "--data-dir", dataDir]),
            stdinPath: "/dev/null", stdoutPath: logPath, stderrPath: logPath)
    }

    /// `<PEER>_ADDR` for every service of `cluster` (as its peers reach them: proxies included),
    /// and a port where nothing answers for the services it does not run.
    public static func peerEnvironment(_ cluster: ServiceCluster) -> [String: String] {
        var env: [String: String] = [:]
        for s in ClusterService.allCases {
            env[s.rawValue.uppercased() + "_ADDR"] = "127.0.0.1:\(cluster.peerPortOrNowhere(s))"
        }
        return env
    }

    /// Everything the child wrote (stdout and stderr).
    public var log: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }

    /// Whether the child (timeout) still runs; records its exit status once it ended.
    public var isRunning: Bool {
        if exitStatus.withLock({ $0 }) != nil { return false }
        var status: Int32 = 0
        let r = waitpid(spawned, &status, WNOHANG)
        guard r == spawned else { return r == 0 }
        let signal = status & 0x7f
        exitStatus.withLock { $0 = signal == 0 ? (status >> 8) & 0xff : 128 + signal }
        return false
    }

    /// The port from its "listening on 127.0.0.1:N" line.
    public func waitUntilListening(timeout: Duration = .seconds(30)) async throws -> Int {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            let text = log
            if let range = text.range(of: #"listening on 127\.0\.0\.1:(\d+)"#, options: .regularExpression) {
                let match = text[range]
                let pid = (try? String(contentsOfFile: "\(dataDir)/\(name).sqlite.lock", encoding: .utf8)).flatMap {
                    Int32($0.trimmingCharacters(in: .whitespacesAndNewlines))
                }
                servicePid.withLock { $0 = pid }
                return Int(match[match.index(after: match.lastIndex(of: ":")!)...])!
            }
            if !isRunning { break }
            try await Task.sleep(for: .milliseconds(20))
        }
        throw RPCError(.unavailable, "\(name) did not start:\n\(log)")
    }

    /// The service's own pid (from its lock file), once it listens.
    public var pid: Int32? { servicePid.withLock { $0 } }

    /// Signals the service itself (not `timeout`).
    public func signal(_ sig: Int32) { if let pid, isRunning, pid != getpid() { kill(pid, sig) } }

    /// Its exit status (128 + signal when killed), or nil when it still runs after `timeout`.
    public func waitForExit(timeout: Duration = .seconds(30)) async -> Int32? {
        let deadline = ContinuousClock.now + timeout
        while isRunning && ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(20)) }
        return exitStatus.withLock { $0 }
    }

    /// Kills it (and `timeout`), reaps it and removes the log.
    public func forceStop() {
        signal(SIGKILL)
        if isRunning { kill(spawned, SIGTERM) }  // no pid yet: timeout passes SIGTERM on
        _ = isRunning
        try? FileManager.default.removeItem(atPath: logPath)
    }

    /// A file next to the test binary (the executables SwiftPM built with the tests).
    public static func builtProduct(_ name: String) -> String {
        let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        var dir = URL(fileURLWithPath: exe).deletingLastPathComponent()
        while dir.path.contains(".xctest") { dir = dir.deletingLastPathComponent() }
        return dir.appendingPathComponent(name).path
    }
}
