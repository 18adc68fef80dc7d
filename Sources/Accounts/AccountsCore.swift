import Contracts
import Foundation
import Logging
import RPCCore
import Security
import ServiceKit
import Storage
import Synchronization

/// The state both accounts services share: the database, the token keys, the password hasher, the
/// throttles, the mail sink. `AccountsService` and `AccountsInternalService` are thin wrappers that
/// route each RPC here.
public final class AccountsCore: Sendable {
    public let configuration: AccountsConfiguration
    public let database: Database
    public let keys: SigningKeyRing
    let hasher: PasswordHasher
    let mail: any MailSink
    let logger: Logger
    let revoked: RevokedSessions
    let pageTokens: PageTokens
    let resetMailer: ResetMailer

    let accountFailures: SlidingWindowThrottle
    let addressFailures: SlidingWindowThrottle
    let resetsByAddress: SlidingWindowThrottle
    let resetsByEmail: SlidingWindowThrottle
    let sendMailInFlight = InFlightKeys()

    /// Opens the database (migrating it), loads or creates the signing key, prepares the mail sink.
    /// Blocking: call at startup.
    public init(configuration: AccountsConfiguration, logger: Logger = Logger(label: "accounts")) throws {
        self.configuration = configuration
        self.logger = logger
        database = try Database.open(directory: configuration.dataDirectory, fileName: AccountsSchema.fileName,
                                     migrations: AccountsSchema.migrations, logger: logger)
        do {
            keys = try SigningKeyRing(database: database, dataDirectory: configuration.dataDirectory,
                                      tokenLifetime: configuration.accessTokenLifetime, logger: logger)
            hasher = try PasswordHasher(parameters: configuration.passwordParameters)
            switch configuration.mail {
            case .maildir(let path): mail = try MaildirSink(path: path)
            case .smtp(let host, let port, let helo): mail = SMTPSink(host: host, port: port, helo: helo)
            }
            revoked = RevokedSessions(accessTokenLifetime: configuration.accessTokenLifetime)
            try revoked.load(from: database)
            let secret = try database.readSync { c in try c.queryOne("SELECT value FROM secrets WHERE name = 'page-token'")?.get(0, as: [UInt8].self) }
            pageTokens = PageTokens(key: secret ?? SecureRandom.bytes(32))
        } catch {
            database.close()
            throw error
        }
        accountFailures = SlidingWindowThrottle(limit: configuration.maxFailuresPerAccount, window: configuration.failureWindow)
        addressFailures = SlidingWindowThrottle(limit: configuration.maxFailuresPerAddress, window: configuration.failureWindow)
        resetsByAddress = SlidingWindowThrottle(limit: configuration.maxResetRequestsPerAddress, window: configuration.resetRequestWindow)
        resetsByEmail = SlidingWindowThrottle(limit: configuration.maxResetRequestsPerEmail, window: configuration.resetRequestWindow)
        resetMailer = ResetMailer()
    }

    /// The public service.
    public var service: AccountsService { AccountsService(core: self) }
    /// The service-to-service API.
    public var internalService: AccountsInternalService { AccountsInternalService(core: self) }
    /// Both, for a server's service list.
    public var services: [any RPCService] { [service, internalService] }

    /// accounts verifies its own tokens with its own public keys (current and retired).
    public var signingKeySource: StaticSigningKeys {
        let keys = self.keys
        return StaticSigningKeys { keys.verificationKeys }
    }

    /// Loops the process runs next to the server: reset mails, account-deletion delivery, upkeep.
    public func backgroundJobs(deliverer: UserDeletionDeliverer) -> [@Sendable () async -> Void] {
        [
            { await self.runResetMails() },
            { await deliverer.run() },
            { await self.maintenance() },
        ]
    }

    /// Sends the queued password reset mails until cancelled.
    public func runResetMails() async { await resetMailer.run(core: self) }

    /// Closes the database (after the server stopped).
    public func close() { database.close() }

    // MARK: Helpers for the handlers

    var sessionLifetime: Duration { configuration.refreshTokenLifetime }

    /// The verified caller of an authenticated RPC whose session is still live here.
    func caller(_ context: ServerContext) throws -> CallerIdentity {
        let id = try context.requireIdentity()
        if revoked.contains(id.sessionID) {
            throw RPCError(.unauthenticated, "this session has ended (logged out, password changed or account deleted): log in again")
        }
        return id
    }

    /// The caller's live account, or UNAUTHENTICATED when it no longer exists.
    func callerRecord(_ db: some SQLReader, _ id: CallerIdentity) throws -> UserRecord {
        guard let user = try UserQueries.byID(db, id.userID) else {
            throw RPCError(.unauthenticated, "the account of this access token no longer exists")
        }
        return user
    }

