import Contracts
import Foundation
import RPCCore
import ServiceKit
import ServiceKitTesting
import Storage
import Testing

@testable import Tasks

/// Household chores over real gRPC: every RPC and every error chores.proto names. The clock is
/// set to a Monday, 2025-03-17 09:00 UTC (10:00 in Berlin), and moved, never slept on.
@Suite("Tasks: chores")
struct ChoreTests {
    static let monday = utc(2025, 3, 17, 9)

    @Test func createValidatesAndChecksHouseholdMembership() async throws {
        try await withWorld(now: Self.monday) { w in
            let (a, b, c, outsider) = (try await w.user("a"), try await w.user("b"), try await w.user("c"), try await w.user("o"))
            let hh = try await w.household([a, b, c])
            var r = createChore(
                household: hh, name: " ", due: date(2025, 2, 30), assignees: [], recurrence: Tasks_V1_ChoreRecurrence(), zone: "Nowhere/City")
            r.idempotencyKey = ""
            r.description_p = String(repeating: "x", count: 501)
            await expectFailure(
                .invalidArgument,
                fields: ["idempotency_key", "name", "description", "due_date", "assignee_user_ids", "recurrence", "time_zone"]
            ) { try await w.tasks.createChore(r, options: a.options) }
            // Not before today in the household's zone.
            await expectFailure(.invalidArgument, fields: ["due_date"]) {
                try await w.tasks.createChore(createChore(household: hh, due: date(2025, 3, 16), assignees: [a.id]), options: a.options)
            }
            var bad = createChore(
                household: hh, due: date(2025, 3, 17), assignees: [a.id], recurrence: recurrence(.everyNDays(Tasks_V1_ChoreEveryNDays())))
            await expectFailure(.invalidArgument, fields: ["recurrence.every_n_days.days"]) { try await w.tasks.createChore(bad, options: a.options) }
            bad.recurrence = weekly([.monday, .monday, .unspecified])
            await expectFailure(.invalidArgument, fields: ["recurrence.weekly.weekdays[1]", "recurrence.weekly.weekdays[2]"]) {
                try await w.tasks.createChore(bad, options: a.options)
            }
            await expectFailure(.invalidArgument, fields: ["assignee_user_ids"]) {
                try await w.tasks.createChore(createChore(household: hh, due: date(2025, 3, 17), assignees: [a.id, a.id]), options: a.options)
            }
            // Non-members named by index; a caller who is not a member gets NOT_FOUND.
            await expectFailure(.invalidArgument, fields: ["assignee_user_ids[1]"]) {
                try await w.tasks.createChore(createChore(household: hh, due: date(2025, 3, 17), assignees: [a.id, outsider.id]), options: a.options)
            }
            await expectFailure(.notFound) {
                try await w.tasks.createChore(createChore(household: hh, due: date(2025, 3, 17), assignees: [a.id]), options: outsider.options)
            }
            await expectFailure(.notFound) {
                try await w.tasks.createChore(createChore(household: "hh_nope", due: date(2025, 3, 17), assignees: [a.id]), options: a.options)
            }

            let created = try await w.tasks.createChore(
                createChore(household: hh, due: date(2025, 3, 17), assignees: [a.id, b.id, c.id], key: "k1"), options: b.options)
            let chore = created.chore
            #expect(!created.replayed && chore.status == .active && chore.revision == 1 && chore.currentAssigneeIndex == 0)
            #expect(chore.assignees.map(\.userId) == [a.id, b.id, c.id] && chore.currentAssignee.username == a.username)
            #expect(chore.createdBy.userId == b.id && chore.timeZone == "Europe/London" && chore.dueDate == date(2025, 3, 17))
            let again = try await w.tasks.createChore(
                createChore(household: hh, due: date(2025, 3, 17), assignees: [a.id, b.id, c.id], key: "k1"), options: b.options)
            #expect(again.replayed && again.chore.choreId == chore.choreId)
            // The first assignee is told (not the creator: a ≠ b).
            #expect(try await w.outboxDrained())
            #expect(try await w.notifications(to: a, kind: .taskAssigned).count == 1)
        }
    }

