import ArgumentParser
import Foundation
import Storage

/// A service's database as its executable's `backup` and `restore` subcommands see it: which
/// service, which file, which migrations this version knows. Each service's schema conforms.
public protocol ServiceDatabase {
    static var schema: DatabaseSchema { get }
}

/// `<service>-service backup [--data-dir DIR] --to FILE`: a consistent copy of the database,
/// taken while the service runs and writes (`Database.backup`). Every executable lists it as a
/// subcommand; serving stays the default one.
public struct BackupCommand<Service: ServiceDatabase>: ParsableCommand {
    public static var configuration: CommandConfiguration {
        CommandConfiguration(
            commandName: "backup",
            abstract: "Copy the \(Service.schema.service) database to a file, consistently, while the service runs.",
            discussion: """
                The copy holds every write acknowledged before the backup began, passes PRAGMA \
                integrity_check, is readable by its owner only, and never overwrites an existing file. \
                The running service is not stopped or locked out (docs/operations.md, "Backups").
                """)
    }

    @Option(
        name: .customLong("data-dir"),
        help: "The service's data directory (env <SERVICE>_DATA_DIR, else $DATA_DIR/<service>, else ./data/<service>).")
    var dataDir: String?
    @Option(name: .customLong("to"), help: "The backup file to write (a new file; its directory must exist).")
    var to: String

    public init() {}

    public func run() throws {
        let schema = Service.schema
        let directory = ServiceSettings.dataDirectory(name: schema.service, flag: dataDir)
        let summary = try Database.backup(schema: schema, directory: directory, to: to)
        print(
            "backed up the \(schema.service) database of \(directory) to \(summary.path): \(summary.bytes) bytes, "
                + "\(summary.migrations.count) migrations, integrity ok")
    }
}

/// `<service>-service restore [--data-dir DIR] --from FILE`: replaces the database with a backup,
/// atomically, after checking it is this service's, not from a newer version, and sound; refused
/// while the service runs (`Database.restore`).
public struct RestoreCommand<Service: ServiceDatabase>: ParsableCommand {
    public static var configuration: CommandConfiguration {
        CommandConfiguration(
            commandName: "restore",
            abstract: "Replace the \(Service.schema.service) database with a backup file (the service must be stopped).",
            discussion: """
                Refused, with nothing changed, when the file is not an SQLite database or fails PRAGMA \
                integrity_check, belongs to another service, was migrated by a newer version, or when \
                the service runs on the data directory (docs/operations.md, "Backups").
                """)
    }

    @Option(
        name: .customLong("data-dir"),
        help: "The service's data directory (env <SERVICE>_DATA_DIR, else $DATA_DIR/<service>, else ./data/<service>).")
    var dataDir: String?
    @Option(name: .customLong("from"), help: "The backup file to restore.")
    var from: String

    public init() {}

    public func run() throws {
        let schema = Service.schema
        let directory = ServiceSettings.dataDirectory(name: schema.service, flag: dataDir)
        let summary = try Database.restore(schema: schema, directory: directory, from: from)
        let missing = schema.migrations.count - summary.migrations.count
        let later = missing > 0 ? "; the service applies the \(missing) later migrations of this version when it starts" : ""
        print(
            "restored the \(schema.service) database \(summary.path) from \(from): \(summary.bytes) bytes, "
                + "\(summary.migrations.count) migrations, integrity ok\(later)")
    }
}
