import Contracts
import Foundation
import Logging
import Push
import Security
import ServiceKit
import Storage
import Synchronization

/// Sends the push outbox: one loop per configured provider, so a provider that is down or slow
/// holds up no other. Each loop keeps up to `concurrency` sends in flight, each row with its own
/// backoff (`retry`, or the provider's Retry-After); a failure of the provider itself (5xx, no
/// connection, our credentials refused) pauses that provider's loop instead of trying every
/// device. A row leaves the table when the provider accepted the push, refused it for good, the
/// target is gone (the target is removed too), or it went stale; at least once, so the
/// notification id is every provider's collapse key and a push resent after a crash between the
/// provider's answer and our write replaces itself on the device.
final class PushDelivery: Sendable {
    let providers: PushProviders
    let store: ServiceStore
    let clock: any WallClock
    let logger: Logger
    let concurrency: Int
    let retry: OutboxRetryPolicy
    let pollInterval: Duration
    private let wakes: [PushProviderKind: WakeSignal]

    init(
        providers: PushProviders, store: ServiceStore, clock: any WallClock, logger: Logger, concurrency: Int, retry: OutboxRetryPolicy,
        pollInterval: Duration = .seconds(5)
    ) {
        self.providers = providers
        self.store = store
        self.clock = clock
        self.logger = logger
        self.concurrency = max(1, concurrency)
        self.retry = retry
        self.pollInterval = pollInterval
        wakes = Dictionary(uniqueKeysWithValues: providers.all.keys.map { ($0, WakeSignal()) })
    }

    /// New rows were committed: every loop looks.
    func wake() {
        for w in wakes.values { w.signal() }
    }

    /// Until cancelled.
    func run() async {
        await withDiscardingTaskGroup { group in
            for (kind, provider) in providers.all {
                guard let wake = wakes[kind] else { continue }
                group.addTask { await self.run(provider, wake: wake) }
            }
        }
    }

    /// One due row with everything its send needs.
    struct Job: Sendable {
        var id: Int64
        var targetID: String
        /// The target's registration when claimed: a "gone" answer removes it only if it was not
        /// registered again meanwhile (new keys, another environment).
        var targetUpdatedAt: Int64 = 0
        var userID: String
        var kind: Social_V1_NotificationKind
        var attempts: Int
        var device: PushDevice?
        /// Nil when the row is to be dropped without a send (with why in `drop`).
        var message: PushMessage?
        var drop: String?
        /// Quiet hours: not now, at this time.
        var postponeTo: Int64?
    }

    private struct LoopState {
        var inFlight = Set<Int64>()
        var pausedUntil: Int64 = 0
        var providerFailures = 0
    }

    /// One provider loop's state, shared with its sends.
    private final class Loop: Sendable {
        let state = Mutex(LoopState())
    }

    private func run(_ provider: any PushProvider, wake: WakeSignal) async {
        let loop = Loop()
        await withDiscardingTaskGroup { group in
            while !Task.isCancelled {
                let now = clock.nowMilliseconds()
                var wait = pollInterval
                let (paused, busy) = loop.state.withLock { ($0.pausedUntil, $0.inFlight) }
                if paused > now {
                    wait = .milliseconds(paused - now)
                } else if busy.count < concurrency {
                    do {
                        let (jobs, nextDue) = try await claim(provider.kind, excluding: busy, limit: concurrency - busy.count, now: now)
                        loop.state.withLock { s in for j in jobs { s.inFlight.insert(j.id) } }
                        for job in jobs {
                            group.addTask {
                                await self.attempt(job, provider, loop: loop)
                                loop.state.withLock { _ = $0.inFlight.remove(job.id) }
                                wake.signal()
                            }
                        }
                        if let nextDue { wait = min(wait, .milliseconds(max(0, nextDue - now))) }
                    } catch {
                        if Task.isCancelled { break }
                        logger.error("push: cannot read the push outbox", metadata: ["provider": "\(provider.kind)", "error": "\(error)"])
                    }
                }
                await wake.wait(upTo: wait)
            }
        }
    }

