internal import CSQLite
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// What a backup wrote or a restore put in place.
public struct DatabaseFileSummary: Sendable, Equatable {
    /// The file written: the backup file, or the restored database.
    public var path: String
    /// The service the file records as its owner.
    public var service: String
    /// The migrations it records, in the order they were applied.
    public var migrations: [String]
    public var bytes: Int64
}

extension Database {
    // MARK: Backup

    /// Copies the database of `schema` in `directory` to `file`, while its service runs and writes.
    ///
    /// SQLite's online backup API (`sqlite3_backup_step(-1)`) copies every page in one step, inside
    /// one read transaction of a connection of our own: in WAL mode that is a snapshot, so the copy
    /// holds exactly the transactions committed before it began (every acknowledged write) and
    /// none half, while the service's writer goes on committing (a reader never blocks the WAL
    /// writer). It never takes the database's process lock, so it runs beside the service; its
    /// connection is read-only, so it cannot change the live file. (`VACUUM INTO` would give the
    /// same snapshot, but rebuilds every table and index on the way: more CPU on the service's
    /// machine for the same guarantee.)
    ///
    /// The copy is written to a temporary file next to `file`, turned into one self-contained file
    /// (rollback-journal mode, no `-wal` beside it), checked (`PRAGMA integrity_check`, and that it
    /// is `schema.service`'s), fsynced, made readable by its owner only (it holds password hashes
    /// and tokens' hashes), then linked into place: `file` appears complete or not at all, and an
    /// existing `file` is never overwritten. Blocking.
    public static func backup(schema: DatabaseSchema, directory: String, to file: String) throws -> DatabaseFileSummary {
        let source = BackupFiles.filePath(directory, schema.fileName)
        guard FileManager.default.fileExists(atPath: source) else { throw BackupError.noDatabase(path: source) }
        guard !FileManager.default.fileExists(atPath: file) else { throw BackupError.destinationExists(path: file) }
        let (folder, name) = BackupFiles.split(file)
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: folder, isDirectory: &isDirectory), isDirectory.boolValue else {
            throw BackupError.io(path: folder, reason: "no such directory for the backup file")
        }
        let temporary = BackupFiles.filePath(folder, ".\(name).tmp-\(getpid())")
        BackupFiles.removeWithSideFiles(temporary)
        do {
            try copyOnline(from: source, to: temporary)
            let (service, migrations) = try inspect(copy: temporary, reportedAs: source)
            guard let service else { throw BackupError.noServiceRecorded(path: source, expected: schema.service) }
            guard service == schema.service else { throw BackupError.wrongService(path: source, expected: schema.service, found: service) }
            chmod(temporary, 0o600)
            try BackupFiles.syncFile(temporary)
            // link, not rename: it fails when `file` appeared meanwhile instead of replacing it.
            if link(temporary, file) != 0 {
                let err = errno
                if err == EEXIST { throw BackupError.destinationExists(path: file) }
                throw BackupError.io(path: file, reason: "cannot create the backup file: \(String(cString: strerror(err)))")
            }
            unlink(temporary)
            try BackupFiles.syncDirectory(folder)
            return DatabaseFileSummary(path: file, service: service, migrations: migrations, bytes: BackupFiles.size(file))
        } catch {
            BackupFiles.removeWithSideFiles(temporary)
            throw error
        }
    }

    /// One `sqlite3_backup_step(-1)`: the whole copy in one read transaction of the source.
    private static func copyOnline(from source: String, to destination: String) throws {
        let from = try Connection(path: source, readOnly: true)
        defer { from.close() }
        // A WAL reader waits only for brief locks (another connection recovering the WAL index).
        sqlite3_busy_timeout(from.handle, 5000)
        let to = try Connection(path: destination)
        defer { to.close() }
        guard let backup = sqlite3_backup_init(to.handle, "main", from.handle, "main") else {
            throw BackupError.copyFailed(path: source, message: String(cString: sqlite3_errmsg(to.handle)))
        }
        var rc = sqlite3_backup_step(backup, -1)
        // BUSY/LOCKED: a lock SQLite could not get within the busy timeout; nothing was copied
        // yet, so trying again is safe. Bounded: a database held that long is a problem to report.
        var attempts = 0
        while (rc & 0xFF == SQLITE_BUSY || rc & 0xFF == SQLITE_LOCKED) && attempts < 5 {
            attempts += 1
            usleep(200_000)
            rc = sqlite3_backup_step(backup, -1)
        }
        let finished = sqlite3_backup_finish(backup)
        guard rc == SQLITE_DONE, finished == SQLITE_OK else {
            let code = rc == SQLITE_DONE ? finished : rc
            if code & 0xFF == SQLITE_NOTADB { throw BackupError.notADatabase(path: source) }
            if code & 0xFF == SQLITE_CORRUPT {
                throw BackupError.integrityCheckFailed(path: source, problems: [String(cString: sqlite3_errstr(code))])
            }
            throw BackupError.copyFailed(path: source, message: "\(String(cString: sqlite3_errmsg(to.handle))) (code \(code))")
        }
    }

    // MARK: Restore

    /// Replaces the database of `schema` in `directory` with the backup `file`, atomically.
    ///
    /// Refused — with nothing in the data directory changed — when `file` is not an SQLite
    /// database or fails `PRAGMA integrity_check`, records no service or another service, or was
    /// migrated by a newer version (a migration name `schema` does not list: the rule `open`
    /// applies); and when the service runs on `directory` (its process lock is held). The lock is
    /// held for the whole restore, so the service cannot start halfway through.
    ///
    /// `file` is copied to a temporary file in the data directory and the checks run on that copy
    /// (what is checked is what is put in place); it is fsynced, the old database's `-wal`, `-shm`
    /// and `-journal` are removed (SQLite would replay an old WAL or journal into the new file),
    /// and the copy is renamed over the database, the directory fsynced after each step. An older
    /// schema is accepted: the service applies the migrations it lacks when it starts. Blocking.
    public static func restore(schema: DatabaseSchema, directory: String, from file: String) throws -> DatabaseFileSummary {
        // The file first: a wrong argument must not touch the data directory.
        try BackupFiles.checkHeader(file)
        let target = BackupFiles.filePath(directory, schema.fileName)
        if let a = BackupFiles.realPath(file), let b = BackupFiles.realPath(target), a == b { throw BackupError.sameFile(path: file) }

        var isDirectory: ObjCBool = false
        let existed = FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory)
        if existed && !isDirectory.boolValue { throw BackupError.io(path: directory, reason: "is not a directory") }
        // The directories this restore creates (innermost first), removed again if it refuses.
        let created = existed ? [] : BackupFiles.missingDirectories(directory)
        func removeCreated() { for made in created { rmdir(made) } }
        if !existed {
            do {
                try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            } catch {
                removeCreated()
                throw BackupError.io(path: directory, reason: "cannot create the data directory (\(error.localizedDescription))")
            }
        }
        let lock: FileLock
        do {
            lock = try FileLock.acquire(path: target + ".lock", databasePath: target)
        } catch StorageError.locked(_, let holder) {
            throw BackupError.serviceRunning(directory: directory, holder: holder)
        } catch {
            if !existed { unlink(target + ".lock") }
            removeCreated()
            throw error
        }
        defer { lock.release() }

        // Under the lock no other restore runs here: what an interrupted one left can go.
        let prefix = ".\(schema.fileName).restore-"
        for name in (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? [] where name.hasPrefix(prefix) {
            unlink(BackupFiles.filePath(directory, name))
        }
        let temporary = BackupFiles.filePath(directory, prefix + "\(getpid())")
        do {
            var status = stat()
            if lstat(target, &status) == 0 && status.st_mode & S_IFMT != S_IFREG {
                throw BackupError.io(path: target, reason: "is not a regular file: move it away first")
            }
            try BackupFiles.copyFile(from: file, to: temporary)
            let (service, migrations) = try inspect(copy: temporary, reportedAs: file)
            guard let service else { throw BackupError.noServiceRecorded(path: file, expected: schema.service) }
            guard service == schema.service else { throw BackupError.wrongService(path: file, expected: schema.service, found: service) }
            let known = Set(schema.migrations.map(\.name))
            let unknown = migrations.filter { !known.contains($0) }
            guard unknown.isEmpty else { throw BackupError.newerSchema(path: file, unknownMigrations: unknown) }
            try BackupFiles.syncFile(temporary)

            // The swap. The old database's side files go first: an old WAL or journal must never
            // meet the new file (SQLite would apply it to the wrong pages). A crash between here
            // and the rename leaves the old database without its last uncheckpointed commits,
            // which this restore was replacing anyway: running it again completes it.
            for side in BackupFiles.sideFiles(target) where unlink(side) != 0 {
                let err = errno
                guard err == ENOENT else {
                    throw BackupError.io(path: side, reason: "cannot remove the old database's side file: \(String(cString: strerror(err)))")
                }
            }
            try BackupFiles.syncDirectory(directory)
            guard rename(temporary, target) == 0 else {
                throw BackupError.io(path: target, reason: "cannot rename the restored copy into place: \(String(cString: strerror(errno)))")
            }
            try BackupFiles.syncDirectory(directory)
            return DatabaseFileSummary(path: target, service: service, migrations: migrations, bytes: BackupFiles.size(target))
        } catch {
            BackupFiles.removeWithSideFiles(temporary)
            if !existed {
                // The directory is ours: leave nothing behind. The lock file goes before the lock
                // is released, so a process starting meanwhile locks a file of its own (and its
                // files keep the directory: rmdir only removes empty ones).
                unlink(target + ".lock")
                lock.release()
                removeCreated()
            }
            throw error
        }
    }

    // MARK: Checking a copy

    /// Checks a copy the caller owns and may rewrite: makes it one self-contained file
    /// (`journal_mode=DELETE`: a copy of a WAL database says "WAL" in its header, and would grow
    /// `-wal`/`-shm` files wherever it is opened), runs `PRAGMA integrity_check`, and reads whose
    /// it is and its migrations. Errors name `reportedAs`, the file the operator gave.
    private static func inspect(copy: String, reportedAs file: String) throws -> (service: String?, migrations: [String]) {
        do {
            let connection = try Connection(path: copy)
            defer { connection.close() }
            let mode = try connection.queryOne("PRAGMA journal_mode=DELETE").flatMap { try $0.get(0, as: String?.self) }
            guard mode?.lowercased() == "delete" else {
                throw BackupError.io(path: file, reason: "cannot make the copy a single file (journal mode \(mode ?? "unknown"))")
            }
            let problems = try connection.query("PRAGMA integrity_check").map { try $0.get(0, as: String?.self) ?? "" }
            guard problems == ["ok"] else { throw BackupError.integrityCheckFailed(path: file, problems: Array(problems.prefix(5))) }
            return (try recordedService(connection), try recordedMigrations(connection))
        } catch StorageError.notADatabase {
            throw BackupError.notADatabase(path: file)
        } catch StorageError.corrupt(_, let message) {
            throw BackupError.integrityCheckFailed(path: file, problems: [message])
        }
    }
}

