import Foundation
import ServiceKit

/// What the finance service chose rather than the contract: how long it waits for its peers and
/// how long it keeps display names. Filled from flags and environment (`from(_:dataDirectory:)`);
/// tests shorten them.
public struct FinanceConfiguration: Sendable {
    /// The data directory (finance.sqlite).
    public var dataDirectory: String
    /// Deadline of the synchronous membership read from social (`CheckHouseholdMembership`):
    /// past it the request is answered UNAVAILABLE and nothing is recorded.
    public var membershipTimeout: Duration = .milliseconds(1500)
    /// Deadline of the display-name read from accounts (`GetUsersByIds`): past it balances are
    /// answered with ids only (the degraded form) rather than failing.
    public var namesTimeout: Duration = .milliseconds(1000)
    /// How long a display name is reused before it is read again.
    public var namesCacheFor: Duration = .seconds(60)

    public init(dataDirectory: String) { self.dataDirectory = dataDirectory }

    /// Reads `FINANCE_MEMBERSHIP_TIMEOUT_MS`, `FINANCE_NAMES_TIMEOUT_MS`,
    /// `FINANCE_NAMES_CACHE_SECONDS`; a malformed value refuses the start.
    public static func from(_ settings: Settings, dataDirectory: String) throws -> FinanceConfiguration {
        var c = FinanceConfiguration(dataDirectory: dataDirectory)
        c.membershipTimeout = try settings.milliseconds("finance.membership.timeout.ms", default: c.membershipTimeout, range: 50...60_000)
        c.namesTimeout = try settings.milliseconds("finance.names.timeout.ms", default: c.namesTimeout, range: 50...60_000)
        c.namesCacheFor = .seconds(try settings.int("finance.names.cache.seconds", default: 60, range: 0...86_400))
        return c
    }
}
