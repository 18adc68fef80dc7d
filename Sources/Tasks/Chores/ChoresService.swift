import Contracts
import Foundation
import RPCCore
import ServiceKit
import Storage

/// Household chores (seed B), `tasks.v1.Tasks` chore RPCs. Every call checks with social that the
/// caller is a member of the chore's household (non-members get NOT_FOUND, as for a chore that
/// does not exist); the rules themselves are the pure functions of `ChoreRules`.
extension TasksService {
    static let choreNotFound = "no such chore (or you are not a member of its household)"

    /// The chore if the caller is a member of its household.
    /// - Parameter changing: a write to the chore's turn: refused at once when social says the
    ///   household was deleted, before its EndHouseholdChores event has ended the chore here.
    func memberChore(_ raw: String, caller me: String, changing: Bool = false) async throws -> ChoreStore.Row {
        var errors = FieldErrors()
        let id = FieldRules.id(raw, field: "chore_id", into: &errors)
        try errors.throwIfAny()
        guard let chore = try await core.read({ c in try ChoreStore.load(c, ids: [id]).first }) else {
            throw RPCError(.notFound, Self.choreNotFound)
        }
        let state = try await core.peers.requireMember(household: chore.householdID, user: me, what: Self.choreNotFound)
        if changing, state != .active {
            throw RPCError(.failedPrecondition, "this chore has ended (its household was deleted)")
        }
        return chore
    }

    /// Today in the chore's zone.
    func today(_ zone: String) -> LocalDate {
        LocalDate.at(milliseconds: core.now, in: ChoreZone.zone(named: zone) ?? TimeZone(identifier: "UTC")!)
    }

    static func date(_ d: Common_V1_Date, field: String, into errors: inout FieldErrors) -> LocalDate? {
        guard let v = LocalDate.valid(year: Int(d.year), month: Int(d.month), day: Int(d.day)) else {
            errors.add(field, "is not a real date between 2000 and 2100")
            return nil
        }
        return v
    }

    /// The contract's recurrence → the rule, or the problem (field path named).
    static func recurrence(_ r: Tasks_V1_ChoreRecurrence?, due: LocalDate?, into errors: inout FieldErrors) -> ChoreRecurrence? {
        guard let kind = r?.kind else {
            errors.add("recurrence", "required: one time, every N days, weekly, monthly or on demand")
            return nil
        }
        switch kind {
        case .oneTime: return .oneTime
        case .everyNDays(let e):
            guard (1...365).contains(e.days) else {
                errors.add("recurrence.every_n_days.days", "must be 1 to 365")
                return nil
            }
            return .everyNDays(Int(e.days))
        case .weekly(let w):
            var days = Set<Int>()
            for (i, d) in w.weekdays.enumerated() {
                guard (1...7).contains(d.rawValue) else {
                    errors.add("recurrence.weekly.weekdays[\(i)]", "must be a weekday (MONDAY … SUNDAY)")
                    continue
                }
                if !days.insert(Int(d.rawValue)).inserted { errors.add("recurrence.weekly.weekdays[\(i)]", "is listed twice") }
            }
            return .weekly(weekdays: days)
        case .monthly: return .monthly(anchorDay: due?.day ?? 1)
        case .onDemand: return .onDemand
        }
    }

