import Contracts
import Foundation
import GRPCContracts
import Push
import ServiceKit
import Storage

/// What a write needs to queue pushes; nil in `Outbound` when no provider is configured.
struct PushPlan: Sendable {
    /// The configured providers (`push_targets.kind` values): targets of others wait for nothing.
    var providers: [Int]
    /// True when a user with a live stream open gets no push (SOCIAL_PUSH_WHILE_STREAMING=off).
    var isStreaming: (@Sendable (String) -> Bool)?
}

/// The push outbox: a row per (notification, target) in the notification's transaction, and the
/// push preferences that decide which rows are written and when they are due.
enum PushQueue {
    struct Preferences: Sendable {
        var disabled: [Int32] = []
        var quiet: PushPreferenceRules.QuietHours?
    }

    /// Queues one push per target of `recipient` for a notification just stored unsilenced,
    /// unless the kind is turned off, or quiet hours drop it (short-lived kinds) or delay it.
    static func enqueue(
        _ tx: Transaction, recipient: String, notificationID: String, kind: Social_V1_NotificationKind, now: Int64, plan: PushPlan,
        out: inout Outbound
    ) throws {
        if let streaming = plan.isStreaming, streaming(recipient) { return }
        let prefs = try preferences(tx, recipient)
        let kindValue = Int32(kind.rawValue)
        if prefs.disabled.contains(kindValue) { return }
        var due = now
        if let quiet = prefs.quiet, let until = PushPreferenceRules.quietUntil(quiet, now: now) {
            if PushPreferenceRules.isShortLived(kind) { return }
            due = until
        }
        let providers = plan.providers.map(String.init).joined(separator: ",")
        try tx.execute(
            """
            INSERT OR IGNORE INTO push_outbox (notification_id, target_id, user_id, provider, kind, created_at, due_at, expires_at)
            SELECT ?, target_id, user_id, kind, ?, ?, ?, ? FROM push_targets WHERE user_id = ? AND kind IN (\(providers))
            """,
            notificationID, Int64(kindValue), now, due, now + PushPreferenceRules.lifetime(kind), recipient)
        if tx.changes > 0 { out.pushQueued = true }
    }

    static func preferences(_ db: some SQLReader, _ user: String) throws -> Preferences {
        guard
            let row = try db.queryOne(
                "SELECT push_disabled_kinds, quiet_start, quiet_end, quiet_zone FROM notification_settings WHERE user_id = ?", user)
        else { return Preferences() }
        var p = Preferences(disabled: PushPreferenceRules.decode(try row.get("push_disabled_kinds", as: String?.self)))
        if let start = try row.get("quiet_start", as: Int?.self), let end = try row.get("quiet_end", as: Int?.self),
            let name = try row.get("quiet_zone", as: String?.self), let zone = PushPreferenceRules.zone(named: name)
        {
            p.quiet = .init(start: start, end: end, zone: zone, zoneName: name)
        }
        return p
    }

    /// The contract form of the stored preferences.
    static func message(_ p: Preferences) -> Social_V1_PushPreferences {
        var m = Social_V1_PushPreferences()
        m.disabledKinds = p.disabled.map { Social_V1_NotificationKind(rawValue: $0) }
        if let q = p.quiet {
            var h = Social_V1_QuietHours()
            h.startMinute = Int32(q.start)
            h.endMinute = Int32(q.end)
            h.timeZone = q.zoneName
            m.quietHours = h
        }
        return m
    }

    static func save(_ tx: Transaction, user: String, disabled: [Int32], quiet: PushPreferenceRules.QuietHours?) throws {
        try tx.execute(
            """
            INSERT INTO notification_settings (user_id, push_disabled_kinds, quiet_start, quiet_end, quiet_zone) VALUES (?, ?, ?, ?, ?)
            ON CONFLICT(user_id) DO UPDATE SET push_disabled_kinds = excluded.push_disabled_kinds, quiet_start = excluded.quiet_start,
                quiet_end = excluded.quiet_end, quiet_zone = excluded.quiet_zone
            """,
            user, PushPreferenceRules.encode(disabled), quiet?.start, quiet?.end, quiet?.zoneName)
    }
}
