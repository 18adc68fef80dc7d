import ContractTesting
import Foundation
import ServiceCluster
import Testing

/// `backup` and `restore` of every service executable but accounts' (which
/// AccountsTests/BackupProcessTests runs under load): the real social-, finance-, tasks- and
/// matchmaking-service. Each serves on a fresh data directory (its migrations applied); `backup
/// --data-dir D --to F` copies it while it runs; `restore` puts the copy in an empty directory, where
/// SQLite's own integrity_check passes, every migration is there, and the service starts and stops
/// cleanly; and each refuses another service's backup, saying whose it is, leaving nothing behind.
@Suite(.serialized) struct BackupEveryServiceTests {
    static let services = ["social", "finance", "tasks", "matchmaking"]

    static func run(_ executable: String, _ arguments: [String]) async throws -> (status: Int32, output: String) {
        let r = try await Subprocess.capture(executable, arguments, input: [])
        return (r.status, String(decoding: r.stdout + r.stderr, as: UTF8.self))
    }

    /// One query through Debian's sqlite3 (an SQLite independent of the one we link).
    static func sqlite(_ file: String, _ sql: String) async throws -> String {
        let r = try await run("/usr/bin/sqlite3", ["-readonly", file, sql])
        #expect(r.status == 0, "\(r.output)")
        return r.output.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    @Test func everyServiceBacksUpWhileServingAndRestoresOnlyItsOwnDatabase() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("backup-every-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        var backups: [String: String] = [:]
        var migrations: [String: String] = [:]

        for name in Self.services {
            let executable = ServiceProcess.builtProduct("\(name)-service")
            let data = "\(dir)/\(name)"
            let service = try ServiceProcess("\(name)-service", name: name, dataDir: data)
            defer { service.forceStop() }
            _ = try await service.waitUntilListening()
            migrations[name] = try await Self.sqlite("\(data)/\(name).sqlite", "SELECT group_concat(name, ',') FROM schema_migrations")

            // While it serves.
            let backup = "\(dir)/\(name).backup"
            let taken = try await Self.run(executable, ["backup", "--data-dir", data, "--to", backup])
            #expect(taken.status == 0, "\(name): \(taken.output)")
            #expect(taken.output.contains("backed up the \(name) database") && taken.output.contains("integrity ok"), "\(taken.output)")
            backups[name] = backup
            service.signal(SIGTERM)
            #expect(await service.waitForExit() == 0, "\(name)")

            let restoredDir = "\(dir)/\(name)-restored"
            let restored = try await Self.run(executable, ["restore", "--data-dir", restoredDir, "--from", backup])
            #expect(restored.status == 0, "\(name): \(restored.output)")
            #expect(restored.output.contains("restored the \(name) database"), "\(restored.output)")
            let file = "\(restoredDir)/\(name).sqlite"
            #expect(try await Self.sqlite(file, "PRAGMA integrity_check") == "ok", "\(name)")
            let applied = try await Self.sqlite(file, "SELECT group_concat(name, ',') FROM schema_migrations")
            #expect(!applied.isEmpty && applied == migrations[name], "\(name): \(applied) vs \(migrations[name] ?? "")")

            // The service serves the restored copy.
            let again = try ServiceProcess("\(name)-service", name: name, dataDir: restoredDir)
            defer { again.forceStop() }
            _ = try await again.waitUntilListening()
            again.signal(SIGTERM)
            #expect(await again.waitForExit() == 0, "\(name) on its restored data")
        }

        // Another service's backup, into each service's (stopped) data directory: refused, naming
        // the service it belongs to, and the database left as it was.
        for (i, name) in Self.services.enumerated() {
            let other = Self.services[(i + 1) % Self.services.count]
            let data = "\(dir)/\(name)"
            let before = try await Self.sqlite("\(data)/\(name).sqlite", "SELECT count(*) FROM schema_migrations")
            let wrong = try await Self.run(
                ServiceProcess.builtProduct("\(name)-service"), ["restore", "--data-dir", data, "--from", try #require(backups[other])])
            #expect(wrong.status != 0, "\(name) restored \(other)'s backup")
            #expect(wrong.output.contains("is a database of the \(other) service, not \(name)"), "\(name): \(wrong.output)")
            #expect(try await Self.sqlite("\(data)/\(name).sqlite", "SELECT count(*) FROM schema_migrations") == before, "\(name)")
            #expect(try await Self.sqlite("\(data)/\(name).sqlite", "PRAGMA integrity_check") == "ok", "\(name)")
        }
    }
}