    public func createChore(request: Tasks_V1_CreateChoreRequest, context: ServerContext) async throws -> Tasks_V1_CreateChoreResponse {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let key = FieldRules.idempotencyKey(request.idempotencyKey, into: &errors)
        let household = FieldRules.id(request.householdId, field: "household_id", into: &errors)
        let name = FieldRules.text(request.name, field: "name", 1...60, into: &errors)
        let description = FieldRules.text(request.description_p, field: "description", 0...500, multiline: true, into: &errors)
        var due: LocalDate?
        if request.hasDueDate { due = Self.date(request.dueDate, field: "due_date", into: &errors) } else { errors.add("due_date", "required") }
        if request.assigneeUserIds.isEmpty { errors.add("assignee_user_ids", "select at least one housemate") }
        let assignees = FieldRules.ids(request.assigneeUserIds, field: "assignee_user_ids", minimum: 0, maximum: 20, into: &errors)
        if assignees.count != request.assigneeUserIds.count, request.assigneeUserIds.count <= 20,
            Set(request.assigneeUserIds).count != request.assigneeUserIds.count
        {
            errors.add("assignee_user_ids", "lists a housemate twice: each takes one place in the rotation")
        }
        let zoneName = FieldRules.trimmed(request.timeZone)
        let zone = ChoreZone.zone(named: zoneName)
        if zone == nil { errors.add("time_zone", "is not a known IANA time zone (e.g. \"Europe/Berlin\")") }
        let recurrence = Self.recurrence(request.hasRecurrence ? request.recurrence : nil, due: due, into: &errors)
        if let due, let zone, due < LocalDate.at(milliseconds: core.now, in: zone) {
            errors.add("due_date", "must not be before today (\(LocalDate.at(milliseconds: core.now, in: zone)) in \(zone.identifier))")
        }
        try errors.throwIfAny()
        guard let due, let recurrence, zone != nil else { throw RPCError(.invalidArgument, "invalid request") }

        let scope = "CreateChore:\(me)", fingerprint = Idempotency.fingerprint(request)
        if var replay = try await core.store.storedAnswer(scope: scope, key: key, fingerprint: fingerprint, as: Tasks_V1_CreateChoreResponse.self) {
            replay.replayed = true
            return replay
        }
        // Membership of the caller and of every assignee (non-members named by index).
        guard let answer = try await core.peers.membership(household: household, users: Array(Set([me] + assignees))),
            answer.memberships[me] == .member
        else { throw RPCError(.notFound, "no such household (or you are not a member of it)") }
        guard answer.state == .active else { throw RPCError(.failedPrecondition, "this household was deleted: its chores have ended") }
        var members = FieldErrors()
        for (i, a) in request.assigneeUserIds.enumerated() where answer.memberships[FieldRules.trimmed(a)] != .member {
            members.add("assignee_user_ids[\(i)]", "is not a member of this household")
        }
        try members.throwIfAny(summary: "not housemates")
        let users = try await core.users.lookUp(assignees + [me])

        let now = core.now, core = self.core
        let zoneID = zoneName.isEmpty ? "UTC" : zoneName
        let (response, replayed) = try await core.write { tx -> (Tasks_V1_CreateChoreResponse, Bool) in
            try tx.idempotent(scope: scope, key: key, fingerprint: fingerprint, now: now) {
                let id = ULID.make(now: now)
                let r = ChoreStore.stored(recurrence)
                try tx.execute(
                    """
                    INSERT INTO chores (id, household_id, name, description, time_zone, recurrence, every_days, weekdays, anchor_day, status,
                        due_day, current_index, current_user_id, revision, created_by, created_at)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, 0, ?, 1, ?, ?)
                    """, id, household, name, description, zoneID, r.kind, r.days, r.weekdays, r.anchor, due.key, assignees[0], me, now)
                for (i, a) in assignees.enumerated() {
                    try tx.execute("INSERT INTO chore_assignees (chore_id, position, user_id) VALUES (?, ?, ?)", id, Int64(i), a)
                }
                try UserDirectory.remember(tx, users.values, now: now)
                let chore = try ChoreStore.one(tx, id: id)
                try ReminderStore.scheduleChore(tx, chore, now: now)
                try Self.notifyAssigned(core, tx, chore, actor: me, eventID: "tasks:chore-assigned:\(id):1", users: users)
                var out = Tasks_V1_CreateChoreResponse()
                out.chore = ChoreStore.proto(chore, users: users)
                return out
            }
        }
        core.remindersChanged()
        var out = response
        out.replayed = replayed
        return out
    }

    /// TASK_ASSIGNED to the chore's current assignee (not when they caused it themselves).
    static func notifyAssigned(
        _ core: TasksCore, _ tx: Transaction, _ chore: ChoreStore.Row, actor: String, eventID: String, users: [String: Common_V1_UserRef]
    ) throws {
        let who = chore.currentAssignee
        guard !who.isEmpty, who != actor, chore.status == .active else { return }
        let due = chore.due.map { " (due \($0))" } ?? ""
        try core.notify(
            tx, kind: .taskAssigned, recipients: [who], actor: actor, title: "Your turn: \(chore.name)",
            body: "\(Self.displayName(users.ref(actor))) says it is your turn to do \"\(chore.name)\"\(due).", target: .taskId(chore.id),
            data: ["chore_id": chore.id, "household_id": chore.householdID, "area": "chore"], eventID: eventID)
    }