    /// A RemoveHousemateChores that arrives after the member rejoined (tasks was down meanwhile)
    /// changes nothing: the member keeps what they hold now.
    @Test func aLateRemovalLeavesAMemberWhoRejoinedAlone() async throws {
        try await withWorld(now: Self.monday) { w in
            let a = try await w.user("a"), b = try await w.user("b")
            let hh = try await w.household([a, b])
            let chore = try await w.tasks.createChore(createChore(household: hh, due: date(2025, 3, 20), assignees: [b.id]), options: a.options)
                .chore.choreId
            var late = Tasks_V1_RemoveHousemateChoresRequest()
            late.eventId = "social:left:late"
            late.householdId = hh
            late.userId = b.id
            late.remainingMemberIds = [a.id]
            let answer = try await w.internalAPI.removeHousemateChores(late)
            #expect(answer.reassignedCount == 0 && !answer.replayed)
            var get = Tasks_V1_GetChoreRequest()
            get.choreId = chore
            #expect(try await w.tasks.getChore(get, options: b.options).chore.assignees.map(\.userId) == [b.id])
            #expect(try await w.internalAPI.removeHousemateChores(late).replayed)
        }
    }

    @Test func weeklyRotatesOnFinishSkipKeepsTheDateAndRevisionsGuard() async throws {
        try await withWorld(now: Self.monday) { w in
            let (a, b, c, o) = (try await w.user("a"), try await w.user("b"), try await w.user("c"), try await w.user("o"))
            let hh = try await w.household([a, b, c])
            var chore = try await w.tasks.createChore(
                createChore(household: hh, due: date(2025, 3, 17), assignees: [a.id, b.id, c.id], zone: "Europe/Berlin"), options: a.options
            ).chore
            var finish = Tasks_V1_FinishChoreRequest()
            finish.choreId = chore.choreId
            finish.expectedRevision = 1
            await expectFailure(.notFound) { try await w.tasks.finishChore(finish, options: o.options) }
            chore = try await w.tasks.finishChore(finish, options: c.options).chore  // any member may finish
            #expect(chore.currentAssignee.userId == b.id && chore.dueDate == date(2025, 3, 24) && chore.revision == 2)
            #expect(chore.lastFinishedBy.userId == c.id && chore.hasLastFinishedAt)
            // A stale revision → ABORTED, nothing changes.
            let stale = await expectFailure(.aborted) { try await w.tasks.finishChore(finish, options: a.options) }
            #expect(stale?.message.contains("reload") == true)

            var skip = Tasks_V1_SkipChoreRequest()
            skip.choreId = chore.choreId
            await expectFailure(.permissionDenied) { try await w.tasks.skipChore(skip, options: a.options) }
            skip.expectedRevision = 1
            await expectFailure(.aborted) { try await w.tasks.skipChore(skip, options: b.options) }
            skip.expectedRevision = 2
            chore = try await w.tasks.skipChore(skip, options: b.options).chore
            #expect(chore.currentAssignee.userId == c.id && chore.dueDate == date(2025, 3, 24) && chore.revision == 3)

            // Finished three weeks late (2025-04-14): the next turn is a week after today, not in the past.
            w.clock.set(milliseconds: utc(2025, 4, 14, 20))
            finish.expectedRevision = 0
            chore = try await w.tasks.finishChore(finish, options: c.options).chore
            #expect(chore.currentAssignee.userId == a.id && chore.dueDate == date(2025, 4, 21))
            // Late evening in Berlin is already the next day there: 2025-04-20 22:30 UTC = 00:30 on the 21st.
            w.clock.set(milliseconds: utc(2025, 4, 20, 22, 30))
            w.clock.advance(by: .seconds(120))
            chore = try await w.tasks.finishChore(finish, options: a.options).chore
            #expect(chore.dueDate == date(2025, 4, 28))
            #expect(try await w.outboxDrained())
            // Each new current assignee was told (b after c finished, c after b skipped, a, b).
            #expect(try await w.notifications(to: b, kind: .taskAssigned).count == 2)
            #expect(try await w.notifications(to: c, kind: .taskAssigned).count == 1)
        }
    }

