import Contracts
import Foundation
import RPCCore
import ServiceKit
import ServiceKitTesting
import Social
import Testing

@Suite("Social: teams and the ranking", .serialized)
struct TeamsTests {
    static func create(_ env: SocialEnv, _ by: User, _ name: String = "Night Owls", members: [String]) async throws -> Social_V1_Team {
        var r = Social_V1_CreateTeamRequest()
        r.name = name
        r.memberUsernames = members
        return try await env.social.createTeam(r, options: by.options).team
    }

    @Test func createNamesEveryUnknownAndEveryTakenMemberAndNotifiesMembers() async throws {
        try await withSocial { env in
            let alice = try await env.user("alice"), bob = try await env.user("bob"), carol = try await env.user("carol")
            let dave = try await env.user("dave"), erin = try await env.user("erin")

            var bad = Social_V1_CreateTeamRequest()
            bad.name = "  "
            bad.memberUsernames = ["", "x\u{7}y"]
            await expectFailure(.invalidArgument, fields: ["name", "member_usernames[0]", "member_usernames[1]"]) {
                try await env.social.createTeam(bad, options: alice.options)
            }
            // Unknown usernames: INVALID_ARGUMENT naming each (by its index).
            await expectFailure(.invalidArgument, fields: ["member_usernames[1]", "member_usernames[3]"]) {
                _ = try await Self.create(env, alice, members: [bob.username, "nobody_1", carol.username, "nobody_2"])
            }
            // Duplicates (any case) and the caller's own name are ignored; creator first.
            let team = try await Self.create(env, alice, members: [bob.username.uppercased(), bob.username, alice.username, carol.username])
            #expect(team.members.map(\.userId) == [alice.id, bob.id, carol.id])
            #expect(team.members.map(\.username) == [alice.username, bob.username, carol.username])
            #expect(team.score == 0 && team.rank >= 1 && team.name == "Night Owls")

            // Caller already in a team; members already in a team → FAILED_PRECONDITION naming all.
            await expectFailure(.failedPrecondition) { _ = try await Self.create(env, bob, members: []) }
            await expectFailure(.failedPrecondition, fields: ["member_usernames[0]", "member_usernames[2]"]) {
                _ = try await Self.create(env, dave, members: [bob.username, erin.username, carol.username])
            }
            // Both kinds at once: one INVALID_ARGUMENT names the unknown and the already-teamed
            // members (it used to name only the unknown one).
            let both = await expectFailure(.invalidArgument, fields: ["member_usernames[0]", "member_usernames[1]", "member_usernames[3]"]) {
                _ = try await Self.create(env, dave, members: [bob.username, "nobody_3", erin.username, carol.username])
            }
            #expect(
                both?.message.contains("no such user") == true && both?.message.contains("is already in a team") == true, "\(both?.message ?? "")")
            // Members were told (TEAM_JOINED) — the creator was not.
            let inbox = try await env.social.listNotifications(Social_V1_ListNotificationsRequest(), options: bob.options)
            #expect(inbox.notifications.map(\.kind) == [.teamJoined])
            #expect(inbox.notifications.first?.actor.userId == alice.id)
            #expect(inbox.notifications.first?.target.teamId == team.teamId)
            #expect(try await env.social.listNotifications(Social_V1_ListNotificationsRequest(), options: alice.options).notifications.isEmpty)

            // GetMyTeam, GetTeamOfUser; LeaveTeam; the last member leaving deletes the team.
            #expect(try await env.social.getMyTeam(Social_V1_GetMyTeamRequest(), options: carol.options).team.teamId == team.teamId)
            #expect(!(try await env.social.getMyTeam(Social_V1_GetMyTeamRequest(), options: dave.options).hasTeam))
            var of = Social_V1_GetTeamOfUserRequest()
            of.userId = bob.id
            #expect(try await env.internalAPI.getTeamOfUser(of).team.members.count == 3)
            of.userId = dave.id
            #expect(!(try await env.internalAPI.getTeamOfUser(of).hasTeam))
            await expectFailure(.failedPrecondition) { try await env.social.leaveTeam(Social_V1_LeaveTeamRequest(), options: dave.options) }
            #expect(!(try await env.social.leaveTeam(Social_V1_LeaveTeamRequest(), options: alice.options).teamDeleted))
            #expect(!(try await env.social.leaveTeam(Social_V1_LeaveTeamRequest(), options: bob.options).teamDeleted))
            #expect(try await env.social.leaveTeam(Social_V1_LeaveTeamRequest(), options: carol.options).teamDeleted)
            of.userId = carol.id
            #expect(!(try await env.internalAPI.getTeamOfUser(of).hasTeam))
            // Free again: alice may create another one.
            _ = try await Self.create(env, alice, "Second", members: [bob.username])
        }
    }

    @Test func rankingIsByScoreThenWhoReachedItFirstThenIDPagedWithoutGapsAndScoredOncePerTask() async throws {
        try await withSocial { env in
            var teams: [Social_V1_Team] = []
            var owners: [User] = []
            for i in 0..<5 {
                let u = try await env.user("rank")
                owners.append(u)
                teams.append(try await Self.create(env, u, "Team \(i)", members: []))
                env.clock.advance(by: .seconds(1))
            }
            func record(
                _ team: Int, task: String, event: String = "tasks:\(ULID.make())", points: Int32 = 1
            ) async throws -> Social_V1_RecordTeamTaskCompletedResponse {
                var r = Social_V1_RecordTeamTaskCompletedRequest()
                r.eventId = event
                r.teamId = teams[team].teamId
                r.taskId = task
                r.points = points
                env.clock.advance(by: .seconds(1))
                return try await env.internalAPI.recordTeamTaskCompleted(r)
            }
            // Team 3 reaches 2 first, then team 1 reaches 2: 3 ranks before 1. Team 4: 5 points.
            #expect(try await record(3, task: "t1").teamScore == 1)
            #expect(try await record(3, task: "t2").teamScore == 2)
            _ = try await record(1, task: "t3")
            _ = try await record(1, task: "t4")
            _ = try await record(4, task: "t5", points: 5)
            // Idempotent by event id and by task id.
            let once = try await record(4, task: "t6", event: "tasks:same-event")
            let again = try await record(4, task: "t6", event: "tasks:same-event")
            #expect(once.teamScore == 6 && !once.replayed && again.teamScore == 6 && again.replayed)
            let otherEventSameTask = try await record(4, task: "t6")
            #expect(otherEventSameTask.teamScore == 6 && otherEventSameTask.replayed)
            await expectFailure(.invalidArgument, fields: ["event_id", "team_id", "task_id", "points"]) {
                try await env.internalAPI.recordTeamTaskCompleted(Social_V1_RecordTeamTaskCompletedRequest())
            }

            var page = Social_V1_ListTeamRankingRequest()
            page.pageSize = 2
            var seen: [Social_V1_TeamRankingEntry] = []
            while true {
                let r = try await env.social.listTeamRanking(page, options: owners[1].options)
                seen += r.entries
                #expect(r.myTeam.teamId == teams[1].teamId)
                if r.nextPageToken.isEmpty { break }
                page.pageToken = r.nextPageToken
            }
            let ours = seen.filter { e in teams.contains { $0.teamId == e.teamId } }
            #expect(ours.map(\.teamId) == [teams[4], teams[3], teams[1], teams[0], teams[2]].map(\.teamId))
            #expect(seen.map(\.rank) == Array(1...Int32(seen.count)))
            #expect(ours.first?.score == 6 && ours.first?.memberCount == 1)
            let mine = try await env.social.getMyTeam(Social_V1_GetMyTeamRequest(), options: owners[1].options).team
            #expect(mine.rank == seen.first { $0.teamId == teams[1].teamId }!.rank && mine.score == 2)

            // A forged token and one from other filters are refused naming page_token.
            page.pageToken = "bm9wZQ.AAAA"
            await expectFailure(.invalidArgument, fields: ["page_token"]) { try await env.social.listTeamRanking(page, options: owners[0].options) }
            page.pageToken = ""
            page.pageSize = -1
            await expectFailure(.invalidArgument, fields: ["page_size"]) { try await env.social.listTeamRanking(page, options: owners[0].options) }

            // A team that no longer exists: the event is acknowledged (the sender's queue moves on).
            _ = try await env.social.leaveTeam(Social_V1_LeaveTeamRequest(), options: owners[2].options)
            let gone = try await record(2, task: "t9")
            #expect(gone.teamScore == 0)
        }
    }
}

