import Contracts
import Foundation
import RPCCore
import ServiceKit
import Storage

/// Automatic reminders in the database: the households' chore reminder settings, the habits'
/// reminder times, and one row per chore or habit in `reminders` naming its next occurrence and
/// the UTC instant it fires (NULL: nothing pending; the row then only remembers which occurrences
/// were handled, so none is ever sent twice). Every write that changes what a chore or habit
/// should remind recomputes its row here, in the write's own transaction; the scanner
/// (`ReminderScheduler`) reads only rows whose instant has come, through `reminders_due`.
enum ReminderStore {
    static let migration = Migration(
        name: "reminders.001-tables",
        sql: """
            -- A household's choice for its chores' automatic reminders (none: 09:00, on).
            CREATE TABLE chore_reminder_settings (
                household_id TEXT PRIMARY KEY NOT NULL,
                minute_of_day INTEGER NOT NULL,     -- local time of day, 0..1439
                reminders_off INTEGER NOT NULL DEFAULT 0,
                updated_by TEXT,                    -- NULL once erased
                updated_at INTEGER NOT NULL
            ) WITHOUT ROWID;
            -- The next occurrence of each chore's or habit's reminder. Occurrences before it are
            -- handled (sent, dropped as stale, or passed over by a write).
            CREATE TABLE reminders (
                subject TEXT NOT NULL,              -- 'chore' or 'habit'
                subject_id TEXT NOT NULL,
                occurrence_day INTEGER NOT NULL,    -- yyyymmdd: chore: the turn's due date; habit: the day it fires for
                phase INTEGER NOT NULL DEFAULT 0,   -- chore: 0 due-day, 1 overdue, 2 both handled; habit: 0
                fire_at INTEGER,                    -- UTC Unix ms it fires at; NULL = nothing pending
                handled_through INTEGER,            -- habit: yyyymmdd of the last day handled; no write goes back to it
                PRIMARY KEY (subject, subject_id)
            ) WITHOUT ROWID;
            -- The due scan: only pending rows, by instant.
            CREATE INDEX reminders_due ON reminders(fire_at) WHERE fire_at IS NOT NULL;
            CREATE TRIGGER chores_reminders_delete AFTER DELETE ON chores BEGIN
                DELETE FROM reminders WHERE subject = 'chore' AND subject_id = old.id;
            END;
            CREATE TRIGGER habits_reminders_delete AFTER DELETE ON habits BEGIN
                DELETE FROM reminders WHERE subject = 'habit' AND subject_id = old.id;
            END;
            -- A habit's reminder: local minute of day and the zone it was set in (NULL: none).
            ALTER TABLE habits ADD COLUMN reminder_minute INTEGER;
            ALTER TABLE habits ADD COLUMN reminder_zone TEXT;
            """)

    enum Subject: String, Sendable {
        case chore, habit
    }

    // MARK: Household settings

    struct Settings: Sendable, Equatable {
        var time: TimeOfDay = .nineAM
        var off = false
        var updatedBy: String?
        var updatedAt: Int64?
    }

    static func settings(_ db: some SQLReader, household: String) throws -> Settings {
        guard
            let r = try db.queryOne(
                "SELECT minute_of_day, reminders_off, updated_by, updated_at FROM chore_reminder_settings WHERE household_id = ?", household)
        else { return Settings() }
        return Settings(
            time: TimeOfDay(minutes: Int(try r.get("minute_of_day", as: Int64.self))) ?? .nineAM,
            off: try r.get("reminders_off", as: Int64.self) != 0, updatedBy: try r.get("updated_by"), updatedAt: try r.get("updated_at"))
    }

    static func proto(_ s: Settings, household: String, users: [String: Common_V1_UserRef]) -> Tasks_V1_ChoreReminderSettings {
        var m = Tasks_V1_ChoreReminderSettings()
        m.householdId = household
        m.reminderTime = s.time.description
        m.remindersOff = s.off
        if let at = s.updatedAt {
            m.updatedBy = users.ref(s.updatedBy)
            m.updatedAt = Google_Protobuf_Timestamp(milliseconds: at)
        }
        return m
    }

    // MARK: Rows

    struct Pending: Sendable, Equatable {
        var subject: Subject
        var id: String
        var day: LocalDate
        var phase: Int
        var fireAt: Int64?
        /// Habits: the last day handled (sent, dropped, already done); nil for chores.
        var handledThrough: LocalDate? = nil
    }

