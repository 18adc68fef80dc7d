import Foundation
import Security
import ServiceKit

/// Everything about the accounts service that is a choice rather than a rule of the contract: token
/// lifetimes, throttling windows, the password cost, the mail sink. The executable fills it from
/// flags and environment variables (`fromEnvironment`); tests shorten the durations and lower the
/// scrypt cost.
public struct AccountsConfiguration: Sendable {
    /// The data directory: database, signing key, Maildir.
    public var dataDirectory: String
    /// Password hashing cost (scrypt N/r/p). Default: N=2^15, r=8, p=1 (32 MiB, tens of ms).
    public var passwordParameters: PasswordHasher.Parameters = .default
    /// Access token lifetime (15 minutes).
    public var accessTokenLifetime: Duration = .seconds(15 * 60)
    /// Refresh token lifetime; every rotation starts a new period (30 days).
    public var refreshTokenLifetime: Duration = .seconds(30 * 24 * 3600)
    /// Password reset token lifetime (30 minutes).
    public var resetTokenLifetime: Duration = .seconds(30 * 60)
    /// A signing key older than this is replaced (the old one is still published until every token
    /// it signed has expired). Nil: never rotate automatically.
    public var signingKeyMaxAge: Duration? = .seconds(90 * 24 * 3600)
    /// How long verifiers may cache GetSigningKeys.
    public var signingKeysCacheFor: Duration = .seconds(300)

    /// Failed logins (or wrong current passwords) per account within `failureWindow`.
    public var maxFailuresPerAccount = 5
    /// Failed logins per client address within `failureWindow`.
    public var maxFailuresPerAddress = 20
    /// The sliding window of the failure counters.
    public var failureWindow: Duration = .seconds(15 * 60)
    /// Password reset requests per client address within `resetRequestWindow`.
    public var maxResetRequestsPerAddress = 10
    /// Password reset requests per email address within `resetRequestWindow` (mail bombing).
    public var maxResetRequestsPerEmail = 3
    public var resetRequestWindow: Duration = .seconds(15 * 60)

    /// Sign-ups per client address within `signUpWindow` (a flood from one address would fill the
    /// hashing queue; a household or an office signs up far fewer).
    public var maxSignUpsPerAddress = 100
    /// Guest accounts made per client address within `signUpWindow`.
    public var maxGuestsPerAddress = 100
    public var signUpWindow: Duration = .seconds(3600)

    /// Password hashing threads (scrypt: CPU and 128·r·N bytes of memory each).
    public var hashingThreads = max(1, min(2, ProcessInfo.processInfo.activeProcessorCount))
    /// Password checks that may wait for a hashing thread; past it a call is refused at once
    /// (UNAVAILABLE, retry in a second) instead of waiting behind a burst: with 2 threads at
    /// ~50 ms per hash, 32 waiting is under a second of wait.
    public var maxQueuedHashes = 32

    /// Largest accepted avatar image (1 MiB).
    public var maxAvatarBytes = 1 << 20

    /// The largest request message the server should accept: an avatar upload plus room for its
    /// framing. Anything larger is refused by the transport (RESOURCE_EXHAUSTED) before it is read;
    /// each method's own limit from the contracts (`(common.v1.max_request_bytes)`) applies below
    /// it. No window needs sizing for it: the transport releases a message's bytes to flow control
    /// as they arrive (docs/architecture.md, "Flow control is backpressure").
    public var maxRequestBytes: Int { maxAvatarBytes + 64 * 1024 }

    /// Where mail goes: a Maildir under the data directory, or SMTP.
    public var mail: MailConfiguration

    /// The `From:` of every mail.
    public var mailFrom = "ChoreMate <no-reply@accounts.invalid>"

    public init(dataDirectory: String) {
        self.dataDirectory = dataDirectory
        self.mail = .maildir(path: dataDirectory + "/mail")
    }

    /// Reads the optional settings (names in Sources/Accounts/README.md): `ACCOUNTS_SCRYPT_N`,
    /// `_R`, `_P`, `ACCOUNTS_SIGNING_KEY_MAX_AGE_DAYS`, `ACCOUNTS_SIGNUPS_PER_ADDRESS`,
    /// `ACCOUNTS_GUESTS_PER_ADDRESS`, `ACCOUNTS_HASHING_QUEUE`, `SMTP_HOST`, `SMTP_PORT`,
    /// `SMTP_HELO`, `MAIL_FROM`, `ACCOUNTS_MAILDIR`. A malformed value refuses the start.
    public static func fromEnvironment(
        dataDirectory: String, _ env: [String: String] = ProcessInfo.processInfo.environment
    ) throws -> AccountsConfiguration {
        try from(Settings(environment: env), dataDirectory: dataDirectory)
    }

    public static func from(_ settings: Settings, dataDirectory: String) throws -> AccountsConfiguration {
        var c = AccountsConfiguration(dataDirectory: dataDirectory)
        var p = c.passwordParameters
        if let n = try settings.int("accounts.scrypt.n", range: 0...Int(Int32.max)) { p.n = UInt64(n) }
        if let r = try settings.int("accounts.scrypt.r", range: 0...Int(Int32.max)) { p.r = UInt32(r) }
        if let pp = try settings.int("accounts.scrypt.p", range: 0...Int(Int32.max)) { p.p = UInt32(pp) }
        do { c.passwordParameters = try PasswordHasher(parameters: p).parameters } catch {
            throw ConfigurationError("scrypt parameters: \(error)")
        }
        if let days = try settings.int("accounts.signing.key.max.age.days", range: 0...36500) {
            c.signingKeyMaxAge = days > 0 ? .seconds(Int64(days) * 24 * 3600) : nil
        }
        c.maxSignUpsPerAddress = try settings.int("accounts.signups.per.address", default: c.maxSignUpsPerAddress, range: 1...1_000_000)
        c.maxGuestsPerAddress = try settings.int("accounts.guests.per.address", default: c.maxGuestsPerAddress, range: 1...1_000_000)
        c.maxQueuedHashes = try settings.int("accounts.hashing.queue", default: c.maxQueuedHashes, range: 0...100_000)
        if let from = settings.string("mail.from") { c.mailFrom = from }
        if let dir = settings.string("accounts.maildir") { c.mail = .maildir(path: dir) }
        if let host = settings.string("smtp.host") {
            let port = try settings.int("smtp.port", default: 25, range: 1...65535)
            c.mail = .smtp(host: host, port: port, helo: settings.string("smtp.helo", default: "accounts.local"))
        }
        return c
    }
}

public struct ConfigurationError: Error, CustomStringConvertible {
    public let description: String
    init(_ d: String) { description = d }
}

/// Where mails are delivered.
public enum MailConfiguration: Sendable, Equatable {
    /// Written as files into a Maildir (`<path>/{tmp,new,cur}`); ListSentMail reads them back.
    case maildir(path: String)
    /// Sent to an SMTP relay, plain SMTP without TLS or AUTH (a local relay, e.g. a sidecar).
    case smtp(host: String, port: Int, helo: String)
}
