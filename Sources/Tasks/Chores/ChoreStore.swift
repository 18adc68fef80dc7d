import Contracts
import Foundation
import RPCCore
import ServiceKit
import Storage

/// Chores in the database, and their conversion to and from the contract's messages.
enum ChoreStore {
    struct Row: Sendable {
        var id: String
        var householdID: String
        var name: String
        var description: String
        var timeZone: String
        var recurrence: ChoreRecurrence
        var status: ChoreStatusValue
        var due: LocalDate?
        var currentIndex: Int
        var revision: Int64
        var createdBy: String?
        var createdAt: Int64
        var lastFinishedBy: String?
        var lastFinishedAt: Int64?
        var lastFinishedRevision: Int64?
        var lastRemindedAt: Int64?
        var assignees: [String]

        var currentAssignee: String { assignees.indices.contains(currentIndex) ? assignees[currentIndex] : "" }
        var turn: ChoreTurn { ChoreTurn(assigneeCount: assignees.count, currentIndex: currentIndex, due: due, status: status) }
        var userIDs: [String] { assignees + [createdBy, lastFinishedBy].compactMap { $0 } }
    }

    static let columns = """
        id, household_id, name, description, time_zone, recurrence, every_days, weekdays, anchor_day, status, due_day, current_index,
        revision, created_by, created_at, last_finished_by, last_finished_at, last_finished_revision, last_reminded_at
        """

    // MARK: Recurrence as stored

    static func stored(_ r: ChoreRecurrence) -> (kind: Int64, days: Int64, weekdays: Int64, anchor: Int64) {
        switch r {
        case .oneTime: (1, 0, 0, 0)
        case .everyNDays(let n): (2, Int64(n), 0, 0)
        case .weekly(let days): (3, 0, days.reduce(0) { $0 | (1 << Int64($1 - 1)) }, 0)
        case .monthly(let anchor): (4, 0, 0, Int64(anchor))
        case .onDemand: (5, 0, 0, 0)
        }
    }

    static func recurrence(kind: Int64, days: Int64, weekdays: Int64, anchor: Int64) -> ChoreRecurrence {
        switch kind {
        case 2: .everyNDays(Int(days))
        case 3: .weekly(weekdays: Set((1...7).filter { weekdays & (1 << Int64($0 - 1)) != 0 }))
        case 4: .monthly(anchorDay: Int(anchor))
        case 5: .onDemand
        default: .oneTime
        }
    }

    static func proto(_ r: ChoreRecurrence) -> Tasks_V1_ChoreRecurrence {
        var m = Tasks_V1_ChoreRecurrence()
        switch r {
        case .oneTime: m.kind = .oneTime(Tasks_V1_ChoreOneTime())
        case .everyNDays(let n):
            var e = Tasks_V1_ChoreEveryNDays()
            e.days = Int32(n)
            m.kind = .everyNDays(e)
        case .weekly(let days):
            var w = Tasks_V1_ChoreWeekly()
            w.weekdays = days.sorted().compactMap { Common_V1_Weekday(rawValue: Int32($0)) }
            m.kind = .weekly(w)
        case .monthly: m.kind = .monthly(Tasks_V1_ChoreMonthly())
        case .onDemand: m.kind = .onDemand(Tasks_V1_ChoreOnDemand())
        }
        return m
    }

    // MARK: Reading

    static func row(_ r: Storage.Row, assignees: [String]) throws -> Row {
        let due: Int64? = try r.get("due_day")
        return Row(
            id: try r.get("id"), householdID: try r.get("household_id"), name: try r.get("name"), description: try r.get("description"),
            timeZone: try r.get("time_zone"),
            recurrence: recurrence(
                kind: try r.get("recurrence"), days: try r.get("every_days"), weekdays: try r.get("weekdays"), anchor: try r.get("anchor_day")),
            status: ChoreStatusValue(rawValue: Int(try r.get("status", as: Int64.self))) ?? .ended, due: due.map(LocalDate.init(key:)),
            currentIndex: try r.get("current_index"), revision: try r.get("revision"), createdBy: try r.get("created_by"),
            createdAt: try r.get("created_at"), lastFinishedBy: try r.get("last_finished_by"), lastFinishedAt: try r.get("last_finished_at"),
            lastFinishedRevision: try r.get("last_finished_revision"),
            lastRemindedAt: try r.get("last_reminded_at"), assignees: assignees)
    }