    static func pending(_ r: Storage.Row, _ subject: Subject, _ id: String) throws -> Pending {
        let handled: Int64? = try r.get("handled_through")
        return Pending(
            subject: subject, id: id, day: LocalDate(key: try r.get("occurrence_day")), phase: Int(try r.get("phase", as: Int64.self)),
            fireAt: try r.get("fire_at"), handledThrough: handled.map(LocalDate.init(key:)))
    }

    static func pending(_ db: some SQLReader, _ subject: Subject, _ id: String) throws -> Pending? {
        try db.queryOne(
            "SELECT occurrence_day, phase, fire_at, handled_through FROM reminders WHERE subject = ? AND subject_id = ?", subject.rawValue, id
        ).map { r in try pending(r, subject, id) }
    }

    static func save(_ tx: Transaction, _ p: Pending) throws {
        try tx.execute(
            """
            INSERT INTO reminders (subject, subject_id, occurrence_day, phase, fire_at, handled_through) VALUES (?, ?, ?, ?, ?, ?)
            ON CONFLICT (subject, subject_id) DO UPDATE SET occurrence_day = excluded.occurrence_day, phase = excluded.phase,
                fire_at = excluded.fire_at, handled_through = excluded.handled_through
            """, p.subject.rawValue, p.id, p.day.key, Int64(p.phase), p.fireAt, p.handledThrough?.key)
    }

    /// The earliest pending instant (the scanner sleeps until then), via `reminders_due`.
    static let earliestSQL = "SELECT MIN(fire_at) FROM reminders WHERE fire_at IS NOT NULL"
    /// Pending rows due at `?`, earliest first, at most `?`: a range of `reminders_due`, never a
    /// scan of chores or habits.
    static let dueSQL = """
        SELECT subject, subject_id, occurrence_day, phase, fire_at, handled_through FROM reminders
        WHERE fire_at IS NOT NULL AND fire_at <= ? ORDER BY fire_at LIMIT ?
        """

    static func earliest(_ db: some SQLReader) throws -> Int64? {
        try db.queryOne(earliestSQL).flatMap { try $0.get(0, as: Int64?.self) }
    }

    static func due(_ db: some SQLReader, now: Int64, limit: Int) throws -> [Pending] {
        try db.query(dueSQL, now, Int64(limit)).compactMap { r in
            guard let subject = Subject(rawValue: try r.get("subject")) else { return nil }
            return try pending(r, subject, try r.get("subject_id"))
        }
    }

    // MARK: Chores

    static func zone(_ name: String?) -> TimeZone { ChoreZone.zone(named: name ?? "") ?? TimeZone(identifier: "UTC") ?? .current }

    static func chorePending(_ p: Pending) -> ReminderRules.ChorePending {
        ReminderRules.ChorePending(due: p.day, phase: ReminderRules.ChorePhase(rawValue: p.phase) ?? .finished, fireAt: p.fireAt)
    }

    static func row(_ id: String, _ c: ReminderRules.ChorePending) -> Pending {
        Pending(subject: .chore, id: id, day: c.due, phase: c.phase.rawValue, fireAt: c.fireAt)
    }

    /// Recomputes a chore's pending reminder after a write (`ReminderRules.chorePlan`): ACTIVE
    /// with a due date and someone to remind, reminders on in its household → the next phase not
    /// yet handled whose time is ahead; otherwise nothing pending. Returns the row as saved.
    @discardableResult
    static func scheduleChore(_ tx: Transaction, _ c: ChoreStore.Row, now: Int64, settings known: Settings? = nil) throws -> Pending? {
        let settings = try known ?? Self.settings(tx, household: c.householdID)
        let stored = try pending(tx, .chore, c.id)
        let remindable = c.status == .active && !c.currentAssignee.isEmpty && !settings.off
        guard
            let plan = ReminderRules.chorePlan(
                due: remindable ? c.due : nil, time: settings.time, zone: zone(c.timeZone), stored: stored.map(chorePending), now: now)
        else { return nil }
        let saved = Self.row(c.id, plan)
        if saved != stored { try save(tx, saved) }
        return saved
    }

