import Contracts
import Foundation
import RPCCore
import ServiceKit
import ServiceKitTesting
import Social
import Testing

@Suite("Social: hostile and racing clients", .serialized)
struct HostileTests {
    static func codes(_ n: Int, _ call: @escaping @Sendable () async throws -> Void) async -> [StatusCode] {
        await withTaskGroup(of: StatusCode.self) { group in
            for _ in 0..<n {
                group.addTask { do { try await call(); return .ok } catch let e as RPCError { return e.code } catch { return .unknown } }
            }
            var out: [StatusCode] = []
            for await c in group { out.append(c) }
            return out
        }
    }

    @Test func hugeAndMalformedInputsGetAClearStatusAndChangeNothing() async throws {
        try await withSocial { env in
            let alice = try await env.user("alice")
            // Over the transport's per-message limit: refused before it is read (RESOURCE_EXHAUSTED).
            var team = Social_V1_CreateTeamRequest()
            team.name = String(repeating: "n", count: 100_000)
            await expectFailure(.resourceExhausted) { try await env.social.createTeam(team, options: alice.options) }
            // Within it but over the field rules: INVALID_ARGUMENT naming the fields.
            team.name = String(repeating: "n", count: 10_000)
            team.memberUsernames = (0..<500).map { "user\($0)" }
            let f = await expectFailure(.invalidArgument) { try await env.social.createTeam(team, options: alice.options) }
            #expect(f?.fields.contains("name") == true && f?.fields.contains("member_usernames") == true)
            #expect((f?.message.count ?? 0) < 10_000)  // the answer names fields, it does not echo the input

            var household = Social_V1_CreateHouseholdRequest()
            household.name = "Flat"
            household.inviteEmails = (0..<1000).map { "x\($0)@example.com" }
            await expectFailure(.invalidArgument, fields: ["invite_emails"]) {
                try await env.social.createHousehold(household, options: alice.options)
            }
            household.inviteEmails = [String(repeating: "a", count: 300) + "@example.com"]
            await expectFailure(.invalidArgument, fields: ["invite_emails[0]"]) {
                try await env.social.createHousehold(household, options: alice.options)
            }
            #expect(try await env.social.listMyHouseholds(Social_V1_ListMyHouseholdsRequest(), options: alice.options).households.isEmpty)

            var add = Social_V1_AddFriendRequest()
            add.user.username = String(repeating: "z", count: 10_000)
            await expectFailure(.invalidArgument, fields: ["user.username"]) { try await env.social.addFriend(add, options: alice.options) }
            add.user.userId = String(repeating: "1", count: 65)
            await expectFailure(.invalidArgument, fields: ["user.user_id"]) { try await env.social.addFriend(add, options: alice.options) }
            var join = Social_V1_JoinHouseholdRequest()
            join.inviteCode = String(repeating: "K", count: 5_000)
            await expectFailure(.invalidArgument, fields: ["invite_code"]) { try await env.social.joinHousehold(join, options: alice.options) }
            join.inviteCode = String(repeating: "K", count: 100_000)
            await expectFailure(.resourceExhausted) { try await env.social.joinHousehold(join, options: alice.options) }
            var list = Social_V1_ListFriendsRequest()
            list.pageToken = String(repeating: "A", count: 5000) + "." + "B"
            await expectFailure(.invalidArgument, fields: ["page_token"]) { try await env.social.listFriends(list, options: alice.options) }
            var mark = Social_V1_MarkNotificationsReadRequest()
            mark.notificationIds = (0..<101).map { _ in ULID.make() }
            await expectFailure(.invalidArgument, fields: ["notification_ids"]) {
                try await env.social.markNotificationsRead(mark, options: alice.options)
            }
            var snooze = Social_V1_SnoozeNotificationsRequest()
            snooze.duration.seconds = -5
            await expectFailure(.invalidArgument, fields: ["duration"]) { try await env.social.snoozeNotifications(snooze, options: alice.options) }
            snooze.duration.seconds = .max
            await expectFailure(.invalidArgument, fields: ["duration.seconds"]) {
                try await env.social.snoozeNotifications(snooze, options: alice.options)
            }
            mark.notificationIds = []
            mark.readUpTo.seconds = 9_223_372_036_854_776  // the fuzzer's: trapped the process on * 1000
            mark.readUpTo.nanos = -1
            await expectFailure(.invalidArgument, fields: ["read_up_to.seconds", "read_up_to.nanos"]) {
                try await env.social.markNotificationsRead(mark, options: alice.options)
            }
            var send = Social_V1_SendNotificationRequest()
            send.eventId = "e"
            send.recipientUserIds = [alice.id]
            send.kind = .init(rawValue: 999)
            send.title = "t"
            send.data = Dictionary(uniqueKeysWithValues: (0..<21).map { ("k\($0)", "v") })
            await expectFailure(.invalidArgument, fields: ["kind", "data"]) { try await env.internalAPI.sendNotification(send) }
            // No token, a forged token: UNAUTHENTICATED; the process is fine afterwards.
            await expectFailure(.unauthenticated) { try await env.social.getMyTeam(Social_V1_GetMyTeamRequest()) }
            await expectFailure(.unauthenticated) { try await env.social.getMyTeam(Social_V1_GetMyTeamRequest(), options: bearer("e30.e30.AAAA")) }
            _ = try await env.social.getMyTeam(Social_V1_GetMyTeamRequest(), options: alice.options)
        }
    }