    public func getChore(request: Tasks_V1_GetChoreRequest, context: ServerContext) async throws -> Tasks_V1_GetChoreResponse {
        let me = try core.caller(context)
        let chore = try await memberChore(request.choreId, caller: me)
        let staleBefore = core.users.staleBefore
        let users = try await core.read { c in try UserDirectory.cached(c, chore.userIDs, staleBefore: staleBefore) }
        core.users.refreshIfStale(users.stale)
        var response = Tasks_V1_GetChoreResponse()
        response.chore = ChoreStore.proto(chore, users: users.refs)
        return response
    }

    public func listChores(request: Tasks_V1_ListChoresRequest, context: ServerContext) async throws -> Tasks_V1_ListChoresResponse {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let household = FieldRules.id(request.householdId, field: "household_id", into: &errors)
        let pageSize = FieldRules.pageSize(request.pageSize, defaultSize: 50, into: &errors)
        var statuses = Set<Int64>()
        for (i, s) in request.statuses.enumerated() {
            if (1...4).contains(s.rawValue) { statuses.insert(Int64(s.rawValue)) } else { errors.add("statuses[\(i)]", "unknown chore status") }
        }
        if statuses.isEmpty { statuses = [1, 2] }
        let filters = "chores:\(household):\(statuses.sorted()):\(request.assignedToMe ? me : "")"
        var cursor: [String]?
        if !request.pageToken.isEmpty {
            cursor = core.pageTokens.open(request.pageToken, filters: filters, parts: 3)
            if cursor == nil { errors.add("page_token", "not a page token of this list (forged, or made for other filters)") }
        }
        try errors.throwIfAny()
        try await core.peers.requireMember(household: household, user: me, what: "no such household (or you are not a member of it)")
        let mine = request.assignedToMe
        let (rows, more) = try await Self.feed(
            core, household: household, statuses: statuses, assignee: mine ? me : nil, cursor: cursor, pageSize: pageSize)
        let staleBefore = core.users.staleBefore
        let users = try await core.read { c in try UserDirectory.cached(c, rows.flatMap(\.userIDs), staleBefore: staleBefore) }
        core.users.refreshIfStale(users.stale)
        var response = Tasks_V1_ListChoresResponse()
        response.chores = rows.map { ChoreStore.proto($0, users: users.refs) }
        if more, let last = rows.last {
            response.nextPageToken = core.pageTokens.make(
                cursor: [String(last.due?.key ?? 99_999_999), last.name, last.id], filters: filters)
        }
        return response
    }

    /// One page of a household's feed (due date, WAITING last, name, id), after `cursor`.
    static func feed(
        _ core: TasksCore, household: String, statuses: Set<Int64>, assignee: String?, cursor: [String]?, pageSize: Int
    ) async throws -> ([ChoreStore.Row], Bool) {
        try await core.read { c in
            let marks = Array(repeating: "?", count: statuses.count).joined(separator: ",")
            var sql = "SELECT id FROM chores WHERE household_id = ? AND status IN (\(marks))"
            var args: [DatabaseValue] = [.text(household)] + statuses.sorted().map { .integer($0) }
            if let assignee {
                sql += " AND current_user_id = ?"
                args.append(.text(assignee))
            }
            if let cursor, let due = Int64(cursor[0]) {
                sql += " AND (COALESCE(due_day, 99999999), name, id) > (?, ?, ?)"
                args += [.integer(due), .text(cursor[1]), .text(cursor[2])]
            }
            sql += " ORDER BY \(ChoreStore.feedOrder) LIMIT ?"
            args.append(.integer(Int64(pageSize + 1)))
            let ids = try c.query(sql, arguments: args).map { try $0.get(0, as: String.self) }
            return (try ChoreStore.load(c, ids: Array(ids.prefix(pageSize))), ids.count > pageSize)
        }
    }

    /// ABORTED when the client saw another revision (0 skips the check).
    static func checkRevision(_ expected: Int64, _ chore: ChoreStore.Row) throws {
        if expected < 0 { throw FieldErrors.single(.invalidArgument, field: "expected_revision", "must not be negative") }
        if expected != 0, expected != chore.revision {
            throw RPCError(.aborted, "the chore changed, reload (your revision \(expected), now \(chore.revision))")
        }
    }