    /// The due rows of `provider` not in flight (up to `limit`), and when the first row that is
    /// not due yet will be.
    func claim(_ provider: PushProviderKind, excluding busy: Set<Int64>, limit: Int, now: Int64) async throws -> (jobs: [Job], nextDue: Int64?) {
        try await store.read { c in
            var jobs: [Job] = []
            var nextDue: Int64?
            let rows = try c.query(
                "SELECT id, due_at FROM push_outbox INDEXED BY push_outbox_due WHERE provider = ? ORDER BY due_at, id LIMIT ?",
                provider.rawValue, limit + busy.count)
            var ids: [Int64] = []
            for row in rows {
                let id: Int64 = try row.get(0)
                if busy.contains(id) { continue }
                let due: Int64 = try row.get(1)
                if due > now {
                    nextDue = due
                    break
                }
                if ids.count < limit { ids.append(id) }
            }
            for id in ids { if let job = try Self.job(c, id: id, now: now) { jobs.append(job) } }
            return (jobs, nextDue)
        }
    }

    static func job(_ c: Connection, id: Int64, now: Int64) throws -> Job? {
        guard
            let row = try c.queryOne(
                """
                SELECT o.id, o.notification_id, o.target_id, o.user_id, o.kind, o.attempts, o.expires_at,
                       t.kind AS target_kind, t.updated_at AS target_updated_at, t.apns_device_token, t.apns_topic, t.apns_environment, t.fcm_registration_token,
                       t.web_push_endpoint, t.web_push_p256dh, t.web_push_auth,
                       n.title, n.body, n.data, n.read_at, n.id AS present
                FROM push_outbox o JOIN push_targets t ON t.target_id = o.target_id
                LEFT JOIN notifications n ON n.id = o.notification_id
                WHERE o.id = ?
                """, id)
        else { return nil }
        let kind = Social_V1_NotificationKind(rawValue: Int32(clamping: try row.get("kind", as: Int64.self)))
        var job = Job(
            id: id, targetID: try row.get("target_id"), userID: try row.get("user_id"), kind: kind, attempts: try row.get("attempts"))
        job.targetUpdatedAt = try row.get("target_updated_at")
        let expiresAt: Int64 = try row.get("expires_at")
        if try row.get("present", as: String?.self) == nil {
            job.drop = "the notification is no longer in the inbox"
            return job
        }
        if try row.get("read_at", as: Int64?.self) != nil {
            job.drop = "read before its push left"
            return job
        }
        if now >= expiresAt {
            job.drop = "stale: not sent within its lifetime"
            return job
        }
        let prefs = try PushQueue.preferences(c, job.userID)
        if prefs.disabled.contains(Int32(kind.rawValue)) {
            job.drop = "the user turned this kind off"
            return job
        }
        if let quiet = prefs.quiet, let until = PushPreferenceRules.quietUntil(quiet, now: now) {
            if PushPreferenceRules.isShortLived(kind) {
                job.drop = "quiet hours (a short-lived kind)"
            } else {
                job.postponeTo = until
            }
            return job
        }
        switch try row.get("target_kind", as: Int.self) {
        case PushProviderKind.apns.rawValue:
            job.device = .apns(
                deviceToken: try row.get("apns_device_token", as: String?.self) ?? "", topic: try row.get("apns_topic", as: String?.self) ?? "",
                sandbox: try row.get("apns_environment", as: Int?.self) == Int(Social_V1_ApnsEnvironment.sandbox.rawValue))
        case PushProviderKind.fcm.rawValue:
            job.device = .fcm(registrationToken: try row.get("fcm_registration_token", as: String?.self) ?? "")
        default:
            job.device = .webPush(
                endpoint: try row.get("web_push_endpoint", as: String?.self) ?? "",
                p256dh: Base64URL.decode(try row.get("web_push_p256dh", as: String?.self) ?? "") ?? [],
                auth: Base64URL.decode(try row.get("web_push_auth", as: String?.self) ?? "") ?? [])
        }
        var data: [String: String] = [:]
        if let bytes = try row.get("data", as: [UInt8]?.self) { data = (try? Social_V1_Notification(serializedBytes: bytes).data) ?? [:] }
        let unread =
            try c.queryOne("SELECT count(*) FROM notifications WHERE recipient_id = ? AND read_at IS NULL", job.userID)?.get(0, as: Int64.self) ?? 0
        job.message = PushMessage(
            notificationID: try row.get("notification_id"), kind: kind.contractName, title: try row.get("title") ?? "",
            body: try row.get("body") ?? "", badge: Int(clamping: unread), data: data, expiresAt: expiresAt / 1000,
            urgent: true)
        return job
    }