@Suite("Social: households and invite codes", .serialized)
struct HouseholdsTests {
    static func create(
        _ env: SocialEnv, _ by: User, _ name: String = "Maple Street 12", invite: [String] = []
    ) async throws -> Social_V1_CreateHouseholdResponse {
        var r = Social_V1_CreateHouseholdRequest()
        r.name = name
        r.inviteEmails = invite
        return try await env.social.createHousehold(r, options: by.options)
    }

    static func join(_ env: SocialEnv, _ who: User, _ code: String) async throws -> Social_V1_Household {
        var r = Social_V1_JoinHouseholdRequest()
        r.inviteCode = code
        return try await env.social.joinHousehold(r, options: who.options).household
    }

    @Test func theHouseholdJourneyWithMailedCodes() async throws {
        try await withSocial { env in
            let alice = try await env.user("alice"), bob = try await env.user("bob"), carol = try await env.user("carol")
            let stranger = try await env.user("mallory")

            var bad = Social_V1_CreateHouseholdRequest()
            bad.name = ""
            bad.inviteEmails = ["ok@example.com", "not-an-email", "also@bad"]
            await expectFailure(.invalidArgument, fields: ["name", "invite_emails[1]", "invite_emails[2]"]) {
                try await env.social.createHousehold(bad, options: alice.options)
            }
            let created = try await Self.create(env, alice, invite: [bob.email, carol.email.uppercased(), bob.email, "newcomer@example.org"])
            let household = created.household
            #expect(household.members.map(\.user.userId) == [alice.id])
            #expect(household.createdByUserId == alice.id)
            #expect(created.invites.map(\.email) == [bob.email, carol.email.uppercased(), "newcomer@example.org"])
            for invite in created.invites {
                #expect(invite.inviteCode.count == 9 && invite.inviteCode.dropFirst(4).first == "-")
                #expect(invite.expiresAt.milliseconds - invite.createdAt.milliseconds == 7 * 24 * 3600 * 1000)
            }
            // The codes arrive by mail (social's outbox → accounts' SendMail); bob's also in-app.
            let bobMail = try #require(try await env.waitForMail(to: bob.email).first)
            let bobCode = try #require(bobMail.data["invite_code"])
            #expect(bobMail.data["household_id"] == household.householdId && bobMail.bodyText.contains(bobCode))
            #expect(created.invites.contains { $0.inviteCode == bobCode })
            let carolCode = try #require(try await env.waitForMail(to: carol.email.uppercased()).first?.data["invite_code"])
            _ = try await env.waitForMail(to: "newcomer@example.org")
            let bobInbox = try await env.social.listNotifications(Social_V1_ListNotificationsRequest(), options: bob.options).notifications
            #expect(bobInbox.map(\.kind) == [.householdInvite] && bobInbox.first?.target.householdId == household.householdId)

            // Join: lower case, no hyphen works; members are notified; a used code is spent.
            let joined = try await Self.join(env, bob, bobCode.lowercased().replacingOccurrences(of: "-", with: ""))
            #expect(joined.members.map(\.user.userId) == [alice.id, bob.id])
            let aliceInbox = try await env.social.listNotifications(Social_V1_ListNotificationsRequest(), options: alice.options).notifications
            #expect(aliceInbox.map(\.kind) == [.householdJoined] && aliceInbox.first?.actor.userId == bob.id)
            await expectFailure(.alreadyExists) { _ = try await Self.join(env, bob, carolCode) }  // not consumed
            _ = try await Self.join(env, carol, carolCode)
            await expectFailure(.failedPrecondition, fields: ["invite_code"]) { _ = try await Self.join(env, stranger, bobCode) }
            await expectFailure(.notFound, fields: ["invite_code"]) { _ = try await Self.join(env, stranger, "ZZZZ-ZZZZ") }
            await expectFailure(.invalidArgument, fields: ["invite_code"]) { _ = try await Self.join(env, stranger, "not a code!") }
            await expectFailure(.invalidArgument, fields: ["invite_code"]) { _ = try await Self.join(env, stranger, "") }

            // Strangers see nothing (NOT_FOUND, as for no household at all).
            var get = Social_V1_GetHouseholdRequest()
            get.householdId = household.householdId
            await expectFailure(.notFound, fields: ["household_id"]) { try await env.social.getHousehold(get, options: stranger.options) }
            let full = try await env.social.getHousehold(get, options: carol.options)
            #expect(full.household.members.map(\.user.userId) == [alice.id, bob.id, carol.id])
            #expect(full.pendingInvites.map(\.email) == ["newcomer@example.org"])

            // Invite later: a malformed email, a member's email, then dave's address twice (the
            // first code is replaced by the second).
            var invite = Social_V1_InviteHousemateRequest()
            invite.householdId = household.householdId
            invite.email = "dave@"
            await expectFailure(.invalidArgument, fields: ["email"]) { try await env.social.inviteHousemate(invite, options: bob.options) }
            invite.email = carol.email
            await expectFailure(.alreadyExists, fields: ["email"]) { try await env.social.inviteHousemate(invite, options: bob.options) }
            invite.email = "Dave.Okafor@example.com"
            let first = try await env.social.inviteHousemate(invite, options: bob.options).invite
            let second = try await env.social.inviteHousemate(invite, options: bob.options).invite
            #expect(first.inviteCode != second.inviteCode && second.invitedByUserId == bob.id)
            await expectFailure(.failedPrecondition, fields: ["invite_code"]) { _ = try await Self.join(env, stranger, first.inviteCode) }
            await expectFailure(.notFound) { try await env.social.inviteHousemate(invite, options: stranger.options) }
            // Codes expire after 7 days.
            env.clock.advance(by: .seconds(7 * 24 * 3600 + 1))
            await expectFailure(.failedPrecondition, fields: ["invite_code"]) { _ = try await Self.join(env, stranger, second.inviteCode) }
            #expect(try await env.social.getHousehold(get, options: carol.options).pendingInvites.isEmpty)

            // Rename, list, mine, remove, leave, delete.
            var rename = Social_V1_RenameHouseholdRequest()
            rename.householdId = household.householdId
            rename.name = " "
            await expectFailure(.invalidArgument, fields: ["name"]) { try await env.social.renameHousehold(rename, options: bob.options) }
            rename.name = "The Maple House"
            #expect(try await env.social.renameHousehold(rename, options: bob.options).household.name == "The Maple House")
            await expectFailure(.notFound) { try await env.social.renameHousehold(rename, options: stranger.options) }

            var list = Social_V1_ListHousematesRequest()
            list.householdId = household.householdId
            list.pageSize = 2
            let page1 = try await env.social.listHousemates(list, options: alice.options)
            list.pageToken = page1.nextPageToken
            let page2 = try await env.social.listHousemates(list, options: alice.options)
            #expect((page1.housemates + page2.housemates).map(\.user.userId) == [alice.id, bob.id, carol.id])
            #expect(page2.nextPageToken.isEmpty)
            let mine = try await env.social.listMyHouseholds(Social_V1_ListMyHouseholdsRequest(), options: carol.options)
            #expect(mine.households.map(\.householdId) == [household.householdId])

            var remove = Social_V1_RemoveHousemateRequest()
            remove.householdId = household.householdId
            remove.userId = stranger.id
            await expectFailure(.notFound, fields: ["user_id"]) { try await env.social.removeHousemate(remove, options: alice.options) }
            remove.userId = carol.id
            #expect(!(try await env.social.removeHousemate(remove, options: alice.options).householdDeleted))
            let carolInbox = try await env.social.listNotifications(Social_V1_ListNotificationsRequest(), options: carol.options).notifications
            #expect(carolInbox.first?.kind == .householdRemoved)
            await expectFailure(.notFound) { try await env.social.getHousehold(get, options: carol.options) }
            remove.userId = bob.id  // bob leaves
            #expect(!(try await env.social.removeHousemate(remove, options: bob.options).householdDeleted))

            // A chore of alice's in tasks (ended by the deletion below).
            env.tasksClock.set(milliseconds: env.clock.nowMilliseconds())
            let today = Date(timeIntervalSince1970: Double(env.clock.nowMilliseconds()) / 1000 + 86_400)
            let parts = Calendar(identifier: .gregorian).dateComponents(in: TimeZone(identifier: "UTC")!, from: today)
            let chore = try await env.chore(
                "Water the plants", in: household.householdId, for: alice, due: (Int32(parts.year!), Int32(parts.month!), Int32(parts.day!)),
                by: alice)

            // Memberships as other services see them.
            var check = Social_V1_CheckHouseholdMembershipRequest()
            check.householdId = household.householdId
            check.userIds = [alice.id, carol.id, stranger.id]
            let before = try await env.internalAPI.checkHouseholdMembership(check)
            #expect(before.state == .active && before.memberUserIds == [alice.id] && before.name == "The Maple House")
            #expect(before.memberships == [alice.id: .member, carol.id: .formerMember, stranger.id: .notMember])

            var delete = Social_V1_DeleteHouseholdRequest()
            delete.householdId = household.householdId
            await expectFailure(.notFound) { try await env.social.deleteHousehold(delete, options: bob.options) }
            _ = try await env.social.deleteHousehold(delete, options: alice.options)
            // Still answers for finance (memberships as at deletion); tasks ends its chores once.
            let after = try await env.internalAPI.checkHouseholdMembership(check)
            #expect(after.state == .deleted && after.memberUserIds == [alice.id] && after.memberships[alice.id] == .member)
            var getChore = Tasks_V1_GetChoreRequest()
            getChore.choreId = chore
            #expect(await eventually { (try? await env.tasks.getChore(getChore, options: alice.options).chore.status) == .ended })
            // One EndHouseholdChores for it, delivered. (Tasks may show the chore ended a moment
            // before the delivery loop has marked the event delivered: it marks it when the call
            // returns.)
            let endPath = Tasks_V1_TasksInternalMethods.endHouseholdChores.path
            #expect(await eventually { (try? await env.core.database.pendingOutbox(limit: 10).isEmpty) == true })
            let ends = try env.core.database.readSync { c in
                try c.queryOne("SELECT count(*) FROM outbox WHERE kind = ? AND delivered_at IS NOT NULL", endPath)!.get(0, as: Int64.self)
            }
            #expect(ends == 1)
            check.householdId = "01JD4H2M3N4P5Q6R7S8T9V0W1X"
            await expectFailure(.notFound, fields: ["household_id"]) { try await env.internalAPI.checkHouseholdMembership(check) }
            await expectFailure(.notFound) { try await env.social.getHousehold(get, options: alice.options) }
        }
    }

