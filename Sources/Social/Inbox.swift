import Contracts
import GRPCContracts
import ServiceKit
import Storage

/// The inbox table: storing a notification (with the recipient's settings and blocks applied) and
/// reading it back as a `Notification`.
enum Inbox {
    struct Draft: Sendable {
        var kind: Social_V1_NotificationKind
        var title: String
        var body: String = ""
        var actor: Common_V1_UserRef?
        var target: Social_V1_NotificationTarget?
        var data: [String: String] = [:]
        var eventID: String?
        /// A notification a user can cause again and again by undoing and redoing an action
        /// (follow request, friendship): while an unread one of the same kind from the same actor
        /// about the same target is in the inbox, another is not stored (nor pushed).
        var collapsesUnread = false
    }

    static let maxKept = SocialConfiguration.notificationsKept

    /// True when `recipient` blocks `actor` (their notifications are dropped, not stored).
    static func blocks(_ db: some SQLReader, blocker: String, blocked: String) throws -> Bool {
        try db.queryOne("SELECT 1 FROM blocks WHERE blocker_id = ? AND blocked_id = ?", blocker, blocked) != nil
    }

    /// Stores `draft` for `recipient` and queues it for the live streams unless silenced. Nil when
    /// the recipient blocks the actor (nothing stored). The id is made here, inside the write, so
    /// ids follow commit order.
    static func store(_ tx: Transaction, recipient: String, _ draft: Draft, now: Int64, out: inout Outbound) throws -> String? {
        if let actor = draft.actor, try blocks(tx, blocker: recipient, blocked: actor.userId) { return nil }
        // An erase may commit between a caller's lookups and this write: never store for them.
        if try tx.queryOne("SELECT 1 FROM erased_users WHERE id = ?", recipient) != nil { return nil }
        if draft.collapsesUnread, let actor = draft.actor,
            let existing = try tx.queryOne(
                """
                SELECT id FROM notifications INDEXED BY notifications_unread
                WHERE recipient_id = ? AND read_at IS NULL AND kind = ? AND actor_id = ? AND target IS ?
                ORDER BY id DESC LIMIT 1
                """,
                recipient, Int64(draft.kind.rawValue), actor.userId, draft.target.map { $0.serializedBytes() })
        {
            return try existing.get(0, as: String.self)
        }
        let settings = try tx.queryOne("SELECT help_muted, snoozed_until FROM notification_settings WHERE user_id = ?", recipient)
        let muted = try settings?.get("help_muted", as: Bool.self) ?? false
        let snoozedUntil = try settings?.get("snoozed_until", as: Int64?.self) ?? nil
        let silenced = NotificationRules.silenced(kind: draft.kind, helpMuted: muted, snoozedUntil: snoozedUntil, now: now)
        let id = ULID.make(now: now)
        var dataHolder = Social_V1_Notification()
        dataHolder.data = draft.data
        try tx.execute(
            """
            INSERT INTO notifications (id, recipient_id, kind, title, body, actor_id, actor_username, actor_display_name,
                                       target, data, created_at, silenced, event_id)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """,
            id, recipient, Int64(draft.kind.rawValue), draft.title, draft.body, draft.actor?.userId, draft.actor?.username,
            draft.actor?.displayName, draft.target.map { $0.serializedBytes() }, draft.data.isEmpty ? nil : dataHolder.serializedBytes(),
            now, silenced, draft.eventID)
        try tx.execute(
            """
            DELETE FROM notifications WHERE recipient_id = ?1 AND id <= (
                SELECT id FROM notifications WHERE recipient_id = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2)
            """,
            recipient, Int64(maxKept))
        if !silenced {
            var n = Social_V1_Notification()
            n.notificationId = id
            n.kind = draft.kind
            n.title = draft.title
            n.body = draft.body
            if let actor = draft.actor { n.actor = actor }
            if let target = draft.target { n.target = target }
            n.data = draft.data
            n.createdAt = Google_Protobuf_Timestamp(milliseconds: now)
            out.live.append(.init(recipient: recipient, notification: n))
            if let plan = out.push {
                try PushQueue.enqueue(tx, recipient: recipient, notificationID: id, kind: draft.kind, now: now, plan: plan, out: &out)
            }
        }
        return id
    }

    static let columns = "id, kind, title, body, actor_id, actor_username, actor_display_name, target, data, created_at, read_at, silenced"

    static func notification(_ row: Row) throws -> Social_V1_Notification {
        var n = Social_V1_Notification()
        n.notificationId = try row.get("id")
        n.kind = Social_V1_NotificationKind(rawValue: Int32(clamping: try row.get("kind", as: Int64.self)))
        n.title = try row.get("title")
        n.body = try row.get("body")
        if let actorID = try row.get("actor_id", as: String?.self) {
            var a = Common_V1_UserRef()
            a.userId = actorID
            a.username = try row.get("actor_username", as: String?.self) ?? ""
            a.displayName = try row.get("actor_display_name", as: String?.self) ?? ""
            n.actor = a
        }
        if let target = try row.get("target", as: [UInt8]?.self) { n.target = try Social_V1_NotificationTarget(serializedBytes: target) }
        if let data = try row.get("data", as: [UInt8]?.self) { n.data = try Social_V1_Notification(serializedBytes: data).data }
        n.createdAt = Google_Protobuf_Timestamp(milliseconds: try row.get("created_at"))
        if let read = try row.get("read_at", as: Int64?.self) { n.readAt = Google_Protobuf_Timestamp(milliseconds: read) }
        n.silenced = try row.get("silenced")
        return n
    }

    static func unreadCount(_ db: some SQLReader, _ user: String) throws -> Int32 {
        Int32(
            clamping: try db.queryOne("SELECT count(*) FROM notifications WHERE recipient_id = ? AND read_at IS NULL", user)!.get(0, as: Int64.self))
    }

    static func settings(_ db: some SQLReader, _ user: String, now: Int64) throws -> Social_V1_NotificationSettings {
        var s = Social_V1_NotificationSettings()
        if let row = try db.queryOne("SELECT help_muted, snoozed_until FROM notification_settings WHERE user_id = ?", user) {
            s.helpMuted = try row.get("help_muted")
            if let until = try row.get("snoozed_until", as: Int64?.self), until > now {
                s.snoozedUntil = Google_Protobuf_Timestamp(milliseconds: until)
            }
        }
        s.push = PushQueue.message(try PushQueue.preferences(db, user))
        return s
    }
}