    @Test func theSameRequestTwiceAtOnceCreatesNothingTwice() async throws {
        try await withSocial { env in
            let alice = try await env.user("alice"), bob = try await env.user("bob")
            // Both befriend each other at the same moment: one friendship, one ALREADY_EXISTS.
            var ab = Social_V1_AddFriendRequest()
            ab.user.userId = bob.id
            var ba = Social_V1_AddFriendRequest()
            ba.user.userId = alice.id
            async let x: StatusCode = {
                do { _ = try await env.social.addFriend(ab, options: alice.options); return .ok } catch let e as RPCError { return e.code } catch {
                    return .unknown
                }
            }()
            async let y: StatusCode = {
                do { _ = try await env.social.addFriend(ba, options: bob.options); return .ok } catch let e as RPCError { return e.code } catch {
                    return .unknown
                }
            }()
            let pair = await [x, y]
            #expect(pair.sorted { $0.rawValue < $1.rawValue } == [.ok, .alreadyExists])
            #expect(try await env.social.listFriends(Social_V1_ListFriendsRequest(), options: alice.options).friends.count == 1)

            var block = Social_V1_BlockUserRequest()
            block.user.userId = bob.id
            let blocks = await Self.codes(6) { [block] in _ = try await env.social.blockUser(block, options: alice.options) }
            #expect(blocks.filter { $0 == .ok }.count == 1 && blocks.filter { $0 == .alreadyExists }.count == 5)

            var team = Social_V1_CreateTeamRequest()
            team.name = "Racers"
            let teams = await Self.codes(6) { [team] in _ = try await env.social.createTeam(team, options: alice.options) }
            #expect(teams.filter { $0 == .ok }.count == 1 && teams.filter { $0 == .failedPrecondition }.count == 5)

            // One event delivered six times at once: stored once, every answer names the same id.
            var send = Social_V1_SendNotificationRequest()
            send.eventId = "tasks:racing-event"
            send.recipientUserIds = [bob.id]
            send.kind = .taskReminder
            send.title = "Once"
            let answers = Shared<Set<String>>([])
            let sends = await Self.codes(6) { [send] in
                let r = try await env.internalAPI.sendNotification(send)
                answers.withLock { _ = $0.insert(r.notificationIds[bob.id] ?? "") }
            }
            #expect(sends.allSatisfy { $0 == .ok } && answers.withLock { $0.count } == 1)
            let inbox = try await env.social.listNotifications(Social_V1_ListNotificationsRequest(), options: bob.options).notifications
            #expect(inbox.filter { $0.title == "Once" }.count == 1)

            var erase = Social_V1_EraseUserRequest()
            erase.eventId = "accounts:erase-1"
            erase.userId = bob.id
            let erases = await Self.codes(4) { [erase] in _ = try await env.internalAPI.eraseUser(erase) }
            #expect(erases.allSatisfy { $0 == .ok })
        }
    }
}
