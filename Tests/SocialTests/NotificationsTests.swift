import Contracts
import Foundation
import RPCCore
import RPCTransport
import ServiceKit
import ServiceKitTesting
import Social
import Synchronization
import Testing

@Suite("Social: the inbox, settings and live streams", .serialized)
struct NotificationsTests {
    @Test func sendNotificationStoresOncePerEventSkipsUnknownRecipientsAndValidatesEveryField() async throws {
        try await withSocial { env in
            let alice = try await env.user("alice"), bob = try await env.user("bob")
            let unknown = "01JD3KCW8S4B1C5D9E2F6G7H8J"
            var r = Social_V1_SendNotificationRequest()
            r.eventId = "tasks:evt-1"
            r.recipientUserIds = [bob.id, unknown, bob.id]
            r.kind = .helpRequest
            r.title = "Alice needs help"
            r.body = "Alice asks for help with \"Quarterly report\"."
            r.actorUserId = alice.id
            r.target.taskId = "01JD4P9Q8R7S6T5V4W3X2Y1Z0A"
            r.data = ["task_name": "Quarterly report"]
            let first = try await env.internalAPI.sendNotification(r)
            #expect(!first.replayed && first.notificationIds.keys.sorted() == [bob.id] && first.skippedUserIds == [unknown])
            let again = try await env.internalAPI.sendNotification(r)
            #expect(again.replayed && again.notificationIds == first.notificationIds && again.skippedUserIds == [unknown])
            let inbox = try await env.social.listNotifications(Social_V1_ListNotificationsRequest(), options: bob.options)
            #expect(inbox.notifications.count == 1 && inbox.unreadCount == 1)
            let n = inbox.notifications[0]
            #expect(n.notificationId == first.notificationIds[bob.id] && n.kind == .helpRequest && n.title == r.title && n.body == r.body)
            #expect(n.actor.userId == alice.id && n.actor.username == alice.username && n.actor.displayName == alice.displayName)
            #expect(n.target.taskId == r.target.taskId && n.data == r.data && !n.silenced && !n.hasReadAt)

            var bad = Social_V1_SendNotificationRequest()
            bad.title = String(repeating: "x", count: 101)
            bad.body = String(repeating: "y", count: 501)
            bad.data = ["k": String(repeating: "v", count: 501)]
            await expectFailure(.invalidArgument, fields: ["event_id", "recipient_user_ids", "kind", "title", "body", "data[k]"]) {
                try await env.internalAPI.sendNotification(bad)
            }
            bad = r
            bad.recipientUserIds = (0..<101).map { "u\($0)" }
            await expectFailure(.invalidArgument, fields: ["recipient_user_ids"]) { try await env.internalAPI.sendNotification(bad) }
            // Users may not call it.
            await expectFailure(.permissionDenied) {
                try await Social_V1_SocialInternalClient(env.server.gateway).sendNotification(r, options: bob.options)
            }
        }
    }

