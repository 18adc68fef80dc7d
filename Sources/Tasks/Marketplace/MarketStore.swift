import Contracts
import Foundation
import RPCCore
import ServiceKit
import Storage

/// Marketplace tasks, photos and bids in the database, their search indexes (FTS5 for words, an
/// R*Tree for places, both kept by triggers in the same transaction as the row), and their
/// conversion to the contract's messages.
enum MarketStore {
    static let migration = Migration(
        name: "marketplace.001-tables",
        sql: """
            CREATE TABLE market_tasks (
                n INTEGER PRIMARY KEY,              -- the row of the FTS5 and R*Tree indexes
                id TEXT NOT NULL UNIQUE,
                requester_id TEXT,                  -- NULL once erased (DONE tasks are kept)
                title TEXT NOT NULL,
                description TEXT NOT NULL,
                latitude REAL,
                longitude REAL,
                status INTEGER NOT NULL,            -- tasks.v1.MarketTaskStatus
                assignee_id TEXT,                   -- the accepted bid's provider (ASSIGNED, DONE)
                accepted_bid_id TEXT,
                next_photo INTEGER NOT NULL DEFAULT 1,
                created_at INTEGER NOT NULL,
                updated_at INTEGER NOT NULL,
                done_at INTEGER
            );
            CREATE INDEX market_tasks_open ON market_tasks(status, id);
            CREATE INDEX market_tasks_requester ON market_tasks(requester_id, id);
            CREATE INDEX market_tasks_assignee ON market_tasks(assignee_id, id) WHERE assignee_id IS NOT NULL;
            CREATE TABLE market_task_photos (
                task_id TEXT NOT NULL REFERENCES market_tasks(id) ON DELETE CASCADE,
                photo_id TEXT NOT NULL,
                position INTEGER NOT NULL,
                content_type TEXT NOT NULL,
                size_bytes INTEGER NOT NULL,
                data BLOB NOT NULL
            );
            CREATE UNIQUE INDEX market_task_photos_id ON market_task_photos(task_id, photo_id);
            CREATE TABLE market_bids (
                id TEXT PRIMARY KEY NOT NULL,
                task_id TEXT NOT NULL REFERENCES market_tasks(id) ON DELETE CASCADE,
                provider_id TEXT,                   -- NULL once erased (accepted bids of DONE tasks are kept)
                amount_cents INTEGER NOT NULL,
                currency TEXT NOT NULL,
                status INTEGER NOT NULL,            -- tasks.v1.BidStatus: 1 active, 2 accepted
                created_at INTEGER NOT NULL
            );
            -- One bid per provider per task (placing again replaces it); the lists of a task's bids.
            CREATE UNIQUE INDEX market_bids_provider_task ON market_bids(provider_id, task_id);
            CREATE INDEX market_bids_task ON market_bids(task_id, status, amount_cents, created_at, id);

            -- Words: trigram tokens make every keyword a case-insensitive substring match.
            CREATE VIRTUAL TABLE market_task_text USING fts5(
                title, description, content='market_tasks', content_rowid='n', tokenize='trigram');
            -- Places: a point per located task (min = max).
            CREATE VIRTUAL TABLE market_task_geo USING rtree(id, min_lat, max_lat, min_lon, max_lon);
            CREATE TRIGGER market_tasks_insert AFTER INSERT ON market_tasks BEGIN
                INSERT INTO market_task_text (rowid, title, description) VALUES (new.n, new.title, new.description);
                INSERT INTO market_task_geo (id, min_lat, max_lat, min_lon, max_lon)
                    SELECT new.n, new.latitude, new.latitude, new.longitude, new.longitude WHERE new.latitude IS NOT NULL;
            END;
            CREATE TRIGGER market_tasks_delete AFTER DELETE ON market_tasks BEGIN
                INSERT INTO market_task_text (market_task_text, rowid, title, description) VALUES ('delete', old.n, old.title, old.description);
                DELETE FROM market_task_geo WHERE id = old.n;
            END;
            CREATE TRIGGER market_tasks_text AFTER UPDATE OF title, description ON market_tasks BEGIN
                INSERT INTO market_task_text (market_task_text, rowid, title, description) VALUES ('delete', old.n, old.title, old.description);
                INSERT INTO market_task_text (rowid, title, description) VALUES (new.n, new.title, new.description);
            END;
            CREATE TRIGGER market_tasks_place AFTER UPDATE OF latitude, longitude ON market_tasks BEGIN
                DELETE FROM market_task_geo WHERE id = old.n;
                INSERT INTO market_task_geo (id, min_lat, max_lat, min_lon, max_lon)
                    SELECT new.n, new.latitude, new.latitude, new.longitude, new.longitude WHERE new.latitude IS NOT NULL;
            END;
            """)