    private func attempt(_ job: Job, _ provider: any PushProvider, loop: Loop) async {
        let now = clock.nowMilliseconds()
        let id = job.id
        do {
            if let drop = job.drop {
                logger.debug("push dropped", metadata: ["target": "\(job.targetID)", "why": "\(drop)"])
                try await store.write { tx in try tx.execute("DELETE FROM push_outbox WHERE id = ?", id) }
                return
            }
            if let until = job.postponeTo {
                try await store.write { tx in try tx.execute("UPDATE push_outbox SET due_at = ? WHERE id = ?", until, id) }
                return
            }
            guard let message = job.message, let device = job.device else { return }
            let outcome = await provider.send(message, to: device)
            if Task.isCancelled { return }  // shutting down: the row stays and is sent after the restart
            // A send can take the whole request timeout: pauses and backoffs count from its end.
            let answered = clock.nowMilliseconds()
            let target = job.targetID, registered = job.targetUpdatedAt
            if case .retry(_, _, true) = outcome {} else { loop.state.withLock { $0.providerFailures = 0 } }
            switch outcome {
            case .delivered:
                try await store.write { tx in try tx.execute("DELETE FROM push_outbox WHERE id = ?", id) }
            case .gone(let why):
                logger.info(
                    "push target removed: the provider says it is gone",
                    metadata: ["target": "\(target)", "provider": "\(provider.kind)", "answer": "\(why)"])
                try await store.write { tx in
                    try tx.execute("DELETE FROM push_targets WHERE target_id = ? AND updated_at = ?", target, registered)
                }
            case .refused(let why):
                logger.warning(
                    "push refused by the provider; dropped", metadata: ["target": "\(target)", "provider": "\(provider.kind)", "answer": "\(why)"])
                try await store.write { tx in try tx.execute("DELETE FROM push_outbox WHERE id = ?", id) }
            case .retry(let why, let after, let providerWide):
                let attempts = job.attempts + 1
                let delay = after?.milliseconds ?? retry.delay(afterAttempt: attempts).milliseconds
                if providerWide {
                    // Sends in flight together fail together: one failure per pause, so a burst of them
                    // does not escalate the pause to its maximum at once.
                    let pause = loop.state.withLock { s -> Int64 in
                        guard now >= s.pausedUntil else { return s.pausedUntil - answered }
                        s.providerFailures += 1
                        let p = after?.milliseconds ?? retry.delay(afterAttempt: s.providerFailures).milliseconds
                        s.pausedUntil = answered + p
                        return p
                    }
                    logger.warning(
                        "push provider failing; paused", metadata: ["provider": "\(provider.kind)", "answer": "\(why)", "pause_ms": "\(pause)"])
                } else {
                    logger.info(
                        "push will be retried",
                        metadata: ["target": "\(target)", "provider": "\(provider.kind)", "answer": "\(why)", "retry_in_ms": "\(delay)"])
                }
                let next = answered + delay
                let error = String(why.prefix(500))
                try await store.write { tx in
                    try tx.execute("UPDATE push_outbox SET attempts = ?, due_at = ?, last_error = ? WHERE id = ?", attempts, next, error, id)
                }
            }
        } catch {
            if Task.isCancelled { return }
            logger.error("push: cannot record an attempt", metadata: ["target": "\(job.targetID)", "error": "\(error)"])
        }
    }
}

extension Duration {
    fileprivate var milliseconds: Int64 {
        components.seconds * 1000 + components.attoseconds / 1_000_000_000_000_000
    }
}

extension Social_V1_NotificationKind {
    /// The enum value's contract name without its prefix (`TASK_REMINDER`): what apps switch on.
    var contractName: String {
        guard let full = protoName else { return String(rawValue) }
        return full.hasPrefix("NOTIFICATION_KIND_") ? String(full.dropFirst("NOTIFICATION_KIND_".count)) : full
    }
}