    @Test func twoMembersFinishingAtOnceFinishItOnce() async throws {
        try await withWorld(now: Self.monday) { w in
            let (a, b, c) = (try await w.user("a"), try await w.user("b"), try await w.user("c"))
            let hh = try await w.household([a, b, c])
            for expected: Int64 in [1, 0] {
                let chore = try await w.tasks.createChore(
                    createChore(household: hh, name: "Race \(expected)", due: date(2025, 3, 17), assignees: [a.id, b.id, c.id]), options: a.options
                ).chore
                var finish = Tasks_V1_FinishChoreRequest()
                finish.choreId = chore.choreId
                finish.expectedRevision = expected
                let req = finish
                let results = await withTaskGroup(of: Result<Tasks_V1_Chore, RPCError>.self) { group in
                    for u in [a, b, c] {
                        group.addTask {
                            do { return .success(try await w.tasks.finishChore(req, options: u.options).chore) } catch let e as RPCError {
                                return .failure(e)
                            } catch { return .failure(RPCError(.unknown, "\(error)")) }
                        }
                    }
                    var out: [Result<Tasks_V1_Chore, RPCError>] = []
                    for await r in group { out.append(r) }
                    return out
                }
                var get = Tasks_V1_GetChoreRequest()
                get.choreId = chore.choreId
                let now = try await w.tasks.getChore(get, options: a.options).chore
                // Finished once: one turn on, one week on.
                #expect(now.revision == 2 && now.currentAssigneeIndex == 1 && now.dueDate == date(2025, 3, 24), "expected_revision \(expected)")
                if expected != 0 {
                    #expect(results.filter { if case .failure(let e) = $0 { return e.code == .aborted } else { return false } }.count == 2)
                }
            }
        }
    }

    @Test func remindOncePerHourNeverMyself() async throws {
        try await withWorld(now: Self.monday) { w in
            let (a, b) = (try await w.user("a"), try await w.user("b"))
            let hh = try await w.household([a, b])
            let chore = try await w.tasks.createChore(
                createChore(household: hh, due: date(2025, 3, 18), assignees: [a.id, b.id]), options: a.options
            ).chore
            var remind = Tasks_V1_RemindChoreAssigneeRequest()
            remind.choreId = chore.choreId
            await expectFailure(.failedPrecondition) { try await w.tasks.remindChoreAssignee(remind, options: a.options) }
            remind.message = "Bins go out tonight!"
            #expect(try await w.tasks.remindChoreAssignee(remind, options: b.options).reminded.userId == a.id)
            let f = await expectFailure(.resourceExhausted) { try await w.tasks.remindChoreAssignee(remind, options: b.options) }
            #expect((f?.retryDelaySeconds ?? 0) > 3000)
            w.clock.advance(by: .seconds(3601))
            _ = try await w.tasks.remindChoreAssignee(remind, options: b.options)
            remind.message = String(repeating: "x", count: 141)
            await expectFailure(.invalidArgument, fields: ["message"]) { try await w.tasks.remindChoreAssignee(remind, options: b.options) }
            #expect(try await w.outboxDrained())
            let reminders = try await w.notifications(to: a, kind: .taskReminder)
            #expect(reminders.count == 2 && reminders[0].body == "Bins go out tonight!" && reminders[0].actorUserId == b.id)
        }
    }

