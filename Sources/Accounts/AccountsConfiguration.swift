import Foundation
import Security

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

    /// Largest accepted avatar image (1 MiB).
    public var maxAvatarBytes = 1 << 20

    /// The largest request message the server should accept: an avatar upload plus room for its
    /// framing. Anything larger is refused by the transport (RESOURCE_EXHAUSTED) before it is read.
    public var maxRequestBytes: Int { maxAvatarBytes + 64 * 1024 }

    /// The HTTP/2 stream window the server should announce: larger than any accepted request.
    /// (The transport opens the window per complete message, so a message larger than the window
    /// could never arrive; see the README.)
    public var streamWindowBytes: Int { max(1 << 20, maxRequestBytes * 2) }

    /// Where mail goes: a Maildir under the data directory, or SMTP.
    public var mail: MailConfiguration

    /// The `From:` of every mail.
    public var mailFrom = "ChoreMate <no-reply@accounts.invalid>"

    public init(dataDirectory: String) {
        self.dataDirectory = dataDirectory
        self.mail = .maildir(path: dataDirectory + "/mail")
    }

    /// Reads the optional environment variables (names in Sources/Accounts/README.md):
    /// `ACCOUNTS_SCRYPT_N`, `ACCOUNTS_SCRYPT_R`, `ACCOUNTS_SCRYPT_P`, `ACCOUNTS_SIGNING_KEY_MAX_AGE_DAYS`,
    /// `SMTP_HOST`, `SMTP_PORT`, `SMTP_HELO`, `MAIL_FROM`, `ACCOUNTS_MAILDIR`.
    public static func fromEnvironment(dataDirectory: String, _ env: [String: String] = ProcessInfo.processInfo.environment) throws -> AccountsConfiguration {
        var c = AccountsConfiguration(dataDirectory: dataDirectory)
        func int(_ name: String) throws -> Int? {
            guard let v = env[name], !v.isEmpty else { return nil }
            guard let n = Int(v) else { throw ConfigurationError("\(name) must be an integer, got \(v)") }
            return n
        }
        var p = c.passwordParameters
        if let n = try int("ACCOUNTS_SCRYPT_N") { p.n = UInt64(max(0, n)) }
        if let r = try int("ACCOUNTS_SCRYPT_R") { p.r = UInt32(clamping: max(0, r)) }
        if let pp = try int("ACCOUNTS_SCRYPT_P") { p.p = UInt32(clamping: max(0, pp)) }
        do { c.passwordParameters = try PasswordHasher(parameters: p).parameters } catch {
            throw ConfigurationError("scrypt parameters: \(error)")
        }
        if let days = try int("ACCOUNTS_SIGNING_KEY_MAX_AGE_DAYS") {
            c.signingKeyMaxAge = days > 0 ? .seconds(Int64(days) * 24 * 3600) : nil
        }
        if let from = env["MAIL_FROM"], !from.isEmpty { c.mailFrom = from }
        if let dir = env["ACCOUNTS_MAILDIR"], !dir.isEmpty { c.mail = .maildir(path: dir) }
        if let host = env["SMTP_HOST"], !host.isEmpty {
            let port = try int("SMTP_PORT") ?? 25
            guard (1...65535).contains(port) else { throw ConfigurationError("SMTP_PORT \(port) is out of range") }
            c.mail = .smtp(host: host, port: port, helo: env["SMTP_HELO"] ?? "accounts.local")
        }
        return c
    }
}

/// Where mails are delivered.
public enum MailConfiguration: Sendable, Equatable {
    /// Written as files into a Maildir (`<path>/{tmp,new,cur}`); ListSentMail reads them back.
    case maildir(path: String)
    /// Sent to an SMTP relay, plain SMTP without TLS or AUTH (a local relay, e.g. a sidecar).
    case smtp(host: String, port: Int, helo: String)
}

public struct ConfigurationError: Error, CustomStringConvertible {
    public let description: String
    init(_ d: String) { description = d }
}