    /// "The removed user's chores are reassigned by tasks": social tells tasks through its outbox
    /// (in the removal's transaction); tasks closes the rotation up or hands a chore left with
    /// nobody to the longest-standing remaining member. Each removal is its own event.
    @Test func aRemovedHousematesChoresAreHandedOnByTasks() async throws {
        try await withSocial { env in
            let alice = try await env.user("alice"), bob = try await env.user("bob")
            let created = try await Self.create(env, alice, invite: [bob.email])
            let code = try #require(try await env.waitForMail(to: bob.email).first?.data["invite_code"])
            _ = try await Self.join(env, bob, code)
            let hid = created.household.householdId
            env.tasksClock.set(milliseconds: 1_604_188_800_000)  // 2020-11-01
            let bobs = try await env.chore("Clean the bathroom", in: hid, for: bob, due: (2020, 11, 20), by: alice)
            var remove = Social_V1_RemoveHousemateRequest()
            remove.householdId = hid
            remove.userId = bob.id
            #expect(!(try await env.social.removeHousemate(remove, options: alice.options).householdDeleted))
            var get = Tasks_V1_GetChoreRequest()
            get.choreId = bobs
            #expect(
                await eventually {
                    (try? await env.tasks.getChore(get, options: alice.options).chore.assignees.map(\.userId)) == [alice.id]
                })
            let path = Tasks_V1_TasksInternalMethods.removeHousemateChores.path
            #expect(await eventually { (try? await env.core.database.pendingOutbox(limit: 10).isEmpty) == true })
            let sent = try env.core.database.readSync { c in
                try c.queryOne("SELECT count(*) FROM outbox WHERE kind = ? AND delivered_at IS NOT NULL", path)!.get(0, as: Int64.self)
            }
            #expect(sent == 1)
        }
    }

    @Test func aRemovalWhileTasksIsDownWaitsInTheOutbox() async throws {
        try await withSocial(tasksUp: false) { env in
            let alice = try await env.user("alice"), bob = try await env.user("bob")
            let created = try await Self.create(env, alice, invite: [bob.email])
            let code = try #require(try await env.waitForMail(to: bob.email).first?.data["invite_code"])
            _ = try await Self.join(env, bob, code)
            var remove = Social_V1_RemoveHousemateRequest()
            remove.householdId = created.household.householdId
            remove.userId = bob.id
            _ = try await env.social.removeHousemate(remove, options: bob.options)
            let pending = try await env.core.database.pendingOutbox(limit: 10)
            #expect(pending.contains { $0.kind == Tasks_V1_TasksInternalMethods.removeHousemateChores.path })
        }
    }

    @Test func theLastMemberLeavingDeletesTheHouseholdAndEndsItsChoresEvenWhileTasksIsDown() async throws {
        try await withSocial(tasksUp: false) { env in
            let alice = try await env.user("alice")
            let household = try await Self.create(env, alice, "Solo").household
            var remove = Social_V1_RemoveHousemateRequest()
            remove.householdId = household.householdId
            remove.userId = alice.id
            #expect(try await env.social.removeHousemate(remove, options: alice.options).householdDeleted)
            // tasks is down: the call waits in the outbox (never lost).
            let pending = try await env.core.database.pendingOutbox(limit: 10)
            #expect(pending.contains { $0.kind == "/tasks.v1.TasksInternal/EndHouseholdChores" })
        }
    }

    @Test func housemateProfileShowsChoresAndStillAnswersWhileTasksIsDown() async throws {
        try await withSocial { env in
            let alice = try await env.user("alice"), bob = try await env.user("bob"), mallory = try await env.user("mallory")
            let created = try await Self.create(env, alice, invite: [bob.email])
            let code = try #require(try await env.waitForMail(to: bob.email).first?.data["invite_code"])
            _ = try await Self.join(env, bob, code)
            let hid = created.household.householdId
            // bob's chores in tasks (tasks' clock in 2020, so that one can be due then: overdue now).
            env.tasksClock.set(milliseconds: 1_604_188_800_000)  // 2020-11-01
            let c3 = try await env.chore("Buy toilet paper", in: hid, for: bob, due: (2099, 1, 3), by: alice)
            let c2 = try await env.chore("Take out the recycling", in: hid, for: bob, due: (2099, 1, 2), by: bob)
            let c1 = try await env.chore("Clean the bathroom", in: hid, for: bob, due: (2020, 11, 20), by: alice)
            _ = try await env.chore("Alice's own", in: hid, for: alice, due: (2020, 11, 21), by: alice)
            var r = Social_V1_GetHousemateProfileRequest()
            r.householdId = hid
            r.userId = bob.id
            let profile = try await env.social.getHousemateProfile(r, options: alice.options)
            #expect(profile.housemate.user.username == bob.username)
            #expect(profile.assignedChores.map(\.taskId) == [c1, c2, c3])
            #expect(profile.assignedChores.map(\.overdue) == [true, false, false])
            #expect(!profile.assignedChoresUnavailable)
            await expectFailure(.notFound) { try await env.social.getHousemateProfile(r, options: mallory.options) }
            r.userId = mallory.id
            await expectFailure(.notFound, fields: ["user_id"]) { try await env.social.getHousemateProfile(r, options: alice.options) }
            await expectFailure(.invalidArgument, fields: ["household_id", "user_id"]) {
                try await env.social.getHousemateProfile(Social_V1_GetHousemateProfileRequest(), options: alice.options)
            }
            // tasks goes down: the profile still answers and says the chore list is unavailable.
            env.cluster.setDown(.tasks, true)
            r.userId = bob.id
            let degraded = try await env.social.getHousemateProfile(r, options: alice.options)
            #expect(degraded.assignedChoresUnavailable && degraded.assignedChores.isEmpty && degraded.housemate.user.userId == bob.id)
        }
    }

    @Test func concurrentJoinsWithOneCodeLetExactlyOneIn() async throws {
        try await withSocial { env in
            let alice = try await env.user("alice")
            let created = try await Self.create(env, alice, invite: ["shared@example.org"])
            let code = created.invites[0].inviteCode
            var joiners: [User] = []
            for _ in 0..<8 { joiners.append(try await env.user("j")) }
            let results = await withTaskGroup(of: StatusCode?.self) { group in
                for j in joiners {
                    group.addTask {
                        do { _ = try await Self.join(env, j, code); return nil } catch let e as RPCError { return e.code } catch { return .unknown }
                    }
                }
                var out: [StatusCode?] = []
                for await r in group { out.append(r) }
                return out
            }
            #expect(results.filter { $0 == nil }.count == 1)
            #expect(results.compactMap { $0 }.allSatisfy { $0 == .failedPrecondition })
            var get = Social_V1_GetHouseholdRequest()
            get.householdId = created.household.householdId
            #expect(try await env.social.getHousehold(get, options: alice.options).household.members.count == 2)

            // The same user twice at once with a fresh code: one joins, the other hears ALREADY_EXISTS.
            var invite = Social_V1_InviteHousemateRequest()
            invite.householdId = created.household.householdId
            invite.email = "twice@example.org"
            let twiceCode = try await env.social.inviteHousemate(invite, options: alice.options).invite.inviteCode
            let twice = try await env.user("twice")
            async let a: StatusCode? = {
                do { _ = try await Self.join(env, twice, twiceCode); return nil } catch let e as RPCError { return e.code } catch { return .unknown }
            }()
            async let b: StatusCode? = {
                do { _ = try await Self.join(env, twice, twiceCode); return nil } catch let e as RPCError { return e.code } catch { return .unknown }
            }()
            let both = await [a, b]
            #expect(both.filter { $0 == nil }.count == 1 && both.contains(.alreadyExists))
        }
    }

    @Test func guessingCodesIsThrottledPerCallerAndPerAddressBeforeTheLookup() async throws {
        try await withSocial({
            $0.maxGuessesPerUser = 3; $0.maxGuessesPerAddress = 5
        }) { env in
            let alice = try await env.user("alice"), guesser = try await env.user("g"), other = try await env.user("h")
            let created = try await Self.create(env, alice, invite: ["x@example.org"])
            // Concurrent wrong guesses: at most 3 are evaluated for one caller, whatever the concurrency.
            let codes = (0..<10).map { _ in InviteCode.display(InviteCode.make()) }
            let results = await withTaskGroup(of: StatusCode.self) { group in
                for c in codes {
                    group.addTask {
                        do { _ = try await Self.join(env, guesser, c); return .ok } catch let e as RPCError { return e.code } catch {
                            return .unknown
                        }
                    }
                }
                var out: [StatusCode] = []
                for await r in group { out.append(r) }
                return out
            }
            #expect(results.filter { $0 == .notFound }.count == 3)
            #expect(results.filter { $0 == .resourceExhausted }.count == 7)
            let f = await expectFailure(.resourceExhausted) { _ = try await Self.join(env, guesser, created.invites[0].inviteCode) }
            #expect((f?.retryDelaySeconds ?? 0) > 0)
            // The address limit (5) catches another account from the same address after 2 more.
            for _ in 0..<2 { await expectFailure(.notFound) { _ = try await Self.join(env, other, InviteCode.display(InviteCode.make())) } }
            await expectFailure(.resourceExhausted) { _ = try await Self.join(env, other, created.invites[0].inviteCode) }
            // The window passes (the throttles use the service's clock).
            env.clock.advance(by: .seconds(16 * 60))
            _ = try await Self.join(env, other, created.invites[0].inviteCode)
        }
    }
}
