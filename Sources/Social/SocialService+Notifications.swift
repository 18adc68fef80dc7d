import Contracts
import GRPCContracts
import RPCCore
import ServiceKit
import Storage

// MARK: Notifications (A UC11–13, B UC-18, UC-24, C 04.02, D 5.a, E 2.5)

extension SocialService {
    public func listNotifications(
        request: Social_V1_ListNotificationsRequest, context: ServerContext
    ) async throws -> Social_V1_ListNotificationsResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let size = FieldRules.pageSize(request.pageSize, into: &errors)
        var kinds: [Int32] = []
        for (i, k) in request.kinds.enumerated() {
            switch k {
            case .unspecified, .unrecognized: errors.add("kinds[\(i)]", "not a notification kind")
            default: if !kinds.contains(k.rawValue) { kinds.append(k.rawValue) }
            }
        }
        kinds.sort()
        let kindList = kinds.map(String.init).joined(separator: ",")
        let filters = "notifications:\(request.unreadOnly):\(kindList)"
        let before = core.pageTokens.cursor(request.pageToken, filters: filters, parts: 1, into: &errors)?[0]
        try errors.throwIfAny()
        let unreadOnly = request.unreadOnly
        let (rows, unread) = try await core.store.read { c -> ([Row], Int32) in
            var sql = "SELECT \(Inbox.columns) FROM notifications WHERE recipient_id = ?"
            var args: [DatabaseValue] = [.text(caller.userID)]
            if unreadOnly { sql += " AND read_at IS NULL" }
            if !kindList.isEmpty { sql += " AND kind IN (\(kindList))" }
            if let before {
                sql += " AND id < ?"
                args.append(.text(before))
            }
            sql += " ORDER BY id DESC LIMIT ?"
            args.append(.integer(Int64(size + 1)))
            return (try c.query(sql, arguments: args), try Inbox.unreadCount(c, caller.userID))
        }
        var response = Social_V1_ListNotificationsResponse()
        response.notifications = try rows.prefix(size).map(Inbox.notification)
        if rows.count > size, let last = response.notifications.last {
            response.nextPageToken = core.pageTokens.make(cursor: [last.notificationId], filters: filters)
        }
        response.unreadCount = unread
        return response
    }

    public func markNotificationsRead(
        request: Social_V1_MarkNotificationsReadRequest, context: ServerContext
    ) async throws -> Social_V1_MarkNotificationsReadResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        if request.notificationIds.isEmpty && !request.hasReadUpTo {
            errors.add("notification_ids", "set notification_ids or read_up_to")
        }
        let ids = FieldRules.ids(request.notificationIds, field: "notification_ids", minimum: 0, maximum: 100, into: &errors)
        let upTo = request.hasReadUpTo ? FieldRules.timestamp(request.readUpTo, field: "read_up_to", into: &errors) : nil
        try errors.throwIfAny()
        let now = core.now()
        let (marked, unread) = try await core.store.write { tx -> (Int, Int32) in
            var missing = FieldErrors()
            for (i, id) in ids.enumerated()
            where try tx.queryOne("SELECT 1 FROM notifications WHERE id = ? AND recipient_id = ?", id, caller.userID) == nil {
                missing.add("notification_ids[\(request.notificationIds.firstIndex(of: id) ?? i)]", "no such notification of yours")
            }
            try missing.throwIfAny(.notFound, summary: "not found")
            var marked = 0
            for id in ids {
                try tx.execute("UPDATE notifications SET read_at = ? WHERE id = ? AND recipient_id = ? AND read_at IS NULL", now, id, caller.userID)
                marked += tx.changes
            }
            if let upTo {
                try tx.execute(
                    "UPDATE notifications SET read_at = ? WHERE recipient_id = ? AND read_at IS NULL AND created_at <= ?",
                    now, caller.userID, upTo)
                marked += tx.changes
            }
            return (marked, try Inbox.unreadCount(tx, caller.userID))
        }
        var response = Social_V1_MarkNotificationsReadResponse()
        response.markedCount = Int32(clamping: marked)
        response.unreadCount = unread
        return response
    }

    /// The live stream. Race-free replay: the subscription is registered *first* (from then on
    /// every committed notification of the caller is queued in it), *then* the inbox is read
    /// (everything committed before the read is in it), and queued notifications whose id is not
    /// past the last one sent are dropped (they were in the read too). Ids follow commit order and
    /// publications are released in commit order, so nothing is missed, repeated or reordered.
    public func subscribeNotifications(
        request: Social_V1_SubscribeNotificationsRequest,
        responses: ResponseWriter<Social_V1_SubscribeNotificationsResponse>,
        context: ServerContext
    ) async throws {
        let caller = try core.caller(context)
        let after = FieldRules.trimmed(request.afterNotificationId)
        if !after.isEmpty && !ULID.isValid(after.uppercased()) {
            throw FieldErrors.single(.invalidArgument, field: "after_notification_id", "is not a notification id")
        }
        let subscription = try core.hub.register(userID: caller.userID, sessionID: caller.sessionID, expiresAt: caller.expiresAt * 1000)
        defer { core.hub.remove(subscription) }
        // Two calls, so that the replay's locals are gone while the stream idles: an idle stream
        // keeps only `live`'s small frame (memory per subscription, see the README).
        let last = try await startAndReplay(user: caller.userID, after: after.uppercased(), responses: responses)
        try await live(subscription, after: last, responses: responses)
    }

    /// Sends `started` and the missed notifications; returns the id to continue after.
    func startAndReplay(
        user: String, after: String,
        responses: ResponseWriter<Social_V1_SubscribeNotificationsResponse>
    ) async throws -> String {
        let now = core.now()
        let batch = 200
        var (started, replay, last) = try await core.store.read { c -> (Social_V1_SubscriptionStarted, [Social_V1_Notification], String) in
            var s = Social_V1_SubscriptionStarted()
            s.unreadCount = try Inbox.unreadCount(c, user)
            s.settings = try Inbox.settings(c, user, now: now)
            if after.isEmpty {
                // Only what is created after subscribing: start past the newest stored one.
                let newest = try c.queryOne("SELECT max(id) FROM notifications WHERE recipient_id = ?", user)?.get(0, as: String?.self)
                return (s, [], newest ?? "")
            }
            let rows = try c.query(
                "SELECT \(Inbox.columns) FROM notifications WHERE recipient_id = ? AND id > ? AND silenced = 0 ORDER BY id LIMIT ?",
                user, after, batch)
            return (s, try rows.map(Inbox.notification), after)
        }
        var element = Social_V1_SubscribeNotificationsResponse()
        element.started = started
        try await responses.write(element)
        started = Social_V1_SubscriptionStarted()
        // Replay what was missed, page by page (a later page is read after the earlier was sent).
        while !replay.isEmpty {
            for n in replay {
                element.notification = n
                try await responses.write(element)
                last = n.notificationId
            }
            if replay.count < batch { break }
            let from = last
            replay = try await core.store.read { c in
                try c.query(
                    "SELECT \(Inbox.columns) FROM notifications WHERE recipient_id = ? AND id > ? AND silenced = 0 ORDER BY id LIMIT ?",
                    user, from, batch
                ).map(Inbox.notification)
            }
        }
        return last
    }

    /// Live notifications until the client goes, the token expires, the server shuts down, or the
    /// stream is replaced or falls too far behind (each ends the call with its status).
    func live(
        _ subscription: NotificationHub.Subscription, after: String,
        responses: ResponseWriter<Social_V1_SubscribeNotificationsResponse>
    ) async throws {
        var last = after
        while true {
            switch await subscription.next() {
            case .notifications(let list):
                for n in list where n.notificationId > last {
                    var element = Social_V1_SubscribeNotificationsResponse()
                    element.notification = n
                    try await responses.write(element)
                    last = n.notificationId
                }
            case .closed(let error):
                throw error
            }
        }
    }

    public func getNotificationSettings(
        request: Social_V1_GetNotificationSettingsRequest, context: ServerContext
    ) async throws -> Social_V1_GetNotificationSettingsResponse {
        let caller = try core.caller(context)
        let now = core.now()
        var response = Social_V1_GetNotificationSettingsResponse()
        response.settings = try await core.store.read { c in try Inbox.settings(c, caller.userID, now: now) }
        return response
    }

    public func muteHelpNotifications(
        request: Social_V1_MuteHelpNotificationsRequest, context: ServerContext
    ) async throws -> Social_V1_MuteHelpNotificationsResponse {
        let caller = try core.caller(context)
        let now = core.now()
        let muted = request.muted
        var response = Social_V1_MuteHelpNotificationsResponse()
        response.settings = try await core.store.write { tx in
            try tx.execute(
                "INSERT INTO notification_settings (user_id, help_muted) VALUES (?, ?) ON CONFLICT(user_id) DO UPDATE SET help_muted = excluded.help_muted",
                caller.userID, muted)
            return try Inbox.settings(tx, caller.userID, now: now)
        }
        return response
    }

    public func snoozeNotifications(
        request: Social_V1_SnoozeNotificationsRequest, context: ServerContext
    ) async throws -> Social_V1_SnoozeNotificationsResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let ms = FieldRules.duration(request.duration, field: "duration", into: &errors)
        if errors.isEmpty && ms != 0 && !NotificationRules.snoozeRange.contains(ms) {
            errors.add("duration", "must be zero (end the snooze) or 1 minute to 7 days")
        }
        try errors.throwIfAny()
        let now = core.now()
        let until: Int64? = ms == 0 ? nil : now + ms
        var response = Social_V1_SnoozeNotificationsResponse()
        response.settings = try await core.store.write { tx in
            try tx.execute(
                "INSERT INTO notification_settings (user_id, snoozed_until) VALUES (?, ?) ON CONFLICT(user_id) DO UPDATE SET snoozed_until = excluded.snoozed_until",
                caller.userID, until)
            return try Inbox.settings(tx, caller.userID, now: now)
        }
        return response
    }

    public func setPushPreferences(
        request: Social_V1_SetPushPreferencesRequest, context: ServerContext
    ) async throws -> Social_V1_SetPushPreferencesResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let (disabled, quiet) = PushPreferenceRules.validate(request.preferences, field: "preferences", into: &errors)
        try errors.throwIfAny()
        let now = core.now()
        var response = Social_V1_SetPushPreferencesResponse()
        response.settings = try await core.store.write { tx in
            if try tx.queryOne("SELECT 1 FROM erased_users WHERE id = ?", caller.userID) != nil {
                throw RPCError(.unauthenticated, "the account of this access token no longer exists")
            }
            try PushQueue.save(tx, user: caller.userID, disabled: disabled, quiet: quiet)
            // Pushes held for the old quiet hours (never tried yet) are checked again now.
            try tx.execute("UPDATE push_outbox SET due_at = ? WHERE user_id = ? AND attempts = 0 AND due_at > ?", now, caller.userID, now)
            return try Inbox.settings(tx, caller.userID, now: now)
        }
        core.wakePush()
        return response
    }
}