    @Test func oneTimeOnDemandAndMonthly() async throws {
        try await withWorld(now: Self.monday) { w in
            let (a, b) = (try await w.user("a"), try await w.user("b"))
            let hh = try await w.household([a, b])
            var once = try await w.tasks.createChore(
                createChore(
                    household: hh, name: "Fix the tap", due: date(2025, 3, 20), assignees: [a.id, b.id], recurrence: recurrence(.oneTime(.init()))),
                options: a.options
            ).chore
            var finish = Tasks_V1_FinishChoreRequest()
            finish.choreId = once.choreId
            once = try await w.tasks.finishChore(finish, options: b.options).chore
            #expect(once.status == .done)
            await expectFailure(.failedPrecondition) { try await w.tasks.finishChore(finish, options: b.options) }
            var remind = Tasks_V1_RemindChoreAssigneeRequest()
            remind.choreId = once.choreId
            await expectFailure(.failedPrecondition) { try await w.tasks.remindChoreAssignee(remind, options: b.options) }

            var kettle = try await w.tasks.createChore(
                createChore(
                    household: hh, name: "Descale the kettle", due: date(2025, 3, 17), assignees: [a.id, b.id],
                    recurrence: recurrence(.onDemand(.init()))),
                options: a.options
            ).chore
            var again = Tasks_V1_RequestOnDemandChoreRequest()
            again.choreId = kettle.choreId
            again.dueDate = date(2025, 3, 20)
            await expectFailure(.failedPrecondition) { try await w.tasks.requestOnDemandChore(again, options: a.options) }  // not WAITING
            finish.choreId = kettle.choreId
            kettle = try await w.tasks.finishChore(finish, options: a.options).chore
            #expect(kettle.status == .waiting && !kettle.hasDueDate && kettle.currentAssignee.userId == b.id)
            again.dueDate = date(2025, 3, 16)
            await expectFailure(.invalidArgument, fields: ["due_date"]) { try await w.tasks.requestOnDemandChore(again, options: a.options) }
            again.dueDate = date(2025, 3, 20)
            kettle = try await w.tasks.requestOnDemandChore(again, options: a.options).chore
            #expect(kettle.status == .active && kettle.dueDate == date(2025, 3, 20) && kettle.currentAssignee.userId == b.id)
            // Asked for again and finished within the same minute: a new turn, not the last finish
            // seen twice (the double-tap rule holds only while nothing happened since).
            #expect(finish.expectedRevision == 0)
            let turnTaken = try await w.tasks.finishChore(finish, options: b.options).chore
            #expect(turnTaken.status == .waiting && turnTaken.currentAssignee.userId == a.id)
            kettle = try await w.tasks.requestOnDemandChore(again, options: a.options).chore
            again.choreId = once.choreId
            await expectFailure(.failedPrecondition) { try await w.tasks.requestOnDemandChore(again, options: a.options) }

            let rent = try await w.tasks.createChore(
                createChore(household: hh, name: "Pay rent", due: date(2025, 3, 31), assignees: [a.id], recurrence: recurrence(.monthly(.init()))),
                options: a.options
            ).chore
            finish.choreId = rent.choreId
            var skip = Tasks_V1_SkipChoreRequest()
            skip.choreId = rent.choreId
            await expectFailure(.failedPrecondition) { try await w.tasks.skipChore(skip, options: a.options) }  // single assignee
            finish.expectedRevision = 1
            #expect(try await w.tasks.finishChore(finish, options: a.options).chore.dueDate == date(2025, 4, 30))
            finish.expectedRevision = 2
            #expect(try await w.tasks.finishChore(finish, options: a.options).chore.dueDate == date(2025, 5, 31))
            // Without a revision, a second finish within a minute is the same turn (a double tap).
            finish.expectedRevision = 0
            #expect(try await w.tasks.finishChore(finish, options: a.options).chore.dueDate == date(2025, 5, 31))
            w.clock.advance(by: .seconds(61))
            #expect(try await w.tasks.finishChore(finish, options: a.options).chore.dueDate == date(2025, 6, 30))
        }
    }

