import Contracts
import Foundation
import RPCCore
import ServiceKit
import ServiceKitTesting
import Social
import Testing

/// What a hostile user could do to other users through social's ordinary RPCs: mail bombing
/// through invites, notification spam by undoing and redoing, forcing blocked users into a team,
/// and growing someone's inbox without bound.
@Suite("Social: abuse of ordinary RPCs", .serialized)
struct AbuseTests {
    static func household(_ env: SocialEnv, _ by: User, emails: [String] = []) async throws -> Social_V1_CreateHouseholdResponse {
        var r = Social_V1_CreateHouseholdRequest()
        r.name = "Flat \(ULID.make().suffix(4))"
        r.inviteEmails = emails
        return try await env.social.createHousehold(r, options: by.options)
    }

    static func invite(_ env: SocialEnv, _ by: User, _ household: String, _ email: String) async throws -> Social_V1_InviteHousemateResponse {
        var r = Social_V1_InviteHousemateRequest()
        r.householdId = household
        r.email = email
        return try await env.social.inviteHousemate(r, options: by.options)
    }

    @Test func reInvitingOneAddressStopsAtItsDailyQuotaAndSoDoesASender() async throws {
        try await withSocial({ c in
            c.maxInviteMailsPerAddress = 3
            c.maxInviteMailsPerUser = 6
        }) { env in
            let mallory = try await env.user("mallory")
            let h = try await Self.household(env, mallory).household.householdId
            // Each re-invite revokes the previous code (pending stays 1) but is still a mail.
            for _ in 0..<3 { _ = try await Self.invite(env, mallory, h, "victim@example.com") }
            let refused = await expectFailure(.resourceExhausted) { try await Self.invite(env, mallory, h, "Victim@Example.com") }
            #expect(refused?.message.contains("victim@example.com") == true || refused?.message.contains("Victim@Example.com") == true)
            #expect(refused?.retryDelaySeconds != nil)
            #expect(try await env.waitForMail(to: "victim@example.com", count: 3).count == 3)

            // Other addresses still work until the sender's own quota (6 in the window) runs out;
            // a household created with more invites than the quota leaves is refused whole.
            for i in 0..<3 { _ = try await Self.invite(env, mallory, h, "other\(i)@example.com") }
            await expectFailure(.resourceExhausted) { try await Self.invite(env, mallory, h, "one-more@example.com") }
            await expectFailure(.resourceExhausted) { _ = try await Self.household(env, mallory, emails: ["x@example.com"]) }
            let mine = try await env.social.listMyHouseholds(Social_V1_ListMyHouseholdsRequest(), options: mallory.options)
            #expect(mine.households.count == 1, "the refused CreateHousehold left nothing behind")

            // A day later the window has moved on.
            env.clock.advance(by: .seconds(24 * 3600 + 1))
            _ = try await Self.invite(env, mallory, h, "victim@example.com")
        }
    }

    @Test func followAndUnfollowLoopsLeaveOneUnreadRequestNotAThousand() async throws {
        try await withSocial { env in
            let mallory = try await env.user("mallory"), bob = try await env.user("bob")
            var follow = Social_V1_RequestFollowRequest()
            follow.user = bob.selector
            var unfollow = Social_V1_UnfollowRequest()
            unfollow.user = bob.selector
            for _ in 0..<5 {
                _ = try await env.social.requestFollow(follow, options: mallory.options)
                _ = try await env.social.unfollow(unfollow, options: mallory.options)
            }
            let inbox = try await env.social.listNotifications(Social_V1_ListNotificationsRequest(), options: bob.options)
            #expect(inbox.notifications.map(\.kind) == [.followRequest])
            // Once bob has read it, a new request is news again.
            var read = Social_V1_MarkNotificationsReadRequest()
            read.notificationIds = inbox.notifications.map(\.notificationId)
            _ = try await env.social.markNotificationsRead(read, options: bob.options)
            _ = try await env.social.requestFollow(follow, options: mallory.options)
            #expect(try await env.social.listNotifications(Social_V1_ListNotificationsRequest(), options: bob.options).notifications.count == 2)
        }
    }

    @Test func aBlockedUserCannotBePutIntoATeamEitherWay() async throws {
        try await withSocial { env in
            let alice = try await env.user("alice"), bob = try await env.user("bob"), carol = try await env.user("carol")
            var block = Social_V1_BlockUserRequest()
            block.user = alice.selector
            _ = try await env.social.blockUser(block, options: bob.options)  // bob blocks alice
            var r = Social_V1_CreateTeamRequest()
            r.name = "Forced"
            r.memberUsernames = [carol.username, bob.username]
            let failure = await expectFailure(.failedPrecondition, fields: ["member_usernames[1]"]) {
                try await env.social.createTeam(r, options: alice.options)
            }
            #expect(failure?.message.contains("blocked") == false, "which side blocked is not told")
            // Nor the other way round: bob cannot add alice either; nothing was created.
            r.memberUsernames = [alice.username]
            await expectFailure(.failedPrecondition, fields: ["member_usernames[0]"]) { try await env.social.createTeam(r, options: bob.options) }
            #expect(!(try await env.social.getMyTeam(Social_V1_GetMyTeamRequest(), options: alice.options).hasTeam))
            #expect(try await env.social.listNotifications(Social_V1_ListNotificationsRequest(), options: bob.options).notifications.isEmpty)
        }
    }

    @Test func anInboxKeepsItsNewestThousand() async throws {
        try await withSocial { env in
            let bob = try await env.user("bob")
            var first = ""
            for i in 0..<(SocialConfiguration.notificationsKept + 5) {
                let sent = try await env.notify([bob.id], title: "Reminder \(i)")
                if i == 0 { first = sent.notificationIds[bob.id] ?? "" }
            }
            var list = Social_V1_ListNotificationsRequest()
            list.pageSize = 1
            let newest = try await env.social.listNotifications(list, options: bob.options)
            #expect(newest.unreadCount == Int32(SocialConfiguration.notificationsKept))
            #expect(newest.notifications.first?.title == "Reminder \(SocialConfiguration.notificationsKept + 4)")
            // The oldest five are gone: marking the first read is NOT_FOUND now.
            var read = Social_V1_MarkNotificationsReadRequest()
            read.notificationIds = [first]
            await expectFailure(.notFound) { try await env.social.markNotificationsRead(read, options: bob.options) }
        }
    }
}