    /// Words in every script: the folded title and description (`TextFold`) stored beside them,
    /// and the trigram index over those instead of the text (its own folding off): a keyword of
    /// three or more characters (FTS5) and a shorter one (`instr` on the same columns) match by
    /// the one rule. Existing rows are folded here.
    static let foldedText = Migration(name: "marketplace.003-folded-text") { tx in
        try tx.executeScript(
            """
            DROP TRIGGER market_tasks_insert;
            DROP TRIGGER market_tasks_delete;
            DROP TRIGGER market_tasks_text;
            DROP TABLE market_task_text;
            ALTER TABLE market_tasks ADD COLUMN title_folded TEXT NOT NULL DEFAULT '';
            ALTER TABLE market_tasks ADD COLUMN description_folded TEXT NOT NULL DEFAULT '';
            """)
        var last: Int64 = 0
        while true {
            let rows = try tx.query("SELECT n, title, description FROM market_tasks WHERE n > ? ORDER BY n LIMIT 1000", last)
            for r in rows {
                last = try r.get("n")
                try tx.execute(
                    "UPDATE market_tasks SET title_folded = ?, description_folded = ? WHERE n = ?",
                    TextFold.fold(try r.get("title")), TextFold.fold(try r.get("description")), last)
            }
            if rows.count < 1000 { break }
        }
        try tx.executeScript(
            """
            -- Trigrams of the folded text: every keyword a substring match, TextFold's rule.
            CREATE VIRTUAL TABLE market_task_text USING fts5(
                title_folded, description_folded, content='market_tasks', content_rowid='n', tokenize='trigram case_sensitive 1');
            INSERT INTO market_task_text (market_task_text) VALUES ('rebuild');
            CREATE TRIGGER market_tasks_insert AFTER INSERT ON market_tasks BEGIN
                INSERT INTO market_task_text (rowid, title_folded, description_folded) VALUES (new.n, new.title_folded, new.description_folded);
                INSERT INTO market_task_geo (id, min_lat, max_lat, min_lon, max_lon)
                    SELECT new.n, new.latitude, new.latitude, new.longitude, new.longitude WHERE new.latitude IS NOT NULL;
            END;
            CREATE TRIGGER market_tasks_delete AFTER DELETE ON market_tasks BEGIN
                INSERT INTO market_task_text (market_task_text, rowid, title_folded, description_folded)
                    VALUES ('delete', old.n, old.title_folded, old.description_folded);
                DELETE FROM market_task_geo WHERE id = old.n;
            END;
            CREATE TRIGGER market_tasks_text AFTER UPDATE OF title_folded, description_folded ON market_tasks BEGIN
                INSERT INTO market_task_text (market_task_text, rowid, title_folded, description_folded)
                    VALUES ('delete', old.n, old.title_folded, old.description_folded);
                INSERT INTO market_task_text (rowid, title_folded, description_folded) VALUES (new.n, new.title_folded, new.description_folded);
            END;
            """)
    }

    enum Status: Int64 {
        case requested = 1, bidded = 2, assigned = 3, done = 4
        var isOpen: Bool { self == .requested || self == .bidded }
    }

    struct Bid: Sendable {
        var id: String
        var taskID: String
        var providerID: String?
        var cents: Int64
        var currency: String
        var accepted: Bool
        var createdAt: Int64
    }

    struct Photo: Sendable {
        var id: String
        var contentType: String
        var size: Int64
    }

    struct Row: Sendable {
        var n: Int64
        var id: String
        var requesterID: String?
        var title: String
        var description: String
        var location: GeoPoint?
        var status: Status
        var assigneeID: String?
        var acceptedBidID: String?
        var createdAt: Int64
        var updatedAt: Int64
        var doneAt: Int64?
        var photos: [Photo] = []
        var activeBids = 0
        var lowest: (cents: Int64, currency: String)?
        var acceptedBid: Bid?

        var userIDs: [String] { [requesterID, assigneeID].compactMap { $0 } }
    }

    static let columns =
        "n, id, requester_id, title, description, latitude, longitude, status, assignee_id, accepted_bid_id, created_at, updated_at, done_at"

    static func bid(_ r: Storage.Row) throws -> Bid {
        Bid(
            id: try r.get("id"), taskID: try r.get("task_id"), providerID: try r.get("provider_id"), cents: try r.get("amount_cents"),
            currency: try r.get("currency"), accepted: try r.get("status", as: Int64.self) == 2, createdAt: try r.get("created_at"))
    }

    static let bidColumns = "id, task_id, provider_id, amount_cents, currency, status, created_at"

