import Accounts
import ContractTesting
import Contracts
import Foundation
import RPCCore
import ServiceKit
import ServiceKitTesting
import Social
import Testing

/// Runs every fixture of `Tests/Fixtures/social/` against the live service with the shared
/// `ContractHarness`: the request fixture is encoded by protoc, its fixture ids are mapped to the
/// live ones of a scenario that builds the fixture's state (the people of the fixtures — alice,
/// bob_k, carol.w, dave, mallory — signed up in the real accounts), it is sent over gRPC by the
/// right caller, and the answer is compared with the response fixture, ignoring its
/// `# generated:` fields.
@Suite("Social: contract fixtures against the live service", .serialized)
struct ContractFixtureTests {
    static let fixtures = ContractPaths.locate().root + "/Tests/Fixtures/social"

    @Test func everyFixtureMatchesTheLiveService() async throws {
        try await withSocial { env in
            // "Now" of the fixtures: 2026-11-22 14:00 UTC (chores due on the 20th are overdue).
            env.clock.set(milliseconds: 1_795_356_000_000)
            let runner = SocialFixtureRunner(env: env)
            let s = env.social, i = env.internalAPI
            func person(_ username: String, _ display: String, email: String? = nil, fixtureID: String) async throws -> User {
                var r = Accounts_V1_SignUpRequest()
                r.username = username
                r.email = email ?? "\(username.replacingOccurrences(of: ".", with: "_"))@example.com"
                r.password = "correct horse battery staple"
                r.displayName = display
                let out = try await env.accounts.signUp(r)
                let u = User(id: out.user.userId, username: username, email: r.email, displayName: display, token: out.session.accessToken)
                runner.ids[fixtureID] = u.id
                return u
            }
            let alice = try await person("alice", "Alice Martin", fixtureID: "01JD3K7Q2M8W5X9Y4Z6A1B2C3D")
            let bob = try await person("bob_k", "Bob Kowalski", email: "bob.kowalski@example.com", fixtureID: "01JD3K8R4N9X6Y1Z5A7B2C3D4E")
            let carol = try await person("carol.w", "Carol Wong", fixtureID: "01JD3K9S5P1Y7Z2A6B8C3D4E5F")
            let dave = try await person("dave", "Dave Okafor", email: "dave.okafor@example.com", fixtureID: "01JD3KAT6Q2Z8A3B7C9D4E5F6G")
            let mallory = try await person("mallory", "Mallory", fixtureID: "01JD3KBV7R3A9B4C8D1E5F6G7H")
            let nina = try await env.user("nina")
            func tick() { env.clock.advance(by: .seconds(60)) }

            // ---- Teams: Deadline Dodgers (4 members, 15), Team Rocket Science (5, reaches 7
            // first), Night Owls (alice, bob_k, carol.w: 7 → rank 3, then 8), a fourth below.
            func team(_ name: String, size: Int) async throws -> (String, [User]) {
                var members: [User] = []
                for _ in 0..<size { members.append(try await env.user("m")) }
                var r = Social_V1_CreateTeamRequest()
                r.name = name
                r.memberUsernames = members.dropFirst().map(\.username)
                return (try await s.createTeam(r, options: members[0].options).team.teamId, members)
            }
            func score(_ teamID: String, _ points: Int32) async throws {
                var r = Social_V1_RecordTeamTaskCompletedRequest()
                r.eventId = "tasks:\(ULID.make())"
                r.teamId = teamID
                r.taskId = ULID.make()
                r.points = points
                tick()
                _ = try await i.recordTeamTaskCompleted(r)
            }
            let (dodgers, _) = try await team("Deadline Dodgers", size: 4)
            let (rocket, rocketMembers) = try await team("Team Rocket Science", size: 5)
            let (last, _) = try await team("Slow Starters", size: 1)
            let owls = try await runner.run("CreateTeam", Social_V1_CreateTeamRequest.self) { try await s.createTeam($0, options: alice.options) }
                .team
            runner.ids["01JD4T1A2B3C4D5E6F7G8H9J0K"] = owls.teamId
            try await score(dodgers, 15)
            try await score(rocket, 7)
            try await score(owls.teamId, 7)
            try await score(last, 1)
            _ = try await runner.run("GetMyTeam", Social_V1_GetMyTeamRequest.self) { try await s.getMyTeam($0, options: carol.options) }
            _ = try await runner.run("GetTeamOfUser", Social_V1_GetTeamOfUserRequest.self) { try await i.getTeamOfUser($0) }
            _ = try await runner.run("ListTeamRanking", Social_V1_ListTeamRankingRequest.self) {
                try await s.listTeamRanking($0, options: alice.options)
            }
            _ = try await runner.run("RecordTeamTaskCompleted", Social_V1_RecordTeamTaskCompletedRequest.self) {
                try await i.recordTeamTaskCompleted($0)
            }
            _ = try await runner.run("LeaveTeam", Social_V1_LeaveTeamRequest.self) { try await s.leaveTeam($0, options: rocketMembers[4].options) }

            // ---- Households: Maple Street 12.
            tick()
            let created = try await runner.run("CreateHousehold", Social_V1_CreateHouseholdRequest.self) {
                try await s.createHousehold($0, options: alice.options)
            }
            let hid = created.household.householdId
            runner.ids["01JD4H2M3N4P5Q6R7S8T9V0W1X"] = hid
            let bobCode = try #require(try await env.waitForMail(to: bob.email).first?.data["invite_code"])
            tick()
            _ = try await runner.run("JoinHousehold", Social_V1_JoinHouseholdRequest.self, rewrite: { $0.inviteCode = bobCode.lowercased() }) {
                try await s.joinHousehold($0, options: bob.options)
            }
            _ = try await runner.run("ListMyHouseholds", Social_V1_ListMyHouseholdsRequest.self) {
                try await s.listMyHouseholds($0, options: bob.options)
            }
            _ = try await runner.run("RenameHousehold", Social_V1_RenameHouseholdRequest.self) {
                try await s.renameHousehold($0, options: bob.options)
            }
            var rename = Social_V1_RenameHouseholdRequest()
            rename.householdId = hid
            rename.name = "Maple Street 12"
            _ = try await s.renameHousehold(rename, options: alice.options)
            // dave joins and is removed; carol joins with the code mailed to newcomer@example.org.
            var invite = Social_V1_InviteHousemateRequest()
            invite.householdId = hid
            invite.email = dave.email
            let daveCode = try await s.inviteHousemate(invite, options: alice.options).invite.inviteCode
            var join = Social_V1_JoinHouseholdRequest()
            join.inviteCode = daveCode
            tick()
            _ = try await s.joinHousehold(join, options: dave.options)
            join.inviteCode = try #require(created.invites.first { $0.email == "newcomer@example.org" }?.inviteCode)
            tick()
            _ = try await s.joinHousehold(join, options: carol.options)
            _ = try await runner.run("RemoveHousemate", Social_V1_RemoveHousemateRequest.self) {
                try await s.removeHousemate($0, options: alice.options)
            }
            tick()
            _ = try await runner.run("InviteHousemate", Social_V1_InviteHousemateRequest.self) {
                try await s.inviteHousemate($0, options: alice.options)
            }
            _ = try await runner.run("GetHousehold", Social_V1_GetHouseholdRequest.self) { try await s.getHousehold($0, options: carol.options) }
            _ = try await runner.run("ListHousemates", Social_V1_ListHousematesRequest.self) { try await s.listHousemates($0, options: bob.options) }
            _ = try await runner.run("CheckHouseholdMembership", Social_V1_CheckHouseholdMembershipRequest.self) {
                try await i.checkHouseholdMembership($0)
            }
            // bob's chores, made in the real tasks (its clock on the 19th, so that one may be due on the 20th).
            env.tasksClock.set(milliseconds: 1_795_356_000_000 - 3 * 86_400_000)
            for (name, due) in [
                ("Buy toilet paper", (Int32(2026), Int32(11), Int32(28))), ("Take out the recycling", (2026, 11, 24)),
                ("Clean the bathroom", (2026, 11, 20)),
            ] {
                _ = try await env.chore(name, in: hid, for: bob, due: due, by: alice)
            }
            _ = try await runner.run("GetHousemateProfile", Social_V1_GetHousemateProfileRequest.self) {
                try await s.getHousemateProfile($0, options: alice.options)
            }

            // ---- Friends and blocks.
            var add = Social_V1_AddFriendRequest()
            add.user.username = carol.username
            _ = try await s.addFriend(add, options: alice.options)
            tick()
            _ = try await runner.run("AddFriend", Social_V1_AddFriendRequest.self) { try await s.addFriend($0, options: alice.options) }
            _ = try await runner.run("ListFriends", Social_V1_ListFriendsRequest.self) { try await s.listFriends($0, options: alice.options) }
            _ = try await runner.run("BlockUser", Social_V1_BlockUserRequest.self) { try await s.blockUser($0, options: alice.options) }
            _ = try await runner.run("ListBlockedUsers", Social_V1_ListBlockedUsersRequest.self) {
                try await s.listBlockedUsers($0, options: alice.options)
            }
            _ = try await runner.run("UnblockUser", Social_V1_UnblockUserRequest.self) { try await s.unblockUser($0, options: alice.options) }

            // ---- Follows: dave asks carol (listed), carol accepts; then alice asks and is accepted.
            var follow = Social_V1_RequestFollowRequest()
            follow.user.username = carol.username
            tick()
            _ = try await s.requestFollow(follow, options: dave.options)
            _ = try await runner.run("ListFollowRequests", Social_V1_ListFollowRequestsRequest.self) {
                try await s.listFollowRequests($0, options: carol.options)
            }
            var accept = Social_V1_AcceptFollowRequestRequest()
            accept.requesterUserId = dave.id
            _ = try await s.acceptFollowRequest(accept, options: carol.options)
            tick()
            _ = try await runner.run("RequestFollow", Social_V1_RequestFollowRequest.self) { try await s.requestFollow($0, options: alice.options) }
            tick()
            _ = try await runner.run("AcceptFollowRequest", Social_V1_AcceptFollowRequestRequest.self) {
                try await s.acceptFollowRequest($0, options: carol.options)
            }
            _ = try await runner.run("ListFollowers", Social_V1_ListFollowersRequest.self) { try await s.listFollowers($0, options: carol.options) }
            _ = try await runner.run("ListFollowing", Social_V1_ListFollowingRequest.self) { try await s.listFollowing($0, options: alice.options) }
            _ = try await runner.run("ListFollowedUserIds", Social_V1_ListFollowedUserIdsRequest.self) { try await i.listFollowedUserIds($0) }
            follow.user.username = bob.username
            _ = try await s.requestFollow(follow, options: alice.options)
            accept.requesterUserId = alice.id
            _ = try await s.acceptFollowRequest(accept, options: bob.options)
            _ = try await runner.run("CheckRelationship", Social_V1_CheckRelationshipRequest.self) { try await i.checkRelationship($0) }
            follow.user.username = bob.username
            _ = try await s.requestFollow(follow, options: mallory.options)
            _ = try await runner.run("DeclineFollowRequest", Social_V1_DeclineFollowRequestRequest.self) {
                try await s.declineFollowRequest($0, options: bob.options)
            }
            follow.user.username = dave.username
            _ = try await s.requestFollow(follow, options: bob.options)
            _ = try await runner.run("Unfollow", Social_V1_UnfollowRequest.self) { try await s.unfollow($0, options: bob.options) }
            _ = try await runner.run("RemoveFriend", Social_V1_RemoveFriendRequest.self) { try await s.removeFriend($0, options: alice.options) }

            // ---- Notifications, for nina: two reminders, a help offer while muted, a help
            // request, then a reminder after the read_up_to instant.
            runner.ids["01JD3K9S5P1Y7Z2A6B8C3D4E5F"] = carol.id
            var mute = Social_V1_MuteHelpNotificationsRequest()
            for _ in 0..<2 {
                tick()
                _ = try await env.notify([nina.id])
            }
            mute.muted = true
            _ = try await s.muteHelpNotifications(mute, options: nina.options)
            func help(_ kind: Social_V1_NotificationKind, _ title: String, _ body: String) async throws -> String {
                var r = Social_V1_SendNotificationRequest()
                r.eventId = "tasks:\(ULID.make())"
                r.recipientUserIds = [nina.id]
                r.kind = kind
                r.title = title
                r.body = body
                r.actorUserId = alice.id
                r.target.taskId = "01JD4P9Q8R7S6T5V4W3X2Y1Z0A"
                r.data = ["task_name": "Quarterly report"]
                return try await i.sendNotification(r).notificationIds[nina.id]!
            }
            tick()
            runner.ids["01JD5N1A2B3C4D5E6F7G8H9J0K"] = try await help(.helpOffer, "Alice offers help", "Alice can help with \"Quarterly report\".")
            mute.muted = false
            _ = try await s.muteHelpNotifications(mute, options: nina.options)
            tick()
            runner.ids["01JD5N2B3C4D5E6F7G8H9J0K1M"] = try await help(
                .helpRequest, "Alice needs help", "Alice asks for help with \"Quarterly report\".")
            tick()
            let upTo = env.clock.nowTimestamp()
            tick()
            _ = try await env.notify([nina.id])
            _ = try await runner.run("ListNotifications", Social_V1_ListNotificationsRequest.self) {
                try await s.listNotifications($0, options: nina.options)
            }
            _ = try await runner.runStream("SubscribeNotifications", Social_V1_SubscribeNotificationsRequest.self, user: nina)
            _ = try await runner.run("MarkNotificationsRead", Social_V1_MarkNotificationsReadRequest.self, rewrite: { $0.readUpTo = upTo }) {
                try await s.markNotificationsRead($0, options: nina.options)
            }
            _ = try await runner.run("SnoozeNotifications", Social_V1_SnoozeNotificationsRequest.self) {
                try await s.snoozeNotifications($0, options: nina.options)
            }
            env.clock.advance(by: .seconds(5401))  // that snooze is over
            _ = try await runner.run("MuteHelpNotifications", Social_V1_MuteHelpNotificationsRequest.self) {
                try await s.muteHelpNotifications($0, options: nina.options)
            }
            var snooze = Social_V1_SnoozeNotificationsRequest()
            snooze.duration.seconds = 5400
            _ = try await s.snoozeNotifications(snooze, options: nina.options)
            _ = try await runner.run("GetNotificationSettings", Social_V1_GetNotificationSettingsRequest.self) {
                try await s.getNotificationSettings($0, options: nina.options)
            }
            // SendNotification: bob and carol get it; mallory, who blocks alice, is skipped.
            var block = Social_V1_BlockUserRequest()
            block.user.username = alice.username
            _ = try await s.blockUser(block, options: mallory.options)
            let sent = try await runner.run("SendNotification", Social_V1_SendNotificationRequest.self) { try await i.sendNotification($0) }
            #expect(sent.skippedUserIds == [mallory.id] && sent.notificationIds.keys.sorted() == [bob.id, carol.id].sorted())

            // ---- Push targets (issue 36), nina's: an iPhone, a Pixel, then Firefox (the fixture);
            // the list is newest first; the Pixel is removed.
            var iphone = Social_V1_RegisterPushTargetRequest()
            iphone.target.apns.deviceToken = "740F4707BEBCF74F9B7C25D48E3358945F6AA01DA5DDB387462C7EAF61BB78AD"
            iphone.target.apns.topic = "com.example.chores"
            iphone.target.apns.environment = .production
            iphone.target.label = "iPhone"
            tick()
            _ = try await s.registerPushTarget(iphone, options: nina.options)
            var pixel = Social_V1_RegisterPushTargetRequest()
            pixel.target.fcm.registrationToken =
                "dQw4w9WgXcQ:APA91bHPRgkF3JUikC4ENAHEeMrd41Zxv3hVZjC9KtT8OvPVGJ-hQMRKRrZuJAEcl7B338qju59zJMjw2DELjzEvxwYv7hH5Ynpc1ODQ0aT4U4OFEeco8ohsN5PjL1iC2dNtk2BAokeMCg2ZXKqpc8FXKmhX94kIxQ"
            pixel.target.label = "  Pixel 8 "
            tick()
            runner.ids["01JD7P2F3C4M5T6Q7K8E9N0A1B"] = try await s.registerPushTarget(pixel, options: nina.options).target.targetId
            tick()
            _ = try await runner.run("RegisterPushTarget", Social_V1_RegisterPushTargetRequest.self) {
                try await s.registerPushTarget($0, options: nina.options)
            }
            _ = try await runner.run("ListPushTargets", Social_V1_ListPushTargetsRequest.self) {
                try await s.listPushTargets($0, options: nina.options)
            }
            _ = try await runner.run("RemovePushTarget", Social_V1_RemovePushTargetRequest.self) {
                try await s.removePushTarget($0, options: nina.options)
            }
            _ = try await runner.run("SetPushPreferences", Social_V1_SetPushPreferencesRequest.self) {
                try await s.setPushPreferences($0, options: nina.options)
            }

            // ---- The end: the household is deleted, mallory's account erased.
            _ = try await runner.run("DeleteHousehold", Social_V1_DeleteHouseholdRequest.self) {
                try await s.deleteHousehold($0, options: bob.options)
            }
            _ = try await runner.run("EraseUser", Social_V1_EraseUserRequest.self) { try await i.eraseUser($0) }

            let names = try FileManager.default.contentsOfDirectory(atPath: Self.fixtures).filter { $0.hasSuffix(".request.txtpb") }
                .map { String($0.dropLast(".request.txtpb".count)) }
            #expect(Set(names) == runner.ran, "fixtures not run: \(Set(names).subtracting(runner.ran).sorted())")
            #expect(Set(names).count == Social_V1_SocialMethods.all.count + Social_V1_SocialInternalMethods.all.count)
        }
    }
}