    static func ruleError(_ e: ChoreRuleError, _ chore: ChoreStore.Row) -> RPCError {
        switch e {
        case .notActive:
            RPCError(
                .failedPrecondition,
                chore.status == .waiting
                    ? "this on-demand chore is waiting: ask for it again (RequestOnDemandChore) first"
                    : chore.status == .done ? "this chore was done already" : "this chore has ended (its household was deleted)")
        case .notCurrentAssignee: RPCError(.permissionDenied, "only the current assignee can skip their turn")
        case .singleAssignee: RPCError(.failedPrecondition, "this chore has a single assignee: there is no one to pass the turn to")
        }
    }

    public func finishChore(request: Tasks_V1_FinishChoreRequest, context: ServerContext) async throws -> Tasks_V1_FinishChoreResponse {
        let me = try core.caller(context)
        let seen = try await memberChore(request.choreId, caller: me, changing: true)
        let expected = request.expectedRevision
        try Self.checkRevision(expected, seen)
        let now = core.now, core = self.core, today = self.today(seen.timeZone)
        let window = core.configuration.duplicateFinishWindow.milliseconds
        let (chore, users) = try await core.write { tx -> (ChoreStore.Row, [String: Common_V1_UserRef]) in
            let c = try ChoreStore.one(tx, id: seen.id)
            try Self.checkRevision(expected, c)
            // Without a revision the server cannot tell "this turn" from "the next one": a finish
            // within a minute of the last one (two members tapping at once, a double tap, a
            // retry) is taken for the same turn and changes nothing — but only while nothing else
            // happened since that finish (no skip, no new request of an on-demand chore, no edit).
            if expected == 0, c.status == .active, let at = c.lastFinishedAt, now - at < window, now >= at,
                c.lastFinishedRevision == c.revision
            {
                return (c, try UserDirectory.cached(tx, c.userIDs + [me]))
            }
            let next: ChoreTurn
            do { next = try ChoreRules.finish(c.turn, recurrence: c.recurrence, today: today) } catch let e as ChoreRuleError {
                throw Self.ruleError(e, c)
            }
            try ChoreStore.save(tx, c, turn: next, finishedBy: me, now: now)
            let after = try ChoreStore.one(tx, id: c.id)
            try ReminderStore.scheduleChore(tx, after, now: now)
            let users = try UserDirectory.cached(tx, after.userIDs + [me])
            try Self.notifyAssigned(core, tx, after, actor: me, eventID: "tasks:chore-assigned:\(c.id):\(after.revision)", users: users)
            return (after, users)
        }
        core.remindersChanged()
        var response = Tasks_V1_FinishChoreResponse()
        response.chore = ChoreStore.proto(chore, users: users)
        return response
    }

    public func skipChore(request: Tasks_V1_SkipChoreRequest, context: ServerContext) async throws -> Tasks_V1_SkipChoreResponse {
        let me = try core.caller(context)
        let seen = try await memberChore(request.choreId, caller: me, changing: true)
        let expected = request.expectedRevision
        try Self.checkRevision(expected, seen)
        let now = core.now, core = self.core
        let (chore, users) = try await core.write { tx -> (ChoreStore.Row, [String: Common_V1_UserRef]) in
            let c = try ChoreStore.one(tx, id: seen.id)
            try Self.checkRevision(expected, c)
            let next: ChoreTurn
            do { next = try ChoreRules.skip(c.turn, isCurrentAssignee: c.currentAssignee == me) } catch let e as ChoreRuleError {
                throw Self.ruleError(e, c)
            }
            try ChoreStore.save(tx, c, turn: next, now: now)
            let after = try ChoreStore.one(tx, id: c.id)
            try ReminderStore.scheduleChore(tx, after, now: now)
            let users = try UserDirectory.cached(tx, after.userIDs)
            try Self.notifyAssigned(core, tx, after, actor: me, eventID: "tasks:chore-assigned:\(c.id):\(after.revision)", users: users)
            return (after, users)
        }
        core.remindersChanged()
        var response = Tasks_V1_SkipChoreResponse()
        response.chore = ChoreStore.proto(chore, users: users)
        return response
    }

