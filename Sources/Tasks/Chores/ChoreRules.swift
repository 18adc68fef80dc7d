/// The chore rules of `chores.proto` as pure functions: recurrence (when the next turn is due),
/// rotation (whose turn it is), and what finishing and skipping do. No storage, no clock: the
/// handlers pass "today" in the household's zone.
public enum ChoreRecurrence: Equatable, Sendable {
    case oneTime
    case everyNDays(Int)
    /// Every 7 days (`weekdays` empty), or on the chosen ISO weekdays (1 = Monday … 7 = Sunday).
    case weekly(weekdays: Set<Int>)
    /// Monthly on `anchorDay` (the day of month of the first due date), clamped to short months.
    case monthly(anchorDay: Int)
    case onDemand

    /// The due date of the next turn after finishing one due `due` on `today`: counted from the
    /// later of the two, so a finish long after the due date, or a due date that a clock change
    /// seemed to skip, never produces a date in the past. nil for one-time and on-demand chores.
    public func next(after due: LocalDate, today: LocalDate) -> LocalDate? {
        let base = max(due, today)
        switch self {
        case .oneTime, .onDemand: return nil
        case .everyNDays(let n): return base.adding(days: max(1, n))
        case .weekly(let days):
            if days.isEmpty { return base.adding(days: 7) }
            var d = base.adding(days: 1)
            while !days.contains(d.weekday) { d = d.adding(days: 1) }
            return d
        case .monthly(let anchor): return base.adding(months: 1, anchorDay: anchor)
        }
    }
}

public enum ChoreStatusValue: Int, Sendable {
    case active = 1, waiting = 2, done = 3, ended = 4
}

/// The state the rules change.
public struct ChoreTurn: Equatable, Sendable {
    public var assigneeCount: Int
    public var currentIndex: Int
    public var due: LocalDate?
    public var status: ChoreStatusValue

    public init(assigneeCount: Int, currentIndex: Int, due: LocalDate?, status: ChoreStatusValue) {
        self.assigneeCount = assigneeCount
        self.currentIndex = currentIndex
        self.due = due
        self.status = status
    }
}

public enum ChoreRuleError: Error, Equatable, Sendable {
    case notActive
    case notCurrentAssignee
    case singleAssignee
}

public enum ChoreRules {
    /// The next index in rotation order.
    public static func rotate(_ index: Int, count: Int) -> Int { count <= 0 ? 0 : (index + 1) % count }

    /// Finish the current turn (any member): one-time → DONE; recurring → next assignee, next due
    /// date; on-demand → next assignee, WAITING, no due date.
    public static func finish(_ t: ChoreTurn, recurrence: ChoreRecurrence, today: LocalDate) throws(ChoreRuleError) -> ChoreTurn {
        guard t.status == .active, let due = t.due else { throw .notActive }
        var n = t
        switch recurrence {
        case .oneTime:
            n.status = .done
        case .onDemand:
            n.currentIndex = rotate(t.currentIndex, count: t.assigneeCount)
            n.status = .waiting
            n.due = nil
        default:
            n.currentIndex = rotate(t.currentIndex, count: t.assigneeCount)
            n.due = recurrence.next(after: due, today: today)
        }
        return n
    }

    /// Skip my turn: only the current assignee, only ACTIVE, only with two or more assignees; the
    /// next assignee takes it and the due date stays.
    public static func skip(_ t: ChoreTurn, isCurrentAssignee: Bool) throws(ChoreRuleError) -> ChoreTurn {
        guard t.status == .active else { throw .notActive }
        guard isCurrentAssignee else { throw .notCurrentAssignee }
        guard t.assigneeCount > 1 else { throw .singleAssignee }
        var n = t
        n.currentIndex = rotate(t.currentIndex, count: t.assigneeCount)
        return n
    }

    /// Who is current after the assignee at `removed` leaves the rotation (account erased): the
    /// same person if someone else left, the next in order if the current one left. nil when no
    /// one is left.
    public static func indexAfterRemoving(_ removed: Int, current: Int, count: Int) -> Int? {
        let remaining = count - 1
        guard remaining > 0 else { return nil }
        if removed < current { return current - 1 }
        if removed > current { return current }
        return current % remaining  // the next one moved into the removed slot (wrapping to 0)
    }
}
