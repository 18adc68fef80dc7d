import Push
import ServiceKit
import Storage

/// Everything about the social service that is a choice rather than a rule of the contract:
/// limits, lifetimes, throttles, deadlines. The executable fills it from flags and environment
/// variables (`from(_:dataDirectory:)`, names in Sources/Social/README.md); tests shorten it.
public struct SocialConfiguration: Sendable {
    /// Notifications kept per inbox: past it, the oldest are deleted as new ones arrive, so no
    /// sender can make an inbox grow without bound.
    public static let notificationsKept = 1000

    /// The data directory: the database.
    public var dataDirectory: String

    /// Invite codes stop working this long after they are made (the contract: 7 days).
    public var inviteLifetime: Duration = .seconds(7 * 24 * 3600)
    /// Failed invite-code guesses (unknown codes) per caller within `guessWindow`.
    public var maxGuessesPerUser = 10
    /// Failed invite-code guesses per client address within `guessWindow`.
    public var maxGuessesPerAddress = 30
    public var guessWindow: Duration = .seconds(15 * 60)
    /// Pending (unused, unexpired) invites per household: mail bombing through one household.
    public var maxPendingInvitesPerHousehold = 50
    /// Invite mails one user may cause within `inviteMailWindow` (all households together): a
    /// re-invite revokes the earlier code, so the pending limit alone never stops a mail loop.
    public var maxInviteMailsPerUser = 50
    /// Invite mails one address may receive within `inviteMailWindow`, whoever sends them.
    public var maxInviteMailsPerAddress = 5
    public var inviteMailWindow: Duration = .seconds(24 * 3600)
    /// Households one user may belong to at once.
    public var maxHouseholdsPerUser = 20
    /// Members of one household (the contract: 1..30).
    public var maxHouseholdMembers = 30
    /// Members of one team (the contract: 1..20).
    public var maxTeamMembers = 20
    /// Push targets one user holds (the contract: 10); registering one more removes the user's
    /// least recently registered ones.
    public var maxPushTargetsPerUser = 10

    /// Live notification streams one user may hold at once; a new one past it closes the oldest.
    public var maxSubscriptionsPerUser = 5
    /// Notifications waiting to be written to one live stream; a client that lets more pile up is
    /// cut off (RESOURCE_EXHAUSTED) and reconnects with after_notification_id, missing nothing.
    public var maxQueuedPerSubscription = 256

    /// How often the sessions of live streams are checked with accounts: a revoked session's
    /// stream ends within about this long (else only when its access token expires).
    public var sessionCheckInterval: Duration = .seconds(30)

    /// Deadline of a synchronous read of a peer (accounts' lookups, tasks' chores).
    public var peerDeadline: Duration = .milliseconds(1500)

    /// Push providers and their credentials (none: nothing is pushed).
    public var push = PushSettings()
    /// Whether a user with a live notification stream open also gets pushes (the default: yes,
    /// the stream may be a browser tab while the phone is in a pocket).
    public var pushWhileStreaming = true
    /// Sends in flight per provider.
    public var pushConcurrency = 32
    /// A device's backoff after a failed send the provider gave no Retry-After for.
    public var pushRetry = OutboxRetryPolicy(initialDelay: .seconds(2), maximumDelay: .seconds(3600))

    public init(dataDirectory: String) { self.dataDirectory = dataDirectory }

