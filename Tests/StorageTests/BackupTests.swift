import Foundation
import Synchronization
import Testing

@testable import Storage

/// `Database.backup` beside a running writer, and `Database.restore` with everything it refuses.
/// Every assertion is on content (rows, integrity, files), none on time.
@Suite(.serialized) struct BackupTests {
    static let notes = DatabaseSchema(service: "notes", migrations: testMigrations)
    /// What `storage-crash-helper` opens.
    static let crash = DatabaseSchema(
        service: "crash", migrations: [Migration(name: "001-acks", sql: "CREATE TABLE acks (id INTEGER PRIMARY KEY, payload BLOB NOT NULL)")])

    /// Reads a backup file without writing anything next to it (it is a rollback-journal file).
    static func inspect<T>(_ path: String, _ body: (Connection) throws -> T) throws -> T {
        let c = try Connection(path: path, readOnly: true)
        defer { c.close() }
        return try body(c)
    }

    static func integrity(_ c: Connection) throws -> [String] {
        try c.query("PRAGMA integrity_check").map { try $0.get(0, as: String.self) }
    }

    /// The files of a directory and their bytes, lock files aside (a restore that took the lock
    /// leaves its pid there; the file only names the last process that held it).
    static func contents(_ directory: String) -> [String: Data] {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
        var result: [String: Data] = [:]
        for name in names where !name.hasSuffix(".lock") {
            result[name] = FileManager.default.contents(atPath: directory + "/" + name) ?? Data()
        }
        return result
    }

    /// A database of `schema` in `directory` with `count` users, closed.
    static func makeDatabase(_ directory: String, _ schema: DatabaseSchema = notes, users count: Int = 3, from first: Int = 1) throws {
        let db = try Database.openQuiet(directory: directory, schema: schema)
        defer { db.close() }
        try db.writeSync { tx in
            for i in first..<(first + count) { try tx.execute("INSERT INTO users (id, email) VALUES (?, ?)", i, "u\(i)@example.com") }
        }
    }

    // MARK: Backup

    /// Another process (it holds the database's lock) commits row after row; the backup copies
    /// the database meanwhile. The copy passes integrity_check, holds every row acknowledged
    /// before it began, and is a prefix of the commits (no gap, nothing half); the writer goes
    /// on committing past the copy's last row.
    @Test func backupWhileAnotherProcessCommits() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let child = try ChildProcess(crashHelperPath(), [dir.file("data"), "full"])
        defer { child.kill() }
        let before = child.readLines { $0 == "ack 200" }
        try #require(before.last == "ack 200", "child output: \(before.suffix(3))")

