/// Why `Database.backup` or `Database.restore` refused or failed, for the operator who ran it.
/// A refusal changes nothing: the backup file is not written, the data directory is left as it was.
public enum BackupError: Error, Sendable, Hashable, CustomStringConvertible {
    /// backup: there is no database at this path (wrong `--data-dir`, or the service never ran).
    case noDatabase(path: String)
    /// backup: the backup file exists already; a backup never overwrites one.
    case destinationExists(path: String)
    /// restore: the file is not an SQLite database (garbage, truncated, empty, or encrypted).
    case notADatabase(path: String)
    /// The file fails `PRAGMA integrity_check` (the first problems SQLite reported).
    case integrityCheckFailed(path: String, problems: [String])
    /// The file does not record which service it belongs to, so it cannot be trusted as this
    /// service's database.
    case noServiceRecorded(path: String, expected: String)
    /// The file belongs to another service.
    case wrongService(path: String, expected: String, found: String)
    /// restore: the file was migrated by a newer version of the service.
    case newerSchema(path: String, unknownMigrations: [String])
    /// restore: the service runs on this data directory (it holds the database's lock).
    case serviceRunning(directory: String, holder: String?)
    /// restore: the file given is the database it would replace.
    case sameFile(path: String)
    /// A file could not be read, written, synced or renamed.
    case io(path: String, reason: String)
    /// SQLite's backup of the running database failed.
    case copyFailed(path: String, message: String)

    public var description: String {
        switch self {
        case .noDatabase(let path):
            return "there is no database at \(path): check --data-dir (the service creates its database when it first starts)."
        case .destinationExists(let path):
            return "\(path) exists already: a backup never overwrites a file. Choose a new name (e.g. with the date) or move the old one away."
        case .notADatabase(let path):
            return "\(path) is not an SQLite database (garbage, truncated, empty or encrypted): nothing was restored."
        case .integrityCheckFailed(let path, let problems):
            return
                "\(path) fails PRAGMA integrity_check (\(problems.joined(separator: "; "))): it is damaged. Nothing was written; use another backup."
        case .noServiceRecorded(let path, let expected):
            return
                "\(path) does not record which service it belongs to, so it is not taken as \(expected)'s database. A file made by `\(expected)-service backup` records it; a database records it once a version with backups has opened it (restart the service, then back up)."
        case .wrongService(let path, let expected, let found):
            return "\(path) is a database of the \(found) service, not \(expected): use \(found)-service with it, or a backup of \(expected)."
        case .newerSchema(let path, let unknown):
            return
                "\(path) was migrated by a newer version of this service (migrations this version does not know: \(unknown.joined(separator: ", "))). Restore it with that version, or restore an older backup."
        case .serviceRunning(let directory, let holder):
            let who = holder.map { "process \($0)" } ?? "another process"
            return "the service is running on \(directory) (\(who) holds its database lock): stop it, then restore. Nothing was changed."
        case .sameFile(let path):
            return "\(path) is the database it would replace: give the backup file to restore from."
        case .io(let path, let reason):
            return "\(path): \(reason)"
        case .copyFailed(let path, let message):
            return "the online backup of \(path) failed: \(message). No backup file was written."
        }
    }
}
