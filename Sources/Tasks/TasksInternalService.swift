import Contracts
import Foundation
import RPCCore
import ServiceKit
import Storage

/// `tasks.v1.TasksInternal`: what other services ask of tasks (service credential only).
public struct TasksInternalService: Tasks_V1_TasksInternalService {
    let core: TasksCore

    public func listTasksAssignedToUser(
        request: Tasks_V1_ListTasksAssignedToUserRequest, context: ServerContext
    ) async throws -> Tasks_V1_ListTasksAssignedToUserResponse {
        var errors = FieldErrors()
        let user = FieldRules.id(request.userId, field: "user_id", into: &errors)
        let household = FieldRules.id(request.householdId, field: "household_id", into: &errors)
        let pageSize = FieldRules.pageSize(request.pageSize, defaultSize: 50, into: &errors)
        let filters = "assigned:\(household):\(user)"
        var cursor: [String]?
        if !request.pageToken.isEmpty {
            cursor = core.pageTokens.open(request.pageToken, filters: filters, parts: 3)
            if cursor == nil { errors.add("page_token", "not a page token of this list") }
        }
        try errors.throwIfAny()
        let (rows, more) = try await TasksService.feed(core, household: household, statuses: [1], assignee: user, cursor: cursor, pageSize: pageSize)
        let users = try await core.read { c in try UserDirectory.cached(c, rows.flatMap(\.userIDs)) }
        var response = Tasks_V1_ListTasksAssignedToUserResponse()
        response.chores = rows.map { ChoreStore.proto($0, users: users) }
        if more, let last = rows.last {
            response.nextPageToken = core.pageTokens.make(cursor: [String(last.due?.key ?? 99_999_999), last.name, last.id], filters: filters)
        }
        return response
    }

    public func endHouseholdChores(
        request: Tasks_V1_EndHouseholdChoresRequest, context: ServerContext
    ) async throws -> Tasks_V1_EndHouseholdChoresResponse {
        var errors = FieldErrors()
        let eventID = FieldRules.eventID(request.eventId, into: &errors)
        let household = FieldRules.id(request.householdId, field: "household_id", into: &errors)
        try errors.throwIfAny()
        let now = core.now
        let result = try await core.store.applyOnce(eventID: eventID) { tx -> Int in
            // ACTIVE and WAITING chores end; DONE ones stay DONE (finished history, read-only anyway).
            try tx.execute("UPDATE chores SET status = 4, revision = revision + 1 WHERE household_id = ? AND status IN (1, 2)", household)
            let ended = tx.changes
            // Their pending reminders are cancelled with them.
            _ = try ReminderStore.scheduleHousehold(tx, household: household, now: now)
            return ended
        }
        let (replayed, ended) = (result == nil, result ?? 0)
        core.logger.notice(
            replayed ? "end-household-chores replayed" : "household chores ended",
            metadata: ["event": "\(eventID)", "household": "\(household)", "ended": "\(ended)"])
        var response = Tasks_V1_EndHouseholdChoresResponse()
        response.endedCount = Int32(ended)
        response.replayed = replayed
        return response
    }

    public func removeHousemateChores(
        request: Tasks_V1_RemoveHousemateChoresRequest, context: ServerContext
    ) async throws -> Tasks_V1_RemoveHousemateChoresResponse {
        var errors = FieldErrors()
        let eventID = FieldRules.eventID(request.eventId, into: &errors)
        let household = FieldRules.id(request.householdId, field: "household_id", into: &errors)
        let user = FieldRules.id(request.userId, field: "user_id", into: &errors)
        var remaining: [String] = []
        for (i, member) in request.remainingMemberIds.enumerated() {
            let id = FieldRules.id(member, field: "remaining_member_ids[\(i)]", into: &errors)
            if id == user { errors.add("remaining_member_ids[\(i)]", "is the member who left") }
            remaining.append(id)
        }
        try errors.throwIfAny()
        // The event may arrive late (tasks was down): a member who has rejoined meanwhile keeps
        // what they hold now. Social answers UNAVAILABLE → the sender's outbox tries again.
        let rejoined = try await core.peers.membership(household: household, users: [user])?.memberships[user] == .member
        let heir = remaining.first
        let result = try await core.store.applyOnce(eventID: eventID) { tx -> Int in
            if rejoined { return 0 }
            // Open chores only (ACTIVE, WAITING): finished ones are history, read as they were.
            let chores = try tx.query(
                """
                SELECT DISTINCT a.chore_id FROM chore_assignees a JOIN chores c ON c.id = a.chore_id
                WHERE a.user_id = ? AND c.household_id = ? AND c.status IN (1, 2)
                """, user, household
            ).map { try $0.get(0, as: String.self) }
            try Self.closeRotations(tx, chores: chores, leaving: user, heir: heir)
            return chores.count
        }
        let (replayed, changed) = (result == nil, result ?? 0)
        core.logger.notice(
            replayed ? "remove-housemate-chores replayed" : "housemate's chores handed on",
            metadata: ["event": "\(eventID)", "household": "\(household)", "chores": "\(changed)"])
        var response = Tasks_V1_RemoveHousemateChoresResponse()
        response.reassignedCount = Int32(changed)
        response.replayed = replayed
        return response
    }