    @Test func feedOrderFiltersPagesAndDelete() async throws {
        try await withWorld(now: Self.monday) { w in
            let (a, b, o) = (try await w.user("a"), try await w.user("b"), try await w.user("o"))
            let hh = try await w.household([a, b])
            let other = try await w.household([o])
            func make(_ name: String, _ due: Common_V1_Date, _ who: [String], _ r: Tasks_V1_ChoreRecurrence = weekly()) async throws -> Tasks_V1_Chore
            {
                try await w.tasks.createChore(createChore(household: hh, name: name, due: due, assignees: who, recurrence: r), options: a.options)
                    .chore
            }
            let dishes = try await make("Dishes", date(2025, 3, 18), [b.id])
            let bins = try await make("Bins", date(2025, 3, 18), [a.id])
            let floor = try await make("Floor", date(2025, 3, 17), [a.id])
            var kettle = try await make("Kettle", date(2025, 3, 17), [a.id, b.id], recurrence(.onDemand(.init())))
            var finish = Tasks_V1_FinishChoreRequest()
            finish.choreId = kettle.choreId
            kettle = try await w.tasks.finishChore(finish, options: a.options).chore  // WAITING, b's turn
            let oneOff = try await make("Window", date(2025, 3, 19), [a.id], recurrence(.oneTime(.init())))
            finish.choreId = oneOff.choreId
            _ = try await w.tasks.finishChore(finish, options: a.options)  // DONE
            _ = try await w.tasks.createChore(createChore(household: other, due: date(2025, 3, 17), assignees: [o.id]), options: o.options)

            var list = Tasks_V1_ListChoresRequest()
            list.householdId = hh
            list.pageSize = 2
            var names: [String] = []
            repeat {
                let page = try await w.tasks.listChores(list, options: b.options)
                names += page.chores.map(\.name)
                list.pageToken = page.nextPageToken
            } while !list.pageToken.isEmpty
            #expect(names == ["Floor", "Bins", "Dishes", "Kettle"])  // by date, ties by name, WAITING last, DONE not shown
            list = Tasks_V1_ListChoresRequest()
            list.householdId = hh
            list.statuses = [.done]
            #expect(try await w.tasks.listChores(list, options: a.options).chores.map(\.name) == ["Window"])
            list.statuses = []
            list.assignedToMe = true
            #expect(try await w.tasks.listChores(list, options: b.options).chores.map(\.name) == ["Dishes", "Kettle"])
            list.statuses = [.unrecognized(9)]
            await expectFailure(.invalidArgument, fields: ["statuses[0]"]) { try await w.tasks.listChores(list, options: b.options) }
            list.statuses = []
            list.pageToken = "x.y"
            await expectFailure(.invalidArgument, fields: ["page_token"]) { try await w.tasks.listChores(list, options: b.options) }
            list.pageToken = ""
            await expectFailure(.notFound) { try await w.tasks.listChores(list, options: o.options) }

            // social's housemate profile: b's ACTIVE chores, by due date.
            var assigned = Tasks_V1_ListTasksAssignedToUserRequest()
            assigned.userId = b.id
            assigned.householdId = hh
            #expect(try await w.internalAPI.listTasksAssignedToUser(assigned).chores.map(\.name) == ["Dishes"])
            await expectFailure(.permissionDenied) { try await Tasks_V1_TasksInternalClient(w.server.gateway).listTasksAssignedToUser(assigned) }

            var del = Tasks_V1_DeleteChoreRequest()
            del.choreId = dishes.choreId
            await expectFailure(.notFound) { try await w.tasks.deleteChore(del, options: o.options) }
            _ = try await w.tasks.deleteChore(del, options: b.options)
            await expectFailure(.notFound) { try await w.tasks.deleteChore(del, options: b.options) }
            var get = Tasks_V1_GetChoreRequest()
            get.choreId = dishes.choreId
            await expectFailure(.notFound) { try await w.tasks.getChore(get, options: b.options) }
            get.choreId = bins.choreId
            await expectFailure(.notFound) { try await w.tasks.getChore(get, options: o.options) }
            #expect(try await w.tasks.getChore(get, options: b.options).chore.name == "Bins")
            _ = floor
        }
    }

