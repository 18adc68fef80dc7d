import ArgumentParser
import Foundation
import Logging
import ServiceKitTesting
import Storage
import Testing

@testable import ServiceKit

/// A service database for the commands under test.
enum NotesDatabase: ServiceDatabase {
    static let schema = DatabaseSchema(
        service: "notes", migrations: [Migration(name: "notes.001", sql: "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")])
}

/// A root command wired as every service executable is: serving is the default subcommand.
struct NotesCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "notes-service",
        subcommands: [Run.self, BackupCommand<NotesDatabase>.self, RestoreCommand<NotesDatabase>.self], defaultSubcommand: Run.self)

    struct Run: AsyncParsableCommand {
        @OptionGroup var options: ServiceOptions
        func run() async throws {}
    }
}

@Suite struct DatabaseCommandsTests {
    /// Serving stays what a bare command line does (scripts/run, compose and the tests start the
    /// services with flags only); `backup` and `restore` are found by name.
    @Test func servingIsTheDefaultSubcommand() throws {
        let serve = try NotesCommand.parseAsRoot(["--host", "127.0.0.1", "--port", "0", "--data-dir", "/tmp/notes"])
        let run = try #require(serve as? NotesCommand.Run)
        #expect(run.options.port == 0)
        #expect(run.options.dataDir == "/tmp/notes")
        #expect(try NotesCommand.parseAsRoot(["run", "--port", "7"]) is NotesCommand.Run)
        let backup = try #require(try NotesCommand.parseAsRoot(["backup", "--data-dir", "/d", "--to", "/b"]) as? BackupCommand<NotesDatabase>)
        #expect(backup.dataDir == "/d" && backup.to == "/b")
        #expect(try NotesCommand.parseAsRoot(["restore", "--from", "/b"]) is RestoreCommand<NotesDatabase>)
        #expect(throws: (any Error).self) { try NotesCommand.parseAsRoot(["backup", "--data-dir", "/d"]) }  // --to is required
    }

    /// The data directory of `backup` and `restore` is found as serving finds it.
    @Test func dataDirectoryFallsBackAsServingDoes() {
        #expect(ServiceSettings.dataDirectory(name: "notes", flag: "/flag", environment: ["NOTES_DATA_DIR": "/env"]) == "/flag")
        #expect(ServiceSettings.dataDirectory(name: "notes", flag: nil, environment: ["NOTES_DATA_DIR": "/env", "DATA_DIR": "/root"]) == "/env")
        #expect(ServiceSettings.dataDirectory(name: "notes", flag: nil, environment: ["DATA_DIR": "/root"]) == "/root/notes")
        #expect(ServiceSettings.dataDirectory(name: "notes", flag: nil, environment: [:]) == "./data/notes")
    }

    /// The commands run the storage's backup and restore on the service's database: a backup
    /// of a running database, a restore refused while it runs, then accepted once it stopped.
    @Test func backupAndRestoreRunOnTheServiceDatabase() throws {
        let dir = TemporaryDirectory("db-commands")
        defer { dir.remove() }
        let data = dir.path + "/notes"
        let quiet = Logger(label: "notes") { _ in SwiftLogNoOpLogHandler() }
        let db = try Database.open(directory: data, schema: NotesDatabase.schema, logger: quiet)
        try db.writeSync { tx in try tx.execute("INSERT INTO notes (body) VALUES ('kept')") }

        var backup = try NotesCommand.parseAsRoot(["backup", "--data-dir", data, "--to", dir.path + "/notes.backup"])
        try backup.run()
        try db.writeSync { tx in try tx.execute("INSERT INTO notes (body) VALUES ('after the backup')") }

        var restore = try NotesCommand.parseAsRoot(["restore", "--data-dir", data, "--from", dir.path + "/notes.backup"])
        #expect { try restore.run() } throws: { error in
            guard case BackupError.serviceRunning = error else { return false }
            return true
        }
        db.close()
        try restore.run()
        let restored = try Database.open(directory: data, schema: NotesDatabase.schema, logger: quiet)
        defer { restored.close() }
        #expect(try restored.readSync { c in try c.query("SELECT body FROM notes").map { try $0.get(0, as: String.self) } } == ["kept"])
    }
}