    /// The client's address for throttling: the gateway's `x-forwarded-for` (last hop, the one the
    /// gateway itself saw) when the call carries the service credential, else the TCP peer.
    func clientAddress(_ context: ServerContext) -> String {
        if context.isServiceCall, let forwarded = context.requestMetadata["x-forwarded-for"],
           let last = forwarded.split(separator: ",").last {
            let a = last.trimmingCharacters(in: .whitespaces)
            if !a.isEmpty { return a }
        }
        return context.peerHost
    }

    /// Runs a database write, mapping storage failures to the wire's vocabulary.
    func write<T: Sendable>(_ body: @escaping @Sendable (Transaction) throws -> T) async throws -> T {
        do { return try await database.write(body) } catch let e as StorageError { throw mapped(e) }
    }

    func read<T: Sendable>(_ body: @escaping @Sendable (Connection) throws -> T) async throws -> T {
        do { return try await database.read(body) } catch let e as StorageError { throw mapped(e) }
    }

    private func mapped(_ e: StorageError) -> RPCError {
        if case .uniqueViolation(let columns, _) = e {
            // A race lost to a concurrent request with the same username or email.
            let field = columns.contains { $0.contains("email") } ? "email" : "username"
            return FieldErrors.single(.alreadyExists, field: field, "already taken")
        }
        if case .busy = e {} else if case .diskFull = e {} else if case .closed = e {} else {
            logger.error("storage failure", metadata: ["error": "\(e)"])
        }
        return e.rpcError
    }

    /// RESOURCE_EXHAUSTED with RetryInfo.
    static func throttled(_ what: String, waitMilliseconds: Int64) -> RPCError {
        let seconds = max(1, (waitMilliseconds + 999) / 1000)
        return RPCError.retryLater("\(what): try again in \(seconds) s", after: .seconds(seconds))
    }

    /// Counts a wrong password for the account and the address.
    func recordFailure(account: String, address: String) {
        accountFailures.record(account)
        addressFailures.record(address)
    }

    /// Refuses when the account or the address had too many failures recently.
    func checkThrottle(account: String?, address: String) throws {
        var wait: Int64 = 0
        if let account, let w = accountFailures.retryAfter(account) { wait = max(wait, w) }
        if let w = addressFailures.retryAfter(address) { wait = max(wait, w) }
        if wait > 0 { throw Self.throttled("too many failed attempts", waitMilliseconds: wait) }
    }

    // MARK: Upkeep

    /// Hourly: rotate an old signing key, purge expired tokens and delivered outbox events, and say
    /// in the log how many deletion events still wait for a peer.
    func maintenance() async {
        while !Task.isCancelled {
            do {
                let keys = self.keys, maxAge = configuration.signingKeyMaxAge
                try await MailIO.run { try keys.maintain(maxAge: maxAge) }
                let now = Clock.nowMilliseconds()
                let idle = configuration.refreshTokenLifetime.milliseconds
                try await database.write { tx in
                    // A session whose latest refresh token expired is over; its rows go a month later.
                    try tx.execute("UPDATE sessions SET revoked_at = ?, revoke_reason = 'expired' WHERE revoked_at IS NULL AND refreshed_at < ?",
                                   now, now - idle)
                    try tx.execute("DELETE FROM refresh_tokens WHERE expires_at < ?", now)
                    try tx.execute(
                        "DELETE FROM sessions WHERE revoked_at < ? AND NOT EXISTS (SELECT 1 FROM refresh_tokens r WHERE r.session_id = sessions.id)",
                        now - 31 * 24 * 3600 * 1000)
                    try tx.execute("DELETE FROM password_resets WHERE expires_at < ?", now - 24 * 3600 * 1000)
                    try tx.purgeDeliveredOutbox(deliveredBefore: Date(timeIntervalSinceNow: -7 * 24 * 3600))
                }
                let pending = try await database.pendingOutbox(limit: 1000)
                if let oldest = pending.first {
                    logger.warning("account-deletion events waiting for their services (sqlite3 <data-dir>/accounts.sqlite 'select * from outbox where delivered_at is null')",
                                   metadata: ["pending": "\(pending.count)", "oldest": "\(oldest.createdAt)",
                                              "destinations": "\(Set(pending.map(\.destination)).sorted().joined(separator: ","))"])
                }
            } catch {
                logger.error("maintenance failed", metadata: ["error": "\(error)"])
            }
            try? await Task.sleep(for: .seconds(3600))
        }
    }
}

/// Keys with a request in flight (SendMail by event id), so two concurrent deliveries of one event
/// do not both send the mail.
final class InFlightKeys: Sendable {
    private let keys = Mutex<Set<String>>([])
    func claim(_ key: String) -> Bool { keys.withLock { $0.insert(key).inserted } }
    func release(_ key: String) { _ = keys.withLock { $0.remove(key) } }
}
