import Contracts
import Foundation
import GRPCContracts
import RPCCore
import ServiceKit
import ServiceKitTesting
import Social
import Testing

@Suite("Social: friends, blocks and follows", .serialized)
struct RelationsTests {
    static func by(_ u: User, id: Bool = false) -> Social_V1_UserSelector {
        var s = Social_V1_UserSelector()
        if id { s.userId = u.id } else { s.username = u.username.uppercased() }
        return s
    }

    static func relation(_ env: SocialEnv, _ a: User, _ b: User) async throws -> Social_V1_CheckRelationshipResponse {
        var r = Social_V1_CheckRelationshipRequest()
        r.userId = a.id
        r.otherUserId = b.id
        return try await env.internalAPI.checkRelationship(r)
    }

    @Test func friendsAreMutualAndListedByUsername() async throws {
        try await withSocial { env in
            let alice = try await env.user("alice"), bob = try await env.user("bob"), carol = try await env.user("Carol")
            var add = Social_V1_AddFriendRequest()
            add.user = Self.by(bob)
            let f = try await env.social.addFriend(add, options: alice.options)
            #expect(f.friendship.user.userId == bob.id && f.friendship.user.username == bob.username)
            await expectFailure(.alreadyExists, fields: ["user"]) { try await env.social.addFriend(add, options: alice.options) }
            add.user = Self.by(alice, id: true)
            await expectFailure(.alreadyExists) { try await env.social.addFriend(add, options: bob.options) }  // mutual already
            add.user = Self.by(alice)
            await expectFailure(.invalidArgument, fields: ["user"]) { try await env.social.addFriend(add, options: alice.options) }
            add.user.username = "nobody_here"
            await expectFailure(.notFound, fields: ["user.username"]) { try await env.social.addFriend(add, options: alice.options) }
            add.user.userId = "01JD3KCW8S4B1C5D9E2F6G7H8J"
            await expectFailure(.notFound, fields: ["user.user_id"]) { try await env.social.addFriend(add, options: alice.options) }
            await expectFailure(.invalidArgument, fields: ["user"]) {
                try await env.social.addFriend(Social_V1_AddFriendRequest(), options: alice.options)
            }
            add.user = Self.by(carol)
            _ = try await env.social.addFriend(add, options: alice.options)

            let bobInbox = try await env.social.listNotifications(Social_V1_ListNotificationsRequest(), options: bob.options).notifications
            #expect(bobInbox.map(\.kind) == [.friendAdded] && bobInbox[0].actor.userId == alice.id)

            var list = Social_V1_ListFriendsRequest()
            list.pageSize = 1
            let p1 = try await env.social.listFriends(list, options: alice.options)
            list.pageToken = p1.nextPageToken
            let p2 = try await env.social.listFriends(list, options: alice.options)
            #expect(p2.nextPageToken.isEmpty)
            let expected = [bob, carol].sorted { $0.username.lowercased() < $1.username.lowercased() }.map(\.id)
            #expect((p1.friends + p2.friends).map(\.user.userId) == expected)
            #expect(try await env.social.listFriends(Social_V1_ListFriendsRequest(), options: bob.options).friends.map(\.user.userId) == [alice.id])
            #expect(try await Self.relation(env, bob, alice).friends)

            var remove = Social_V1_RemoveFriendRequest()
            remove.user = Self.by(alice)
            _ = try await env.social.removeFriend(remove, options: bob.options)  // either side ends it
            await expectFailure(.notFound, fields: ["user"]) { try await env.social.removeFriend(remove, options: bob.options) }
            #expect(try await env.social.listFriends(Social_V1_ListFriendsRequest(), options: alice.options).friends.map(\.user.userId) == [carol.id])
        }
    }

    @Test func aRenameInAccountsReachesFriendListsWithoutListsWaitingOnAccounts() async throws {
        try await withSocial { env in
            let alice = try await env.user("alice"), bob = try await env.user("bob", displayName: "Bob")
            var add = Social_V1_AddFriendRequest()
            add.user = Self.by(bob)
            _ = try await env.social.addFriend(add, options: alice.options)
            var update = Accounts_V1_UpdateProfileRequest()
            var name = Google_Protobuf_StringValue()
            name.value = "Robert Kowalski"
            update.displayName = name
            _ = try await env.accounts.updateProfile(update, options: bob.options)
            // The first page answers from the cache and refreshes it in the background.
            let renamed = try await eventually {
                let friends = try await env.social.listFriends(Social_V1_ListFriendsRequest(), options: alice.options).friends
                return friends.first?.user.displayName == "Robert Kowalski"
            }
            #expect(renamed)
        }
    }