/// The file operations of backup and restore (POSIX calls: outside `Database`, whose `open`,
/// `read`, `write` and `close` would shadow them).
enum BackupFiles {
    /// Refuses what is not an SQLite database file before anything else is done.
    static func checkHeader(_ file: String) throws {
        var status = stat()
        guard stat(file, &status) == 0 else {
            throw BackupError.io(path: file, reason: "cannot read it: \(String(cString: strerror(errno)))")
        }
        guard status.st_mode & S_IFMT == S_IFREG else { throw BackupError.io(path: file, reason: "is not a regular file") }
        let fd = open(file, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw BackupError.io(path: file, reason: "cannot read it: \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var header = [UInt8](repeating: 0, count: 16)
        let n = header.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, 0) }
        guard n == 16, header == Array("SQLite format 3\0".utf8) else { throw BackupError.notADatabase(path: file) }
    }

    static func filePath(_ directory: String, _ name: String) -> String {
        directory.hasSuffix("/") ? directory + name : directory + "/" + name
    }

    /// The directory (`.` when none is given) and the name of a path.
    static func split(_ file: String) -> (directory: String, name: String) {
        guard let slash = file.lastIndex(of: "/") else { return (".", file) }
        let directory = String(file[..<slash])
        return (directory.isEmpty ? "/" : directory, String(file[file.index(after: slash)...]))
    }