    /// Tasks by id with photos (metadata), active-bid count, lowest bid and accepted bid, in the
    /// order of `ids`.
    static func load(_ db: some SQLReader, ids: [String]) throws -> [Row] {
        guard !ids.isEmpty else { return [] }
        let marks = Array(repeating: "?", count: ids.count).joined(separator: ",")
        let args = ids.map { DatabaseValue.text($0) }
        var byID: [String: Row] = [:]
        for r in try db.query("SELECT \(columns) FROM market_tasks WHERE id IN (\(marks))", arguments: args) {
            let lat: Double? = try r.get("latitude"), lon: Double? = try r.get("longitude")
            let row = Row(
                n: try r.get("n"), id: try r.get("id"), requesterID: try r.get("requester_id"), title: try r.get("title"),
                description: try r.get("description"), location: lat.flatMap { la in lon.map { GeoPoint(latitude: la, longitude: $0) } },
                status: Status(rawValue: try r.get("status")) ?? .requested, assigneeID: try r.get("assignee_id"),
                acceptedBidID: try r.get("accepted_bid_id"), createdAt: try r.get("created_at"), updatedAt: try r.get("updated_at"),
                doneAt: try r.get("done_at"))
            byID[row.id] = row
        }
        for p in try db.query(
            "SELECT task_id, photo_id, content_type, size_bytes FROM market_task_photos WHERE task_id IN (\(marks)) ORDER BY task_id, position",
            arguments: args)
        {
            byID[try p.get("task_id")]?.photos.append(
                Photo(id: try p.get("photo_id"), contentType: try p.get("content_type"), size: try p.get("size_bytes")))
        }
        for b in try db.query(
            """
            SELECT task_id, COUNT(*) AS bids, MIN(amount_cents) AS lowest, MIN(currency) AS currency FROM market_bids
            WHERE task_id IN (\(marks)) AND status = 1 GROUP BY task_id
            """, arguments: args)
        {
            let id: String = try b.get("task_id")
            byID[id]?.activeBids = Int(try b.get("bids", as: Int64.self))
            byID[id]?.lowest = (try b.get("lowest"), try b.get("currency"))
        }
        for b in try db.query("SELECT \(bidColumns) FROM market_bids WHERE task_id IN (\(marks)) AND status = 2", arguments: args) {
            let bid = try Self.bid(b)
            byID[bid.taskID]?.acceptedBid = bid
        }
        return ids.compactMap { byID[$0] }
    }

    static func one(_ db: some SQLReader, id: String) throws -> Row? { try load(db, ids: [id]).first }

    /// Whether `user` has a bid (active or accepted) on `task`.
    static func hasBid(_ db: some SQLReader, task: String, user: String) throws -> Bool {
        try db.queryOne("SELECT 1 FROM market_bids WHERE provider_id = ? AND task_id = ?", user, task) != nil
    }

    /// Who may read a task: everyone while it is open; afterwards its requester, its provider and
    /// the users who bid on it.
    static func visible(_ db: some SQLReader, _ t: Row, to user: String) throws -> Bool {
        if t.status.isOpen || t.requesterID == user || t.assigneeID == user { return true }
        return try hasBid(db, task: t.id, user: user)
    }

    /// REQUESTED or BIDDED from the active bids (after a bid came or went).
    static func settleOpenStatus(_ tx: Transaction, task: String, now: Int64) throws -> Status {
        let count = try tx.queryOne("SELECT COUNT(*) FROM market_bids WHERE task_id = ? AND status = 1", task)?.get(0, as: Int64.self) ?? 0
        let status: Status = count > 0 ? .bidded : .requested
        // Only open tasks move: an ASSIGNED or DONE task keeps its status whatever bids remain.
        try tx.execute(
            "UPDATE market_tasks SET status = ?, updated_at = ? WHERE id = ? AND status IN (1, 2) AND status <> ?", status.rawValue, now, task,
            status.rawValue)
        return status
    }

    // MARK: Messages

    static func money(_ cents: Int64, _ currency: String) -> Common_V1_Money {
        var m = Common_V1_Money()
        m.amountCents = cents
        m.currency = currency
        return m
    }

    static func proto(_ b: Bid, users: [String: Common_V1_UserRef]) -> Tasks_V1_Bid {
        var m = Tasks_V1_Bid()
        m.bidId = b.id
        m.taskId = b.taskID
        m.provider = users.ref(b.providerID)
        m.amount = money(b.cents, b.currency)
        m.status = b.accepted ? .accepted : .active
        m.createdAt = Google_Protobuf_Timestamp(milliseconds: b.createdAt)
        return m
    }

    static func proto(_ t: Row, users: [String: Common_V1_UserRef]) -> Tasks_V1_MarketTask {
        var m = Tasks_V1_MarketTask()
        m.taskId = t.id
        m.requester = users.ref(t.requesterID)
        m.title = t.title
        m.description_p = t.description
        if let l = t.location { m.location = Geo.proto(l) }
        m.photos = t.photos.map { p in
            var ph = Tasks_V1_MarketTaskPhoto()
            ph.photoId = p.id
            ph.contentType = p.contentType
            ph.sizeBytes = p.size
            return ph
        }
        m.status = Tasks_V1_MarketTaskStatus(rawValue: Int32(t.status.rawValue))
        if let l = t.lowest { m.lowestBid = money(l.cents, l.currency) }
        m.bidCount = Int32(t.activeBids)
        if let a = t.acceptedBid, t.status == .assigned || t.status == .done { m.acceptedBid = proto(a, users: users) }
        m.createdAt = Google_Protobuf_Timestamp(milliseconds: t.createdAt)
        m.updatedAt = Google_Protobuf_Timestamp(milliseconds: t.updatedAt)
        if let d = t.doneAt { m.doneAt = Google_Protobuf_Timestamp(milliseconds: d) }
        return m
    }

    /// Every user id the messages of `rows` name.
    static func userIDs(_ rows: [Row]) -> [String] {
        rows.flatMap { $0.userIDs + [$0.acceptedBid?.providerID].compactMap { $0 } }
    }
}