    @Test func listFiltersPagesAndMarksRead() async throws {
        try await withSocial { env in
            let bob = try await env.user("bob")
            var ids: [String] = []
            for (i, kind) in [Social_V1_NotificationKind.helpRequest, .taskReminder, .helpOffer, .newBid, .helpRequest].enumerated() {
                env.clock.advance(by: .seconds(60))
                ids.append(try await env.notify([bob.id], kind: kind, title: "n\(i)").notificationIds[bob.id]!)
            }
            var list = Social_V1_ListNotificationsRequest()
            list.kinds = [.helpRequest, .helpOffer]
            list.pageSize = 2
            let p1 = try await env.social.listNotifications(list, options: bob.options)
            #expect(p1.notifications.map(\.notificationId) == [ids[4], ids[2]] && p1.unreadCount == 5)
            list.pageToken = p1.nextPageToken
            let p2 = try await env.social.listNotifications(list, options: bob.options)
            #expect(p2.notifications.map(\.notificationId) == [ids[0]] && p2.nextPageToken.isEmpty)
            list.kinds = [.helpRequest]  // the token is bound to the filters
            await expectFailure(.invalidArgument, fields: ["page_token"]) { try await env.social.listNotifications(list, options: bob.options) }
            list = Social_V1_ListNotificationsRequest()
            list.kinds = [.unspecified]
            await expectFailure(.invalidArgument, fields: ["kinds[0]"]) { try await env.social.listNotifications(list, options: bob.options) }

            // Mark two by id and everything up to the third's time: 3 changed; read ones stay read.
            let third = try await env.social.listNotifications(Social_V1_ListNotificationsRequest(), options: bob.options).notifications[2]
            var mark = Social_V1_MarkNotificationsReadRequest()
            mark.notificationIds = [ids[4], ids[0]]
            mark.readUpTo = third.createdAt
            let marked = try await env.social.markNotificationsRead(mark, options: bob.options)
            #expect(marked.markedCount == 4 && marked.unreadCount == 1)
            #expect(try await env.social.markNotificationsRead(mark, options: bob.options).markedCount == 0)
            var unread = Social_V1_ListNotificationsRequest()
            unread.unreadOnly = true
            #expect(try await env.social.listNotifications(unread, options: bob.options).notifications.map(\.notificationId) == [ids[3]])
            // Someone else's ids → NOT_FOUND naming them; nothing changes.
            let carol = try await env.user("carol")
            mark = Social_V1_MarkNotificationsReadRequest()
            mark.notificationIds = [ids[3]]
            await expectFailure(.notFound, fields: ["notification_ids[0]"]) {
                try await env.social.markNotificationsRead(mark, options: carol.options)
            }
            await expectFailure(.invalidArgument, fields: ["notification_ids"]) {
                try await env.social.markNotificationsRead(Social_V1_MarkNotificationsReadRequest(), options: bob.options)
            }
        }
    }

    @Test func aLiveStreamGetsAnotherUsersActionThenAReconnectGetsExactlyWhatItMissed() async throws {
        try await withSocial { env in
            let alice = try await env.user("alice"), bob = try await env.user("bob")
            _ = try await env.notify([bob.id], title: "before")
            let stream = try await LiveStream.open(env.social, bob)
            #expect(stream.started?.unreadCount == 1)
            #expect(stream.notifications.isEmpty)  // only what comes after subscribing
            var add = Social_V1_AddFriendRequest()
            add.user = bob.selector
            _ = try await env.social.addFriend(add, options: alice.options)
            #expect(await stream.waitFor(1))
            #expect(stream.notifications.first?.kind == .friendAdded && stream.notifications.first?.actor.userId == alice.id)
            let lastSeen = stream.ids.last!
            await stream.cancel()
            #expect(await eventually { env.core.hub.liveCount(userID: bob.id) == 0 })

            // Missed while away: three, then a reconnect with the last id gets each exactly once,
            // in order, then live ones.
            var missed: [String] = []
            for i in 0..<3 { missed.append(try await env.notify([bob.id], title: "missed \(i)").notificationIds[bob.id]!) }
            let again = try await LiveStream.open(env.social, bob, after: lastSeen)
            #expect(await again.waitFor(3))
            let live = try await env.notify([bob.id], title: "live").notificationIds[bob.id]!
            #expect(await again.waitFor(4))
            try await Task.sleep(for: .milliseconds(100))
            #expect(again.ids == missed + [live])
            await again.cancel()
        }
    }

