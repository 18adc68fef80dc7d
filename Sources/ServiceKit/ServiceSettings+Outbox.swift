import Storage

extension ServiceSettings {
    /// The outbox's retry policy: `base` (the service's own, by default 1 s doubling up to 300 s)
    /// with `OUTBOX_RETRY_INITIAL_MS` (the first wait after a failed delivery) and
    /// `OUTBOX_RETRY_MAX_MS` (the longest) when set. After a long outage the next attempt can be
    /// up to the maximum away: a smaller one delivers the backlog sooner once the peer is back,
    /// for one attempt per maximum per destination while it is down. A malformed value refuses
    /// the start, naming the variable.
    public func outboxRetry(_ base: OutboxRetryPolicy = OutboxRetryPolicy()) throws -> OutboxRetryPolicy {
        var policy = base
        if let ms = try settings.int("outbox.retry.initial.ms", range: 1...86_400_000) { policy.initialDelay = .milliseconds(ms) }
        if let ms = try settings.int("outbox.retry.max.ms", range: 1...86_400_000) { policy.maximumDelay = .milliseconds(ms) }
        if policy.maximumDelay < policy.initialDelay { policy.initialDelay = policy.maximumDelay }
        return policy
    }
}
