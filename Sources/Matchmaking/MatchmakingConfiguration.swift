import Foundation
import ServiceKit

/// Everything about matchmaking that is a choice rather than a rule of the contract, and the
/// contract's own numbers in one place so tests can read them. The executable fills it from
/// settings (`from(_:dataDirectory:)`, names in Sources/Matchmaking/README.md).
public struct MatchmakingConfiguration: Sendable {
    public var dataDirectory: String

    // The contract's numbers.
    /// Turn deadline of non-local matches (60 s).
    public var turnTimeout: Duration = .seconds(60)
    /// A pending challenge expires after this (10 minutes).
    public var challengeLifetime: Duration = .seconds(600)
    /// Rematch window after a match ends (2 minutes).
    public var rematchWindow: Duration = .seconds(120)
    /// A queue ticket expires after this without an opponent (5 minutes).
    public var queueLifetime: Duration = .seconds(300)
    /// Queue status at least this often (5 s).
    public var queueStatusEvery: Duration = .seconds(5)
    /// Chat: at most `chatLimit` messages per `chatWindow` per player and match (5 per 10 s).
    public var chatLimit = 5
    public var chatWindow: Duration = .seconds(10)

    // Choices.
    /// Deadline of synchronous reads of social and accounts.
    public var peerDeadline: Duration = .milliseconds(1500)
    /// How long a relationship answer from social is trusted by the queue (a block made meanwhile
    /// stops pairings after at most this long). Challenges and chat always ask afresh (chat falls
    /// back to the last answer known while social is down).
    public var relationshipCacheFor: Duration = .seconds(30)
    /// How often the upkeep loop looks at deadlines, expiries, rematch windows and the queue.
    public var tick: Duration = .milliseconds(200)
    /// Queue pairing: candidates per ticket on the higher-rating side (see QueuePairing).
    public var pairingNeighbors = 8
    /// Live streams: at most this many open WatchMatch streams per user (the oldest is closed).
    public var maxWatchStreamsPerUser = 16
    /// Live streams: events queued for a slow watcher before it is cut off (it resumes with
    /// after_sequence and misses nothing).
    public var maxQueuedEvents = 256
    /// Finished matches keep their event log this long (then a watcher gets a snapshot).
    public var keepEventsFor: Duration = .seconds(7 * 24 * 3600)

    public init(dataDirectory: String) { self.dataDirectory = dataDirectory }

    /// Reads `MATCHMAKING_TURN_TIMEOUT_MS`, `MATCHMAKING_PEER_DEADLINE_MS`,
    /// `MATCHMAKING_RELATIONSHIP_CACHE_MS`, `MATCHMAKING_TICK_MS`, `MATCHMAKING_PAIRING_NEIGHBORS`,
    /// `MATCHMAKING_MAX_WATCH_STREAMS_PER_USER`, `MATCHMAKING_CHAT_LIMIT`. A malformed value refuses the start.
    public static func from(_ settings: Settings, dataDirectory: String) throws -> MatchmakingConfiguration {
        var c = MatchmakingConfiguration(dataDirectory: dataDirectory)
        c.turnTimeout = try settings.milliseconds("matchmaking.turn.timeout.ms", default: c.turnTimeout, range: 1000...86_400_000)
        c.peerDeadline = try settings.milliseconds("matchmaking.peer.deadline.ms", default: c.peerDeadline, range: 50...60_000)
        c.relationshipCacheFor = try settings.milliseconds(
            "matchmaking.relationship.cache.ms", default: c.relationshipCacheFor, range: 0...3_600_000)
        c.tick = try settings.milliseconds("matchmaking.tick.ms", default: c.tick, range: 10...10_000)
        c.pairingNeighbors = try settings.int("matchmaking.pairing.neighbors", default: c.pairingNeighbors, range: 1...1000)
        c.maxWatchStreamsPerUser = try settings.int(
            "matchmaking.max.watch.streams.per.user", default: c.maxWatchStreamsPerUser, range: 1...1000)
        c.chatLimit = try settings.int("matchmaking.chat.limit", default: c.chatLimit, range: 1...1000)
        return c
    }
}