    @Test func householdDeletedEndsItsChoresOnce() async throws {
        try await withWorld(now: Self.monday) { w in
            let (a, b) = (try await w.user("a"), try await w.user("b"))
            let hh = try await w.household([a, b])
            let one = try await w.tasks.createChore(createChore(household: hh, due: date(2025, 3, 17), assignees: [a.id, b.id]), options: a.options)
                .chore
            _ = try await w.tasks.createChore(createChore(household: hh, name: "Two", due: date(2025, 3, 18), assignees: [b.id]), options: a.options)
            var end = Tasks_V1_EndHouseholdChoresRequest()
            end.eventId = "social:household-deleted:1"
            end.householdId = hh
            let first = try await w.internalAPI.endHouseholdChores(end)
            #expect(first.endedCount == 2 && !first.replayed)
            let second = try await w.internalAPI.endHouseholdChores(end)
            #expect(second.endedCount == 0 && second.replayed)
            end.eventId = ""
            await expectFailure(.invalidArgument, fields: ["event_id"]) { try await w.internalAPI.endHouseholdChores(end) }
            try await w.deleteHousehold(hh, by: a)  // social then tells tasks too (another event: nothing left to end)
            var get = Tasks_V1_GetChoreRequest()
            get.choreId = one.choreId
            #expect(try await w.tasks.getChore(get, options: a.options).chore.status == .ended)  // read-only, still readable
            var finish = Tasks_V1_FinishChoreRequest()
            finish.choreId = one.choreId
            await expectFailure(.failedPrecondition) { try await w.tasks.finishChore(finish, options: a.options) }
            await expectFailure(.failedPrecondition) {
                try await w.tasks.createChore(createChore(household: hh, due: date(2025, 3, 18), assignees: [a.id]), options: a.options)
            }
        }
    }

    @Test func eraseUserClosesTheRotation() async throws {
        try await withWorld(now: Self.monday) { w in
            let (a, b, c) = (try await w.user("a"), try await w.user("b"), try await w.user("c"))
            let hh = try await w.household([a, b, c])
            var chore = try await w.tasks.createChore(
                createChore(household: hh, due: date(2025, 3, 17), assignees: [a.id, b.id, c.id]), options: a.options
            ).chore
            let alone = try await w.tasks.createChore(
                createChore(household: hh, name: "Mine", due: date(2025, 3, 17), assignees: [a.id]), options: b.options
            ).chore
            var erase = Tasks_V1_EraseUserRequest()
            erase.eventId = "accounts:user-deleted:a"
            erase.userId = a.id
            _ = try await w.internalAPI.eraseUser(erase)
            var get = Tasks_V1_GetChoreRequest()
            get.choreId = chore.choreId
            chore = try await w.tasks.getChore(get, options: b.options).chore
            #expect(chore.assignees.map(\.userId) == [b.id, c.id] && chore.currentAssignee.userId == b.id)
            #expect(chore.createdBy.userId.isEmpty && chore.createdBy.username == "deleted-user")
            get.choreId = alone.choreId
            await expectFailure(.notFound) { try await w.tasks.getChore(get, options: b.options) }
        }
    }

    @Test func socialDownIsAClearUnavailable() async throws {
        try await withWorld(now: Self.monday, { $0.peerDeadline = .milliseconds(300) }) { w in
            let a = try await w.user("a")
            let hh = try await w.household([a])
            let chore = try await w.tasks.createChore(createChore(household: hh, due: date(2025, 3, 17), assignees: [a.id]), options: a.options).chore
            w.setSocialDown(true)
            var get = Tasks_V1_GetChoreRequest()
            get.choreId = chore.choreId
            let f = await expectFailure(.unavailable) { try await w.tasks.getChore(get, options: a.options) }
            #expect(f?.message.contains("social") == true)
        }
    }
}