    /// `directory` and those of its ancestors that do not exist, innermost first.
    static func missingDirectories(_ directory: String) -> [String] {
        var missing: [String] = []
        var path = directory
        while !path.isEmpty, path != "/", path != ".", !FileManager.default.fileExists(atPath: path) {
            missing.append(path)
            let parent = split(path).directory
            if parent == path { break }
            path = parent
        }
        return missing
    }

    /// The files SQLite keeps next to a database.
    static func sideFiles(_ path: String) -> [String] { [path + "-wal", path + "-shm", path + "-journal"] }

    static func removeWithSideFiles(_ path: String) {
        for file in [path] + sideFiles(path) { unlink(file) }
    }

    static func realPath(_ path: String) -> String? {
        guard let resolved = realpath(path, nil) else { return nil }
        defer { free(resolved) }
        return String(cString: resolved)
    }

    static func size(_ path: String) -> Int64 {
        var status = stat()
        return stat(path, &status) == 0 ? Int64(status.st_size) : 0
    }

    /// Copies `source` to a new file `destination` (mode 0600); the caller syncs it.
    static func copyFile(from source: String, to destination: String) throws {
        let input = open(source, O_RDONLY | O_CLOEXEC)
        guard input >= 0 else { throw BackupError.io(path: source, reason: "cannot read it: \(String(cString: strerror(errno)))") }
        defer { close(input) }
        let output = open(destination, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard output >= 0 else {
            throw BackupError.io(path: destination, reason: "cannot create the restored copy: \(String(cString: strerror(errno)))")
        }
        defer { close(output) }
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        while true {
            let n = buffer.withUnsafeMutableBytes { read(input, $0.baseAddress, $0.count) }
            if n == 0 { return }
            if n < 0 {
                if errno == EINTR { continue }
                throw BackupError.io(path: source, reason: "cannot read it: \(String(cString: strerror(errno)))")
            }
            var written = 0
            while written < n {
                let w = buffer.withUnsafeBytes { write(output, $0.baseAddress! + written, n - written) }
                if w < 0 {
                    if errno == EINTR { continue }
                    throw BackupError.io(path: destination, reason: "cannot write the restored copy: \(String(cString: strerror(errno)))")
                }
                written += w
            }
        }
    }

    static func syncFile(_ path: String) throws {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0, fsync(fd) == 0 else {
            let reason = String(cString: strerror(errno))
            if fd >= 0 { close(fd) }
            throw BackupError.io(path: path, reason: "cannot fsync it: \(reason)")
        }
        close(fd)
    }

    /// Makes a rename or link in `directory` durable.
    static func syncDirectory(_ directory: String) throws {
        let fd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw BackupError.io(path: directory, reason: "cannot open the directory: \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        // EINVAL: a file system that cannot sync directories (its renames are as durable as it gets).
        guard fsync(fd) == 0 || errno == EINVAL else {
            throw BackupError.io(path: directory, reason: "cannot fsync the directory: \(String(cString: strerror(errno)))")
        }
    }
}
