import Foundation
import RPCCore
import Synchronization
import Testing

@testable import Storage

@Suite(.serialized) struct DatabaseTests {
    @Test func migrationsApplyOnceInOrderAndReopenIsIdempotent() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let order = Mutex<[String]>([])
        func tracked(_ name: String, _ sql: String) -> Migration {
            Migration(name: name) { tx in
                order.withLock { $0.append(name) }
                try tx.executeScript(sql)
            }
        }
        let first = [
            tracked("001", "CREATE TABLE t (v INTEGER)"),
            tracked("002", "INSERT INTO t VALUES (1)"),
        ]
        do {
            let db = try Database.openQuiet(directory: dir.path, fileName: "a.sqlite", migrations: first)
            #expect(try db.appliedMigrations() == ["001", "002"])
            db.close()
        }
        do {
            let db = try Database.openQuiet(directory: dir.path, fileName: "a.sqlite", migrations: first)
            #expect(try db.appliedMigrations() == ["001", "002"])
            db.close()
        }
        let second = first + [tracked("003", "INSERT INTO t VALUES (2)")]
        let db = try Database.openQuiet(directory: dir.path, fileName: "a.sqlite", migrations: second)
        defer { db.close() }
        #expect(order.withLock { $0 } == ["001", "002", "003"])
        #expect(try db.appliedMigrations() == ["001", "002", "003"])
        let values = try db.readSync { c in try c.query("SELECT v FROM t ORDER BY v").map { try $0.get(0, as: Int.self) } }
        #expect(values == [1, 2])
        let pragmas = try db.readSync { c in
            (try c.queryOne("PRAGMA journal_mode")!.get(0, as: String.self), try c.queryOne("PRAGMA foreign_keys")!.get(0, as: Int.self))
        }
        #expect(pragmas.0 == "wal")
        #expect(pragmas.1 == 1)
    }

    @Test func failedMigrationRollsBackAndNamesItself() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let bad = testMigrations + [Migration(name: "003-broken", sql: "CREATE TABLE x (a INTEGER); CREATE TABLE oops (;")]
        #expect {
            try Database.openQuiet(directory: dir.path, fileName: "a.sqlite", migrations: bad)
        } throws: { error in
            guard case StorageError.migrationFailed(let name, _) = error else { return false }
            return name == "003-broken"
        }
        // The half of 003 that succeeded was rolled back, and 001/002 stay applied.
        let db = try Database.openQuiet(directory: dir.path, fileName: "a.sqlite", migrations: testMigrations)
        defer { db.close() }
        #expect(try db.appliedMigrations() == ["001-users", "002-notes"])
        #expect(try db.readSync { c in try c.queryOne("SELECT count(*) FROM sqlite_master WHERE name = 'x'")!.get(0, as: Int.self) } == 0)
    }

    @Test func newerSchemaIsRefusedByName() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let newer = testMigrations + [Migration(name: "003-from-the-future", sql: "CREATE TABLE f (a)")]
        try Database.openQuiet(directory: dir.path, fileName: "a.sqlite", migrations: newer).close()
        var caught: StorageError?
        do {
            _ = try Database.openQuiet(directory: dir.path, fileName: "a.sqlite", migrations: testMigrations)
        } catch let error as StorageError {
            caught = error
        }
        #expect(caught == .newerSchema(path: dir.file("a.sqlite"), unknownMigrations: ["003-from-the-future"]))
        #expect(caught?.description.contains("003-from-the-future") == true)
        #expect(caught?.rpcError.code == .internal)
        // The refusal released the lock: the newer code can still open it.
        try Database.openQuiet(directory: dir.path, fileName: "a.sqlite", migrations: newer).close()
    }

    /// `open(directory:schema:)` records the owner in a database that has none (one made before
    /// the record existed gets it on its next open) and refuses another service's database before
    /// migrating anything.
    @Test func openRecordsItsServiceAndRefusesAnotherServicesDatabase() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        // Made without a schema: no owner recorded, as every database was before.
        try Database.openQuiet(directory: dir.path, fileName: "notes.sqlite", migrations: testMigrations).close()
        func owner() throws -> String? {
            let c = try Connection(path: dir.file("notes.sqlite"), readOnly: true)
            defer { c.close() }
            return try Database.recordedService(c)
        }
        #expect(try owner() == nil)
        let notes = DatabaseSchema(service: "notes", migrations: testMigrations)
        #expect(notes.fileName == "notes.sqlite")
        try Database.openQuiet(directory: dir.path, schema: notes).close()
        #expect(try owner() == "notes")
        try Database.openQuiet(directory: dir.path, schema: notes).close()  // reopening keeps it

        // Another service whose file has the same name: refused before its migrations run.
        let other = DatabaseSchema(
            service: "other", fileName: "notes.sqlite", migrations: testMigrations + [Migration(name: "other.001", sql: "CREATE TABLE o (a)")])
        var caught: StorageError?
        do { _ = try Database.openQuiet(directory: dir.path, schema: other) } catch let error as StorageError { caught = error }
        #expect(caught == .wrongService(path: dir.file("notes.sqlite"), expected: "other", found: "notes"))
        #expect(caught?.description.contains("belongs to the notes service, not other") == true)
        let db = try Database.openQuiet(directory: dir.path, schema: notes)
        defer { db.close() }
        #expect(try db.appliedMigrations() == ["001-users", "002-notes"])
    }

    @Test func secondOpenInTheSameProcessIsRefusedUntilClosed() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let db = try Database.openQuiet(directory: dir.path, fileName: "a.sqlite", migrations: testMigrations)
        #expect(throws: StorageError.locked(path: dir.file("a.sqlite"), holder: "\(getpid())")) {
            try Database.openQuiet(directory: dir.path, fileName: "a.sqlite", migrations: testMigrations)
        }
        db.close()
        try Database.openQuiet(directory: dir.path, fileName: "a.sqlite", migrations: testMigrations).close()
    }

    @Test func openHeldByAnotherProcessIsRefusedWithItsPid() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let child = try ChildProcess(crashHelperPath(), [dir.path])
        defer { child.kill() }
        let lines = child.readLines { $0 == "ready" }
        try #require(lines.last == "ready")
        var caught: StorageError?
        do {
            _ = try Database.openQuiet(directory: dir.path, fileName: "crash.sqlite", migrations: [])
        } catch let error as StorageError {
            caught = error
        }
        #expect(caught == .locked(path: dir.file("crash.sqlite"), holder: "\(child.pid)"))
        #expect(caught?.rpcError.code == .unavailable)
        #expect(caught?.description.contains("in use by process \(child.pid)") == true)
    }

    @Test func garbageFileIsAClearError() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let garbage = Data((0..<4096).map { _ in UInt8.random(in: 0...255) })
        _ = FileManager.default.createFile(atPath: dir.file("g.sqlite"), contents: garbage)
        #expect(throws: StorageError.notADatabase(path: dir.file("g.sqlite"))) {
            try Database.openQuiet(directory: dir.path, fileName: "g.sqlite", migrations: testMigrations)
        }
        #expect(StorageError.notADatabase(path: "x").description.contains("not an SQLite database"))
        // A directory where the file should be.
        try FileManager.default.createDirectory(atPath: dir.file("d.sqlite"), withIntermediateDirectories: true)
        #expect {
            try Database.openQuiet(directory: dir.path, fileName: "d.sqlite", migrations: testMigrations)
        } throws: { error in
            guard case StorageError.cannotOpen(let path, _) = error else { return false }
            return path == dir.file("d.sqlite")
        }
    }

    @Test func writeRollsBackEverythingWhenTheBodyThrows() async throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let db = try Database.openQuiet(directory: dir.path, fileName: "a.sqlite", migrations: testMigrations)
        defer { db.close() }
        struct Boom: Error {}
        await #expect(throws: Boom.self) {
            try await db.write { tx in
                try tx.execute("INSERT INTO users (email) VALUES (?)", "a@x")
                try tx.execute("INSERT INTO notes (user_id, body) VALUES (?, ?)", tx.lastInsertRowID, "n")
                throw Boom()
            }
        }
        // A failing statement after a successful one: the whole transaction goes.
        await #expect(throws: StorageError.self) {
            try await db.write { tx in
                try tx.execute("INSERT INTO users (email) VALUES (?)", "b@x")
                try tx.execute("INSERT INTO notes (user_id, body) VALUES (?, ?)", 999, "dangling")  // foreign key
            }
        }
        let counts = try await db.read { c in
            (try c.queryOne("SELECT count(*) FROM users")!.get(0, as: Int.self), try c.queryOne("SELECT count(*) FROM notes")!.get(0, as: Int.self))
        }
        #expect(counts == (0, 0))
        // The writer is usable afterwards.
        let id = try await db.write { tx in
            try tx.execute("INSERT INTO users (email) VALUES (?)", "c@x")
            return tx.lastInsertRowID
        }
        #expect(id == 1 || id > 0)
    }

    @Test func uniqueViolationNamesTheColumnsOrIndex() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let migrations =
            testMigrations + [
                Migration(
                    name: "003-handles", sql: "CREATE TABLE handles (name TEXT NOT NULL); CREATE UNIQUE INDEX handles_ci ON handles(lower(name))"),
                Migration(name: "004-pairs", sql: "CREATE TABLE pairs (a INTEGER, b INTEGER, PRIMARY KEY (a, b))"),
            ]
        let db = try Database.openQuiet(directory: dir.path, fileName: "a.sqlite", migrations: migrations)
        defer { db.close() }
        try db.writeSync { tx in try tx.execute("INSERT INTO users (email) VALUES (?)", "a@x") }
        var caught: StorageError?
        do { try db.writeSync { tx in try tx.execute("INSERT INTO users (email) VALUES (?)", "a@x") } } catch let e as StorageError { caught = e }
        #expect(caught == .uniqueViolation(columns: ["users.email"], index: nil))
        #expect(caught?.rpcError == RPCError(.alreadyExists, "a record with the same email already exists"))

        try db.writeSync { tx in try tx.execute("INSERT INTO handles VALUES ('Ann')") }
        #expect(throws: StorageError.uniqueViolation(columns: [], index: "handles_ci")) {
            try db.writeSync { tx in try tx.execute("INSERT INTO handles VALUES ('ANN')") }
        }
        try db.writeSync { tx in try tx.execute("INSERT INTO pairs VALUES (1, 2)") }
        #expect(throws: StorageError.uniqueViolation(columns: ["pairs.a", "pairs.b"], index: nil)) {
            try db.writeSync { tx in try tx.execute("INSERT INTO pairs VALUES (1, 2)") }
        }
        // A caught violation inside the body leaves the transaction usable (statement-level rollback).
        let kept = try db.writeSync { tx -> Bool in
            do { try tx.execute("INSERT INTO users (email) VALUES (?)", "a@x") } catch StorageError.uniqueViolation {}
            try tx.execute("INSERT INTO users (email) VALUES (?)", "b@x")
            return true
        }
        #expect(kept)
        #expect(try db.readSync { c in try c.queryOne("SELECT count(*) FROM users")!.get(0, as: Int.self) } == 2)
    }

    @Test func valuesRoundTripAndRowsReadByIndexAndName() throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let db = try Database.openQuiet(
            directory: dir.path, fileName: "a.sqlite",
            migrations: [Migration(name: "001", sql: "CREATE TABLE v (i INTEGER, r REAL, t TEXT, b BLOB, f INTEGER, n TEXT)")]
        )
        defer { db.close() }
        let optionalNil: String? = nil
        let text = "héllo\u{0}wörld 🎉"
        try db.writeSync { tx in
            try tx.execute("INSERT INTO v VALUES (?, ?, ?, ?, ?, ?)", Int64.max, 2.5, text, [UInt8]([0, 1, 255]), true, optionalNil)
            try tx.execute("INSERT INTO v VALUES (?, ?, ?, ?, ?, ?)", 7, 3, "", [UInt8](), false, nil)
            try tx.execute(
                "INSERT INTO v VALUES (?, ?, ?, ?, ?, ?)", arguments: [.integer(-1), .real(0), .text("x"), .blob([9]), .null, .text("set")])
        }
        let rows = try db.readSync { c in try c.query("SELECT i, r, t, b, f, n AS named FROM v ORDER BY rowid") }
        #expect(rows.count == 3)
        #expect(try rows[0].get(0, as: Int64.self) == .max)
        #expect(try rows[0].get("r", as: Double.self) == 2.5)
        #expect(try rows[0].get("T", as: String.self) == text)
        #expect(try rows[0].get("b", as: [UInt8].self) == [0, 1, 255])
        #expect(try rows[0].get("f", as: Bool.self) == true)
        #expect(try rows[0].get("named", as: String?.self) == nil)
        #expect(rows[0].columnNames == ["i", "r", "t", "b", "f", "named"])
        #expect(try rows[1].get(0, as: Int.self) == 7)
        #expect(try rows[1].get(1, as: Double.self) == 3)
        #expect(try rows[1].get(2, as: String.self) == "")
        #expect(rows[1][3] == .blob([]))  // empty, not NULL
        #expect(try rows[1].get("f", as: Bool.self) == false)
        #expect(rows[2]["f"] == .null)
        #expect(rows[2]["missing"] == nil)
        #expect(throws: StorageError.typeMismatch(column: "t", expected: "Int64", actual: "TEXT")) { try rows[2].get("t", as: Int64.self) }
        #expect(throws: StorageError.noSuchColumn("zzz")) { try rows[2].get("zzz", as: Int64.self) }
        #expect(try db.readSync { c in try c.queryOne("SELECT i FROM v WHERE i = ?", 12345) } == nil)
    }

    @Test func misuseIsReportedNotCrashed() async throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let db = try Database.openQuiet(directory: dir.path, fileName: "a.sqlite", migrations: testMigrations)
        #expect(throws: StorageError.self) { try db.writeSync { tx in try tx.execute("INSERT INTO users (email) VALUES (?)") } }
        #expect(throws: StorageError.self) { try db.writeSync { tx in try tx.execute("INSERT INTO users (email) VALUES ('a'); DELETE FROM users") } }
        #expect(throws: StorageError.self) { try db.writeSync { tx in try tx.execute("SELEC nonsense") } }
        // Readers cannot write.
        #expect(throws: StorageError.self) { try db.readSync { c in try c.execute("INSERT INTO users (email) VALUES ('r')") } }
        // Nested synchronous write from inside a write body would deadlock: refused instead.
        #expect(throws: StorageError.self) { try db.writeSync { _ in try db.writeSync { _ in } } }
        // A transaction that escaped its body is dead.
        let escaped = try db.writeSync { tx in tx }
        #expect(throws: StorageError.self) { try escaped.execute("DELETE FROM users") }
        // A body that commits by itself is reported.
        #expect(throws: StorageError.self) { try db.writeSync { tx in try tx.execute("COMMIT") } }
        try db.writeSync { tx in try tx.execute("INSERT INTO users (email) VALUES ('ok')") }
        db.close()
        await #expect(throws: StorageError.closed) { try await db.read { c in try c.query("SELECT 1") } }
        #expect(StorageError.closed.rpcError.code == .unavailable)
    }

    @Test func readsRunConcurrentlyWithAWriteAndSeeASnapshot() async throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let db = try Database.openQuiet(directory: dir.path, fileName: "a.sqlite", migrations: testMigrations)
        defer { db.close() }
        try await db.write { tx in try tx.execute("INSERT INTO users (email) VALUES ('before')") }
        let inWrite = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let writer = Task {
            try await db.write { tx in
                try tx.execute("INSERT INTO users (email) VALUES ('during')")
                inWrite.signal()
                _ = release.wait(timeout: .now() + 10)  // hold the write transaction open
            }
        }
        await withCheckedContinuation { c in
            DispatchQueue.global().async {
                inWrite.wait(); c.resume()
            }
        }
        // Several reads while the write transaction is open: they complete, and see the committed state only.
        let clock = ContinuousClock()
        let start = clock.now
        let counts = try await withThrowingTaskGroup(of: Int.self) { group in
            for _ in 0..<6 {
                group.addTask { try await db.read { c in try c.queryOne("SELECT count(*) FROM users")!.get(0, as: Int.self) } }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        let elapsed = clock.now - start
        release.signal()
        try await writer.value
        #expect(counts == Array(repeating: 1, count: 6))
        #expect(elapsed < .seconds(5))
        #expect(try await db.read { c in try c.queryOne("SELECT count(*) FROM users")!.get(0, as: Int.self) } == 2)
    }

    /// Prints figures, asserts nothing about them: timing belongs in benchmarks, not in tests.
    @Test func commitLatencyBySynchronousMode() async throws {
        for mode in [Database.Options.Synchronous.normal, .full] {
            let dir = TempDirectory()
            defer { dir.cleanup() }
            let db = try Database.openQuiet(directory: dir.path, fileName: "a.sqlite", migrations: testMigrations, options: .init(synchronous: mode))
            defer { db.close() }
            let n = 200
            let clock = ContinuousClock()
            let serial = try clock.measure {
                for i in 0..<n { try db.writeSync { tx in try tx.execute("INSERT INTO users (email) VALUES (?)", "s\(i)@x") } }
            }
            let reads = try clock.measure {
                for i in 0..<n { _ = try db.readSync { c in try c.queryOne("SELECT id, email FROM users WHERE email = ?", "s\(i)@x") } }
            }
            let tasks = 16
            let start = clock.now
            try await withThrowingTaskGroup(of: Void.self) { group in
                for t in 0..<tasks {
                    group.addTask {
                        for i in 0..<(n / tasks) {
                            try await db.write { tx in try tx.execute("INSERT INTO users (email) VALUES (?)", "c\(t)-\(i)@x") }
                        }
                    }
                }
                try await group.waitForAll()
            }
            let concurrent = clock.now - start
            print(
                "storage \(mode.rawValue): one writer at a time \(Self.us(serial / n)) µs/write; \(tasks) concurrent writers \(Self.us(concurrent / n)) µs/write (\(Int(Double(n) / concurrent.inSeconds)) writes/s); point read \(Self.us(reads / n)) µs"
            )
        }
    }

    static func us(_ d: Duration) -> Int { Int((d.inSeconds * 1e6).rounded()) }
}