final class SocialFixtureRunner: @unchecked Sendable {
    let env: SocialEnv
    let harness: ContractHarness
    /// Fixture id → live id (same length: ULIDs), applied to request bytes.
    var ids: [String: String] = [:]
    private(set) var ran = Set<String>()

    init(env: SocialEnv) {
        self.env = env
        harness = ContractHarness(transport: env.server.channel)
    }

    /// The fixture request with fixture ids replaced by live ones (byte-wise: both are 26-character
    /// ULIDs, so lengths and the encoding stay valid).
    func request<Req: ProtoMessage>(_ method: String, _: Req.Type) async throws -> Req {
        let fixture = try ContractFixture.load(service: "social", fileName: "\(method).request.txtpb", paths: harness.paths)
        #expect(fixture.messageName == Req.protoMessageName)
        var bytes = try await harness.protoc.encode(fixture.messageName, text: fixture.text, files: try harness.paths.protoFiles(service: "social"))
        for (from, to) in ids where from.utf8.count == to.utf8.count { bytes = Self.replace(bytes, Array(from.utf8), Array(to.utf8)) }
        return try Req(serializedBytes: bytes)
    }

    static func replace(_ bytes: [UInt8], _ from: [UInt8], _ to: [UInt8]) -> [UInt8] {
        var out = bytes
        var i = 0
        while i + from.count <= out.count {
            if out[i..<(i + from.count)].elementsEqual(from) {
                out.replaceSubrange(i..<(i + from.count), with: to)
                i += from.count
            } else {
                i += 1
            }
        }
        return out
    }

