import Contracts
import Foundation
import RPCCore
import ServiceKit
import Storage

/// Habits and their events in the database (events' places in an R*Tree kept by triggers), and
/// their conversion to the contract's messages with the metrics of `HabitRules`.
enum HabitStore {
    static let migration = Migration(
        name: "habits.001-tables",
        sql: """
            CREATE TABLE habits (
                id TEXT PRIMARY KEY NOT NULL,
                owner_id TEXT NOT NULL,
                title TEXT NOT NULL,
                title_key TEXT NOT NULL,            -- lower-cased title: the lists' order
                reason TEXT NOT NULL,
                weekdays INTEGER NOT NULL,          -- bit (d - 1) for ISO weekday d
                start_day INTEGER NOT NULL,         -- yyyymmdd
                created_at INTEGER NOT NULL,
                updated_at INTEGER NOT NULL
            );
            CREATE INDEX habits_owner ON habits(owner_id, title_key, id);
            CREATE TABLE habit_events (
                n INTEGER PRIMARY KEY,              -- the R*Tree row
                id TEXT NOT NULL UNIQUE,
                habit_id TEXT NOT NULL REFERENCES habits(id) ON DELETE CASCADE,
                owner_id TEXT NOT NULL,
                day INTEGER NOT NULL,               -- yyyymmdd: the owner's "today" when added
                comment TEXT NOT NULL,
                latitude REAL,
                longitude REAL,
                utc_offset INTEGER NOT NULL,        -- seconds east of UTC of the zone it was added in
                excused_from INTEGER,               -- yyyymmdd: first day the calendar skipped before it
                created_at INTEGER NOT NULL,
                updated_at INTEGER NOT NULL,
                photo_size INTEGER NOT NULL DEFAULT 0,
                photo BLOB                          -- last: lists without photos never read it
            );
            CREATE UNIQUE INDEX habit_events_day ON habit_events(habit_id, day);
            CREATE INDEX habit_events_history ON habit_events(owner_id, day, created_at, id);
            CREATE VIRTUAL TABLE habit_event_geo USING rtree(id, min_lat, max_lat, min_lon, max_lon);
            CREATE TRIGGER habit_events_insert AFTER INSERT ON habit_events WHEN new.latitude IS NOT NULL BEGIN
                INSERT INTO habit_event_geo (id, min_lat, max_lat, min_lon, max_lon)
                    VALUES (new.n, new.latitude, new.latitude, new.longitude, new.longitude);
            END;
            CREATE TRIGGER habit_events_delete AFTER DELETE ON habit_events BEGIN
                DELETE FROM habit_event_geo WHERE id = old.n;
            END;
            CREATE TRIGGER habit_events_place AFTER UPDATE OF latitude, longitude ON habit_events BEGIN
                DELETE FROM habit_event_geo WHERE id = old.n;
                INSERT INTO habit_event_geo (id, min_lat, max_lat, min_lon, max_lon)
                    SELECT new.n, new.latitude, new.latitude, new.longitude, new.longitude WHERE new.latitude IS NOT NULL;
            END;
            """)

    /// The folded comment (`TextFold`) stored beside it: `comment_contains` matches it with
    /// `instr`, in every script (`LIKE` folds ASCII only). Existing events are folded here.
    static let foldedComment = Migration(name: "habits.003-folded-comment") { tx in
        try tx.execute("ALTER TABLE habit_events ADD COLUMN comment_folded TEXT NOT NULL DEFAULT ''")
        var last: Int64 = 0
        while true {
            let rows = try tx.query("SELECT n, comment FROM habit_events WHERE n > ? ORDER BY n LIMIT 1000", last)
            for r in rows {
                last = try r.get("n")
                try tx.execute("UPDATE habit_events SET comment_folded = ? WHERE n = ?", TextFold.fold(try r.get("comment")), last)
            }
            if rows.count < 1000 { break }
        }
    }

    struct Habit: Sendable {
        var id: String
        var ownerID: String
        var title: String
        var titleKey: String
        var reason: String
        var weekdays: Set<Int>
        var start: LocalDate
        var createdAt: Int64
        var updatedAt: Int64
        /// The reminder's local minute of day and zone (`reminders.001-tables`); nil: none.
        var reminderMinute: Int? = nil
        var reminderZone: String? = nil
        var events: [HabitEventDay] = []
    }

    static func mask(_ days: Set<Int>) -> Int64 { days.reduce(0) { $0 | (1 << Int64($1 - 1)) } }
    static func days(_ mask: Int64) -> Set<Int> { Set((1...7).filter { mask & (1 << Int64($0 - 1)) != 0 }) }

    static let columns = "id, owner_id, title, title_key, reason, weekdays, start_day, created_at, updated_at, reminder_minute, reminder_zone"

