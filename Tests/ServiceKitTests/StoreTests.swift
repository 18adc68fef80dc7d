import Contracts
import Foundation
import Logging
import RPCCore
import ServiceKitTesting
import Storage
import Testing

@testable import ServiceKit

/// ServiceStore: one mapping of storage failures, idempotency keys, events received once.
@Suite struct StoreTests {
    static var quiet: Logger {
        var l = Logger(label: "store-test")
        l.logLevel = .critical
        return l
    }

    static func open(_ dir: TemporaryDirectory, options: Database.Options = Database.Options()) throws -> ServiceStore {
        let db = try Database.open(
            directory: dir.path, fileName: "t.sqlite",
            migrations: Migration.kit + [
                Migration(
                    name: "t.001",
                    sql: """
                        CREATE TABLE members (id TEXT PRIMARY KEY, email TEXT NOT NULL, handle TEXT);
                        CREATE UNIQUE INDEX members_email ON members(lower(email));
                        CREATE UNIQUE INDEX members_handle ON members(handle);
                        """)
            ],
            options: options, logger: quiet)
        return ServiceStore(
            database: db,
            uniqueFields: [
                "members.handle": .init(field: "handle", message: "already taken"),
                "members_email": .init(field: "email"),
            ], logger: quiet)
    }

    @Test func uniqueViolationsNameTheDeclaredField() async throws {
        let dir = TemporaryDirectory()
        defer { dir.remove() }
        let store = try Self.open(dir)
        defer { store.database.close() }
        try await store.write { tx in try tx.execute("INSERT INTO members VALUES ('1', 'a@x.io', 'ada')") }
        let byColumn = await expectFailure(.alreadyExists, fields: ["handle"]) {
            try await store.write { tx in try tx.execute("INSERT INTO members VALUES ('2', 'b@x.io', 'ada')") }
        }
        #expect(byColumn?.message.contains("already taken") == true)
        await expectFailure(.alreadyExists, fields: ["email"]) {
            try await store.write { tx in try tx.execute("INSERT INTO members VALUES ('3', 'A@X.IO', 'bob')") }
        }
        // Undeclared (the primary key): still ALREADY_EXISTS, no field, the cause kept for the log.
        do {
            try await store.write { tx in try tx.execute("INSERT INTO members VALUES ('1', 'c@x.io', 'cy')") }
            Issue.record("duplicate primary key accepted")
        } catch let e as RPCError {
            #expect(e.code == .alreadyExists)
            #expect(e.cause is StorageError)
        }
    }

    @Test func idempotencyKeysReplayTheFirstAnswerAndRefuseAnotherRequest() async throws {
        let dir = TemporaryDirectory()
        defer { dir.remove() }
        let store = try Self.open(dir)
        defer { store.database.close() }
        var first = Finance_V1_CreateChargeRequest()
        first.description_p = "Groceries"
        first.idempotencyKey = "k-1"
        var other = first
        other.description_p = "Rent"
        @Sendable func create(_ r: Finance_V1_CreateChargeRequest) async throws -> (String, Bool) {
            try await store.write { tx in
                let (response, replayed) = try tx.idempotent(
                    scope: "CreateCharge:u1", key: r.idempotencyKey,
                    fingerprint: Idempotency.fingerprint(r)
                ) {
                    try tx.execute("INSERT INTO members VALUES (?, ?, NULL)", ULID.make(), "\(UUID())@x.io")
                    var h = Finance_V1_CreateChargeResponse()
                    h.transaction.transactionId = ULID.make()
                    return h
                }
                return (response.transaction.transactionId, replayed)
            }
        }
        // Concurrent retries of one request: one effect, one answer.
        let results = try await withThrowingTaskGroup(of: (String, Bool).self) { group in
            let request = first
            for _ in 0..<8 { group.addTask { try await create(request) } }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(Set(results.map(\.0)).count == 1)
        #expect(results.filter { !$0.1 }.count == 1, "exactly one was not a replay")
        #expect(try await store.read { c in try c.queryOne("SELECT count(*) FROM members")!.get(0, as: Int.self) } == 1)
        await expectFailure(.failedPrecondition, fields: ["idempotency_key"]) { try await create(other) }
    }

    @Test func eventsAreAppliedOnce() async throws {
        let dir = TemporaryDirectory()
        defer { dir.remove() }
        let store = try Self.open(dir)
        defer { store.database.close() }
        var replays: [Bool] = []
        for _ in 0..<3 {
            replays.append(
                try await store.receiveOnce(eventID: "erase-u1") { tx in
                    try tx.execute("INSERT INTO members VALUES (?, 'x@y.io', NULL)", ULID.make())
                })
        }
        #expect(replays == [false, true, true])
        try await store.purgeKitTables()
    }

    @Test func idempotencyKeysArePurgedAfterAWeekUnlessKeptForEver() async throws {
        let dir = TemporaryDirectory()
        defer { dir.remove() }
        let store = try Self.open(dir)
        defer { store.database.close() }
        let created = SystemClock.nowMilliseconds()
        try await store.write { tx in
            _ = try tx.idempotent(scope: "s", key: "k", fingerprint: [1], now: created) { Google_Protobuf_Empty() }
        }
        func keys() async throws -> Int {
            try await store.read { c in try c.queryOne("SELECT count(*) FROM idempotency_keys")!.get(0, as: Int.self) }
        }
        let eightDaysLater = created + 8 * 24 * 3600 * 1000
        try await store.purgeKitTables(now: eightDaysLater, keepIdempotencyKeys: nil)
        #expect(try await keys() == 1, "kept for ever")
        try await store.purgeKitTables(now: eightDaysLater)
        #expect(try await keys() == 0, "the default keeps a week")
    }
}

@Suite struct EraseUserTests {
    @Test func erasesOncePerEventAndValidatesBothFields() async throws {
        let dir = TemporaryDirectory()
        defer { dir.remove() }
        let store = try StoreTests.open(dir)
        defer { store.database.close() }
        try await store.write { tx in try tx.execute("INSERT INTO members VALUES ('u1', 'a@x.io', 'ada')") }
        let erase: @Sendable (Transaction, String) throws -> Void = { tx, user in try tx.execute("DELETE FROM members WHERE id = ?", user) }
        #expect(try await EraseUser.receive(eventID: "ev-1", userID: "u1", store: store, erase) == false)
        #expect(try await EraseUser.receive(eventID: "ev-1", userID: "u1", store: store, erase) == true)
        #expect(try await store.read { c in try c.queryOne("SELECT count(*) FROM members")!.get(0, as: Int.self) } == 0)
        await expectFailure(.invalidArgument, fields: ["event_id", "user_id"]) {
            try await EraseUser.receive(eventID: "", userID: "", store: store, erase)
        }
    }
}