    public func deleteChore(request: Tasks_V1_DeleteChoreRequest, context: ServerContext) async throws -> Tasks_V1_DeleteChoreResponse {
        let me = try core.caller(context)
        let chore = try await memberChore(request.choreId, caller: me)
        try await core.write { tx in
            try tx.execute("DELETE FROM chores WHERE id = ?", chore.id)
            if tx.changes == 0 { throw RPCError(.notFound, Self.choreNotFound) }
        }
        return Tasks_V1_DeleteChoreResponse()
    }

    public func remindChoreAssignee(
        request: Tasks_V1_RemindChoreAssigneeRequest, context: ServerContext
    ) async throws -> Tasks_V1_RemindChoreAssigneeResponse {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let message = FieldRules.text(request.message, field: "message", 0...140, multiline: true, into: &errors)
        try errors.throwIfAny()
        let seen = try await memberChore(request.choreId, caller: me, changing: true)
        let now = core.now, core = self.core, interval = core.configuration.reminderInterval.milliseconds
        let (chore, users) = try await core.write { tx -> (ChoreStore.Row, [String: Common_V1_UserRef]) in
            let c = try ChoreStore.one(tx, id: seen.id)
            guard c.status == .active else { throw Self.ruleError(.notActive, c) }
            guard c.currentAssignee != me else {
                throw RPCError(.failedPrecondition, "it is your own turn: there is no one to remind")
            }
            if let last = c.lastRemindedAt, now - last < interval {
                throw RPCError.throttled(
                    "this chore's assignee was reminded less than an hour ago", wait: SlidingWindowThrottle.Wait(milliseconds: last + interval - now))
            }
            try tx.execute("UPDATE chores SET last_reminded_at = ? WHERE id = ?", now, c.id)
            let users = try UserDirectory.cached(tx, c.userIDs + [me])
            let due = c.due.map { " (due \($0))" } ?? ""
            try core.notify(
                tx, kind: .taskReminder, recipients: [c.currentAssignee], actor: me, title: "Reminder: \(c.name)",
                body: message.isEmpty ? "\(Self.displayName(users.ref(me))) reminds you to do \"\(c.name)\"\(due)." : message,
                target: .taskId(c.id), data: ["chore_id": c.id, "household_id": c.householdID, "area": "chore"],
                eventID: "tasks:chore-reminder:\(ULID.make(now: now))")
            return (c, users)
        }
        var response = Tasks_V1_RemindChoreAssigneeResponse()
        response.reminded = users.ref(chore.currentAssignee)
        return response
    }

    public func requestOnDemandChore(
        request: Tasks_V1_RequestOnDemandChoreRequest, context: ServerContext
    ) async throws -> Tasks_V1_RequestOnDemandChoreResponse {
        let me = try core.caller(context)
        var errors = FieldErrors()
        var due: LocalDate?
        if request.hasDueDate { due = Self.date(request.dueDate, field: "due_date", into: &errors) } else { errors.add("due_date", "required") }
        try errors.throwIfAny()
        let seen = try await memberChore(request.choreId, caller: me, changing: true)
        let today = self.today(seen.timeZone)
        if let due, due < today { throw FieldErrors.single(.invalidArgument, field: "due_date", "must not be before today (\(today))") }
        guard let due else { throw RPCError(.invalidArgument, "due_date: required") }
        let now = core.now, core = self.core
        let (chore, users) = try await core.write { tx -> (ChoreStore.Row, [String: Common_V1_UserRef]) in
            let c = try ChoreStore.one(tx, id: seen.id)
            guard c.recurrence == .onDemand, c.status == .waiting else {
                throw RPCError(
                    .failedPrecondition,
                    c.recurrence == .onDemand
                        ? "this chore is not waiting (it is already due or has ended)" : "only on-demand chores can be asked for again")
            }
            let turn = ChoreTurn(assigneeCount: c.assignees.count, currentIndex: c.currentIndex, due: due, status: .active)
            try ChoreStore.save(tx, c, turn: turn, now: now)
            let after = try ChoreStore.one(tx, id: c.id)
            try ReminderStore.scheduleChore(tx, after, now: now)
            let users = try UserDirectory.cached(tx, after.userIDs + [me])
            try Self.notifyAssigned(core, tx, after, actor: me, eventID: "tasks:chore-assigned:\(c.id):\(after.revision)", users: users)
            return (after, users)
        }
        core.remindersChanged()
        var response = Tasks_V1_RequestOnDemandChoreResponse()
        response.chore = ChoreStore.proto(chore, users: users)
        return response
    }
}