    /// Reads the optional settings: `SOCIAL_INVITE_LIFETIME_HOURS`, `SOCIAL_GUESSES_PER_USER`,
    /// `SOCIAL_GUESSES_PER_ADDRESS`, `SOCIAL_INVITE_MAILS_PER_USER`, `SOCIAL_INVITE_MAILS_PER_ADDRESS`,
    /// `SOCIAL_SUBSCRIPTIONS_PER_USER`, `SOCIAL_PEER_DEADLINE_MS`,
    /// `SOCIAL_QUEUED_PER_SUBSCRIPTION`, `SOCIAL_SESSION_CHECK_MS`. A malformed value refuses the start.
    public static func from(_ settings: Settings, dataDirectory: String) throws -> SocialConfiguration {
        var c = SocialConfiguration(dataDirectory: dataDirectory)
        if let hours = try settings.int("social.invite.lifetime.hours", range: 1...24 * 365) {
            c.inviteLifetime = .seconds(Int64(hours) * 3600)
        }
        c.maxGuessesPerUser = try settings.int("social.guesses.per.user", default: c.maxGuessesPerUser, range: 1...1_000_000)
        c.maxGuessesPerAddress = try settings.int("social.guesses.per.address", default: c.maxGuessesPerAddress, range: 1...1_000_000)
        c.maxInviteMailsPerUser = try settings.int("social.invite.mails.per.user", default: c.maxInviteMailsPerUser, range: 1...1_000_000)
        c.maxInviteMailsPerAddress = try settings.int(
            "social.invite.mails.per.address", default: c.maxInviteMailsPerAddress, range: 1...1_000_000)
        c.maxSubscriptionsPerUser = try settings.int("social.subscriptions.per.user", default: c.maxSubscriptionsPerUser, range: 1...1000)
        c.maxQueuedPerSubscription = try settings.int(
            "social.queued.per.subscription", default: c.maxQueuedPerSubscription,
            range: 1...100_000)
        c.sessionCheckInterval = try settings.milliseconds(
            "social.session.check.ms", default: c.sessionCheckInterval, range: 100...3_600_000)
        c.peerDeadline = try settings.milliseconds("social.peer.deadline.ms", default: c.peerDeadline, range: 50...60_000)
        c.push = try pushSettings(settings)
        c.pushWhileStreaming = try settings.bool("social.push.while.streaming", default: c.pushWhileStreaming)
        c.pushConcurrency = try settings.int("social.push.concurrency", default: c.pushConcurrency, range: 1...1000)
        return c
    }

    /// The providers' settings (Sources/Social/README.md, "Push"): a provider is on when its
    /// credentials are named; a partial set refuses the start naming what is missing.
    static func pushSettings(_ settings: Settings) throws -> PushSettings {
        var p = PushSettings()
        func all(_ keys: [String]) throws -> [String]? {
            let values = keys.map { settings.string($0) }
            if values.allSatisfy({ $0 == nil }) { return nil }
            let missing = zip(keys, values).filter { $0.1 == nil }.map { Settings.variable($0.0) }
            guard missing.isEmpty else {
                throw SettingsError(
                    "\(keys.map(Settings.variable).joined(separator: ", ")) go together: \(missing.joined(separator: ", ")) missing (set all or none)"
                )
            }
            return values.compactMap { $0 }
        }
        if let v = try all(["push.apns.key.file", "push.apns.key.id", "push.apns.team.id"]) {
            var a = PushSettings.APNs(keyFile: v[0], keyID: v[1], teamID: v[2])
            a.productionURL = settings.string("push.apns.url", default: a.productionURL)
            a.sandboxURL = settings.string("push.apns.sandbox.url", default: a.sandboxURL)
            p.apns = a
        }
        if let v = try all(["push.fcm.service.account.file"]) {
            var f = PushSettings.FCM(serviceAccountFile: v[0])
            f.baseURL = settings.string("push.fcm.url", default: f.baseURL)
            p.fcm = f
        }
        if let v = try all(["push.vapid.key.file", "push.vapid.subject"]) {
            p.webPush = PushSettings.WebPush(vapidKeyFile: v[0], subject: v[1])
        }
        p.trustRootsFile = settings.string("push.tls.ca")
        p.allowPrivateEndpoints = try settings.bool("push.allow.private.endpoints", default: false)
        p.requestTimeout = try settings.milliseconds("push.timeout.ms", default: p.requestTimeout, range: 100...120_000)
        return p
    }
}