    @Test func aBlockEndsEverythingBetweenTwoUsersAndKeepsTheBlockedOneAway() async throws {
        try await withSocial { env in
            let alice = try await env.user("alice"), mallory = try await env.user("mallory")
            var add = Social_V1_AddFriendRequest()
            add.user = Self.by(mallory)
            _ = try await env.social.addFriend(add, options: alice.options)
            var follow = Social_V1_RequestFollowRequest()
            follow.user = Self.by(mallory)
            _ = try await env.social.requestFollow(follow, options: alice.options)
            var accept = Social_V1_AcceptFollowRequestRequest()
            accept.requesterUserId = alice.id
            _ = try await env.social.acceptFollowRequest(accept, options: mallory.options)
            follow.user = Self.by(alice)
            _ = try await env.social.requestFollow(follow, options: mallory.options)  // pending
            let before = try await Self.relation(env, alice, mallory)
            #expect(before.friends && before.userFollowsOther && !before.otherFollowsUser)

            var block = Social_V1_BlockUserRequest()
            block.user = Self.by(mallory)
            let blocked = try await env.social.blockUser(block, options: alice.options)
            #expect(blocked.blocked.user.userId == mallory.id)
            await expectFailure(.alreadyExists, fields: ["user"]) { try await env.social.blockUser(block, options: alice.options) }
            var selfBlock = Social_V1_BlockUserRequest()
            selfBlock.user = Self.by(alice, id: true)
            await expectFailure(.invalidArgument, fields: ["user"]) { try await env.social.blockUser(selfBlock, options: alice.options) }
            selfBlock.user.username = "nobody_here"
            await expectFailure(.notFound, fields: ["user.username"]) { try await env.social.blockUser(selfBlock, options: alice.options) }
            let after = try await Self.relation(env, alice, mallory)
            #expect(!after.friends && !after.userFollowsOther && !after.otherFollowsUser && after.userBlocksOther && !after.otherBlocksUser)
            let seenByMallory = try await Self.relation(env, mallory, alice)
            #expect(seenByMallory.otherBlocksUser && !seenByMallory.userBlocksOther)
            var incoming = Social_V1_ListFollowRequestsRequest()
            incoming.direction = .incoming
            #expect(try await env.social.listFollowRequests(incoming, options: alice.options).requests.isEmpty)

            // mallory can no longer befriend, follow or notify alice (and alice not mallory either).
            add.user = Self.by(alice)
            await expectFailure(.permissionDenied) { try await env.social.addFriend(add, options: mallory.options) }
            follow.user = Self.by(alice)
            await expectFailure(.permissionDenied) { try await env.social.requestFollow(follow, options: mallory.options) }
            add.user = Self.by(mallory)
            await expectFailure(.permissionDenied) { try await env.social.addFriend(add, options: alice.options) }
            let sent = try await env.notify([alice.id], kind: .challenge, title: "Mallory challenges you", actor: mallory.id)
            #expect(sent.skippedUserIds == [alice.id] && sent.notificationIds.isEmpty)
            #expect(
                try await env.social.listNotifications(Social_V1_ListNotificationsRequest(), options: alice.options).notifications
                    .allSatisfy { $0.actor.userId != mallory.id || $0.kind != .challenge })

            let list = try await env.social.listBlockedUsers(Social_V1_ListBlockedUsersRequest(), options: alice.options)
            #expect(list.blocked.map(\.user.userId) == [mallory.id] && list.blocked[0].user.username == mallory.username)
            var unblock = Social_V1_UnblockUserRequest()
            unblock.user = Self.by(mallory, id: true)
            _ = try await env.social.unblockUser(unblock, options: alice.options)
            await expectFailure(.notFound, fields: ["user"]) { try await env.social.unblockUser(unblock, options: alice.options) }
            // The friendship is not restored.
            #expect(!(try await Self.relation(env, alice, mallory).friends))
            add.user = Self.by(alice)
            _ = try await env.social.addFriend(add, options: mallory.options)
            await expectFailure(.invalidArgument, fields: ["other_user_id"]) { _ = try await Self.relation(env, alice, alice) }
            await expectFailure(.invalidArgument, fields: ["user_id", "other_user_id"]) {
                try await env.internalAPI.checkRelationship(Social_V1_CheckRelationshipRequest())
            }
            // Internal methods need the service credential.
            await expectFailure(.permissionDenied) {
                try await Social_V1_SocialInternalClient(env.server.gateway).checkRelationship(
                    Social_V1_CheckRelationshipRequest(), options: alice.options)
            }
        }
    }

    @Test func theFollowJourney() async throws {
        try await withSocial { env in
            let alice = try await env.user("alice"), carol = try await env.user("carol"), dave = try await env.user("dave")
            var follow = Social_V1_RequestFollowRequest()
            follow.user = Self.by(carol)
            let pending = try await env.social.requestFollow(follow, options: alice.options).request
            #expect(pending.requester.userId == alice.id && pending.target.userId == carol.id && pending.target.username == carol.username)
            await expectFailure(.alreadyExists, fields: ["user"]) { try await env.social.requestFollow(follow, options: alice.options) }
            follow.user = Self.by(alice)
            await expectFailure(.invalidArgument) { try await env.social.requestFollow(follow, options: alice.options) }
            follow.user.username = "nobody_here"
            await expectFailure(.notFound) { try await env.social.requestFollow(follow, options: alice.options) }
            follow.user = Self.by(carol)
            env.clock.advance(by: .seconds(1))
            _ = try await env.social.requestFollow(follow, options: dave.options)
            let carolInbox = try await env.social.listNotifications(Social_V1_ListNotificationsRequest(), options: carol.options).notifications
            #expect(carolInbox.map(\.kind) == [.followRequest, .followRequest])

            var incoming = Social_V1_ListFollowRequestsRequest()
            let inc = try await env.social.listFollowRequests(incoming, options: carol.options).requests
            #expect(inc.map(\.requester.userId) == [dave.id, alice.id])  // newest first
            incoming.direction = .outgoing
            #expect(try await env.social.listFollowRequests(incoming, options: alice.options).requests.map(\.target.userId) == [carol.id])

            var accept = Social_V1_AcceptFollowRequestRequest()
            accept.requesterUserId = alice.id
            let follower = try await env.social.acceptFollowRequest(accept, options: carol.options).follower
            #expect(follower.user.userId == alice.id && follower.user.username == alice.username)
            await expectFailure(.notFound, fields: ["requester_user_id"]) { try await env.social.acceptFollowRequest(accept, options: carol.options) }
            #expect(
                try await env.social.listNotifications(Social_V1_ListNotificationsRequest(), options: alice.options).notifications.first?.kind
                    == .followAccepted)
            var decline = Social_V1_DeclineFollowRequestRequest()
            decline.requesterUserId = dave.id
            _ = try await env.social.declineFollowRequest(decline, options: carol.options)
            await expectFailure(.notFound) { try await env.social.declineFollowRequest(decline, options: carol.options) }
            #expect(try await env.social.listNotifications(Social_V1_ListNotificationsRequest(), options: dave.options).notifications.isEmpty)

            follow.user = Self.by(carol)
            await expectFailure(.alreadyExists) { try await env.social.requestFollow(follow, options: alice.options) }
            #expect(
                try await env.social.listFollowers(Social_V1_ListFollowersRequest(), options: carol.options).followers.map(\.user.userId) == [
                    alice.id
                ])
            #expect(
                try await env.social.listFollowing(Social_V1_ListFollowingRequest(), options: alice.options).following.map(\.user.userId) == [
                    carol.id
                ])
            var ids = Social_V1_ListFollowedUserIdsRequest()
            ids.userId = alice.id
            #expect(try await env.internalAPI.listFollowedUserIds(ids).userIds == [carol.id])
            ids.pageSize = -1
            await expectFailure(.invalidArgument, fields: ["page_size"]) { try await env.internalAPI.listFollowedUserIds(ids) }

            // Unfollow ends a follow or withdraws a request; neither → NOT_FOUND.
            var unfollow = Social_V1_UnfollowRequest()
            unfollow.user = Self.by(carol)
            _ = try await env.social.unfollow(unfollow, options: alice.options)
            await expectFailure(.notFound, fields: ["user"]) { try await env.social.unfollow(unfollow, options: alice.options) }
            _ = try await env.social.requestFollow(follow, options: dave.options)
            _ = try await env.social.unfollow(unfollow, options: dave.options)
            incoming.direction = .incoming
            #expect(try await env.social.listFollowRequests(incoming, options: carol.options).requests.isEmpty)
        }
    }

    @Test func followedIdsPageOldestFirst() async throws {
        try await withSocial { env in
            let alice = try await env.user("alice")
            var targets: [User] = []
            for _ in 0..<5 {
                let t = try await env.user("t")
                targets.append(t)
                var follow = Social_V1_RequestFollowRequest()
                follow.user = Self.by(t)
                _ = try await env.social.requestFollow(follow, options: alice.options)
                var accept = Social_V1_AcceptFollowRequestRequest()
                accept.requesterUserId = alice.id
                _ = try await env.social.acceptFollowRequest(accept, options: t.options)
                env.clock.advance(by: .seconds(1))
            }
            var r = Social_V1_ListFollowedUserIdsRequest()
            r.userId = alice.id
            r.pageSize = 2
            var all: [String] = []
            while true {
                let page = try await env.internalAPI.listFollowedUserIds(r)
                all += page.userIds
                if page.nextPageToken.isEmpty { break }
                r.pageToken = page.nextPageToken
            }
            #expect(all == targets.map(\.id))
            var following = Social_V1_ListFollowingRequest()
            following.pageSize = 3
            let first = try await env.social.listFollowing(following, options: alice.options)
            following.pageToken = first.nextPageToken
            let second = try await env.social.listFollowing(following, options: alice.options)
            #expect((first.following + second.following).map(\.user.userId) == targets.reversed().map(\.id))
        }
    }
}