    func check<Res: ProtoMessage>(_ method: String, _ response: Res, sourceLocation: SourceLocation) async throws {
        let fixture = try ContractFixture.load(service: "social", fileName: "\(method).response.txtpb", paths: harness.paths)
        let result = try await harness.compare(response.serializedBytes(), with: fixture, method: method)
        #expect(result.matches, "\(result)", sourceLocation: sourceLocation)
    }

    func run<Req: ProtoMessage, Res: ProtoMessage>(
        _ method: String, _ type: Req.Type, rewrite: (inout Req) -> Void = { _ in },
        sourceLocation: SourceLocation = #_sourceLocation, _ call: (Req) async throws -> Res
    ) async throws -> Res {
        ran.insert(method)
        var request = try await self.request(method, type)
        rewrite(&request)
        let response: Res
        do { response = try await call(request) } catch {
            Issue.record("\(method): the live service failed: \(error)", sourceLocation: sourceLocation)
            throw error
        }
        try await check(method, response, sourceLocation: sourceLocation)
        return response
    }

    /// The stream fixture is its first notification element (after `started`).
    func runStream<Req: ProtoMessage>(
        _ method: String, _ type: Req.Type, user: User,
        sourceLocation: SourceLocation = #_sourceLocation
    ) async throws -> Social_V1_SubscribeNotificationsResponse {
        ran.insert(method)
        let request = try await self.request(method, Social_V1_SubscribeNotificationsRequest.self)
        let stream = try await LiveStream.open(env.social, user, after: request.afterNotificationId)
        #expect(await stream.waitFor(1), sourceLocation: sourceLocation)
        await stream.cancel()
        let element = try #require(stream.elements.withLock { $0.first { if case .notification = $0.event { true } else { false } } })
        try await check(method, element, sourceLocation: sourceLocation)
        return element
    }
}
