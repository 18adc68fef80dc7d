import Foundation
import ServiceKit

/// The tasks service's choices that are not rules of the contracts (Sources/Tasks/README.md,
/// "Settings"). The executable reads them from flags and the environment (`TASKS_*`); tests
/// shorten durations.
public struct TasksConfiguration: Sendable {
    /// The data directory: `tasks.sqlite` (one database for every area).
    public var dataDirectory: String

    /// Deadline of a synchronous read of a peer (accounts' names, social's memberships and teams).
    /// Past it the call is answered without the peer (UNAVAILABLE, or cached names).
    public var peerDeadline: Duration = .milliseconds(1500)
    /// A user's cached name is asked again from accounts after this long.
    public var userRefreshAfter: Duration = .seconds(15 * 60)

    /// Largest attachment (the contract's 5 MiB).
    public var maxAttachmentBytes = 5 * 1024 * 1024
    /// Attachments per task (the contract's 20).
    public var maxAttachmentsPerTask = 20
    /// Upload tokens last this long (the contract's 24 h).
    public var uploadTokenLifetime: Duration = .seconds(24 * 3600)
    /// Unexpired upload tokens one user may hold (all tasks together): each is a stored row.
    public var maxLiveUploadTokensPerUser = 50
    /// Expired upload tokens are kept this long so the page can say "expired" instead of "unknown".
    public var expiredUploadTokensKeptFor: Duration = .seconds(7 * 24 * 3600)
    /// Wrong upload tokens per client address per 15 minutes before RESOURCE_EXHAUSTED.
    public var maxBadUploadTokensPerAddress = 30

    /// One reminder per chore per this long (the contract's hour).
    public var reminderInterval: Duration = .seconds(3600)
    /// Automatic reminders: how often the scanner looks at the flag a write raises when it moved a
    /// pending reminder (a look costs nothing; the database is read only when raised, at the
    /// earliest pending instant, or every `reminderPoll`).
    public var reminderTick: Duration = .milliseconds(250)
    /// The scanner reads the earliest pending instant again at least this often (a clock that
    /// jumped, a database restored under it).
    public var reminderPoll: Duration = .seconds(60)
    /// Due reminders fired per transaction.
    public var reminderBatch = 200

    /// A finish without `expected_revision` that arrives this soon after another member finished
    /// the same chore is taken for the same turn (two members at once) and changes nothing.
    public var duplicateFinishWindow: Duration = .seconds(60)

    /// Whether SearchMarketTasks uses its indexes (FTS5 for words, R*Tree for places). Off, it
    /// scans every open task: the reference the tests and the bench compare the indexes with.
    public var searchUsesIndexes = true
    /// How many followed users a habit feed asks social for (pages of 500).
    public var maxFollowedUsers = 5000

    /// The largest request message the process accepts: an attachment upload (the contract's
    /// 5 MiB + 16 KiB for UploadTeamTaskAttachment) with room for its framing; each method's own
    /// limit from the contracts applies below it.
    public var maxRequestBytes = 6 * 1024 * 1024

    public init(dataDirectory: String) { self.dataDirectory = dataDirectory }

    /// Reads the settings named in the README (`TASKS_PEER_DEADLINE_MS`, …); a malformed value
    /// refuses the start, naming the variable.
    public static func from(_ s: Settings, dataDirectory: String) throws -> TasksConfiguration {
        var c = TasksConfiguration(dataDirectory: dataDirectory)
        c.peerDeadline = try s.milliseconds("tasks.peer.deadline.ms", default: c.peerDeadline, range: 50...60_000)
        c.uploadTokenLifetime = try s.seconds("tasks.upload.token.lifetime.seconds", range: 1...(30 * 24 * 3600)) ?? c.uploadTokenLifetime
        c.maxLiveUploadTokensPerUser = try s.int("tasks.upload.tokens.per.user", default: c.maxLiveUploadTokensPerUser, range: 1...100_000)
        c.maxBadUploadTokensPerAddress = try s.int("tasks.bad.upload.tokens.per.address", default: c.maxBadUploadTokensPerAddress, range: 1...100_000)
        c.searchUsesIndexes = try s.bool("tasks.search.indexes", default: true)
        return c
    }
}