    /// Chores by id (with their rotation), in the order of `ids`.
    static func load(_ db: some SQLReader, ids: [String]) throws -> [Row] {
        guard !ids.isEmpty else { return [] }
        let marks = Array(repeating: "?", count: ids.count).joined(separator: ",")
        let args = ids.map { DatabaseValue.text($0) }
        var assignees: [String: [String]] = [:]
        for a in try db.query(
            "SELECT chore_id, user_id FROM chore_assignees WHERE chore_id IN (\(marks)) ORDER BY chore_id, position", arguments: args)
        {
            assignees[try a.get("chore_id"), default: []].append(try a.get("user_id"))
        }
        var byID: [String: Row] = [:]
        for r in try db.query("SELECT \(columns) FROM chores WHERE id IN (\(marks))", arguments: args) {
            let id: String = try r.get("id")
            byID[id] = try row(r, assignees: assignees[id] ?? [])
        }
        return ids.compactMap { byID[$0] }
    }

    static func one(_ db: some SQLReader, id: String) throws -> Row {
        guard let row = try load(db, ids: [id]).first else { throw RPCError(.notFound, "no such chore") }
        return row
    }

    static func date(_ d: LocalDate) -> Common_V1_Date {
        var m = Common_V1_Date()
        m.year = Int32(d.year)
        m.month = Int32(d.month)
        m.day = Int32(d.day)
        return m
    }

    static func proto(_ c: Row, users: [String: Common_V1_UserRef]) -> Tasks_V1_Chore {
        var m = Tasks_V1_Chore()
        m.choreId = c.id
        m.householdId = c.householdID
        m.name = c.name
        m.description_p = c.description
        if let due = c.due { m.dueDate = date(due) }
        m.assignees = c.assignees.map { users.ref($0) }
        m.currentAssigneeIndex = Int32(c.currentIndex)
        m.currentAssignee = users.ref(c.currentAssignee)
        m.recurrence = proto(c.recurrence)
        m.status = Tasks_V1_ChoreStatus(rawValue: Int32(c.status.rawValue))
        m.revision = c.revision
        m.createdBy = users.ref(c.createdBy)
        m.createdAt = Google_Protobuf_Timestamp(milliseconds: c.createdAt)
        if let at = c.lastFinishedAt {
            m.lastFinishedBy = users.ref(c.lastFinishedBy)
            m.lastFinishedAt = Google_Protobuf_Timestamp(milliseconds: at)
        }
        m.timeZone = c.timeZone
        return m
    }

    // MARK: Writing

    /// Writes the turn state the rules produced, one revision later.
    static func save(_ tx: Transaction, _ c: Row, turn: ChoreTurn, finishedBy: String? = nil, now: Int64) throws {
        let current = c.assignees.indices.contains(turn.currentIndex) ? c.assignees[turn.currentIndex] : ""
        if let finishedBy {
            try tx.execute(
                """
                UPDATE chores SET status = ?, due_day = ?, current_index = ?, current_user_id = ?, revision = revision + 1,
                    last_finished_by = ?, last_finished_at = ?, last_finished_revision = revision + 1 WHERE id = ?
                """, Int64(turn.status.rawValue), turn.due?.key, Int64(turn.currentIndex), current, finishedBy, now, c.id)
        } else {
            try tx.execute(
                "UPDATE chores SET status = ?, due_day = ?, current_index = ?, current_user_id = ?, revision = revision + 1 WHERE id = ?",
                Int64(turn.status.rawValue), turn.due?.key, Int64(turn.currentIndex), current, c.id)
        }
    }

    /// The feed position of a chore: due date ascending, WAITING (no date) last, then name, then id.
    static let feedOrder = "COALESCE(due_day, 99999999), name, id"
}