        let summary = try Database.backup(schema: Self.crash, directory: dir.file("data"), to: dir.file("crash-backup.sqlite"))
        #expect(summary.service == "crash")
        #expect(summary.migrations == ["001-acks"])
        let (integrity, count, maxID) = try Self.inspect(summary.path) { c in
            (
                try Self.integrity(c), try c.queryOne("SELECT count(*) FROM acks")!.get(0, as: Int.self),
                try c.queryOne("SELECT max(id) FROM acks")!.get(0, as: Int.self)
            )
        }
        #expect(integrity == ["ok"])
        #expect(maxID >= 200)
        #expect(count == maxID)
        // Not held up by the backup: it commits rows the copy does not have.
        let after = child.readLines { $0 == "ack \(maxID + 50)" }
        #expect(after.last == "ack \(maxID + 50)")
        // A backup is one self-contained file, its owner's only.
        #expect(!FileManager.default.fileExists(atPath: summary.path + "-wal"))
        let mode = try FileManager.default.attributesOfItem(atPath: summary.path)[.posixPermissions] as? Int
        #expect(mode == 0o600)
        print("backup beside a writing process: \(count) rows in the copy (200 acknowledged before it began)")
    }

    /// The same beside a writer of this process: the backup does not need the process lock this
    /// process holds, and the writes go on while it copies.
    @Test func backupWhileThisProcessCommits() async throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let db = try Database.openQuiet(directory: dir.file("data"), schema: Self.notes)
        defer { db.close() }
        let acknowledged = Atomic<Int>(0)
        let writer = Task {
            var i = 0
            while !Task.isCancelled {
                i += 1
                let id = i
                try await db.write { tx in try tx.execute("INSERT INTO users (id, email) VALUES (?, ?)", id, "u\(id)@example.com") }
                acknowledged.store(id, ordering: .releasing)
            }
        }
        defer { writer.cancel() }
        while acknowledged.load(ordering: .acquiring) < 100 { try await Task.sleep(for: .milliseconds(1)) }
        let acknowledgedBefore = acknowledged.load(ordering: .acquiring)

        let summary = try Database.backup(schema: Self.notes, directory: dir.file("data"), to: dir.file("notes-backup.sqlite"))
        let (integrity, count, maxID) = try Self.inspect(summary.path) { c in
            (
                try Self.integrity(c), try c.queryOne("SELECT count(*) FROM users")!.get(0, as: Int.self),
                try c.queryOne("SELECT max(id) FROM users")!.get(0, as: Int.self)
            )
        }
        #expect(integrity == ["ok"])
        #expect(maxID >= acknowledgedBefore)
        #expect(count == maxID)
        while acknowledged.load(ordering: .acquiring) < maxID + 50 { try await Task.sleep(for: .milliseconds(1)) }
        writer.cancel()
        _ = try? await writer.value
    }

    @Test func backupRefusesWhatItCannotVouchFor() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        // No database there.
        #expect(throws: BackupError.noDatabase(path: dir.file("empty/notes.sqlite"))) {
            try Database.backup(schema: Self.notes, directory: dir.file("empty"), to: dir.file("b.sqlite"))
        }
        try Self.makeDatabase(dir.file("data"))
        // An existing file is never overwritten.
        _ = FileManager.default.createFile(atPath: dir.file("taken.sqlite"), contents: Data("keep me".utf8))
        #expect(throws: BackupError.destinationExists(path: dir.file("taken.sqlite"))) {
            try Database.backup(schema: Self.notes, directory: dir.path + "/data", to: dir.file("taken.sqlite"))
        }
        #expect(FileManager.default.contents(atPath: dir.file("taken.sqlite")) == Data("keep me".utf8))
        // Another service's database in this service's place.
        let impostor = DatabaseSchema(service: "impostor", fileName: "notes.sqlite", migrations: testMigrations)
        #expect(throws: BackupError.wrongService(path: dir.file("data/notes.sqlite"), expected: "impostor", found: "notes")) {
            try Database.backup(schema: impostor, directory: dir.file("data"), to: dir.file("b.sqlite"))
        }
        // A database that records no owner (never opened by a version that records it).
        try Database.openQuiet(directory: dir.file("old"), fileName: "notes.sqlite", migrations: testMigrations).close()
        #expect(throws: BackupError.noServiceRecorded(path: dir.file("old/notes.sqlite"), expected: "notes")) {
            try Database.backup(schema: Self.notes, directory: dir.file("old"), to: dir.file("b.sqlite"))
        }
        // No file and no temporary left behind by any refusal.
        #expect(Set(try FileManager.default.contentsOfDirectory(atPath: dir.path)) == ["data", "old", "taken.sqlite"])
    }

    // MARK: Restore

    /// A restore over a database its crashed process left with a WAL full of commits: the old
    /// `-wal`/`-shm` are removed before the copy takes the database's name (replayed into the
    /// restored file they would corrupt it), and the database holds exactly the backup.
    @Test func restoreReplacesTheDatabaseAndDropsTheOldWAL() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        // The backup: five rows of its own.
        let source = try Database.openQuiet(directory: dir.file("source"), schema: Self.crash)
        try source.writeSync { tx in
            for i in 1...5 { try tx.execute("INSERT INTO acks (id, payload) VALUES (?, ?)", i, [UInt8](repeating: 1, count: 16)) }
        }
        let backup = try Database.backup(schema: Self.crash, directory: dir.file("source"), to: dir.file("backup.sqlite"))
        source.close()

        // The data directory: a writer killed mid-stream, its commits still in the WAL.
        let child = try ChildProcess(crashHelperPath(), [dir.file("data"), "full"])
        let lines = child.readLines { $0 == "ack 300" }
        child.kill(SIGKILL)
        try #require(lines.last == "ack 300")
        let wal = dir.file("data/crash.sqlite-wal")
        try #require(BackupFiles.size(wal) > 0)

        // What an interrupted restore left (another pid's temporary copy) goes too.
        _ = FileManager.default.createFile(atPath: dir.file("data/.crash.sqlite.restore-1"), contents: Data("partial".utf8))
        let restored = try Database.restore(schema: Self.crash, directory: dir.file("data"), from: backup.path)
        #expect(restored.path == dir.file("data/crash.sqlite"))
        #expect(restored.migrations == ["001-acks"])
        #expect(!FileManager.default.fileExists(atPath: wal))
        #expect(!FileManager.default.fileExists(atPath: dir.file("data/crash.sqlite-shm")))
        // No temporary left, and the backup itself is untouched.
        #expect(Set(try FileManager.default.contentsOfDirectory(atPath: dir.file("data"))) == ["crash.sqlite", "crash.sqlite.lock"])
        #expect(try Self.inspect(backup.path) { try $0.queryOne("SELECT count(*) FROM acks")!.get(0, as: Int.self) } == 5)

        let db = try Database.openQuiet(directory: dir.file("data"), schema: Self.crash)
        defer { db.close() }
        let (ids, integrity) = try db.readSync { c in
            (try c.query("SELECT id FROM acks ORDER BY id").map { try $0.get(0, as: Int.self) }, try Self.integrity(c))
        }
        #expect(ids == [1, 2, 3, 4, 5])
        #expect(integrity == ["ok"])
    }

    /// A backup of an older version restores, into a new data directory too, and the service
    /// applies the migrations it lacks when it opens it.
    @Test func restoreAcceptsAnOlderSchemaIntoANewDirectory() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let older = DatabaseSchema(service: "notes", migrations: [testMigrations[0]])
        try Self.makeDatabase(dir.file("old"), older, users: 2)
        let backup = try Database.backup(schema: older, directory: dir.file("old"), to: dir.file("old.sqlite"))
        let restored = try Database.restore(schema: Self.notes, directory: dir.file("new/notes"), from: backup.path)
        #expect(restored.migrations == ["001-users"])
        let db = try Database.openQuiet(directory: dir.file("new/notes"), schema: Self.notes)
        defer { db.close() }
        #expect(try db.appliedMigrations() == ["001-users", "002-notes"])
        #expect(try db.readSync { c in try c.queryOne("SELECT count(*) FROM users")!.get(0, as: Int.self) } == 2)
    }

    /// Everything restore refuses, each with its own error, and nothing in the data directory
    /// changed: not the database, not its WAL, no temporary left; a data directory that did not
    /// exist still does not.
    @Test func restoreRefusesAndChangesNothing() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let data = dir.file("data")
        try Self.makeDatabase(data, users: 3)
        let good = try Database.backup(schema: Self.notes, directory: data, to: dir.file("good.sqlite")).path
        let original = Self.contents(data)
        try #require(original["notes.sqlite"] != nil)

        func refused(_ file: String, into directory: String? = nil, schema: DatabaseSchema = BackupTests.notes, _ expected: BackupError) {
            let target = directory ?? data
            let existedBefore = FileManager.default.fileExists(atPath: target)
            let before = Self.contents(target)
            #expect(throws: expected) { try Database.restore(schema: schema, directory: target, from: file) }
            if existedBefore {
                #expect(Self.contents(target) == before, "\(expected)")
            } else {
                #expect(!FileManager.default.fileExists(atPath: target), "\(expected)")
            }
        }

        // Not a database: garbage, empty, a database's name on a text file.
        let garbage = dir.file("garbage.sqlite")
        _ = FileManager.default.createFile(atPath: garbage, contents: Data((0..<8192).map { _ in UInt8.random(in: 0...255) }))
        refused(garbage, .notADatabase(path: garbage))
        let empty = dir.file("empty.sqlite")
        _ = FileManager.default.createFile(atPath: empty, contents: Data())
        refused(empty, .notADatabase(path: empty))
        refused(empty, into: dir.file("fresh"), .notADatabase(path: empty))

        // An SQLite header over damaged pages: fails integrity_check.
        var bytes = try Data(contentsOf: URL(fileURLWithPath: good))
        for i in 4096..<bytes.count { bytes[i] = 0xFF }
        let damaged = dir.file("damaged.sqlite")
        try bytes.write(to: URL(fileURLWithPath: damaged))
        #expect {
            try Database.restore(schema: Self.notes, directory: data, from: damaged)
        } throws: { error in
            guard case BackupError.integrityCheckFailed(let path, let problems) = error else { return false }
            return path == damaged && !problems.isEmpty
        }
        #expect(Self.contents(data) == original)

        // Another service's backup, into an existing and into a new data directory.
        try Self.makeDatabase(dir.file("other"), DatabaseSchema(service: "other", fileName: "notes.sqlite", migrations: testMigrations))
        let other = try Database.backup(
            schema: DatabaseSchema(service: "other", fileName: "notes.sqlite", migrations: testMigrations), directory: dir.file("other"),
            to: dir.file("other.sqlite")
        ).path
        refused(other, .wrongService(path: other, expected: "notes", found: "other"))
        refused(other, into: dir.file("fresh/nested"), .wrongService(path: other, expected: "notes", found: "other"))
        #expect(!FileManager.default.fileExists(atPath: dir.file("fresh")))  // the parent it made too

        // A database that records no owner.
        try Database.openQuiet(directory: dir.file("anonymous"), fileName: "notes.sqlite", migrations: testMigrations).close()
        let anonymous = dir.file("anonymous/notes.sqlite")
        refused(anonymous, .noServiceRecorded(path: anonymous, expected: "notes"))

        // A newer version's backup: a migration this version does not know.
        let newer = DatabaseSchema(service: "notes", migrations: testMigrations + [Migration(name: "003-from-the-future", sql: "CREATE TABLE f (a)")])
        try Self.makeDatabase(dir.file("newer"), newer)
        let future = try Database.backup(schema: newer, directory: dir.file("newer"), to: dir.file("newer.sqlite")).path
        refused(future, .newerSchema(path: future, unknownMigrations: ["003-from-the-future"]))

        // The database itself.
        refused(dir.file("data/notes.sqlite"), .sameFile(path: dir.file("data/notes.sqlite")))

        // The service runs on the data directory (this process holds its lock).
        let running = try Database.openQuiet(directory: data, schema: Self.notes)
        let error = #expect(throws: BackupError.self) { try Database.restore(schema: Self.notes, directory: data, from: good) }
        #expect(error == .serviceRunning(directory: data, holder: "\(getpid())"))
        #expect(error?.description.contains("stop it, then restore") == true)
        running.close()

        // Stopped, the good backup restores.
        let restored = try Database.restore(schema: Self.notes, directory: data, from: good)
        #expect(restored.bytes > 0)
        let db = try Database.openQuiet(directory: data, schema: Self.notes)
        defer { db.close() }
        #expect(try db.readSync { c in try c.queryOne("SELECT count(*) FROM users")!.get(0, as: Int.self) } == 3)
    }
}