    @Test func mutedAndSnoozedOnesAreStoredSilencedNotPushedAndPushingResumesAfterTheSnooze() async throws {
        try await withSocial { env in
            let bob = try await env.user("bob")
            var mute = Social_V1_MuteHelpNotificationsRequest()
            mute.muted = true
            #expect(try await env.social.muteHelpNotifications(mute, options: bob.options).settings.helpMuted)
            let stream = try await LiveStream.open(env.social, bob)
            #expect(stream.started?.settings.helpMuted == true)
            let help = try await env.notify([bob.id], kind: .helpOffer, title: "help").notificationIds[bob.id]!
            let reminder = try await env.notify([bob.id], kind: .taskReminder, title: "reminder").notificationIds[bob.id]!
            #expect(await stream.waitFor(1))
            #expect(stream.ids == [reminder])

            var snooze = Social_V1_SnoozeNotificationsRequest()
            snooze.duration.seconds = 30
            await expectFailure(.invalidArgument, fields: ["duration"]) { try await env.social.snoozeNotifications(snooze, options: bob.options) }
            snooze.duration.seconds = 8 * 24 * 3600
            await expectFailure(.invalidArgument, fields: ["duration"]) { try await env.social.snoozeNotifications(snooze, options: bob.options) }
            snooze.duration.seconds = 5400
            let snoozed = try await env.social.snoozeNotifications(snooze, options: bob.options).settings
            #expect(snoozed.snoozedUntil.milliseconds == env.clock.nowMilliseconds() + 5_400_000)
            let quiet = try await env.notify([bob.id], kind: .newBid, title: "while snoozed").notificationIds[bob.id]!
            // The snooze ends by itself (the clock moves): the next one is pushed.
            env.clock.advance(by: .seconds(5401))
            #expect(
                !(try await env.social.getNotificationSettings(Social_V1_GetNotificationSettingsRequest(), options: bob.options).settings
                    .hasSnoozedUntil))
            let after = try await env.notify([bob.id], kind: .newBid, title: "after").notificationIds[bob.id]!
            #expect(await stream.waitFor(2))
            #expect(stream.ids == [reminder, after])

            // Everything is in the inbox; the silenced ones say so, and a replay skips them.
            let inbox = try await env.social.listNotifications(Social_V1_ListNotificationsRequest(), options: bob.options).notifications
            #expect(inbox.map(\.notificationId) == [after, quiet, reminder, help])
            #expect(inbox.map(\.silenced) == [false, true, false, true])
            let replay = try await LiveStream.open(env.social, bob, after: "00000000000000000000000000")
            #expect(await replay.waitFor(2))
            #expect(replay.ids == [reminder, after])
            // Ending a snooze early, and unmuting.
            _ = try await env.social.snoozeNotifications(snooze, options: bob.options)
            snooze.duration = .init()
            #expect(!(try await env.social.snoozeNotifications(snooze, options: bob.options).settings.hasSnoozedUntil))
            mute.muted = false
            #expect(!(try await env.social.muteHelpNotifications(mute, options: bob.options).settings.helpMuted))
            await stream.cancel()
            await replay.cancel()
        }
    }

    @Test func concurrentSendersReachAStreamInIdOrderEachOnce() async throws {
        try await withSocial { env in
            let bob = try await env.user("bob")
            let stream = try await LiveStream.open(env.social, bob)
            let sent = Shared<[String]>([])
            await withTaskGroup(of: Void.self) { group in
                for w in 0..<8 {
                    group.addTask {
                        for i in 0..<10 {
                            if let id = try? await env.notify([bob.id], title: "w\(w) #\(i)").notificationIds[bob.id] {
                                sent.withLock { $0.append(id) }
                            }
                        }
                    }
                }
            }
            let all = sent.withLock { $0 }.sorted()
            #expect(all.count == 80)
            #expect(await stream.waitFor(80))
            try await Task.sleep(for: .milliseconds(100))
            #expect(stream.ids == all)  // ascending = creation order, no gaps, no repeats
            await stream.cancel()
        }
    }

    @Test func streamsAreBoundedPerUserExpireWithTheTokenAndEndAtShutdown() async throws {
        try await withSocial({ $0.maxSubscriptionsPerUser = 2 }) { env in
            let bob = try await env.user("bob")
            let s1 = try await LiveStream.open(env.social, bob)
            let s2 = try await LiveStream.open(env.social, bob)
            let s3 = try await LiveStream.open(env.social, bob)
            let evicted = await s1.waitUntilFinished()
            #expect(evicted?.code == .resourceExhausted)
            #expect(env.core.hub.liveCount(userID: bob.id) == 2 && !s2.isFinished)
            _ = try await env.notify([bob.id], title: "to both")
            let both = await s2.waitFor(1)
            let third = await s3.waitFor(1)
            #expect(both && third)

            // The access token expires (15 min): the stream ends UNAUTHENTICATED.
            env.clock.advance(by: .seconds(16 * 60))
            env.core.hub.closeExpired()
            #expect(await s2.waitUntilFinished()?.code == .unauthenticated)
            #expect(await s3.waitUntilFinished()?.code == .unauthenticated)
            #expect(await eventually { env.core.hub.liveCount == 0 })

            // A fresh token: shutting down ends it with UNAVAILABLE and refuses new ones.
            env.clock.set(milliseconds: SystemClock.nowMilliseconds())
            let s4 = try await LiveStream.open(env.social, bob)
            env.core.shutDownStreams()
            #expect(await s4.waitUntilFinished()?.code == .unavailable)
            await expectFailure(.unavailable) {
                try await env.social.subscribeNotifications(Social_V1_SubscribeNotificationsRequest(), options: bob.options) { s in
                    for try await _ in s.messages {}
                }
            }
        }
    }

    @Test func aSubscriberWhoseConnectionDiesIsNoticedAndFreed() async throws {
        try await withSocial { env in
            let bob = try await env.user("bob")
            // Its own connection: closing it (not a stream reset) must free the subscription too.
            let channel = RPCChannel(host: "127.0.0.1", port: env.server.port)
            let client = Social_V1_SocialClient(
                RPCClient(transport: CredentialedTransport(base: channel, gatewayToken: TestCredentials.gatewayToken)))
            let stream = try await LiveStream.open(client, bob)
            #expect(env.core.hub.liveCount(userID: bob.id) == 1)
            await channel.close()
            #expect(await eventually { env.core.hub.liveCount(userID: bob.id) == 0 })
            _ = await stream.waitUntilFinished()
            // Notifications sent meanwhile wait in the inbox for the next subscription.
            let id = try await env.notify([bob.id]).notificationIds[bob.id]!
            let again = try await LiveStream.open(env.social, bob, after: "00000000000000000000000000")
            #expect(await again.waitFor(1))
            #expect(again.ids == [id])
            await again.cancel()
        }
    }

    @Test func aSlowStreamIsCutOffAndAMalformedCursorIsRefused() async throws {
        try await withSocial({ $0.maxQueuedPerSubscription = 4 }) { env in
            let bob = try await env.user("bob")
            var r = Social_V1_SubscribeNotificationsRequest()
            r.afterNotificationId = "not-an-id"
            await expectFailure(.invalidArgument, fields: ["after_notification_id"]) {
                try await env.social.subscribeNotifications(r, options: bob.options) { s in for try await _ in s.messages {} }
            }
            await expectFailure(.unauthenticated) {
                try await env.social.subscribeNotifications(Social_V1_SubscribeNotificationsRequest()) { s in for try await _ in s.messages {} }
            }
            // A subscription whose mailbox overflows (nobody drains it) is closed.
            let sub = try env.core.hub.register(userID: bob.id, expiresAt: .max)
            for _ in 0..<5 { _ = try await env.notify([bob.id]) }
            #expect(await eventually { sub.isClosed })
            env.core.hub.remove(sub)
            #expect(env.core.hub.liveCount == 0)
        }
    }

    @Test func eraseUserRemovesEverythingAndIsIdempotent() async throws {
        try await withSocial { env in
            let alice = try await env.user("alice"), bob = try await env.user("bob"), carol = try await env.user("carol")
            var add = Social_V1_AddFriendRequest()
            add.user = bob.selector
            _ = try await env.social.addFriend(add, options: alice.options)  // bob gets a notification with alice as actor
            var follow = Social_V1_RequestFollowRequest()
            follow.user = carol.selector
            _ = try await env.social.requestFollow(follow, options: alice.options)
            var block = Social_V1_BlockUserRequest()
            block.user = carol.selector
            _ = try await env.social.blockUser(block, options: bob.options)
            var team = Social_V1_CreateTeamRequest()
            team.name = "Solo"
            _ = try await env.social.createTeam(team, options: alice.options)
            var hh = Social_V1_CreateHouseholdRequest()
            hh.name = "Shared"
            let household = try await env.social.createHousehold(hh, options: alice.options).household
            _ = try await env.notify([alice.id], title: "for alice")
            let stream = try await LiveStream.open(env.social, alice)

            var erase = Social_V1_EraseUserRequest()
            erase.eventId = "01JD6E1R2A3S4E5V6S7E8R9D0X"
            erase.userId = alice.id
            #expect(!(try await env.internalAPI.eraseUser(erase).replayed))
            #expect(try await env.internalAPI.eraseUser(erase).replayed)
            #expect(await stream.waitUntilFinished()?.code == .unauthenticated)

            #expect(try await env.social.listFriends(Social_V1_ListFriendsRequest(), options: bob.options).friends.isEmpty)
            #expect(try await env.social.listFollowRequests(Social_V1_ListFollowRequestsRequest(), options: carol.options).requests.isEmpty)
            var of = Social_V1_GetTeamOfUserRequest()
            of.userId = alice.id
            #expect(!(try await env.internalAPI.getTeamOfUser(of).hasTeam))
            var check = Social_V1_CheckHouseholdMembershipRequest()
            check.householdId = household.householdId
            #expect(try await env.internalAPI.checkHouseholdMembership(check).state == .deleted)
            #expect(try await env.social.listNotifications(Social_V1_ListNotificationsRequest(), options: alice.options).notifications.isEmpty)
            let bobsCopy = try await env.social.listNotifications(Social_V1_ListNotificationsRequest(), options: bob.options).notifications
            #expect(bobsCopy.count == 1 && !bobsCopy[0].hasActor && bobsCopy[0].title.contains(alice.displayName))
            // Bob's own block of carol is untouched; an erased user is skipped as a recipient.
            #expect(try await env.social.listBlockedUsers(Social_V1_ListBlockedUsersRequest(), options: bob.options).blocked.count == 1)
            #expect(try await env.notify([alice.id]).skippedUserIds == [alice.id])
            var unknown = erase
            unknown.eventId = "other-event"
            unknown.userId = "01JD3KCW8S4B1C5D9E2F6G7H8J"
            #expect(!(try await env.internalAPI.eraseUser(unknown).replayed))
            await expectFailure(.invalidArgument, fields: ["event_id", "user_id"]) {
                try await env.internalAPI.eraseUser(Social_V1_EraseUserRequest())
            }
        }
    }

    @Test func whileAccountsIsDownKnownUsersStillGetNotificationsAndUnknownOnesAreRetriedLater() async throws {
        try await withSocial(accountsDown: true) { env in
            // accounts issues the tokens but social cannot reach it: the caller is unknown to social.
            let bob = try await env.user("bob")
            await expectFailure(.unavailable) { try await env.notify([bob.id]) }
            var add = Social_V1_AddFriendRequest()
            add.user.username = "someone"
            await expectFailure(.unavailable) { try await env.social.addFriend(add, options: bob.options) }
            // Reads that need no peer answer.
            #expect(try await env.social.listNotifications(Social_V1_ListNotificationsRequest(), options: bob.options).notifications.isEmpty)
        }
    }
}