    /// Takes `leaving` out of each chore's rotation, which closes up around them (when it was
    /// their turn, the next assignee's). A chore left with nobody goes to `heir`, or is deleted
    /// when there is none (an erased user's only chores).
    static func closeRotations(_ tx: Transaction, chores: [String], leaving user: String, heir: String?) throws {
        for id in chores {
            let c = try ChoreStore.one(tx, id: id)
            var assignees = c.assignees
            var index = c.currentIndex
            while let removed = assignees.firstIndex(of: user) {
                guard let next = ChoreRules.indexAfterRemoving(removed, current: index, count: assignees.count) else {
                    assignees = []
                    break
                }
                assignees.remove(at: removed)
                index = next
            }
            if assignees.isEmpty {
                guard let heir else {
                    try tx.execute("DELETE FROM chores WHERE id = ?", id)
                    continue
                }
                assignees = [heir]
                index = 0
            }
            try tx.execute("DELETE FROM chore_assignees WHERE chore_id = ?", id)
            for (i, a) in assignees.enumerated() {
                try tx.execute("INSERT INTO chore_assignees (chore_id, position, user_id) VALUES (?, ?, ?)", id, Int64(i), a)
            }
            try tx.execute(
                "UPDATE chores SET current_index = ?, current_user_id = ?, revision = revision + 1 WHERE id = ?", Int64(index), assignees[index], id)
        }
    }

    public func eraseUser(request: Tasks_V1_EraseUserRequest, context: ServerContext) async throws -> Tasks_V1_EraseUserResponse {
        let now = core.now, core = self.core
        let replayed = try await EraseUser.receive(eventID: request.eventId, userID: request.userId, store: core.store) { tx, user in
            try Self.erase(tx, user: user, now: now)
            try TasksService.eraseMarketplace(core, tx, user: user, now: now)
            // Habits: deleted with their events.
            try tx.execute("DELETE FROM habits WHERE owner_id = ?", user)
        }
        var response = Tasks_V1_EraseUserResponse()
        response.replayed = replayed
        return response
    }

    /// The contract's erasure, in one transaction: the user's participation in team tasks (a task
    /// left with no one is deleted; one whose remaining participants all completed becomes
    /// COMPLETED), their upload tokens, their chore rotation slots (a chore left with no one is
    /// deleted), their personal values in the journal; comments, tasks they created, chores they
    /// created or last finished and attachments they uploaded stay, anonymised.
    static func erase(_ tx: Transaction, user: String, now: Int64) throws {
        // Team tasks.
        let tasks = try tx.query("SELECT task_id FROM team_task_participants WHERE user_id = ?", user).map { try $0.get(0, as: String.self) }
        for task in tasks {
            try tx.execute("DELETE FROM team_task_participants WHERE task_id = ? AND user_id = ?", task, user)
            try TeamTaskStore.journal(tx, "team-task.participant-erased", task: task, at: now, fields: [], personal: [])
            let left =
                try tx.queryOne("SELECT COUNT(*) FROM team_task_participants WHERE task_id = ?", task).map { try $0.get(0, as: Int64.self) } ?? 0
            if left == 0 {
                try TeamTaskStore.deleteTask(tx, task: task, now: now)
            } else {
                try TeamTaskStore.settleCompletion(tx, task: task, now: now, actor: nil)
            }
        }
        try tx.execute("UPDATE team_tasks SET creator_id = NULL WHERE creator_id = ?", user)
        try tx.execute("UPDATE team_task_comments SET author_id = NULL WHERE author_id = ?", user)
        try tx.execute("UPDATE team_task_attachments SET uploaded_by = NULL WHERE uploaded_by = ?", user)
        try tx.execute("DELETE FROM team_task_upload_tokens WHERE created_by = ?", user)

        // Chores: the rotation closes up around the erased user (a chore left with no one is deleted).
        let chores = try tx.query("SELECT DISTINCT chore_id FROM chore_assignees WHERE user_id = ?", user).map { try $0.get(0, as: String.self) }
        try closeRotations(tx, chores: chores, leaving: user, heir: nil)
        try tx.execute("UPDATE chores SET created_by = NULL WHERE created_by = ?", user)
        try tx.execute("UPDATE chores SET last_finished_by = NULL WHERE last_finished_by = ?", user)
        try tx.execute("UPDATE chore_reminder_settings SET updated_by = NULL WHERE updated_by = ?", user)

        try Journal.erase(tx, owner: user)
        try tx.execute("DELETE FROM users WHERE user_id = ?", user)
    }

    public func verifyJournal(request: Tasks_V1_VerifyJournalRequest, context: ServerContext) async throws -> Tasks_V1_VerifyJournalResponse {
        let verdict = try await core.read { c in try Journal.verify(c, chain: TeamTaskStore.chain) }
        var response = Tasks_V1_VerifyJournalResponse()
        response.intact = verdict.intact
        response.checkedEntries = verdict.checked
        response.erasedValues = verdict.erasedValues
        if let b = verdict.firstBroken {
            response.firstBrokenSequence = b.sequence
            response.firstBrokenEntryId = b.id
            response.problem = b.problem
            core.logger.error("journal broken", metadata: ["sequence": "\(b.sequence)", "entry": "\(b.id)", "problem": "\(b.problem)"])
        }
        response.headHash = verdict.head.map(HashChain.hex) ?? ""
        return response
    }
}