    /// Habits by id with their event days, in the order of `ids`.
    static func load(_ db: some SQLReader, ids: [String]) throws -> [Habit] {
        guard !ids.isEmpty else { return [] }
        let marks = Array(repeating: "?", count: ids.count).joined(separator: ",")
        let args = ids.map { DatabaseValue.text($0) }
        var byID: [String: Habit] = [:]
        for r in try db.query("SELECT \(columns) FROM habits WHERE id IN (\(marks))", arguments: args) {
            let minute: Int64? = try r.get("reminder_minute")
            let h = Habit(
                id: try r.get("id"), ownerID: try r.get("owner_id"), title: try r.get("title"), titleKey: try r.get("title_key"),
                reason: try r.get("reason"), weekdays: days(try r.get("weekdays")), start: LocalDate(key: try r.get("start_day")),
                createdAt: try r.get("created_at"), updatedAt: try r.get("updated_at"), reminderMinute: minute.map { Int($0) },
                reminderZone: try r.get("reminder_zone"))
            byID[h.id] = h
        }
        for e in try db.query("SELECT habit_id, day, excused_from FROM habit_events WHERE habit_id IN (\(marks))", arguments: args) {
            let excused: Int64? = try e.get("excused_from")
            byID[try e.get("habit_id")]?.events.append(
                HabitEventDay(day: LocalDate(key: try e.get("day")), excusedFrom: excused.map(LocalDate.init(key:))))
        }
        return ids.compactMap { byID[$0] }
    }

    static func one(_ db: some SQLReader, id: String) throws -> Habit? { try load(db, ids: [id]).first }

    static func date(_ d: LocalDate) -> Common_V1_Date { ChoreStore.date(d) }

    /// The habit as `viewer` sees it: its reminder only when `viewer` owns it.
    static func proto(_ h: Habit, users: [String: Common_V1_UserRef], today: LocalDate, viewer: String) -> Tasks_V1_Habit {
        var m = Tasks_V1_Habit()
        m.habitId = h.id
        m.owner = users.ref(h.ownerID)
        m.title = h.title
        m.reason = h.reason
        m.days = h.weekdays.sorted().map { Common_V1_Weekday(rawValue: Int32($0)) }
        m.startDate = date(h.start)
        let v = HabitRules.metrics(weekdays: h.weekdays, start: h.start, events: h.events, today: today)
        var metrics = Tasks_V1_HabitMetrics()
        metrics.scheduledDays = Int32(v.scheduled)
        metrics.completedDays = Int32(v.completed)
        metrics.completionRate = v.completionRate
        metrics.currentStreak = Int32(v.currentStreak)
        metrics.longestStreak = Int32(v.longestStreak)
        metrics.dueToday = v.dueToday
        metrics.doneToday = v.doneToday
        metrics.weeks = v.weeks.map { w in
            var x = Tasks_V1_HabitWeekMetrics()
            x.weekStart = date(w.weekStart)
            x.scheduledDays = Int32(w.scheduled)
            x.completedDays = Int32(w.completed)
            return x
        }
        m.metrics = metrics
        m.createdAt = Google_Protobuf_Timestamp(milliseconds: h.createdAt)
        m.updatedAt = Google_Protobuf_Timestamp(milliseconds: h.updatedAt)
        if viewer == h.ownerID, let minute = h.reminderMinute, let time = TimeOfDay(minutes: minute) {
            var r = Tasks_V1_HabitReminder()
            r.time = time.description
            r.timeZone = h.reminderZone ?? "UTC"
            m.reminder = r
        }
        return m
    }

    // MARK: Events

    struct Event: Sendable {
        var n: Int64
        var id: String
        var habitID: String
        var habitTitle: String
        var ownerID: String
        var day: LocalDate
        var comment: String
        var location: GeoPoint?
        var createdAt: Int64
        var updatedAt: Int64
        var photoSize: Int
        var photo: [UInt8]?
    }

    static func eventColumns(photo: Bool) -> String {
        "e.n, e.id, e.habit_id, h.title AS habit_title, e.owner_id, e.day, e.comment, e.latitude, e.longitude, e.created_at, e.updated_at, e.photo_size"
            + (photo ? ", e.photo" : "")
    }

    static func event(_ r: Storage.Row, photo: Bool) throws -> Event {
        let lat: Double? = try r.get("latitude"), lon: Double? = try r.get("longitude")
        return Event(
            n: try r.get("n"), id: try r.get("id"), habitID: try r.get("habit_id"), habitTitle: try r.get("habit_title"),
            ownerID: try r.get("owner_id"), day: LocalDate(key: try r.get("day")), comment: try r.get("comment"),
            location: lat.flatMap { la in lon.map { GeoPoint(latitude: la, longitude: $0) } }, createdAt: try r.get("created_at"),
            updatedAt: try r.get("updated_at"), photoSize: Int(try r.get("photo_size", as: Int64.self)),
            photo: photo ? (try r.get("photo", as: [UInt8]?.self)) : nil)
    }

    static func oneEvent(_ db: some SQLReader, id: String) throws -> Event? {
        try db.queryOne("SELECT \(eventColumns(photo: true)) FROM habit_events e JOIN habits h ON h.id = e.habit_id WHERE e.id = ?", id).map {
            try event($0, photo: true)
        }
    }

    static func proto(_ e: Event, users: [String: Common_V1_UserRef]) -> Tasks_V1_HabitEvent {
        var m = Tasks_V1_HabitEvent()
        m.eventId = e.id
        m.habitId = e.habitID
        m.habitTitle = e.habitTitle
        m.owner = users.ref(e.ownerID)
        m.date = date(e.day)
        m.comment = e.comment
        if let p = e.photo { m.photo = p }
        m.photoSizeBytes = Int32(e.photoSize)
        if let l = e.location { m.location = Geo.proto(l) }
        m.createdAt = Google_Protobuf_Timestamp(milliseconds: e.createdAt)
        m.updatedAt = Google_Protobuf_Timestamp(milliseconds: e.updatedAt)
        return m
    }
}