    /// Recomputes every open chore of a household (its settings changed, or it ended).
    static func scheduleHousehold(_ tx: Transaction, household: String, now: Int64) throws -> Int {
        let settings = try settings(tx, household: household)
        let ids = try tx.query("SELECT id FROM chores WHERE household_id = ?", household).map {
            try $0.get(0, as: String.self)
        }
        var changed = 0
        for start in stride(from: 0, to: ids.count, by: 500) {
            for c in try ChoreStore.load(tx, ids: Array(ids[start..<min(start + 500, ids.count)])) {
                let before = try pending(tx, .chore, c.id)
                if try scheduleChore(tx, c, now: now, settings: settings) != before { changed += 1 }
            }
        }
        return changed
    }

    // MARK: Habits

    /// What a habit's reminder needs of the habit (never its events).
    struct HabitSchedule: Sendable {
        var id: String
        var ownerID: String
        var title: String
        var reason: String
        var weekdays: Set<Int>
        var start: LocalDate
        var time: TimeOfDay?
        var zone: String
    }

    static func habitSchedule(_ db: some SQLReader, id: String) throws -> HabitSchedule? {
        try db.queryOne(
            "SELECT id, owner_id, title, reason, weekdays, start_day, reminder_minute, reminder_zone FROM habits WHERE id = ?", id
        ).map { r in
            let minute: Int64? = try r.get("reminder_minute")
            return HabitSchedule(
                id: try r.get("id"), ownerID: try r.get("owner_id"), title: try r.get("title"), reason: try r.get("reason"),
                weekdays: HabitStore.days(try r.get("weekdays")), start: LocalDate(key: try r.get("start_day")),
                time: minute.flatMap { TimeOfDay(minutes: Int($0)) }, zone: try r.get("reminder_zone", as: String?.self) ?? "UTC")
        }
    }

    /// Recomputes a habit's pending reminder (created, schedule or reminder changed): the first
    /// scheduled day after the last one handled whose time is ahead; the stored one when it is
    /// already due and unchanged (waiting for the scanner); nothing pending without a reminder.
    /// A day handled once (sent, dropped, found done) is never pending again, whatever changes.
    @discardableResult
    static func scheduleHabit(_ tx: Transaction, id: String, now: Int64) throws -> Pending? {
        let stored = try pending(tx, .habit, id)
        guard let h = try habitSchedule(tx, id: id), let time = h.time else {
            guard var stored, stored.fireAt != nil else { return stored }
            stored.fireAt = nil
            try save(tx, stored)
            return stored
        }
        let zone = zone(h.zone)
        let handled = stored?.handledThrough
        var row = Pending(subject: .habit, id: h.id, day: stored?.day ?? h.start, phase: 0, fireAt: nil, handledThrough: handled)
        if let stored, let at = stored.fireAt, at <= now, stored.day >= h.start, h.weekdays.contains(stored.day.weekday),
            ReminderRules.nextFireInstant(localDate: stored.day, timeOfDay: time, zone: zone) == at
        {
            row = stored
        } else if let next = ReminderRules.habitNext(
            from: handled?.adding(days: 1) ?? h.start, weekdays: h.weekdays, start: h.start, time: time, zone: zone, after: now)
        {
            row.day = next.day
            row.fireAt = next.fireAt
        }
        if row != stored { try save(tx, row) }
        return row
    }

    // MARK: Upgrading

    /// Gives every ACTIVE chore and every habit with a reminder that has no row yet (chores made
    /// before reminders existed) its pending reminder, as a write would. Run at every start;
    /// finds nothing to do after the first.
    static func backfill(_ tx: Transaction, now: Int64) throws -> Int {
        let chores = try tx.query(
            """
            SELECT c.id FROM chores c WHERE c.status = 1
            AND NOT EXISTS (SELECT 1 FROM reminders r WHERE r.subject = 'chore' AND r.subject_id = c.id)
            """
        ).map { try $0.get(0, as: String.self) }
        var settings: [String: Settings] = [:]
        for start in stride(from: 0, to: chores.count, by: 500) {
            for c in try ChoreStore.load(tx, ids: Array(chores[start..<min(start + 500, chores.count)])) {
                if settings[c.householdID] == nil { settings[c.householdID] = try Self.settings(tx, household: c.householdID) }
                try scheduleChore(tx, c, now: now, settings: settings[c.householdID])
            }
        }
        let habits = try tx.query(
            """
            SELECT h.id FROM habits h WHERE h.reminder_minute IS NOT NULL
            AND NOT EXISTS (SELECT 1 FROM reminders r WHERE r.subject = 'habit' AND r.subject_id = h.id)
            """
        ).map { try $0.get(0, as: String.self) }
        for h in habits { try scheduleHabit(tx, id: h, now: now) }
        return chores.count + habits.count
    }
}
